#!/usr/bin/env bash
# bench/attention.sh — BENCH.md's attention section: cllm's CUDA attention
# kernels alone against PyTorch SDPA's flash and cuDNN backends in the same
# run (bench/sdpa_reference.py), on the GPU machine; the same kernels over an
# fp8 KV cache against bf16. Writes $OUT/attention.json.
#   bench/attention.sh [BIN]   BIN: a built bench_attention (default
#   build/cuda/bench/bench_attention, built here from build/cuda/libcllm.a
#   when missing: ./build.sh first)
# Prefill: causal, 32 heads, head size 128, TFLOP/s (4 L^2 H D / 2 per
# sequence); decode: one row per sequence, 32q/8kv, head size 128, K+V bytes
# (fp8: codes + scales) over time; shared: N sequences sharing a 2000-token
# prefix, one decode row each, flat vs cascade, the distinct K/V bytes over
# time; variants: window 4096, soft-cap 50 and sinks at 1x16384 prefill and
# 8x32768 decode, against PyTorch's flex_attention where it has the variant
# and against our plain kernel. Results: bench/attention_results.py.
# Environment: see bench/lib.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
BUILD=$(./build.sh --print-dir 2>/dev/null || echo build/cuda)
BIN=${1:-$BUILD/bench/bench_attention}
if [ ! -x "$BIN" ]; then
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    mkdir -p "$(dirname "$BIN")"
    gcc -std=c11 -D_GNU_SOURCE -O2 -I. -I"$CUDA_HOME/include" bench/bench_attention.c "$BUILD/libcllm.a" \
        -L"$CUDA_HOME/lib64" -lcudart_static -lcublasLt -lnccl -lz -ldl -lrt -lpthread -lm -lstdc++ -o "$BIN" || exit 1
fi
bench_limits || exit 1
"$BIN" > "$OUT/attention-cllm.txt" || { cat "$OUT/attention-cllm.txt"; exit 1; }
cat "$OUT/attention-cllm.txt"
python3 bench/sdpa_reference.py > "$OUT/attention-sdpa.txt" 2> "$OUT/attention-sdpa.log"
rc=$?
cat "$OUT/attention-sdpa.txt"
[ $rc = 0 ] || tail -3 "$OUT/attention-sdpa.log"
python3 bench/attention_results.py "$OUT" "$rc"
