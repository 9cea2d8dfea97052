#!/usr/bin/env bash
# tests/gpu/run.sh — the checks that need a GPU, run on the GPU machine from a
# build made elsewhere (./build.sh, then carry build/gpu). Prints a short
# table last.
#   tests/gpu/run.sh [BIN_DIR]   (default build/gpu)
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/gpu}
export CLLM_FIXTURES=$PWD/tests/fixtures
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
declare -a rows

run_check() { # name, command...
    local name=$1; shift
    local log="$OUT/$name.log" t0=$(date +%s%N)
    "$@" > "$log" 2>&1; local rc=$?
    local secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    local p=$(grep -c '^ok - ' "$log") f=$(grep -c '^not ok - ' "$log")
    grep -E '^#|^not ok|CHECK|ERROR|error' "$log" | head -60
    rows+=("$(printf '%-28s rc=%-3s %3s ok %3s not-ok %7sms' "$name" "$rc" "$p" "$f" "$secs")")
}

run_check cuda_ops "$BIN/test_cuda_ops"
run_check cuda_forward "$BIN/test_cuda_forward"
run_check sampling "$BIN/test_sampling"
run_check attention sh -c "$BIN/test_attention && if command -v compute-sanitizer >/dev/null; then compute-sanitizer --error-exitcode 9 --tool memcheck $BIN/test_attention --quick; fi"
run_check quant sh -c "$BIN/test_quant && if command -v compute-sanitizer >/dev/null; then compute-sanitizer --error-exitcode 9 --tool memcheck $BIN/test_quant --quick; fi"
if command -v compute-sanitizer >/dev/null; then
    run_check sanitizer_cuda_forward compute-sanitizer --error-exitcode 9 --tool memcheck "$BIN/test_cuda_forward"
else
    rows+=("compute-sanitizer            not installed on this machine")
fi
printf 'Hello\n' > "$OUT/turn.txt"
run_check chat_tiny_gpu sh -c "$BIN/cllm chat -m tests/fixtures/tiny/llama.gguf --temp 0 -n 8 < $OUT/turn.txt && echo 'ok - chat on the GPU'"

echo
echo "== summary"
for r in "${rows[@]}"; do echo "$r"; done
