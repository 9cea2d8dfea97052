/* test_fp8_matmul.c — FP8 (e4m3) weight products on the GPU (kernels/cuda/fp8.cuh:
 * fp8_gemv, fp8_gemm in both its modes, fp8_dequant_bf16) against the host's
 * exact definition: run on a GPU machine by tests/gpu/run.sh; never in CI.
 *
 *   - random e4m3 weights (every finite code) with random row scales in
 *     [2^-9, 2^-6], random bf16 x (a few values large enough to saturate a
 *     static scale, some rows all zero); rows = a base + 1..37, columns a
 *     multiple of 16 and not of 256 (the GEMM's matrices: rows rounded up
 *     to 16, the odd ones checked refused); T = 1, 2, 3, 8 (GEMV and GEMM), 9, 17,
 *     128, 300, 1024 (GEMM); dynamic (per-token amax / 448) and static
 *     activation scales; with and without bias; the GEMV also with q|k|v
 *     parts and with the residual add (GemvOut.add); the GEMM into bf16 and
 *     fp32 y, in cuBLASLt's mode and forced into the fallback (unit scales,
 *     then the rescale kernel); the GEMV with the GLU fused (Wgate | Wup).
 *   - reference: x quantized by base/dtype.c (fp8_quantize_row, or
 *     fp32_to_e4m3(x / input_scale)), code products summed in double (exact),
 *     times a_scale[t] * scale[n] (that fp32 product, as the kernels take it),
 *     + bias. y is NaN-poisoned before each launch.
 *   - tolerance, per element: 2^-8 |ref| + e * a_scale * scale * sum |code
 *     products|. The GPU and the host multiply the same codes, so what is
 *     left is (1) bf16's rounding of y: the GPU rounds its fp32 value, the
 *     check compares with the unrounded reference, half a bf16 step (2^-9
 *     relative) each way, 2^-8 covers both and the fp32 scale products, and
 *     (2) the order and precision of the sums: e = 2^-16 for the GEMV
 *     (mma.sync m16n8k32 e4m3, fp32 accumulation: its worst element on an
 *     H200 was 2^-29 of the sum of |products| off), e = 2^-10 for cuBLASLt
 *     (Hopper's wgmma FP8 adds products in fewer than fp32's bits between
 *     promotions to fp32: on an H200 the worst element of 163,840 at K = 272
 *     was 2^-11.4 off, past the 2^-12 first tried). The worst seen is
 *     printed.
 *     A dropped or wrong scale moves an element by a factor (scales are
 *     2^-9 .. 2^-6, row scales differ by up to 8x): each case also checks
 *     that the reference without W's scales, and without x's, fails the same
 *     bound on nearly every element, so the bound cannot pass such a bug.
 *   - --bench: the GEMV's GB/s on the Llama-3-8B matrices (4096x4096,
 *     6144x4096, 28672x4096, 4096x14336) at T = 1, 2, 4, 8, and the GEMM's
 *     TFLOP/s at T = 8, 512, 4096 in both modes; printed, never asserted.
 *   - --quick: fewer cases (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/quant.cuh"
#include "tests/gpu/time_launch.h"
#include "tests/test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((rnd64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

/* a finite e4m3 code (0x7f and 0xff are NaN) */
static uint8_t rand_code(void) {
    uint8_t c;
    do c = (uint8_t)rnd64(); while ((c & 0x7f) == 0x7f);
    return c;
}

typedef struct {
    int64_t rows, cols;
    uint8_t *codes;   /* host [rows][cols] */
    float *scale;     /* host [rows] */
    void *buf;        /* device: the QuantMatrix's planes */
    QuantMatrix m;
} F8Mat;

static int f8_build(F8Mat *M, int64_t rows, int64_t cols, float input_scale) {
    memset(M, 0, sizeof *M);
    M->rows = rows;
    M->cols = cols;
    M->codes = malloc((size_t)rows * cols);
    M->scale = malloc((size_t)rows * sizeof(float));
    if (!M->codes || !M->scale) return -1;
    for (int64_t i = 0; i < rows * cols; i++) M->codes[i] = rand_code();
    for (int64_t r = 0; r < rows; r++) M->scale[r] = ldexpf(1.0f + 0.5f * frand(), -(int)(6 + rnd64() % 3));
    size_t bytes = 0;
    Err err = {{0}};
    if (quant_matrix_bytes(DT_F8_E4M3, rows, cols, &bytes, &err) || cudaMalloc(&M->buf, bytes) ||
        quant_matrix_init(&M->m, DT_F8_E4M3, rows, cols, M->buf, &err))
        return -1;
    M->m.input_scale = input_scale;
    if (cudaMemcpy(M->m.qs, M->codes, (size_t)rows * cols, cudaMemcpyHostToDevice) ||
        cudaMemcpy(M->m.sc, M->scale, (size_t)rows * sizeof(float), cudaMemcpyHostToDevice))
        return -1;
    return 0;
}

static void f8_free(F8Mat *M) {
    free(M->codes);
    free(M->scale);
    cudaFree(M->buf);
    memset(M, 0, sizeof *M);
}

/* x [T][K] bf16 bits: values in (-1, 1), a few of +-3 (x / 0.0035 saturates), every 5th row (from row 2)
 * times 40, row 4 all zero */
static void make_x(uint16_t *x, int T, int64_t K) {
    for (int t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            float v = rnd64() % 97 == 0 ? (frand() > 0 ? 3.0f : -3.0f) : frand();
            if (t % 5 == 2) v *= 40.0f;
            if (t == 4) v = 0.0f;
            x[(int64_t)t * K + k] = fp32_to_bf16(v);
        }
}

/* The host's side of the definition: codes [T][K] as floats and a_scale [T]. */
static void ref_quantize(const uint16_t *x, int T, int64_t K, float input_scale, float *xc, float *as) {
    float *row = malloc((size_t)K * sizeof(float));
    uint8_t *c = malloc((size_t)K);
    for (int t = 0; t < T; t++) {
        for (int64_t k = 0; k < K; k++) row[k] = bf16_to_fp32(x[(int64_t)t * K + k]);
        if (input_scale > 0) {
            for (int64_t k = 0; k < K; k++) c[k] = fp32_to_e4m3(row[k] / input_scale);
            as[t] = input_scale;
        } else {
            fp8_quantize_row(row, (int)K, c, &as[t]);
        }
        for (int64_t k = 0; k < K; k++) xc[(int64_t)t * K + k] = e4m3_to_fp32(c[k]);
    }
    free(row);
    free(c);
}

typedef struct {
    const char *what;   /* the route, for messages */
    double e;           /* sum-order term of the tolerance (see the top) */
    bool f32, add;      /* y fp32; y += bf16(value) (the GEMV's residual add) */
    const float *bias;  /* host [rows] or NULL */
    const float *base;  /* add: y before the launch (host [T][rows]) */
    double *worst;      /* the largest sum-order error seen, over a x scale x sum |products| (printed) */
} Check;

/* Elements of y [T][rows] (bf16 bits or fp32) outside the bound, and how many of them the references
 * without W's / x's scales would pass (*drop_pass). Rows every `step` only (big shapes). */
static int64_t check_y(const F8Mat *M, const float *xc, const float *as, int T, const void *y, const Check *c,
                       int64_t step, int64_t *drop_pass, int64_t *n_checked) {
    int64_t bad = 0, shown = 0;
    float *w = malloc((size_t)M->cols * sizeof(float));
    for (int64_t n = 0; n < M->rows; n++) {
        if (n % step && n != M->rows - 1) continue;
        for (int64_t k = 0; k < M->cols; k++) w[k] = e4m3_to_fp32(M->codes[n * M->cols + k]);
        for (int t = 0; t < T; t++) {
            const float *xr = xc + (int64_t)t * M->cols;
            double s = 0, sa = 0;
            for (int64_t k = 0; k < M->cols; k++) {
                double p = (double)w[k] * xr[k];
                s += p;
                sa += fabs(p);
            }
            const float sc = as[t] * M->scale[n]; /* the kernels' fp32 product */
            const double b = c->bias ? c->bias[n] : 0.0;
            double ref = (double)sc * s + b;
            double tol = ldexp(fabs(ref), -8) + c->e * fabs((double)sc) * sa;
            const int64_t i = (int64_t)t * M->rows + n;
            double got = c->f32 || c->add ? ((const float *)y)[i] : bf16_to_fp32(((const uint16_t *)y)[i]);
            if (c->add) { /* y = base + bf16(value): compare the added part */
                got -= c->base[i];
                tol += ldexp(fabs(c->base[i]), -23) * 2;
            }
            (*n_checked)++;
            if (!c->add && sa > 0 && sc != 0) {
                const double r = (fabs(got - ref) - ldexp(fabs(ref), -8)) / (fabs((double)sc) * sa);
                if (r > *c->worst) *c->worst = r;
            }
            if (!(fabs(got - ref) <= tol)) {
                if (shown++ < 5)
                    printf("  %s [%lld][%lld] T=%d: y[%d][%lld] = %.9g, want %.9g (tol %.3g)\n", c->what,
                           (long long)M->rows, (long long)M->cols, T, t, (long long)n, got, ref, tol);
                bad++;
            }
            const double no_w = (double)as[t] * s + b, no_x = (double)M->scale[n] * s + b;
            if (sc != 0 && s != 0 && (fabs(got - no_w) <= tol || fabs(got - no_x) <= tol)) (*drop_pass)++;
        }
    }
    free(w);
    return bad;
}

/* One launch of a route on M with T rows of x, checked. route: 0 GEMV, 1 GEMV with q|k|v parts, 2 GEMV
 * adding into fp32 y, 3 GEMM (g's mode), each with or without bias. */
/* The largest sum-order error of the GEMV's and the GEMM's elements (Check.worst), printed by test_routes. */
static double worst_sum_error[2];

static void run_case(Fp8Gemm *g, const char *gname, F8Mat *M, int T, int route, bool bias, bool y_f32, int64_t step) {
    const int64_t K = M->cols, R = M->rows, ny = (int64_t)T * R;
    uint16_t *xh = malloc((size_t)T * K * 2);
    float *xc = malloc((size_t)T * K * sizeof(float)), as[1024], *bh = NULL, *base = NULL;
    void *yh = malloc((size_t)ny * 4);
    void *dx = NULL, *dy = NULL;
    float *db = NULL;
    make_x(xh, T, K);
    ref_quantize(xh, T, K, M->m.input_scale, xc, as);
    bool f32 = y_f32 || route == 2;
    int rc = cudaMalloc(&dx, (size_t)T * K * 2) || cudaMalloc(&dy, (size_t)ny * 4) ||
             cudaMemcpy(dx, xh, (size_t)T * K * 2, cudaMemcpyHostToDevice);
    if (bias) {
        bh = malloc((size_t)R * sizeof(float));
        for (int64_t n = 0; n < R; n++) bh[n] = frand();
        rc = rc || cudaMalloc((void **)&db, (size_t)R * sizeof(float)) ||
             cudaMemcpy(db, bh, (size_t)R * sizeof(float), cudaMemcpyHostToDevice);
    }
    if (route == 2) { /* a residual stream */
        base = malloc((size_t)ny * sizeof(float));
        for (int64_t i = 0; i < ny; i++) base[i] = 4.0f * frand();
        rc = rc || cudaMemcpy(dy, base, (size_t)ny * 4, cudaMemcpyHostToDevice);
    } else {
        rc = rc || cudaMemset(dy, 0xff, (size_t)ny * 4); /* NaN in either width */
    }
    CHECK(!rc, "setup of [%lld][%lld] T=%d", (long long)R, (long long)K, T);
    Err err = {{0}};
    const char *what = route == 0 ? "gemv" : route == 1 ? "gemv parts" : route == 2 ? "gemv add" : gname;
    if (!rc && route < 3) {
        GemvOut out = gemv_out_one(dy, f32, db, R);
        if (route == 1) { /* three parts back to back in dy, each [T][part rows], the biases split the same way */
            int64_t e0 = R / 3, e1 = 2 * R / 3;
            char *y0 = dy;
            out.y[0] = y0;
            out.y[1] = y0 + (size_t)T * e0 * 2;
            out.y[2] = y0 + (size_t)T * e1 * 2;
            out.bias[1] = db ? db + e0 : NULL;
            out.bias[2] = db ? db + e1 : NULL;
            out.end[0] = e0;
            out.end[1] = e1;
        }
        out.add = route == 2;
        rc = fp8_gemv(&M->m, dx, NULL, &out, T, 0, &err);
    } else if (!rc) {
        rc = fp8_gemm(g, &M->m, dx, T, dy, y_f32, db, 0, &err);
    }
    CHECK(!rc, "%s [%lld][%lld] T=%d: %s", what, (long long)R, (long long)K, T, err.msg);
    rc = rc || cudaDeviceSynchronize() || cudaMemcpy(yh, dy, (size_t)ny * (f32 ? 4 : 2), cudaMemcpyDeviceToHost);
    CHECK(!rc, "%s [%lld][%lld] T=%d: run failed (%s)", what, (long long)R, (long long)K, T,
          cudaGetErrorString(cudaGetLastError()));
    if (!rc && route == 1) { /* the parts back into one [T][R] for the check */
        int64_t e[3] = {R / 3, 2 * R / 3, R}, s0[3] = {0, R / 3, 2 * R / 3};
        uint16_t *whole = malloc((size_t)ny * 2);
        const uint16_t *src = yh;
        for (int p = 0, off = 0; p < 3; p++) {
            int64_t w = e[p] - s0[p];
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < w; r++) whole[(int64_t)t * R + s0[p] + r] = src[off + (int64_t)t * w + r];
            off += (int)(T * w);
        }
        memcpy(yh, whole, (size_t)ny * 2);
        free(whole);
    }
    if (!rc) {
        Check c = {what, route < 3 ? ldexp(1, -16) : ldexp(1, -10), f32, route == 2, bh, base, &worst_sum_error[route < 3 ? 0 : 1]};
        int64_t drop = 0, n = 0, bad = check_y(M, xc, as, T, yh, &c, step, &drop, &n);
        CHECK(bad == 0, "%s [%lld][%lld] T=%d scale %s bias %d: %lld of %lld elements off", what, (long long)R,
              (long long)K, T, M->m.input_scale > 0 ? "static" : "dynamic", bias, (long long)bad, (long long)n);
        CHECK(drop * 50 <= n, "%s [%lld][%lld] T=%d: the bound passes %lld of %lld elements without a scale", what,
              (long long)R, (long long)K, T, (long long)drop, (long long)n);
    }
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(db);
    free(xh);
    free(xc);
    free(yh);
    free(bh);
    free(base);
}

/* The GLU GEMV on M = Wgate | Wup (2F rows): out [T][F] = silu(gate + bg) x (up + bu) from the fp32 values.
 * Tolerance: each of gate and up within the GEMV's bound (tg, tu), carried through silu(g) u (|silu'| < 1.1),
 * plus 2^-8 |ref| for the bf16 output and expf's few ulps. */
static void run_glu_case(F8Mat *M, int T, bool bias) {
    const int64_t K = M->cols, F = M->rows / 2;
    uint16_t *xh = malloc((size_t)T * K * 2), *yh = malloc((size_t)T * F * 2);
    float *xc = malloc((size_t)T * K * sizeof(float)), as[FP8_GEMV_MAX_T], *bh = NULL;
    void *dx = NULL, *dy = NULL;
    float *db = NULL;
    make_x(xh, T, K);
    ref_quantize(xh, T, K, M->m.input_scale, xc, as);
    int rc = cudaMalloc(&dx, (size_t)T * K * 2) || cudaMalloc(&dy, (size_t)T * F * 2) ||
             cudaMemcpy(dx, xh, (size_t)T * K * 2, cudaMemcpyHostToDevice) || cudaMemset(dy, 0xff, (size_t)T * F * 2);
    if (bias) {
        bh = malloc((size_t)2 * F * sizeof(float));
        for (int64_t n = 0; n < 2 * F; n++) bh[n] = frand();
        rc = rc || cudaMalloc((void **)&db, (size_t)2 * F * sizeof(float)) ||
             cudaMemcpy(db, bh, (size_t)2 * F * sizeof(float), cudaMemcpyHostToDevice);
    }
    Err err = {{0}};
    rc = rc || fp8_gemv_glu(&M->m, dx, NULL, dy, db, db ? db + F : NULL, ACT_SILU, 0.0f, T, 0, &err);
    CHECK(!rc, "glu [%lld][%lld] T=%d: %s", (long long)M->rows, (long long)K, T, err.msg);
    rc = rc || cudaDeviceSynchronize() || cudaMemcpy(yh, dy, (size_t)T * F * 2, cudaMemcpyDeviceToHost);
    int64_t bad = 0;
    for (int64_t n = 0; !rc && n < F; n++)
        for (int t = 0; t < T; t++) {
            double v[2], tv[2];
            for (int h = 0; h < 2; h++) {
                const int64_t row = n + h * F;
                double s = 0, sa = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)e4m3_to_fp32(M->codes[row * K + k]) * xc[(int64_t)t * K + k];
                    s += p;
                    sa += fabs(p);
                }
                const float sc = as[t] * M->scale[row];
                v[h] = (double)sc * s + (bh ? bh[row] : 0.0);
                tv[h] = ldexp(1, -16) * fabs((double)sc) * sa + ldexp(fabs(v[h]), -22);
            }
            const double sg = v[0] / (1.0 + exp(-v[0])), ref = sg * v[1];
            const double tol = ldexp(fabs(ref), -8) + 1.1 * fabs(v[1]) * tv[0] + fabs(sg) * tv[1] + 1e-6 * fabs(ref);
            const double got = bf16_to_fp32(yh[(int64_t)t * F + n]);
            if (!(fabs(got - ref) <= tol) && bad++ < 5)
                printf("  glu [%lld][%lld] T=%d: out[%d][%lld] = %.9g, want %.9g (tol %.3g)\n", (long long)M->rows,
                       (long long)K, T, t, (long long)n, got, ref, tol);
        }
    CHECK(bad == 0, "glu [%lld][%lld] T=%d bias %d: %lld elements off", (long long)M->rows, (long long)K, T, bias,
          (long long)bad);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(db);
    free(xh);
    free(yh);
    free(xc);
    free(bh);
}

/* ---- cases ---- */

static bool quick;

static void test_routes(void) {
    /* rows: a base + 1..37; columns: multiples of 16, not of 256 */
    const int64_t shapes[][2] = {{1, 16}, {38, 48}, {147, 272}, {2 * 273, 1040}, {4096 + 21, 4112}};
    const int Ts[] = {1, 2, 3, 8, 9, 17, 128, 300, 1024};
    const int n_shapes = quick ? 3 : 5, n_T = quick ? 6 : 9;
    Err err = {{0}};
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    const size_t ws_bytes = (size_t)32 << 20;
    Fp8Gemm g = {0}, gr = {0}; /* cuBLASLt's mode, and the fallback forced */
    const CublasLt *L = cublaslt_lib(&err);
    int rc = !L || L->Create(&lt) || cudaMalloc(&ws, ws_bytes) || fp8_gemm_init(&g, lt, ws, ws_bytes, 1024, 4112, &err) ||
             fp8_gemm_init(&gr, lt, ws, ws_bytes, 1024, 4112, &err);
    CHECK(!rc, "setup: %s", err.msg);
    if (rc) return;
    gr.force_rescale = true;
    for (int si = 0; si < n_shapes; si++)
        for (int dyn = 0; dyn < 2; dyn++) {
            /* M: the GEMV's odd rows; Ma: the GEMM's, rounded up to 16 (fp8_gemm refuses M) */
            F8Mat M, Ma;
            const float in_scale = dyn ? 0.0f : 0.0035f;
            CHECK(f8_build(&M, shapes[si][0], shapes[si][1], in_scale) == 0, "matrix");
            CHECK(f8_build(&Ma, (shapes[si][0] + 15) / 16 * 16, shapes[si][1], in_scale) == 0, "matrix");
            CHECK(!fp8_gemm_takes(&M.m) && fp8_gemm_takes(&Ma.m), "fp8_gemm_takes: %lld rows no, %lld rows yes",
                  (long long)M.rows, (long long)Ma.rows);
            CHECK(fp8_gemm(&g, &M.m, NULL, 9, NULL, false, NULL, 0, &err) == -1 && strstr(err.msg, "multiples of 16"),
                  "fp8_gemm refuses %lld rows: %s", (long long)M.rows, err.msg);
            const int64_t step = M.rows > 1024 ? 61 : 1; /* the 4117-row matrix: every 61st row and the last */
            for (int ti = 0; ti < n_T; ti++) {
                const int T = Ts[ti];
                if (M.rows > 1024 && T > 300) continue;
                for (int bias = 0; bias < 2; bias++) {
                    if (T <= FP8_GEMV_MAX_T) {
                        if (M.rows % 2 == 0 && M.rows <= 1024) run_glu_case(&M, T, bias);
                        run_case(&g, "", &M, T, 0, bias, false, step);
                        if (M.rows >= 3) run_case(&g, "", &M, T, 1, bias, false, step);
                        run_case(&g, "", &M, T, 2, bias, false, step);
                    }
                    run_case(&g, "gemm", &Ma, T, 3, bias, bias && T == 9, step); /* fp32 y once: logits */
                    run_case(&gr, "gemm rescale", &Ma, T, 3, bias, bias && T == 17, step);
                }
            }
            f8_free(&M);
            f8_free(&Ma);
        }
    /* the GLU with x codes of 8 rows x 4112 columns (32.9 KB of dynamic shared memory beside the static arrays:
     * past the 48 KB a kernel gets without opting in) */
    F8Mat G;
    CHECK(f8_build(&G, 400, 4112, 0.0f) == 0, "matrix");
    for (int T = 1; T <= FP8_GEMV_MAX_T; T += FP8_GEMV_MAX_T - 1) run_glu_case(&G, T, true);
    f8_free(&G);
    printf("  worst sum-order error, over a_scale x scale x sum |products|: GEMV 2^%.2f, GEMM 2^%.2f (bounds 2^-16, 2^-10)\n",
           log2(worst_sum_error[0] > 0 ? worst_sum_error[0] : 1e-30), log2(worst_sum_error[1] > 0 ? worst_sum_error[1] : 1e-30));
    printf("  cuBLASLt FP8: first plan %s; plans %d outer-vector, %d rescale (the fallback forced: %d / %d)\n",
           fp8_gemm_mode_name(g.mode), g.n_outer, g.n_rescale, gr.n_outer, gr.n_rescale);
    fp8_gemm_free(&g);
    fp8_gemm_free(&gr);
    cudaFree(ws);
    L->Destroy(lt);
}

/* The bf16 dequantization: bit-exact with the host's fp32 product rounded to bf16. */
static void test_dequant(void) {
    F8Mat M;
    CHECK(f8_build(&M, 37 + 64, 272, 0.0f) == 0, "matrix");
    const int64_t r0 = 5, n = 90, ne = n * M.cols;
    uint16_t *h = malloc((size_t)ne * 2);
    void *d = NULL;
    Err err = {{0}};
    int rc = cudaMalloc(&d, (size_t)ne * 2) || fp8_dequant_bf16(&M.m, r0, n, d, 0, &err) ||
             cudaMemcpy(h, d, (size_t)ne * 2, cudaMemcpyDeviceToHost);
    CHECK(!rc, "dequant: %s", err.msg);
    int64_t bad = 0;
    for (int64_t i = 0; !rc && i < ne; i++) {
        const int64_t r = r0 + i / M.cols;
        bad += h[i] != fp32_to_bf16(e4m3_to_fp32(M.codes[r0 * M.cols + i]) * M.scale[r]);
    }
    CHECK(bad == 0, "%lld of %lld values differ", (long long)bad, (long long)ne);
    CHECK(quant_dequant_bf16(&M.m, r0, n, d, 0, &err) == 0, "quant_dequant_bf16 refuses F8: %s", err.msg);
    CHECK(fp8_dequant_bf16(&M.m, 100, 5, d, 0, &err) != 0, "rows past the end taken");
    cudaFree(d);
    free(h);
    f8_free(&M);
}

static void test_refused(void) {
    Err err = {{0}};
    size_t b = 0;
    CHECK(quant_matrix_bytes(DT_F8_E4M3, 8, 40, &b, &err) != 0, "40 columns taken");
    CHECK(quant_matrix_bytes(DT_F8_E4M3, 8, 48, &b, &err) == 0 && b >= 8 * 48 + 8 * 4, "8 x 48: %zu bytes", b);
    QuantMatrix W = {DT_F8_E4M3, 64, 262144, NULL, NULL, 0.0f};
    CHECK(!fp8_gemv_takes(&W, 1), "a 256 KB x row taken by the GEMV");
    W.cols = 4096;
    CHECK(fp8_gemv_takes(&W, 8) && !fp8_gemv_takes(&W, 9) && !fp8_gemv_takes(&W, 0), "GEMV rows");
    CHECK(!quant_gemv_takes(QGEMV_SCALAR, &W, 1, false) && !quant_gemv_takes(QGEMV_X8, &W, 1, false),
          "a quantized GEMV takes F8");
    CHECK(quant_type_supported(DT_F8_E4M3) == dtype_gpu_keeps_blocks(DT_F8_E4M3), "lists disagree");
}

/* ---- --bench ---- */

typedef struct {
    F8Mat *M;
    Fp8Gemm *g;
    void *x, *y;
    int T;
    bool gemm;
} Run;

static int run_once(Run *r) {
    Err err = {{0}};
    if (r->gemm) return fp8_gemm(r->g, &r->M->m, r->x, r->T, r->y, false, NULL, 0, &err);
    GemvOut out = gemv_out_one(r->y, false, NULL, r->M->rows);
    return fp8_gemv(&r->M->m, r->x, NULL, &out, r->T, 0, &err);
}

static int run_once_v(void *r) { return run_once(r); }

/* us per launch: the median of 7 samples of 20 back-to-back launches */
static float time_us(Run *r) { return time_launch_us(run_once_v, r, 20); }

static void bench(void) {
    const int64_t shapes[4][2] = {{4096, 4096}, {6144, 4096}, {28672, 4096}, {4096, 14336}};
    const char *names[4] = {"o", "qkv", "gate+up", "down"};
    const int gemv_T[4] = {1, 2, 4, 8}, gemm_T[3] = {8, 512, 4096};
    Err err = {{0}};
    cublasLtHandle_t lt = NULL;
    void *ws = NULL, *x = NULL, *y = NULL;
    const size_t ws_bytes = (size_t)32 << 20;
    Fp8Gemm g = {0}, gr = {0};
    const CublasLt *L = cublaslt_lib(&err);
    int rc = !L || L->Create(&lt) || cudaMalloc(&ws, ws_bytes) || cudaMalloc(&x, (size_t)4096 * 14336 * 2) ||
             cudaMalloc(&y, (size_t)4096 * 28672 * 2) || fp8_gemm_init(&g, lt, ws, ws_bytes, 4096, 14336, &err) ||
             fp8_gemm_init(&gr, lt, ws, ws_bytes, 4096, 14336, &err);
    CHECK(!rc, "bench setup: %s", err.msg);
    if (rc) return;
    gr.force_rescale = true;
    uint16_t *xh = malloc((size_t)4096 * 14336 * 2);
    make_x(xh, 4096, 14336);
    cudaMemcpy(x, xh, (size_t)4096 * 14336 * 2, cudaMemcpyHostToDevice);
    free(xh);
    printf("# fp8 GEMV: us (GB/s of W's codes + scales; H200 copy 4.26 TB/s)\n# %-8s %-12s", "matrix", "shape");
    for (int i = 0; i < 4; i++) printf(" | T=%d          ", gemv_T[i]);
    printf("\n");
    for (int s = 0; s < 4; s++) {
        F8Mat M;
        if (f8_build(&M, shapes[s][0], shapes[s][1], 0.0f)) continue;
        printf("# %-8s %5lldx%-6lld", names[s], (long long)shapes[s][0], (long long)shapes[s][1]);
        const double bytes = (double)M.rows * M.cols + 4.0 * M.rows;
        for (int i = 0; i < 4; i++) {
            Run r = {&M, NULL, x, y, gemv_T[i], false};
            float us = time_us(&r);
            printf(" | %6.1f (%5.0f)", us, bytes / (us * 1e-6) * 1e-9);
        }
        printf("\n");
        f8_free(&M);
    }
    for (int mode = 0; mode < 2; mode++) {
        Fp8Gemm *gg = mode ? &gr : &g;
        printf("# fp8 GEMM (quantize x + cuBLASLt%s): us (TFLOP/s)\n# %-8s %-12s", mode ? ", fallback forced" : "",
               "matrix", "shape");
        for (int i = 0; i < 3; i++) printf(" | T=%-4d          ", gemm_T[i]);
        printf("\n");
        for (int s = 0; s < 4; s++) {
            F8Mat M;
            if (f8_build(&M, shapes[s][0], shapes[s][1], 0.0f)) continue;
            printf("# %-8s %5lldx%-6lld", names[s], (long long)shapes[s][0], (long long)shapes[s][1]);
            for (int i = 0; i < 3; i++) {
                Run r = {&M, gg, x, y, gemm_T[i], true};
                float us = time_us(&r);
                printf(" | %8.1f (%5.0f)", us, 2.0 * gemm_T[i] * M.rows * M.cols / (us * 1e-6) * 1e-12);
            }
            printf("\n");
            f8_free(&M);
        }
        printf("# mode: %s (plans: %d outer-vector, %d rescale)\n", fp8_gemm_mode_name(gg->mode), gg->n_outer,
               gg->n_rescale);
    }
    CHECK(cudaGetLastError() == cudaSuccess, "bench launches failed");
    fp8_gemm_free(&g);
    fp8_gemm_free(&gr);
    cudaFree(ws);
    cudaFree(x);
    cudaFree(y);
    L->Destroy(lt);
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("not ok - no CUDA device\n");
        return 1;
    }
    quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        RUN(bench);
        TEST_EXIT();
    }
    RUN(test_refused);
    RUN(test_dequant);
    RUN(test_routes);
    TEST_EXIT();
}
