#!/usr/bin/env bash
# tests/run.sh — everything that runs without a GPU (the README's test command;
# .ci/run calls exactly this). Builds cllm and the unit tests three times
# (CUDA for sm_90, the user's default ./build.sh, AddressSanitizer + UBSan),
# fetches the real models of models.txt, runs the
# unit-test programs, the command-line checks and a short fuzz run, and ends
# with the line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
export CLLM_FIXTURES="$PWD/tests/fixtures"
mkdir -p tests/out
log=tests/out/run.log; : > "$log"
pass=0; fail=0

# Counts the "ok - " / "not ok - " lines a test program printed.
count() { # label, output file, exit code (t0: $SECONDS when the test started)
    local p f
    p=$(grep -c '^ok - ' "$2"); f=$(grep -c '^not ok - ' "$2")
    if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "not ok - $1 exited $3" >> "$2"; fi
    pass=$((pass + p)); fail=$((fail + f))
    printf '%-40s %4d passed %4d failed %5d s\n' "$1" "$p" "$f" "$((SECONDS - t0))"
    grep '^not ok\|^  ' "$2" | head -40
    cat "$2" >> "$log"
}

echo "== build"
# 1. The CUDA code, for sm_90 only (a compile check, and the binary the unit
#    tests and tests/cli/binary.sh use: its CPU fallback and NEEDED list);
#    every arch would take ~4x as long. 2. ./cllm the way a user gets it
#    (./build.sh: CPU-only on a machine without a GPU), for the CLI checks.
#    3. The AddressSanitizer + UBSan build.
build() { # log, options...
    local log=tests/out/$1; shift
    ./build.sh "$@" > "$log" 2>&1 || { tail -40 "$log"; echo "0 passed, 1 failed"; exit 1; }
    tail -1 "$log"
}
build build-cuda.log --cuda-archs 90
bin=$(./build.sh --cuda-archs 90 --print-dir)
build build.log
build build-asan.log --asan

echo "== models"
models/fetch.sh --quiet default gemma3-270m > tests/out/fetch.log 2>&1 || { cat tests/out/fetch.log; echo "(real-model tests will fail)"; }
export CLLM_MODELS="$PWD/models/cache"

echo "== unit tests"
for t in "$bin"/tests/test_*; do
    case $t in *.d|*.o) continue ;; esac  # make's dependency files and kept objects (incremental builds)
    name=$(basename "$t"); out=tests/out/$name.txt; t0=$SECONDS
    timeout 900 "$t" > "$out" 2>&1; count "$name" "$out" $?
done

echo "== unit tests under AddressSanitizer + UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
for t in build/asan/tests/test_*; do
    case $t in *.d|*.o) continue ;; esac  # make's dependency files and kept objects (incremental builds)
    name=$(basename "$t"); out=tests/out/asan-$name.txt; t0=$SECONDS
    CLLM_QUICK=1 timeout 900 "$t" > "$out" 2>&1; count "asan/$name" "$out" $?
done

echo "== layers"
out=tests/out/layers.txt; t0=$SECONDS
bash tests/layers.sh > "$out" 2>&1; count "layers" "$out" $?

echo "== command line"
for s in tests/cli/*.sh; do
    [ "$(basename "$s")" = lib.sh ] && continue
    name=$(basename "$s" .sh); out=tests/out/cli-$name.txt; t0=$SECONDS
    timeout 900 bash "$s" > "$out" 2>&1; count "cli/$name" "$out" $?
done

echo "== $((SECONDS / 60)) min $((SECONDS % 60)) s in all (the budget: 20 min on 2 cores)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
