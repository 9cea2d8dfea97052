#!/usr/bin/env bash
# bench/fixed_lengths.sh — BENCH.md's fixed-lengths section: the input/output
# lengths that published throughput tables use (128/128, 128/2048, 2048/128,
# 1000/1000), each as FL_PROMPTS prompts of random token ids of exactly the
# input length (bench/random_prompts.py --ids: token-id prompts are used as
# given), exactly the output length generated (--ignore-eos -n), greedy,
# through `cllm generate -v --steps-csv`. Prints one markdown table (output
# tok/s over the whole process and over the steps, the roofline of the same
# steps and the % of it reached, the steps' share of wall time) and writes
# $OUT/$FL_NAME.json for bench/report.py. Exit 1 when a run failed, a prompt
# failed, or a length was not exact.
#   bench/fixed_lengths.sh [MODEL_DIR]   (default: the random Llama-3-8B of bench/make_model.py)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS, BENCH_COMMIT);
#   FL_PROMPTS  prompts per length (default 1000)
#   FL_SHAPES   the lengths, "IN/OUT ..." (default "128/128 128/2048 2048/128 1000/1000")
#   FL_ARGS     extra `cllm generate` options (e.g. "--max-seqs 512", "--cpu" for the smoke test)
#   FL_NAME     the section's JSON name (default fixed_lengths)
#   FL_NO_LIMITS=1  do not measure the limits (no GPU: the roofline only if OUT/limits.json is there)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
MODEL=${1:-}
N=${FL_PROMPTS:-1000}
SHAPES=${FL_SHAPES:-128/128 128/2048 2048/128 1000/1000}
NAME=${FL_NAME:-fixed_lengths}
[ -n "$MODEL" ] || MODEL=$(bench_model llama3-8b)
if [ -z "${FL_NO_LIMITS:-}" ]; then
    bench_limits || echo "fixed_lengths.sh: limits not measured; no roofline" >&2
fi
for shape in $SHAPES; do
    in=${shape%/*} out=${shape#*/}
    base=$OUT/fl-$in-$out
    rm -f "$base.jsonl" "$base.csv" "$base.wall" "$base.log"
    python3 bench/random_prompts.py "$N" --ids "$in" --model "$MODEL" > "$base.prompts.jsonl"
    t0=$(date +%s.%N)
    rc=0
    # shellcheck disable=SC2086  # FL_ARGS is a list of options
    "$CLLM" generate --overwrite -m "$MODEL" -i "$base.prompts.jsonl" -o "$base.jsonl" -n "$out" --ignore-eos \
        --temp 0 -v --steps-csv "$base.csv" ${FL_ARGS:-} 2> "$base.log" >&2 || rc=$?
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)" > "$base.wall"
    [ $rc = 0 ] || echo "fixed_lengths.sh: $shape: cllm generate exit $rc: $(tail -1 "$base.log")" >&2
    rm -f "$base.prompts.jsonl"
done
python3 bench/fixed_lengths.py "$OUT" "$MODEL" --shapes "$SHAPES" --name "$NAME" --args "${FL_ARGS:-}"
