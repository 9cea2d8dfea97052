#!/usr/bin/env bash
# bench/timeline.sh — every kernel of `cllm bench` on a timeline (CUPTI, as the GPU
# ran them: graphs and PDL overlaps kept), then where one graphed decode step goes
# (bench/kernel_timeline.py: per kernel "own" time beyond its predecessor's end).
#   bench/timeline.sh OUT.tsv CLLM BENCH-ARGS...     e.g.
#   bench/timeline.sh /tmp/t.tsv ./cllm bench -m M --dummy-weights=q4_k --ctx 128 --decode-tokens 16
# Environment: TIMELINE_LIB (the injection library; built here from bench/kernel_timeline.c
# when unset, which needs gcc and CUPTI from /usr/local/cuda), TIMELINE_ARGS (for the summary).
set -euo pipefail
out=$1; shift
lib=${TIMELINE_LIB:-}
if [ -z "$lib" ]; then
    lib=$(mktemp -d)/kernel_timeline.so
    gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include "$(dirname "$0")/kernel_timeline.c" \
        -L/usr/local/cuda/lib64 -l:libcupti.so.13 -o "$lib"
fi
CUDA_INJECTION64_PATH=$(realpath "$lib") CLLM_TIMELINE_OUT=$out "$@"
python3 "$(dirname "$0")/kernel_timeline.py" "$out" ${TIMELINE_ARGS:-}
