/* norm.cuh — RMSNorm on the device (kernels/cuda/norm.cu), as
 * kernels/cpu/norm.c: out = x / sqrt(mean(x^2) + eps) * (w + offset), fp32
 * sums, bf16 out; the residual add fused in front where the stream is. */
#ifndef CLLM_NORM_CUH
#define CLLM_NORM_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/bf16.cuh"

/* x += delta (delta may be NULL); out = rmsnorm(x) * (w + offset) */
void cuda_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int T, int C, float eps, float offset,
                      cudaStream_t s);
void cuda_rmsnorm(bf16 *out, const bf16 *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s);

#endif
