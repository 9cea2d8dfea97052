/* backend_cuda_matmul.cu — every matrix product of the CUDA backend goes
 * through one route table, matmul_route(weight, rows): by the weight's type
 * (bf16, or which quantized blocks), the step's rows and the mode
 * (default or batch-invariant), it names the kernel; wgemm runs it.
 *
 *   bf16 weights      rows <= BF16_GEMV_MAX_T   MM_GEMV        (gemv.cuh)
 *                     more                      MM_CUBLASLT    (the algorithm chosen once per shape)
 *   quantized         rows <= qgemv_rows        MM_QGEMV_X8 / _MMA / _SCALAR (quant.cuh, by type and shape)
 *                     up to QGEMM_FUSED_MAX_T   MM_QGEMM       (where it takes the type: quant_gemm_supported)
 *                     more, or not taken        MM_DEQUANT_CUBLASLT (bf16 scratch, made one matrix ahead)
 *   FP8 (e4m3)        rows <= FP8_GEMV_MAX_T    MM_FP8_GEMV    (fp8.cuh; where it takes W: T x cols fits a block)
 *                     more, FP8 tensor cores    MM_FP8_GEMM    (x quantized per token, cuBLASLt FP8)
 *                     more, sm_80 / sm_86       MM_DEQUANT_CUBLASLT
 *   batch-invariant   every rows                MM_GEMM_BI, or MM_DEQUANT_GEMM_BI for quantized and FP8 weights
 *
 * The batch-invariant mode takes one GEMM with one sum order at every T
 * (gemm_bi.cuh): a quantized GEMV's fp32 sums of dequantized values could
 * not match a tensor-core GEMM's. Every route is graph-capturable: no host
 * sync, no allocation. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemv.cuh"

/* ---------- cuBLASLt (loaded at run time: cuda_libs.h) ---------- */

static int gemm_plan(CudaBackend *cb, int m, int n, int k, int ldc, bool out_f32, GemmPlan **out, Err *err) {
    const CublasLt *L = cublaslt_lib(err);
    if (!L) return -1;
    for (int i = 0; i < cb->n_plans; i++) {
        GemmPlan *p = &cb->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ldc == ldc && p->out_f32 == out_f32) { *out = p; return 0; }
    }
    if (cb->n_plans == GEMM_CACHE) { /* full: recycle the last slot */
        GemmPlan *p = &cb->plans[--cb->n_plans];
        L->MatmulDescDestroy(p->desc);
        L->MatrixLayoutDestroy(p->a); L->MatrixLayoutDestroy(p->b); L->MatrixLayoutDestroy(p->c);
    }
    GemmPlan *p = &cb->plans[cb->n_plans];
    memset(p, 0, sizeof *p);
    p->m = m; p->n = n; p->k = k; p->ldc = ldc; p->out_f32 = out_f32;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ct = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    bool ok = L->MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
              L->MatrixLayoutCreate(&p->a, CUDA_R_16BF, k, m, k) == CUBLAS_STATUS_SUCCESS && /* W: [m][k] row-major */
              L->MatrixLayoutCreate(&p->b, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS && /* x: [n][k] row-major */
              L->MatrixLayoutCreate(&p->c, ct, m, n, ldc) == CUBLAS_STATUS_SUCCESS &&        /* y: [n][ldc] row-major */
              L->MatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cb->workspace_bytes,
                                              sizeof cb->workspace_bytes) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulAlgoGetHeuristic(cb->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &h, &found) ==
                  CUBLAS_STATUS_SUCCESS && found > 0;
    if (pref) L->MatmulPreferenceDestroy(pref);
    if (!ok) {
        if (p->desc) L->MatmulDescDestroy(p->desc);
        if (p->a) L->MatrixLayoutDestroy(p->a);
        if (p->b) L->MatrixLayoutDestroy(p->b);
        if (p->c) L->MatrixLayoutDestroy(p->c);
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
    const CublasLt *L = cublaslt_lib(NULL); /* gemm_plan loaded it */
    cublasStatus_t st = L->Matmul(cb->lt, p->desc, &alpha, W, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                  cb->workspace, cb->workspace_bytes, cb->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cb->failed = true;
        err_set(&cb->err, "cuBLASLt matmul failed (%d) for %d x %d x %d", (int)st, M, T, K);
    }
}

void gemm_plans_free(CudaBackend *cb) {
    const CublasLt *L = cb->n_plans ? cublaslt_lib(NULL) : NULL; /* a plan was made: it is loaded */
    for (int i = 0; i < cb->n_plans; i++) {
        L->MatmulDescDestroy(cb->plans[i].desc);
        L->MatrixLayoutDestroy(cb->plans[i].a);
        L->MatrixLayoutDestroy(cb->plans[i].b);
        L->MatrixLayoutDestroy(cb->plans[i].c);
    }
    cb->n_plans = 0;
}

/* The batch-invariant GEMM (gemm_bi.cuh): one sum order for every T. */
static void gemm_bi(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, const float *bias, int M,
                    int T, int K, int ldc) {
    Err e = {};
    if (cb->failed || cuda_gemm_bi(y, y_f32, ldc, W, x, bias, M, T, K, cb->stream, &e) == 0) return;
    cb->failed = true;
    cb->err = e;
}

/* ---------- the route table ---------- */

/* Whether the fused quantized GEMM takes W in this backend. */
static bool qgemm_takes(const CudaBackend *cb, const QuantMatrix *W) {
    return cb->tune.quant_gemm && quant_gemm_supported(W->type, W->rows, W->cols);
}

/* The rows up to which W goes through a quantized GEMV: QUANT_GEMV_MAX_T, but 1 for Q5_K and 2 for
 * Q6_K where the fused GEMM takes W (their GEMV above that is the scalar one, slower than the fused
 * GEMM from there). */
static int qgemv_rows(const CudaBackend *cb, const QuantMatrix *W) {
    if ((W->type == DT_Q5_K || W->type == DT_Q6_K) && qgemm_takes(cb, W)) return W->type == DT_Q5_K ? 1 : 2;
    return QUANT_GEMV_MAX_T;
}

/* The quantized GEMV for W at T rows: dp4a at one row (Q8_0 on tall matrices only: on 4096-row ones
 * the mma kernel is faster), the mma kernel where it takes W (Q8_0 at one row only on big matrices),
 * else the scalar one. */
static MatmulRoute qgemv_route(const QuantMatrix *W, int T) {
    bool big = W->rows >= 16384 || W->cols >= 8192;
    if (T == 1 && quant_gemv_takes(QGEMV_X8, W, T, false) && (W->type != DT_Q8_0 || W->rows >= 16384))
        return MM_QGEMV_X8;
    if (quant_gemv_takes(QGEMV_MMA, W, T, false) && (W->type == DT_Q4_K || T >= 2 || big)) return MM_QGEMV_MMA;
    return MM_QGEMV_SCALAR;
}

/* FP8 weights: the GEMV multiplies the same e4m3 codes of x as the GEMM (fp8.cuh), so where both run the
 * route changes only the order of fp32 sums; without FP8 tensor cores (sm_80/86) the GEMM dequantizes W to
 * bf16 and multiplies the bf16 x (not x's codes). */
static MatmulRoute fp8_route(const CudaBackend *cb, const QuantMatrix *W, int T) {
    if (T <= FP8_GEMV_MAX_T && fp8_gemv_takes(W, T)) return MM_FP8_GEMV;
    return cb->tune.fp8_gemm && cb->fp8.xq && fp8_gemm_takes(W) ? MM_FP8_GEMM : MM_DEQUANT_CUBLASLT;
}

MatmulRoute matmul_route(const CudaBackend *cb, const WeightRef *w, int T) {
    if (!is_quant(w)) return cb->bi ? MM_GEMM_BI : T <= BF16_GEMV_MAX_T ? MM_GEMV : MM_CUBLASLT;
    const QuantMatrix *W = qm_of(w);
    if (cb->bi) return MM_DEQUANT_GEMM_BI;
    if (W->type == DT_F8_E4M3) return fp8_route(cb, W, T);
    if (T <= qgemv_rows(cb, W)) return qgemv_route(W, T);
    int fused_max = W->type == DT_Q5_K || W->type == DT_Q6_K ? QGEMM_FUSED_MAX_T_K56 : QGEMM_FUSED_MAX_T;
    if (T <= fused_max && qgemm_takes(cb, W)) return MM_QGEMM;
    return MM_DEQUANT_CUBLASLT;
}

bool route_is_qgemv(MatmulRoute r) {
    return r == MM_QGEMV_X8 || r == MM_QGEMV_MMA || r == MM_QGEMV_SCALAR || r == MM_FP8_GEMV;
}

/* ---------- the routes ---------- */

void gemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, const float *bias, int M, int T,
          int K) {
    if (cb->failed || T <= 0) return;
    if (cb->bi) { gemm_bi(cb, y, y_f32, x, W, bias, M, T, K, M); return; }
    if (T <= BF16_GEMV_MAX_T) { cuda_gemv(y, y_f32, W, x, bias, M, K, T, cb->stream); return; }
    gemm_lt(cb, y, y_f32, x, W, M, T, K, M);
    if (bias && !cb->failed) cuda_add_bias(y, y_f32, bias, T, M, cb->stream);
}

void qgemv(CudaBackend *cb, MatmulRoute r, const bf16 *x, const QuantMatrix *W, const GemvOut *out, int T) {
    if (r == MM_FP8_GEMV) {
        Err e = {};
        if (fp8_gemv(W, x, NULL, out, T, cb->stream, &e)) cb_fail(cb, &e);
        return;
    }
    QuantGemvKernel k = r == MM_QGEMV_X8 ? QGEMV_X8 : r == MM_QGEMV_MMA ? QGEMV_MMA : QGEMV_SCALAR;
    Err e = {};
    if (quant_gemv(W, x, false, out, T, k, cb->stream, &e)) cb_fail(cb, &e);
}

/* The quantized matrix a step multiplies after W (order_quant), or NULL. */
static const QuantMatrix *qnext_of(const CudaBackend *cb, const QuantMatrix *W) {
    size_t slot = (size_t)(W - cb->qm), n_slots = (size_t)cb->shape->n_layers * LAYER_REFS + 1;
    return W && slot < n_slots ? cb->qnext[slot] : NULL;
}

/* The next matrix after W that a step of T rows dequantizes (the ones it runs fused, or FP8 ones it
 * multiplies as codes, are passed over, a layer's worth at most), or NULL. */
static const QuantMatrix *qnext_dequantized(const CudaBackend *cb, const QuantMatrix *W, int T) {
    for (int hop = 0; hop < LAYER_REFS; hop++) {
        if (!(W = qnext_of(cb, W))) return NULL;
        WeightRef w = {W, W->type, W->rows, W->cols, 1, 0, NULL, NULL, 0.0f, 0};
        MatmulRoute r = matmul_route(cb, &w, T);
        if (r == MM_DEQUANT_CUBLASLT || r == MM_DEQUANT_GEMM_BI) return W;
    }
    return NULL;
}

/* W dequantized to the bf16 scratch in chunks of rows, each chunk's columns of y by cuBLASLt (or, in
 * the batch-invariant mode, the batch-invariant GEMM, which adds the bias itself); the next matrices
 * the step dequantizes are made ahead on the side stream. */
static void dequant_gemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const QuantMatrix *W,
                         const float *bias, int T) {
    Err e = {};
    int64_t chunk = cb->deq.elems / W->cols;
    if (chunk > W->rows) chunk = W->rows;
    if (chunk < 1) {
        err_set(&e, "cuda: no dequantization scratch for a %lld-wide matrix", (long long)W->cols);
        cb_fail(cb, &e);
        return;
    }
    size_t ysz = y_f32 ? sizeof(float) : sizeof(bf16);
    const QuantMatrix *next[DEQ_AHEAD_MAX - 1] = {NULL};
    for (int k = 0; k < DEQ_AHEAD_MAX - 1; k++) next[k] = qnext_dequantized(cb, k ? next[k - 1] : W, T);
    for (int64_t r0 = 0; r0 < W->rows && !cb->failed; r0 += chunk) {
        int64_t nr = W->rows - r0 < chunk ? W->rows - r0 : chunk;
        const bf16 *Wd = (const bf16 *)deq_ahead_get(&cb->deq, W, r0, nr, cb->stream, &e);
        if (!Wd) { cb_fail(cb, &e); return; }
        const float *b = bias && cb->bi ? bias + r0 : NULL;
        if (cb->bi) gemm_bi(cb, (char *)y + r0 * ysz, y_f32, x, Wd, b, (int)nr, T, (int)W->cols, (int)W->rows);
        else gemm_lt(cb, (char *)y + r0 * ysz, y_f32, x, Wd, (int)nr, T, (int)W->cols, (int)W->rows);
        int n_next = r0 + nr == W->rows && T >= DEQ_AHEAD_MIN_T ? DEQ_AHEAD_MAX - 1 : 0;
        if (deq_ahead_after_gemm(&cb->deq, Wd, next, n_next, cb->stream, &e)) { cb_fail(cb, &e); return; }
    }
    if (bias && !cb->failed && !cb->bi) cuda_add_bias(y, y_f32, bias, T, (int)W->rows, cb->stream);
}

void wgemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const WeightRef *w, int mat, const float *bias,
           int T) {
    if (cb->failed || T <= 0) return;
    MatmulRoute r = matmul_route(cb, w, T);
    if (!is_quant(w)) {
        gemm(cb, y, y_f32, x, mat_of(w, mat), bias, (int)w->rows, T, (int)w->cols);
        return;
    }
    const QuantMatrix *W = qm_of(w); /* quantized matrices are single ones: mat 0 */
    Err e = {};
    if (route_is_qgemv(r)) {
        GemvOut out = gemv_out_one(y, y_f32, bias, W->rows);
        qgemv(cb, r, x, W, &out, T);
    } else if (r == MM_FP8_GEMM) {
        if (fp8_gemm(&cb->fp8, W, x, T, y, y_f32, bias, cb->stream, &e)) cb_fail(cb, &e);
    } else if (r == MM_QGEMM) {
        if (quant_gemm(W, x, T, y, y_f32, 0, 0, &cb->qwork, cb->stream, &e)) cb_fail(cb, &e);
        else if (bias) cuda_add_bias(y, y_f32, bias, T, (int)W->rows, cb->stream);
    } else {
        dequant_gemm(cb, y, y_f32, x, W, bias, T);
    }
}

bool qgemm_epi(CudaBackend *cb, const bf16 *x, const QuantMatrix *W, const QuantGemmEpi *e, int T) {
    WeightRef w = {W, W->type, W->rows, W->cols, 1, 0, NULL, NULL, 0.0f, 0};
    if (cb->failed || matmul_route(cb, &w, T) != MM_QGEMM || !quant_gemm_epi_takes(W, e)) return false;
    Err err = {};
    if (quant_gemm_epi(W, x, T, e, 0, 0, &cb->qwork, cb->stream, &err)) cb_fail(cb, &err);
    return true;
}
