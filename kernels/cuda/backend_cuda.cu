/* backend_cuda.cu — the CUDA backend: the Backend ops of kernels/backend.h on
 * one GPU.
 *
 * Weights are uploaded once as bf16 matrices (any file dtype, dequantized on
 * the host by a thread pool into pinned staging buffers, two buffers
 * alternating so converting overlaps the copy) and fp32 vectors; each
 * layer's Wq|Wk|Wv and Wgate|Wup are placed back to back so each pair/triple
 * is one GEMM. Matrices of a type quant.cuh reads (Q8_0, Q4_0, Q4_1, Q4_K,
 * Q5_K, Q6_K) stay in their blocks instead (issue 7): the file's bytes are
 * copied up and repacked on the device, Wq|Wk|Wv and Wgate|Wup of one type
 * as one matrix; their WeightRef keeps the file's type and row_bytes and
 * points at a host QuantMatrix (kept quantized <=> quant_type_supported of
 * the device type). Up to 8 rows they run quant_gemv; larger steps
 * dequantize the matrix (in row chunks) to a bf16 scratch and call
 * cuBLASLt. Embedding tables and stacked MoE experts stay bf16; the
 * bf16_weights option forces the bf16 path for every matrix (checks). Activations between GEMMs are bf16, the residual stream and
 * logits fp32, the KV cache bf16 or (--kv-dtype fp8) e4m3 codes with an
 * fp32 scale per (token, KV head): per layer K codes | V codes | K scales |
 * V scales, each 256-byte aligned in one pool, sized by the same memory
 * budget (about twice the tokens). GEMMs of up to BF16_GEMV_MAX_T rows (decode) go
 * to our matrix-vector kernels (gemv.cu), larger ones through cuBLASLt (bf16
 * in, fp32 accumulate, bf16 or fp32 out; the algorithm chosen once per shape,
 * one fixed workspace).
 *
 * Decode-shaped steps (every row wants logits, at most 64 rows; MoE: 8) run
 * as CUDA graphs, one per bucket of rows (1, 2, 4, ... 64): begin_step pads
 * the step to its bucket and copies the inputs into fixed device buffers
 * (padding rows: token 0 at position 0 of sequence 0, slot -1 so they write
 * no KV); the first step of a bucket is captured, later ones replayed.
 *
 * Attention runs the kernels of attention.cuh (FlashAttention-style prefill
 * tiles, split-KV decode with each row's splits from its own length) from
 * one metadata buffer built and uploaded per step; in a step of decode rows
 * alone the decode kernel also does the rope and KV write (rope_attention).
 * A model whose head sizes they lack gets the simple kernel of cuda_ops.cu.
 * In a graphed step every padding row is its own sequence at position 0
 * (reading block 0), so the step stays all decode rows.
 *
 * Batch-invariant mode (CudaOptions.batch_invariant): a row's results do
 * not depend on the other rows of its step. Every GEMM, at every T, is
 * gemm_bi.cuh's (one fixed sum order; quantized matrices dequantized to the
 * bf16 scratch first, also at T <= 8); decode rows take their KV splits from
 * their own length (attn_row_splits); MoE routes on the host at every T. The
 * norms, rope, the prefill attention tiles (key tiles at fixed positions, so
 * also how a prompt is chunked) and the element-wise kernels work per row in
 * both modes. What remains is which kernel a row meets: a run of >= 2 rows
 * is prefill, a lone row decode; the scheduler never makes a prompt chunk of
 * one row (scheduler.c), so each token meets the same kernel in any batch.
 *
 * Written C-style: plain structs and functions, extern "C" entry points. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_profiler_api.h>

extern "C" { /* C headers of the engine: C linkage */
#include "kernels/attn_meta.h"
#include "kernels/backend.h"
#include "model/forward.h"
}
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.cuh"
#include "kernels/cuda/dequant_ahead.cuh"
#include "kernels/cuda/nccl_link.cuh"
#include "kernels/cuda/gemm_bi.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/sampling.cuh"

#define GEMM_CACHE 64
#define STAGING_BYTES ((size_t)64 << 20)
#define MAX_BUFS 64
#define N_BUCKETS 7                        /* graph buckets 1, 2, 4, ... 64 rows */
#define RESERVE_BYTES ((size_t)256 << 20)  /* left free beside the KV budget (cuBLASLt, graphs, fragmentation) */
#define MAX_AUTO_BLOCKS (1 << 20)          /* a budget-sized cache stops here (the host block pool is an array) */
#ifndef DEQ_MAX_MB
#define DEQ_MAX_MB 256 /* (-D for experiments) */
#endif
/* Steps of fewer rows dequantize each matrix just before its GEMM: there the GEMMs are bound by
 * bandwidth too, and a copy made ahead competes with them (H200, 8B Q8_0, batch-16 decode 5% slower
 * with it; prefill 512 6% faster: kernels/NOTES.md "dequantize ahead"). */
#define DEQ_AHEAD_MIN_T 128
/* The rows of a step whose quantized GEMMs run fused by default (quant_gemm v5, K split over the SMs
 * where a GEMM has few tiles): every step above the GEMVs' rows (qgemv_rows) up to 1536. H200, 8B Q4_K tok/s fused vs
 * dequantize + cuBLASLt: batch-16 decode 3,238 vs 1,497, prefill 16 3,506 vs 1,508 (16-128-token tiles by
 * T: kernels/NOTES.md "small steps"); 512 30.4k vs 27.2k, 1024 34.3k vs 33.7k, 2048 33.6k vs 35.1k ("v5") */
#define QGEMM_FUSED_MAX_T 1536
/* Q5_K's and Q6_K's fused dequantization costs ~2x Q4_K's a value: 8B Q6_K tok/s fused vs dequantize +
 * cuBLASLt, prefill 16 2,429 vs 1,535, 64 9,017 vs 5,980, 128 15,787 vs 11,860, 256 22,237 vs 20,742, 384
 * 19,866 vs 24,382, 512 25,338 vs 28,704; batch-16 decode 2,511 vs 1,569 */
#define QGEMM_FUSED_MAX_T_K56 256
enum { QGEMM_NEVER, QGEMM_AUTO, QGEMM_ALWAYS };
/* bf16 weights: the GEMV kernels up to this many rows, cuBLASLt above (GEMV_MAX_T is what they take).
 * H200, 8B bf16 decode tok/s, GEMV vs cuBLASLt: batch 2 426 vs 428, batch 4 761 vs 849, batch 8 1,052 vs
 * 1,667 (the GEMV re-reads x per weight load: kernels/NOTES.md "bf16 matrix-vector products"). */
#define BF16_GEMV_MAX_T 2
#define DEQ_AHEAD_BUFFERS 2 /* the matrix a GEMM reads and the next (3: no faster, measured) */
#define DEQ_MAX_BYTES ((size_t)DEQ_MAX_MB << 20) /* bf16 scratch of quantized GEMMs above 8 rows; larger matrices go in row chunks */
#define LAYER_REFS ((int)(sizeof(LayerWeights) / sizeof(WeightRef)))

typedef struct {
    int m, n, k, ldc;
    bool out_f32;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

typedef struct {
    void *ptr;
    BufKind kind;
    int64_t n;
} Buf;

typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    GemmPlan plans[GEMM_CACHE];
    int n_plans;
    const ModelConfig *cfg;
    ModelWeights w;              /* device copies; layers array on the host */
    void **allocs;               /* every cudaMalloc of weights, for freeing */
    int n_allocs, cap_allocs;
    bool bf16_weights;           /* every matrix as bf16, quantized ones too (CudaOptions) */
    bool bi;                     /* batch-invariant mode (CudaOptions.batch_invariant) */
    int qgemv_version;           /* quant_gemv_variant's version: 0 (default) or CLLM_QUANT_GEMV=1..5 (benchmarks) */
    int qgemv_max_t;             /* quantized weights: steps of up to this many rows by quant_gemv, larger ones by
                                    qgemm's other routes: CLLM_QUANT_GEMV_MAX_T=1..8 (benchmarks), 0 = by type
                                    (qgemv_rows) */
    int gemv_max_t;              /* bf16 weights: steps of up to this many rows by the GEMV kernels, larger ones by
                                    cuBLASLt (BF16_GEMV_MAX_T; CLLM_GEMV_MAX_T=1..8 for benchmarks) */
    int qgemm_mode;              /* quantized GEMMs above 8 rows through quant_gemm where it takes W: QGEMM_AUTO (steps
                                    above the GEMVs' rows up to QGEMM_FUSED_MAX_T; the default), QGEMM_ALWAYS (CLLM_QUANT_GEMM=1,
                                    3, 4, 5) or QGEMM_NEVER (=0; also without an sm_90a build on a 9.0 GPU, and in
                                    the batch-invariant mode) */
    int qgemm_version;           /* quant_gemm_variant's version: 0 (default), or CLLM_QUANT_GEMM=3..5 (benchmarks) */
    int prof_first, prof_count;  /* CLLM_PROFILE_STEPS=FIRST,COUNT: the profiler (ncu --profile-from-start off) records
                                    steps FIRST .. FIRST + COUNT - 1 only (0-based: a benchmark's batched decode steps
                                    without the prefills before them) */
    int64_t steps;               /* steps begun */
    bool rope_apart;             /* CLLM_ROPE_ATTENTION=0: rope_kv_write and attention as two launches at decode
                                    too (the checks compare the two, the benchmarks time them) */
    QuantMatrix *qm;             /* [n_layers * LAYER_REFS + 1] quantized matrices (slot of each WeightRef; last: LM head) */
    uint64_t weight_bytes;       /* device bytes of all weights */
    void *qnative;               /* upload only: a matrix's file bytes before repacking */
    size_t qnative_cap;
    DeqAhead deq;                /* bf16 copies of quantized matrices for GEMMs of more than 8 rows */
    QuantGemmWork qwork;         /* quant_gemm's split-K partials and counters (zeroed once; qgemm_mode != NEVER) */
    int64_t deq_elems;
    int deq_bufs;                /* dequantization buffers: DEQ_AHEAD_BUFFERS, or CLLM_DEQ_AHEAD=1..3 (0: 1) */
    const QuantMatrix **qnext;   /* [n_layers * LAYER_REFS + 1] the quantized matrix a step multiplies after each slot's */
    float *d_inv_freq;           /* [n_layers][rope_dim/2] */
    float *mscale;               /* [n_layers], host */
    void *kv_pool;               /* every layer's K then V (fp8: and their scales) */
    size_t kv_pool_bytes;
    KVLayerDev *kv;              /* [n_layers] views into kv_pool */
    int64_t n_slots;
    int max_tokens, max_seqs, max_blocks;
    int32_t *d_ids, *d_pos, *d_seq, *d_tables, *d_rows;
    int64_t *d_slot;
    int32_t *h_ids, *h_pos, *h_seq, *h_tables, *h_rows, *h_need; /* pinned staging (h_need: malloc) */
    int64_t *h_slot;
    KVDtype kv_dtype;
    DevAttnBatch batch;
    bool fast_attn;              /* attention.cuh has kernels for this model's variant */
    int n_sms;
    AttnMeta meta;               /* this step's attention metadata (host) */
    int32_t *d_meta, *h_meta;    /* its upload, at a fixed address (graphs replay it) */
    int64_t meta_cap;            /* int32 values d_meta / h_meta hold */
    int32_t *meta_seq;           /* [max_tokens] sequence of each row, padding rows their own */
    const int32_t **meta_tables; /* [max_seqs + 64] block table of each of those sequences */
    AttnDevMeta dmeta;
    AttnDecodeWork work;
    GpuSampler sampler;          /* built at the first sample() call */
    bool sampler_built;
    bf16 *scratch;               /* [T][nq+nk+nv] or [T][2F] GEMM outputs */
    float *router, *h_router, *moe_w, *h_w, *moe_acc;
    int32_t *moe_idx, *h_idx;
    bf16 *moe_rows, *moe_act, *moe_out;
    Buf bufs[MAX_BUFS];
    int n_bufs;
    bool graphs_on;
    int bucket;                  /* this step's graph bucket, -1: none */
    cudaGraphExec_t graph[N_BUCKETS];
    NcclGroup *link;             /* pipeline stage: NCCL to its neighbours (backend_cuda_link), or NULL */
    int link_rank;
    int graph_splits[N_BUCKETS]; /* batch-invariant mode: the decode splits each graph was captured with */
    char name[16];               /* "cuda:N", "cuda:N+bi" in the batch-invariant mode */
    Err err;                     /* first error inside a void op; reported by read() */
    bool failed;
} CudaBackend;

static const int BUCKET_ROWS[N_BUCKETS] = {1, 2, 4, 8, 16, 32, 64};

static CudaBackend *cb_of(Backend *be) { return (CudaBackend *)be->ctx; }

/* The entry points of a step (and buffer calls) make the backend's GPU the
 * thread's current device: pipeline stages on several GPUs share a thread. */
static CudaBackend *cb_use(Backend *be) {
    CudaBackend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    return cb;
}

static void op_fail(CudaBackend *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess || cb->failed) return;
    cb->failed = true;
    err_set(&cb->err, "CUDA error '%s' in %s (device %d)", cudaGetErrorString(e), what, cb->device);
}

/* ---------- GEMM ---------- */

static int gemm_plan(CudaBackend *cb, int m, int n, int k, int ldc, bool out_f32, GemmPlan **out, Err *err) {
    for (int i = 0; i < cb->n_plans; i++) {
        GemmPlan *p = &cb->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ldc == ldc && p->out_f32 == out_f32) { *out = p; return 0; }
    }
    if (cb->n_plans == GEMM_CACHE) { /* full: recycle the last slot */
        GemmPlan *p = &cb->plans[--cb->n_plans];
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->a); cublasLtMatrixLayoutDestroy(p->b); cublasLtMatrixLayoutDestroy(p->c);
    }
    GemmPlan *p = &cb->plans[cb->n_plans];
    memset(p, 0, sizeof *p);
    p->m = m; p->n = n; p->k = k; p->ldc = ldc; p->out_f32 = out_f32;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ct = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    bool ok = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, m, k) == CUBLAS_STATUS_SUCCESS && /* W: [m][k] row-major */
              cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS && /* x: [n][k] row-major */
              cublasLtMatrixLayoutCreate(&p->c, ct, m, n, ldc) == CUBLAS_STATUS_SUCCESS &&        /* y: [n][ldc] row-major */
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cb->workspace_bytes,
                                                   sizeof cb->workspace_bytes) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoGetHeuristic(cb->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &h, &found) ==
                  CUBLAS_STATUS_SUCCESS && found > 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->c) cublasLtMatrixLayoutDestroy(p->c);
        return err_set(err, "cuBLASLt: no algorithm for a %d x %d x %d bf16 GEMM", m, n, k);
    }
    p->algo = h.algo;
    cb->n_plans++;
    *out = p;
    return 0;
}

/* y[T][ldc] (columns 0..M-1; bf16, or fp32 when y_f32) = x[T][K] @ W[M][K]^T
 * through cuBLASLt. */
static void gemm_lt(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, int M, int T, int K, int ldc) {
    GemmPlan *p = NULL;
    if (cb->failed || gemm_plan(cb, M, T, K, ldc, y_f32, &p, &cb->err)) { cb->failed = true; return; }
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasLtMatmul(cb->lt, p->desc, &alpha, W, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                       cb->workspace, cb->workspace_bytes, cb->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cb->failed = true;
        err_set(&cb->err, "cuBLASLt matmul failed (%d) for %d x %d x %d", (int)st, M, T, K);
    }
}

/* The batch-invariant GEMM (gemm_bi.cuh): one sum order for every T. */
static void gemm_bi(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, const float *bias, int M,
                    int T, int K, int ldc) {
    Err e = {};
    if (cb->failed || cuda_gemm_bi(y, y_f32, ldc, W, x, bias, M, T, K, cb->stream, &e) == 0) return;
    cb->failed = true;
    cb->err = e;
}

/* y[T][M] (bf16, or fp32 when y_f32) = x[T][K] @ W[M][K]^T (+ bias[M]). */
static void gemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, const float *bias, int M, int T,
                 int K) {
    if (cb->failed || T <= 0) return;
    if (cb->bi) { gemm_bi(cb, y, y_f32, x, W, bias, M, T, K, M); return; }
    if (T <= cb->gemv_max_t) { cuda_gemv(y, y_f32, W, x, bias, M, K, T, cb->stream); return; }
    gemm_lt(cb, y, y_f32, x, W, M, T, K, M);
    if (bias && !cb->failed) cuda_add_bias(y, y_f32, bias, T, M, cb->stream);
}

static void quant_fail(CudaBackend *cb, const Err *e) {
    if (cb->failed) return;
    cb->failed = true;
    cb->err = *e;
}

/* The quantized GEMV of qgemm below (T <= QUANT_GEMV_MAX_T), y in parts;
 * a version asked for (CLLM_QUANT_GEMV) where it takes W and T, else the default. */
static void qgemv(CudaBackend *cb, const bf16 *x, const QuantMatrix *W, const GemvOut *out, int T) {
    Err e = {};
    int v = cb->qgemv_version;
    if ((v == 3 || v == 4) && !quant_gemv_mma_supported(W->type, W->cols, false)) v = 0;
    if (v == 5 && (T != 1 || !quant_gemv_x8_supported(W->type, W->cols))) v = 0;
    if (quant_gemv_parts(W, x, out, T, v, cb->stream, &e)) quant_fail(cb, &e);
}

/* Whether quant_gemm (v5 by default) takes W in this backend. */
static bool q_fusable(const CudaBackend *cb, const QuantMatrix *W) {
    bool v3_ok = cb->qgemm_mode == QGEMM_ALWAYS && cb->qgemm_version < 4; /* by default only where v5 takes W */
    return cb->qgemm_mode != QGEMM_NEVER && quant_gemm_supported(W->type, W->rows, W->cols) &&
           (v3_ok || quant_gemm_tma_takes(W->type, W->cols)) && quant_gemm_version_takes(W->type, cb->qgemm_version);
}

/* The rows up to which W goes through quant_gemv: QUANT_GEMV_MAX_T, but 1 for Q5_K and 2 for Q6_K where
 * quant_gemm takes W (their GEMV above one row is the scalar v2: H200, 8B, batch 2 / 4 / 8 decode tok/s,
 * GEMV vs fused, Q5_K 308 / 466 / 568 vs 345 / 694 / 1,376, Q6_K 393 / 538 / 685 vs 320 / 639 / 1,270);
 * CLLM_QUANT_GEMV_MAX_T sets it for every type. */
static int qgemv_rows(const CudaBackend *cb, const QuantMatrix *W) {
    if (cb->qgemv_max_t) return cb->qgemv_max_t;
    if ((W->type == DT_Q5_K || W->type == DT_Q6_K) && q_fusable(cb, W)) return W->type == DT_Q5_K ? 1 : 2;
    return QUANT_GEMV_MAX_T;
}

/* Whether a GEMM of more rows than qgemv_rows on W runs fused (quant_gemm), not dequantized + cuBLASLt;
 * T = 0: whether every such GEMM on W does (then W needs no bf16 scratch and is never dequantized ahead). */
static bool q_fused(const CudaBackend *cb, const QuantMatrix *W, int T) {
    bool at_T = cb->qgemm_mode == QGEMM_ALWAYS ||
                (cb->qgemm_mode == QGEMM_AUTO && T > qgemv_rows(cb, W) &&
                 T <= (W->type == DT_Q5_K || W->type == DT_Q6_K ? QGEMM_FUSED_MAX_T_K56 : QGEMM_FUSED_MAX_T));
    return at_T && q_fusable(cb, W);
}

/* The quantized matrix a step multiplies after W (order_quant), or NULL. */
static const QuantMatrix *qnext_of(const CudaBackend *cb, const QuantMatrix *W) {
    size_t slot = (size_t)(W - cb->qm), n_slots = (size_t)cb->cfg->n_layers * LAYER_REFS + 1;
    return W && slot < n_slots ? cb->qnext[slot] : NULL;
}

/* The next matrix after W that a step of T rows dequantizes (the ones it runs fused are passed
 * over, a layer's worth at most), or NULL. */
static const QuantMatrix *qnext_dequantized(const CudaBackend *cb, const QuantMatrix *W, int T) {
    for (int hop = 0; hop < LAYER_REFS; hop++)
        if (!(W = qnext_of(cb, W)) || !q_fused(cb, W, T)) return W;
    return NULL;
}

/* The same for a quantized W: quant_gemv up to 8 rows (reads each block
 * once); above, quant_gemm where it takes W (q_fused: tiles dequantized in
 * shared memory for wgmma); else W is dequantized to the bf16 scratch in chunks of rows and
 * each chunk's columns of y come from cuBLASLt (no host sync, no
 * allocation: graph-capturable either way). The batch-invariant mode takes
 * the dequantizing route at every T, with gemm_bi: quant_gemv's sums (fp32
 * FMAs of the dequantized values) could not match a tensor-core GEMM's. */
static void qgemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const QuantMatrix *W, const float *bias, int T) {
    if (cb->failed || T <= 0) return;
    Err e = {};
    if (T <= qgemv_rows(cb, W) && !cb->bi) {
        GemvOut out = gemv_out_one(y, y_f32, bias, W->rows);
        qgemv(cb, x, W, &out, T);
        return;
    }
    if (q_fused(cb, W, T)) {
        if (quant_gemm_variant(W, x, T, y, y_f32, 0, cb->qgemm_version, 0, &cb->qwork, cb->stream, &e)) quant_fail(cb, &e);
        else if (bias) cuda_add_bias(y, y_f32, bias, T, (int)W->rows, cb->stream);
        return;
    }
    int64_t chunk = cb->deq.elems / W->cols;
    if (chunk > W->rows) chunk = W->rows;
    if (chunk < 1) { err_set(&e, "cuda: no dequantization scratch for a %lld-wide matrix", (long long)W->cols); quant_fail(cb, &e); return; }
    size_t ysz = y_f32 ? sizeof(float) : sizeof(bf16);
    const QuantMatrix *next[DEQ_AHEAD_MAX - 1] = {NULL};
    for (int k = 0; k < DEQ_AHEAD_MAX - 1; k++) next[k] = qnext_dequantized(cb, k ? next[k - 1] : W, T);
    for (int64_t r0 = 0; r0 < W->rows && !cb->failed; r0 += chunk) {
        int64_t nr = W->rows - r0 < chunk ? W->rows - r0 : chunk;
        const bf16 *Wd = (const bf16 *)deq_ahead_get(&cb->deq, W, r0, nr, cb->stream, &e);
        if (!Wd) { quant_fail(cb, &e); return; }
        const float *b = bias && cb->bi ? bias + r0 : NULL; /* gemm_bi adds it in its epilogue */
        if (cb->bi) gemm_bi(cb, (char *)y + r0 * ysz, y_f32, x, Wd, b, (int)nr, T, (int)W->cols, (int)W->rows);
        else gemm_lt(cb, (char *)y + r0 * ysz, y_f32, x, Wd, (int)nr, T, (int)W->cols, (int)W->rows);
        int n_next = r0 + nr == W->rows && T >= DEQ_AHEAD_MIN_T ? DEQ_AHEAD_MAX - 1 : 0;
        if (deq_ahead_after_gemm(&cb->deq, Wd, next, n_next, cb->stream, &e)) { quant_fail(cb, &e); return; }
    }
    if (bias && !cb->failed && !cb->bi) cuda_add_bias(y, y_f32, bias, T, (int)W->rows, cb->stream);
}

/* The fused GEMM with an epilogue that stores its output in parts or gated (quant_gemm_epi) where it runs
 * W at T rows and takes e; false: the caller runs the GEMM and the split or GLU kernel. */
static bool qgemm_epi(CudaBackend *cb, const bf16 *x, const QuantMatrix *W, const QuantGemmEpi *e, int T) {
    if (cb->failed || T <= qgemv_rows(cb, W) || !q_fused(cb, W, T) || cb->qgemm_version == 3 ||
        !quant_gemm_epi_takes(W, e))
        return false;
    Err err = {};
    if (quant_gemm_epi(W, x, T, e, 0, cb->qgemm_version, 0, &cb->qwork, cb->stream, &err)) quant_fail(cb, &err);
    return true;
}

static bool is_quant(const WeightRef *w) { return w->data && quant_type_supported(w->type); }
static const QuantMatrix *qm_of(const WeightRef *w) { return (const QuantMatrix *)w->data; }

static const bf16 *mat_of(const WeightRef *w, int mat) { return (const bf16 *)w->data + (int64_t)mat * w->rows * w->cols; }
static const float *vec_of(const WeightRef *b, int mat) {
    return b && b->data ? (const float *)b->data + (int64_t)mat * b->cols : NULL;
}

/* y = x @ w[mat]^T (+ bias) for a device weight of either kind (quantized
 * ones are single matrices: mat 0). */
static void wgemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const WeightRef *w, int mat, const float *bias,
                  int T) {
    if (is_quant(w)) qgemm(cb, y, y_f32, x, qm_of(w), bias, T);
    else gemm(cb, y, y_f32, x, mat_of(w, mat), bias, (int)w->rows, T, (int)w->cols);
}
/* ---------- weights upload ---------- */

static int cb_track(CudaBackend *cb, void *p, Err *err) {
    if (cb->n_allocs == cb->cap_allocs) {
        int cap = cb->cap_allocs ? 2 * cb->cap_allocs : 256;
        void **a = (void **)realloc(cb->allocs, cap * sizeof *a);
        if (!a) return err_set(err, "out of memory");
        cb->allocs = a;
        cb->cap_allocs = cap;
    }
    cb->allocs[cb->n_allocs++] = p;
    return 0;
}

typedef struct {
    void *pinned[2];
    cudaEvent_t done[2];
    int cur;
    uint64_t bytes;      /* uploaded */
    ThreadPool *tp;      /* converts rows in parallel (the file's dtype to bf16) */
} Staging;

/* Rows [a, b) of a staging chunk: src rows r0 + a.. of hw, out rows a.. of dst. */
typedef struct {
    const WeightRef *hw;
    char *dst;
    int64_t r0;
    size_t row_out;
    bool vec, raw;       /* raw: the file's bytes as they are (quantized matrices) */
} ConvertJob;

static void convert_rows(void *ctx, int64_t a, int64_t b) {
    const ConvertJob *j = (const ConvertJob *)ctx;
    const WeightRef *hw = j->hw;
    float *tmp = j->vec || hw->type == DT_BF16 ? NULL : (float *)malloc(hw->cols * sizeof(float));
    for (int64_t r = a; r < b; r++) {
        const void *src = (const char *)hw->data + (j->r0 + r) * hw->row_bytes;
        char *out = j->dst + r * j->row_out;
        if (j->raw) {
            memcpy(out, src, hw->row_bytes);
        } else if (j->vec) {
            dequantize_row(hw->type, src, (float *)out, hw->cols);
        } else if (hw->type == DT_BF16) { /* already the device format */
            memcpy(out, src, j->row_out);
        } else if (tmp) {
            dequantize_row(hw->type, src, tmp, hw->cols);
            uint16_t *o = (uint16_t *)out;
            for (int64_t c = 0; c < hw->cols; c++) o[c] = fp32_to_bf16(tmp[c]);
        } else { /* no memory for the row: NaN, which the checks downstream see */
            for (int64_t c = 0; c < hw->cols; c++) ((uint16_t *)out)[c] = 0x7fc0;
        }
    }
    free(tmp);
}

/* Copies the rows of a host WeightRef to dev, each converted to row_out
 * bytes (raw: copied as they are; vec: fp32; else bf16), staging through
 * pinned memory (two buffers: the pool converts a chunk while the previous
 * one is copied). */
static int stage_rows(CudaBackend *cb, Staging *stg, const WeightRef *hw, void *dev, size_t row_out, bool vec,
                      bool raw, Err *err) {
    int64_t rows = hw->rows * hw->n_mats;
    size_t rows_per_chunk = STAGING_BYTES / row_out;
    if (rows_per_chunk == 0) return err_set(err, "tensor '%s' row too large to stage", hw->name);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
        int64_t nr = rows - r0 < (int64_t)rows_per_chunk ? rows - r0 : (int64_t)rows_per_chunk;
        int b = stg->cur;
        CUDA_CHECK(cudaEventSynchronize(stg->done[b]), err); /* the buffer's previous copy finished */
        ConvertJob job = {hw, (char *)stg->pinned[b], r0, row_out, vec, raw};
        cpu_parallel_for(stg->tp, nr, convert_rows, &job);
        CUDA_CHECK(cudaMemcpyAsync((char *)dev + r0 * row_out, job.dst, nr * row_out, cudaMemcpyHostToDevice,
                                   cb->stream), err);
        CUDA_CHECK(cudaEventRecord(stg->done[b], cb->stream), err);
        stg->cur ^= 1;
        stg->bytes += nr * row_out;
    }
    return 0;
}

/* Converts a host WeightRef (any dtype) to bf16 (matrices) or fp32 (vectors)
 * on the device; into dst when given (a slot of a concatenated matrix), else
 * into its own allocation. */
static int upload_weight(CudaBackend *cb, Staging *stg, const WeightRef *hw, WeightRef *dw, void *dst_dev, Err *err) {
    *dw = *hw;
    if (!hw->data) return 0;
    bool vec = hw->rows == 1;
    size_t elem = vec ? sizeof(float) : sizeof(__nv_bfloat16);
    size_t row_out = (size_t)hw->cols * elem, total = row_out * hw->rows * hw->n_mats;
    void *dev = dst_dev;
    if (!dev) {
        CUDA_CHECK(cudaMalloc(&dev, total), err);
        if (cb_track(cb, dev, err)) return -1;
        cb->weight_bytes += total;
    }
    if (stage_rows(cb, stg, hw, dev, row_out, vec, false, err)) return -1;
    dw->data = dev;
    dw->type = vec ? DT_F32 : DT_BF16;
    dw->row_bytes = row_out;
    return 0;
}

/* Whether a host matrix stays in its blocks on the device (expert stacks,
 * vectors and the embedding table never do). */
static bool keep_quant(bool bf16_weights, const WeightRef *w) {
    return !bf16_weights && w->data && w->n_mats == 1 && w->rows > 1 && quant_type_supported(w->type);
}

/* Matrices that are uploaded back to back (one GEMM for all): Wq|Wk|Wv and
 * Wgate|Wup when each is one plain matrix of the same input width, and all
 * stay in blocks of one type or all become bf16. A mixed group (Q4_K_M
 * files: Wv in Q6_K in about half the layers) is uploaded matrix by matrix,
 * each kept quantized: concatenated it would have to be bf16 (3.5x the
 * bytes of Q4_K, read every decode step). */
static bool can_concat(bool bf16_weights, const WeightRef *const *m, int n) {
    for (int i = 0; i < n; i++) {
        if (!m[i]->data || m[i]->n_mats != 1 || m[i]->rows <= 1 || m[i]->cols != m[0]->cols) return false;
        bool q = keep_quant(bf16_weights, m[i]), q0 = keep_quant(bf16_weights, m[0]);
        if (q != q0 || (q && m[i]->type != m[0]->type)) return false;
    }
    return true;
}

/* Uploads n quantized matrices of one type and width as one repacked
 * matrix in slot: their file bytes back to back (rows are independent, so
 * they form one [sum rows][cols] tensor) into the qnative buffer, then
 * quant_repack. Each dst keeps its file type, shape and row_bytes and
 * points at slot (qkv / gate_up find the concatenation that way). */
static int upload_quant(CudaBackend *cb, Staging *stg, const WeightRef *const *src, WeightRef *const *dst, int n,
                        QuantMatrix *slot, Err *err) {
    int64_t rows = 0, cols = src[0]->cols;
    for (int i = 0; i < n; i++) rows += src[i]->rows;
    size_t native = (size_t)rows * src[0]->row_bytes, bytes = 0;
    if (native > cb->qnative_cap) { /* grows to the largest; upload only */
        CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
        CUDA_CHECK(cudaFree(cb->qnative), err);
        cb->qnative = NULL;
        CUDA_CHECK(cudaMalloc(&cb->qnative, native), err);
        cb->qnative_cap = native;
    }
    void *buf = NULL;
    Err why = {};
    if (quant_matrix_bytes(src[0]->type, rows, cols, &bytes, &why)) return err_set(err, "tensor '%s': %s", src[0]->name, why.msg);
    CUDA_CHECK(cudaMalloc(&buf, bytes), err);
    if (cb_track(cb, buf, err)) return -1;
    cb->weight_bytes += bytes;
    if (quant_matrix_init(slot, src[0]->type, rows, cols, buf, err)) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (stage_rows(cb, stg, src[i], (char *)cb->qnative + off, src[i]->row_bytes, false, true, err)) return -1;
        off += (size_t)src[i]->rows * src[i]->row_bytes;
        *dst[i] = *src[i];
        dst[i]->data = slot;
    }
    if (quant_repack(slot, cb->qnative, cb->stream, err)) return -1;
    int64_t deq = rows * cols; /* the bf16 scratch serves only matrices quant_gemm does not take */
    if (!q_fused(cb, slot, 0) && deq > cb->deq_elems) cb->deq_elems = deq;
    return 0;
}

/* n matrices that can_concat: one quantized matrix, or one bf16 buffer */
static int upload_concat(CudaBackend *cb, Staging *stg, const WeightRef *const *src, WeightRef *const *dst, int n,
                         QuantMatrix *slot, Err *err) {
    if (keep_quant(cb->bf16_weights, src[0])) return upload_quant(cb, stg, src, dst, n, slot, err);
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += src[i]->rows;
    char *base;
    CUDA_CHECK(cudaMalloc(&base, (size_t)rows * src[0]->cols * sizeof(bf16)), err);
    if (cb_track(cb, base, err)) return -1;
    cb->weight_bytes += (size_t)rows * src[0]->cols * sizeof(bf16);
    for (int i = 0; i < n; i++) {
        if (upload_weight(cb, stg, src[i], dst[i], base, err)) return -1;
        base += (size_t)src[i]->rows * src[i]->cols * sizeof(bf16);
    }
    return 0;
}

/* A layer's weights; slots: its LAYER_REFS QuantMatrix slots, one per
 * WeightRef (a concatenation uses the slot of its first matrix). */
static int upload_layer(CudaBackend *cb, Staging *stg, const LayerWeights *h, LayerWeights *d, QuantMatrix *slots,
                        Err *err) {
    const WeightRef *qkv[3] = {&h->wq, &h->wk, &h->wv}, *gu[2] = {&h->w_gate, &h->w_up};
    WeightRef *dqkv[3] = {&d->wq, &d->wk, &d->wv}, *dgu[2] = {&d->w_gate, &d->w_up};
    const WeightRef *src = (const WeightRef *)h;
    WeightRef *dst = (WeightRef *)d;
    bool cat_qkv = can_concat(cb->bf16_weights, qkv, 3), cat_gu = can_concat(cb->bf16_weights, gu, 2);
    if (cat_qkv && upload_concat(cb, stg, qkv, dqkv, 3, &slots[&h->wq - src], err)) return -1;
    if (cat_gu && upload_concat(cb, stg, gu, dgu, 2, &slots[&h->w_gate - src], err)) return -1;
    for (int i = 0; i < LAYER_REFS; i++) {
        bool done = (cat_qkv && (&src[i] == qkv[0] || &src[i] == qkv[1] || &src[i] == qkv[2])) ||
                    (cat_gu && (&src[i] == gu[0] || &src[i] == gu[1]));
        if (done) continue;
        const WeightRef *one[1] = {&src[i]};
        WeightRef *dst1[1] = {&dst[i]};
        int rc = keep_quant(cb->bf16_weights, &src[i]) ? upload_quant(cb, stg, one, dst1, 1, &slots[i], err)
                                                       : upload_weight(cb, stg, &src[i], &dst[i], NULL, err);
        if (rc) return -1;
    }
    return 0;
}

/* The bf16 scratch of quantized GEMMs above 8 rows: deq_bufs buffers of the
 * largest quantized matrix (dequant_ahead.cuh), at most DEQ_MAX_BYTES each
 * (larger ones are done in row chunks). */
static int alloc_deq(CudaBackend *cb, Err *err) {
    if (cb->deq_elems == 0) return 0;
    if (cb->deq_elems * (int64_t)sizeof(bf16) > (int64_t)DEQ_MAX_BYTES) cb->deq_elems = DEQ_MAX_BYTES / sizeof(bf16);
    return deq_ahead_init(&cb->deq, cb->deq_elems, cb->deq_bufs, err);
}

/* qnext: the order in which a step multiplies the quantized matrices (q|k|v,
 * o, gate|up, down, then the next layer's), so each GEMM knows which matrix
 * to dequantize ahead. A wrong guess costs time, never values. */
static int order_quant(CudaBackend *cb, int n_layers, Err *err) {
    size_t n = (size_t)n_layers * LAYER_REFS + 1;
    cb->qnext = (const QuantMatrix **)calloc(n, sizeof *cb->qnext);
    if (!cb->qnext) return err_set(err, "out of memory");
    const QuantMatrix *prev = NULL;
    for (int l = 0; l < n_layers; l++) {
        const LayerWeights *lw = &cb->w.layers[l];
        const WeightRef *order[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++) {
            if (!is_quant(order[i]) || q_fused(cb, qm_of(order[i]), 0) || qm_of(order[i]) == prev) continue;
            if (prev) cb->qnext[prev - cb->qm] = qm_of(order[i]);
            prev = qm_of(order[i]);
        }
    }
    return 0;
}

static int upload_model(CudaBackend *cb, const ModelConfig *c, const ModelWeights *host, double *gbps, Err *err) {
    Staging stg = {};
    int rc = 0;
    stg.tp = thread_pool_create(0, err);
    if (!stg.tp) rc = -1;
    for (int b = 0; rc == 0 && b < 2; b++) {
        cudaError_t e = cudaMallocHost(&stg.pinned[b], STAGING_BYTES);
        if (e == cudaSuccess) e = cudaEventCreate(&stg.done[b]);
        if (e == cudaSuccess) e = cudaEventRecord(stg.done[b], cb->stream);
        if (e != cudaSuccess) rc = err_set(err, "CUDA error '%s' preparing the weight upload", cudaGetErrorString(e));
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cb->w.layers = (LayerWeights *)calloc(c->n_layers, sizeof *cb->w.layers);
    QuantMatrix *head = NULL;
    cb->qm = (QuantMatrix *)calloc((size_t)c->n_layers * LAYER_REFS + 1, sizeof *cb->qm);
    if (rc == 0 && (!cb->w.layers || !cb->qm)) rc = err_set(err, "out of memory");
    else head = &cb->qm[(size_t)c->n_layers * LAYER_REFS];
    /* the embedding table stays bf16: a lookup reads T rows, and a tied LM head shares it */
    if (rc == 0) rc = upload_weight(cb, &stg, &host->tok_embd, &cb->w.tok_embd, NULL, err);
    if (rc == 0) rc = upload_weight(cb, &stg, &host->output_norm, &cb->w.output_norm, NULL, err);
    const WeightRef *out1[1] = {&host->output};
    WeightRef *dout1[1] = {&cb->w.output};
    if (rc == 0 && host->output.data == host->tok_embd.data) cb->w.output = cb->w.tok_embd;
    else if (rc == 0 && keep_quant(cb->bf16_weights, &host->output)) rc = upload_quant(cb, &stg, out1, dout1, 1, head, err);
    else if (rc == 0) rc = upload_weight(cb, &stg, &host->output, &cb->w.output, NULL, err);
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        rc = upload_layer(cb, &stg, &host->layers[l], &cb->w.layers[l], &cb->qm[(size_t)l * LAYER_REFS], err);
    cb->w.rope_freqs = host->rope_freqs; /* read on the host (backend_rope_tables) */
    cudaError_t e = cudaStreamSynchronize(cb->stream);
    if (rc == 0 && e != cudaSuccess) rc = err_set(err, "CUDA error '%s' uploading weights", cudaGetErrorString(e));
    cudaFree(cb->qnative);
    cb->qnative = NULL;
    if (rc == 0) rc = alloc_deq(cb, err);
    if (rc == 0) rc = order_quant(cb, c->n_layers, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (gbps) *gbps = s > 0 ? stg.bytes / s / 1e9 : 0;
    for (int b = 0; b < 2; b++) {
        if (stg.pinned[b]) cudaFreeHost(stg.pinned[b]);
        if (stg.done[b]) cudaEventDestroy(stg.done[b]);
    }
    if (stg.tp) thread_pool_destroy(stg.tp);
    return rc;
}

/* ---------- buffers and steps ---------- */

static void graphs_drop(CudaBackend *cb) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (cb->graph[i]) { cudaGraphExecDestroy(cb->graph[i]); cb->graph[i] = NULL; }
}

static void *cuda_be_alloc(Backend *be, int64_t n, BufKind kind) {
    CudaBackend *cb = cb_use(be);
    void *p = NULL;
    if (n <= 0 || cb->n_bufs == MAX_BUFS) return NULL;
    if (cudaMalloc(&p, n * (kind == BUF_F32 ? sizeof(float) : sizeof(bf16))) != cudaSuccess) return NULL;
    cb->bufs[cb->n_bufs++] = (Buf){p, kind, n};
    return p;
}

/* Captured graphs hold buffer addresses: any release drops them. */
static void cuda_be_release(Backend *be, void *p) {
    CudaBackend *cb = cb_use(be);
    graphs_drop(cb);
    for (int i = 0; i < cb->n_bufs; i++)
        if (cb->bufs[i].ptr == p) { cb->bufs[i] = cb->bufs[--cb->n_bufs]; break; }
    cudaFree(p);
}

static const Buf *buf_of(CudaBackend *cb, const void *p) {
    for (int i = 0; i < cb->n_bufs; i++)
        if (cb->bufs[i].ptr == p) return &cb->bufs[i];
    return NULL;
}

/* The graph bucket of a step of T rows (-1: issue its kernels directly):
 * decode-shaped steps only, since a graph computes logits for every row, and
 * for MoE only buckets whose routing stays on the device. */
static int step_bucket(CudaBackend *cb, const AttnBatch *b, int n_logits) {
    int T = b->n_tokens;
    if (!cb->graphs_on || n_logits != T) return -1;
    for (int i = 1; i < T; i++) /* two rows in a run make a prefill tile: not a decode step */
        if (b->seq[i] == b->seq[i - 1] && b->pos[i] == b->pos[i - 1] + 1) return -1;
    for (int i = 0; i < N_BUCKETS; i++)
        if (T <= BUCKET_ROWS[i]) {
            /* MoE routed on the host: above 8 rows, and always in the batch-invariant mode */
            bool host_sync = cb->cfg->n_experts > 0 && (BUCKET_ROWS[i] > GEMV_MAX_T || cb->bi);
            return BUCKET_ROWS[i] <= cb->max_tokens && !host_sync ? i : -1;
        }
    return -1;
}

/* Batch-invariant mode: the decode grid's splits for this graphed step.
 * Rows take splits from their own length, so the grid only has to have
 * enough: a bucket's graph keeps the splits it was captured with until a
 * row needs more, then is captured again with the next power of two (a
 * handful of captures as contexts grow, and no grid of mostly idle blocks
 * sized for the longest possible context). */
static int bi_graph_splits(CudaBackend *cb, int need) {
    int b = cb->bucket;
    if (cb->graph[b] && cb->graph_splits[b] >= need) return cb->graph_splits[b];
    if (cb->graph[b]) { cudaGraphExecDestroy(cb->graph[b]); cb->graph[b] = NULL; }
    int s = 1;
    while (s < need) s *= 2;
    return cb->graph_splits[b] = s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
}

/* The decode grid's splits (default mode) for n_decode rows and contexts up
 * to ctx: rows take their own splits (at most ATTN_MAX_SPLITS), so the
 * grid needs no more. */
static int decode_grid_splits(const CudaBackend *cb, int ctx, int n_decode) {
    const ModelConfig *c = cb->cfg;
    int s = attn_decode_splits(ctx, n_decode, c->n_kv_heads, (c->n_heads / c->n_kv_heads + 15) / 16, cb->n_sms);
    return s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
}

/* The attention metadata of a step of Tp rows (h_pos already holds their
 * positions), uploaded to d_meta, and the decode split count: for a step of
 * decode rows alone, from the longest context a sequence may reach, so one
 * graph capture serves every later step and a step computes the same sums
 * whether it is replayed or issued (graphs on or off). */
static int attn_step_meta(CudaBackend *cb, const AttnBatch *b, int Tp, Err *err) {
    static const int32_t block0 = 0;
    for (int s = 0; s < b->n_seqs; s++) cb->meta_tables[s] = b->block_tables[s];
    for (int i = 0; i < Tp; i++) {
        bool real = i < b->n_tokens;
        cb->meta_seq[i] = real ? b->seq[i] : b->n_seqs + (i - b->n_tokens);
        if (!real) cb->meta_tables[cb->meta_seq[i]] = &block0;
    }
    int n_seqs = b->n_seqs + (Tp - b->n_tokens);
    AttnBatch mb = {Tp, cb->h_pos, cb->meta_seq, NULL, n_seqs, cb->meta_tables, b->block_size};
    AttnMetaOpts o = {(int)(cb->n_slots / b->block_size), cb->bucket >= 0 ? cb->max_blocks : 0};
    attn_meta_free(&cb->meta);
    if (attn_meta_build(&cb->meta, &mb, &o, err)) return -1;
    if (cb->meta.buf_len > cb->meta_cap)
        return err_set(err, "cuda: attention metadata of %d values exceeds its buffer (%lld)", cb->meta.buf_len,
                       (long long)cb->meta_cap);
    memcpy(cb->h_meta, cb->meta.buf, cb->meta.buf_len * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(cb->d_meta, cb->h_meta, cb->meta.buf_len * sizeof(int32_t), cudaMemcpyHostToDevice,
                               cb->stream), err);
    attn_dev_meta(&cb->dmeta, &cb->meta, cb->d_meta);
    int ctx = cb->meta.n_tiles == 0 ? cb->max_blocks * b->block_size : cb->meta.max_kv_len;
    cb->work.max_decode = cb->meta.n_decode;
    if (cb->bi) {
        int need = attn_decode_row_splits_max(&cb->meta);
        cb->work.n_splits = cb->bucket >= 0 ? bi_graph_splits(cb, need) : need;
    } else {
        cb->work.n_splits = decode_grid_splits(cb, ctx, cb->meta.n_decode);
        /* one decode row: half-size splits (more blocks for its long rows); with more rows the grid is
         * full already and the extra merges cost (H200 8B Q4_K: batch 1 at ctx 512-1024 +5%, batch 8 at
         * 4k -14% with them; kernels/NOTES.md "split size by batch") */
        cb->work.split_tiles = cb->meta.n_decode == 1 ? ATTN_SPLIT_TILES_ONE_ROW : ATTN_SPLIT_TILES;
    }
    return 0;
}

static int cuda_be_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows,
                              int n_logits, StepRows *rows, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    int T = b->n_tokens;
    if (T > cb->max_tokens || b->n_seqs > cb->max_seqs || b->n_seqs < 1)
        return err_set(err, "cuda: step of %d tokens / %d sequences exceeds %d / %d", T, b->n_seqs, cb->max_tokens,
                       cb->max_seqs);
    if (cb->prof_count > 0 && cb->steps == cb->prof_first) op_fail(cb, cudaProfilerStart(), "profiler start");
    if (cb->prof_count > 0 && cb->steps == (int64_t)cb->prof_first + cb->prof_count)
        op_fail(cb, cudaProfilerStop(), "profiler stop");
    cb->steps++;
    cb->bucket = step_bucket(cb, b, n_logits);
    if (deq_ahead_begin_step(&cb->deq, cb->stream, err)) return -1;
    int Tp = cb->bucket >= 0 ? BUCKET_ROWS[cb->bucket] : T, np = cb->bucket >= 0 ? Tp : n_logits;
    /* Block tables: each sequence's blocks up to its furthest position. */
    for (int s = 0; s < b->n_seqs; s++) cb->h_need[s] = 0;
    for (int i = 0; i < T; i++) {
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs || b->pos[i] < 0)
            return err_set(err, "cuda: row %d has sequence %d / position %d", i, b->seq[i], b->pos[i]);
        int nb = b->pos[i] / b->block_size + 1;
        if (nb > cb->h_need[b->seq[i]]) cb->h_need[b->seq[i]] = nb;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        if (cb->h_need[s] > cb->max_blocks)
            return err_set(err, "cuda: sequence %d needs %d blocks (> %d)", s, cb->h_need[s], cb->max_blocks);
        memcpy(cb->h_tables + (int64_t)s * cb->max_blocks, b->block_tables[s], cb->h_need[s] * sizeof(int32_t));
    }
    for (int i = 0; i < Tp; i++) {
        bool real = i < T;
        cb->h_ids[i] = real ? ids[i] : 0;
        cb->h_pos[i] = real ? b->pos[i] : 0;
        cb->h_seq[i] = real ? b->seq[i] : 0;
        cb->h_slot[i] = real ? b->slot[i] : -1;
        cb->h_rows[i] = i < n_logits ? logit_rows[i] : 0;
    }
    cudaStream_t st = cb->stream;
    CUDA_CHECK(cudaMemcpyAsync(cb->d_ids, cb->h_ids, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_pos, cb->h_pos, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_seq, cb->h_seq, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_slot, cb->h_slot, Tp * sizeof(int64_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_rows, cb->h_rows, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_tables, cb->h_tables, (size_t)b->n_seqs * cb->max_blocks * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st), err);
    cb->batch = (DevAttnBatch){Tp, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_tables, cb->max_blocks, b->block_size};
    *rows = (StepRows){Tp, np};
    return cb->fast_attn ? attn_step_meta(cb, b, Tp, err) : 0;
}

static bool cuda_be_graph_replay(Backend *be) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed || cb->bucket < 0 || !cb->graph[cb->bucket]) return false;
    op_fail(cb, cudaGraphLaunch(cb->graph[cb->bucket], cb->stream), "graph replay");
    return true;
}

/* Capture of this bucket's first step; the graph is then launched once to
 * do the step's work (capturing runs nothing). */
static void cuda_be_graph_capture(Backend *be, bool begin) {
    CudaBackend *cb = cb_of(be);
    if (cb->bucket < 0 || (begin && cb->failed)) return;
    if (begin) {
        op_fail(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), "graph capture");
        return;
    }
    Err je = {};
    if (deq_ahead_join(&cb->deq, cb->stream, &je)) quant_fail(cb, &je);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
    cudaGraphExec_t ex = NULL;
    if (e == cudaSuccess && !cb->failed) e = cudaGraphInstantiate(&ex, g, 0);
    if (g) cudaGraphDestroy(g);
    op_fail(cb, e, "graph instantiate");
    if (cb->failed) { if (ex) cudaGraphExecDestroy(ex); return; }
    cb->graph[cb->bucket] = ex;
    op_fail(cb, cudaGraphLaunch(ex, cb->stream), "graph launch");
}

/* ---------- ops ---------- */

static void cuda_be_embed(Backend *be, void *out, const WeightRef *table, int T, float scale) {
    CudaBackend *cb = cb_of(be);
    cuda_embed((float *)out, (const bf16 *)table->data, cb->d_ids, T, (int)table->cols, scale, cb->stream);
}

static void cuda_be_add_rmsnorm(Backend *be, void *x, const void *delta, void *out, const WeightRef *w, int T, int C,
                                float eps, float offset) {
    cuda_add_rmsnorm((float *)x, (const bf16 *)delta, (bf16 *)out, (const float *)w->data, T, C, eps, offset,
                     cb_of(be)->stream);
}

static void cuda_be_rmsnorm(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                            float offset) {
    cuda_rmsnorm((bf16 *)out, (const bf16 *)x, (const float *)w->data, rows, C, eps, offset, cb_of(be)->stream);
}

static void cuda_be_matmul(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias,
                           int T) {
    wgemm(cb_of(be), y, false, (const bf16 *)x, w, mat, vec_of(bias, mat), T);
}

/* Where the matrix-vector kernels store q, k, v (+ biases) of Wq|Wk|Wv. */
static GemvOut qkv_out(void *q, void *k, void *v, const LayerWeights *lw) {
    const int64_t nq = lw->wq.rows, nk = lw->wk.rows, nv = lw->wv.rows;
    GemvOut out = {{q, k, v}, {vec_of(&lw->bq, 0), vec_of(&lw->bk, 0), vec_of(&lw->bv, 0)}, {nq, nq + nk, nq + nk + nv},
                   false, false};
    return out;
}

/* One GEMM over the concatenated Wq|Wk|Wv, split (and biased) after. */
static void cuda_be_qkv(Backend *be, void *q, void *k, void *v, const void *x, const LayerWeights *lw, int T) {
    CudaBackend *cb = cb_of(be);
    int nq = (int)lw->wq.rows, nk = (int)lw->wk.rows, nv = (int)lw->wv.rows, K = (int)lw->wq.cols;
    const bf16 *Wq = mat_of(&lw->wq, 0), *Wk = mat_of(&lw->wk, 0), *Wv = mat_of(&lw->wv, 0);
    bool qcat = is_quant(&lw->wq) && lw->wk.data == lw->wq.data && lw->wv.data == lw->wq.data;
    bool bcat = !is_quant(&lw->wq) && !is_quant(&lw->wk) && !is_quant(&lw->wv) && Wk == Wq + (int64_t)nq * K &&
                Wv == Wk + (int64_t)nk * K;
    bool gemv = T <= (qcat ? qgemv_rows(cb, qm_of(&lw->wq)) : cb->gemv_max_t) && !cb->bi;
    if (cb->failed || T <= 0) return;
    if ((qcat || bcat) && gemv) { /* the matrix-vector kernels store q, k, v (+ biases) themselves */
        GemvOut out = qkv_out(q, k, v, lw);
        if (qcat) qgemv(cb, (const bf16 *)x, qm_of(&lw->wq), &out, T);
        else cuda_gemv_parts(&out, Wq, (const bf16 *)x, nq + nk + nv, K, T, cb->stream);
    } else if (qcat || bcat) {
        GemvOut out = qkv_out(q, k, v, lw);
        QuantGemmEpi epi = {&out, false, NULL, NULL, NULL, ACT_SILU, 0.0f};
        if (qcat && qgemm_epi(cb, (const bf16 *)x, qm_of(&lw->wq), &epi, T)) return; /* stores q, k, v itself */
        if (qcat) qgemm(cb, cb->scratch, false, (const bf16 *)x, qm_of(&lw->wq), NULL, T);
        else gemm(cb, cb->scratch, false, (const bf16 *)x, Wq, NULL, nq + nk + nv, T, K);
        cuda_split_qkv((bf16 *)q, (bf16 *)k, (bf16 *)v, cb->scratch, vec_of(&lw->bq, 0), vec_of(&lw->bk, 0),
                       vec_of(&lw->bv, 0), T, nq, nk, nv, cb->stream);
    } else {
        cuda_be_matmul(be, q, x, &lw->wq, 0, &lw->bq, T);
        cuda_be_matmul(be, k, x, &lw->wk, 0, &lw->bk, T);
        cuda_be_matmul(be, v, x, &lw->wv, 0, &lw->bv, T);
    }
}

static void cuda_be_rope_kv_write(Backend *be, int layer, void *q, void *k, const void *v, int T) {
    CudaBackend *cb = cb_of(be);
    const ModelConfig *c = cb->cfg;
    DevAttnBatch b = cb->batch;
    b.n_tokens = T;
    const LayerWeights *lw = &cb->w.layers[layer];
    QkNorm qk = {(const float *)lw->q_norm.data, (const float *)lw->k_norm.data, c->norm_eps, c->norm_offset};
    cuda_rope_kv_write((bf16 *)q, (bf16 *)k, (const bf16 *)v, &cb->kv[layer], &b, c->n_heads,
                       c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->rope_dim,
                       cb->d_inv_freq + (size_t)layer * (c->rope_dim / 2), cb->mscale[layer], c->rope_neox,
                       cb->n_slots, &qk, cb->stream);
}

static void cuda_be_attention(Backend *be, void *out, const void *q, int layer, const AttnParams *p, int T) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) return;
    if (!cb->fast_attn) {
        DevAttnBatch b = cb->batch;
        b.n_tokens = T;
        cuda_attention_generic((bf16 *)out, (const bf16 *)q, &cb->kv[layer], &b, p, cb->stream);
        return;
    }
    Err e = {};
    if (cuda_attention(out, q, &cb->kv[layer], &cb->dmeta, p, p->sinks, &cb->work, cb->stream, &e)) {
        cb->failed = true;
        cb->err = e;
    }
}

/* A step of decode rows alone: rope, cache write and attention in the decode
 * kernel (one launch instead of two; attention.cuh cuda_attention_decode_rope). */
static bool cuda_be_rope_attention(Backend *be, int layer, void *out, void *q, void *k, const void *v,
                                   const AttnParams *p, int T) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed || cb->rope_apart || !cb->fast_attn || cb->meta.n_tiles > 0 || cb->meta.n_decode != T)
        return false;
    const ModelConfig *c = cb->cfg;
    const LayerWeights *lw = &cb->w.layers[layer];
    AttnRope r = {k, v, (const float *)lw->q_norm.data, (const float *)lw->k_norm.data, c->norm_eps,
                  c->norm_offset, cb->d_inv_freq + (size_t)layer * (c->rope_dim / 2), cb->mscale[layer],
                  c->rope_dim, c->rope_neox, cb->batch.slot, cb->n_slots};
    Err e = {};
    if (cuda_attention_decode_rope(out, q, &cb->kv[layer], &cb->dmeta, p, p->sinks, &cb->work, &r, cb->stream, &e)) {
        cb->failed = true;
        cb->err = e;
    }
    return true;
}

/* Wgate|Wup as the one quantized matrix that the dp4a GEMV with the
 * activation fused takes at T rows (one), or NULL. */
static const QuantMatrix *glu_x8_matrix(const CudaBackend *cb, const LayerWeights *lw, int T) {
    const QuantMatrix *W = is_quant(&lw->w_gate) && lw->w_up.data == lw->w_gate.data ? qm_of(&lw->w_gate) : NULL;
    int v = cb->qgemv_version;
    return W && T == 1 && !cb->bi && (v == 0 || v == 5) && quant_gemv_x8_supported(W->type, W->cols) ? W : NULL;
}

/* Decode: one matrix-vector pass over Wgate|Wup with the activation fused;
 * else one GEMM (two when not concatenated) and the GLU kernel. */
static void cuda_be_gate_up(Backend *be, void *out, const void *x, const LayerWeights *lw, int mat, int T,
                            Activation act, float limit) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) return;
    int F = (int)lw->w_gate.rows, K = (int)lw->w_gate.cols;
    const bf16 *Wg = mat_of(&lw->w_gate, mat), *Wu = mat_of(&lw->w_up, mat);
    const float *bg = vec_of(&lw->b_gate, mat), *bu = vec_of(&lw->b_up, mat);
    bool anyq = is_quant(&lw->w_gate) || is_quant(&lw->w_up);
    const QuantMatrix *qgu = anyq && lw->w_up.data == lw->w_gate.data ? qm_of(&lw->w_gate) : NULL;
    if (glu_x8_matrix(cb, lw, T)) {
        Err e = {}; /* one row: the dp4a GEMV with the activation fused (no GLU kernel) */
        if (quant_gemv_x8_glu(qgu, x, NULL, out, bg, bu, act, limit, cb->stream, &e)) quant_fail(cb, &e);
    } else if (qgu) { /* one repacked Wgate|Wup: the GLU in the fused GEMM's epilogue, or its kernel after */
        QuantGemmEpi epi = {NULL, true, out, bg, bu, act, limit};
        if (qgemm_epi(cb, (const bf16 *)x, qgu, &epi, T)) return;
        qgemm(cb, cb->scratch, false, (const bf16 *)x, qgu, NULL, T);
        cuda_glu((bf16 *)out, cb->scratch, cb->scratch + F, 2 * F, bg, bu, T, F, act, limit, cb->stream);
    } else if (anyq) {
        bf16 *g = cb->scratch, *u = cb->scratch + (int64_t)T * F;
        wgemm(cb, g, false, (const bf16 *)x, &lw->w_gate, mat, NULL, T);
        wgemm(cb, u, false, (const bf16 *)x, &lw->w_up, mat, NULL, T);
        cuda_glu((bf16 *)out, g, u, F, bg, bu, T, F, act, limit, cb->stream);
    } else if (Wu == Wg + (int64_t)F * K && T <= cb->gemv_max_t && !cb->bi) {
        cuda_gemv_glu((bf16 *)out, Wg, (const bf16 *)x, bg, bu, F, K, T, act, limit, cb->stream);
    } else if (Wu == Wg + (int64_t)F * K) {
        gemm(cb, cb->scratch, false, (const bf16 *)x, Wg, NULL, 2 * F, T, K);
        cuda_glu((bf16 *)out, cb->scratch, cb->scratch + F, 2 * F, bg, bu, T, F, act, limit, cb->stream);
    } else {
        bf16 *g = cb->scratch, *u = cb->scratch + (int64_t)T * F;
        gemm(cb, g, false, (const bf16 *)x, Wg, NULL, F, T, K);
        gemm(cb, u, false, (const bf16 *)x, Wu, NULL, F, T, K);
        cuda_glu((bf16 *)out, g, u, F, bg, bu, T, F, act, limit, cb->stream);
    }
}

/* Wq|Wk|Wv as the one quantized matrix that the dp4a GEMV takes at T rows
 * (by default or as asked: qgemv's choice), or NULL. */
static const QuantMatrix *qkv_x8_matrix(const CudaBackend *cb, const LayerWeights *lw, int T) {
    const QuantMatrix *W = is_quant(&lw->wq) && lw->wk.data == lw->wq.data && lw->wv.data == lw->wq.data
                               ? qm_of(&lw->wq) : NULL;
    int v = cb->qgemv_version;
    bool x8 = W && T == 1 && !cb->bi &&
              (v == 0 ? quant_gemv_picks_x8(W, T) : v == 5 && quant_gemv_x8_supported(W->type, W->cols));
    return x8 ? W : NULL;
}

/* W, when add_rmsnorm can be folded into the dp4a GEMV over it (W not
 * NULL, nothing to add first, the norm as wide as W, rows 16-byte aligned):
 * *qn is then set. Else runs add_rmsnorm into n->out and returns NULL. */
static const QuantMatrix *norm_fold(Backend *be, const AddNorm *n, const QuantMatrix *W, int T, QxNorm *qn) {
    if (W && !n->delta && W->cols == n->C && n->w->data && (uintptr_t)n->x % 16 == 0 &&
        (uintptr_t)n->w->data % 16 == 0) {
        *qn = QxNorm{(const float *)n->x, (const float *)n->w->data, n->eps, n->offset};
        return W;
    }
    cuda_be_add_rmsnorm(be, n->x, n->delta, n->out, n->w, T, n->C, n->eps, n->offset);
    return NULL;
}

/* At one row with Q|K|V in one dp4a GEMV, that GEMV normalizes x itself
 * (no add_rmsnorm launch); else add_rmsnorm, then qkv. */
static void cuda_be_norm_qkv(Backend *be, const AddNorm *n, void *q, void *k, void *v, const LayerWeights *lw,
                             int T) {
    CudaBackend *cb = cb_of(be);
    QxNorm qn;
    if (cb->failed) return;
    const QuantMatrix *W = norm_fold(be, n, qkv_x8_matrix(cb, lw, T), T, &qn);
    if (!W) return cuda_be_qkv(be, q, k, v, n->out, lw, T);
    GemvOut out = qkv_out(q, k, v, lw);
    Err e = {};
    if (quant_gemv_x8(W, NULL, &qn, &out, 1, cb->stream, &e)) quant_fail(cb, &e);
}

/* The same for Wgate|Wup with the activation fused. */
static void cuda_be_norm_gate_up(Backend *be, const AddNorm *n, void *out, const LayerWeights *lw, int T,
                                 Activation act, float limit) {
    CudaBackend *cb = cb_of(be);
    QxNorm qn;
    if (cb->failed) return;
    const QuantMatrix *W = norm_fold(be, n, glu_x8_matrix(cb, lw, T), T, &qn);
    if (!W) return cuda_be_gate_up(be, out, n->out, lw, 0, T, act, limit);
    Err e = {};
    if (quant_gemv_x8_glu(W, NULL, &qn, out, vec_of(&lw->b_gate, 0), vec_of(&lw->b_up, 0), act, limit, cb->stream,
                          &e))
        quant_fail(cb, &e);
}

/* x += the product, stored by the quantized GEMV itself (up to 8 rows; not
 * in the batch-invariant mode, whose GEMM route writes a buffer). */
static bool cuda_be_matmul_add(Backend *be, void *x, const void *in, const WeightRef *w, int mat,
                               const WeightRef *bias, int T) {
    CudaBackend *cb = cb_of(be);
    if (!is_quant(w) || T < 1 || T > qgemv_rows(cb, qm_of(w)) || cb->bi) return false;
    GemvOut out = gemv_out_one(x, true, vec_of(bias, mat), w->rows);
    out.add = true;
    if (!cb->failed) qgemv(cb, (const bf16 *)in, qm_of(w), &out, T);
    return true;
}

/* Top-k of one token's router logits, then a softmax over those k (as
 * gpt-oss routes). */
static void moe_route(const float *lg, int E, int K, int *sel, float *wts) {
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        sel[j] = best;
    }
    float m = lg[sel[0]], sum = 0;
    for (int j = 0; j < K; j++) sum += wts[j] = expf(lg[sel[j]] - m);
    for (int j = 0; j < K; j++) wts[j] /= sum;
}

/* Decode-sized MoE, all on the device (no host sync, so it can be graphed):
 * top-k routing kernel, then one matrix-vector pass per (token, choice) pair
 * over its expert's gate/up (GLU fused) and down rows, then the weighted sum. */
static void moe_decode(CudaBackend *cb, bf16 *out, const bf16 *x, const LayerWeights *lw, const ModelConfig *c, int T) {
    int K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    Activation act = c->act == ACT_KIND_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU;
    cuda_moe_route(cb->moe_idx, cb->moe_w, cb->router, T, c->n_experts, K, cb->stream);
    cuda_gemv_experts(cb->moe_act, mat_of(&lw->w_gate, 0), mat_of(&lw->w_up, 0), vec_of(&lw->b_gate, 0),
                      vec_of(&lw->b_up, 0), x, K, cb->moe_idx, T * K, F, C, act, c->act_limit, cb->stream);
    cuda_gemv_experts(cb->moe_out, mat_of(&lw->w_down, 0), NULL, vec_of(&lw->b_down, 0), NULL, cb->moe_act, 1,
                      cb->moe_idx, T * K, C, F, act, 0, cb->stream);
    cuda_moe_combine(out, cb->moe_out, cb->moe_w, T, K, C, cb->stream);
}

/* MoE: the router runs on the GPU (fp32 logits). Up to GEMV_MAX_T rows
 * the rest does too (moe_decode); larger steps choose the top-k on the host
 * (one sync per layer), list the rows of all experts in one upload, then
 * gather each expert's rows, run its MLP and add them back with their
 * routing weight in fp32. */
static void cuda_be_moe(Backend *be, void *out, const void *x, const LayerWeights *lw, const ModelConfig *c, int T) {
    CudaBackend *cb = cb_of(be);
    int E = c->n_experts, K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    wgemm(cb, cb->router, true, (const bf16 *)x, &lw->router, 0, vec_of(&lw->router_bias, 0), T);
    if (T <= GEMV_MAX_T && !cb->bi) { moe_decode(cb, (bf16 *)out, (const bf16 *)x, lw, c, T); return; }
    op_fail(cb, cudaMemcpyAsync(cb->h_router, cb->router, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost,
                                cb->stream), "router");
    op_fail(cb, cudaStreamSynchronize(cb->stream), "router");
    int *sel = (int *)malloc((size_t)T * K * sizeof(int)), *start = (int *)calloc(E + 1, sizeof(int));
    float *wts = (float *)malloc((size_t)T * K * sizeof(float));
    if (!sel || !wts || !start) op_fail(cb, cudaErrorMemoryAllocation, "moe routing");
    if (cb->failed) { free(sel); free(wts); free(start); return; }
    for (int t = 0; t < T; t++) moe_route(cb->h_router + (int64_t)t * E, E, K, sel + t * K, wts + t * K);
    for (int i = 0; i < T * K; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int e = 0, n = 0; e < E; e++)
        for (int i = 0; i < T * K; i++)
            if (sel[i] == e) { cb->h_idx[n] = i / K; cb->h_w[n] = wts[i]; n++; }
    op_fail(cb, cudaMemcpyAsync(cb->moe_idx, cb->h_idx, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                cb->stream), "moe");
    op_fail(cb, cudaMemcpyAsync(cb->moe_w, cb->h_w, (size_t)T * K * sizeof(float), cudaMemcpyHostToDevice, cb->stream),
            "moe");
    op_fail(cb, cudaMemsetAsync(cb->moe_acc, 0, (size_t)T * C * sizeof(float), cb->stream), "moe");
    Activation act = c->act == ACT_KIND_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU;
    for (int e = 0; e < E && !cb->failed; e++) {
        int n = start[e + 1] - start[e];
        if (n == 0) continue;
        cuda_gather_rows(cb->moe_rows, (const bf16 *)x, cb->moe_idx + start[e], n, C, cb->stream);
        cuda_be_gate_up(be, cb->moe_act, cb->moe_rows, lw, e, n, act, c->act_limit);
        gemm(cb, cb->moe_out, false, cb->moe_act, mat_of(&lw->w_down, e), vec_of(&lw->b_down, e), C, n, F);
        cuda_scatter_add(cb->moe_acc, cb->moe_out, cb->moe_idx + start[e], cb->moe_w + start[e], n, C, cb->stream);
    }
    cuda_f32_to_bf16((bf16 *)out, cb->moe_acc, (int64_t)T * C, cb->stream);
    free(sel);
    free(wts);
    free(start);
}

static void cuda_be_gather_rows(Backend *be, void *dst, const void *src, int n, int C) {
    CudaBackend *cb = cb_of(be);
    cuda_gather_rows((bf16 *)dst, (const bf16 *)src, cb->d_rows, n, C, cb->stream);
}

static void cuda_be_logits(Backend *be, void *logits, const void *x, const WeightRef *w, int n, float cap) {
    CudaBackend *cb = cb_of(be);
    wgemm(cb, logits, true, (const bf16 *)x, w, 0, NULL, n);
    if (cap > 0) cuda_softcap((float *)logits, (int64_t)n * w->rows, cap, cb->stream);
}

/* Ends the step: copies n values of buf (fp32, or bf16 widened on the host). */
static int cuda_be_read(Backend *be, float *host, const void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    op_fail(cb, cudaGetLastError(), "kernel launch");
    Err je = {};
    if (!cb->failed && deq_ahead_join(&cb->deq, cb->stream, &je)) quant_fail(cb, &je);
    if (!cb->failed && (!b || n > b->n)) return err_set(err, "cuda: read of %lld values from an unknown buffer", (long long)n);
    bf16 *tmp = !cb->failed && n > 0 && b->kind == BUF_ACT ? (bf16 *)malloc(n * sizeof(bf16)) : NULL;
    if (!cb->failed && n > 0 && b->kind == BUF_ACT && !tmp) return err_set(err, "out of memory");
    void *dst = tmp ? (void *)tmp : (void *)host;
    size_t bytes = n * (tmp ? sizeof(bf16) : sizeof(float));
    if (!cb->failed && n > 0) op_fail(cb, cudaMemcpyAsync(dst, buf, bytes, cudaMemcpyDeviceToHost, cb->stream), "read");
    if (!cb->failed && cb->link) { /* a stage: its transfers may wait on a peer, so wait with a deadline */
        Err e = {};
        if (nccl_link_wait(cb->link, cb->link_rank, cb->stream, &e)) { cb->failed = true; cb->err = e; }
    } else if (!cb->failed) op_fail(cb, cudaStreamSynchronize(cb->stream), "step");
    for (int64_t i = 0; tmp && !cb->failed && i < n; i++) host[i] = __bfloat162float(tmp[i]);
    free(tmp);
    if (cb->failed) { *err = cb->err; return -1; }
    return 0;
}

static int cuda_be_write(Backend *be, void *buf, const float *host, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: write of %lld values to an unknown buffer", (long long)n);
    if (n <= 0) return 0;
    /* On the backend's stream, waited for: a plain cudaMemcpy from pageable
     * memory may return before its DMA lands, and the non-blocking stream
     * would not wait for it. */
    bf16 *tmp = b->kind == BUF_F32 ? NULL : (bf16 *)malloc(n * sizeof(bf16));
    if (b->kind != BUF_F32 && !tmp) return err_set(err, "out of memory");
    for (int64_t i = 0; tmp && i < n; i++) tmp[i] = __float2bfloat16(host[i]);
    cudaError_t e = cudaMemcpyAsync(buf, tmp ? (const void *)tmp : (const void *)host,
                                    n * (tmp ? sizeof(bf16) : sizeof(float)), cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
    free(tmp);
    CUDA_CHECK(e, err);
    return 0;
}

/* Rows of a step whose logits stay on the device: the GPU sampler draws
 * them and only the token ids come back (a 256-row step of a 128k
 * vocabulary would otherwise copy 131 MB to the host). */
static int cuda_be_sample(Backend *be, void *logits, int n, Sampler *const *samplers, int32_t *tokens, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    if (n <= 0) return 0;
    if (!cb->sampler_built) {
        if (gpu_sampler_build(&cb->sampler, cb->max_seqs, cb->cfg->vocab, 256 * cb->max_seqs, err)) return -1;
        cb->sampler_built = true;
    }
    if (n > cb->sampler.max_rows) return 1;
    Err why = {};
    for (int r = 0; r < n; r++)
        if (gpu_sampler_set_row(&cb->sampler, r, samplers[r], &why)) return 1; /* e.g. top_k above the GPU limit */
    if (gpu_sampler_run(&cb->sampler, (float *)logits, n, cb->stream, err)) return -1;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
    gpu_sampler_finish(&cb->sampler, samplers, n);
    memcpy(tokens, cb->sampler.h_out, n * sizeof(int32_t));
    return 0;
}

/* ---------- pipeline links (nccl_link.h) ---------- */

static void cuda_destroy(Backend *be);

static int cuda_be_send_next(Backend *be, const void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: send of %lld values from an unknown buffer", (long long)n);
    if (cb->failed) { *err = cb->err; return -1; }
    return nccl_link_send(cb->link, cb->link_rank, buf, (size_t)n, b->kind == BUF_ACT, cb->link_rank + 1, cb->stream,
                          err);
}

static int cuda_be_recv_prev(Backend *be, void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: receive of %lld values into an unknown buffer", (long long)n);
    if (cb->failed) { *err = cb->err; return -1; }
    return nccl_link_recv(cb->link, cb->link_rank, buf, (size_t)n, b->kind == BUF_ACT, cb->link_rank - 1, cb->stream,
                          err);
}

extern "C" int backend_cuda_link(Backend *be, NcclGroup *g, int rank, Err *err) {
    if (!be || be->destroy != cuda_destroy) return err_set(err, "nccl: stage %d is not on a CUDA backend", rank);
    CudaBackend *cb = cb_of(be);
    cb->link = g;
    cb->link_rank = rank;
    be->send_next = cuda_be_send_next;
    be->recv_prev = cuda_be_recv_prev;
    return 0;
}

static void cuda_destroy(Backend *be) {
    CudaBackend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    if (cb->sampler_built) gpu_sampler_free(&cb->sampler);
    graphs_drop(cb);
    deq_ahead_free(&cb->deq);
    free(cb->qnext);
    for (int i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
    for (int i = 0; i < cb->n_bufs; i++) cudaFree(cb->bufs[i].ptr);
    void *dev[] = {cb->d_ids, cb->d_pos, cb->d_seq, cb->d_tables, cb->d_slot, cb->d_rows, cb->scratch, cb->router,
                   cb->moe_w, cb->moe_acc, cb->moe_idx, cb->moe_rows, cb->moe_act, cb->moe_out, cb->workspace,
                   cb->d_inv_freq, cb->kv_pool, cb->d_meta, cb->work.part, cb->qnative, cb->qwork.buf};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    void *pinned[] = {cb->h_ids, cb->h_pos, cb->h_seq, cb->h_slot, cb->h_rows, cb->h_tables, cb->h_router, cb->h_w,
                      cb->h_idx, cb->h_meta};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) cudaFreeHost(pinned[i]);
    for (int i = 0; i < cb->n_plans; i++) {
        cublasLtMatmulDescDestroy(cb->plans[i].desc);
        cublasLtMatrixLayoutDestroy(cb->plans[i].a);
        cublasLtMatrixLayoutDestroy(cb->plans[i].b);
        cublasLtMatrixLayoutDestroy(cb->plans[i].c);
    }
    if (cb->lt) cublasLtDestroy(cb->lt);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb->kv);
    free(cb->mscale);
    free(cb->h_need);
    free(cb->meta_seq);
    free(cb->meta_tables);
    attn_meta_free(&cb->meta);
    free(cb->allocs);
    free(cb->qm);
    free(cb->w.layers);
    free(cb);
    free(be);
}

/* ---------- creation ---------- */

/* Step buffers sized for max_tokens rows; rope tables. */
static int cuda_alloc_step(CudaBackend *cb, const ModelConfig *c, const ModelWeights *host, Err *err) {
    int T = cb->max_tokens;
    cb->max_seqs = T < 1024 ? T : 1024;
    int64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->n_experts > 0 ? c->n_experts_used : 1;
    int64_t qkv = (int64_t)c->n_heads * c->head_dim_k + (int64_t)c->n_kv_heads * (c->head_dim_k + c->head_dim_v);
    int64_t wide = qkv > 2 * (int64_t)c->ffn_dim ? qkv : 2 * (int64_t)c->ffn_dim;
    CUDA_CHECK(cudaMalloc(&cb->d_ids, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_pos, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_seq, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_slot, T * sizeof(int64_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_rows, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_ids, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_pos, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_seq, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_slot, T * sizeof(int64_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_rows, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->scratch, T * wide * sizeof(bf16)), err);
    CUDA_CHECK(cudaMalloc(&cb->router, T * E * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_router, T * E * sizeof(float)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_idx, (T > GEMV_MAX_T ? T : GEMV_MAX_T) * K * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_idx, T * K * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_w, (T > GEMV_MAX_T ? T : GEMV_MAX_T) * K * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_w, T * K * sizeof(float)), err);
    if (c->n_experts > 0) {
        int64_t rows = T > GEMV_MAX_T * K ? T : GEMV_MAX_T * K; /* expert rows, or decode (token, choice) pairs */
        CUDA_CHECK(cudaMalloc(&cb->moe_rows, (size_t)T * c->dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_out, (size_t)rows * c->dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_act, (size_t)rows * c->ffn_dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_acc, (size_t)T * c->dim * sizeof(float)), err);
    }
    float *inv_freq = NULL;
    if (backend_rope_tables(c, host, &inv_freq, &cb->mscale, err)) return -1;
    size_t fbytes = (size_t)c->n_layers * (c->rope_dim / 2 > 0 ? c->rope_dim / 2 : 1) * sizeof(float);
    cudaError_t e = cudaMalloc(&cb->d_inv_freq, fbytes);
    if (e == cudaSuccess) e = cudaMemcpy(cb->d_inv_freq, inv_freq, fbytes, cudaMemcpyHostToDevice);
    free(inv_freq);
    CUDA_CHECK(e, err);
    return 0;
}

/* Bytes the KV cache may take: mem_util of the device's memory, less what
 * is in use now (weights, step buffers, other processes) and what the
 * activations of forward_init will take. */
static int64_t kv_budget(const ModelConfig *c, float mem_util, size_t free_b, size_t total, int max_tokens,
                         int64_t already_planned) {
    int64_t act, f32;
    forward_buffer_elems(c, max_tokens, &act, &f32);
    double budget = (double)mem_util * total - (double)(total - free_b) - already_planned - act * 2.0 - f32 * 4.0 -
                    (double)RESERVE_BYTES;
    return budget > 0 ? (int64_t)budget : 0;
}

/* Bytes of one layer of a cache of n_slots slots, and (when kv is given)
 * its views at base: K | V (| K scales | V scales), each 256-byte aligned. */
static size_t kv_layer_layout(const ModelConfig *c, KVDtype t, int64_t n_slots, char *base, KVLayerDev *kv) {
    size_t elem = t == KV_DTYPE_FP8 ? 1 : sizeof(bf16), align = 256;
    size_t part[4] = {(size_t)n_slots * c->n_kv_heads * c->head_dim_k * elem,
                      (size_t)n_slots * c->n_kv_heads * c->head_dim_v * elem, 0, 0};
    if (t == KV_DTYPE_FP8) part[2] = part[3] = (size_t)n_slots * c->n_kv_heads * sizeof(float);
    size_t off[4], at = 0;
    for (int i = 0; i < 4; i++) {
        off[i] = at;
        at += (part[i] + align - 1) / align * align;
    }
    if (kv) {
        bool fp8 = t == KV_DTYPE_FP8;
        *kv = (KVLayerDev){t, base + off[0], base + off[1], fp8 ? (float *)(base + off[2]) : NULL,
                           fp8 ? (float *)(base + off[3]) : NULL};
    }
    return at;
}

static int cuda_alloc_kv(CudaBackend *cb, const ModelConfig *c, const CudaOptions *o, Err *err) {
    int64_t per_block = (int64_t)o->block_size * config_kv_bytes_per_token(c, o->kv_dtype);
    int64_t n_blocks = o->n_blocks;
    if (n_blocks <= 0) {
        size_t free_b = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total), err);
        float util = o->mem_util > 0 ? o->mem_util : 0.9f;
        n_blocks = kv_budget(c, util, free_b, total, cb->max_tokens, 0) / (per_block > 0 ? per_block : 1);
        if (n_blocks > MAX_AUTO_BLOCKS) n_blocks = MAX_AUTO_BLOCKS;
        if (n_blocks < 1)
            return err_set(err, "cuda: --gpu-mem-util %.2f of %.1f GiB leaves no room for the KV cache after the "
                           "weights and activations (%.1f GiB in use)", util, total / 1073741824.0,
                           (total - free_b) / 1073741824.0);
    }
    int64_t seq_tokens = o->max_seq_tokens > 0 ? o->max_seq_tokens : n_blocks * o->block_size;
    int64_t width = (seq_tokens + o->block_size - 1) / o->block_size;
    cb->max_blocks = (int)(width < n_blocks ? width : n_blocks);
    cb->n_slots = n_blocks * o->block_size;
    cb->kv_dtype = o->kv_dtype;
    size_t layer = kv_layer_layout(c, o->kv_dtype, cb->n_slots, NULL, NULL);
    cb->kv_pool_bytes = (size_t)c->n_layers * layer;
    CUDA_CHECK(cudaMalloc(&cb->kv_pool, cb->kv_pool_bytes), err);
    cb->kv = (KVLayerDev *)calloc(c->n_layers, sizeof *cb->kv);
    cb->h_need = (int32_t *)calloc(cb->max_seqs, sizeof(int32_t));
    if (!cb->kv || !cb->h_need) return err_set(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++)
        kv_layer_layout(c, o->kv_dtype, cb->n_slots, (char *)cb->kv_pool + (size_t)l * layer, &cb->kv[l]);
    CUDA_CHECK(cudaMallocHost(&cb->h_tables, (size_t)cb->max_seqs * cb->max_blocks * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_tables, (size_t)cb->max_seqs * cb->max_blocks * sizeof(int32_t)), err);
    return 0;
}

/* Whether attention.cuh has kernels for this model, and the split-decode
 * scratch for the largest (decode rows x splits) a step can pick (taken
 * before the KV cache is sized; splits only grow with the context). */
static int attn_alloc_work(CudaBackend *cb, const ModelConfig *c, const CudaOptions *o, Err *err) {
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap, 0, NULL};
    Err why = {};
    cb->fast_attn = !o->generic_attention && cuda_attention_check(&p, o->block_size, &why) == 0;
    if (!cb->fast_attn) return 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&cb->n_sms, cudaDevAttrMultiProcessorCount, cb->device), err);
    size_t work = 0, slot = attn_decode_work_bytes(1, c->n_heads, c->head_dim_v, 1);
    for (int n = 1; n <= cb->max_tokens; n++) {
        int splits = decode_grid_splits(cb, 1 << 30, n);
        size_t b = attn_decode_work_bytes(n, c->n_heads, c->head_dim_v, splits);
        work = b > work ? b : work;
    }
    /* batch-invariant: room for a full graph bucket at the most splits a row
     * takes; larger steps run their decode rows in groups (attention.cu) */
    size_t bi_work = (size_t)BUCKET_ROWS[N_BUCKETS - 1] * ATTN_MAX_SPLITS * slot;
    if (cb->bi && bi_work > work) work = bi_work;
    CUDA_CHECK(cudaMalloc(&cb->work.part, work), err);
    CUDA_CHECK(cudaMemset(cb->work.part, 0, work), err); /* the split counters start at zero */
    cb->work.cap = (int64_t)(work / slot);
    /* every decode row splits its own key range, ATTN_SPLIT_TILES tiles a
     * split: a short row of a long graph gets one split and no merge (a
     * Llama-3-8B Q4_K step at a context of 32k: 188 -> 227 tok/s; batch 8 at
     * 4k: +12%) */
    cb->work.split_tiles = ATTN_SPLIT_TILES;
    return 0;
}

/* The per-step metadata buffers: max_tokens rows, full-width tables for
 * max_seqs sequences plus a graph's padding ones. The KV pool is zeroed so
 * padding rows read finite keys (fp8: code 0, scale 0). */
static int attn_alloc_meta(CudaBackend *cb, const ModelConfig *c, Err *err) {
    CUDA_CHECK(cudaMemsetAsync(cb->kv_pool, 0, cb->kv_pool_bytes, cb->stream), err);
    if (!cb->fast_attn) return 0;
    int T = cb->max_tokens, max_pad = BUCKET_ROWS[N_BUCKETS - 1];
    cb->meta_cap = 9LL * T + (int64_t)(cb->max_seqs + max_pad) * cb->max_blocks;
    cb->meta_seq = (int32_t *)calloc(T > max_pad ? T : max_pad, sizeof(int32_t));
    cb->meta_tables = (const int32_t **)calloc(cb->max_seqs + max_pad, sizeof(int32_t *));
    if (!cb->meta_seq || !cb->meta_tables) return err_set(err, "out of memory");
    CUDA_CHECK(cudaMalloc(&cb->d_meta, cb->meta_cap * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_meta, cb->meta_cap * sizeof(int32_t)), err);
    return 0;
}

extern "C" Backend *backend_cuda_create_opts(const ModelConfig *c, const ModelWeights *host, const CudaOptions *o,
                                             double *load_gbps, Err *err) {
    Backend *be = (Backend *)calloc(1, sizeof *be);
    CudaBackend *cb = (CudaBackend *)calloc(1, sizeof *cb);
    if (!be || !cb) { free(be); free(cb); err_set(err, "out of memory"); return NULL; }
    *be = (Backend){};
    be->ctx = cb;
    be->destroy = cuda_destroy;
    cb->device = o->device;
    cb->cfg = c;
    cb->max_tokens = o->max_tokens > 0 ? o->max_tokens : 1;
    cb->graphs_on = !o->no_graphs;
    cb->bf16_weights = o->bf16_weights;
    cb->bi = o->batch_invariant;
    const char *qv = getenv("CLLM_QUANT_GEMV"); /* compare kernel versions on a whole model without a rebuild */
    cb->qgemv_version = qv && qv[0] >= '1' && qv[0] <= '5' && !qv[1] ? qv[0] - '0' : 0;
    const char *gm = getenv("CLLM_GEMV_MAX_T");
    cb->gemv_max_t = gm && gm[0] >= '1' && gm[0] <= '0' + GEMV_MAX_T && !gm[1] ? gm[0] - '0' : BF16_GEMV_MAX_T;
    const char *qm = getenv("CLLM_QUANT_GEMV_MAX_T");
    cb->qgemv_max_t = qm && qm[0] >= '1' && qm[0] <= '0' + QUANT_GEMV_MAX_T && !qm[1] ? qm[0] - '0' : 0;
    const char *ra = getenv("CLLM_ROPE_ATTENTION");
    cb->rope_apart = ra && !strcmp(ra, "0");
    const char *da = getenv("CLLM_DEQ_AHEAD"); /* buffers, for benchmarks: 0 or 1 (nothing ahead), 2, 3 */
    bool da_ok = da && da[0] >= '0' && da[0] <= '0' + DEQ_AHEAD_MAX && !da[1];
    cb->deq_bufs = da_ok ? (da[0] == '0' ? 1 : da[0] - '0') : DEQ_AHEAD_BUFFERS;
    const char *ps = getenv("CLLM_PROFILE_STEPS");
    if (ps && (sscanf(ps, "%d,%d", &cb->prof_first, &cb->prof_count) != 2 || cb->prof_first < 0 || cb->prof_count < 1))
        cb->prof_count = -1;
    cb->bucket = -1;
    cb->workspace_bytes = (size_t)32 << 20;
    int rc = 0;
    if (qv && *qv && cb->qgemv_version == 0) rc = err_set(err, "CLLM_QUANT_GEMV '%s': not 1, 2, 3, 4 or 5", qv);
    if (rc == 0 && gm && *gm && cb->gemv_max_t != gm[0] - '0')
        rc = err_set(err, "CLLM_GEMV_MAX_T '%s': not 1 .. %d", gm, GEMV_MAX_T);
    if (rc == 0 && qm && *qm && cb->qgemv_max_t == 0)
        rc = err_set(err, "CLLM_QUANT_GEMV_MAX_T '%s': not 1 .. %d", qm, QUANT_GEMV_MAX_T);
    if (rc == 0 && cb->prof_count < 0) rc = err_set(err, "CLLM_PROFILE_STEPS '%s': not FIRST,COUNT (0-based)", ps);
    if (rc == 0 && da && *da && !da_ok) rc = err_set(err, "CLLM_DEQ_AHEAD '%s': not 0, 1, 2 or 3", da);
    /* quantized GEMMs of > 8 rows by quant_gemm: unset, by the step's rows; 0 never; 1 always;
     * 3, 4, 5 always, by that version of it (benchmarks, checks) */
    const char *qg = getenv("CLLM_QUANT_GEMM");
    bool qg_on = qg && qg[0] && strchr("1345", qg[0]) && !qg[1];
    if (rc == 0 && qg && *qg && !qg_on && strcmp(qg, "0"))
        rc = err_set(err, "CLLM_QUANT_GEMM '%s': not 0, 1, 3, 4 or 5", qg);
    cb->qgemm_version = qg_on && qg[0] != '1' ? qg[0] - '0' : 0;
    cudaError_t e = rc ? cudaSuccess : cudaSetDevice(o->device);
    if (e != cudaSuccess) rc = err_set(err, "cuda: cannot use device %d: %s", o->device, cudaGetErrorString(e));
    cb->qgemm_mode = rc || cb->bi || (qg && !strcmp(qg, "0")) || !quant_gemm_available() ? QGEMM_NEVER
                     : qg_on                                                               ? QGEMM_ALWAYS
                                                                                           : QGEMM_AUTO;
    if (rc == 0 && o->block_size <= 0) rc = err_set(err, "cuda: block size %d", o->block_size);
    int least = 0, greatest = 0; /* the step's stream above dequant_ahead's side stream */
    if (rc == 0 && (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
        rc = err_set(err, "cuda: stream priorities: %s", cudaGetErrorString(e));
    if (rc == 0 && (e = cudaStreamCreateWithPriority(&cb->stream, cudaStreamNonBlocking, greatest)) != cudaSuccess)
        rc = err_set(err, "cuda: stream: %s", cudaGetErrorString(e));
    if (rc == 0 && cublasLtCreate(&cb->lt) != CUBLAS_STATUS_SUCCESS) rc = err_set(err, "cuBLASLt: cannot initialize");
    if (rc == 0 && (e = cudaMalloc(&cb->workspace, cb->workspace_bytes)) != cudaSuccess)
        rc = err_set(err, "cuda: workspace: %s", cudaGetErrorString(e));
    if (rc == 0 && cb->qgemm_mode != QGEMM_NEVER) {
        int sms = 0;
        cb->qwork.bytes = (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o->device)) == cudaSuccess
                              ? quant_gemm_work_bytes(sms) : 0;
        if (e == cudaSuccess && (e = cudaMalloc(&cb->qwork.buf, cb->qwork.bytes)) == cudaSuccess)
            e = cudaMemset(cb->qwork.buf, 0, cb->qwork.bytes);
        if (e != cudaSuccess) rc = err_set(err, "cuda: quant_gemm work space: %s", cudaGetErrorString(e));
    }
    if (rc == 0) rc = upload_model(cb, c, host, load_gbps, err);
    if (rc == 0) rc = cuda_alloc_step(cb, c, host, err);
    if (rc == 0) rc = attn_alloc_work(cb, c, o, err);
    if (rc == 0) rc = cuda_alloc_kv(cb, c, o, err);
    if (rc == 0) rc = attn_alloc_meta(cb, c, err);
    if (rc) { cuda_destroy(be); return NULL; }
    snprintf(cb->name, sizeof cb->name, "cuda:%d%s", o->device, cb->bi ? "+bi" : "");
    be->name = cb->name;
    be->weights = &cb->w;
    be->kv_block_size = o->block_size;
    be->kv_n_blocks = (int)(cb->n_slots / o->block_size);
    be->alloc = cuda_be_alloc;
    be->release = cuda_be_release;
    be->begin_step = cuda_be_begin_step;
    be->graph_replay = cuda_be_graph_replay;
    be->graph_capture = cuda_be_graph_capture;
    be->embed = cuda_be_embed;
    be->add_rmsnorm = cuda_be_add_rmsnorm;
    be->rmsnorm = cuda_be_rmsnorm;
    be->qkv = cuda_be_qkv;
    be->matmul = cuda_be_matmul;
    be->rope_kv_write = cuda_be_rope_kv_write;
    be->attention = cuda_be_attention;
    be->rope_attention = cuda_be_rope_attention;
    be->gate_up = cuda_be_gate_up;
    be->norm_qkv = cuda_be_norm_qkv;
    be->norm_gate_up = cuda_be_norm_gate_up;
    be->matmul_add = cuda_be_matmul_add;
    be->moe = cuda_be_moe;
    be->gather_rows = cuda_be_gather_rows;
    be->logits = cuda_be_logits;
    be->read = cuda_be_read;
    be->write = cuda_be_write;
    be->sample = cuda_be_sample;
    return be;
}

extern "C" Backend *backend_cuda_create(const ModelConfig *c, const ModelWeights *host, int device, int block_size,
                                        int n_blocks, int max_tokens, double *load_gbps, Err *err) {
    CudaOptions o = {device, block_size, n_blocks, 0, max_tokens, 0.9f, false, false, false, false, KV_DTYPE_BF16};
    if (n_blocks <= 0) return (Backend *)(err_set(err, "cuda: %d KV blocks", n_blocks), NULL);
    return backend_cuda_create_opts(c, host, &o, load_gbps, err);
}

/* Device bytes of one host weight as upload_model stores it (quantized
 * concatenations differ from the sum of their parts by plane alignment
 * only: at most 512 bytes). */
static uint64_t ref_device_bytes(const WeightRef *w, bool bf16_weights) {
    if (!w->data) return 0;
    size_t qb = 0;
    Err why = {};
    if (keep_quant(bf16_weights, w) && quant_matrix_bytes(w->type, w->rows, w->cols, &qb, &why) == 0) return qb;
    return (uint64_t)w->rows * w->cols * w->n_mats * (w->rows == 1 ? sizeof(float) : sizeof(bf16));
}

extern "C" uint64_t cuda_weight_bytes_planned(const ModelConfig *c, const ModelWeights *w, bool bf16_weights) {
    uint64_t b = ref_device_bytes(&w->tok_embd, true) + ref_device_bytes(&w->output_norm, true);
    if (w->output.data != w->tok_embd.data) b += ref_device_bytes(&w->output, bf16_weights);
    for (int l = 0; l < c->n_layers; l++) {
        const WeightRef *r = (const WeightRef *)&w->layers[l];
        for (int i = 0; i < LAYER_REFS; i++) b += ref_device_bytes(&r[i], bf16_weights);
    }
    return b;
}

extern "C" uint64_t cuda_weight_bytes(const Backend *be) { return ((const CudaBackend *)be->ctx)->weight_bytes; }

extern "C" int cuda_kv_tokens_that_fit(const ModelConfig *c, uint64_t weight_bytes, int device, float mem_util,
                                       int max_tokens, int block_size, KVDtype kv_dtype, int64_t *tokens, Err *err) {
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaSetDevice(device), err);
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total), err);
    int64_t per_block = (int64_t)block_size * config_kv_bytes_per_token(c, kv_dtype);
    int64_t budget = kv_budget(c, mem_util > 0 ? mem_util : 0.9f, free_b, total, max_tokens, (int64_t)weight_bytes);
    *tokens = per_block > 0 ? budget / per_block * block_size : 0;
    return 0;
}
