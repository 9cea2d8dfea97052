/* test_quant_gemm.c — the prefill GEMM on quantized weights
 * (kernels/cuda/quant_gemm.cu: W's tiles dequantized in registers, wgmma)
 * against the CPU: run on a GPU machine by tests/gpu/run.sh; never in CI.
 *
 *   - Q4_K, Q5_K, Q6_K and Q8_0 matrices of random GGUF blocks (quant_mats.h)
 *     times random bf16 x, T = 9 .. 512 rows (tails of the tiles), 16, 32,
 *     64, 128 and 256 tokens per block, bf16 and fp32 y. Reference: the
 *     block fields through the kernel's bf16 operations, each rounding
 *     emulated exactly (ref_row), products summed in double.
 *     Every checked element: |y - ref| <= 1e-4 * sum |w x| (+ half a bf16
 *     step of |ref| for bf16 y): the kernel's error is fp32 summation only,
 *     and a misplaced k or row moves an element by ~1e-2 of that sum.
 *     y is NaN-poisoned before each launch and every element must be
 *     written; a guard after y must stay untouched (tails not stored); a
 *     few cases with y 2 bytes off 16-byte alignment (bf16 y is stored
 *     through shared memory in 16-byte pieces, an unaligned y element by
 *     element). K is split as quant_gemm picks for the shape (up to one
 *     split a turn of 4 stages on the small ones; 256-token tiles where two
 *     splits a tile fit in a wave), or in 3 uneven splits (16384 rows at T =
 *     300 in 64- and 128-token tiles: more tiles than SMs, unsplit, two
 *     blocks an SM), all cases through one work space (a counter left
 *     non-zero would break the next case's reduction).
 *   - the epilogues (quant_gemm_epi: q, k, v parts with biases; the gated
 *     activation of Wgate|Wup) against the plain y of the same launch
 *     finished on the host (test_epilogues).
 *   - refusals: types and shapes it does not take, a bad tile size or split
 *     count, a missing or short work space.
 *   - timing (printed, never asserted; not with --quick): the four GEMMs of
 *     a Llama-3-8B layer at 512 and 2048 tokens, fused (128 and 256 tokens a
 *     block) against the route it replaces (dequantize to bf16, then
 *     cuBLASLt), as TFLOP/s; ANCHORS.md: cuBLAS bf16 at 711 TFLOP/s. */
#include <cublasLt.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/quant.cuh"
#include "tests/gpu/quant_mats.h"
#include "tests/gpu/time_launch.h"
#include "tests/test.h"

#define GUARD 4096 /* bytes after y that must stay untouched */

typedef struct {
    int64_t rows_chk[256];
    int n_chk;
    float *w; /* [n_chk][cols]: the checked rows as the kernel's A operand holds them (ref_row) */
} Ref;

/* v exact in a double, rounded to bf16 once (nearest, ties to even; bf16
 * keeps 8 significant bits, subnormal steps of 2^-133) */
static float bf16_round(double v) {
    if (v == 0 || !isfinite(v)) return (float)v;
    int e;
    frexp(v, &e);
    int sh = e - 8 < -133 ? -133 : e - 8;
    return (float)ldexp(nearbyint(ldexp(v, -sh)), sh);
}

/* A row as the kernel makes its values (quant_gemm_mainloop.cuh qr_frags_bf16x2, q6k_frags_bf16x2): Q8_0
 * bf16(q bf16(d)); Q4_K fma(q, s, c) rounded once (a 4-bit q times an 8-bit
 * s plus an 8-bit c: exact in a double), s = bf16(scale bf16(d)), c =
 * bf16(min bf16(-dmin)). */
static void ref_row(DType t, const uint8_t *b, float *w, int64_t cols) {
    for (int64_t i0 = 0; i0 < cols; i0 += t == DT_Q8_0 ? 32 : 256) {
        if (t == DT_Q6_K) { /* (q - 32) s rounded once, s = bf16(sc bf16(d)) */
            double d = bf16_round(fp16_to_fp32((uint16_t)(b[208] | b[209] << 8)));
            for (int i = 0; i < 256; i++) {
                int h = i / 128, j = (i / 32) % 4, l = i % 32;
                int lo = (b[h * 64 + (j % 2) * 32 + l] >> (4 * (j / 2))) & 15, hi = (b[128 + h * 32 + l] >> (2 * j)) & 3;
                double s = bf16_round((int8_t)b[192 + i / 16] * d);
                w[i0 + i] = bf16_round(((lo | hi << 4) - 32) * s);
            }
            b += 210;
            continue;
        }
        if (t == DT_Q8_0) {
            float d = bf16_round(fp16_to_fp32((uint16_t)(b[0] | b[1] << 8)));
            for (int i = 0; i < 32; i++) w[i0 + i] = bf16_round((double)(int8_t)b[2 + i] * d);
            b += 34;
            continue;
        }
        double d = bf16_round(fp16_to_fp32((uint16_t)(b[0] | b[1] << 8)));
        double nmin = bf16_round(-fp16_to_fp32((uint16_t)(b[2] | b[3] << 8)));
        const bool q5 = t == DT_Q5_K; /* Q5_K: qh[32] before the codes, the fifth bit k of qh[l] */
        for (int k = 0; k < 8; k++) {
            int sc, m;
            kquant_scale_min(b + 4, k, &sc, &m);
            double s = bf16_round(sc * d), c = bf16_round(m * nmin);
            for (int l = 0; l < 32; l++) {
                int q = (b[(q5 ? 48 : 16) + 32 * (k / 2) + l] >> 4 * (k % 2)) & 15;
                if (q5) q |= ((b[16 + l] >> k) & 1) << 4;
                w[i0 + 32 * k + l] = bf16_round(q * s + c);
            }
        }
        b += q5 ? 176 : 144;
    }
}

static void ref_build(Ref *R, const Mat *M) {
    R->n_chk = quant_check_rows(M->rows, R->rows_chk, 256);
    R->w = malloc((size_t)R->n_chk * M->cols * sizeof *R->w);
    int64_t row_bytes = (int64_t)dtype_row_bytes(M->type, M->cols);
    for (int j = 0; j < R->n_chk; j++)
        ref_row(M->type, M->native + R->rows_chk[j] * row_bytes, R->w + (int64_t)j * M->cols, M->cols);
}

/* One launch; returns the worst |y - ref| / sum |w x| (INFINITY on a failure). */
static double gemm_case(const Mat *M, const Ref *R, int T, int bn, bool y_f32, int y_shift, int splits,
                        const QuantGemmWork *work) {
    Err err = {{0}};
    int64_t rows = M->rows, cols = M->cols;
    const char *name = dtype_info(M->type)->name;
    uint16_t *xb = malloc((size_t)T * cols * 2);
    for (int64_t i = 0; i < T * cols; i++) xb[i] = fp32_to_bf16(frand());
    size_t ysz = (size_t)T * rows * (y_f32 ? 4 : 2);
    void *dx = NULL, *dy0 = NULL;
    uint8_t *y = malloc(ysz + GUARD);
    int rc = cudaMalloc(&dx, (size_t)T * cols * 2) || cudaMalloc(&dy0, ysz + GUARD + 16);
    void *dy = (uint8_t *)dy0 + y_shift; /* y_shift 2: y not 16-byte aligned (stored element by element) */
    rc = rc || cudaMemcpy(dx, xb, (size_t)T * cols * 2, cudaMemcpyHostToDevice);
    rc = rc || cudaMemset(dy, 0xff, ysz) || cudaMemset((uint8_t *)dy + ysz, 0x5a, GUARD); /* NaN poison, guard */
    rc = rc || quant_gemm(&M->m, dx, T, dy, y_f32, bn, splits, work, 0, &err);
    rc = rc || cudaDeviceSynchronize() || cudaMemcpy(y, dy, ysz + GUARD, cudaMemcpyDeviceToHost);
    CHECK(!rc, "%s [%lld][%lld] T=%d bn=%d splits %d: launch failed: %s (cuda %d)", name, (long long)rows,
          (long long)cols, T, bn, splits, err.msg, rc);
    double worst = rc ? INFINITY : 0;
    int64_t unwritten = 0, guard_hit = 0, over = 0;
    for (int64_t i = 0; !rc && i < T * rows; i++)
        unwritten += !isfinite(y_f32 ? ((float *)y)[i] : bf16_to_fp32(((uint16_t *)y)[i]));
    for (size_t i = 0; !rc && i < GUARD; i++) guard_hit += y[ysz + i] != 0x5a;
    for (int j = 0; !rc && j < R->n_chk; j++) {
        const float *w = R->w + (int64_t)j * cols;
        for (int t = 0; t < T; t++) {
            double ref = 0, abs_sum = 0;
            for (int64_t c = 0; c < cols; c++) {
                double p = (double)w[c] * bf16_to_fp32(xb[t * cols + c]);
                ref += p;
                abs_sum += fabs(p);
            }
            int64_t i = t * rows + R->rows_chk[j];
            double v = y_f32 ? ((float *)y)[i] : bf16_to_fp32(((uint16_t *)y)[i]);
            double d = fabs(v - ref), tol = 1e-4 * abs_sum + (y_f32 ? 0 : fabs(ref) / 256) + 1e-30;
            if (!(d <= tol) && over++ < 3)
                printf("  %s [%lld][%lld] T=%d bn=%d: y[%d][%lld] = %.7g, reference %.7g (sum |w x| %.4g)\n",
                       name, (long long)rows, (long long)cols, T, bn, t, (long long)R->rows_chk[j], v, ref, abs_sum);
            double e = abs_sum > 0 ? d / abs_sum : d;
            if (!(e <= worst)) worst = e; /* a NaN sticks */
        }
    }
    CHECK(unwritten == 0, "%s [%lld][%lld] T=%d bn=%d: %lld outputs not written", name, (long long)rows,
          (long long)cols, T, bn, (long long)unwritten);
    CHECK(guard_hit == 0, "%s [%lld][%lld] T=%d bn=%d: %lld bytes written past y", name, (long long)rows,
          (long long)cols, T, bn, (long long)guard_hit);
    CHECK(over == 0, "%s [%lld][%lld] T=%d bn=%d splits %d y %s: %lld elements over the bound", name,
          (long long)rows, (long long)cols, T, bn, splits, y_f32 ? "f32" : "bf16", (long long)over);
    free(xb); free(y);
    cudaFree(dx); cudaFree(dy0);
    return worst;
}

typedef struct {
    DType type;
    int64_t rows, cols;
    int Ts[5];
} Shape;

static void test_quant_gemm(void) {
    CHECK(quant_gemm_available(), "quant_gemm not available: an sm_90a build on a compute-capability 9.0 GPU?");
    if (!quant_gemm_available()) return;
    /* split K: one work space for every case (its counters must come back to 0 after each) */
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    QuantGemmWork work = {NULL, quant_gemm_work_bytes(sms)};
    CHECK(cudaMalloc(&work.buf, work.bytes) == 0 && cudaMemset(work.buf, 0, work.bytes) == 0, "work space");
    const Shape shapes[] = {
        {DT_Q8_0, 128, 256, {9, 100, 128, 129, 300}},  {DT_Q8_0, 256, 512, {17, 127, 256, 257, 0}},
        {DT_Q8_0, 384, 1024, {64, 200, 0}},            {DT_Q8_0, 4096, 4096, {512, 0}},
        {DT_Q8_0, 8192, 1024, {600, 0}},
        {DT_Q4_K, 128, 256, {9, 100, 128, 129, 300}},  {DT_Q4_K, 256, 512, {17, 127, 256, 257, 0}},
        {DT_Q4_K, 384, 1280, {64, 200, 0}},            {DT_Q4_K, 1024, 14336, {200, 0}},
        {DT_Q4_K, 4096, 4096, {512, 0}},               {DT_Q4_K, 8192, 1024, {600, 0}},
        {DT_Q4_K, 16384, 512, {300, 0}},               {DT_Q8_0, 16384, 512, {300, 0}}, /* 2 blocks an SM */
        {DT_Q6_K, 128, 256, {9, 100, 128, 129, 300}},  {DT_Q6_K, 256, 512, {17, 127, 256, 257, 0}},
        {DT_Q6_K, 384, 1280, {64, 200, 0}},            {DT_Q6_K, 4096, 4096, {512, 0}},
        {DT_Q5_K, 128, 256, {9, 100, 128, 129, 300}},  {DT_Q5_K, 256, 512, {17, 127, 256, 257, 0}},
        {DT_Q5_K, 384, 1280, {64, 200, 0}},            {DT_Q5_K, 4096, 4096, {512, 0}},
    };
    const char *only = getenv("CLLM_QGEMM_ROWS"); /* a quick look at one shape's rows: CLLM_QGEMM_ROWS=8192 */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const Shape *sh = &shapes[s];
        if (only && sh->rows != atoll(only)) continue;
        Mat M;
        if (mat_build(&M, sh->type, sh->rows, sh->cols)) continue;
        Ref R;
        ref_build(&R, &M);
        double worst = 0;
        int n = 0;
        int turns = (int)(sh->cols / 256);
        for (int i = 0; i < 5 && sh->Ts[i]; i++)
            for (int b = 0; b < 5; b++) { /* tokens a block: 16 .. 256 */
                int bn = 16 << b;
                bool y_f32 = (i + b) % 2;
                int shift = !y_f32 && i == 1 && sh->rows <= 384 ? 2 : 0;
                /* K split as quant_gemm picks (0: every tile of a GEMM of fewer tiles than SMs, or, at 132
                 * SMs, the tiles of the last partial wave: 8192 rows at T = 600 split 60 of 192 tiles of 256
                 * tokens in 2, 28 of 1216 of 32 in 4), and by 3 where that is uneven over the turns */
                int splits = i == 1 && turns > 3 ? 3 : 0;
                double e = gemm_case(&M, &R, sh->Ts[i], bn, y_f32, shift, splits, &work);
                if (y_f32 && !(e <= worst)) worst = e; /* bf16 y: its own rounding dominates */
                n++;
            }
        printf("# quant_gemm %-5s [%5lld][%5lld] %d cases, worst fp32 |y - ref| / sum |w x| %.2e\n",
               dtype_info(sh->type)->name, (long long)sh->rows, (long long)sh->cols, n, worst);
        free(R.w);
        mat_free(&M);
    }
    cudaFree(work.buf);
}

/* The epilogues of quant_gemm_epi against the plain y of the same launch shape, finished on the host as
 * the QKV split and GLU kernels finish it. Parts: bit for bit (one fp32 add and one rounding, the same
 * on both). GLU: within one bf16 step of the host's cpu_glu (the GPU's expf / tanhf differ from the
 * host's in the last fp32 bits), plus 2^-20 |gate x up| for GELU's 1 + tanh, which cancels to ~1e-6 of it
 * for gates below -3 (the last bits of tanhf then move the output by percents); where the default split of K takes the last partial wave's tiles, a
 * gated pair's tiles are not the plain GEMM's tiles (their gate rows may be split where the plain ones
 * are whole: other fp32 sums, so gate and up may each round a bf16 step apart), so those cases get 2^-5 of
 * the value and 2^-5 of the output's mean magnitude (a misplaced row or token is off by about the mean). Outputs
 * NaN-poisoned (each must be written) with a guard after. */
static int epi_fetch(void *h, const void *d, size_t n) {
    return cudaDeviceSynchronize() || cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
}

static void epi_case(const Mat *M, int T, int bn, int splits, Activation act, bool bias, bool loose,
                     const QuantGemmWork *work) {
    Err err = {{0}};
    const int64_t rows = M->rows, cols = M->cols, F = rows / 2;
    const char *name = dtype_info(M->type)->name;
    uint16_t *xb = malloc((size_t)T * cols * 2), *y = malloc((size_t)T * rows * 2);
    uint16_t *h = malloc((size_t)T * rows * 2 + GUARD);
    float *b = malloc((size_t)rows * 4), *g = malloc((size_t)T * F * 4), *u = malloc((size_t)T * F * 4);
    float *o = malloc((size_t)T * F * 4);
    for (int64_t i = 0; i < T * cols; i++) xb[i] = fp32_to_bf16(frand());
    for (int64_t i = 0; i < rows; i++) b[i] = frand();
    void *dx = NULL, *dy = NULL, *dh = NULL, *db = NULL;
    int rc = cudaMalloc(&dx, (size_t)T * cols * 2) || cudaMalloc(&dy, (size_t)T * rows * 2) ||
             cudaMalloc(&dh, (size_t)T * rows * 2 + GUARD) || cudaMalloc(&db, (size_t)rows * 4);
    rc = rc || cudaMemcpy(dx, xb, (size_t)T * cols * 2, cudaMemcpyHostToDevice) ||
         cudaMemcpy(db, b, (size_t)rows * 4, cudaMemcpyHostToDevice);
    rc = rc || quant_gemm(&M->m, dx, T, dy, false, bn, splits, work, 0, &err) ||
         epi_fetch(y, dy, (size_t)T * rows * 2);
    /* gated: bg = b[0 .. F), bu = b[F .. 2F) */
    const float *bg = bias ? (float *)db : NULL, *bu = bias ? (float *)db + F : NULL;
    QuantGemmEpi ge = {NULL, true, dh, bg, bu, act, 7.0f};
    rc = rc || cudaMemset(dh, 0xff, (size_t)T * F * 2) || cudaMemset((uint8_t *)dh + T * F * 2, 0x5a, GUARD);
    rc = rc || quant_gemm_epi(&M->m, dx, T, &ge, bn, splits, work, 0, &err) ||
         epi_fetch(h, dh, (size_t)T * F * 2 + GUARD);
    CHECK(!rc, "%s [%lld][%lld] T=%d bn=%d splits %d glu: %s (cuda %d)", name, (long long)rows, (long long)cols, T,
          bn, splits, err.msg, rc);
    double mean = 0;
    int64_t bad = 0, guard_hit = 0;
    for (int t = 0; !rc && t < T; t++)
        for (int64_t i = 0; i < F; i++) {
            g[t * F + i] = bf16_to_fp32(y[t * rows + i]) + (bias ? b[i] : 0.0f);
            u[t * F + i] = bf16_to_fp32(y[t * rows + F + i]) + (bias ? b[F + i] : 0.0f);
        }
    if (!rc) cpu_glu(o, g, u, T * F, act, 7.0f);
    for (int64_t i = 0; !rc && i < T * F; i++) mean += fabs(bf16_to_fp32(fp32_to_bf16(o[i]))) / (double)(T * F);
    for (int64_t i = 0; !rc && i < T * F; i++) {
        double r = bf16_to_fp32(fp32_to_bf16(o[i])), v = bf16_to_fp32(h[i]);
        double tol = fabs(r) / (loose ? 32 : 128) + (act == ACT_GELU_TANH ? 0x1p-20 * fabs((double)g[i] * u[i]) : 0) +
                     (loose ? mean / 32 : 1e-30);
        if (!(fabs(v - r) <= tol) && bad++ < 3)
            printf("  %s [%lld][%lld] T=%d bn=%d splits %d act %d: out[%lld][%lld] = %.6g, host %.6g\n", name,
                   (long long)rows, (long long)cols, T, bn, splits, (int)act, (long long)(i / F), (long long)(i % F), v, r);
    }
    for (size_t i = 0; !rc && i < GUARD; i++) guard_hit += ((uint8_t *)h)[T * F * 2 + i] != 0x5a;
    CHECK(bad == 0 && guard_hit == 0, "%s [%lld][%lld] T=%d bn=%d splits %d glu: %lld outputs off, %lld guard bytes hit",
          name, (long long)rows, (long long)cols, T, bn, splits, (long long)bad, (long long)guard_hit);
    /* parts: ends multiples of 8 that cut tiles (rows 136 and 264 of a 384-row W), biases on parts 0 and 2 */
    const int64_t e0 = rows / 3 / 8 * 8 + 8, e1 = 2 * rows / 3 / 8 * 8 + 8;
    uint16_t *dp = dh;
    GemvOut po = {{dp, dp + T * e0, dp + T * e1}, {bias ? (float *)db : NULL, NULL, bias ? (float *)db + e1 : NULL},
                  {e0, e1, rows}, false, false};
    QuantGemmEpi pe = {&po, false, NULL, NULL, NULL, ACT_SILU, 0.0f};
    err.msg[0] = 0;
    rc = rc || cudaMemset(dh, 0xff, (size_t)T * rows * 2) || cudaMemset((uint8_t *)dh + T * rows * 2, 0x5a, GUARD);
    rc = rc || quant_gemm_epi(&M->m, dx, T, &pe, bn, splits, work, 0, &err) ||
         epi_fetch(h, dh, (size_t)T * rows * 2 + GUARD);
    CHECK(!rc, "%s [%lld][%lld] T=%d parts: %s (cuda %d)", name, (long long)rows, (long long)cols, T, err.msg, rc);
    bad = guard_hit = 0;
    for (int t = 0; !rc && t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            int p = r < e0 ? 0 : r < e1 ? 1 : 2;
            int64_t r0 = p == 0 ? 0 : p == 1 ? e0 : e1, n = (p == 0 ? e0 : p == 1 ? e1 : rows) - r0;
            float v = bf16_to_fp32(y[t * rows + r]);
            uint16_t want = bias && p != 1 ? fp32_to_bf16(v + b[r]) : y[t * rows + r];
            uint16_t got = h[T * r0 + t * n + r - r0];
            if (got != want && bad++ < 3)
                printf("  %s T=%d parts: part %d [%d][%lld] = %#x, want %#x\n", name, T, p, t, (long long)(r - r0), got, want);
        }
    for (size_t i = 0; !rc && i < GUARD; i++) guard_hit += ((uint8_t *)h)[T * rows * 2 + i] != 0x5a;
    CHECK(bad == 0 && guard_hit == 0, "%s [%lld][%lld] T=%d bn=%d splits %d parts: %lld values differ, %lld guard bytes hit",
          name, (long long)rows, (long long)cols, T, bn, splits, (long long)bad, (long long)guard_hit);
    free(xb), free(y), free(h), free(b), free(g), free(u), free(o);
    cudaFree(dx), cudaFree(dy), cudaFree(dh), cudaFree(db);
}

static void test_epilogues(void) {
    if (!quant_gemm_available()) return;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    QuantGemmWork work = {NULL, quant_gemm_work_bytes(sms)};
    CHECK(cudaMalloc(&work.buf, work.bytes) == 0 && cudaMemset(work.buf, 0, work.bytes) == 0, "work space");
    const struct { DType type; int64_t rows, cols; int T, bn, splits; } cases[] = {
        {DT_Q4_K, 256, 512, 17, 0, 0},   {DT_Q4_K, 256, 512, 100, 128, 1}, {DT_Q4_K, 384, 1280, 257, 256, 0},
        {DT_Q4_K, 384, 1280, 200, 64, 3}, {DT_Q8_0, 384, 1024, 64, 0, 0},   {DT_Q8_0, 256, 512, 129, 256, 1},
        {DT_Q6_K, 256, 512, 129, 0, 0},   {DT_Q6_K, 384, 1280, 300, 128, 3}, {DT_Q5_K, 384, 1280, 200, 0, 0},
        {DT_Q5_K, 256, 512, 33, 32, 1},   {DT_Q4_K, 4096, 4096, 512, 0, 0},  {DT_Q4_K, 16384, 512, 300, 128, 1},
        {DT_Q8_0, 16384, 512, 300, 64, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Mat M;
        if (mat_build(&M, cases[i].type, cases[i].rows, cases[i].cols)) continue;
        epi_case(&M, cases[i].T, cases[i].bn, cases[i].splits, (Activation)(i % 3), i % 2 == 0, false, &work);
        mat_free(&M);
    }
    /* gate+up-shaped with the last partial wave split (192 tiles of 256 on 132 SMs) */
    Mat M;
    if (mat_build(&M, DT_Q4_K, 8192, 1024) == 0) {
        epi_case(&M, 600, 0, 0, ACT_SILU, false, sms < 192, &work);
        mat_free(&M);
    }
    if (mat_build(&M, DT_Q4_K, 384, 1280) == 0) { /* refusals */
        Err err = {{0}};
        uint16_t *d = NULL;
        cudaMalloc((void **)&d, 64 * 384 * 2 + 64);
        GemvOut po = {{d, d + 8 * 100, d + 8 * 200}, {NULL, NULL, NULL}, {100, 200, 384}, false, false};
        QuantGemmEpi pe = {&po, false, NULL, NULL, NULL, ACT_SILU, 0.0f}, both = {&po, true, d, NULL, NULL, ACT_SILU, 0};
        QuantGemmEpi ge = {NULL, true, (char *)d + 2, NULL, NULL, ACT_SILU, 0.0f};
        CHECK(!quant_gemm_epi_takes(&M.m, &pe) && quant_gemm_epi(&M.m, d, 8, &pe, 0, 0, &work, 0, &err) != 0 &&
                  strstr(err.msg, "part 0 ends at row 100"), "parts ending at 100: '%s'", err.msg);
        err.msg[0] = 0;
        CHECK(quant_gemm_epi(&M.m, d, 8, &both, 0, 0, &work, 0, &err) != 0 && strstr(err.msg, "one of"), "both: '%s'", err.msg);
        err.msg[0] = 0;
        CHECK(!quant_gemm_epi_takes(&M.m, &ge) && quant_gemm_epi(&M.m, d, 8, &ge, 0, 0, &work, 0, &err) != 0 &&
                  strstr(err.msg, "aligned"), "unaligned glu out: '%s'", err.msg);
        ge.out = d;
        const QuantMatrix q8_576 = {DT_Q8_0, 384, 576, M.m.qs, M.m.sc, 0.0f}; /* not a whole number of TMA boxes */
        err.msg[0] = 0;
        CHECK(quant_gemm_epi_takes(&M.m, &ge) && !quant_gemm_epi_takes(&q8_576, &ge) &&
                  quant_gemm_epi(&q8_576, d, 8, &ge, 128, 1, &work, 0, &err) != 0 && strstr(err.msg, "576"),
              "Q8_0 with 576 columns, glu: '%s'", err.msg);
        cudaFree(d);
        mat_free(&M);
    }
    cudaFree(work.buf);
}

static void test_refused(void) {
    Err err = {{0}};
    CHECK(!quant_gemm_supported(DT_Q4_0, 128, 256) && !quant_gemm_supported(DT_Q4_1, 128, 256) &&
              !quant_gemm_supported(DT_Q5_0, 128, 256) && !quant_gemm_supported(DT_Q5_1, 128, 256),
          "Q4_0, Q4_1, Q5_0 or Q5_1 taken (they go dequantize + cuBLASLt)");
    CHECK(!quant_gemm_supported(DT_Q4_K, 100, 256), "rows 100 taken");
    CHECK(!quant_gemm_supported(DT_Q4_K, 128, 128), "Q4_K cols 128 taken");
    /* W comes by TMA boxes: a Q8_0 scale plane's rows (cols / 16 bytes) must be 16-byte multiples */
    CHECK(!quant_gemm_supported(DT_Q8_0, 128, 32) && !quant_gemm_supported(DT_Q8_0, 128, 64) &&
              !quant_gemm_supported(DT_Q8_0, 128, 576), "Q8_0 cols 32, 64 or 576 taken");
    CHECK(quant_gemm_supported(DT_Q8_0, 128, 512) && quant_gemm_supported(DT_Q4_K, 4096, 14336), "shapes refused");
    CHECK(quant_gemm_supported(DT_Q6_K, 128, 256) && !quant_gemm_supported(DT_Q6_K, 128, 192), "Q6_K shapes");
    CHECK(quant_gemm_supported(DT_Q5_K, 128, 512), "Q5_K shapes");
    Mat M;
    if (mat_build(&M, DT_Q4_0, 128, 256)) return;
    CHECK(quant_gemm(&M.m, NULL, 4, NULL, false, 0, 0, NULL, 0, &err) != 0 && strstr(err.msg, "Q4_0"), "Q4_0: '%s'",
          err.msg);
    mat_free(&M);
    if (mat_build(&M, DT_Q5_0, 128, 256)) return;
    CHECK(quant_gemm(&M.m, NULL, 4, NULL, false, 0, 0, NULL, 0, &err) != 0 && strstr(err.msg, "Q5_0"), "Q5_0: '%s'",
          err.msg);
    mat_free(&M);
    if (mat_build(&M, DT_Q4_K, 128, 256)) return;
    void *dx = NULL, *dy = NULL;
    cudaMalloc(&dx, 64 * 256 * 2);
    cudaMalloc(&dy, 64 * 128 * 4);
    err.msg[0] = 0;
    CHECK(quant_gemm(&M.m, dx, 64, dy, true, 192, 0, NULL, 0, &err) != 0 && strstr(err.msg, "192"), "bn 192: '%s'",
          err.msg);
    CHECK(quant_gemm(&M.m, dx, 0, dy, true, 0, 0, NULL, 0, &err) == 0, "T = 0 must be a no-op");
    err.msg[0] = 0;
    CHECK(quant_gemm(&M.m, (char *)dx + 2, 4, dy, true, 0, 0, NULL, 0, &err) != 0 && strstr(err.msg, "aligned"),
          "unaligned x: '%s'", err.msg);
    mat_free(&M);
    if (mat_build(&M, DT_Q4_K, 128, 1024)) return; /* 4 turns of K */
    QuantGemmWork small = {dx, 1000};
    const struct { int bn, splits; const QuantGemmWork *w; const char *what; } bad[] = {
        {128, 2, NULL, "work space"}, {128, 2, &small, "work space"}, {256, 2, NULL, "work space"},
        {128, 5, NULL, "5 splits"},   {128, -1, NULL, "-1 splits"},   {48, 1, NULL, "tokens per block 48"},
        {32, 2, &small, "work space"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECK(quant_gemm(&M.m, dx, 64, dy, true, bad[i].bn, bad[i].splits, bad[i].w, 0, &err) != 0 &&
                  strstr(err.msg, bad[i].what),
              "bn %d %d splits: '%s'", bad[i].bn, bad[i].splits, err.msg);
    }
    err.msg[0] = 0; /* more split tiles than the work space has counters for (refused before any launch or read of x) */
    CHECK(quant_gemm(&M.m, dx, 20000, dy, true, 16, 2, &small, 0, &err) != 0 && strstr(err.msg, "tiles split"),
          "20000 rows in 16-token tiles, 2 splits: '%s'", err.msg);
    mat_free(&M);
    if (mat_build(&M, DT_Q8_0, 128, 576)) return;
    err.msg[0] = 0;
    CHECK(quant_gemm(&M.m, dx, 4, dy, true, 128, 0, NULL, 0, &err) != 0 && strstr(err.msg, "576"),
          "Q8_0 cols 576: '%s'", err.msg);
    mat_free(&M);
    cudaFree(dx); cudaFree(dy);
}

/* ---- timing: fused against dequantize + cuBLASLt ---- */

typedef struct {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
} Lt;

/* y[T][m] bf16 = x[T][k] @ W[m][k]^T on bf16 W, as the backend's gemm_lt */
static int lt_gemm(Lt *L, void *y, const void *x, const void *W, int m, int T, int k) {
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1, beta = 0;
    int ok = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
             cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, m, k) == 0 &&
             cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, T, k) == 0 &&
             cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, m, T, m) == 0 && cublasLtMatmulPreferenceCreate(&pref) == 0 &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &L->ws_bytes,
                                                  sizeof L->ws_bytes) == 0 &&
             cublasLtMatmulAlgoGetHeuristic(L->lt, desc, a, b, c, c, pref, 1, &h, &found) == 0 && found > 0 &&
             cublasLtMatmul(L->lt, desc, &alpha, W, a, x, b, &beta, y, c, y, c, &h.algo, L->ws, L->ws_bytes, 0) == 0;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a); cublasLtMatrixLayoutDestroy(b); cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
    return ok ? 0 : -1;
}

typedef struct {
    const Mat *M;
    Lt *L;
    void *x, *y, *wbf;
    int T, route; /* 0: dequantize alone, 1: cuBLASLt alone, 2 / 3: fused, bn 128 / 256 */
    int bn;       /* tokens a block for routes 2, 3 (0: the route's 128 / 256) */
    int splits;   /* quant_gemm's (0 without a work space: none) */
    const QuantGemmWork *work;
} Run;

static int run_once(Run *r) {
    Err err = {{0}};
    const QuantMatrix *W = &r->M->m;
    switch (r->route) {
    case 0: return quant_dequant_bf16(W, 0, W->rows, r->wbf, 0, &err);
    case 1: return lt_gemm(r->L, r->y, r->x, r->wbf, (int)W->rows, r->T, (int)W->cols);
    default:
        return quant_gemm(W, r->x, r->T, r->y, false, r->bn ? r->bn : r->route == 3 ? 256 : 128, r->splits, r->work, 0,
                          &err);
    }
}

static int run_once_v(void *r) { return run_once(r); }

/* us per launch: the median of 7 samples of 10 back-to-back launches */
static float time_us(Run *r) { return time_launch_us(run_once_v, r, 10); }

static void test_timing(void) {
    enum { NR = 4 }; /* Run.route */
    const int64_t shapes[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    const char *names[4] = {"qkv", "o", "gate+up", "down"};
    const DType types[2] = {DT_Q4_K, DT_Q8_0};
    const int Ts[2] = {512, 2048};
    Lt L = {0};
    L.ws_bytes = 32 << 20;
    void *x = NULL, *y = NULL, *wbf = NULL;
    int rc = cublasLtCreate(&L.lt) != 0 || cudaMalloc(&L.ws, L.ws_bytes) || cudaMalloc(&x, 2048 * 14336 * 2) ||
             cudaMalloc(&y, (size_t)2048 * 28672 * 2) || cudaMalloc(&wbf, (size_t)28672 * 4096 * 2);
    CHECK(!rc, "timing setup failed");
    if (rc) return;
    uint16_t *xh = malloc(2048 * 14336 * 2);
    for (int64_t i = 0; i < 2048 * 14336; i++) xh[i] = fp32_to_bf16(frand());
    cudaMemcpy(x, xh, 2048 * 14336 * 2, cudaMemcpyHostToDevice);
    free(xh);
    printf("# timing, bf16 x and y: us per GEMM (TFLOP/s); dequantize + cuBLASLt is the route quant_gemm replaces\n");
    printf("# %-5s %-8s %5s | %-15s | %-15s | %-15s | %-15s\n", "type", "matrix", "T", "dequant+Lt", "(Lt alone)",
           "fused bn 128", "fused bn 256");
    for (int ti = 0; ti < 2; ti++)
        for (int k = 0; k < 2; k++) {
            double tot[NR] = {0}, flops_tot = 0;
            for (int s = 0; s < 4; s++) {
                Mat M;
                if (mat_build(&M, types[k], shapes[s][0], shapes[s][1])) continue;
                Run r = {&M, &L, x, y, wbf, Ts[ti], 0, 0, 0, NULL};
                double u[NR];
                for (r.route = 0; r.route < NR; r.route++) u[r.route] = time_us(&r);
                u[0] += u[1]; /* dequantize + cuBLASLt */
                double flops = 2.0 * Ts[ti] * shapes[s][0] * shapes[s][1];
                printf("# %-5s %-8s %5d |", dtype_info(types[k])->name, names[s], Ts[ti]);
                for (int i = 0; i < NR; i++) printf(" %7.1f (%4.0f) |", u[i], flops / (u[i] * 1e-6) * 1e-12);
                printf("\n");
                for (int i = 0; i < NR; i++) tot[i] += u[i];
                flops_tot += flops;
                mat_free(&M);
            }
            printf("# %-5s %-8s %5d |", dtype_info(types[k])->name, "layer", Ts[ti]);
            for (int i = 0; i < NR; i++) printf(" %7.1f (%4.0f) |", tot[i], flops_tot / (tot[i] * 1e-6) * 1e-12);
            printf("\n");
        }
    CHECK(cudaGetLastError() == cudaSuccess, "timing launches failed");
    cudaFree(x); cudaFree(y); cudaFree(wbf); cudaFree(L.ws);
    cublasLtDestroy(L.lt);
}

int main(int argc, char **argv) {
    if (!quant_have_device()) return 1;
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    /* one GEMM, for a profiler: --time TYPE ROWS COLS T BN [SPLITS] (SPLITS: through a work space, 0 = quant_gemm's pick) */
    if (argc >= 7 && !strcmp(argv[1], "--time")) {
        DType t = DT_COUNT;
        const DType types[4] = {DT_Q4_K, DT_Q8_0, DT_Q6_K, DT_Q5_K};
        for (int i = 0; i < 4; i++)
            if (!strcasecmp(argv[2], dtype_info(types[i])->name)) t = types[i];
        int64_t rows = atoll(argv[3]), cols = atoll(argv[4]);
        int T = atoi(argv[5]), bn = atoi(argv[6]);
        Mat M;
        void *x = NULL, *y = NULL;
        int rc = t == DT_COUNT || T <= 0 || mat_build(&M, t, rows, cols) || cudaMalloc(&x, (size_t)T * cols * 2) ||
                 cudaMalloc(&y, (size_t)T * rows * 2);
        QuantGemmWork w = {NULL, (size_t)64 << 20}; /* SPLITS: a work space for any split of these shapes */
        if (argc > 7) rc = rc || cudaMalloc(&w.buf, w.bytes) || cudaMemset(w.buf, 0, w.bytes);
        Run r = {&M, NULL, x, y, NULL, T, 2, bn, argc > 7 ? atoi(argv[7]) : 0, argc > 7 ? &w : NULL};
        float us = rc ? NAN : time_us(&r);
        cudaFree(w.buf);
        printf("# %s %lldx%lld T=%d bn=%d: %.1f us, %.0f TFLOP/s\n", argv[2], (long long)rows, (long long)cols, T, bn,
               us, 2.0 * T * rows * cols / (us * 1e-6) * 1e-12);
        CHECK(!rc && isfinite(us), "--time %s %s %s %s %s failed", argv[2], argv[3], argv[4], argv[5], argv[6]);
        TEST_EXIT();
    }
    RUN(test_refused);
    RUN(test_quant_gemm);
    RUN(test_epilogues);
    if (!quick) RUN(test_timing);
    TEST_EXIT();
}
