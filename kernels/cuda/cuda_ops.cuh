/* cuda_ops.cuh — launchers of the elementwise / norm / rope / attention
 * kernels of the CUDA backend (kernels/cuda/cuda_ops.cu) and of the bf16
 * matrix-vector kernels (kernels/cuda/gemv.cu).
 *
 * Element types: activations between GEMMs are bf16 [T][width]; the residual
 * stream and the logits are fp32; weights are bf16 (matrices) or fp32
 * (vectors: norms, biases, sinks); the KV cache is bf16 or fp8 (e4m3 codes
 * and a scale per head vector: KVLayerDev of attention.cuh), per layer
 * K [n_blocks][block_size][KV][Dk] and V [n_blocks][block_size][KV][Dv]
 * (a slot = block * block_size + offset). Every kernel accumulates in fp32.
 * Stream last. */
#ifndef CLLM_CUDA_OPS_CUH
#define CLLM_CUDA_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/attn_batch.h"
#include "kernels/activation.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/gemv_out.cuh"

typedef __nv_bfloat16 bf16;

/* Attention metadata on the device: tables flattened to [n_seqs][max_blocks]. */
typedef struct {
    int n_tokens;
    const int32_t *pos, *seq;
    const int64_t *slot;            /* < 0: a padding row, nothing written */
    const int32_t *tables;
    int max_blocks, block_size;
} DevAttnBatch;

/* The gated activations of cpu_glu, on one fp32 pair. */
static __device__ __forceinline__ float act_glu(float g, float u, Activation act, float limit) {
    if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    if (act == ACT_SWIGLU_OAI) {
        if (limit > 0) { g = fminf(g, limit); u = fminf(fmaxf(u, -limit), limit); }
        return (u + 1.0f) * g / (1.0f + expf(-1.702f * g));
    }
    return g / (1.0f + expf(-g)) * u;
}

void cuda_embed(float *out, const bf16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s);
/* x += delta (delta may be NULL); out = rmsnorm(x) * (w + offset) */
void cuda_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int T, int C, float eps, float offset,
                      cudaStream_t s);
void cuda_rmsnorm(bf16 *out, const bf16 *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s);
/* qkv [T][nq+nk+nv] -> q [T][nq], k [T][nk], v [T][nv] (+ biases, each may be NULL) */
void cuda_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk, const float *bv,
                    int T, int nq, int nk, int nv, cudaStream_t s);
void cuda_add_bias(void *y, bool y_f32, const float *bias, int T, int n, cudaStream_t s); /* y bf16 or fp32 */
/* qk-norm weights [D] of q and k heads (NULL: none), as in cuda_rmsnorm. */
typedef struct {
    const float *q, *k;
    float eps, offset;
} QkNorm;
/* qk-norm (per qk), then rope on q [T][H][D] and k [T][KV][D] in place
 * (first rot_dim channels of each head, inv_freq [rot_dim/2]), then k, v
 * rows to the cache at slot[t] (skipped when slot < 0 or >= n_slots); an
 * fp8 cache gets each head vector quantized as fp8_quantize_row does it. */
void cuda_rope_kv_write(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, const DevAttnBatch *b, int n_heads,
                        int n_kv_heads, int head_dim_k, int head_dim_v, int rot_dim, const float *inv_freq,
                        float mscale, bool neox, int64_t n_slots, const QkNorm *qk, cudaStream_t s);
/* out [T][H][Dv] (bf16) = attention of q [T][H][Dk] (bf16) over the paged cache:
 * the simple kernel, for any head size and block size (the backend uses it
 * where kernels/cuda/attention.cuh has no kernel for the variant). */
void cuda_attention_generic(bf16 *out, const bf16 *q, const KVLayerDev *kv, const DevAttnBatch *b, const AttnParams *p,
                            cudaStream_t s);
/* out[t][i] = act(gate[t*ld + i] + bg[i]) * (up[t*ld + i] + bu[i]), i < F (biases may be NULL) */
void cuda_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu, int T, int F,
              Activation act, float limit, cudaStream_t s);
void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s);
void cuda_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int n, int C, cudaStream_t s);
/* out[rows[i]] += w[i] * src[i] for i < n, fp32 accumulation (MoE combine; a
 * row repeats only across calls). */
void cuda_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s);
void cuda_f32_to_bf16(bf16 *out, const float *x, int64_t n, cudaStream_t s);

/* gemv.cu: y[t][m] = sum_k W[m][k] x[t][k] (+ bias[m]) for T <= GEMV_MAX_T rows,
 * W [M][K] bf16, x [T][K] bf16, y bf16 or fp32 (y_f32), row stride M. */
#define GEMV_MAX_T 8
void cuda_gemv(void *y, bool y_f32, const bf16 *W, const bf16 *x, const float *bias, int M, int K, int T,
               cudaStream_t s);
/* The same with y stored in parts (a fused Q|K|V matrix: gemv_out.cuh; o->end[2] = M). */
void cuda_gemv_parts(const GemvOut *o, const bf16 *W, const bf16 *x, int M, int K, int T, cudaStream_t s);
/* The gate/up pair of a GLU MLP from one concatenated W [2F][K] (gate rows
 * 0..F, up rows F..2F): out[t][i] = act(gate + bg) * (up + bu). */
void cuda_gemv_glu(bf16 *out, const bf16 *W, const bf16 *x, const float *bg, const float *bu, int F, int K, int T,
                   Activation act, float limit, cudaStream_t s);

/* Decode MoE: pair p (< n_pairs) runs expert sel[p] on x row p / x_div.
 * Wb != NULL: out[p][M] = act(Wa[e] x + ba[e]) * (Wb[e] x + bb[e]) (gate/up,
 * each [E][M][K]); else out[p][M] = Wa[e] x + ba[e] (down). Biases may be NULL. */
void cuda_gemv_experts(bf16 *out, const bf16 *Wa, const bf16 *Wb, const float *ba, const float *bb, const bf16 *x,
                       int x_div, const int32_t *sel, int n_pairs, int M, int K, Activation act, float limit,
                       cudaStream_t s);
/* Router top-k on the device: per row t of logits [T][E] (fp32), the k best
 * experts sel[t][k] (ties: the lower id) and the softmax of their logits w[t][k]. */
void cuda_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k, cudaStream_t s);
/* out[t][C] (bf16) = sum_j w[t][j] * y[t*k + j][C] */
void cuda_moe_combine(bf16 *out, const bf16 *y, const float *w, int T, int k, int C, cudaStream_t s);

#endif
