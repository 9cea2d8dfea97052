#!/usr/bin/env bash
# build.sh — the one build command of cllm.
#
#   ./build.sh            build ./cllm (CUDA when nvcc is found, else CPU-only)
#   ./build.sh --cpu      force a CPU-only build
#   ./build.sh --asan     build a CPU-only cllm and tests with AddressSanitizer + UBSan
#   ./build.sh --print-dir   print the build folder the same options would use
#   ./build.sh --clean    remove build outputs
#
# Steps, top to bottom: check the C toolchain and zlib (install zlib's headers
# and static archive when root, else say what to install), find the CUDA toolkit, run make with
# dependency tracking (a one-file change recompiles one file), copy the
# binary to ./cllm. Each configuration has a folder of its own (build/cpu,
# build/cuda, build/asan), so builds of any order never mix objects.
set -euo pipefail
cd "$(dirname "$0")"

mode=auto; san=0; print_dir=0
for arg in "$@"; do
    case "$arg" in
        --cpu) mode=cpu ;;
        --asan) san=1 ;;
        --print-dir) print_dir=1 ;;
        --clean) rm -rf build cllm; echo "cleaned"; exit 0 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown option '$arg' (see ./build.sh --help)" >&2; exit 2 ;;
    esac
done

# 0. The configuration and its folder.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cuda=0
if [ "$mode" = auto ] && [ "$san" = 0 ] && { command -v nvcc >/dev/null || [ -x "$CUDA_HOME/bin/nvcc" ]; }; then
    cuda=1
fi
if [ "$san" = 1 ]; then build=build/asan; elif [ "$cuda" = 1 ]; then build=build/cuda; else build=build/cpu; fi
if [ "$print_dir" = 1 ]; then echo "$build"; exit 0; fi

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

# 3. CUDA toolkit.
if [ "$mode" = auto ] && [ "$san" = 0 ] && [ "$cuda" = 0 ]; then
    echo "build.sh: notice: no CUDA toolkit found (nvcc); building a CPU-only cllm"
fi

# 4. Compile and link.
jobs=$(nproc 2>/dev/null || echo 2)
make -s -j"$jobs" BUILD="$build" CUDA="$cuda" SAN="$san" all
if [ "$san" = 0 ]; then
    cp "$build/cllm" ./cllm
    if [ "$cuda" = 1 ]; then echo "build.sh: built ./cllm (CUDA sm_80/sm_86/sm_89/sm_90a + PTX, and CPU backends)"
    else echo "build.sh: built ./cllm (CPU backend only)"; fi
else
    echo "build.sh: built $build/cllm and tests with AddressSanitizer + UBSan"
fi
