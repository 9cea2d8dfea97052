#!/usr/bin/env bash
# bench/kv_fp8.sh — issue 7's FP8 KV cache against the bf16 one, whole-model
# decode at long context on the GPU machine; prints a markdown table.
#   bench/kv_fp8.sh [MODEL_DIR]   (default: a random Llama-3-8B made by
#                                  bench/make_model.py in $BENCH_MODELS)
# `cllm bench --kv-dtype bf16|fp8` at contexts $KV_CTX (default 8192,32000),
# batch 1 and batch $KV_BATCH (default 8), 32 timed steps each. Bytes per
# step count the weights and the K/V as each cache holds them (fp8: codes +
# scales), against the 4.26 TB/s copy bandwidth (shared/ANCHORS.md). The
# KV capacity line is the cache each run allocated at --gpu-mem-util 0.9.
set -uo pipefail
cd "$(dirname "$0")/.."
CLLM=${CLLM:-./cllm}
OUT=${OUT:-build/bench-out}
DIR=${1:-${BENCH_MODELS:-/tmp/cllm-bench-models}/llama3-8b}
CTX=${KV_CTX:-8192,32000}
BATCH=${KV_BATCH:-8}
mkdir -p "$OUT"
[ -f "$DIR/config.json" ] || python3 bench/make_model.py llama3-8b "$DIR" > "$OUT/kv-make.log" 2>&1 || exit 1
for kv in bf16 fp8; do
    for b in 1 "$BATCH"; do
        "$CLLM" bench -m "$DIR" --kv-dtype $kv --prompt-lens 16 --ctx "$CTX" --decode-tokens 32 --reps 1 --batch "$b" \
            --json "$OUT/kv-$kv-b$b.json" > "$OUT/kv-$kv-b$b.txt" 2>&1 || { cat "$OUT/kv-$kv-b$b.txt"; exit 1; }
    done
done
echo "Decode, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(basename "$DIR"), KV cache bf16 vs fp8"
echo
for kv in bf16 fp8; do echo "- $kv: $(grep '^KV cache' "$OUT/kv-$kv-b1.txt")"; done
echo
echo "| ctx | batch | bf16 tok/s | bf16 GB/s (% of 4.26 TB/s) | fp8 tok/s | fp8 GB/s (% of 4.26 TB/s) | fp8 / bf16 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
python3 - "$OUT" "$BATCH" <<'PY'
import json, sys
out, batch = sys.argv[1], sys.argv[2]
for b in ("1", batch):
    runs = {kv: json.load(open(f"{out}/kv-{kv}-b{b}.json"))["decode"] for kv in ("bf16", "fp8")}
    for x, y in zip(runs["bf16"], runs["fp8"]):
        print(f"| {x['ctx']} | {b} | {x['tok_s']:.1f} | {x['gbps']:.0f} ({x['pct_peak']:.1f}%) | "
              f"{y['tok_s']:.1f} | {y['gbps']:.0f} ({y['pct_peak']:.1f}%) | {y['tok_s'] / x['tok_s']:.2f}x |")
PY
