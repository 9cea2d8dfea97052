#!/usr/bin/env bash
# build.sh — the one build command of cllm.
#
#   ./build.sh                 build ./cllm for this machine: the CUDA code for the
#                              GPUs present (nvidia-smi), CPU-only when there is none
#   ./build.sh --cpu           a CPU-only build (about 20 s on 2 cores)
#   ./build.sh --cuda-archs 90 the CUDA code for chosen compute capabilities
#                              ("90", "86 90" or "86,90"; 90 = H100/H200, 86 = RTX 30xx)
#   ./build.sh --all-archs     a distributable build: every GPU generation (80 86 89 90 + PTX)
#   ./build.sh --asan          a CPU-only cllm and tests with AddressSanitizer + UBSan
#   ./build.sh --print-dir     print the build folder the same options would use
#   ./build.sh --dry-run       print the plan (folder, CUDA archs) and build nothing
#   ./build.sh --clean         remove build outputs
#
# Steps, top to bottom: choose the configuration, check the C toolchain and
# zlib (installed when root, else say what to install), run make with
# dependency tracking (a one-file change recompiles one file) printing
# "[n/N] file" per compiled file, copy the binary to ./cllm (the last build).
# Each configuration has a folder of its own (build/cpu, build/asan,
# build/cuda-90, build/cuda-86-90, build/cuda-all): make does not notice a
# change of CUDA_ARCHS, so different arch sets never share objects.
set -euo pipefail
cd "$(dirname "$0")"

# Internal: one "[n/N] file" line, called by make ($(PROGRESS) in the Makefile)
# before each compile; the counter is shared by make's parallel jobs.
if [ "${1:-}" = --progress-step ]; then
    counter=$2 total=$3 file=$4
    exec 9>>"$counter.lock"
    command -v flock >/dev/null && flock 9
    n=$(( $(cat "$counter" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$counter"
    printf '[%d/%d] %s\n' "$n" "$total" "$file"
    exit 0
fi

mode=auto; san=0; print_dir=0; dry=0; archs=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) mode=cpu ;;
        --all-archs) mode=all ;;
        --cuda-archs)
            [ $# -ge 2 ] || { echo "build.sh: --cuda-archs needs a value, e.g. --cuda-archs 90" >&2; exit 2; }
            mode=chosen; archs=$2; shift ;;
        --cuda-archs=*) mode=chosen; archs=${1#--cuda-archs=} ;;
        --asan) san=1 ;;
        --print-dir) print_dir=1 ;;
        --dry-run) dry=1 ;;
        --clean) rm -rf build cllm; echo "cleaned"; exit 0 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown option '$1' (see ./build.sh --help)" >&2; exit 2 ;;
    esac
    shift
done

# Sorted, deduplicated, space-separated compute capabilities: "9.0 8.6 9.0" or
# "90,86" -> "86 90". Fails (naming the value) on anything but 2-3 digits.
arch_list() { # source, values
    local a out=""
    for a in $(echo "$2" | tr ',' ' '); do
        a=${a//./}
        case "$a" in
            [1-9][0-9]|[1-9][0-9][0-9]) out="$out $a" ;;
            *) echo "build.sh: $1: '$a' is not a compute capability (e.g. 90 or 9.0)" >&2; return 1 ;;
        esac
    done
    echo "$out" | tr ' ' '\n' | sed '/^$/d' | sort -n -u | tr '\n' ' ' | sed 's/ $//'
}

# 0. The configuration and its folder.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
have_nvcc=0
if command -v nvcc >/dev/null || [ -x "$CUDA_HOME/bin/nvcc" ]; then have_nvcc=1; fi
all_archs=$(sed -n 's/^CUDA_ARCHS ?= *//p' Makefile)
cuda=0; notice=""
if [ "$san" = 1 ]; then
    build=build/asan
elif [ "$mode" = cpu ]; then
    build=build/cpu
elif [ "$mode" = all ]; then
    cuda=1; archs=$all_archs; build=build/cuda-all
elif [ "$mode" = chosen ]; then
    archs=$(arch_list "--cuda-archs" "$archs") || exit 2
    [ -n "$archs" ] || { echo "build.sh: --cuda-archs: no compute capability given (e.g. --cuda-archs 90)" >&2; exit 2; }
    cuda=1; build=build/cuda-$(echo "$archs" | tr ' ' '-')
elif [ "$have_nvcc" = 0 ]; then
    build=build/cpu
    notice="no CUDA toolkit found (nvcc); building a CPU-only cllm"
else
    # the GPUs this machine has; none (or no driver) -> CPU-only
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null) || caps=""
    archs=$(arch_list "nvidia-smi --query-gpu=compute_cap" "$caps" 2>/dev/null) || archs=""
    if [ -n "$archs" ]; then
        cuda=1; build=build/cuda-$(echo "$archs" | tr ' ' '-')
    else
        build=build/cpu
        notice="no NVIDIA GPU found (nvidia-smi); building a CPU-only cllm (for the GPU code anyway: ./build.sh --cuda-archs 90, or --all-archs)"
    fi
fi
# the folder needs no toolkit: scripts ask for it on any machine
if [ "$print_dir" = 1 ]; then echo "$build"; exit 0; fi
if [ "$cuda" = 1 ] && [ "$have_nvcc" = 0 ]; then
    echo "build.sh: the CUDA build needs the CUDA 13 toolkit (nvcc), not found in PATH or $CUDA_HOME/bin; set CUDA_HOME, or build with --cpu" >&2
    exit 1
fi
if [ "$dry" = 1 ]; then
    echo "folder: $build"
    if [ "$cuda" = 1 ]; then echo "cuda archs: $archs"; else echo "cuda archs: none (CPU only)"; fi
    [ -z "$notice" ] || echo "notice: $notice"
    exit 0
fi

# 1. C compiler and make.
for tool in cc make; do
    if ! command -v "$tool" >/dev/null; then
        echo "build.sh: '$tool' not found; install it with: apt-get install build-essential" >&2
        exit 1
    fi
done

# 2. zlib headers and static archive (for .gz prompt and output files; linked
#    in, so the binary needs no libz at run time).
if ! echo '#include <zlib.h>' | cc -E - >/dev/null 2>&1 || [ "$(cc -print-file-name=libz.a)" = libz.a ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "build.sh: installing zlib1g-dev"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zlib1g-dev >/dev/null
    else
        echo "build.sh: zlib headers or its static archive (libz.a) missing; install them with: sudo apt-get install zlib1g-dev" >&2
        exit 1
    fi
fi

[ -z "$notice" ] || echo "build.sh: notice: $notice"

# 3. Compile and link: count the files make would compile (make -n prints the
#    PROGRESS marker of each), then build, one "[n/N] file" line per file.
start=$SECONDS
jobs=$(nproc 2>/dev/null || echo 2)
margs=(BUILD="$build" CUDA="$cuda" SAN="$san")
[ "$cuda" = 0 ] || margs+=(CUDA_ARCHS="$archs")
total=$(make -n "${margs[@]}" PROGRESS=":progress:" all | grep -c "^:progress: " || true)
mkdir -p "$build"
rm -f "$build/.progress" "$build/.progress.lock"
make -s -j"$jobs" "${margs[@]}" PROGRESS="$PWD/build.sh --progress-step $PWD/$build/.progress $total" all
rm -f "$build/.progress" "$build/.progress.lock"
took=$((SECONDS - start)); took="$((took / 60))m$((took % 60))s"
if [ "$san" = 0 ]; then
    cp "$build/cllm" ./cllm
    # build/cuda: the last CUDA build (tests/gpu/*.sh and bench/ default to it);
    # a real folder there (an older build.sh's) is left alone
    if [ "$cuda" = 1 ] && { [ -L build/cuda ] || [ ! -e build/cuda ]; }; then ln -sfn "${build#build/}" build/cuda; fi
    if [ "$cuda" = 1 ]; then echo "build.sh: built ./cllm from $build (CUDA sm_${archs// /\/sm_} + PTX, and CPU backends) in $took"
    else echo "build.sh: built ./cllm from $build (CPU backend only) in $took"; fi
else
    echo "build.sh: built $build/cllm and tests with AddressSanitizer + UBSan in $took"
fi
