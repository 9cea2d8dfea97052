#!/usr/bin/env bash
# bench/pipeline.sh — BENCH.md's pipeline section, on a machine with >= 2 GPUs:
# pipeline stages (--pp 2) against one GPU on the random Llama-3-8B shape
# (`cllm bench --pp 1|2`, and bench/throughput.sh with THROUGHPUT_ARGS="--pp 1|2"),
# then a Llama-3-70B shape that does not fit one GPU (--dummy-weights, --pp 2;
# PP_70B=0 leaves it out). Writes $OUT/pipeline.json. (The --pp 2 correctness
# checks: tests/gpu/pipeline.sh.)
#   bench/pipeline.sh [MODEL_DIR]   (default: the random Llama-3-8B in $BENCH_MODELS, made when missing)
# Environment: see bench/lib.sh; PP_N (prompts of the throughput runs, default
# 1000), BENCH_TIMEOUT (seconds per step, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
LIMIT=${BENCH_TIMEOUT:-300}
gpus=$(bench_gpu_count)
if [ "${gpus:-0}" -lt 2 ]; then
    echo "bench/pipeline.sh: needs 2 GPUs; this machine has ${gpus:-0}" >&2
    exit 2
fi
DIR=${1:-}
[ -n "$DIR" ] || DIR=$(bench_model llama3-8b) || exit 1
bench_limits || exit 1
read -r -a peak <<< "$(bench_peak_args)"
rm -rf "$OUT"/pp-*
for pp in 1 2; do
    echo "== cllm bench --pp $pp"
    timeout "$LIMIT" "$CLLM" bench -m "$DIR" --pp $pp --prompt-lens 512 --ctx 128,4096 "${peak[@]}" \
        --json "$OUT/pp-bench-$pp.json" > "$OUT/pp-bench-$pp.log" 2>&1
    rc=$?
    cat "$OUT/pp-bench-$pp.log"
    [ $rc = 0 ] || { echo "cllm bench --pp $pp exit $rc: $(tail -1 "$OUT/pp-bench-$pp.log")" >> "$OUT/pp-errors";
                     rm -f "$OUT/pp-bench-$pp.json"; }
done
for pp in 1 2; do
    echo "== bench/throughput.sh --pp $pp"
    mkdir -p "$OUT/pp-tp$pp"
    cp "$OUT/limits.json" "$OUT/pp-tp$pp/"
    OUT=$OUT/pp-tp$pp THROUGHPUT_ARGS="--pp $pp" timeout "$LIMIT" bench/throughput.sh "$DIR" "${PP_N:-1000}" 0 \
        > "$OUT/pp-tp$pp.log" 2>&1
    rc=$?
    cat "$OUT/pp-tp$pp.log"
    [ $rc = 0 ] || echo "throughput --pp $pp exit $rc: $(tail -1 "$OUT/pp-tp$pp.log")" >> "$OUT/pp-errors"
done
if [ "${PP_70B:-1}" != 0 ]; then
    echo "== llama3-70b shape, --dummy-weights, --pp 2"
    big=$BENCH_MODELS/llama3-70b
    { [ -f "$big/config.json" ] || python3 bench/make_dummy_model.py llama3-70b "$big"; } > "$OUT/pp-70b.log" 2>&1 &&
        "$CLLM" info "$big" --dummy-weights --pp 2 >> "$OUT/pp-70b.log" 2>&1 &&
        timeout "$LIMIT" "$CLLM" bench -m "$big" --dummy-weights --pp 2 --prompt-lens 512 --ctx 128 "${peak[@]}" \
            --json "$OUT/pp-bench-70b.json" >> "$OUT/pp-70b.log" 2>&1
    rc=$?
    cat "$OUT/pp-70b.log"
    [ $rc = 0 ] || { echo "llama3-70b --pp 2 exit $rc: $(tail -1 "$OUT/pp-70b.log")" >> "$OUT/pp-errors";
                     rm -f "$OUT/pp-bench-70b.json"; }
fi
python3 - "$OUT" "$DIR" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import results
out, model = sys.argv[1:3]
err = os.path.join(out, "pp-errors")
results.write_section(out, "pipeline", {
    "model": os.path.basename(model.rstrip("/")),
    "bench": {pp: results.load(os.path.join(out, f"pp-bench-{pp}.json")) for pp in ("1", "2")},
    "throughput": {pp: results.load(os.path.join(out, f"pp-tp{pp}", "throughput.json")) for pp in ("1", "2")},
    "big": {"model": "llama3-70b", "pp": 2, "bench": results.load(os.path.join(out, "pp-bench-70b.json"))},
    "error": open(err).read().strip() if os.path.exists(err) else None}, gpus_used=2)
sys.exit(0 if all(results.load(os.path.join(out, f"pp-bench-{pp}.json")) for pp in ("1", "2")) else 1)
PY
