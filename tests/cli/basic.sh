#!/usr/bin/env bash
# basic.sh — help, version, option errors, `cllm info` and `cllm tokenize` on the
# real models, and clear errors for files that are not models.
source "$(dirname "$0")/lib.sh"

expect_exit "help exits 0" 0 $CLLM --help && expect_grep "help lists subcommands" "$TMP/out" "generate"
expect_exit "version exits 0" 0 $CLLM --version && expect_grep "version printed" "$TMP/out" "^cllm [0-9]"
expect_exit "unknown option exits 2" 2 $CLLM --frobnicate && expect_grep "unknown option named" "$TMP/err" "frobnicate"
expect_exit "unknown subcommand exits 2" 2 $CLLM frobnicate
expect_exit "info: unknown option exits 2" 2 $CLLM info --bogus && expect_grep "info: option named" "$TMP/err" "bogus"
expect_exit "info: bad number exits 2" 2 $CLLM info -c abc $MODELS/smollm2-135m-instruct.gguf
expect_exit "info --help exits 0" 0 $CLLM info --help

expect_exit "info smollm2" 0 $CLLM info $MODELS/smollm2-135m-instruct.gguf
expect_grep "info smollm2: architecture" "$TMP/out" "architecture +llama"
expect_grep "info smollm2: layers" "$TMP/out" "layers +30"
expect_grep "info smollm2: tensor types" "$TMP/out" "tensors +272:.*Q4_1"
expect_grep "info smollm2: parameters" "$TMP/out" "parameters +0\.13"
expect_grep "info smollm2: KV per token" "$TMP/out" "KV cache"
expect_exit "info gemma3" 0 $CLLM info $MODELS/gemma3-270m.gguf --tensors
expect_grep "info gemma3: architecture" "$TMP/out" "architecture +gemma3"
expect_grep "info gemma3: window pattern" "$TMP/out" "15 of 18 layers windowed"
expect_grep "info gemma3: tensor list" "$TMP/out" "blk.17.ffn_down.weight"

# --pp: 30 equal layers and a tied embedding (a copy on each end) split 15/15;
# K+V of 4096 tokens on 15 layers: 4096 x 15 x 3 KV heads x (64 + 64) x 2 bytes = 47.2 MB.
expect_exit "info --pp 2" 0 $CLLM info $MODELS/smollm2-135m-instruct.gguf --pp 2 -c 4096
expect_grep "info --pp 2: stage 0" "$TMP/out" "stage 0 .*layers 0-14 \(15\), embedding: .*KV 47.2 MB"
expect_grep "info --pp 2: stage 1" "$TMP/out" "stage 1 .*layers 15-29 \(15\), final norm \+ LM head"
expect_exit "info --pp-split" 0 $CLLM info $MODELS/smollm2-135m-instruct.gguf --pp-split 10,20
expect_grep "info --pp-split: stage 1" "$TMP/out" "stage 1 .*layers 10-29 \(20\)"
expect_exit "info --pp beyond the layers exits 2" 2 $CLLM info $MODELS/smollm2-135m-instruct.gguf --pp 31
expect_grep "info --pp 31 says why" "$TMP/err" "only 30 layers"
expect_exit "info --pp-split short exits 2" 2 $CLLM info $MODELS/smollm2-135m-instruct.gguf --pp-split 10,10
expect_grep "info --pp-split short says why" "$TMP/err" "hold 20 layers, the model has 30"
expect_exit "info --pp-split junk exits 2" 2 $CLLM info $MODELS/smollm2-135m-instruct.gguf --pp-split 10,x

# --dummy-weights[=TYPE] on a config-only folder (the tiny Llama's tokenizer): C 256, F 384, 2 layers, 4 heads
# / 2 KV heads of 64, V 320, untied. q4_k: every matrix Q4_K (144 bytes a 256-block) but w_down, [256][384]:
# 384 is not whole 256-blocks, so bf16; LM head Q6_K (210 bytes); the 5 norms bf16. Bytes as stored:
#   embedding 320*144 + head 320*210 + norm 512 + 2 x (2 norms 1024 + wq 36864 + wk 18432 + wv 18432
#   + wo 36864 + gate 55296 + up 55296 + down 196608) = 951424 = 929.125 KiB; bf16: 2296320 = 2.19 MiB.
# On the GPU (--pp 2): a layer is 417792 + 2 fp32 norms 2048 = 419840; stage 0 adds the bf16 embedding
# table 163840 (583680 = 0.6 MB), stage 1 the fp32 norm and the Q6_K head 1024 + 67200 (488064 = 0.5 MB).
mkdir -p "$TMP/dq"
cp tests/fixtures/tiny/llama/tokenizer.json "$TMP/dq/"
echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 384,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 320,
 "max_position_embeddings": 256, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1}' > "$TMP/dq/config.json"
expect_exit "info --dummy-weights=q4_k" 0 $CLLM info "$TMP/dq" --dummy-weights=q4_k --pp 2
expect_grep "info --dummy-weights=q4_k: tensor types" "$TMP/out" "tensors +21: Q4_K x13 Q6_K x1 BF16 x7"
expect_grep "info --dummy-weights=q4_k: quantized size" "$TMP/out" "weights as stored +929\.1[23] KiB"
expect_grep "info --dummy-weights=q4_k --pp 2: stage 0" "$TMP/out" "stage 0 .*embedding: weights 0\.6 MB"
expect_grep "info --dummy-weights=q4_k --pp 2: stage 1" "$TMP/out" "stage 1 .*LM head: weights 0\.5 MB"
expect_exit "info --dummy-weights (bf16)" 0 $CLLM info --dummy-weights "$TMP/dq"
expect_grep "info --dummy-weights: bf16 size" "$TMP/out" "weights as stored +2\.19 MiB"
expect_exit "info --dummy-weights=q3_k exits 2" 2 $CLLM info "$TMP/dq" --dummy-weights=q3_k
expect_grep "info --dummy-weights=q3_k: option and value named" "$TMP/err" "dummy-weights=q3_k: .*q4_k"
expect_exit "info --dummy-weights= exits 2" 2 $CLLM info "$TMP/dq" --dummy-weights=
expect_exit "info --tensors=1 exits 2" 2 $CLLM info "$TMP/dq" --dummy-weights --tensors=1
expect_grep "info --tensors=1: takes no value" "$TMP/err" "tensors takes no value"

# cllm quantize: the _M mixes by name (which layers get Q6_K: tests/test_quantize.c), a bad type named
expect_exit "quantize --type q4_k_m" 0 $CLLM quantize tests/fixtures/tiny/llama.gguf "$TMP/qm.gguf" --type q4_k_m
expect_grep "quantize q4_k_m: names the mix" "$TMP/out" "tensors to Q4_K_M"
expect_exit "quantize --type q3_k_m exits 2" 2 $CLLM quantize tests/fixtures/tiny/llama.gguf "$TMP/qx.gguf" --type q3_k_m
expect_grep "quantize q3_k_m: type named, mixes listed" "$TMP/err" "'q3_k_m' .*q4_k_m q5_k_m"

printf 'not a model at all' > "$TMP/junk.gguf"
expect_exit "info: junk file exits 2" 2 $CLLM info "$TMP/junk.gguf"
expect_grep "info: junk file named" "$TMP/err" "junk.gguf"
expect_exit "info: missing file exits 2" 2 $CLLM info "$TMP/nope.gguf"
expect_grep "info: missing file named" "$TMP/err" "nope.gguf"
head -c 5000000 $MODELS/smollm2-135m-instruct.gguf > "$TMP/trunc.gguf"
expect_exit "info: truncated GGUF exits 2" 2 $CLLM info "$TMP/trunc.gguf"
expect_grep "info: truncated GGUF named" "$TMP/err" "trunc.gguf"

expect_exit "tokenize smollm2" 0 $CLLM tokenize -m $MODELS/smollm2-135m-instruct.gguf "Hello world"
expect_grep "tokenize smollm2 ids" "$TMP/out" "^19556 905$"
expect_exit "tokenize --pieces" 0 $CLLM tokenize -m $MODELS/smollm2-135m-instruct.gguf --pieces "Hello world"
expect_grep "tokenize --pieces shows pieces" "$TMP/out" "905 +Ġworld"
expect_exit "tokenize without text exits 2" 2 $CLLM tokenize -m $MODELS/smollm2-135m-instruct.gguf
expect_exit "info smollm2 (chat family)" 0 $CLLM info $MODELS/smollm2-135m-instruct.gguf
expect_grep "info smollm2: chat template family" "$TMP/out" "chat template +chatml"
expect_exit "info gemma3 (chat family)" 0 $CLLM info $MODELS/gemma3-270m.gguf
expect_grep "info gemma3: template guessed" "$TMP/out" "chat template +gemma \(guessed"
for arch in llama mistral qwen2 qwen3 gemma2 gemma3 gpt-oss; do
    expect_exit "info tiny $arch (safetensors)" 0 $CLLM info tests/fixtures/tiny/$arch
    expect_grep "info tiny $arch: safetensors" "$TMP/out" "format +safetensors"
    expect_exit "info tiny $arch (gguf)" 0 $CLLM info tests/fixtures/tiny/$arch.gguf
done

# Option ranges: a bad number stops every command at once (exit 2), naming the
# option, the value and the range; never a per-request error or a default.
T=tests/fixtures/tiny/llama.gguf
printf 'Hello\n' > "$TMP/one.txt"
while read -r opt val range; do
    for cmd in generate chat; do
        args="-m $T --cpu"; [ $cmd = generate ] && args="$args -i $TMP/one.txt -o $TMP/bad-opt.jsonl"
        expect_exit "$cmd $opt $val exits 2" 2 $CLLM $cmd $args $opt $val < /dev/null
        expect_grep "$cmd $opt $val: option, value and range named" "$TMP/err" "^cllm $cmd: $opt $val: must be .*$range"
    done
done <<'LIST'
--temp -1 >=.0
--top-p 5 \(0,.1\]
--min-p 2 \[0,.1\]
--repeat-penalty 0 >.0
--presence-penalty 3 \[-2,.2\]
--top-k -2 \[0,
--max-tokens -5 \[1,.2147483647\]
--max-tokens 0 \[1,.2147483647\]
--ctx-size 0 \[1,.16777216\]
--ctx-size 2147483647 \[1,.16777216\]
--threads -1 \[1,.4096\]
--threads 0 \[1,.4096\]
--seed -5 \[0,
--pp 0 \[1,
LIST
[ -e "$TMP/bad-opt.jsonl" ] && notok "a bad option writes no output" || ok "a bad option writes no output"
expect_exit "-n with trailing junk exits 2" 2 $CLLM generate -m $T --cpu -i "$TMP/one.txt" -n 5x
expect_grep "-n 5x named" "$TMP/err" "option -n expects an integer.*'5x'"
expect_exit "--temp nan exits 2" 2 $CLLM generate -m $T --cpu -i "$TMP/one.txt" --temp nan
expect_exit "bench --threads 0 exits 2" 2 $CLLM bench -m $T --cpu --threads 0
expect_grep "bench --threads 0 named" "$TMP/err" "^cllm bench: --threads 0: must be"
expect_exit "info -c 0 exits 2" 2 $CLLM info $T -c 0
expect_grep "info -c 0 named" "$TMP/err" "^cllm info: --ctx-size 0: must be"
expect_exit "good options still run" 0 $CLLM generate -m $T --cpu -i "$TMP/one.txt" -n 2 -c 64 -t 1 --temp 0.5 --top-p 1 \
    --min-p 0 --repeat-penalty 1.1 --seed 3
