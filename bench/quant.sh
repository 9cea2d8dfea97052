#!/usr/bin/env bash
# bench/quant.sh — issue 7's benchmark, on the GPU machine: a random-weight
# Llama-3-8B-shaped model (bench/make_model.py --gguf, BF16), quantized by
# `cllm quantize` to Q8_0 and Q4_K, then `cllm bench` on each with the
# weights quantized on the GPU and with --bf16-weights (the same numbers
# dequantized to bf16 at load): prefill 512 and batch-1 decode at context
# 128. (Each quantized kernel alone: tests/gpu/test_quant --time.)
# The decode line's GB/s counts the bytes of the weights as the GPU holds them.
#   bench/quant.sh [DIR]    (models in DIR, default /tmp/cllm-quant; made when missing)
# Environment: CLLM (binary, default ./cllm), TYPES (default "q8_0 q4_k"), OUT (logs, default DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
CLLM=${CLLM:-./cllm}
DIR=${1:-/tmp/cllm-quant}
OUT=${OUT:-$DIR}
mkdir -p "$DIR" "$OUT"
[ -f "$DIR/l8-bf16.gguf" ] || python3 bench/make_model.py llama3-8b "$DIR/l8-bf16.gguf" --gguf
for t in ${TYPES:-q8_0 q4_k}; do
    [ -f "$DIR/l8-$t.gguf" ] || "$CLLM" quantize "$DIR/l8-bf16.gguf" "$DIR/l8-$t.gguf" --type "$t"
    for mode in quant bf16; do
        flag=""; [ $mode = bf16 ] && flag=--bf16-weights
        echo "== $t, weights $mode"
        "$CLLM" bench -m "$DIR/l8-$t.gguf" --prompt-lens 512 --ctx 128 --decode-tokens 64 $flag \
            --json "$OUT/bench-$t-$mode.json" 2>&1 | tee "$OUT/bench-$t-$mode.log"
    done
done
