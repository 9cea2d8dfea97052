/* backend.h — the narrow interface between model/forward.c and the kernels.
 *
 * forward.c is written once against these ops; the CPU backend (fp32,
 * kernels/backend_cpu.c) and the CUDA backend implement them. Activation
 * buffers are opaque: the backend chooses their element type and memory (host
 * fp32 on the CPU, device bf16/fp32 on the GPU); forward.c only passes them
 * between ops. Weights are WeightRefs whose data the backend prepared
 * (backend->weights). Host arrays (ids, positions, attention metadata) are
 * passed as host pointers; a GPU backend copies them in begin_step.
 */
#ifndef CLLM_BACKEND_H
#define CLLM_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "attention/attn_batch.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/config.h"
#include "model/err.h"
#include "model/weights.h"

typedef struct Backend Backend;
struct Backend {
    const char *name;                 /* "cpu", "cuda:0" */
    void *ctx;
    const ModelWeights *weights;      /* the model's weights as this backend reads them */
    int kv_block_size, kv_n_blocks;   /* the paged KV cache it holds */

    void *(*alloc)(Backend *be, int64_t n_elems);   /* activation buffer; NULL on failure */
    void (*release)(Backend *be, void *buf);
    int (*begin_step)(Backend *be, const int32_t *ids, const AttnBatch *b, Err *err);

    void (*embed)(Backend *be, void *out, const WeightRef *table, const int32_t *ids, int T, float scale);
    /* y[T][rows] = x[T][cols] @ W[mat]^T (+ bias[mat]) */
    void (*matmul)(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias, int T);
    void (*rmsnorm)(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                    float offset);
    void (*add)(Backend *be, void *x, const void *delta, int64_t n);
    void (*rope)(Backend *be, void *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim,
                 const float *inv_freq, float mscale, bool neox);
    void (*kv_write)(Backend *be, int layer, const AttnBatch *b, const void *k, const void *v);
    void (*attention)(Backend *be, void *out, const void *q, int layer, const AttnBatch *b, const AttnParams *p);
    void (*glu)(Backend *be, void *out, const void *gate, const void *up, int64_t n, Activation act, float limit);
    /* out[T][C] = the mixture-of-experts MLP of x[T][C] (router, top-k, experts). */
    void (*moe)(Backend *be, void *out, const void *x, const LayerWeights *lw, const ModelConfig *c, int T);
    void (*softcap)(Backend *be, void *x, int64_t n, float cap);
    /* dst rows i = src rows rows[i] (C wide), for picking the rows that need logits. */
    void (*gather_rows)(Backend *be, void *dst, const void *src, const int32_t *rows, int n, int C);
    /* Copies n fp32 values of buf to host memory. */
    int (*read)(Backend *be, float *host, const void *buf, int64_t n, Err *err);
    void (*destroy)(Backend *be);
};

/* The CPU backend for a loaded model: a thread pool (n_threads <= 0: one per
 * core) and a host KV cache of n_blocks blocks of block_size tokens. */
Backend *backend_cpu_create(const ModelConfig *c, const ModelWeights *w, int n_threads, int block_size,
                            int n_blocks, Err *err);

#endif
