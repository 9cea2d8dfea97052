/* cuda_ops.cuh — launchers of the elementwise / norm / rope / attention
 * kernels of the CUDA backend (kernels/cuda/cuda_ops.cu). Activations are
 * fp32 [T][C]; weights bf16 (matrices) or fp32 (vectors); the KV cache fp32
 * in the host layout of attention/kv_cache.h. Stream last. */
#ifndef CLLM_CUDA_OPS_CUH
#define CLLM_CUDA_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attention/attn_batch.h"
#include "kernels/cpu/cpu_ops.h"

/* Attention metadata on the device: tables flattened to [n_seqs][max_blocks]. */
typedef struct {
    int n_tokens;
    const int32_t *pos, *seq;
    const int64_t *slot;
    const int32_t *tables;
    int max_blocks, block_size;
} DevAttnBatch;

void cuda_embed(float *out, const __nv_bfloat16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s);
void cuda_to_bf16(__nv_bfloat16 *out, const float *x, int64_t n, cudaStream_t s);
void cuda_add_bias(float *y, const float *bias, int T, int n, cudaStream_t s);
void cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s);
void cuda_add(float *x, const float *d, int64_t n, cudaStream_t s);
void cuda_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim, const float *inv_freq,
               float mscale, bool neox, cudaStream_t s);
void cuda_kv_write(float *kc, float *vc, const int64_t *slot, const float *k, const float *v, int T, int kw, int vw,
                   cudaStream_t s);
void cuda_attention(float *out, const float *q, const float *kc, const float *vc, const DevAttnBatch *b,
                    const AttnParams *p, const float *sinks, cudaStream_t s);
void cuda_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit, cudaStream_t s);
void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s);
void cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int C, cudaStream_t s);
/* out[rows[i]] += w[i] * src[i] for i < n (MoE combine; rows may repeat only across calls). */
void cuda_scatter_add(float *out, const float *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s);

#endif
