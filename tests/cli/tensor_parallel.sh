#!/usr/bin/env bash
# tensor_parallel.sh — `--tp N` on the command line, CPU backends (fp32): every
# tiny dense model over 2 and 4 ranks generates what one backend generates,
# one sequence at a time (--max-seqs 1) and batched; so do a Q8_0 GGUF, a
# safetensors folder (FP8 weights run; their dynamic activation scales differ),
# --pp 2 --tp 2, and the real small models where their heads allow (SmolLM2:
# 9 heads, 3 KV heads: --tp 3; Gemma 3 270M: 4 heads, 1 KV head: --tp 2 and
# 4). Refused, exit 2, naming why: out-of-range values, heads that do not
# split, a split inside a quantized block, mixture-of-experts, --pp --tp with
# a --world-size other than P*N (the ranks as processes: tests/cli/
# tp_multiprocess.sh, pptp_multiprocess.sh).
# `cllm info --tp N` shows each rank's part and memory, and with --gpus (or
# 0, 1, ...) each rank's GPU, who shares one, and the group's transport; bench and chat run
# with --tp 2, and a serve --tp 2 completion equals one backend's.
source "$(dirname "$0")/lib.sh"
F=tests/fixtures/tiny
for i in $(seq 1 6); do echo "The ranks read the file $i and"; done > "$TMP/p.txt"
GEN="$CLLM generate --cpu -n 10 --temp 0 -c 64 -i $TMP/p.txt --ordered"
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
# same NAME A B: A's replies equal B's (and there are 6)
same() {
    local n; n=$(grep -c '"text"' "$2" 2>/dev/null)
    if [ "$n" = 6 ] && cmp -s <(strip "$2") <(strip "$3"); then ok "$1"
    else notok "$1" "$n replies" "$(diff <(strip "$2") <(strip "$3") 2>&1 | head -4)"; fi
}

# ---- the tiny models: 4 query heads, 2 KV heads (replicated on 2 ranks each with --tp 4) ----
for a in llama llama-mlp-bias mistral qwen2 qwen3 gemma2 gemma3; do
    M=$F/$a.gguf
    expect_exit "$a: one backend" 0 $GEN -m $M --max-seqs 1 -o "$TMP/$a-one.jsonl"
    for n in 2 4; do
        expect_exit "$a --tp $n --max-seqs 1" 0 $GEN -m $M --max-seqs 1 --tp $n -o "$TMP/$a-tp$n.jsonl"
        same "$a --tp $n --max-seqs 1 equals one backend" "$TMP/$a-tp$n.jsonl" "$TMP/$a-one.jsonl"
    done
    expect_exit "$a --tp 2 batched" 0 $GEN -m $M --tp 2 -o "$TMP/$a-tp2b.jsonl"
    same "$a --tp 2 batched equals one backend" "$TMP/$a-tp2b.jsonl" "$TMP/$a-one.jsonl"
done
# the same fixture as a safetensors folder (fp32), and --pp 2 --tp 2 (each stage a group of 2)
expect_exit "llama folder --tp 2" 0 $GEN -m $F/llama --tp 2 -o "$TMP/st-tp2.jsonl"
expect_exit "llama folder, one backend" 0 $GEN -m $F/llama -o "$TMP/st-one.jsonl"
same "llama folder --tp 2 equals one backend" "$TMP/st-tp2.jsonl" "$TMP/st-one.jsonl"
for a in llama gemma3; do
    expect_exit "$a --pp 2 --tp 2" 0 $GEN -m $F/$a.gguf --pp 2 --tp 2 -o "$TMP/$a-pptp.jsonl"
    same "$a --pp 2 --tp 2 equals one backend" "$TMP/$a-pptp.jsonl" "$TMP/$a-one.jsonl"
done
# --tp-nccl-sum asks NCCL's sum of GPU ranks: CPU ranks keep the host group's rank-order sum
expect_exit "llama --tp 2 --tp-nccl-sum on CPU backends" 0 $GEN -m $F/llama.gguf --tp 2 --tp-nccl-sum -o "$TMP/ns.jsonl"
same "--tp-nccl-sum on CPU backends equals one backend" "$TMP/ns.jsonl" "$TMP/llama-one.jsonl"
expect_exit "generate --help" 0 $CLLM generate --help
expect_grep "--help names --tp-nccl-sum" "$TMP/out" "--tp-nccl-sum"
expect_grep "--help: --gpus names each rank's GPU" "$TMP/out" "with --tp each rank's, stage by stage"
expect_exit "generate --tp 2 -v" 0 $GEN -m $F/qwen2.gguf --tp 2 -v -o "$TMP/v.jsonl"
expect_grep "--tp 2 -v names each rank's part" "$TMP/err" "tensor-parallel rank 1 on cpu: heads 2-3, KV heads 1-1, MLP columns 48-95, vocab"

# ---- quantized and FP8 weights ----
expect_exit "quantize llama to q8_0" 0 $CLLM quantize $F/llama.gguf "$TMP/q8.gguf" --type q8_0
expect_exit "q8_0: one backend" 0 $GEN -m "$TMP/q8.gguf" -o "$TMP/q8-one.jsonl"
expect_exit "q8_0 --tp 2" 0 $GEN -m "$TMP/q8.gguf" --tp 2 -o "$TMP/q8-tp2.jsonl"
same "q8_0 --tp 2 equals one backend" "$TMP/q8-tp2.jsonl" "$TMP/q8-one.jsonl"
# --tp 4 would cut Wo's 64 columns (4 heads of 16) into 16: inside a Q8_0 block of 32
expect_exit "q8_0 --tp 4 exits 2" 2 $GEN -m "$TMP/q8.gguf" --tp 4 -o "$TMP/q8-tp4.jsonl"
expect_grep "q8_0 --tp 4 names the matrix and the block" "$TMP/err" \
    "--tp 4: rank 0: blk.0.attn_output.weight \(Q8_0\) would be split at column 16, inside its blocks of 32 values"
# FP8 weights scale each token's activations by its largest value: Wo and
# Wdown on a rank see a slice of the row, so the roundings (and the random
# tiny model's tokens) differ from one backend's; with static scales they
# agree (tests/test_tensor_parallel.c). Here: it runs, a reply per prompt.
expect_exit "fp8 weights --tp 2" 0 $GEN -m $F/mistral --weights fp8 --tp 2 -o "$TMP/w8-tp2.jsonl"
n=$(grep -c '"text"' "$TMP/w8-tp2.jsonl")
[ "$n" = 6 ] && ok "fp8 weights --tp 2: a reply per prompt" || notok "fp8 weights --tp 2: a reply per prompt" "$n lines"

# ---- refused ----
for v in 0 17; do
    expect_exit "generate --tp $v exits 2" 2 $GEN -m $F/llama.gguf --tp $v
    expect_grep "generate --tp $v names the value and the range" "$TMP/err" "^cllm generate: --tp $v: must be an integer in \[1, 16\]"
done
expect_exit "bench --tp 0 exits 2" 2 $CLLM bench -m $F/llama.gguf --cpu --tp 0
expect_grep "bench --tp 0 names the range" "$TMP/err" "--tp 0: must be an integer in \[1, 16\]"
expect_exit "--tp 3 on 4 heads exits 2" 2 $GEN -m $F/llama.gguf --tp 3
expect_grep "--tp 3 names the head count" "$TMP/err" "--tp 3: the model's 4 attention heads do not split evenly over 3 ranks"
expect_exit "gpt-oss --tp 2 exits 2" 2 $GEN -m $F/gpt-oss.gguf --tp 2
expect_grep "gpt-oss --tp 2: mixture-of-experts refused" "$TMP/err" "--tp 2: a mixture-of-experts model \(4 experts\)"
expect_exit "--pp 2 --tp 2 --world-size 2 exits 2" 2 $GEN -m $F/llama.gguf --pp 2 --tp 2 --world-size 2 --rank 0 \
    --master 127.0.0.1:1
expect_grep "--pp --tp with --world-size says why" "$TMP/err" "--pp 2 --tp 2 but --world-size 2: one process per stage and rank, 4"

# ---- info ----
expect_exit "info --tp 4" 0 $CLLM info $F/qwen2.gguf --tp 4 -c 1000
expect_grep "info --tp 4: rank 1 replicates KV head 0" "$TMP/out" "rank 1 +heads 1, KV heads 0, MLP columns 24-47, LM head vocab [0-9]+-[0-9]+: weights .* \+ KV 0\.1 MB"
expect_exit "info --tp 2 --pp 2" 0 $CLLM info $F/llama.gguf --tp 2 --pp 2
expect_grep "info --tp 2 --pp 2: 4 backends" "$TMP/out" "2 ranks per stage \(4 backends\)"
expect_grep "info --tp 2 --pp 2: stage 1 rank 1 on GPU 3" "$TMP/out" "^  GPU 3 +stage 1 rank 1: weights"
expect_grep "info --tp 2 --pp 2: stage 1's group over NCCL where it loads" "$TMP/out" \
    "^  stage 1 transport +NCCL between GPUs 2,3 where NCCL loads, else host memory \(not checked: no GPU here\)"
expect_grep "info without a GPU says what it cannot know" "$TMP/out" "no usable GPU here \(.*\): planned as if the GPUs"
expect_grep "info --tp 2 --pp 2: stage 0 has no LM head" "$TMP/out" "^    rank 1 +heads 2-3, KV heads 1, MLP columns 64-127: weights"
# --gpus: each rank's GPU by the runtime's rule (parallel/placement.c), who shares one, the transport
expect_exit "info --tp 2 --gpus 0,0" 0 $CLLM info $F/llama.gguf --tp 2 --gpus 0,0 -c 1000
expect_grep "info --gpus 0,0: both ranks on GPU 0, shared" "$TMP/out" "^  GPU 0 +rank 0, rank 1 \(2 backends share it\): weights .* \+ KV .* = "
expect_grep "info --gpus 0,0: host memory, saying why" "$TMP/out" "^  transport +host memory; --tp 2: GPU 0 holds ranks 0 and 1"
n=$(grep -c "^  GPU " "$TMP/out")
[ "$n" = 1 ] && ok "info --gpus 0,0: one GPU listed" || notok "info --gpus 0,0: one GPU listed" "$n"
expect_exit "info --tp 2 --gpus 0,1" 0 $CLLM info $F/llama.gguf --tp 2 --gpus 0,1 -c 1000
expect_grep "info --gpus 0,1: rank 0 on GPU 0" "$TMP/out" "^  GPU 0 +rank 0: weights"
expect_grep "info --gpus 0,1: rank 1 on GPU 1" "$TMP/out" "^  GPU 1 +rank 1: weights"
expect_grep "info --gpus 0,1: NCCL" "$TMP/out" "^  transport +NCCL between GPUs 0,1"
expect_exit "info --pp 2 --tp 2 --gpus 1,1,0,0" 0 $CLLM info $F/llama.gguf --pp 2 --tp 2 --gpus 1,1,0,0
expect_grep "info --pp 2 --tp 2 --gpus 1,1,0,0: stage 0 on GPU 1" "$TMP/out" \
    "^  GPU 1 +stage 0 rank 0, stage 0 rank 1 \(2 backends share it\)"
expect_grep "info --pp 2 --tp 2 --gpus 1,1,0,0: stage 1 on GPU 0" "$TMP/out" \
    "^  GPU 0 +stage 1 rank 0, stage 1 rank 1 \(2 backends share it\)"
expect_grep "info --pp 2 --tp 2 --gpus 1,1,0,0: stage 1 through host memory" "$TMP/out" \
    "^  stage 1 transport +host memory; --tp 2: GPU 0 holds ranks 0 and 1"
expect_exit "info --pp 2 --tp 2 --gpus 0,1,0,1" 0 $CLLM info $F/llama.gguf --pp 2 --tp 2 --gpus 0,1,0,1
expect_grep "info --gpus 0,1,0,1: a GPU shared across stages" "$TMP/out" \
    "^  GPU 0 +stage 0 rank 0, stage 1 rank 0 \(2 backends share it\)"
expect_grep "info --gpus 0,1,0,1: host memory: another stage's backend" "$TMP/out" \
    "^  stage 0 transport +host memory; --tp 2: GPU [01] also holds another stage's backend"
for g in 0,x 0 0,1,2 -1,0; do
    expect_exit "info --tp 2 --gpus $g exits 2" 2 $CLLM info $F/llama.gguf --tp 2 --gpus $g
    expect_grep "info --tp 2 --gpus $g names the list" "$TMP/err" "^cllm info: --gpus '$g': "
done
expect_exit "info --gpus without --tp or --pp exits 2" 2 $CLLM info $F/llama.gguf --gpus 0
expect_grep "info --gpus alone says what it needs" "$TMP/err" "--gpus '0': places the backends of --tp or --pp"
expect_exit "info --tp 3 exits 2" 2 $CLLM info $F/llama.gguf --tp 3
expect_grep "info --tp 3 says why" "$TMP/err" "4 attention heads do not split evenly over 3 ranks"

# ---- the real small models (CPU, a few tokens) ----
RGEN="$CLLM generate --cpu -n 6 --temp 0 -c 128 --ordered"
printf '%s\n' "The capital of France is" "Write a haiku about the sea" > "$TMP/r.txt"
S=$MODELS/smollm2-135m-instruct.gguf
expect_exit "SmolLM2: one backend" 0 $RGEN -m $S -i "$TMP/r.txt" -o "$TMP/s-one.jsonl"
expect_exit "SmolLM2 --tp 3" 0 $RGEN -m $S -i "$TMP/r.txt" -o "$TMP/s-tp3.jsonl" --tp 3
cmp -s <(strip "$TMP/s-tp3.jsonl") <(strip "$TMP/s-one.jsonl") && ok "SmolLM2 --tp 3 equals one backend" \
    || notok "SmolLM2 --tp 3 equals one backend" "$(diff <(strip "$TMP/s-tp3.jsonl") <(strip "$TMP/s-one.jsonl") | head -4)"
expect_exit "SmolLM2 --tp 2 exits 2" 2 $RGEN -m $S -i "$TMP/r.txt" --tp 2
expect_grep "SmolLM2 --tp 2 names its 9 heads" "$TMP/err" "the model's 9 attention heads do not split evenly over 2 ranks"
G=$MODELS/gemma3-270m.gguf
expect_exit "Gemma 3 270M: one backend" 0 $RGEN -m $G -i "$TMP/r.txt" -o "$TMP/g-one.jsonl"
for n in 2 4; do
    expect_exit "Gemma 3 270M --tp $n" 0 $RGEN -m $G -i "$TMP/r.txt" -o "$TMP/g-tp$n.jsonl" --tp $n
    cmp -s <(strip "$TMP/g-tp$n.jsonl") <(strip "$TMP/g-one.jsonl") && ok "Gemma 3 270M --tp $n equals one backend" \
        || notok "Gemma 3 270M --tp $n equals one backend" "$(diff <(strip "$TMP/g-tp$n.jsonl") <(strip "$TMP/g-one.jsonl") | head -4)"
done

# ---- eight ranks and stages (issue 44: what 8 GPUs would run, on CPU backends) ----
# A config-only folder (random weights made in memory, --dummy-weights, fp32 on the CPU): 8 layers, 8 query
# heads, 2 KV heads (each replicated on 4 ranks at --tp 8). Requests ask logprobs, so replies differ prompt to
# prompt and every step's distribution is compared, not only the drawn token: texts equal, every logprob and
# top logprob within 1e-4 (the ranks' partial sums are added in another order than one backend's; measured
# worst ~5e-7, while these near-uniform random logits spread over ~1e-2, so a wrong head, column or vocab slice
# is off by far more).
D8=$TMP/d8
mkdir -p "$D8" && cp $F/llama/tokenizer.json "$D8/"
echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 384,
 "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 320,
 "max_position_embeddings": 256, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1}' > "$D8/config.json"
for i in $(seq 1 6); do
    printf '{"id":"p%d","prompt":"The ranks read the file %d and %d","max_tokens":10,"logprobs":3}\n' $i $i $((i * 37))
done > "$TMP/d8.jsonl"
G8="$CLLM generate --cpu --temp 0 -c 64 -i $TMP/d8.jsonl --ordered -m $D8 --dummy-weights"
close8() { expect_logprobs_close "$1" "$TMP/d8-one.jsonl" "$2" 1e-4; } # NAME FILE: matches the one-backend run
expect_exit "8 heads: one backend" 0 $G8 -o "$TMP/d8-one.jsonl"
for opt in "--tp 8 --max-seqs 1" "--tp 8" "--pp 8" "--pp 2 --tp 4" "--pp 4 --tp 2"; do
    name=$(echo "$opt" | tr -d ' -')
    expect_exit "8 heads $opt" 0 $G8 $opt -o "$TMP/d8-$name.jsonl"
    close8 "8 heads $opt matches one backend" "$TMP/d8-$name.jsonl"
done
expect_exit "info --tp 8" 0 $CLLM info "$D8" --dummy-weights --tp 8
expect_grep "info --tp 8: rank 7 holds head 7 and KV head 1" "$TMP/out" "rank 7 +heads 7, KV heads 1, MLP columns 336-383, LM head vocab 280-319"
expect_exit "info --pp 2 --tp 4" 0 $CLLM info "$D8" --dummy-weights --pp 2 --tp 4
expect_grep "info --pp 2 --tp 4: stage 1 rank 3" "$TMP/out" "rank 3 +heads 6-7, KV heads 1, MLP columns 288-383, LM head vocab 240-319"

# ---- bench, chat ----
expect_exit "bench --tp 2" 0 $CLLM bench -m $F/llama.gguf --cpu --tp 2 --prompt-lens 12 --ctx 20 --decode-tokens 5 --reps 1
expect_grep "bench --tp 2 decodes" "$TMP/out" "^ +20 +1 +[0-9.]+ +[0-9.]+"
expect_exit "chat --tp 2" 0 sh -c "echo hello | $CLLM chat -m $F/llama.gguf --cpu --tp 2 -n 4 --temp 0"

# ---- serve: the same completion from a --tp 2 server as from one backend ----
complete() { # PORT: the text of a greedy completion
    python3 -c 'import json, sys, urllib.request as u
r = u.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], json.dumps({"model": "m", "prompt": "The ranks read",
    "max_tokens": 8, "temperature": 0}).encode(), {"Content-Type": "application/json"})
print(json.load(u.urlopen(r, timeout=60))["choices"][0]["text"])' "$1"
}
serve_text() { # NAME ARGS...: starts `cllm serve ARGS`, asks, stops; the text in $TMP/NAME.txt
    local name=$1 port=; shift
    $CLLM serve "$@" --port 0 2> "$TMP/$name.err" > /dev/null &
    local pid=$!
    for _ in $(seq 300); do
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$TMP/$name.err")
        [ -n "$port" ] || ! kill -0 $pid 2> /dev/null && break
        sleep 0.1
    done
    [ -n "$port" ] && complete $port > "$TMP/$name.txt" 2>> "$TMP/$name.err"
    kill -TERM $pid; wait $pid
}
serve_text s-one -m $F/qwen2.gguf --cpu -c 128
serve_text s-tp2 -m $F/qwen2.gguf --cpu -c 128 --tp 2
if [ -s "$TMP/s-one.txt" ] && cmp -s "$TMP/s-one.txt" "$TMP/s-tp2.txt"; then ok "serve --tp 2 completes as one backend"
else notok "serve --tp 2 completes as one backend" "one: $(cat "$TMP/s-one.txt")" "tp2: $(cat "$TMP/s-tp2.txt")" "$(tail -3 "$TMP/s-tp2.err")"; fi
