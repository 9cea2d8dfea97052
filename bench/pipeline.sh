#!/usr/bin/env bash
# bench/pipeline.sh — BENCH.md's pipeline section, on a machine with >= 2 GPUs:
# pipeline stages (--pp 2, and --pp 4 / --pp 8 with >= 4 / >= 8 GPUs) against
# one GPU on the random Llama-3-8B shape (`cllm bench --pp P`, and
# bench/throughput.sh with THROUGHPUT_ARGS="--pp P"), then models that do not
# fit one GPU (--dummy-weights; PP_BIG=0 leaves them out): the Llama-3-70B
# shape in bf16 at --pp G (G = 8, 4 or 2: the most the GPUs allow) and the
# Llama-3.1-405B shape in Q4_K (--dummy-weights=q4_k, 229 GB) at --pp 4 and
# --pp 8 where there are that many GPUs; with >= 8 GPUs also the 70B shape's
# 1000-prompt throughput at --pp 4 and --pp 8 (issue 44).
# Writes $OUT/pipeline.json. (The correctness checks: tests/gpu/pipeline.sh.)
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
PPS="1 2"
[ "$gpus" -ge 4 ] && PPS="1 2 4"
[ "$gpus" -ge 8 ] && PPS="1 2 4 8"
for pp in $PPS; do
    echo "== cllm bench --pp $pp"
    timeout "$LIMIT" "$CLLM" bench -m "$DIR" --pp $pp --prompt-lens 512 --ctx 128,4096 "${peak[@]}" \
        --json "$OUT/pp-bench-$pp.json" > "$OUT/pp-bench-$pp.log" 2>&1
    rc=$?
    cat "$OUT/pp-bench-$pp.log"
    [ $rc = 0 ] || { echo "cllm bench --pp $pp exit $rc: $(tail -1 "$OUT/pp-bench-$pp.log")" >> "$OUT/pp-errors";
                     rm -f "$OUT/pp-bench-$pp.json"; }
done
for pp in $PPS; do
    bench_throughput "pp-tp$pp" "$DIR" "${PP_N:-1000}" "--pp $pp" "$OUT/pp-errors"
done
# big_bench NAME MODEL WEIGHTS PP: the shape's config (made when missing), `cllm info`, then `cllm bench`
# with --dummy-weights=WEIGHTS at --pp PP into $OUT/pp-bench-NAME.json; a failure is a line in pp-errors.
big_bench() {
    local name=$1 model=$2 weights=$3 pp=$4 dir=$BENCH_MODELS/$2 rc
    echo "== $model shape, --dummy-weights=$weights, --pp $pp"
    { [ -f "$dir/config.json" ] || python3 bench/make_dummy_model.py "$model" "$dir"; } > "$OUT/pp-$name.log" 2>&1 &&
        "$CLLM" info "$dir" --dummy-weights="$weights" --pp "$pp" >> "$OUT/pp-$name.log" 2>&1 &&
        timeout "$LIMIT" "$CLLM" bench -m "$dir" --dummy-weights="$weights" --pp "$pp" --prompt-lens 512 --ctx 128 \
            "${peak[@]}" --json "$OUT/pp-bench-$name.json" >> "$OUT/pp-$name.log" 2>&1
    rc=$?
    cat "$OUT/pp-$name.log"
    [ $rc = 0 ] || { echo "$model --pp $pp exit $rc: $(tail -1 "$OUT/pp-$name.log")" >> "$OUT/pp-errors";
                     rm -f "$OUT/pp-bench-$name.json"; }
}
BIG="" BIG_THR=""
if [ "${PP_BIG:-1}" != 0 ]; then
    G=$((gpus >= 8 ? 8 : gpus >= 4 ? 4 : 2))
    big_bench 70b llama3-70b bf16 $G
    BIG="70b|llama3-70b|bf16|$G"
    for pp in 4 8; do
        [ "$gpus" -ge $pp ] || continue
        big_bench 405b-$pp llama3.1-405b q4_k $pp
        BIG="$BIG;405b-$pp|llama3.1-405b|q4_k|$pp"
    done
    if [ "$gpus" -ge 8 ]; then  # the 70B shape's throughput: bf16 weights made in memory
        for pp in 4 8; do
            bench_throughput "pp-70b-tp$pp" "$BENCH_MODELS/llama3-70b" "${PP_N:-1000}" "--dummy-weights --pp $pp" \
                "$OUT/pp-errors"
            BIG_THR="$BIG_THR $pp"
        done
    fi
fi
python3 - "$OUT" "$DIR" "$PPS" "$BIG" "$BIG_THR" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import results
out, model, pps, big, big_thr = sys.argv[1:6]
pps = pps.split()
err = os.path.join(out, "pp-errors")
bigs = [dict(zip(("name", "model", "weights", "pp"), b.split("|"))) for b in big.split(";") if b]
results.write_section(out, "pipeline", {
    "model": os.path.basename(model.rstrip("/")),
    "bench": {pp: results.load(os.path.join(out, f"pp-bench-{pp}.json")) for pp in pps},
    "throughput": {pp: results.load(os.path.join(out, f"pp-tp{pp}", "throughput.json")) for pp in pps},
    "big": [{"model": b["model"], "weights": b["weights"], "pp": int(b["pp"]),
             "bench": results.load(os.path.join(out, f"pp-bench-{b['name']}.json"))} for b in bigs],
    "big_throughput": {"model": "llama3-70b", "runs": {pp: results.load(os.path.join(out, f"pp-70b-tp{pp}", "throughput.json"))
                                                        for pp in big_thr.split()}} if big_thr.split() else None,
    "error": open(err).read().strip() if os.path.exists(err) else None}, gpus_used=int(pps[-1]))
sys.exit(0 if all(results.load(os.path.join(out, f"pp-bench-{pp}.json")) for pp in pps) else 1)
PY
