/* gemm_bi.cuh — the batch-invariant GEMM (kernels/cuda/gemm_bi.cu):
 * y[T][ldc] (columns 0..M-1) = x[T][K] @ W[M][K]^T (+ bias[M]), bf16 in,
 * fp32 accumulate, bf16 or fp32 out, whose every output element has ONE
 * reduction order whatever T is and whichever tile shape computes it.
 *
 * The order: a chain of tensor-core mma.sync m16n8k16 steps over k = 0, 16,
 * 32, ... ceil(K/16)*16 (the tail zero-padded), one fp32 accumulator started
 * at 0, W as the A operand and x as the B operand; then + bias[m] in fp32 and
 * one rounding to the output type. Every tile configuration runs exactly that
 * chain (no split-K, no skipped or extra k steps), so a row of x gives the
 * same bits alone (T = 1) or inside any batch, and the configuration can be
 * chosen per (M, T) for speed alone: narrow tiles that stream W for decode
 * (T <= 64), wide ones for prefill.
 *
 * Stream last; returns 0 or -1 with err. */
#ifndef CLLM_GEMM_BI_CUH
#define CLLM_GEMM_BI_CUH

#include <cuda_runtime.h>
#include <stdbool.h>

#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_BI_CONFIGS 6  /* tile configurations (cuda_gemm_bi_config), each one cuda_gemm_bi picks for some (M, T) */

/* W [M][K], x [T][K] bf16 (uint16 bit patterns) row-major; y [T][ldc] bf16 or fp32 (y_f32); bias
 * fp32 [M] or NULL. Any M, T, K >= 1 (16-byte loads when K % 8 == 0 and
 * W, x are 16-byte aligned, element loads otherwise: same sums). */
int cuda_gemm_bi(void *y, bool y_f32, int ldc, const void *W, const void *x, const float *bias,
                 int M, int T, int K, cudaStream_t s, Err *err);

/* The same with the tile configuration forced (0 .. GEMM_BI_CONFIGS-1; -1:
 * the one cuda_gemm_bi picks): checks and timings. */
int cuda_gemm_bi_config(void *y, bool y_f32, int ldc, const void *W, const void *x,
                        const float *bias, int M, int T, int K, int config, cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
