/* test_quant.c — the quantized-weight kernels (kernels/cuda/quant_gemv.cu,
 * quant_gemv_mma.cu, quant_gemv_x8.cu, quant_repack.cu) against the CPU
 * reference dequantizer (base/dtype.c), run on a GPU machine by
 * tests/gpu/run.sh; never in CI.
 *
 *   - GEMV: for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, matrices of random GGUF
 *     blocks (every quant bit random, scale fields random finite fp16) are
 *     uploaded, repacked on the GPU and multiplied by random x (bf16 or fp32,
 *     T = 1..8 rows) by each kernel of quant.cuh that takes the case
 *     (quant_gemv_takes: the scalar one always, with bf16 and fp32 x; the
 *     mma one for Q4_K / Q8_0 with bf16 x; the x8 one at one bf16 row); the
 *     reference is dequantize_row then a float64 dot product, with x as the
 *     kernel defines it (x8: rounded to two int8 terms per 32 values,
 *     round_x_int8; its error against the unrounded x is printed).
 *     ||y - ref|| / ||ref|| <= 1e-3 for fp32 outputs, 1e-2 for bf16
 *     outputs; outputs NaN-poisoned before each launch and every one must be
 *     finite. Shapes 4096x4096, 14336x4096, 4096x14336, 576x1536, 1000x256,
 *     Gemma 3 270M's qkv 1536x640 (Q5_0 in its Q4_K_M file) and odd ones (3
 *     Q8_0 blocks a row: a partial tile; 3 Q5_0 blocks a row: records whose
 *     rows start 2 bytes off a word, and the plane's last record read up to
 *     its rounded end, which memcheck watches); bias on some cases. Big
 *     shapes check a spread of rows.
 *   - dequantize to bf16: bit-exact with dequantize_row + fp32_to_bf16 (whole
 *     matrices, and a row range of a big one).
 *   - dequant_ahead.cuh: the GEMM's buffer holds the asked matrix's bytes
 *     whether made ahead, on the spot, or in a replayed graph.
 *   - timing (printed, never asserted): each type's GEMV at 4096x14336,
 *     T = 1 and 8, per kernel, and Q4_K / Q8_0 / Q6_K / Q5_K / Q4_0 at the
 *     other shapes of a Llama-3-8B decode step; CUDA events around 20
 *     back-to-back launches over 4 rotating copies (more than the L2),
 *     median of 15, as GB/s of quantized bytes and % of 4.26 TB/s; the
 *     dequantize kernel likewise (quantized bytes read + bf16 written). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/dequant_ahead.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/quant_x8.h"
#include "tests/gpu/gemv_calls.h"
#include "tests/gpu/quant_mats.h"
#include "tests/test.h"

#define COPY_BW 4.26e12 /* ANCHORS.md: H200 device copy, bytes/s */
#define MAX_CHECK_ROWS 384

/* x as the x8 kernel multiplies it: rounded to two int8 terms per group of
 * 32 values with kernels/quant_x8.h's rounding. */
static void round_x_int8(float *x, int64_t n) {
    for (int64_t g = 0; g + QX_GROUP <= n; g += QX_GROUP) {
        int8_t q1[QX_GROUP], q2[QX_GROUP];
        float dxs, sx;
        qx_round_group(x + g, q1, q2, &dxs, &sx);
        for (int i = 0; i < QX_GROUP; i++) {
            CHECK(q1[i] >= -127, "x %g: int8 terms %d %d", x[g + i], q1[i], q2[i]);
            x[g + i] = (float)(128 * q1[i] + q2[i]) * dxs;
        }
    }
}

static const char *const KNAME[3] = {"scalar", "mma", "x8"};

/* One GEMV case: returns the relative error (or INFINITY on a failure)
 * against the product with x as the kernel defines it (x8: x in two int8
 * terms, round_x_int8); *err_x_exact: against x itself (what the x8 kernel's
 * rounding costs; the same number for the other kernels). */
static double gemv_case(Mat *M, int T, QuantGemvKernel k, bool x_f32, bool y_f32, bool bias, int64_t *rows_chk,
                        int n_chk, float *w_rows, double *err_x_exact) {
    Err err = {{0}};
    int64_t rows = M->rows, cols = M->cols;
    float *x = malloc((size_t)T * cols * sizeof *x), *b = malloc((size_t)rows * sizeof *b);
    uint16_t *xb = malloc((size_t)T * cols * 2);
    for (int64_t i = 0; i < T * cols; i++) {
        x[i] = frand();
        if (!x_f32) { xb[i] = fp32_to_bf16(x[i]); x[i] = bf16_to_fp32(xb[i]); }
    }
    for (int64_t i = 0; i < rows; i++) b[i] = frand();
    float *xr = malloc((size_t)T * cols * sizeof *xr); /* the x of the reference */
    memcpy(xr, x, (size_t)T * cols * sizeof *xr);
    if (k == QGEMV_X8) round_x_int8(xr, T * cols);
    void *dx = NULL, *dy = NULL, *db = NULL;
    size_t ysz = (size_t)T * rows * (y_f32 ? 4 : 2);
    int rc = cudaMalloc(&dx, (size_t)T * cols * 4) || cudaMalloc(&dy, ysz) || cudaMalloc(&db, rows * 4);
    rc = rc || cudaMemcpy(dx, x_f32 ? (void *)x : (void *)xb, (size_t)T * cols * (x_f32 ? 4 : 2), cudaMemcpyHostToDevice);
    rc = rc || cudaMemcpy(db, b, rows * 4, cudaMemcpyHostToDevice) || cudaMemset(dy, 0xff, ysz); /* NaN poison */
    GemvOut out = gemv_out_one(dy, y_f32, bias ? (const float *)db : NULL, rows);
    rc = rc || quant_gemv(&M->m, dx, x_f32, &out, T, k, 0, &err);
    rc = rc || cudaDeviceSynchronize();
    void *y = malloc(ysz);
    rc = rc || cudaMemcpy(y, dy, ysz, cudaMemcpyDeviceToHost);
    double num = 0, den = 0, num_x = 0;
    int64_t bad = 0;
    if (!rc) {
        for (int64_t i = 0; i < T * rows; i++) {
            float v = y_f32 ? ((float *)y)[i] : bf16_to_fp32(((uint16_t *)y)[i]);
            if (!isfinite(v)) bad++;
        }
        for (int j = 0; j < n_chk; j++) {
            const float *w = w_rows + (int64_t)j * cols;
            for (int t = 0; t < T; t++) {
                double ref = bias ? b[rows_chk[j]] : 0.0, ref_x = ref;
                for (int64_t c = 0; c < cols; c++) {
                    ref += (double)w[c] * xr[t * cols + c];
                    ref_x += (double)w[c] * x[t * cols + c];
                }
                int64_t i = t * rows + rows_chk[j];
                double v = y_f32 ? ((float *)y)[i] : bf16_to_fp32(((uint16_t *)y)[i]);
                num += (v - ref) * (v - ref);
                num_x += (v - ref_x) * (v - ref_x);
                den += ref * ref;
            }
        }
    }
    CHECK(!rc, "%s [%lld][%lld] T=%d %s: launch failed: %s (cuda %d)", dtype_info(M->type)->name, (long long)rows,
          (long long)cols, T, KNAME[k], err.msg, rc);
    CHECK(bad == 0, "%s [%lld][%lld] T=%d %s: %lld outputs not finite (unwritten?)", dtype_info(M->type)->name,
          (long long)rows, (long long)cols, T, KNAME[k], (long long)bad);
    free(x); free(xb); free(xr); free(b); free(y);
    cudaFree(dx); cudaFree(dy); cudaFree(db);
    *err_x_exact = rc || bad ? INFINITY : sqrt(num_x / den);
    return rc || bad ? INFINITY : sqrt(num / den);
}

/* GEMV cases for one matrix; Ts: the row counts to try, each by every
 * kernel that takes it (the scalar one with bf16 and with fp32 x). */
static void gemv_checks(Mat *M, const int *Ts, int nT) {
    int64_t *rows_chk = malloc(MAX_CHECK_ROWS * sizeof *rows_chk);
    int n_chk = quant_check_rows(M->rows, rows_chk, MAX_CHECK_ROWS);
    const DTypeInfo *info = dtype_info(M->type);
    int64_t row_bytes = (int64_t)dtype_row_bytes(M->type, M->cols);
    float *w = malloc((size_t)n_chk * M->cols * sizeof *w);
    for (int j = 0; j < n_chk; j++)
        dequantize_row(M->type, M->native + rows_chk[j] * row_bytes, w + (int64_t)j * M->cols, M->cols);
    double worst = 0, worst_i8_x = 0;
    int n_cases = 0;
    for (int k = QGEMV_SCALAR; k <= QGEMV_X8; k++)
        for (int i = 0; i < nT; i++)
            for (int f = 0; f < (k == QGEMV_SCALAR ? 2 : 1); f++) {
                const int T = Ts[i];
                const bool x_f32 = f, y_bf16 = T == 3, bias = T % 3 == 1;
                if (!quant_gemv_takes((QuantGemvKernel)k, &M->m, T, x_f32)) continue;
                n_cases++;
                double ex = 0, e = gemv_case(M, T, (QuantGemvKernel)k, x_f32, !y_bf16, bias, rows_chk, n_chk, w, &ex);
                if (k == QGEMV_X8 && !y_bf16 && ex > worst_i8_x) worst_i8_x = ex;
                double tol = y_bf16 ? 1e-2 : 1e-3;
                CHECK(e <= tol, "%s [%lld][%lld] T=%d %s x %s y %s: rel err %.3g > %g", info->name, (long long)M->rows,
                      (long long)M->cols, T, KNAME[k], x_f32 ? "f32" : "bf16", y_bf16 ? "bf16" : "f32", e, tol);
                if (!y_bf16 && e > worst) worst = e;
            }
    bool mma = quant_gemv_takes(QGEMV_MMA, &M->m, 1, false), x8 = quant_gemv_takes(QGEMV_X8, &M->m, 1, false);
    printf("# gemv %-5s [%5lld][%5lld] %d cases (scalar%s%s), worst fp32 rel err %.2e", info->name, (long long)M->rows,
           (long long)M->cols, n_cases, mma ? ", mma" : "", x8 ? ", x8" : "", worst);
    if (x8) printf("; x8 against the unrounded x (its int8 terms) %.2e", worst_i8_x);
    printf("\n");
    free(w);
    free(rows_chk);
}

/* dequantize rows [row0, row0+n) on the GPU; bit-exact vs dtype.c + bf16 */
static void dequant_check(Mat *M, int64_t row0, int64_t n) {
    Err err = {{0}};
    int64_t cols = M->cols, row_bytes = (int64_t)dtype_row_bytes(M->type, cols);
    size_t sz = (size_t)n * cols * 2;
    void *d = NULL;
    uint16_t *got = malloc(sz);
    float *ref = malloc(cols * sizeof *ref);
    int rc = cudaMalloc(&d, sz) || cudaMemset(d, 0xff, sz);
    rc = rc || quant_dequant_bf16(&M->m, row0, n, d, 0, &err) || cudaDeviceSynchronize();
    rc = rc || cudaMemcpy(got, d, sz, cudaMemcpyDeviceToHost);
    CHECK(!rc, "%s dequant: failed: %s", dtype_info(M->type)->name, err.msg);
    int64_t mism = 0, first = -1;
    for (int64_t r = 0; !rc && r < n; r++) {
        dequantize_row(M->type, M->native + (row0 + r) * row_bytes, ref, cols);
        for (int64_t c = 0; c < cols; c++)
            if (got[r * cols + c] != fp32_to_bf16(ref[c])) {
                if (first < 0) first = r * cols + c;
                mism++;
            }
    }
    CHECK(mism == 0, "%s [%lld][%lld] dequant rows %lld..%lld: %lld of %lld values differ (first at %lld)",
          dtype_info(M->type)->name, (long long)M->rows, (long long)cols, (long long)row0, (long long)(row0 + n),
          (long long)mism, (long long)(n * cols), (long long)first);
    cudaFree(d);
    free(got);
    free(ref);
}

/* dequant_ahead.cuh: the buffer a GEMM reads holds exactly quant_dequant_bf16's
 * bytes of the matrix asked for, whether it was made ahead (guessed right),
 * made on the spot (guessed wrong, a row range, the one-buffer mode), or
 * replayed from a captured graph. A "GEMM" here is a copy of the buffer on
 * the main stream, so a copy made ahead that overwrote a buffer before its
 * reader ran would show as a mismatch. Also checks which buffer each get
 * returns: a right guess must be the buffer made ahead, not a fresh copy. */
typedef struct {
    const QuantMatrix *m;
    int64_t r0, n;
    const QuantMatrix *next[2]; /* what the step multiplies next, as the backend passes it */
    int want[3];                /* the buffer deq_ahead_get should return with 1, 2, 3 buffers (-1: any) */
} AheadStep;

static int ahead_run(DeqAhead *d, const AheadStep *st, int n, void **outs, void **got, cudaStream_t s, Err *err) {
    for (int i = 0; i < n; i++) {
        void *b = deq_ahead_get(d, st[i].m, st[i].r0, st[i].n, s, err);
        if (!b) return -1;
        got[i] = b;
        if (cudaMemcpyAsync(outs[i], (const char *)b, (size_t)st[i].n * st[i].m->cols * 2, cudaMemcpyDeviceToDevice, s))
            return err_set(err, "copy");
        if (deq_ahead_after_gemm(d, b, st[i].next, 2, s, err)) return -1;
    }
    return deq_ahead_join(d, s, err);
}

static void test_dequant_ahead(void) {
    Mat M[3];
    const DType types[3] = {DT_Q4_K, DT_Q8_0, DT_Q6_K};
    const int64_t rows[3] = {300, 64, 128}, cols[3] = {512, 1024, 256};
    for (int i = 0; i < 3; i++) mat_build(&M[i], types[i], rows[i], cols[i]);
    const QuantMatrix *A = &M[0].m, *B = &M[1].m, *C = &M[2].m;
    /* two buffers: A on the spot (0), B ahead (1), C ahead over A (0), then a wrong guess (A ahead into 1):
     * B again on the spot, not over the guess (0), the guess still there (1), a row range, A whole ahead.
     * Three: A on the spot (0), B and C ahead (1, 2), each still held when asked again; the row range
     * goes over the oldest (2). */
    const AheadStep st[] = {
        {A, 0, 300, {B, C}, {0, 0, 0}},
        {B, 0, 64, {C, A}, {0, 1, 1}},
        {C, 0, 128, {A, NULL}, {0, 0, 2}},
        {B, 0, 64, {NULL}, {0, 0, 1}},
        {A, 0, 300, {NULL}, {0, 1, 0}},
        {A, 100, 50, {A}, {0, -1, 2}},
        {A, 0, 300, {NULL}, {0, -1, 0}},
    };
    const int n = (int)(sizeof st / sizeof st[0]);
    void *outs[16] = {0}, *ref[3] = {0}, *got[16];
    cudaStream_t s = NULL;
    int rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess;
    Err err = {{0}};
    for (int i = 0; i < 3; i++) {
        rc = rc || cudaMalloc(&ref[i], (size_t)rows[i] * cols[i] * 2);
        rc = rc || quant_dequant_bf16(&M[i].m, 0, rows[i], ref[i], 0, &err);
    }
    for (int i = 0; i < n; i++) rc = rc || cudaMalloc(&outs[i], (size_t)st[i].n * st[i].m->cols * 2);
    rc = rc || cudaDeviceSynchronize();
    CHECK(!rc, "dequant ahead: setup failed: %s", err.msg);
    for (int mode = 0; !rc && mode < 6; mode++) { /* 1, 2, 3 buffers, each issued then graphed */
        int nb = 1 + mode / 2;
        DeqAhead d;
        if (deq_ahead_init(&d, 300 * 512, nb, &err)) { CHECK(0, "deq_ahead_init: %s", err.msg); break; }
        CHECK(d.n_bufs == nb, "%d buffers asked, %d made", nb, d.n_bufs);
        for (int i = 0; i < n; i++) cudaMemset(outs[i], 0xff, (size_t)st[i].n * st[i].m->cols * 2);
        cudaDeviceSynchronize();
        int r = deq_ahead_begin_step(&d, s, &err);
        cudaGraph_t g = NULL;
        cudaGraphExec_t ex = NULL;
        if (!r && mode % 2) r = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
        r = r || ahead_run(&d, st, n, outs, got, s, &err);
        if (mode % 2) {
            r = cudaStreamEndCapture(s, &g) != cudaSuccess || r;
            r = r || cudaGraphInstantiate(&ex, g, 0) != cudaSuccess || cudaGraphLaunch(ex, s) != cudaSuccess;
        }
        r = r || cudaStreamSynchronize(s) != cudaSuccess;
        CHECK(!r, "dequant ahead mode %d: %s (%s)", mode, err.msg, cudaGetErrorString(cudaGetLastError()));
        for (int i = 0; !r && i < n; i++) {
            int mi = st[i].m == A ? 0 : st[i].m == B ? 1 : 2;
            size_t bytes = (size_t)st[i].n * st[i].m->cols * 2, off = (size_t)st[i].r0 * st[i].m->cols * 2;
            uint8_t *h = malloc(bytes), *hr = malloc(bytes);
            cudaMemcpy(h, outs[i], bytes, cudaMemcpyDeviceToHost);
            cudaMemcpy(hr, (char *)ref[mi] + off, bytes, cudaMemcpyDeviceToHost);
            CHECK(!memcmp(h, hr, bytes), "dequant ahead mode %d step %d: the GEMM read other bytes", mode, i);
            int want = st[i].want[nb - 1], was = 0;
            while (was < nb - 1 && got[i] != d.buf[was]) was++;
            CHECK(want < 0 || got[i] == d.buf[want], "dequant ahead mode %d step %d: buffer %d, want %d", mode, i,
                  was, want);
            free(h);
            free(hr);
        }
        if (ex) cudaGraphExecDestroy(ex);
        if (g) cudaGraphDestroy(g);
        /* rows over the buffer are refused with a message (A: 512 values a row, the buffer 1000) */
        DeqAhead small;
        if (!deq_ahead_init(&small, 1000, nb, &err)) {
            bool one = deq_ahead_get(&small, A, 0, 1, s, &err) != NULL;
            CHECK(one && !deq_ahead_get(&small, A, 0, 2, s, &err) && strstr(err.msg, "exceed"),
                  "rows over the buffer: '%s'", err.msg);
            cudaStreamSynchronize(s);
            deq_ahead_free(&small);
        }
        cudaStreamSynchronize(s);
        deq_ahead_free(&d);
    }
    for (int i = 0; i < n; i++) cudaFree(outs[i]);
    for (int i = 0; i < 3; i++) cudaFree(ref[i]), mat_free(&M[i]);
    cudaStreamDestroy(s);
}

static const int T_ALL[] = {1, 2, 3, 4, 5, 6, 7, 8}, T_FEW[] = {1, 5, 8};

static void test_small_shapes(void) {
    /* odd: 3 Q8_0 blocks (a partial tile); 9 K blocks of 256 (a partial tile); 640: Gemma 3 270M's width */
    int64_t shapes[][2] = {{576, 1536}, {1000, 256}, {7, 96}, {33, 2304}, {1536, 640}};
    for (int i = 0; i < N_TYPES; i++)
        for (int s = 0; s < 5; s++) {
            Mat M;
            int64_t cols = shapes[s][1];
            if (cols % dtype_info(TYPES[i])->block_elems) continue;
            if (mat_build(&M, TYPES[i], shapes[s][0], cols)) continue;
            gemv_checks(&M, T_ALL, 8);
            dequant_check(&M, 0, M.rows);
            dequant_check(&M, 1, M.rows - 1);
            mat_free(&M);
        }
}

/* The last shape is tall (the mma kernel takes two m-tiles per warp for
 * Q4_K below T = 4 there) with a part block of rows at the end, every T. */
static void test_big_shapes(void) {
    int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {16401, 512}};
    for (int i = 0; i < N_TYPES; i++)
        for (int s = 0; s < 4; s++) {
            Mat M;
            if (mat_build(&M, TYPES[i], shapes[s][0], shapes[s][1])) continue;
            if (s == 3) gemv_checks(&M, T_ALL, 8);
            else gemv_checks(&M, T_FEW, 3);
            if (s == 1) dequant_check(&M, 1001, 300);
            mat_free(&M);
        }
}

static void test_refused(void) {
    Err err = {{0}};
    size_t b;
    CHECK(quant_matrix_bytes(DT_Q4_K, 8, 300, &b, &err) == -1, "Q4_K with 300 columns accepted");
    CHECK(quant_matrix_bytes(DT_Q2_K, 8, 256, &b, &err) == -1, "Q2_K accepted");
    CHECK(quant_matrix_bytes(DT_Q8_0, 8, 64, &b, &err) == 0 && b >= 8 * 68, "Q8_0 8x64: %zu bytes", b);
    /* Q5_0 / Q5_1: the file's bytes (22 / 24 a block) plus the planes' alignment only: the qs plane to 256
     * bytes, the sc plane to 4 (3 x 3 blocks: 144 -> 256 + 54 -> 56; 9 x 8 = 72) */
    CHECK(quant_matrix_bytes(DT_Q5_0, 3, 96, &b, &err) == 0 && b == 256 + 56, "Q5_0 3x96: %zu bytes, want 312", b);
    CHECK(quant_matrix_bytes(DT_Q5_1, 3, 96, &b, &err) == 0 && b == 256 + 72, "Q5_1 3x96: %zu bytes, want 328", b);
    CHECK(quant_matrix_bytes(DT_Q5_0, 1536, 640, &b, &err) == 0 && b == 1536 * 20 * 22, "Q5_0 1536x640: %zu bytes", b);
    CHECK(quant_matrix_bytes(DT_Q5_0, 8, 48, &b, &err) == -1, "Q5_0 with 48 columns accepted");
    /* which kernel takes what; refused before any launch (no pointers needed) */
    QuantMatrix q4k = {DT_Q4_K, 16, 4096, NULL, NULL, 0.0f}, q40 = {DT_Q4_0, 16, 4096, NULL, NULL, 0.0f};
    QuantMatrix q8 = {DT_Q8_0, 16, 512, NULL, NULL, 0.0f}, q8n = {DT_Q8_0, 16, 96, NULL, NULL, 0.0f};
    QuantMatrix q41 = {DT_Q4_1, 16, 96, NULL, NULL, 0.0f}, q50 = {DT_Q5_0, 16, 4096, NULL, NULL, 0.0f};
    QuantMatrix q51 = {DT_Q5_1, 16, 640, NULL, NULL, 0.0f}, q3k = {DT_Q3_K, 16, 4096, NULL, NULL, 0.0f};
    QuantMatrix q4k288 = {DT_Q4_K, 16, 288, NULL, NULL, 0.0f}, wide = {DT_Q8_0, 16, 65536 + 32, NULL, NULL, 0.0f};
    QuantMatrix tall = {DT_Q8_0, (int64_t)1 << 25, 32, NULL, NULL, 0.0f};
    CHECK(quant_gemv_takes(QGEMV_SCALAR, &q40, 8, true) && quant_gemv_takes(QGEMV_SCALAR, &q4k, 1, false) &&
              quant_gemv_takes(QGEMV_SCALAR, &q50, 8, true) && quant_gemv_takes(QGEMV_SCALAR, &q51, 1, false) &&
              !quant_gemv_takes(QGEMV_SCALAR, &q4k, 9, false) && !quant_gemv_takes(QGEMV_SCALAR, &q4k, 0, false) &&
              !quant_gemv_takes(QGEMV_SCALAR, &q3k, 1, false) && !quant_gemv_takes(QGEMV_SCALAR, &q4k288, 1, false),
          "scalar: every type the GPU keeps in blocks, 1..8 rows, bf16 or fp32 x");
    CHECK(quant_gemv_takes(QGEMV_MMA, &q4k, 1, false) && quant_gemv_takes(QGEMV_MMA, &q8, 8, false),
          "mma: Q4_K / Q8_0 with bf16 x");
    CHECK(!quant_gemv_takes(QGEMV_MMA, &q40, 1, false) && !quant_gemv_takes(QGEMV_MMA, &q8n, 1, false) &&
              !quant_gemv_takes(QGEMV_MMA, &q50, 2, false) && !quant_gemv_takes(QGEMV_MMA, &q51, 2, false) &&
              !quant_gemv_takes(QGEMV_MMA, &q4k, 1, true) && !quant_gemv_takes(QGEMV_MMA, &q4k, 9, false),
          "Q4_0, Q5_0, Q5_1, 96 columns, fp32 x or 9 rows taken by mma");
    GemvOut none = {{NULL}, {NULL}, {0}, false, false}, out16 = gemv_out_one(NULL, false, NULL, 16);
    CHECK(quant_gemv(&q40, NULL, false, &out16, 1, QGEMV_MMA, 0, &err) == -1 && strstr(err.msg, "mma"), "'%s'",
          err.msg);
    CHECK(quant_gemv(&q50, NULL, false, &out16, 2, QGEMV_MMA, 0, &err) == -1 && strstr(err.msg, "mma"), "'%s'",
          err.msg);
    /* x8: every type the GPU keeps in blocks, one bf16 x row, x rounded for this width */
    CHECK(quant_gemv_takes(QGEMV_X8, &q4k, 1, false) && quant_gemv_takes(QGEMV_X8, &q8n, 1, false) &&
              quant_gemv_takes(QGEMV_X8, &q40, 1, false) && quant_gemv_takes(QGEMV_X8, &q41, 1, false) &&
              quant_gemv_takes(QGEMV_X8, &q50, 1, false) && quant_gemv_takes(QGEMV_X8, &q51, 1, false) &&
              !quant_gemv_takes(QGEMV_X8, &q3k, 1, false) && !quant_gemv_takes(QGEMV_X8, &q4k288, 1, false),
          "x8 type / column list");
    CHECK(!quant_gemv_takes(QGEMV_X8, &q4k, 2, false) && !quant_gemv_takes(QGEMV_X8, &q4k, 1, true),
          "x8 at two rows or with fp32 x");
    CHECK(quant_gemv_x8(&q3k, NULL, NULL, &none, 1, 0, &err) == -1 && strstr(err.msg, "quant_gemv_x8"), "'%s'",
          err.msg);
    CHECK(quant_gemv_x8(&q4k, NULL, NULL, &none, 2, 0, &err) == -1 && strstr(err.msg, "one row"), "'%s'", err.msg);
    CHECK(quant_gemv(&q4k, NULL, true, &out16, 1, QGEMV_X8, 0, &err) == -1 && strstr(err.msg, "fp32 x"), "'%s'",
          err.msg);
    CHECK(!quant_gemv_takes(QGEMV_X8, &wide, 1, false), "x8 with x wider than its shared memory");
    CHECK(quant_gemv_x8(&q4k, (void *)8, NULL, &none, 1, 0, &err) == -1 && strstr(err.msg, "aligned"), "'%s'", err.msg);
    CHECK(!quant_gemv_takes(QGEMV_X8, &tall, 1, false), "x8 with 2^25 rows");
    CHECK(quant_gemv_x8(&tall, NULL, NULL, &none, 1, 0, &err) == -1 && strstr(err.msg, "2^24"), "'%s'", err.msg);
    for (int t = 0; t < DT_COUNT; t++) /* the stage plan sizes matrices by the same list */
        CHECK(quant_type_supported((DType)t) == dtype_gpu_keeps_blocks((DType)t), "type %d: lists disagree", t);
}

/* y stored in three parts (a fused Q|K|V: GemvOut), each part [T][n_i]
 * bf16 with its own bias (none for the middle one): every kernel that takes
 * the case, T = 1 and 3, against the dequantized rows. */
static void test_parts(void) {
    const DType types[] = {DT_Q4_K, DT_Q8_0, DT_Q4_0, DT_Q6_K, DT_Q5_K, DT_Q5_0, DT_Q5_1};
    const int64_t end[3] = {384, 512, 640}, cols = 1536;
    for (int i = 0; i < 7; i++) {
        Mat M;
        if (mat_build(&M, types[i], end[2], cols)) continue;
        float *w = malloc((size_t)end[2] * cols * sizeof *w), *x = malloc(3 * cols * sizeof *x);
        float *b = malloc(end[2] * sizeof *b);
        uint16_t *xb = malloc(3 * cols * 2), *y = malloc(3 * end[2] * 2);
        int64_t rb = (int64_t)dtype_row_bytes(M.type, cols);
        for (int64_t r = 0; r < end[2]; r++) dequantize_row(M.type, M.native + r * rb, w + r * cols, cols), b[r] = frand();
        for (int64_t k = 0; k < 3 * cols; k++) xb[k] = fp32_to_bf16(frand()), x[k] = bf16_to_fp32(xb[k]);
        void *dx = NULL, *dy = NULL, *db = NULL;
        int rc = cudaMalloc(&dx, 3 * cols * 2) || cudaMalloc(&dy, 3 * end[2] * 2) || cudaMalloc(&db, end[2] * 4);
        rc = rc || cudaMemcpy(dx, xb, 3 * cols * 2, cudaMemcpyHostToDevice) || cudaMemcpy(db, b, end[2] * 4, cudaMemcpyHostToDevice);
        for (int k = QGEMV_SCALAR; !rc && k <= QGEMV_X8; k++)
            for (int T = 1; T <= 3; T += 2) {
                if (!quant_gemv_takes((QuantGemvKernel)k, &M.m, T, false)) continue;
                Err err = {{0}};
                /* parts laid out one after the other in dy: [T][384] | [T][128] | [T][128] */
                uint16_t *p0 = (uint16_t *)dy, *p1 = p0 + T * end[0], *p2 = p1 + T * (end[1] - end[0]);
                GemvOut out = {{p0, p1, p2}, {(float *)db, NULL, (float *)db + end[1]}, {end[0], end[1], end[2]}, false, false};
                int r2 = cudaMemset(dy, 0xff, 3 * end[2] * 2) ||
                         quant_gemv(&M.m, dx, false, &out, T, (QuantGemvKernel)k, 0, &err) ||
                         cudaDeviceSynchronize() || cudaMemcpy(y, dy, T * end[2] * 2, cudaMemcpyDeviceToHost);
                CHECK(!r2, "%s parts %s T=%d: %s", dtype_info(M.type)->name, KNAME[k], T, err.msg);
                double num = 0, den = 0;
                int64_t bad = 0;
                for (int k = 0; !r2 && k < 3; k++) {
                    int64_t r0 = k ? end[k - 1] : 0, n = end[k] - r0;
                    const uint16_t *yk = y + (k == 0 ? 0 : k == 1 ? T * end[0] : T * end[1]);
                    for (int t = 0; t < T; t++)
                        for (int64_t r = 0; r < n; r++) {
                            double ref = k == 1 ? 0.0 : b[r0 + r];
                            for (int64_t c = 0; c < cols; c++) ref += (double)w[(r0 + r) * cols + c] * x[t * cols + c];
                            double v = bf16_to_fp32(yk[t * n + r]);
                            if (!isfinite(v)) bad++;
                            num += (v - ref) * (v - ref), den += ref * ref;
                        }
                }
                CHECK(bad == 0 && num <= 1e-4 * den, "%s parts %s T=%d: %lld unwritten, rel err %.3g",
                      dtype_info(M.type)->name, KNAME[k], T, (long long)bad, sqrt(num / den));
            }
        Err err = {{0}};
        GemvOut wrong = {{dy, dy, dy}, {NULL}, {end[0], end[1], end[2] - 1}, false, false};
        CHECK(quant_gemv(&M.m, dx, false, &wrong, 1, QGEMV_SCALAR, 0, &err) == -1 && strstr(err.msg, "parts"),
              "parts ending short of the rows: '%s'", err.msg);
        cudaFree(dx); cudaFree(dy); cudaFree(db);
        free(w); free(x); free(b); free(xb); free(y);
        mat_free(&M);
    }
}

/* The x8 kernel with the gated activation fused (quant_gemv_x8_glu): W = gate
 * rows | up rows; every activation, with and without biases, against
 * dequantize_row times the rounded x, then cpu_glu; y is bf16 (tolerance
 * 1e-2 of the norm) and NaN-poisoned first. */
static void test_glu(void) {
    const DType types[] = {DT_Q4_K, DT_Q8_0, DT_Q6_K, DT_Q5_K, DT_Q4_0, DT_Q5_0, DT_Q5_1};
    const int64_t shapes[2][2] = {{700, 2304}, {9001, 512}}; /* F, cols; the second: several rows per warp pair */
    for (int i = 0; i < 14; i++) {
        Mat M;
        const int64_t F = shapes[i / 7][0], cols = shapes[i / 7][1];
        if (mat_build(&M, types[i % 7], 2 * F, cols)) continue;
        float *w = malloc((size_t)2 * F * cols * sizeof *w), *x = malloc(cols * sizeof *x), *b = malloc(2 * F * sizeof *b);
        float *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u), *ref = malloc(F * sizeof *ref);
        uint16_t *xb = malloc(cols * 2), *y = malloc(F * 2);
        int64_t rb = (int64_t)dtype_row_bytes(M.type, cols);
        for (int64_t r = 0; r < 2 * F; r++) dequantize_row(M.type, M.native + r * rb, w + r * cols, cols), b[r] = frand();
        for (int64_t k = 0; k < cols; k++) xb[k] = fp32_to_bf16(4 * frand()), x[k] = bf16_to_fp32(xb[k]);
        round_x_int8(x, cols);
        void *dx = NULL, *dy = NULL, *db = NULL;
        int rc = cudaMalloc(&dx, cols * 2) || cudaMalloc(&dy, F * 2) || cudaMalloc(&db, 2 * F * 4);
        rc = rc || cudaMemcpy(dx, xb, cols * 2, cudaMemcpyHostToDevice) || cudaMemcpy(db, b, 2 * F * 4, cudaMemcpyHostToDevice);
        for (int act = 0; !rc && act < 3; act++)
            for (int with_b = 0; with_b < 2; with_b++) {
                Err err = {{0}};
                float limit = act == ACT_SWIGLU_OAI ? 7.f : 0.f;
                for (int64_t r = 0; r < 2 * F; r++) {
                    double s = with_b ? b[r] : 0.0;
                    for (int64_t c = 0; c < cols; c++) s += (double)w[r * cols + c] * x[c];
                    if (r < F) g[r] = (float)s; else u[r - F] = (float)s;
                }
                cpu_glu(ref, g, u, F, (Activation)act, limit);
                const float *bg = with_b ? (float *)db : NULL, *bu = with_b ? (float *)db + F : NULL;
                int r2 = cudaMemset(dy, 0xff, F * 2) ||
                         quant_gemv_x8_glu(&M.m, dx, NULL, dy, bg, bu, (Activation)act, limit, 0, &err) ||
                         cudaDeviceSynchronize() || cudaMemcpy(y, dy, F * 2, cudaMemcpyDeviceToHost);
                CHECK(!r2, "%s GLU act %d: %s", dtype_info(M.type)->name, act, err.msg);
                double num = 0, den = 0;
                int64_t bad = 0;
                for (int64_t r = 0; !r2 && r < F; r++) {
                    double v = bf16_to_fp32(y[r]);
                    if (!isfinite(v)) bad++;
                    num += (v - ref[r]) * (v - ref[r]), den += (double)ref[r] * ref[r];
                }
                CHECK(!r2 && bad == 0 && den > 0 && num <= 1e-4 * den, "%s GLU F %lld act %d bias %d: %lld unwritten, rel err %.3g",
                      dtype_info(M.type)->name, (long long)F, act, with_b, (long long)bad, sqrt(num / den));
            }
        Err err = {{0}};
        QuantMatrix odd = M.m;
        odd.rows = 2 * F - 1;
        CHECK(quant_gemv_x8_glu(&odd, dx, NULL, dy, NULL, NULL, ACT_SILU, 0.f, 0, &err) == -1 && strstr(err.msg, "even"),
              "odd GLU rows: '%s'", err.msg);
        cudaFree(dx); cudaFree(dy); cudaFree(db);
        free(w); free(x); free(b); free(g); free(u); free(ref); free(xb); free(y);
        mat_free(&M);
    }
}

/* The x8 kernel reading the fp32 residual row and normalizing it itself
 * (QxNorm, as add_rmsnorm without delta would), plain and with the GLU
 * fused: against rmsnorm on the CPU, rounded to bf16 and to the int8 terms,
 * times the dequantized rows; outputs NaN-poisoned first. The norm offset
 * (Gemma's 1 + w) and a residual of large magnitude are both exercised.
 * Then bit for bit: add_rmsnorm's kernel, then the same GEMV reading it. */
static void test_norm_x8(void) {
    const DType types[] = {DT_Q4_K, DT_Q8_0, DT_Q6_K, DT_Q5_K, DT_Q4_1, DT_Q5_0, DT_Q5_1};
    const int64_t F = 700, cols = 2304;
    for (int i = 0; i < 7; i++) {
        Mat M;
        if (mat_build(&M, types[i], 2 * F, cols)) continue;
        float *w = malloc((size_t)2 * F * cols * sizeof *w), *res = malloc(cols * sizeof *res), *g = malloc(cols * 4);
        float *xn = malloc(cols * sizeof *xn), *ref = malloc(2 * F * sizeof *ref), *y = malloc(2 * F * sizeof *y);
        float *glu = malloc(F * sizeof *glu);
        uint16_t *yb = malloc(F * 2);
        int64_t rb = (int64_t)dtype_row_bytes(M.type, cols);
        for (int64_t r = 0; r < 2 * F; r++) dequantize_row(M.type, M.native + r * rb, w + r * cols, cols);
        const float offset = i ? 1.f : 0.f, eps = 1e-6f;
        double ss = 0;
        for (int64_t c = 0; c < cols; c++) res[c] = 40 * frand(), g[c] = 0.5f + frand(), ss += (double)res[c] * res[c];
        const float inv = (float)(1.0 / sqrt(ss / cols + eps));
        for (int64_t c = 0; c < cols; c++) xn[c] = bf16_to_fp32(fp32_to_bf16(res[c] * inv * (g[c] + offset)));
        round_x_int8(xn, cols);
        for (int64_t r = 0; r < 2 * F; r++) {
            double acc = 0;
            for (int64_t c = 0; c < cols; c++) acc += (double)w[r * cols + c] * xn[c];
            ref[r] = (float)acc;
        }
        cpu_glu(glu, ref, ref + F, F, ACT_SILU, 0.f);
        void *dres = NULL, *dg = NULL, *dy = NULL;
        int rc = cudaMalloc(&dres, cols * 4) || cudaMalloc(&dg, cols * 4) || cudaMalloc(&dy, 2 * F * 4) ||
                 cudaMemcpy(dres, res, cols * 4, cudaMemcpyHostToDevice) || cudaMemcpy(dg, g, cols * 4, cudaMemcpyHostToDevice);
        const QxNorm qn = {(const float *)dres, (const float *)dg, eps, offset};
        Err err = {{0}};
        GemvOut out = gemv_out_one(dy, true, NULL, 2 * F);
        int r1 = rc || cudaMemset(dy, 0xff, 2 * F * 4) || quant_gemv_x8(&M.m, NULL, &qn, &out, 1, 0, &err) ||
                 cudaDeviceSynchronize() || cudaMemcpy(y, dy, 2 * F * 4, cudaMemcpyDeviceToHost);
        CHECK(!r1, "%s x8 with the norm: %s", dtype_info(M.type)->name, err.msg);
        double e = r1 ? INFINITY : test_row_err(y, ref, (int)(2 * F));
        CHECK(e <= 1e-3, "%s x8 with the norm: rel err %.3g", dtype_info(M.type)->name, e);
        int r2 = rc || cudaMemset(dy, 0xff, F * 2) ||
                 quant_gemv_x8_glu(&M.m, NULL, &qn, dy, NULL, NULL, ACT_SILU, 0.f, 0, &err) || cudaDeviceSynchronize() ||
                 cudaMemcpy(yb, dy, F * 2, cudaMemcpyDeviceToHost);
        CHECK(!r2, "%s x8 GLU with the norm: %s", dtype_info(M.type)->name, err.msg);
        for (int64_t r = 0; !r2 && r < F; r++) y[r] = bf16_to_fp32(yb[r]);
        double eg = r2 ? INFINITY : test_row_err(y, glu, (int)F);
        CHECK(eg <= 1e-2, "%s x8 GLU with the norm: rel err %.3g", dtype_info(M.type)->name, eg);
        printf("# %s [%lld][%lld] x8 normalizing the residual itself: rel err %.2e, GLU %.2e\n",
               dtype_info(M.type)->name, (long long)(2 * F), (long long)cols, e, eg);
        /* bit for bit against add_rmsnorm's kernel, then the same GEMV reading its bf16 output */
        void *dxn = NULL, *dz = NULL;
        float *z = malloc(2 * F * sizeof *z);
        GemvOut oz = gemv_out_one(NULL, true, NULL, 2 * F);
        int r3 = r1 || cudaMalloc(&dxn, cols * 2) || cudaMalloc(&dz, 2 * F * 4) || cudaMemset(dz, 0xff, 2 * F * 4);
        oz.y[0] = oz.y[1] = oz.y[2] = dz;
        if (!r3) test_add_rmsnorm((float *)dres, NULL, dxn, (const float *)dg, 1, (int)cols, eps, offset);
        r3 = r3 || quant_gemv_x8(&M.m, dxn, NULL, &oz, 1, 0, &err) || cudaDeviceSynchronize() ||
             cudaMemcpy(z, dz, 2 * F * 4, cudaMemcpyDeviceToHost) || cudaMemset(dy, 0xff, 2 * F * 4) ||
             quant_gemv_x8(&M.m, NULL, &qn, &out, 1, 0, &err) || cudaDeviceSynchronize() ||
             cudaMemcpy(y, dy, 2 * F * 4, cudaMemcpyDeviceToHost); /* y: the folded run again (the GLU took y) */
        int64_t nd = 0;
        for (int64_t r = 0; !r3 && r < 2 * F; r++) nd += memcmp(&z[r], &y[r], 4) != 0;
        CHECK(!r3 && nd == 0, "%s x8 with the norm: %lld of %lld differ from add_rmsnorm + the GEMV (%s)",
              dtype_info(M.type)->name, (long long)nd, (long long)(2 * F), err.msg);
        cudaFree(dxn), cudaFree(dz), free(z);
        QxNorm bad = qn;
        bad.x = (const float *)((const char *)dres + 4);
        CHECK(quant_gemv_x8(&M.m, NULL, &bad, &out, 1, 0, &err) == -1 && strstr(err.msg, "aligned"),
              "misaligned residual: '%s'", err.msg);
        cudaFree(dres); cudaFree(dg); cudaFree(dy);
        free(w); free(res); free(g); free(xn); free(ref); free(y); free(glu); free(yb);
        mat_free(&M);
    }
}

/* GemvOut's add mode (the residual stream += the product rounded to bf16)
 * for every kernel at T = 1 and 3 (x8: T = 1): y starts at values 100x the product's,
 * so a store that overwrote, or added twice, misses by far more than bf16's
 * rounding of the product. */
static void test_add_out(void) {
    const int64_t rows = 640, cols = 1536;
    Mat M;
    if (mat_build(&M, DT_Q4_K, rows, cols)) return;
    float *w = malloc((size_t)rows * cols * sizeof *w), *x = malloc(3 * cols * sizeof *x), *b = malloc(rows * 4);
    float *y0 = malloc(3 * rows * 4), *y = malloc(3 * rows * 4), *ref = malloc(3 * rows * 4), *got = malloc(3 * rows * 4);
    uint16_t *xb = malloc(3 * cols * 2);
    int64_t rb = (int64_t)dtype_row_bytes(M.type, cols);
    for (int64_t r = 0; r < rows; r++) dequantize_row(M.type, M.native + r * rb, w + r * cols, cols), b[r] = frand();
    for (int64_t k = 0; k < 3 * cols; k++) xb[k] = fp32_to_bf16(frand()), x[k] = bf16_to_fp32(xb[k]);
    void *dx = NULL, *dy = NULL, *db = NULL;
    int rc = cudaMalloc(&dx, 3 * cols * 2) || cudaMalloc(&dy, 3 * rows * 4) || cudaMalloc(&db, rows * 4) ||
             cudaMemcpy(dx, xb, 3 * cols * 2, cudaMemcpyHostToDevice) || cudaMemcpy(db, b, rows * 4, cudaMemcpyHostToDevice);
    for (int k = QGEMV_SCALAR; !rc && k <= QGEMV_X8; k++)
        for (int T = 1; T <= 3; T += 2) {
            if (!quant_gemv_takes((QuantGemvKernel)k, &M.m, T, false)) continue;
            float *xr = malloc(T * cols * sizeof *xr);
            memcpy(xr, x, T * cols * sizeof *xr);
            if (k == QGEMV_X8) for (int t = 0; t < T; t++) round_x_int8(xr + t * cols, cols);
            double ymax = 0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double acc = b[r];
                    for (int64_t c = 0; c < cols; c++) acc += (double)w[r * cols + c] * xr[t * cols + c];
                    ref[t * rows + r] = (float)acc, ymax = fmax(ymax, fabs(acc));
                }
            for (int64_t i = 0; i < T * rows; i++) y0[i] = (float)(100 * ymax * frand());
            Err err = {{0}};
            GemvOut out = gemv_out_one(dy, true, (const float *)db, rows);
            out.add = true;
            int r2 = cudaMemcpy(dy, y0, T * rows * 4, cudaMemcpyHostToDevice) ||
                     quant_gemv(&M.m, dx, false, &out, T, (QuantGemvKernel)k, 0, &err) || cudaDeviceSynchronize() ||
                     cudaMemcpy(y, dy, T * rows * 4, cudaMemcpyDeviceToHost);
            CHECK(!r2, "add mode %s T=%d: %s", KNAME[k], T, err.msg);
            for (int64_t i = 0; !r2 && i < T * rows; i++) got[i] = y[i] - y0[i];
            double e = r2 ? INFINITY : test_row_err(got, ref, (int)(T * rows));
            CHECK(e <= 1e-2, "add mode %s T=%d: (y - y0) vs the product: rel err %.3g", KNAME[k], T, e);
            free(xr);
        }
    cudaFree(dx); cudaFree(dy); cudaFree(db);
    free(w); free(x); free(b); free(y0); free(y); free(ref); free(got); free(xb);
    mat_free(&M);
}

/* ---- timing ---- */

typedef int (*LaunchFn)(Mat *copies, int i, void *ctx);

/* One sample = LOOP back-to-back launches between two events, so the host's
 * launch cost overlaps the kernels (as in a CUDA graph) instead of being
 * counted; the median of REPS samples, per launch. */
static float median_us(Mat *copies, LaunchFn fn, void *ctx) {
    enum { REPS = 15, LOOP = 20 };
    float ms[REPS];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 5; i++) fn(copies, i, ctx);
    for (int i = 0; i < REPS; i++) {
        cudaEventRecord(e0, 0);
        for (int k = 0; k < LOOP; k++) fn(copies, k, ctx);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(ms, REPS, sizeof *ms, quant_cmp_float);
    return ms[REPS / 2] * 1000.0f / LOOP;
}

typedef struct { void *x, *y; int T; QuantGemvKernel k; void *dst; } TimeCtx;

static int run_gemv(Mat *c, int i, void *ctx) {
    TimeCtx *t = ctx;
    Err err;
    const GemvOut out = gemv_out_one(t->y, false, NULL, c[i % 4].rows);
    return quant_gemv(&c[i % 4].m, t->x, false, &out, t->T, t->k, 0, &err);
}

static int run_dequant(Mat *c, int i, void *ctx) {
    TimeCtx *t = ctx;
    Err err;
    return quant_dequant_bf16(&c[i % 4].m, 0, c[i % 4].rows, t->dst, 0, &err);
}

/* One matrix shape: every kernel that takes it at T = 1 (and at 8 where it
 * takes that), and with full the dequantize kernel too. */
static void time_shape(DType type, int64_t rows, int64_t cols, bool full, void *x, void *y, void *dst) {
    Mat c[4];
    int ok = 1;
    for (int k = 0; k < 4; k++) ok = ok && !mat_build(&c[k], type, rows, cols);
    if (!ok) return;
    double qbytes = (double)rows * (double)dtype_row_bytes(type, cols);
    for (int k = QGEMV_SCALAR; k <= QGEMV_X8; k++) {
        if (!quant_gemv_takes((QuantGemvKernel)k, &c[0].m, 1, false)) continue;
        TimeCtx t1 = {x, y, 1, (QuantGemvKernel)k, NULL}, t8 = {x, y, 8, (QuantGemvKernel)k, NULL};
        TimeCtx td = {0, 0, 0, QGEMV_SCALAR, dst};
        float u1 = median_us(c, run_gemv, &t1);
        float u8 = quant_gemv_takes((QuantGemvKernel)k, &c[0].m, 8, false) ? median_us(c, run_gemv, &t8) : NAN;
        char dq[64] = "";
        if (full && k == QGEMV_SCALAR) {
            float ud = median_us(c, run_dequant, &td);
            double b = qbytes + (double)rows * cols * 2;
            snprintf(dq, sizeof dq, "%8.1f %6.0f %5.1f%%", ud, b / ud * 1e-3, 100 * b / (ud * 1e-6) / COPY_BW);
        }
        printf("# %-5s %6lldx%-5lld %7.2f %-6s | %7.1f %6.0f %5.1f%% | %7.1f %6.0f %5.1f%% | %s\n",
               dtype_info(type)->name, (long long)rows, (long long)cols, qbytes / 1e6, KNAME[k], u1, qbytes / u1 * 1e-3,
               100 * qbytes / (u1 * 1e-6) / COPY_BW, u8, qbytes / u8 * 1e-3, 100 * qbytes / (u8 * 1e-6) / COPY_BW, dq);
    }
    CHECK(cudaGetLastError() == cudaSuccess, "%s timing launches failed", dtype_info(type)->name);
    for (int k = 0; k < 4; k++) mat_free(&c[k]);
}

/* One GEMV, T rows of x, kernel k (--time): the timing line only. */
static void time_one(DType type, int64_t rows, int64_t cols, QuantGemvKernel k, int T) {
    void *x = NULL, *y = NULL;
    Mat c[4];
    int ok = cudaMalloc(&x, (size_t)T * cols * 2) == cudaSuccess && cudaMalloc(&y, (size_t)T * rows * 4) == cudaSuccess;
    for (int i = 0; ok && i < 4; i++) ok = !mat_build(&c[i], type, rows, cols);
    CHECK(ok, "--time: setup failed");
    if (!ok) return;
    const bool takes = quant_gemv_takes(k, &c[0].m, T, false);
    CHECK(takes, "--time: the %s kernel does not take this case", KNAME[k]);
    TimeCtx tc = {x, y, T, k, NULL};
    float us = takes ? median_us(c, run_gemv, &tc) : NAN;
    double qbytes = (double)rows * (double)dtype_row_bytes(type, cols);
    printf("# %s %lldx%lld %s T=%d: %.1f us, %.0f GB/s, %.1f%% of 4.26 TB/s\n", dtype_info(type)->name,
           (long long)rows, (long long)cols, KNAME[k], T, us, qbytes / us * 1e-3, 100 * qbytes / (us * 1e-6) / COPY_BW);
    CHECK(cudaGetLastError() == cudaSuccess, "--time launches failed");
    for (int i = 0; i < 4; i++) mat_free(&c[i]);
    cudaFree(x); cudaFree(y);
}

/* Every type at 4096x14336 in full, then Q4_K, Q8_0, Q6_K, Q5_K and Q4_0 at
 * the other matrix shapes of Llama-3-8B's decode step (qkv, o, gate+up, LM
 * head). */
static void test_timing(void) {
    void *x = NULL, *y = NULL, *dst = NULL;
    if (cudaMalloc(&x, 8 * 14336 * 2) || cudaMalloc(&y, 8 * 128256 * 4) || cudaMalloc(&dst, 4096 * 14336 * 2)) {
        CHECK(0, "timing: cudaMalloc failed");
        return;
    }
    uint16_t *xh = malloc(8 * 14336 * 2);
    for (int64_t i = 0; i < 8 * 14336; i++) xh[i] = fp32_to_bf16(frand());
    cudaMemcpy(x, xh, 8 * 14336 * 2, cudaMemcpyHostToDevice);
    free(xh);
    printf("# timing, x bf16, y bf16: per launch, median of 15 runs of 20 back-to-back launches over 4 rotating copies\n");
    printf("# %-5s %12s %7s %-6s | %-22s | %-22s | %s\n", "type", "shape", "MB", "kernel", "T=1 us   GB/s  %4.26",
           "T=8 us   GB/s  %", "dequant->bf16 us GB/s %");
    for (int i = 0; i < N_TYPES; i++) time_shape(TYPES[i], 4096, 14336, true, x, y, dst);
    const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {128256, 4096}};
    /* Q6_K: the LM head and some matrices of Q4_K_M files; Q5_K: Q5_K_M's */
    const DType both[5] = {DT_Q4_K, DT_Q8_0, DT_Q6_K, DT_Q5_K, DT_Q4_0};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 5; k++) time_shape(both[k], shapes[i][0], shapes[i][1], false, x, y, dst);
    cudaFree(x); cudaFree(y); cudaFree(dst);
}

int main(int argc, char **argv) {
    if (!quant_have_device()) return 1;
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc == 7 && !strcmp(argv[1], "--time")) { /* one case, for a profiler: --time TYPE ROWS COLS KERNEL T */
        DType t = DT_COUNT;
        for (int i = 0; i < N_TYPES; i++)
            if (!strcasecmp(argv[2], dtype_info(TYPES[i])->name)) t = TYPES[i];
        int64_t rows = atoll(argv[3]), cols = atoll(argv[4]);
        int k = 0;
        while (k < 3 && strcasecmp(argv[5], KNAME[k])) k++;
        CHECK(t != DT_COUNT && rows > 0 && cols > 0 && k < 3, "--time %s %s %s %s: bad type, shape or kernel (scalar, "
              "mma, x8)", argv[2], argv[3], argv[4], argv[5]);
        if (t != DT_COUNT && rows > 0 && cols > 0 && k < 3) time_one(t, rows, cols, (QuantGemvKernel)k, atoi(argv[6]));
        TEST_EXIT();
    }
    RUN(test_refused);
    RUN(test_small_shapes);
    RUN(test_parts);
    RUN(test_glu);
    RUN(test_norm_x8);
    RUN(test_add_out);
    RUN(test_dequant_ahead);
    if (!quick) {
        RUN(test_big_shapes);
        RUN(test_timing);
    }
    TEST_EXIT();
}
