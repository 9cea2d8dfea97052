/* cpu_ops.h — the CPU backend: every op of model/forward.c in plain fp32 C.
 *
 * This is the reference every CUDA kernel is checked against, so each op is
 * written for clarity first; the matmul and attention spread rows over a
 * thread pool. Activations are row-major [T][C] float arrays (T tokens,
 * C channels). Weights stay in the model file's own dtype (mmap'd) and are
 * dequantized a row at a time inside the matmul, so a quantized model keeps
 * its small memory on the CPU too.
 */
#ifndef CLLM_CPU_OPS_H
#define CLLM_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/attn_batch.h"
#include "kernels/attn_cascade.h"
#include "kernels/activation.h"
#include "kernels/cpu/kv_cache_host.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/thread_pool.h"


/* A weight matrix W [rows][cols] (PyTorch Linear layout: rows = out features)
 * in any dtype; row r starts at data + r * row_bytes. DT_F8_E4M3: row r's
 * values are its codes times scale[r], and input_scale is the static
 * activation scale (0: per token), as in WeightRef. */
typedef struct {
    const void *data;
    DType type;
    int64_t rows, cols;
    uint64_t row_bytes;
    const float *scale;
    float input_scale;
} CpuMatrix;

/* y[T][rows] = x[T][cols] @ W^T (+ bias[rows] when bias != NULL). An FP8
 * matrix multiplies FP8 activations (matmul.c says how x is rounded). */
void cpu_matmul(ThreadPool *tp, float *y, const float *x, const CpuMatrix *w, const float *bias, int T);

/* out[t] = embedding row ids[t] of table E [vocab][C] (any dtype), times scale. */
void cpu_embed(float *out, const CpuMatrix *table, const int32_t *ids, int T, float scale);

/* RMSNorm of each row: out = x / sqrt(mean(x^2) + eps) * (w + w_offset).
 * out may equal x. */
void cpu_rmsnorm(float *out, const float *x, const float *w, int T, int C, float eps, float w_offset);

/* x += delta, then out = rmsnorm(x) (the fused residual add + norm). */
void cpu_add_rmsnorm(float *x, const float *delta, float *out, const float *w, int T, int C, float eps,
                     float w_offset);

void cpu_add(float *x, const float *delta, int64_t n);       /* x += delta */

/* Rotary embedding in place on x [T][n_heads][head_dim], rotating the first
 * rot_dim channels of each head. inv_freq [rot_dim/2] already holds any
 * scaling (linear / llama3 / yarn); mscale multiplies cos and sin (yarn).
 * neox: pairs (i, i + rot_dim/2) (HF rotate_half); else pairs (2i, 2i+1). */
void cpu_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim,
              const float *inv_freq, float mscale, bool neox);

/* Writes k [T][n_kv_heads][head_dim_k] and v [T][n_kv_heads][head_dim_v] into
 * layer `layer` of the cache at batch->slot[t] (an fp8 cache quantizes each
 * head vector: kv_cache_store). */
void cpu_kv_write(KVCacheHost *c, int layer, const AttnBatch *batch, const float *k, const float *v);
/* --kv-scales calibrate: the static scales of layer `layer` (c->k_fixed /
 * v_fixed) from k and v as cpu_kv_write takes them: per KV head, amax over
 * the rows the batch writes (a valid slot), fp8_scale_of_amax. false (and
 * nothing set) when no row of the batch is written. */
bool cpu_kv_calibrate(KVCacheHost *c, int layer, const AttnBatch *batch, const float *k, const float *v);

/* out [T][n_heads][head_dim_v] = attention of q [T][n_heads][head_dim_k] over
 * the cached keys/values of each row's sequence, exactly as DESIGN.md defines
 * it (scale, soft-cap, causal, window, sinks, GQA). */
void cpu_attention(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                   const AttnBatch *batch, const AttnParams *p);
/* Query rows one unit of cascade's shared pass takes (times the query heads
 * of its KV head): their partial sums stay in cache while the keys stream
 * by. The backend's plan is costed with it (AttnCascadeOpts.rows_per_unit). */
#define CPU_CASCADE_UNIT_ROWS 16

/* The same with a cascade plan built from batch and p (NULL or no group:
 * cpu_attention): each group's shared prefix attended once for all its
 * rows, merged with each row's own keys by log-sum-exp; equal to
 * cpu_attention up to fp32 rounding. */
void cpu_attention_cascade(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                           const AttnBatch *batch, const AttnParams *p, const AttnCascadePlan *plan);

/* Gated activations over gate/up halves: out[t][i] = act(gate[t][i]) * up[t][i]
 * (kernels/activation.h). */
void cpu_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit);

/* Soft-cap in place: x = cap * tanh(x / cap). */
void cpu_softcap(float *x, int64_t n, float cap);

/* Row-wise in-place softmax of x [n]. */
void cpu_softmax(float *x, int n);

#endif
