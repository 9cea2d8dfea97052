#!/usr/bin/env bash
# bench/run.sh — the one benchmark command, run on the GPU machine:
#   bench/run.sh [--tiny] [MODEL...]        MODEL: llama3-8b (default: llama3-8b gemma2-9b)
# For each model: makes the random-weight model if missing (bench/make_model.py),
# runs `cllm bench` on it and the transformers reference on the same folder,
# then bench/attention.sh when present, and writes BENCH.md ($OUT/BENCH.md,
# also printed) with every figure against its limit and its ratio to the reference.
#
# Environment: CLLM (binary, default ./cllm), OUT (results folder, default
# build/bench-out), BENCH_MODELS (where models are made, default /tmp/cllm-bench-models),
# BENCH_COMMIT (commit to name; default git rev-parse), BENCH_NOTE (a line for the
# header), BENCH_PROMPT_LENS / BENCH_CTX / BENCH_DECODE_TOKENS / BENCH_REPS
# (default 512,4096 / 128,4096 / 64 / 3), BENCH_TIMEOUT (seconds per step, default 300),
# BENCH_ATTENTION_BIN (passed to bench/attention.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
CLLM=${CLLM:-./cllm}
OUT=${OUT:-build/bench-out}
MODELS_DIR=${BENCH_MODELS:-/tmp/cllm-bench-models}
COMMIT=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
LENS=${BENCH_PROMPT_LENS:-512,4096}
CTX=${BENCH_CTX:-128,4096}
STEPS=${BENCH_DECODE_TOKENS:-64}
REPS=${BENCH_REPS:-3}
LIMIT=${BENCH_TIMEOUT:-300}
TINY=""
MODELS=()
for a in "$@"; do
    case $a in
        --tiny) TINY=--tiny ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) MODELS+=("$a") ;;
    esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(llama3-8b gemma2-9b)
mkdir -p "$OUT" "$MODELS_DIR"
LOG=$OUT/run.log
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }
# step NAME CMD...: runs CMD under the time limit, its output into the log.
step() {
    local name=$1; shift
    say "$name: $*"
    local t0=$SECONDS
    timeout "$LIMIT" "$@" >> "$LOG" 2>&1
    local rc=$?
    say "$name: exit $rc after $((SECONDS - t0)) s"
    return $rc
}

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
say "cllm $COMMIT on ${GPU:-no GPU} (driver ${DRIVER:-?}); models in $MODELS_DIR"
report_args=()
report() {
    python3 bench/report.py --out "$OUT/BENCH.md" --gpu "${GPU:-unknown}" --driver "${DRIVER:-unknown}" \
        --commit "$COMMIT" --note "${BENCH_NOTE:-}" "${report_args[@]}" "$@"
}
for m in "${MODELS[@]}"; do
    dir=$MODELS_DIR/$m${TINY:+-tiny}
    name=$m${TINY:+-tiny}
    if [ ! -f "$dir/config.json" ]; then
        step "make $name" python3 bench/make_model.py "$m" "$dir" $TINY || { rm -rf "$dir"; continue; }
    fi
    sync
    step "cllm $name" "$CLLM" bench -m "$dir" --prompt-lens "$LENS" --ctx "$CTX" --decode-tokens "$STEPS" \
        --reps "$REPS" --json "$OUT/cllm-$name.json" || continue
    step "transformers $name" python3 bench/hf_reference.py "$dir" --prompt-lens "$LENS" --ctx "$CTX" \
        --decode-tokens "$STEPS" --reps "$REPS" --json "$OUT/hf-$name.json"
    report_args+=(--model "$m" "$OUT/cllm-$name.json" "$OUT/hf-$name.json")
    report  # after each model, so a run cut short still leaves a report
done

attn=()
if [ -f bench/attention.sh ]; then
    say "attention: bench/attention.sh ${BENCH_ATTENTION_BIN:-}"
    timeout "$LIMIT" bash bench/attention.sh ${BENCH_ATTENTION_BIN:-} > "$OUT/attention.md" 2>> "$LOG"
    rc=$?
    say "attention: exit $rc"
    [ $rc = 0 ] && [ -s "$OUT/attention.md" ] && attn=(--attention "$OUT/attention.md")
fi

report "${attn[@]}" || exit 1
echo
cat "$OUT/BENCH.md"
