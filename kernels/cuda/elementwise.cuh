/* elementwise.cuh — the small kernels between the GEMMs
 * (kernels/cuda/elementwise.cu): embedding lookup, splitting a fused q|k|v
 * product, biases, gated activations, soft-cap, row gather / scatter-add,
 * fp32 to bf16. Each mirrors its CPU reference; arithmetic is fp32. */
#ifndef CLLM_ELEMENTWISE_CUH
#define CLLM_ELEMENTWISE_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/activation.h"
#include "kernels/cuda/bf16.cuh"

void cuda_embed(float *out, const bf16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s);
/* qkv [T][nq+nk+nv] -> q [T][nq], k [T][nk], v [T][nv] (+ biases, each may be NULL) */
void cuda_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk, const float *bv,
                    int T, int nq, int nk, int nv, cudaStream_t s);
void cuda_add_bias(void *y, bool y_f32, const float *bias, int T, int n, cudaStream_t s); /* y bf16 or fp32 */
/* out[t][i] = act(gate[t*ld + i] + bg[i]) * (up[t*ld + i] + bu[i]), i < F (biases may be NULL) */
void cuda_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu, int T, int F,
              Activation act, float limit, cudaStream_t s);
void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s);
void cuda_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int n, int C, cudaStream_t s);
/* out[rows[i]] += w[i] * src[i] for i < n, fp32 accumulation (MoE combine; a
 * row repeats only across calls). */
void cuda_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s);
void cuda_f32_to_bf16(bf16 *out, const float *x, int64_t n, cudaStream_t s);

#endif
