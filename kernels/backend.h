/* backend.h — the narrow interface between model/forward.c and the kernels.
 *
 * forward.c is written once against these ops; the CPU backend (fp32,
 * kernels/cpu/backend_cpu.c) and the CUDA backend (kernels/cuda/) implement
 * them, and backend_create (kernels/backend.c) picks one. Everything an op
 * takes is defined at this level: the model's shape (ModelShape), its
 * weights as WeightRefs (kernels/weights.h), a step's attention metadata
 * (kernels/attn_batch.h) and plain parameters. Activation buffers are
 * opaque: the backend chooses their element type and memory from their kind
 * (BUF_ACT: host fp32 on the CPU, device bf16 on the GPU; BUF_F32: fp32
 * everywhere); forward.c only passes them between ops. Weights are
 * WeightRefs whose data the backend prepared (backend->weights).
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
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "kernels/activation.h"
#include "kernels/attn_batch.h"
#include "kernels/tp_group.h"
#include "kernels/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* What a backend needs to know of the model it runs: the sizes of its
 * buffers and the constants of its ops (the model layer fills it from its
 * config: model/config.h config_shape). */
typedef struct {
    int n_layers, dim, ffn_dim, vocab;
    int n_heads, n_kv_heads;
    int head_dim_k, head_dim_v;
    int n_experts, n_experts_used; /* 0: a dense MLP */
    float norm_eps, norm_offset;   /* RMSNorm: x / rms(x) * (w + norm_offset) */
    int rope_dim;                  /* channels rotated per head */
    bool rope_neox;                /* pairs (i, i + d/2), else (2i, 2i+1) */
    const float *rope_inv_freq;    /* [n_layers][rope_dim/2], scaling included */
    const float *rope_mscale;      /* [n_layers] multiplier of cos and sin */
    float attn_scale, attn_softcap;
    Activation act;                /* of the MLP (and the experts) */
    float act_limit;               /* ACT_SWIGLU_OAI's clamp; 0: none */
} ModelShape;

/* One row of a batched draw, as the engine's sampler would make it
 * (engine/sampler.h sampler_row): its parameters, its penalty window and
 * the uniform in [0, 1) its generator gives the next draw. */
typedef struct {
    float temperature;             /* 0: greedy */
    int top_k;
    float top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    const int32_t *pen_ids, *pen_counts; /* [n_pen] the window's distinct tokens and their counts */
    int n_pen;
    double uniform;
} SampleRow;

typedef struct Backend Backend;
struct Backend {
    const char *name;                 /* "cpu", "cuda:0" */
    void *ctx;
    int device;                       /* its GPU, or -1: the CPU */
    const ModelWeights *weights;      /* the model's weights as this backend reads them */
    int kv_block_size, kv_n_blocks;   /* the paged KV cache it holds */
    uint64_t weight_bytes;            /* bytes its copy of the weights takes (0: it reads the caller's) */
    double load_gbps;                 /* the rate they were uploaded at (0: none) */

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
    void (*moe)(Backend *be, void *out, const void *x, const LayerWeights *lw, int T);
    /* dst row i = src row logit_rows[i] of the step (ACT, C wide), i < n */
    void (*gather_rows)(Backend *be, void *dst, const void *src, int n, int C);
    /* logits[n][V] (F32) = x[n][C] (ACT) @ W^T, then soft-capped when cap > 0 */
    void (*logits)(Backend *be, void *logits, const void *x, const WeightRef *w, int n, float cap);
    /* Copies n values of buf to / from host fp32 memory; read ends the step
     * and reports the first error of its ops. */
    int (*read)(Backend *be, float *host, const void *buf, int64_t n, Err *err);
    int (*write)(Backend *be, void *buf, const float *host, int64_t n, Err *err);
    /* Optional (NULL: none): draws tokens[i] from logits row i (F32, n rows,
     * after the step was read) as rows[i] says, as the engine's sampler
     * would; drew[i] tells whether the draw used rows[i].uniform (more than
     * one candidate survived: the caller advances that generator). Returns 0,
     * 1 when these rows are beyond it (nothing touched: sample on the host),
     * or -1 with err. */
    int (*sample)(Backend *be, void *logits, int n, const SampleRow *rows, int32_t *tokens, bool *drew, Err *err);
    /* Optional, the three or none (NULL: the engine steps synchronously):
     * overlapped steps, the host building step t+1 while the backend runs
     * step t. sample_launch enqueues the draw of logits rows [0, n) as
     * sample would, its tokens kept in the backend's memory and copied to
     * the host, and the logits of the rows keep[i] marks (keep NULL: none)
     * copied as they were before the draw; it returns without waiting: 0;
     * 1 when these rows are beyond it (nothing launched: the caller reads
     * the logits and draws on the host); -1 with err. sample_result waits
     * for that draw and hands over its n tokens and drew flags (sample's
     * meaning) and each kept row i at kept + i * vocab (other rows of kept
     * untouched), and reports the first error of the step's ops; each
     * launch is taken once, before the next.
     * feed_tokens, between begin_step and the step's ops: row rows[i] of
     * the step takes as its input token the one the last launched draw gave
     * its row src[i], read from the backend's memory, so the step can be
     * launched before that token reaches the host. */
    int (*sample_launch)(Backend *be, void *logits, int n, const SampleRow *rows, const bool *keep, Err *err);
    int (*sample_result)(Backend *be, int32_t *tokens, bool *drew, float *kept, int n, Err *err);
    int (*feed_tokens)(Backend *be, const int32_t *rows, const int32_t *src, int n, Err *err);
    /* Optional (NULL: a pipeline hands buffers over through host memory with
     * read and write): passes n elements of buf (kind) to the next pipeline
     * stage's backend / receives them from the previous one's, in the order
     * of the step's ops (no wait: read waits, and times out on a dead peer). */
    int (*send_next)(Backend *be, const void *buf, int64_t n, Err *err);
    int (*recv_prev)(Backend *be, void *buf, int64_t n, Err *err);
    /* Optional (NULL: not a rank of a tensor-parallel group, BackendOptions
     * tp_group): every rank of the group calls these in the same order with
     * its own buffers. all_reduce: buf [n] (kind) = its sum over the ranks,
     * in rank order, the same bits on every rank. all_gather: dst [rows][V]
     * (F32) = every rank's src [rows][cols of that rank] side by side in rank
     * order (the logits of each rank's vocabulary range). A broken group
     * (a rank failed) makes them do nothing and the step's read fail. */
    void (*all_reduce)(Backend *be, void *buf, int64_t n, BufKind kind);
    void (*all_gather)(Backend *be, void *dst, const void *src, int rows, int cols);
    /* Optional on a rank (NULL: the group has no device transport; the
     * caller copies through the host): every rank's buf [n] (kind) = rank
     * 0's, called by every rank of the group. */
    void (*broadcast)(Backend *be, void *buf, int64_t n, BufKind kind);
    /* Optional on a rank (NULL: matmul, then all_reduce of y): y[T][rows]
     * (ACT) = the group's sum of each rank's in @ W[mat]^T (+ bias), each
     * rank's product kept in fp32 until the rank-order sum, which is
     * rounded once (as one backend rounds its whole product once). */
    void (*matmul_all_reduce)(Backend *be, void *y, const void *in, const WeightRef *w, int mat, const WeightRef *bias,
                              int T);
    /* Optional on a rank (NULL: never): x[T][rows] (F32) += that sum rounded
     * to ACT, where the backend can (true); false: nothing done (the caller
     * runs matmul_all_reduce and the next add_rmsnorm adds the result). */
    bool (*matmul_all_reduce_add)(Backend *be, void *x, const void *in, const WeightRef *w, int mat,
                                  const WeightRef *bias, int T);
    void (*destroy)(Backend *be);
};

typedef struct BackendLinks BackendLinks; /* NCCL between GPUs (backend_link_open, backend_tp_links_open) */

/* How to make a backend (backend_create). */
typedef struct {
    int device;            /* GPU index; < 0: the CPU backend */
    int threads;           /* CPU worker threads; <= 0: one per core */
    int block_size;        /* tokens per KV block */
    int n_blocks;          /* KV blocks; <= 0 (GPU): as many as fit in mem_util of its memory */
    int max_seq_tokens;    /* longest sequence (block-table width); <= 0: n_blocks * block_size */
    int max_tokens;        /* rows of one step */
    float mem_util;        /* GPU: the share of its memory cllm may take; <= 0: 0.9 */
    int gpu_share;         /* GPU: backends of this process still to be made on it, this one included (<= 1: it
                              alone): the KV budget is that share of what mem_util leaves (two ranks on one GPU) */
    int64_t act_elems, f32_elems; /* GPU: the buffers the caller will alloc beside, by kind (forward_init's) */
    KVDtype kv_dtype;      /* bf16 (fp32 on the CPU), or fp8 e4m3 with a scale per (token, KV head) */
    KVScales kv_scales;    /* fp8: those scales dynamic (amax / 448), the checkpoint's static ones (every
                              layer's k_scale / v_scale), or calibrated on the first step (base/dtype.h) */
    bool bf16_weights;     /* GPU: every matrix as bf16, also those it could keep quantized */
    bool batch_invariant;  /* GPU: each row's results independent of the other rows of its step */
    TpGroup *tp_group;     /* a rank of this tensor-parallel group (NULL: none) */
    int tp_rank;
    BackendLinks *tp_links;/* GPU ranks: NCCL between the group's GPUs (backend_tp_links_open), or NULL: the
                              ranks exchange through host memory (tp_group.h; any GPUs, one GPU shared too) */
    bool tp_nccl_sum;      /* with tp_links: all_reduce is ncclAllReduce's own sum (faster; not in rank order) */
} BackendOptions;

/* The backend o asks for, over shape and host weights w (both borrowed for
 * its life). */
Backend *backend_create(const ModelShape *shape, const ModelWeights *w, const BackendOptions *o, Err *err);

/* GPUs this build can run on. 0 in a CPU-only build (*why untouched: there
 * is nothing to report), or in a CUDA build with no GPU, no GPU new enough,
 * or no cuBLASLt (libcublasLt.so.13): *why, when given, then says which in
 * one line (the caller runs on the CPU and tells the user why). */
int backend_gpu_count(Err *why);

/* Bytes GPU o->device would hold of w (quantized matrices kept quantized
 * unless o->bf16_weights), and the tokens of KV cache of o->kv_dtype that
 * fit beside them and the caller's buffers within o->mem_util of its memory
 * (what backend_create would allocate). -1 with err without a GPU. */
int backend_gpu_plan(const ModelShape *shape, const ModelWeights *w, const BackendOptions *o,
                     uint64_t *weight_bytes, int64_t *kv_tokens, Err *err);

/* Links between the backends of pipeline stages on distinct GPUs (NCCL),
 * so their send_next / recv_prev pass hidden states device to device; a
 * peer that stops answering for timeout_s makes the waiting stage fail, not
 * hang. One process: backend_link_open over every stage's backend. One
 * process per stage: the driver makes an id (backend_link_id), every rank
 * joins with it. NULL with err where the backends cannot be linked (the
 * stages then hand over through host memory). */
#define BACKEND_LINK_ID_BYTES 128
BackendLinks *backend_link_open(Backend *const *stages, int n, double timeout_s, Err *err);
int backend_link_id(unsigned char id[BACKEND_LINK_ID_BYTES], Err *err);
BackendLinks *backend_link_join(Backend *be, const unsigned char id[BACKEND_LINK_ID_BYTES], int rank, int n,
                                double timeout_s, Err *err);
void backend_link_close(BackendLinks *l);
/* 0 when links can be made here (NCCL loads); -1 with err saying what is
 * missing: asked before any stage uploads its weights. */
int backend_link_available(Err *err);
/* The NCCL communicators of a tensor-parallel group whose rank r runs on
 * GPU devices[r] (n distinct GPUs of this process), for BackendOptions
 * tp_links; closed with backend_link_close after its ranks' backends. NULL
 * with err where they cannot be made (no NCCL, a GPU twice, no CUDA). */
BackendLinks *backend_tp_links_open(const int *devices, int n, double timeout_s, Err *err);
/* Rank `rank` of a tensor-parallel group of n processes, this one on GPU
 * device, every rank given the same id (backend_link_id, shared through the
 * rendezvous): its NCCL communicator, for BackendOptions tp_links; closed
 * with backend_link_close after the rank's backend. NULL with err where it
 * cannot be made. */
BackendLinks *backend_tp_link_join(int device, const unsigned char id[BACKEND_LINK_ID_BYTES], int rank, int n,
                                   double timeout_s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
