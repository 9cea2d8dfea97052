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
