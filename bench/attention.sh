#!/usr/bin/env bash
# bench/attention.sh — cllm's CUDA attention kernels alone vs PyTorch SDPA in
# the same run, on the GPU machine; prints a markdown table to stdout.
#   bench/attention.sh [BIN]   BIN: a built bench_attention (default
#   build/gpu/bench/bench_attention, built here from build/gpu/libcllm.a when
#   missing: ./build.sh first)
# Prefill: causal, 32 heads, head size 128, TFLOP/s (4 L^2 H D / 2 per
# sequence); decode: 8 sequences, 32q/8kv, head size 128, K+V bytes / time
# against the 4.26 TB/s device copy (shared/ANCHORS.md). A second table: the
# same kernels over an fp8 KV cache (--kv-dtype fp8) against bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/gpu/bench/bench_attention}
if [ ! -x "$BIN" ]; then
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    mkdir -p "$(dirname "$BIN")"
    gcc -std=c11 -D_GNU_SOURCE -O2 -I. -I"$CUDA_HOME/include" bench/bench_attention.c build/gpu/libcllm.a \
        -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lpthread -lm -lstdc++ -o "$BIN"
fi
ours=$("$BIN")
ref=$(python3 bench/sdpa_reference.py)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "Attention kernels alone, $gpu (median of 30 after 5 warm-ups, CUDA events)"
echo
echo "| shape | cllm ms | cllm | PyTorch SDPA ms | SDPA | cllm / SDPA |"
echo "| --- | --- | --- | --- | --- | --- |"
join <(echo "$ours" | awk '/^RESULT/ {print $2"_"$3, $4, $5}' | sort) \
     <(echo "$ref" | awk '/^RESULT/ {print $2"_"$3, $4, $5}' | sort) |
awk '{ split($1, k, "_"); unit = k[1] == "prefill" ? " TFLOP/s" : " TB/s";
       extra = k[1] == "decode" ? sprintf(" (%.0f%% of 4.26)", 100 * $3 / 4.26) : "";
       printf "| %s %s | %.3f | %s%s%s | %.3f | %s%s | %.2f |\n", k[1], k[2], $2, $3, unit, extra, $4, $5, unit, $3 / $5 }'
echo
echo "KV cache bf16 vs fp8 (e4m3 + a scale per token and KV head), same kernels and shapes; decode bytes as each cache holds them"
echo
echo "| shape | bf16 ms | fp8 ms | fp8 speed-up | fp8 rate |"
echo "| --- | --- | --- | --- | --- |"
join <(echo "$ours" | awk '/^RESULT (prefill|decode) / {print $2"_"$3, $4}' | sort) \
     <(echo "$ours" | awk '/^RESULT (prefill|decode)-fp8 / {sub(/-fp8/, "", $2); print $2"_"$3, $4, $5}' | sort) |
awk '{ split($1, k, "_"); unit = k[1] == "prefill" ? " TFLOP/s" : " TB/s";
       extra = k[1] == "decode" ? sprintf(" (%.0f%% of 4.26)", 100 * $4 / 4.26) : "";
       rate = $4;
       printf "| %s %s | %.3f | %.3f | %.2fx | %.3g%s%s |\n", k[1], k[2], $2, $3, $2 / $3, rate, unit, extra }'
