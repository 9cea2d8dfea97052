#!/usr/bin/env bash
# tests/gpu/unbundle.sh — on the GPU machine: unpacks .gpu/bundle.tar.xz
# (tests/gpu/bundle.sh) into build/cuda, links the GPU checks there with the
# same libraries as the Makefile, and unpacks any other .gpu/NAME.xz to
# build/NAME.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build/cuda
mkdir -p "$B"
tar -xJf .gpu/bundle.tar.xz -C "$B"
# cllm opens cuBLASLt and NCCL at run time (kernels/cuda/cuda_libs.c); only
# test_quant_gemm calls cuBLASLt itself (its reference GEMM), hence
# --as-needed. The versioned sonames: a runtime-only install has no
# unversioned .so links.
dirs=$(ldconfig -p | grep -E 'lib(cublasLt|z)\.so' | sed 's,.*=> ,,;s,/[^/]*$,,' | sort -u | sed 's,^,-L,')
LIBS="-L${CUDA_HOME:-/usr/local/cuda}/lib64 $dirs -lcudart_static -ldl -lrt -lstdc++ -l:libz.so.1 -lm -pthread
      -Wl,--as-needed -l:libcublasLt.so.13"
extra=$(ls "$B"/tests/gpu/*.o | grep -v '/test_' || true) # test-only device code (tests/gpu/*.cu)
for o in "$B"/tests/gpu/test_*.o; do
    cc -o "${o%.o}" "$o" "$B"/tests/ref/*.o $extra "$B/libcllm.a" $LIBS &
done
wait
for x in .gpu/*.xz; do
    n=$(basename "$x" .xz)
    [ "$n" = bundle.tar ] || { xz -dc "$x" > "build/$n"; chmod +x "build/$n"; }
done
ls "$B"/tests/gpu/ | grep -v '\.o$' | tr '\n' ' '; echo
