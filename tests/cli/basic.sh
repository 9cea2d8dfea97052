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
