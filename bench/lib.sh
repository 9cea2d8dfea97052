# shellcheck shell=bash
# bench/lib.sh — what the bench scripts share (sourced after `cd` to the
# repository root): the binary, the results folder, the random-weight models,
# and the limits every figure is set against.
#
# Environment: CLLM (binary, default ./cllm), OUT (results folder, default
# build/bench-out), BENCH_MODELS (where models are made, default
# /tmp/cllm-bench-models), BENCH_COMMIT (commit to name; default git's).
CLLM=${CLLM:-./cllm}
OUT=${OUT:-build/bench-out}
BENCH_MODELS=${BENCH_MODELS:-/tmp/cllm-bench-models}
mkdir -p "$OUT"

# bench_limits: OUT/limits.json (copy bandwidth and bf16 matmul rate measured
# on GPU 0 by bench/limits.py), unless it is there already for this GPU kind.
bench_limits() {
    python3 bench/results.py limits-ok "$OUT" && return 0
    python3 bench/limits.py --json "$OUT/limits.json"
}

# bench_peak_args: the measured limits as `cllm bench` options, when this
# binary takes them (its own printout then shows the same % as BENCH.md;
# report.py computes every % from the measured limits either way).
bench_peak_args() {
    "$CLLM" bench --help 2>&1 | grep -q -- --peak-tflops || return 0
    python3 bench/results.py limits-args "$OUT"
}

# bench_model NAME [--tiny]: the random-weight model BENCH_MODELS/NAME (or
# NAME-tiny), made by bench/make_model.py when missing; prints its folder.
bench_model() {
    local dir=$BENCH_MODELS/$1${2:+-tiny}
    if [ ! -f "$dir/config.json" ]; then
        mkdir -p "$BENCH_MODELS"
        python3 bench/make_model.py "$1" "$dir" ${2:-} >&2 || { rm -rf "$dir"; return 1; }
        sync
    fi
    echo "$dir"
}

bench_gpu_count() {
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
}

# bench_throughput NAME MODEL PROMPTS ARGS ERRFILE: bench/throughput.sh on MODEL
# with THROUGHPUT_ARGS=ARGS, PROMPTS prompts and no one-at-a-time run, in
# $OUT/NAME/ (the limits copied in), its output in $OUT/NAME.log and printed;
# a failure (or BENCH_TIMEOUT seconds, default 300) is a line in ERRFILE.
bench_throughput() {
    local sub=$OUT/$1 rc
    echo "== bench/throughput.sh $(basename "$2"), THROUGHPUT_ARGS=\"$4\""
    mkdir -p "$sub"
    cp "$OUT/limits.json" "$sub/"
    OUT=$sub THROUGHPUT_ARGS="$4" timeout "${BENCH_TIMEOUT:-300}" bench/throughput.sh "$2" "$3" 0 > "$sub.log" 2>&1
    rc=$?
    cat "$sub.log"
    [ $rc = 0 ] || echo "throughput $(basename "$2") $4 exit $rc: $(tail -1 "$sub.log" | cut -c1-200)" >> "$5"
    return $rc
}

# bench_power_start FILE, bench_power_stop: every GPU's SM clock, board power and clock-event
# reasons sampled every 100 ms into FILE while a run goes (bench/power.py summarizes them): the
# limits are measured on a cool GPU, a long batched run can sit at the board's power cap, its SM
# clock lowered. Without nvidia-smi, nothing (FILE not written).
bench_power_start() {
    BENCH_POWER_PID=
    command -v nvidia-smi > /dev/null 2>&1 || return 0
    nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_throttle_reasons.active \
        --format=csv,noheader,nounits -lms 100 > "$1" 2> /dev/null &
    BENCH_POWER_PID=$!
}
bench_power_stop() {
    [ -n "${BENCH_POWER_PID:-}" ] || return 0
    kill "$BENCH_POWER_PID" 2> /dev/null || true
    wait "$BENCH_POWER_PID" 2> /dev/null || true
    BENCH_POWER_PID=
}
