/* fp8_rows.cu — test-only: the device code of the fp8 KV-cache write
 * (warp_quantize_fp8, attention_common.cuh) over whole rows, so
 * test_attention can compare its bytes with the host's fp8_quantize_row.
 * Compiled into the GPU checks only. */
#include <stdint.h>

#include "kernels/cuda/attention_common.cuh"
#include "tests/gpu/fp8_rows.h"

/* A warp per row of x [rows][n] (fp32) to codes [rows][n] and scales [rows]. */
static __global__ void kernel_fp8_quantize_rows(uint8_t *codes, float *scales, const float *x, const float *fixed,
                                                int rows, int n) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r < rows)
        warp_quantize_fp8(x + (int64_t)r * n, n, codes + (int64_t)r * n, scales + r, fixed ? fixed + r : nullptr);
}

extern "C" void cuda_fp8_quantize_rows(uint8_t *codes, float *scales, const float *x, const float *fixed, int rows,
                                       int n, cudaStream_t s) {
    if (rows > 0) kernel_fp8_quantize_rows<<<(rows + 7) / 8, 256, 0, s>>>(codes, scales, x, fixed, rows, n);
}
