#!/usr/bin/env bash
# build.sh — ./build.sh's choice of what to build, without building
# (--dry-run prints the plan): the GPUs present (a fake nvidia-smi on PATH
# reporting 9.0, 8.6 + 9.0, none, or failing), a fake CUDA toolkit (nvcc) or
# none, and the explicit --cpu / --cuda-archs / --all-archs / --asan. Each arch
# set has its own folder, and --print-dir agrees with the plan.
source "$(dirname "$0")/lib.sh"

mkdir -p "$TMP/cuda/bin" "$TMP/nocuda" "$TMP/bin"
printf '#!/bin/sh\nexit 0\n' > "$TMP/cuda/bin/nvcc"; chmod +x "$TMP/cuda/bin/nvcc"
BASE=/usr/sbin:/usr/bin:/sbin:/bin   # no nvcc, no nvidia-smi here

# fake_smi OUTPUT EXIT — an nvidia-smi that prints OUTPUT for the compute_cap query.
fake_smi() {
    printf "$1" > "$TMP/smi.out"
    printf '#!/bin/sh\ncase "$*" in *compute_cap*) cat "%s"; exit %s ;; esac\nexit 9\n' "$TMP/smi.out" "$2" > "$TMP/bin/nvidia-smi"
    chmod +x "$TMP/bin/nvidia-smi"
}
# plan NAME EXPECTED_FOLDER EXPECTED_ARCHS [CUDA_HOME] -- OPTIONS...
plan() {
    local name=$1 folder=$2 archs=$3 home=$4; shift 5
    local out dir
    out=$(PATH="$TMP/bin:$BASE" CUDA_HOME=$home ./build.sh --dry-run "$@" 2>&1)
    dir=$(PATH="$TMP/bin:$BASE" CUDA_HOME=$home ./build.sh --print-dir "$@" 2>&1)
    if echo "$out" | grep -qx "folder: $folder" && echo "$out" | grep -qx "cuda archs: $archs" && [ "$dir" = "$folder" ]; then
        ok "build: $name"
    else
        notok "build: $name" "expected folder $folder, archs '$archs'" "plan: $(echo $out)" "--print-dir: $dir"
    fi
}

fake_smi '9.0\n' 0
plan "one H200 (9.0): sm_90 in build/cuda-90" build/cuda-90 90 "$TMP/cuda" --
fake_smi '9.0\n9.0\n' 0
plan "two H200s: 90 once" build/cuda-90 90 "$TMP/cuda" --
fake_smi '9.0\n8.6\n9.0\n' 0
plan "8.6 + 9.0: both, sorted, a folder of their own" build/cuda-86-90 "86 90" "$TMP/cuda" --
fake_smi '12.0\n' 0
plan "12.0 -> 120" build/cuda-120 120 "$TMP/cuda" --
plan "a GPU but --cpu: CPU only" build/cpu "none (CPU only)" "$TMP/cuda" -- --cpu
plan "a GPU but --asan: build/asan, CPU only" build/asan "none (CPU only)" "$TMP/cuda" -- --asan

fake_smi '' 0
plan "nvidia-smi lists no GPU: CPU only" build/cpu "none (CPU only)" "$TMP/cuda" --
out=$(PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/cuda ./build.sh --dry-run 2>&1)
echo "$out" | grep -q -- '--cuda-archs' && echo "$out" | grep -q -- '--all-archs' \
    && ok "build: the no-GPU notice says how to build the GPU code anyway" \
    || notok "build: the no-GPU notice says how to build the GPU code anyway" "$out"
fake_smi 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver\n' 9
plan "nvidia-smi fails (no driver): CPU only" build/cpu "none (CPU only)" "$TMP/cuda" --
rm -f "$TMP/bin/nvidia-smi"
plan "no nvidia-smi: CPU only" build/cpu "none (CPU only)" "$TMP/cuda" --
plan "--cuda-archs 90 without a GPU" build/cuda-90 90 "$TMP/cuda" -- --cuda-archs 90
plan "--cuda-archs 90,8.6: sorted" build/cuda-86-90 "86 90" "$TMP/cuda" -- --cuda-archs 90,8.6
plan "--cuda-archs '89 80'" build/cuda-80-89 "80 89" "$TMP/cuda" -- --cuda-archs "89 80"
plan "--all-archs: the Makefile's list, build/cuda-all" build/cuda-all \
    "$(sed -n 's/^CUDA_ARCHS ?= *//p' Makefile)" "$TMP/cuda" -- --all-archs
fake_smi '9.0\n' 0
plan "a GPU but no toolkit: CPU only" build/cpu "none (CPU only)" "$TMP/nocuda" --

# errors: exit 2 (bad option) or 1 (no toolkit for an explicit CUDA build), naming the value
PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/cuda expect_exit "build: --cuda-archs sm90 is refused" 2 ./build.sh --dry-run --cuda-archs sm90 \
    && expect_grep "build: the error names 'sm90'" "$TMP/err" "'sm90'"
PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/cuda expect_exit "build: --cuda-archs without a value" 2 ./build.sh --cuda-archs
PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/nocuda expect_exit "build: --all-archs without nvcc fails" 1 ./build.sh --dry-run --all-archs \
    && expect_grep "build: ... saying nvcc is missing" "$TMP/err" "nvcc"
PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/cuda expect_exit "build: an unknown option" 2 ./build.sh --gpu-archs 90
dir=$(PATH="$TMP/bin:$BASE" CUDA_HOME=$TMP/nocuda ./build.sh --print-dir --cuda-archs 90 2>&1)
[ "$dir" = build/cuda-90 ] && ok "build: --print-dir names the CUDA folder without a toolkit" \
    || notok "build: --print-dir names the CUDA folder without a toolkit" "got: $dir"
