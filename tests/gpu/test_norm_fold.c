/* test_norm_fold.c — the decode GEMVs that normalize x themselves
 * (kernels/cuda/norm_fold.cuh) and the bf16 GEMV's residual add: run on a
 * GPU machine by tests/gpu/run.sh; never in CI.
 *
 *   - bf16 (gemv.cuh: q|k|v parts with biases, and the GLU) and FP8
 *     (fp8.cuh: fp8_gemv with parts, fp8_gemv_glu; dynamic and static
 *     activation scales) with a RowNorm, T = 1..8, widths K = 4096 (one
 *     group of 4 a norm thread), 4104 and 8192 (two; 4104: the last
 *     thread's second group past the row), 264 (fewer norm threads than a
 *     block), norm offsets 0 and 1; residual rows of different sizes (x40,
 *     one row x1/64).
 *   - each against (1) the path it replaces, on the GPU: add_rmsnorm's
 *     kernel into a bf16 x, then the same GEMV reading it, outputs equal
 *     bit for bit (the fold plays the norm's sum order and arithmetic, the
 *     products are the same code), and (2) a CPU reference from the fp32
 *     residual and the norm weight: x normalized in double, rounded to
 *     bf16 (FP8: then quantized by base/dtype.c), products in double; per
 *     element within 2^-8 |ref| + 2^-10 sum |products| for bf16 (the bf16
 *     output, the sum order, and a normalized value that rounds the other
 *     way where the CPU's 1 / rms differs from rsqrtf in the last bits),
 *     relative L2 error <= 1e-2 for FP8 (a code on the other side of a
 *     rounding moves one product by an e4m3 step). Outputs are NaN-poisoned
 *     before every launch. A missing norm (x / rms ~ x / 23 here), a lost
 *     offset or weight fails both.
 *   - what the fold does not take is refused with a message (bf16: K % 8;
 *     both: K > 8192, a misaligned residual): the backend then runs
 *     add_rmsnorm and the plain GEMV.
 *   - GemvOut.add on the bf16 GEMV (the o / down products' residual add):
 *     y == y0 + bf16(product + bias) bit for bit, with the plain GEMV's
 *     bf16 output added on the host; y0 100x the product, so an overwrite
 *     or a double add misses by far. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/quant.cuh"
#include "tests/gpu/gemv_calls.h"
#include "tests/test.h"

#define MAX_T 8

static bool quick; /* --quick (compute-sanitizer): T = 1, 2 and 8, two widths */
static bool skip_t(int T) { return quick && T > 2 && T < MAX_T; }

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((rnd64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static float bf16_round(float x) { return bf16_to_fp32(fp32_to_bf16(x)); }

/* A case's inputs on both sides: residual [T][K], norm weight [K]. */
typedef struct {
    int T, K;
    float eps, offset;
    float *res, *g, *xn;   /* host; xn: the CPU's normalized x, bf16 values */
    float *d_res, *d_g;    /* device */
    void *d_xn;            /* device bf16 [T][K]: add_rmsnorm's output (the unfolded path) */
} NormCase;

static int norm_case(NormCase *c, int T, int K, float offset) {
    memset(c, 0, sizeof *c);
    c->T = T, c->K = K, c->eps = 1e-5f, c->offset = offset;
    c->res = malloc((size_t)T * K * 4), c->g = malloc((size_t)K * 4), c->xn = malloc((size_t)T * K * 4);
    for (int k = 0; k < K; k++) c->g[k] = offset ? 0.3f * frand() : 0.5f + frand();
    for (int t = 0; t < T; t++) {
        const float scale = t == 2 ? 1.0f / 64 : 40.0f;
        double ss = 0;
        for (int k = 0; k < K; k++) {
            const float v = scale * frand();
            c->res[(int64_t)t * K + k] = v;
            ss += (double)v * v;
        }
        const double inv = 1.0 / sqrt(ss / K + c->eps);
        for (int k = 0; k < K; k++)
            c->xn[(int64_t)t * K + k] = bf16_round((float)(c->res[(int64_t)t * K + k] * inv * (c->g[k] + offset)));
    }
    if (cudaMalloc((void **)&c->d_res, (size_t)T * K * 4 + 16) || cudaMalloc((void **)&c->d_g, (size_t)K * 4) ||
        cudaMalloc(&c->d_xn, (size_t)T * K * 2) ||
        cudaMemcpy(c->d_res, c->res, (size_t)T * K * 4, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->d_g, c->g, (size_t)K * 4, cudaMemcpyHostToDevice))
        return -1;
    test_add_rmsnorm(c->d_res, NULL, c->d_xn, c->d_g, T, K, c->eps, c->offset);
    return cudaDeviceSynchronize() ? -1 : 0;
}

static void norm_case_free(NormCase *c) {
    cudaFree(c->d_res), cudaFree(c->d_g), cudaFree(c->d_xn);
    free(c->res), free(c->g), free(c->xn);
}

static RowNorm row_norm(const NormCase *c) { return (RowNorm){c->d_res, c->d_g, c->eps, c->offset}; }

/* Device bf16 [n] (0xffff: NaN) and its host copy as floats. */
static void *poisoned(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) || cudaMemset(p, 0xff, bytes)) return NULL;
    return p;
}

static void read_bf16(float *dst, const void *src, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    if (cudaDeviceSynchronize() || cudaMemcpy(h, src, (size_t)n * 2, cudaMemcpyDeviceToHost))
        for (int64_t i = 0; i < n; i++) h[i] = 0xffff;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(h[i]);
    free(h);
}

/* Elements of a and b [n] whose bits differ (a NaN counts). */
static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0 || a[i] != a[i];
    return d;
}

/* ---- bf16 ---- */

/* W [M][K] bf16 values (host floats, device bf16), biases [M]. */
typedef struct {
    int M, K;
    float *w, *b;
    void *d_w;
    float *d_b;
} Bf16Mat;

static int bf16_mat(Bf16Mat *m, int M, int K) {
    m->M = M, m->K = K;
    m->w = malloc((size_t)M * K * 4), m->b = malloc((size_t)M * 4);
    uint16_t *h = malloc((size_t)M * K * 2);
    const float ws = 1.0f / sqrtf((float)K);
    for (int64_t i = 0; i < (int64_t)M * K; i++) h[i] = fp32_to_bf16(ws * frand()), m->w[i] = bf16_to_fp32(h[i]);
    for (int i = 0; i < M; i++) m->b[i] = 0.5f * frand();
    int rc = cudaMalloc(&m->d_w, (size_t)M * K * 2) || cudaMalloc((void **)&m->d_b, (size_t)M * 4) ||
             cudaMemcpy(m->d_w, h, (size_t)M * K * 2, cudaMemcpyHostToDevice) ||
             cudaMemcpy(m->d_b, m->b, (size_t)M * 4, cudaMemcpyHostToDevice);
    free(h);
    return rc ? -1 : 0;
}

static void bf16_mat_free(Bf16Mat *m) { cudaFree(m->d_w), cudaFree(m->d_b), free(m->w), free(m->b); }

/* ref[t][m] = W[m] . xn[t] (+ b[m]) in double, sabs the sum of |products|. */
static void ref_products(const Bf16Mat *m, const float *xn, int T, bool bias, double *ref, double *sabs) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < m->M; r++) {
            double s = bias ? m->b[r] : 0.0, a = 0;
            for (int k = 0; k < m->K; k++) {
                const double p = (double)m->w[(int64_t)r * m->K + k] * xn[(int64_t)t * m->K + k];
                s += p, a += fabs(p);
            }
            ref[(int64_t)t * m->M + r] = s, sabs[(int64_t)t * m->M + r] = a;
        }
}

/* q|k|v parts (three uneven parts, biases) of W with the norm folded in,
 * against add_rmsnorm + the plain GEMV (bits) and the CPU (bound). */
static void check_bf16_parts(const NormCase *c, const Bf16Mat *m) {
    const int T = c->T, M = m->M, K = c->K, n0 = M / 2, n1 = n0 + M / 3;
    const int64_t n = (int64_t)T * M;
    void *ya = poisoned(n * 2), *yb = poisoned(n * 2);
    CHECK(ya && yb, "alloc");
    if (!ya || !yb) return;
    const int64_t ends[3] = {n0, n1, M};
    char *pa[3] = {ya, (char *)ya + (int64_t)T * n0 * 2, (char *)ya + (int64_t)T * n1 * 2};
    char *pb[3] = {yb, (char *)yb + (int64_t)T * n0 * 2, (char *)yb + (int64_t)T * n1 * 2};
    GemvOut oa = {{pa[0], pa[1], pa[2]}, {m->d_b, m->d_b + n0, m->d_b + n1}, {ends[0], ends[1], ends[2]}, false, false};
    GemvOut ob = oa;
    for (int i = 0; i < 3; i++) ob.y[i] = pb[i];
    test_gemv_parts(&oa, m->d_w, c->d_xn, M, K, T);
    const RowNorm rn = row_norm(c);
    Err err = {{0}};
    int rc = test_gemv_parts_norm(&ob, m->d_w, &rn, M, K, T, &err);
    CHECK(rc == 0, "bf16 parts with the norm K=%d T=%d: %s", K, T, err.msg);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    double *ref = malloc(n * 8), *sabs = malloc(n * 8);
    read_bf16(a, ya, n), read_bf16(b, yb, n);
    CHECK(bits_differ(b, a, n) == 0, "bf16 parts K=%d T=%d: %lld of %lld differ from add_rmsnorm + GEMV", K, T,
          (long long)bits_differ(b, a, n), (long long)n);
    ref_products(m, c->xn, T, true, ref, sabs);
    int64_t bad = 0;
    for (int p = 0; p < 3; p++) { /* part p is [T][rows of p] */
        const int r0 = p ? (int)ends[p - 1] : 0, w = (int)ends[p] - r0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < w; r++) {
                const int64_t i = (int64_t)t * M + r0 + r;
                const double g = b[(int64_t)T * r0 + (int64_t)t * w + r], tol = ldexp(fabs(ref[i]), -8) + ldexp(sabs[i], -10);
                if (!(fabs(g - ref[i]) <= tol) && bad++ < 5)
                    printf("  bf16 parts K=%d T=%d: y[%d][%d] = %.9g, want %.9g (tol %.3g)\n", K, T, t, r0 + r, g, ref[i], tol);
            }
    }
    CHECK(bad == 0, "bf16 parts K=%d T=%d: %lld elements off the CPU", K, T, (long long)bad);
    cudaFree(ya), cudaFree(yb);
    free(a), free(b), free(ref), free(sabs);
}

/* The GLU (W = gate | up, 2F rows, biases) with the norm folded in. */
static void check_bf16_glu(const NormCase *c, const Bf16Mat *m) {
    const int T = c->T, F = m->M / 2, K = c->K;
    const int64_t n = (int64_t)T * F;
    void *ya = poisoned(n * 2), *yb = poisoned(n * 2);
    CHECK(ya && yb, "alloc");
    if (!ya || !yb) return;
    test_gemv_glu(ya, m->d_w, c->d_xn, m->d_b, m->d_b + F, F, K, T);
    const RowNorm rn = row_norm(c);
    Err err = {{0}};
    CHECK(test_gemv_glu_norm(yb, m->d_w, &rn, m->d_b, m->d_b + F, F, K, T, &err) == 0, "bf16 GLU with the norm: %s",
          err.msg);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    double *ref = malloc((size_t)T * m->M * 8), *sabs = malloc((size_t)T * m->M * 8);
    read_bf16(a, ya, n), read_bf16(b, yb, n);
    CHECK(bits_differ(b, a, n) == 0, "bf16 GLU K=%d T=%d: %lld of %lld differ from add_rmsnorm + GEMV", K, T,
          (long long)bits_differ(b, a, n), (long long)n);
    ref_products(m, c->xn, T, true, ref, sabs);
    int64_t bad = 0;
    for (int t = 0; t < T; t++)
        for (int f = 0; f < F; f++) {
            const int64_t gi = (int64_t)t * m->M + f, ui = gi + F;
            const double gv = ref[gi], uv = ref[ui], sg = gv / (1.0 + exp(-gv)), want = sg * uv;
            const double tg = ldexp(sabs[gi], -10), tu = ldexp(sabs[ui], -10);
            const double tol = ldexp(fabs(want), -8) + 1.1 * fabs(uv) * tg + (fabs(sg) + tg) * tu + 1e-6 * fabs(want);
            const double got = b[(int64_t)t * F + f];
            if (!(fabs(got - want) <= tol) && bad++ < 5)
                printf("  bf16 GLU K=%d T=%d: out[%d][%d] = %.9g, want %.9g (tol %.3g)\n", K, T, t, f, got, want, tol);
        }
    CHECK(bad == 0, "bf16 GLU K=%d T=%d: %lld elements off the CPU", K, T, (long long)bad);
    cudaFree(ya), cudaFree(yb);
    free(a), free(b), free(ref), free(sabs);
}

static void test_bf16_fold(void) {
    const int Ks[] = {4096, 4104, 264, 8192};
    for (int ki = 0; ki < (quick ? 2 : 4); ki++) {
        const int K = Ks[ki];
        Bf16Mat m;
        CHECK(bf16_mat(&m, K == 8192 ? 334 : 2 * 301, K) == 0, "matrix");
        for (int T = 1; T <= MAX_T; T++) {
            if (skip_t(T)) continue;
            NormCase c;
            CHECK(norm_case(&c, T, K, (T + ki) % 2 ? 1.0f : 0.0f) == 0, "case K=%d T=%d", K, T);
            const RowNorm rn = row_norm(&c);
            CHECK(test_gemv_norm_takes(m.d_w, &rn, K, T), "the fold takes K=%d T=%d", K, T);
            check_bf16_parts(&c, &m);
            check_bf16_glu(&c, &m);
            norm_case_free(&c);
        }
        printf("# bf16 K=%d: parts and GLU with the norm folded in, T = 1..%d\n", K, MAX_T);
        bf16_mat_free(&m);
    }
}

/* Shapes and pointers the bf16 fold refuses (the backend runs add_rmsnorm and the plain GEMV there). */
static void test_bf16_refused(void) {
    Bf16Mat m;
    CHECK(bf16_mat(&m, 64, 8200) == 0, "matrix");
    NormCase c;
    CHECK(norm_case(&c, 2, 8200, 0.0f) == 0, "case");
    RowNorm rn = row_norm(&c);
    Err err = {{0}};
    GemvOut o = gemv_out_one(c.d_xn, false, NULL, 64);
    CHECK(!test_gemv_norm_takes(m.d_w, &rn, 8200, 2), "K = 8200 (3 groups a norm thread) refused");
    CHECK(test_gemv_parts_norm(&o, m.d_w, &rn, 64, 8200, 2, &err) == -1 && strstr(err.msg, "8192"),
          "K = 8200: '%s'", err.msg);
    CHECK(!test_gemv_norm_takes(m.d_w, &rn, 4100, 2), "K = 4100 (not a multiple of 8) refused");
    CHECK(!test_gemv_norm_takes(m.d_w, &rn, 4096, 9), "T = 9 refused");
    rn.x = c.d_res + 1;
    CHECK(!test_gemv_norm_takes(m.d_w, &rn, 4096, 1), "a misaligned residual refused");
    norm_case_free(&c);
    bf16_mat_free(&m);
}

/* GemvOut.add (matmul_add on the bf16 route): y = y0 + bf16(W x + b), bit for bit. */
static void test_bf16_add(void) {
    const int M = 333, K = 1032;
    Bf16Mat m;
    CHECK(bf16_mat(&m, M, K) == 0, "matrix");
    for (int T = 1; T <= MAX_T; T++) {
        if (skip_t(T)) continue;
        const int64_t n = (int64_t)T * M;
        uint16_t *xh = malloc((size_t)T * K * 2);
        float *y0 = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
        for (int64_t i = 0; i < (int64_t)T * K; i++) xh[i] = fp32_to_bf16(frand());
        void *dx = NULL, *dz = poisoned(n * 2);
        float *dy = NULL;
        for (int64_t i = 0; i < n; i++) y0[i] = 100.0f * frand();
        int rc = !dz || cudaMalloc(&dx, (size_t)T * K * 2) || cudaMalloc((void **)&dy, n * 4) ||
                 cudaMemcpy(dx, xh, (size_t)T * K * 2, cudaMemcpyHostToDevice) ||
                 cudaMemcpy(dy, y0, n * 4, cudaMemcpyHostToDevice);
        CHECK(!rc, "setup");
        GemvOut plain = gemv_out_one(dz, false, m.d_b, M), add = gemv_out_one(dy, true, m.d_b, M);
        add.add = true;
        test_gemv_parts(&plain, m.d_w, dx, M, K, T);
        test_gemv_parts(&add, m.d_w, dx, M, K, T);
        read_bf16(z, dz, n);
        rc = rc || cudaDeviceSynchronize() || cudaMemcpy(y, dy, n * 4, cudaMemcpyDeviceToHost);
        int64_t bad = 0;
        for (int64_t i = 0; !rc && i < n; i++) {
            const float want = y0[i] + z[i]; /* one fp32 add of the bf16 output, as add_rmsnorm's */
            if (memcmp(&want, &y[i], 4) && bad++ < 5) printf("  add T=%d: y[%lld] = %.9g, want %.9g\n", T, (long long)i, y[i], want);
        }
        CHECK(!rc && bad == 0, "bf16 GEMV with the residual add T=%d: %lld elements off", T, (long long)bad);
        cudaFree(dx), cudaFree(dy), cudaFree(dz);
        free(xh), free(y0), free(y), free(z);
    }
    bf16_mat_free(&m);
}

/* ---- FP8 ---- */

typedef struct {
    int64_t rows, cols;
    uint8_t *codes;   /* host [rows][cols] */
    float *scale;     /* host [rows] */
    void *buf;
    QuantMatrix m;
} F8Mat;

static int f8_build(F8Mat *M, int64_t rows, int64_t cols, float input_scale) {
    memset(M, 0, sizeof *M);
    M->rows = rows, M->cols = cols;
    M->codes = malloc((size_t)rows * cols), M->scale = malloc((size_t)rows * 4);
    for (int64_t i = 0; i < rows * cols; i++) {
        uint8_t c;
        do c = (uint8_t)rnd64(); while ((c & 0x7f) == 0x7f || (c & 0x78) > 0x50); /* finite, |w| <= 2^3 */
        M->codes[i] = c;
    }
    for (int64_t r = 0; r < rows; r++) M->scale[r] = ldexpf(1.0f + 0.5f * frand(), -(int)(8 + rnd64() % 3));
    size_t bytes = 0;
    Err err = {{0}};
    if (quant_matrix_bytes(DT_F8_E4M3, rows, cols, &bytes, &err) || cudaMalloc(&M->buf, bytes) ||
        quant_matrix_init(&M->m, DT_F8_E4M3, rows, cols, M->buf, &err))
        return -1;
    M->m.input_scale = input_scale;
    return cudaMemcpy(M->m.qs, M->codes, (size_t)rows * cols, cudaMemcpyHostToDevice) ||
                   cudaMemcpy(M->m.sc, M->scale, (size_t)rows * 4, cudaMemcpyHostToDevice)
               ? -1
               : 0;
}

static void f8_free(F8Mat *M) { free(M->codes), free(M->scale), cudaFree(M->buf); }

/* ref [T][rows] = a_scale x scale x codes(W) . codes(xn), xn quantized as base/dtype.c does. */
static void f8_ref(const F8Mat *M, const NormCase *c, double *ref) {
    const int64_t K = M->cols;
    uint8_t *xc = malloc((size_t)K);
    for (int t = 0; t < c->T; t++) {
        const float *row = c->xn + (int64_t)t * K;
        float as = M->m.input_scale;
        if (as > 0) for (int64_t k = 0; k < K; k++) xc[k] = fp32_to_e4m3(row[k] / as);
        else fp8_quantize_row(row, (int)K, xc, &as);
        for (int64_t r = 0; r < M->rows; r++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)e4m3_to_fp32(M->codes[r * K + k]) * e4m3_to_fp32(xc[k]);
            ref[(int64_t)t * M->rows + r] = (double)(as * M->scale[r]) * s;
        }
    }
    free(xc);
}

static double rel_l2(const float *got, const double *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
    return num != num ? INFINITY : sqrt(num / (den > 0 ? den : 1));
}

/* fp8_gemv (two parts) and fp8_gemv_glu with the norm folded in: bits against add_rmsnorm + the same GEMV,
 * the CPU within a relative L2 error of 1e-2. */
static void check_fp8(const NormCase *c, const F8Mat *M) {
    const int T = c->T;
    const int64_t R = M->rows, F = R / 2, n = (int64_t)T * R, nf = (int64_t)T * F;
    void *ya = poisoned(n * 2), *yb = poisoned(n * 2), *ga = poisoned(nf * 2), *gb = poisoned(nf * 2);
    CHECK(ya && yb && ga && gb, "alloc");
    if (!ya || !yb || !ga || !gb) return;
    const int64_t h = R / 3;
    GemvOut oa = {{ya, (char *)ya + T * h * 2, (char *)ya + T * h * 2}, {NULL, NULL, NULL}, {h, R, R}, false, false};
    GemvOut ob = oa;
    ob.y[0] = yb, ob.y[1] = ob.y[2] = (char *)yb + T * h * 2;
    const RowNorm rn = row_norm(c);
    Err err = {{0}};
    const char *kind = M->m.input_scale > 0 ? "static" : "dynamic";
    CHECK(fp8_gemv_norm_takes(&M->m, &rn, false, T) && fp8_gemv_norm_takes(&M->m, &rn, true, T) == (M->cols <= 4096),
          "fp8 takes K=%lld T=%d", (long long)M->cols, T);
    int rc = fp8_gemv(&M->m, c->d_xn, NULL, &oa, T, 0, &err) || fp8_gemv(&M->m, NULL, &rn, &ob, T, 0, &err);
    CHECK(!rc, "fp8_gemv with the norm K=%lld T=%d: %s", (long long)M->cols, T, err.msg);
    float *a = malloc(n * 4), *b = malloc(n * 4), *got = malloc(n * 4);
    double *ref = malloc(n * 8), *want = malloc(n * 8);
    read_bf16(a, ya, n), read_bf16(b, yb, n);
    CHECK(bits_differ(b, a, n) == 0, "fp8 %s K=%lld T=%d: %lld of %lld differ from add_rmsnorm + GEMV", kind,
          (long long)M->cols, T, (long long)bits_differ(b, a, n), (long long)n);
    f8_ref(M, c, ref);
    for (int t = 0; t < T; t++) /* b in parts: rows [0, h) then [h, R) */
        for (int64_t r = 0; r < R; r++) got[t * R + r] = r < h ? b[t * h + r] : b[T * h + t * (R - h) + (r - h)];
    const double e = rel_l2(got, ref, n);
    CHECK(e <= 1e-2, "fp8 %s K=%lld T=%d: rel err %.3g against the CPU", kind, (long long)M->cols, T, e);
    if (M->cols <= 4096) { /* the GLU's fold holds one group a norm thread */
        rc = fp8_gemv_glu(&M->m, c->d_xn, NULL, ga, NULL, NULL, ACT_SILU, 0.0f, T, 0, &err) ||
             fp8_gemv_glu(&M->m, NULL, &rn, gb, NULL, NULL, ACT_SILU, 0.0f, T, 0, &err);
        CHECK(!rc, "fp8_gemv_glu with the norm K=%lld T=%d: %s", (long long)M->cols, T, err.msg);
        read_bf16(a, ga, nf), read_bf16(b, gb, nf);
        CHECK(bits_differ(b, a, nf) == 0, "fp8 GLU %s K=%lld T=%d: %lld of %lld differ from add_rmsnorm + GEMV", kind,
              (long long)M->cols, T, (long long)bits_differ(b, a, nf), (long long)nf);
        for (int t = 0; t < T; t++)
            for (int64_t f = 0; f < F; f++) {
                const double g = ref[t * R + f], u = ref[t * R + F + f];
                want[t * F + f] = g / (1.0 + exp(-g)) * u;
            }
        const double eg = rel_l2(b, want, nf);
        CHECK(eg <= 1e-2, "fp8 GLU %s K=%lld T=%d: rel err %.3g against the CPU", kind, (long long)M->cols, T, eg);
    }
    cudaFree(ya), cudaFree(yb), cudaFree(ga), cudaFree(gb);
    free(a), free(b), free(got), free(ref), free(want);
}

static void test_fp8_fold(void) {
    const int Ks[] = {4096, 4112, 272, 8192};
    for (int ki = 0; ki < (quick ? 2 : 4); ki++)
        for (int dyn = 0; dyn < 2; dyn++) {
            const int K = Ks[ki];
            F8Mat M;
            CHECK(f8_build(&M, K == 8192 ? 166 : 2 * 151, K, dyn ? 0.0f : 0.01f) == 0, "matrix");
            for (int T = 1; T <= MAX_T; T++) {
                if (skip_t(T)) continue;
                NormCase c;
                CHECK(norm_case(&c, T, K, (T + ki) % 2 ? 1.0f : 0.0f) == 0, "case K=%d T=%d", K, T);
                check_fp8(&c, &M);
                norm_case_free(&c);
            }
            printf("# fp8 K=%d %s scale: GEMV (parts) and GLU with the norm folded in, T = 1..%d\n", K,
                   dyn ? "dynamic" : "static", MAX_T);
            f8_free(&M);
        }
    F8Mat M; /* refused: a misaligned residual, K past 8192 (the GEMV) and 4096 (the GLU) */
    CHECK(f8_build(&M, 32, 8208, 0.0f) == 0, "matrix");
    NormCase c;
    CHECK(norm_case(&c, 1, 8208, 0.0f) == 0, "case");
    RowNorm rn = row_norm(&c);
    GemvOut o = gemv_out_one(c.d_xn, false, NULL, 32);
    Err err = {{0}};
    CHECK(!fp8_gemv_norm_takes(&M.m, &rn, false, 1) && fp8_gemv(&M.m, NULL, &rn, &o, 1, 0, &err) == -1 &&
              strstr(err.msg, "8192"), "K = 8208: '%s'", err.msg);
    rn.x = c.d_res + 1;
    M.m.cols = 4096;
    CHECK(!fp8_gemv_norm_takes(&M.m, &rn, false, 1) && fp8_gemv(&M.m, NULL, &rn, &o, 1, 0, &err) == -1 &&
              strstr(err.msg, "aligned"), "misaligned residual: '%s'", err.msg);
    norm_case_free(&c);
    f8_free(&M);
}

int main(int argc, char **argv) {
    quick = argc > 1 && !strcmp(argv[1], "--quick");
    RUN(test_bf16_fold);
    RUN(test_bf16_refused);
    RUN(test_bf16_add);
    RUN(test_fp8_fold);
    return test_failed_tests ? 1 : 0;
}
