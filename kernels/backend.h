/* backend.h — the narrow interface between model/forward.c and the kernels.
 *
 * forward.c is written once against these ops; the CPU backend (fp32,
 * kernels/backend_cpu.c) and the CUDA backend implement them. Activation
 * buffers are opaque: the backend chooses their element type and memory from
 * their kind (BUF_ACT: host fp32 on the CPU, device bf16 on the GPU;
 * BUF_F32: fp32 everywhere); forward.c only passes them between ops. Weights
 * are WeightRefs whose data the backend prepared (backend->weights).
 *
 * A step's host inputs (token ids, attention metadata, the rows that need
 * logits) are handed over once, to begin_step; the ops read the backend's
 * copy. That is what lets a GPU backend replay a captured step (a CUDA graph)
 * with new inputs: begin_step fills fixed device buffers, graph_replay
 * replays, and only when it cannot are the ops issued (and maybe captured,
 * between graph_capture(true) and graph_capture(false)).
 */
#ifndef CLLM_BACKEND_H
#define CLLM_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "attention/attn_batch.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/config.h"
#include "model/err.h"
#include "model/weights.h"

/* BUF_ACT: an activation read or written by GEMMs (bf16 on the GPU);
 * BUF_F32: kept in fp32 (the residual stream, the logits). */
typedef enum { BUF_ACT, BUF_F32 } BufKind;

/* The rows the ops of a step run over: the batch's own counts, or a captured
 * graph's bucket (padding rows write no KV and their logits are never read). */
typedef struct {
    int T;          /* rows of every op but the logits */
    int n_logits;   /* rows gathered for the LM head */
} StepRows;

/* add_rmsnorm's operands (x += delta; out = rmsnorm(x) * (w + offset)) when
 * it is handed to the op that reads out (norm_qkv, norm_gate_up). */
typedef struct {
    void *x;                /* F32 [T][C] */
    const void *delta;      /* ACT [T][C], or NULL: none */
    void *out;              /* ACT [T][C] */
    const WeightRef *w;
    int C;
    float eps, offset;
} AddNorm;

typedef struct Backend Backend;
struct Backend {
    const char *name;                 /* "cpu", "cuda:0" */
    void *ctx;
    const ModelWeights *weights;      /* the model's weights as this backend reads them */
    int kv_block_size, kv_n_blocks;   /* the paged KV cache it holds */

    void *(*alloc)(Backend *be, int64_t n_elems, BufKind kind);   /* NULL on failure */
    void (*release)(Backend *be, void *buf);
    /* Takes the step's inputs: ids [T], the batch, and the rows whose logits
     * are wanted; says in *rows how many rows the ops must run over. */
    int (*begin_step)(Backend *be, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                      StepRows *rows, Err *err);
    /* true: a step captured earlier for this shape was replayed; skip the ops. */
    bool (*graph_replay)(Backend *be);
    /* Brackets the ops of a step (begin = true, then false); a backend that
     * graphs this shape captures them and then launches the graph. */
    void (*graph_capture)(Backend *be, bool begin);

    /* out[T][C] (F32) = embedding rows of the step's ids * scale */
    void (*embed)(Backend *be, void *out, const WeightRef *table, int T, float scale);
    /* x[T][C] (F32) += delta (ACT, or NULL: none); out[T][C] (ACT) = rmsnorm(x) */
    void (*add_rmsnorm)(Backend *be, void *x, const void *delta, void *out, const WeightRef *w, int T, int C,
                        float eps, float offset);
    /* out = rmsnorm(x) over rows of C (ACT; out may equal x): qk-norm, post-norms */
    void (*rmsnorm)(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                    float offset);
    /* q, k, v [T][H*D], [T][KV*D], [T][KV*Dv] = x[T][C] @ Wq, Wk, Wv (+ biases) */
    void (*qkv)(Backend *be, void *q, void *k, void *v, const void *x, const LayerWeights *lw, int T);
    /* y[T][rows] = x[T][cols] @ W[mat]^T (+ bias[mat]); ACT in and out */
    void (*matmul)(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias, int T);
    /* q, k = rmsnorm per head with layer's q_norm / k_norm (qk-norm; only
     * when the layer has them), then rope with layer's frequencies at the
     * rows' positions; then k, v go to layer's KV cache at the rows' slots
     * (a negative slot: none). */
    void (*rope_kv_write)(Backend *be, int layer, void *q, void *k, const void *v, int T);
    /* out [T][H][Dv] = attention of q [T][H][Dk] over layer's cache */
    void (*attention)(Backend *be, void *out, const void *q, int layer, const AttnParams *p, int T);
    /* Optional: rope_kv_write, then attention, as one op where the backend
     * can (q, k may be left as they came: no other op reads them); false:
     * nothing done, the caller runs the two. */
    bool (*rope_attention)(Backend *be, int layer, void *out, void *q, void *k, const void *v, const AttnParams *p,
                           int T);
    /* out[T][F] = act(x @ Wgate[mat] + bg) * (x @ Wup[mat] + bu) */
    void (*gate_up)(Backend *be, void *out, const void *x, const LayerWeights *lw, int mat, int T, Activation act,
                    float limit);
    /* Optional (NULL: add_rmsnorm, then qkv / gate_up on n->out): the two in
     * one call, so a backend can fold the norm into the product's reading of
     * x (n->out is then left unwritten: a launch less per sublayer at decode). */
    void (*norm_qkv)(Backend *be, const AddNorm *n, void *q, void *k, void *v, const LayerWeights *lw, int T);
    void (*norm_gate_up)(Backend *be, const AddNorm *n, void *out, const LayerWeights *lw, int T, Activation act,
                         float limit);
    /* Optional (NULL: never): x[T][rows] (F32) += (in @ W[mat]^T + bias)
     * rounded to ACT, stored by the matrix product itself, where the backend
     * can (true); false: nothing done (the caller runs matmul and has the
     * result added by the next add_rmsnorm). */
    bool (*matmul_add)(Backend *be, void *x, const void *in, const WeightRef *w, int mat, const WeightRef *bias, int T);
    /* out[T][C] = the mixture-of-experts MLP of x[T][C] (router, top-k, experts). */
    void (*moe)(Backend *be, void *out, const void *x, const LayerWeights *lw, const ModelConfig *c, int T);
    /* dst row i = src row logit_rows[i] of the step (ACT, C wide), i < n */
    void (*gather_rows)(Backend *be, void *dst, const void *src, int n, int C);
    /* logits[n][V] (F32) = x[n][C] (ACT) @ W^T, then soft-capped when cap > 0 */
    void (*logits)(Backend *be, void *logits, const void *x, const WeightRef *w, int n, float cap);
    /* Copies n values of buf to / from host fp32 memory; read ends the step
     * and reports the first error of its ops. */
    int (*read)(Backend *be, float *host, const void *buf, int64_t n, Err *err);
    int (*write)(Backend *be, void *buf, const float *host, int64_t n, Err *err);
    /* Optional (NULL: none): draws tokens[i] from logits row i (F32, n rows,
     * after the step was read) with samplers[i], as sampler_sample would, and
     * advances each generator; the caller accepts the tokens. Returns 0, 1
     * when these samplers are beyond it (nothing touched: sample on the
     * host), or -1 with err. */
    int (*sample)(Backend *be, void *logits, int n, Sampler *const *samplers, int32_t *tokens, Err *err);
    /* Optional (NULL: a pipeline hands buffers over through host memory with
     * read and write): passes n elements of buf (kind) to the next pipeline
     * stage's backend / receives them from the previous one's, in the order
     * of the step's ops (no wait: read waits, and times out on a dead peer). */
    int (*send_next)(Backend *be, const void *buf, int64_t n, Err *err);
    int (*recv_prev)(Backend *be, void *buf, int64_t n, Err *err);
    void (*destroy)(Backend *be);
};

/* The CPU backend for a loaded model: a thread pool (n_threads <= 0: one per
 * core) and a host KV cache of n_blocks blocks of block_size tokens, fp32
 * (backend_cpu_create) or of kv_dtype (KV_DTYPE_FP8: e4m3 + scales). */
Backend *backend_cpu_create(const ModelConfig *c, const ModelWeights *w, int n_threads, int block_size,
                            int n_blocks, Err *err);
Backend *backend_cpu_create_kv(const ModelConfig *c, const ModelWeights *w, int n_threads, int block_size,
                               int n_blocks, KVDtype kv_dtype, Err *err);

/* Rope tables of every layer, as both backends precompute them at creation:
 * inv_freq [n_layers][rope_dim/2] and mscale [n_layers]; freed by the caller. */
int backend_rope_tables(const ModelConfig *c, const ModelWeights *w, float **inv_freq, float **mscale, Err *err);

#endif
