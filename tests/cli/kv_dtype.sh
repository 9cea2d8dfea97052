#!/usr/bin/env bash
# kv_dtype.sh — `--kv-dtype` (issue 7's fp8 KV cache) on the command line, on
# the CPU: every subcommand refuses a bad value in one line naming it and
# the choices; generate with an fp8 cache runs, --kv-dtype bf16 is the
# default, and the fp8 results do not depend on a pipeline split or the
# batching (the cache holds the same bytes); info sizes the cache in fp8.
source "$(dirname "$0")/lib.sh"
M=$MODELS/smollm2-135m-instruct.gguf
T=tests/fixtures/tiny/llama.gguf

for cmd in "chat -m $T --cpu" "generate -m $T --cpu -i -" "bench -m $T --cpu" "info $T"; do
    for bad in fp16 FP8 e4m3 ""; do
        expect_exit "${cmd%% *} --kv-dtype '$bad' exits 2" 2 $CLLM $cmd --kv-dtype "$bad" < /dev/null
        expect_grep "${cmd%% *} --kv-dtype '$bad' names the value and the choices" "$TMP/err" \
            "^cllm ${cmd%% *}: --kv-dtype '$bad': expected one of bf16, fp8$"
    done
    expect_exit "${cmd%% *} --kv-dtype without a value exits 2" 2 $CLLM $cmd --kv-dtype < /dev/null
done
expect_exit "generate --help" 0 $CLLM generate --help && expect_grep "generate --help lists --kv-dtype" "$TMP/out" "--kv-dtype S +KV cache elements: bf16"
expect_exit "chat --help" 0 $CLLM chat --help && expect_grep "chat --help lists --kv-dtype" "$TMP/out" "--kv-dtype"
expect_exit "info --help" 0 $CLLM info --help && expect_grep "info --help lists --kv-dtype" "$TMP/out" "--kv-dtype"

for i in $(seq 1 12); do echo "Question $i: name a colour and a number."; done > "$TMP/p.txt"
GEN="$CLLM generate -m $M --cpu -n 8 --temp 0 -c 128 -i $TMP/p.txt --ordered"
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
expect_exit "generate --kv-dtype fp8" 0 $GEN --kv-dtype fp8 -o "$TMP/f8.jsonl"
n=$(grep -c '"text"' "$TMP/f8.jsonl")
[ "$n" = 12 ] && ok "fp8: a reply per prompt" || notok "fp8: a reply per prompt" "$n lines: $(head -c 300 "$TMP/f8.jsonl")"
expect_exit "generate --kv-dtype fp8 one at a time" 0 $GEN --kv-dtype fp8 --max-seqs 1 -o "$TMP/f8one.jsonl"
cmp -s <(strip "$TMP/f8.jsonl") <(strip "$TMP/f8one.jsonl") && ok "fp8: batched equals one at a time" \
    || notok "fp8: batched equals one at a time" "$(diff <(strip "$TMP/f8.jsonl") <(strip "$TMP/f8one.jsonl") | head -4)"
expect_exit "generate --kv-dtype fp8 --pp 2" 0 $GEN --kv-dtype fp8 --pp 2 -o "$TMP/f8pp.jsonl"
cmp -s <(strip "$TMP/f8.jsonl") <(strip "$TMP/f8pp.jsonl") && ok "fp8: --pp 2 equals one stage" \
    || notok "fp8: --pp 2 equals one stage" "$(diff <(strip "$TMP/f8.jsonl") <(strip "$TMP/f8pp.jsonl") | head -4)"
expect_exit "generate default" 0 $GEN -o "$TMP/def.jsonl"
expect_exit "generate --kv-dtype bf16" 0 $GEN --kv-dtype bf16 -o "$TMP/bf.jsonl"
cmp -s <(strip "$TMP/def.jsonl") <(strip "$TMP/bf.jsonl") && ok "--kv-dtype bf16 is the default" \
    || notok "--kv-dtype bf16 is the default" "$(diff <(strip "$TMP/def.jsonl") <(strip "$TMP/bf.jsonl") | head -4)"

# SmolLM2: 30 layers x 3 KV heads x (64 + 64): 23040 bytes a token in bf16, 30 x 3 x (128 + 8) = 12240 in fp8.
expect_exit "info --kv-dtype fp8" 0 $CLLM info $M -c 4096 --kv-dtype fp8
expect_grep "info: fp8 cache sized" "$TMP/out" "^KV cache, 4096 tokens, fp8 +47\.81 MiB"
expect_grep "info: bytes per token of both" "$TMP/out" "23040 bytes per token \(bf16\), 12240 \(fp8"
expect_exit "info default" 0 $CLLM info $M -c 4096
expect_grep "info: bf16 cache sized by default" "$TMP/out" "^KV cache, 4096 tokens +90\.00 MiB"
expect_exit "info --pp 2 --kv-dtype fp8" 0 $CLLM info $M --pp 2 -c 4096 --kv-dtype fp8
expect_grep "info --pp 2: fp8 KV per stage" "$TMP/out" "stage 0 .*KV 25.1 MB"
