/* backend_cuda.cu — the CUDA backend: the Backend ops of kernels/backend.h on
 * one GPU. Weights are uploaded once as bf16 matrices (any file dtype,
 * dequantized on the host a row at a time into pinned staging buffers, two
 * buffers alternating so reading the file overlaps the copy) and fp32
 * vectors. GEMMs go through cuBLASLt (bf16 in, fp32 accumulate and out), the
 * algorithm chosen once per shape and cached. Activations are fp32.
 *
 * Written C-style: plain structs and functions, extern "C" entry points. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.cuh"

#define CUBLAS_OK(stmt, err)                                                                              \
    do {                                                                                                  \
        cublasStatus_t s_ = (stmt);                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
            return err_set((err), "cuBLASLt error %d in %s at %s:%d", (int)s_, #stmt, __FILE__, __LINE__); \
    } while (0)

#define GEMM_CACHE 64
#define STAGING_BYTES ((size_t)64 << 20)

typedef struct {
    int m, n, k;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    GemmPlan plans[GEMM_CACHE];
    int n_plans;
    ModelWeights w;              /* device copies; layers array on the host */
    void **allocs;               /* every cudaMalloc of weights, for freeing */
    int n_allocs, cap_allocs;
    int n_layers;
    float **k_cache, **v_cache;  /* [n_layers] device arrays */
    int kw, vw;                  /* floats per slot: KV heads x head sizes */
    int max_tokens, max_seqs, max_blocks;
    int32_t *d_ids, *d_pos, *d_seq, *d_tables, *h_tables;
    int64_t *d_slot;
    DevAttnBatch batch;
    __nv_bfloat16 *xb;           /* GEMM input in bf16 */
    int64_t xb_elems;
    float *moe_rows, *moe_gate, *moe_up, *moe_out, *moe_w, *h_router, *h_w;
    int32_t *moe_idx, *h_idx;
    float *router;
    int64_t moe_cap;
    Err err;                     /* first error inside a void op; reported by read() */
    bool failed;
} CudaBackend;

static CudaBackend *cb_of(Backend *be) { return (CudaBackend *)be->ctx; }

static void op_fail(CudaBackend *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess || cb->failed) return;
    cb->failed = true;
    err_set(&cb->err, "CUDA error '%s' in %s (device %d)", cudaGetErrorString(e), what, cb->device);
}

/* ---------- GEMM ---------- */

static int gemm_plan(CudaBackend *cb, int m, int n, int k, GemmPlan **out, Err *err) {
    for (int i = 0; i < cb->n_plans; i++)
        if (cb->plans[i].m == m && cb->plans[i].n == n && cb->plans[i].k == k) { *out = &cb->plans[i]; return 0; }
    GemmPlan *p = &cb->plans[cb->n_plans < GEMM_CACHE ? cb->n_plans++ : GEMM_CACHE - 1];
    if (cb->n_plans == GEMM_CACHE) { /* reuse the last slot */
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->a); cublasLtMatrixLayoutDestroy(p->b); cublasLtMatrixLayoutDestroy(p->c);
    }
    p->m = m; p->n = n; p->k = k;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_OK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), err);
    CUBLAS_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), err);
    CUBLAS_OK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), err);
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, m, k), err); /* W: [m][k] row-major */
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, n, k), err); /* x: [n][k] row-major */
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, m), err);  /* y: [n][m] row-major */
    cublasLtMatmulPreference_t pref;
    CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref), err);
    CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &cb->workspace_bytes, sizeof cb->workspace_bytes), err);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cb->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        cb->n_plans--;
        return err_set(err, "cuBLASLt: no algorithm for a %d x %d x %d bf16 GEMM", m, n, k);
    }
    p->algo = h.algo;
    *out = p;
    return 0;
}

static void cuda_be_matmul(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias,
                           int T) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) return;
    int64_t in_elems = (int64_t)T * w->cols;
    if (in_elems > cb->xb_elems) { op_fail(cb, cudaErrorMemoryAllocation, "matmul input exceeds the step size"); return; }
    cuda_to_bf16(cb->xb, (const float *)x, in_elems, cb->stream);
    GemmPlan *p = NULL;
    if (gemm_plan(cb, (int)w->rows, T, (int)w->cols, &p, &cb->err)) { cb->failed = true; return; }
    const __nv_bfloat16 *W = (const __nv_bfloat16 *)w->data + (int64_t)mat * w->rows * w->cols;
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasLtMatmul(cb->lt, p->desc, &alpha, W, p->a, cb->xb, p->b, &beta, y, p->c, y, p->c,
                                       &p->algo, cb->workspace, cb->workspace_bytes, cb->stream);
    if (st != CUBLAS_STATUS_SUCCESS && !cb->failed) {
        cb->failed = true;
        err_set(&cb->err, "cuBLASLt matmul failed (%d) for %lld x %d x %lld", (int)st, (long long)w->rows, T,
                (long long)w->cols);
    }
    if (bias && bias->data)
        cuda_add_bias((float *)y, (const float *)bias->data + (int64_t)mat * bias->cols, T, (int)bias->cols, cb->stream);
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
    size_t used;
    uint64_t bytes;      /* uploaded */
} Staging;

/* Converts a host WeightRef (any dtype) to bf16 (matrices) or fp32 (vectors)
 * on the device, staging through pinned memory. */
static int upload_weight(CudaBackend *cb, Staging *stg, const WeightRef *hw, WeightRef *dw, Err *err) {
    *dw = *hw;
    if (!hw->data) return 0;
    bool vec = hw->rows == 1;
    size_t elem = vec ? sizeof(float) : sizeof(__nv_bfloat16);
    int64_t rows = hw->rows * hw->n_mats;
    size_t row_out = (size_t)hw->cols * elem, total = row_out * rows;
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, total), err);
    if (cb_track(cb, dev, err)) return -1;
    float *tmp = (float *)malloc(hw->cols * sizeof(float));
    if (!tmp) return err_set(err, "out of memory");
    size_t rows_per_chunk = STAGING_BYTES / row_out;
    if (rows_per_chunk == 0) { free(tmp); return err_set(err, "tensor '%s' row too large to stage", hw->name); }
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
        int64_t nr = rows - r0 < (int64_t)rows_per_chunk ? rows - r0 : (int64_t)rows_per_chunk;
        int b = stg->cur;
        CUDA_CHECK(cudaEventSynchronize(stg->done[b]), err); /* the buffer's previous copy finished */
        char *dst = (char *)stg->pinned[b];
        for (int64_t r = 0; r < nr; r++) {
            const void *src = (const char *)hw->data + (r0 + r) * hw->row_bytes;
            if (vec) {
                dequantize_row(hw->type, src, (float *)(dst + r * row_out), hw->cols);
            } else {
                dequantize_row(hw->type, src, tmp, hw->cols);
                uint16_t *o = (uint16_t *)(dst + r * row_out);
                for (int64_t c = 0; c < hw->cols; c++) o[c] = fp32_to_bf16(tmp[c]);
            }
        }
        CUDA_CHECK(cudaMemcpyAsync((char *)dev + r0 * row_out, dst, nr * row_out, cudaMemcpyHostToDevice, cb->stream), err);
        CUDA_CHECK(cudaEventRecord(stg->done[b], cb->stream), err);
        stg->cur ^= 1;
        stg->bytes += nr * row_out;
    }
    free(tmp);
    dw->data = dev;
    dw->type = vec ? DT_F32 : DT_BF16;
    dw->row_bytes = row_out;
    return 0;
}

static int upload_model(CudaBackend *cb, const ModelConfig *c, const ModelWeights *host, double *gbps, Err *err) {
    Staging stg = {};
    for (int b = 0; b < 2; b++) {
        CUDA_CHECK(cudaMallocHost(&stg.pinned[b], STAGING_BYTES), err);
        CUDA_CHECK(cudaEventCreate(&stg.done[b]), err);
        CUDA_CHECK(cudaEventRecord(stg.done[b], cb->stream), err);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = 0;
    cb->w.layers = (LayerWeights *)calloc(c->n_layers, sizeof *cb->w.layers);
    if (!cb->w.layers) rc = err_set(err, "out of memory");
    const WeightRef *g_src[] = {&host->tok_embd, &host->output_norm, &host->rope_freqs};
    WeightRef *g_dst[] = {&cb->w.tok_embd, &cb->w.output_norm, &cb->w.rope_freqs};
    for (int i = 0; rc == 0 && i < 3; i++) rc = upload_weight(cb, &stg, g_src[i], g_dst[i], err);
    if (rc == 0 && host->output.data == host->tok_embd.data) cb->w.output = cb->w.tok_embd;
    else if (rc == 0) rc = upload_weight(cb, &stg, &host->output, &cb->w.output, err);
    int n_refs = (int)(sizeof(LayerWeights) / sizeof(WeightRef));
    for (int l = 0; rc == 0 && l < c->n_layers; l++) {
        const WeightRef *src = (const WeightRef *)&host->layers[l];
        WeightRef *dst = (WeightRef *)&cb->w.layers[l];
        for (int i = 0; rc == 0 && i < n_refs; i++) rc = upload_weight(cb, &stg, &src[i], &dst[i], err);
    }
    /* rope_freqs is read on the host by forward_init: keep the host copy. */
    cb->w.rope_freqs = host->rope_freqs;
    cudaError_t e = cudaStreamSynchronize(cb->stream);
    if (rc == 0 && e != cudaSuccess) rc = err_set(err, "CUDA error '%s' uploading weights", cudaGetErrorString(e));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (gbps) *gbps = s > 0 ? stg.bytes / s / 1e9 : 0;
    for (int b = 0; b < 2; b++) {
        cudaFreeHost(stg.pinned[b]);
        cudaEventDestroy(stg.done[b]);
    }
    return rc;
}

/* ---------- ops ---------- */

static void *cuda_be_alloc(Backend *be, int64_t n) {
    void *p = NULL;
    return n > 0 && cudaMalloc(&p, n * sizeof(float)) == cudaSuccess ? p : NULL;
}

static void cuda_be_release(Backend *be, void *p) { cudaFree(p); }

static int cuda_be_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, Err *err) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) { *err = cb->err; return -1; }
    int T = b->n_tokens;
    if (T > cb->max_tokens || b->n_seqs > cb->max_seqs)
        return err_set(err, "cuda: step of %d tokens / %d sequences exceeds %d / %d", T, b->n_seqs, cb->max_tokens,
                       cb->max_seqs);
    /* Block tables: each sequence's blocks up to its furthest position. */
    int need[1024] = {0};
    for (int i = 0; i < T; i++) {
        int nb = b->pos[i] / b->block_size + 1;
        if (nb > need[b->seq[i]]) need[b->seq[i]] = nb;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        if (need[s] > cb->max_blocks) return err_set(err, "cuda: sequence %d needs %d blocks (> %d)", s, need[s], cb->max_blocks);
        memcpy(cb->h_tables + (int64_t)s * cb->max_blocks, b->block_tables[s], need[s] * sizeof(int32_t));
    }
    CUDA_CHECK(cudaMemcpyAsync(cb->d_ids, ids, T * sizeof *ids, cudaMemcpyHostToDevice, cb->stream), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_pos, b->pos, T * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_seq, b->seq, T * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_slot, b->slot, T * sizeof(int64_t), cudaMemcpyHostToDevice, cb->stream), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_tables, cb->h_tables, (size_t)b->n_seqs * cb->max_blocks * sizeof(int32_t),
                               cudaMemcpyHostToDevice, cb->stream), err);
    cb->batch = (DevAttnBatch){T, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_tables, cb->max_blocks, b->block_size};
    return 0;
}

static void cuda_be_embed(Backend *be, void *out, const WeightRef *table, const int32_t *ids, int T, float scale) {
    CudaBackend *cb = cb_of(be);
    cuda_embed((float *)out, (const __nv_bfloat16 *)table->data, cb->d_ids, T, (int)table->cols, scale, cb->stream);
}

static void cuda_be_rmsnorm(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                            float offset) {
    cuda_rmsnorm((float *)out, (const float *)x, (const float *)w->data, rows, C, eps, offset, cb_of(be)->stream);
}

static void cuda_be_add(Backend *be, void *x, const void *d, int64_t n) {
    cuda_add((float *)x, (const float *)d, n, cb_of(be)->stream);
}

/* The forward pass passes host inv_freq; they are copied per call into a
 * small device array (rope_dim/2 floats). */
static void cuda_be_rope(Backend *be, void *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim,
                         const float *inv_freq, float mscale, bool neox) {
    CudaBackend *cb = cb_of(be);
    float *d_freq = cb->router; /* scratch of at least max(rope_dim/2, T*E) floats */
    op_fail(cb, cudaMemcpyAsync(d_freq, inv_freq, rot_dim / 2 * sizeof(float), cudaMemcpyHostToDevice, cb->stream),
            "rope frequencies");
    cuda_rope((float *)x, cb->d_pos, T, n_heads, head_dim, rot_dim, d_freq, mscale, neox, cb->stream);
}

static void cuda_be_kv_write(Backend *be, int layer, const AttnBatch *b, const void *k, const void *v) {
    CudaBackend *cb = cb_of(be);
    cuda_kv_write(cb->k_cache[layer], cb->v_cache[layer], cb->d_slot, (const float *)k, (const float *)v, b->n_tokens,
                  cb->kw, cb->vw, cb->stream);
}

static void cuda_be_attention(Backend *be, void *out, const void *q, int layer, const AttnBatch *b, const AttnParams *p) {
    CudaBackend *cb = cb_of(be);
    const float *sinks = cb->w.layers[layer].sinks.data ? (const float *)cb->w.layers[layer].sinks.data : NULL;
    cuda_attention((float *)out, (const float *)q, cb->k_cache[layer], cb->v_cache[layer], &cb->batch, p, sinks,
                   cb->stream);
}

static void cuda_be_glu(Backend *be, void *out, const void *gate, const void *up, int64_t n, Activation act, float limit) {
    cuda_glu((float *)out, (const float *)gate, (const float *)up, n, act, limit, cb_of(be)->stream);
}

static void cuda_be_softcap(Backend *be, void *x, int64_t n, float cap) {
    cuda_softcap((float *)x, n, cap, cb_of(be)->stream);
}

static void cuda_be_gather_rows(Backend *be, void *dst, const void *src, const int32_t *rows, int n, int C) {
    CudaBackend *cb = cb_of(be);
    op_fail(cb, cudaMemcpyAsync(cb->moe_idx, rows, n * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream), "gather");
    cuda_gather_rows((float *)dst, (const float *)src, cb->moe_idx, n, C, cb->stream);
}

/* MoE: the router runs on the GPU, the top-k choice on the host (E is small),
 * then each expert's rows are gathered, run through its MLP, and added back
 * with their routing weight. */
static void cuda_be_moe(Backend *be, void *out, const void *x, const LayerWeights *lw, const ModelConfig *c, int T) {
    CudaBackend *cb = cb_of(be);
    int E = c->n_experts, K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    cuda_be_matmul(be, cb->router, x, &lw->router, 0, &lw->router_bias, T);
    op_fail(cb, cudaMemcpyAsync(cb->h_router, cb->router, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost, cb->stream), "router");
    op_fail(cb, cudaStreamSynchronize(cb->stream), "router");
    op_fail(cb, cudaMemsetAsync(out, 0, (size_t)T * C * sizeof(float), cb->stream), "moe");
    int *sel = (int *)malloc((size_t)T * K * sizeof(int));
    float *wts = (float *)malloc((size_t)T * K * sizeof(float));
    if (!sel || !wts) { free(sel); free(wts); op_fail(cb, cudaErrorMemoryAllocation, "moe routing"); return; }
    for (int t = 0; t < T; t++) {
        const float *lg = cb->h_router + (int64_t)t * E;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= sel[t * K + i] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            sel[t * K + j] = best;
        }
        float m = lg[sel[t * K]], sum = 0;
        for (int j = 0; j < K; j++) sum += wts[t * K + j] = expf(lg[sel[t * K + j]] - m);
        for (int j = 0; j < K; j++) wts[t * K + j] /= sum;
    }
    for (int e = 0; e < E && !cb->failed; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) { cb->h_idx[n] = t; cb->h_w[n] = wts[t * K + j]; n++; }
        if (n == 0) continue;
        op_fail(cb, cudaMemcpyAsync(cb->moe_idx, cb->h_idx, n * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream), "moe");
        op_fail(cb, cudaMemcpyAsync(cb->moe_w, cb->h_w, n * sizeof(float), cudaMemcpyHostToDevice, cb->stream), "moe");
        cuda_gather_rows(cb->moe_rows, (const float *)x, cb->moe_idx, n, C, cb->stream);
        cuda_be_matmul(be, cb->moe_gate, cb->moe_rows, &lw->w_gate, e, &lw->b_gate, n);
        cuda_be_matmul(be, cb->moe_up, cb->moe_rows, &lw->w_up, e, &lw->b_up, n);
        cuda_glu(cb->moe_gate, cb->moe_gate, cb->moe_up, (int64_t)n * F,
                 c->act == ACT_KIND_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU, c->act_limit, cb->stream);
        cuda_be_matmul(be, cb->moe_out, cb->moe_gate, &lw->w_down, e, &lw->b_down, n);
        cuda_scatter_add((float *)out, cb->moe_out, cb->moe_idx, cb->moe_w, n, C, cb->stream);
        op_fail(cb, cudaStreamSynchronize(cb->stream), "moe expert"); /* h_idx/h_w are reused */
    }
    free(sel);
    free(wts);
}

static int cuda_be_read(Backend *be, float *host, const void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_of(be);
    op_fail(cb, cudaGetLastError(), "kernel launch");
    if (!cb->failed) op_fail(cb, cudaMemcpyAsync(host, buf, n * sizeof(float), cudaMemcpyDeviceToHost, cb->stream), "read");
    if (!cb->failed) op_fail(cb, cudaStreamSynchronize(cb->stream), "step");
    if (cb->failed) { *err = cb->err; return -1; }
    return 0;
}

static void cuda_destroy(Backend *be) {
    CudaBackend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    cudaStreamSynchronize(cb->stream);
    for (int i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
    for (int l = 0; cb->k_cache && l < cb->n_layers; l++) { cudaFree(cb->k_cache[l]); cudaFree(cb->v_cache[l]); }
    void *dev[] = {cb->d_ids, cb->d_pos, cb->d_seq, cb->d_tables, cb->d_slot, cb->xb, cb->moe_rows, cb->moe_gate,
                   cb->moe_up, cb->moe_out, cb->moe_w, cb->moe_idx, cb->router, cb->workspace};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    void *pinned[] = {cb->h_tables, cb->h_router, cb->h_w, cb->h_idx};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) cudaFreeHost(pinned[i]);
    for (int i = 0; i < cb->n_plans; i++) {
        cublasLtMatmulDescDestroy(cb->plans[i].desc);
        cublasLtMatrixLayoutDestroy(cb->plans[i].a);
        cublasLtMatrixLayoutDestroy(cb->plans[i].b);
        cublasLtMatrixLayoutDestroy(cb->plans[i].c);
    }
    if (cb->lt) cublasLtDestroy(cb->lt);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb->k_cache);
    free(cb->v_cache);
    free(cb->allocs);
    free(cb->w.layers);
    free(cb);
    free(be);
}

/* Step buffers sized for max_tokens rows. */
static int cuda_alloc_step(CudaBackend *cb, const ModelConfig *c, int n_blocks, int block_size, Err *err) {
    int T = cb->max_tokens;
    cb->max_seqs = T < 1024 ? T : 1024;
    cb->max_blocks = n_blocks;
    int64_t widest = c->dim;
    int64_t cols[] = {c->ffn_dim, (int64_t)c->n_heads * c->head_dim_v};
    for (int i = 0; i < 2; i++) if (cols[i] > widest) widest = cols[i];
    cb->xb_elems = (int64_t)T * widest;
    int64_t E = c->n_experts > 0 ? c->n_experts : 1, half = c->rope_dim / 2 + 1;
    int64_t router = (int64_t)T * E > half ? (int64_t)T * E : half;
    CUDA_CHECK(cudaMalloc(&cb->d_ids, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_pos, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_seq, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_slot, T * sizeof(int64_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_tables, (size_t)cb->max_seqs * n_blocks * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_tables, (size_t)cb->max_seqs * n_blocks * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->xb, cb->xb_elems * sizeof(__nv_bfloat16)), err);
    CUDA_CHECK(cudaMalloc(&cb->router, router * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_router, router * sizeof(float)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_idx, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_idx, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_w, T * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_w, T * sizeof(float)), err);
    if (c->n_experts > 0) {
        CUDA_CHECK(cudaMalloc(&cb->moe_rows, (size_t)T * c->dim * sizeof(float)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_out, (size_t)T * c->dim * sizeof(float)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_gate, (size_t)T * c->ffn_dim * sizeof(float)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_up, (size_t)T * c->ffn_dim * sizeof(float)), err);
    }
    cb->kw = c->n_kv_heads * c->head_dim_k;
    cb->vw = c->n_kv_heads * c->head_dim_v;
    cb->n_layers = c->n_layers;
    cb->k_cache = (float **)calloc(c->n_layers, sizeof(float *));
    cb->v_cache = (float **)calloc(c->n_layers, sizeof(float *));
    if (!cb->k_cache || !cb->v_cache) return err_set(err, "out of memory");
    size_t slots = (size_t)n_blocks * block_size;
    for (int l = 0; l < c->n_layers; l++) {
        CUDA_CHECK(cudaMalloc(&cb->k_cache[l], slots * cb->kw * sizeof(float)), err);
        CUDA_CHECK(cudaMalloc(&cb->v_cache[l], slots * cb->vw * sizeof(float)), err);
    }
    return 0;
}

extern "C" Backend *backend_cuda_create(const ModelConfig *c, const ModelWeights *host, int device, int block_size,
                                        int n_blocks, int max_tokens, double *load_gbps, Err *err) {
    Backend *be = (Backend *)calloc(1, sizeof *be);
    CudaBackend *cb = (CudaBackend *)calloc(1, sizeof *cb);
    if (!be || !cb) { free(be); free(cb); err_set(err, "out of memory"); return NULL; }
    *be = (Backend){};
    be->ctx = cb;
    be->destroy = cuda_destroy;
    cb->device = device;
    cb->max_tokens = max_tokens;
    cb->workspace_bytes = (size_t)32 << 20;
    int rc = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) rc = err_set(err, "cuda: cannot use device %d: %s", device, cudaGetErrorString(e));
    if (rc == 0 && (e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = err_set(err, "cuda: stream: %s", cudaGetErrorString(e));
    if (rc == 0 && cublasLtCreate(&cb->lt) != CUBLAS_STATUS_SUCCESS) rc = err_set(err, "cuBLASLt: cannot initialize");
    if (rc == 0 && (e = cudaMalloc(&cb->workspace, cb->workspace_bytes)) != cudaSuccess)
        rc = err_set(err, "cuda: workspace: %s", cudaGetErrorString(e));
    if (rc == 0) rc = upload_model(cb, c, host, load_gbps, err);
    if (rc == 0) rc = cuda_alloc_step(cb, c, n_blocks, block_size, err);
    if (rc) { cuda_destroy(be); return NULL; }
    static char name[32];
    snprintf(name, sizeof name, "cuda:%d", device);
    be->name = name;
    be->weights = &cb->w;
    be->kv_block_size = block_size;
    be->kv_n_blocks = n_blocks;
    be->alloc = cuda_be_alloc;
    be->release = cuda_be_release;
    be->begin_step = cuda_be_begin_step;
    be->embed = cuda_be_embed;
    be->matmul = cuda_be_matmul;
    be->rmsnorm = cuda_be_rmsnorm;
    be->add = cuda_be_add;
    be->rope = cuda_be_rope;
    be->kv_write = cuda_be_kv_write;
    be->attention = cuda_be_attention;
    be->glu = cuda_be_glu;
    be->moe = cuda_be_moe;
    be->softcap = cuda_be_softcap;
    be->gather_rows = cuda_be_gather_rows;
    be->read = cuda_be_read;
    return be;
}
