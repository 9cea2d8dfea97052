/* moe.cuh — the routing and combining kernels of a mixture-of-experts MLP
 * at decode (kernels/cuda/moe.cu); the experts' products are
 * gemv.cuh's cuda_gemv_experts. */
#ifndef CLLM_MOE_CUH
#define CLLM_MOE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/bf16.cuh"

/* Router top-k on the device: per row t of logits [T][E] (fp32), the k best
 * experts sel[t][k] (ties: the lower id) and the softmax of their logits w[t][k]. */
void cuda_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k, cudaStream_t s);
/* out[t][C] (bf16) = sum_j w[t][j] * y[t*k + j][C] */
void cuda_moe_combine(bf16 *out, const bf16 *y, const float *w, int T, int k, int C, cudaStream_t s);

#endif
