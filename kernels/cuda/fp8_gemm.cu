/* fp8_gemm.cu — FP8 weight GEMMs of prefill and large batches (fp8.cuh's
 * fp8_gemm), the per-token quantization of x they read, and the bf16
 * dequantization of FP8 matrices (the batch-invariant mode's route, and
 * GPUs without FP8 tensor cores).
 *
 * The product is cuBLASLt's FP8 GEMM on the codes: A = W [m][k] e4m3
 * (transposed, the "TN" layout Hopper's FP8 kernels require), B = x codes
 * [n][k], fp32 accumulation. The scales, scale[m] for W's rows and
 * a_scale[t] for x's rows, are outer vectors of the product, which cuBLASLt
 * applies itself where it can (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
 * on A and B, CUDA 12.9+; D bf16, or fp32 for logits). Whether it can is
 * the heuristic's answer, asked per shape: where it has no algorithm the
 * GEMM runs with unit scales into an fp32 buffer (steps chunked to fit it)
 * and a small kernel applies the scales and the bias and rounds
 * (FP8_MODE_RESCALE). Both give a_scale x scale x (the fp32 sum of exact
 * code products), differing only in the order of the sums and of the two
 * scale multiplies. Plans (descriptor, layouts, algorithm) are made once
 * per shape, as for bf16 (backend_cuda_matmul.cu). */
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/fp8.cuh"

#define FQ_THREADS 256                     /* a row of x a block */
#define FP8_ACC_BYTES ((size_t)64 << 20)   /* the fallback's fp32 product: tokens chunked to fit */

/* ---------- x: per-token quantization ---------- */

__global__ void __launch_bounds__(FQ_THREADS)
kernel_fp8_quantize_rows(const __nv_bfloat16 *x, int K, float input_scale, uint8_t *codes, float *a_scale) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const uint4 *xr = (const uint4 *)(x + row * K);
    const int n8 = K / 8;
    float sc = input_scale;
    if (!(input_scale > 0.0f)) {
        float m = 0.0f;
        for (int c = threadIdx.x; c < n8; c += FQ_THREADS) m = bf16x8_amax(__ldg(xr + c), m);
        m = block_max(m, red); /* >= 0: a nan never wins fmaxf */
        sc = __fdiv_rn(m, 448.0f);
    }
    uint2 *out = (uint2 *)(codes + row * K);
    for (int c = threadIdx.x; c < n8; c += FQ_THREADS) out[c] = fp8_encode8(__ldg(xr + c), sc);
    if (threadIdx.x == 0) a_scale[row] = sc;
}

extern "C" int fp8_quantize_rows(const void *x, int T, int K, float input_scale, uint8_t *codes, float *a_scale,
                                 cudaStream_t s, Err *err) {
    if (T <= 0) return T == 0 ? 0 : err_set(err, "fp8_quantize_rows: T = %d", T);
    if (K <= 0 || K % 8 || (uintptr_t)x % 16 || (uintptr_t)codes % 16)
        return err_set(err, "fp8_quantize_rows: %d columns (a multiple of 8), x and codes 16-byte aligned", K);
    kernel_fp8_quantize_rows<<<(unsigned)T, FQ_THREADS, 0, s>>>((const __nv_bfloat16 *)x, K, input_scale, codes,
                                                                a_scale);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* ---------- W to bf16 ---------- */

/* 16 codes a thread: bf16(e4m3 code x row scale), the product rounded to
 * fp32 (as the host's e4m3_to_fp32(code) * scale), then to bf16 (RNE). */
__global__ void kernel_fp8_dequant_bf16(__nv_bfloat16 *dst, const uint8_t *qs, const float *sc, int64_t row0,
                                        int64_t n_rows, int K) {
    const int n16 = K / 16;
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n_rows * n16) return;
    const int64_t r = i / n16;
    const int c = (int)(i % n16);
    const uint4 w = __ldg((const uint4 *)(qs + (row0 + r) * K) + c);
    const float s = __ldg(sc + row0 + r);
    const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float f[4];
        fp8x4_to_f32(ww[j], f);
        __nv_bfloat162 a = __floats2bfloat162_rn(__fmul_rn(f[0], s), __fmul_rn(f[1], s));
        __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f[2], s), __fmul_rn(f[3], s));
        o[2 * j] = *(uint32_t *)&a;
        o[2 * j + 1] = *(uint32_t *)&b;
    }
    uint4 *d = (uint4 *)(dst + r * K) + 2 * c;
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

extern "C" int fp8_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s,
                                Err *err) {
    if (W->type != DT_F8_E4M3 || W->cols % 16) return err_set(err, "fp8_dequant_bf16: not an F8_E4M3 matrix");
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > W->rows || (uintptr_t)dst % 16)
        return err_set(err, "fp8_dequant_bf16: rows [%lld, %lld) of %lld, or dst not 16-byte aligned",
                       (long long)row0, (long long)(row0 + n_rows), (long long)W->rows);
    const int64_t n = n_rows * (W->cols / 16);
    if (n == 0) return 0;
    kernel_fp8_dequant_bf16<<<(unsigned)((n + 255) / 256), 256, 0, s>>>((__nv_bfloat16 *)dst, (const uint8_t *)W->qs,
                                                                      (const float *)W->sc, row0, n_rows,
                                                                      (int)W->cols);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* ---------- the fallback's epilogue ---------- */

/* y[t][m] = a_scale[t] x scale[m] x acc[t][m] (+ bias[m]), bf16 or fp32;
 * the same multiply order as the GEMV's store. */
__global__ void kernel_fp8_rescale(void *y, bool y_f32, const float *acc, int ld_acc, const float *a_scale,
                                   const float *wscale, const float *bias, int T, int M) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * M) return;
    const int t = (int)(i / M), m = (int)(i % M);
    float v = a_scale[t] * wscale[m] * acc[(int64_t)t * ld_acc + m];
    if (bias) v += bias[m];
    if (y_f32) ((float *)y)[i] = v;
    else ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(v);
}

/* ---------- cuBLASLt plans ---------- */

const char *fp8_gemm_mode_name(Fp8GemmMode m) {
    return m == FP8_MODE_OUTER_VEC ? "outer-vector scales" : m == FP8_MODE_RESCALE ? "unit scales + rescale"
                                                                                    : "undecided";
}

static void plan_destroy(const CublasLt *L, Fp8Plan *p) {
    if (p->desc) L->MatmulDescDestroy(p->desc);
    if (p->a) L->MatrixLayoutDestroy(p->a);
    if (p->b) L->MatrixLayoutDestroy(p->b);
    if (p->d) L->MatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

/* A plan of mode `mode` for D [n][m] = B [n][k] x A [m][k]^T; false when
 * cuBLASLt refuses it (no algorithm, or an attribute it does not know).
 * wscale: a valid A scale vector for the heuristic (OUTER_VEC). */
static bool plan_try(Fp8Gemm *g, const CublasLt *L, Fp8Plan *p, Fp8GemmMode mode, int m, int n, int k, bool out_f32,
                     const float *wscale) {
    memset(p, 0, sizeof *p);
    p->m = m; p->n = n; p->k = k; p->out_f32 = out_f32; p->mode = mode;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t dt = mode == FP8_MODE_OUTER_VEC && !out_f32 ? CUDA_R_16BF : CUDA_R_32F;
    /* OUTER_VEC writes y [n][m] itself; RESCALE writes acc, its rows padded to 64 bytes, since cuBLASLt's
     * FP8 kernels want 16-byte multiples of leading dimensions, which y's rows of an odd m are not */
    p->ldd = mode == FP8_MODE_OUTER_VEC ? m : (m + 15) / 16 * 16;
    int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const void *as = wscale, *bs = g->xs;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    bool ok = L->MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
              L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS;
    if (ok && mode == FP8_MODE_OUTER_VEC)
        ok = L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec) ==
                 CUBLAS_STATUS_SUCCESS &&
             L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec) ==
                 CUBLAS_STATUS_SUCCESS &&
             L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as) ==
                 CUBLAS_STATUS_SUCCESS &&
             L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs) ==
                 CUBLAS_STATUS_SUCCESS;
    ok = ok && L->MatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k, m, k) == CUBLAS_STATUS_SUCCESS && /* W: [m][k] row-major */
         L->MatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k, n, k) == CUBLAS_STATUS_SUCCESS &&       /* x codes: [n][k] */
         L->MatrixLayoutCreate(&p->d, dt, m, n, p->ldd) == CUBLAS_STATUS_SUCCESS &&              /* y: [n][ldd] */
         L->MatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
         L->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->workspace_bytes,
                                         sizeof g->workspace_bytes) == CUBLAS_STATUS_SUCCESS &&
         L->MatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &h, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (pref) L->MatmulPreferenceDestroy(pref);
    if (!ok) { plan_destroy(L, p); return false; }
    p->algo = h.algo;
    return true;
}

/* The plan for (m, n, k, out_f32): cached, else made: OUTER_VEC where the
 * heuristic has an algorithm for it (unless rescale_only, or the fallback is
 * forced), else RESCALE. The first plan made sets g->mode (what the
 * benchmark and the tests report). */
static int fp8_plan(Fp8Gemm *g, int m, int n, int k, bool out_f32, bool rescale_only, const float *wscale,
                    Fp8Plan **out, Err *err) {
    const CublasLt *L = cublaslt_lib(err);
    if (!L) return -1;
    for (int i = 0; i < g->n_plans; i++) {
        Fp8Plan *p = &g->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->out_f32 == out_f32 && p->rescale_only == rescale_only) {
            *out = p;
            return 0;
        }
    }
    if (g->n_plans == FP8_PLANS) plan_destroy(L, &g->plans[--g->n_plans]); /* full: recycle the last slot */
    Fp8Plan *p = &g->plans[g->n_plans];
    bool ok = !rescale_only && !g->force_rescale && plan_try(g, L, p, FP8_MODE_OUTER_VEC, m, n, k, out_f32, wscale);
    if (!ok) ok = plan_try(g, L, p, FP8_MODE_RESCALE, m, n, k, out_f32, wscale);
    if (!ok) return err_set(err, "cuBLASLt: no FP8 (e4m3) algorithm for a %d x %d x %d GEMM", m, n, k);
    p->rescale_only = rescale_only;
    if (g->mode == FP8_MODE_UNKNOWN) g->mode = p->mode;
    if (p->mode == FP8_MODE_OUTER_VEC) g->n_outer++;
    else g->n_rescale++;
    g->n_plans++;
    *out = p;
    return 0;
}

/* ---------- state ---------- */

int fp8_gemm_init(Fp8Gemm *g, cublasLtHandle_t lt, void *workspace, size_t workspace_bytes, int max_t, int64_t max_k,
                  Err *err) {
    memset(g, 0, sizeof *g);
    g->lt = lt;
    g->workspace = workspace;
    g->workspace_bytes = workspace_bytes;
    g->max_t = max_t;
    g->max_k = max_k;
    if (max_t <= 0 || max_k <= 0) return err_set(err, "fp8_gemm_init: %d rows, %lld columns", max_t, (long long)max_k);
    CUDA_CHECK(cudaMalloc(&g->xq, (size_t)max_t * (size_t)max_k), err);
    CUDA_CHECK(cudaMalloc(&g->xs, (size_t)max_t * sizeof(float)), err);
    /* the fallback's buffer, made now: a plan may first be asked for inside a graph capture */
    g->acc_elems = (int64_t)(FP8_ACC_BYTES / sizeof(float));
    CUDA_CHECK(cudaMalloc(&g->acc, FP8_ACC_BYTES), err);
    return 0;
}

void fp8_gemm_free(Fp8Gemm *g) {
    const CublasLt *L = g->n_plans ? cublaslt_lib(NULL) : NULL; /* a plan was made: it is loaded */
    for (int i = 0; i < g->n_plans; i++) plan_destroy(L, &g->plans[i]);
    if (g->xq) cudaFree(g->xq);
    if (g->xs) cudaFree(g->xs);
    if (g->acc) cudaFree(g->acc);
    memset(g, 0, sizeof *g);
}

/* ---------- the GEMM ---------- */

/* Every plan dropped and the fallback forced from now on: cuBLASLt took an
 * OUTER_VEC plan's heuristic but refused its matmul. */
static void fall_back(Fp8Gemm *g) {
    const CublasLt *L = cublaslt_lib(NULL);
    for (int i = 0; i < g->n_plans; i++) plan_destroy(L, &g->plans[i]);
    g->n_plans = 0;
    g->force_rescale = true;
    g->mode = FP8_MODE_RESCALE;
}

extern "C" bool fp8_gemm_takes(const QuantMatrix *W) {
    return W->type == DT_F8_E4M3 && W->rows > 0 && W->rows % 16 == 0 && W->rows <= INT32_MAX && W->cols % 16 == 0 &&
           W->cols <= INT32_MAX;
}

int fp8_gemm(Fp8Gemm *g, const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const float *bias,
             cudaStream_t s, Err *err) {
    if (T <= 0) return T == 0 ? 0 : err_set(err, "fp8_gemm: T = %d", T);
    if (!fp8_gemm_takes(W))
        return err_set(err, "fp8_gemm: a %lld x %lld matrix (F8_E4M3, rows and columns multiples of 16 only)",
                       (long long)W->rows, (long long)W->cols);
    if (!g->xq || T > g->max_t || W->cols > g->max_k)
        return err_set(err, "fp8_gemm: %d rows of %lld columns exceed its buffers (%d x %lld)", T, (long long)W->cols,
                       g->max_t, (long long)g->max_k);
    const int M = (int)W->rows, K = (int)W->cols;
    const float *ws = (const float *)W->sc;
    if (fp8_quantize_rows(x, T, K, W->input_scale, g->xq, g->xs, s, err)) return -1;
    /* a bias into bf16 y goes the RESCALE way, added to the fp32 value before the one rounding: added to y
     * after cuBLASLt rounded it, it cancelled against the rounded sum (errors of 1-2 bf16 steps of the
     * result on an H200) */
    const bool rescale_only = bias && !y_f32;
    Fp8Plan *p = NULL;
    if (fp8_plan(g, M, T, K, y_f32, rescale_only, ws, &p, err)) return -1;
    const CublasLt *L = cublaslt_lib(NULL); /* fp8_plan loaded it */
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (p->mode == FP8_MODE_OUTER_VEC) {
        const void *as = ws, *bs = g->xs; /* the plan serves every matrix of its shape: this one's scales */
        if (L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof as) ||
            L->MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof bs))
            return err_set(err, "cuBLASLt: cannot set the FP8 scale vectors");
        st = L->Matmul(g->lt, p->desc, &alpha, W->qs, p->a, g->xq, p->b, &beta, y, p->d, y, p->d, &p->algo,
                       g->workspace, g->workspace_bytes, s);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
            fall_back(g); /* checked on the host before any launch: nothing ran; x's codes stay valid */
            if (fp8_plan(g, M, T, K, y_f32, true, ws, &p, err)) return -1;
        } else if (st != CUBLAS_STATUS_SUCCESS) {
            return err_set(err, "cuBLASLt FP8 matmul failed (%d) for %d x %d x %d", (int)st, M, T, K);
        } else {
            if (bias) {
                cuda_add_bias(y, y_f32, bias, T, M, s);
                CUDA_CHECK(cudaGetLastError(), err);
            }
            return 0;
        }
    }
    /* RESCALE: tokens in chunks whose fp32 product fits acc, each by its own plan (the last may be shorter) */
    const int64_t ld = (M + 15) / 16 * 16; /* plan_try's */
    const int chunk = T < g->acc_elems / ld ? T : (int)(g->acc_elems / ld);
    if (chunk < 1) return err_set(err, "fp8_gemm: a %d-row matrix does not fit the fp32 buffer", M);
    const size_t ysz = y_f32 ? sizeof(float) : sizeof(__nv_bfloat16);
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int n = T - t0 < chunk ? T - t0 : chunk;
        Fp8Plan *q = p;
        if (n != T && fp8_plan(g, M, n, K, y_f32, true, ws, &q, err)) return -1;
        st = L->Matmul(g->lt, q->desc, &alpha, W->qs, q->a, g->xq + (size_t)t0 * K, q->b, &beta, g->acc, q->d,
                       g->acc, q->d, &q->algo, g->workspace, g->workspace_bytes, s);
        if (st != CUBLAS_STATUS_SUCCESS)
            return err_set(err, "cuBLASLt FP8 matmul failed (%d) for %d x %d x %d", (int)st, M, n, K);
        const int64_t e = (int64_t)n * M;
        kernel_fp8_rescale<<<(unsigned)((e + 255) / 256), 256, 0, s>>>((char *)y + (size_t)t0 * M * ysz, y_f32,
                                                                        g->acc, q->ldd, g->xs + t0, ws, bias, n, M);
        CUDA_CHECK(cudaGetLastError(), err);
    }
    return 0;
}
