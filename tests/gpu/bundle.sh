#!/usr/bin/env bash
# tests/gpu/bundle.sh — packs a CUDA build made here for a GPU machine whose
# calls carry at most 64 MiB: cllm, libcllm.a and the GPU checks' objects,
# compressed, into .gpu/ (git-ignored; name it in the call's carry). There,
# tests/gpu/unbundle.sh unpacks them into build/cuda and links the checks.
#   tests/gpu/bundle.sh [BUILD_DIR] [extra-binary-to-carry-as-NAME=PATH...]
# Build first: ./build.sh --cuda-archs 90 (an H100/H200-only build in
# build/cuda-90, which build/cuda links to).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build/cuda}; shift || true
mkdir -p .gpu
objs=$(ls "$B"/tests/gpu/*.o "$B"/tests/ref/*.o)
tar -cJf .gpu/bundle.tar.xz --transform "s,^$B/,," "$B/cllm" "$B/libcllm.a" $objs
for extra in "$@"; do # NAME=PATH: another binary (e.g. the baseline cllm of an A/B)
    xz -T0 -c "${extra#*=}" > ".gpu/${extra%%=*}.xz"
done
ls -la .gpu
