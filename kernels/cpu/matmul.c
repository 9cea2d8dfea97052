/* matmul.c — y = x @ W^T (+ bias) on the CPU, and the embedding lookup.
 *
 * Parallel over W's rows. Each weight row is turned into fp32 once per call
 * (F32 rows are read in place; other dtypes are dequantized into a buffer on
 * the worker's stack) and dotted with all T input rows, four x rows at a time
 * so each weight value loaded serves four products. Accumulation is fp32 in
 * eight independent partial sums held in two 4-lane vectors.
 *
 * Quantized rows are decoded in pieces of MATMUL_PIECE values: a fixed stack
 * buffer whatever the row length, so there is no allocation (and no failure
 * path) in an op that cannot return an error. A piece is a multiple of every
 * block size, so pieces start on block boundaries.
 *
 * FP8 (DT_F8_E4M3) weights multiply FP8 activations, as the GPU's FP8 x FP8
 * tensor-core GEMMs do: each input row x_t is first rounded to e4m3 codes
 * with one fp32 scale s_t, then
 *
 *     y[t][r] = (sum_i e4m3(xq_t[i]) * e4m3(w_r[i])) * (s_t * scale[r])
 *
 * with the sum in fp32 (each product of two e4m3 values is exact in fp32).
 * The rounding of x (base/dtype.c fp32_to_e4m3: round to nearest, ties to
 * even, saturating at +-448, NaN stays NaN):
 *   dynamic (input_scale == 0): s_t = amax_t / 448 in fp32, amax_t = max_i
 *     |x_t[i]|; code_i = fp32_to_e4m3(x_t[i] / s_t) (an all-zero row: s_t =
 *     0, codes 0) -- fp8_quantize_row;
 *   static (input_scale > 0): s_t = input_scale; code_i =
 *     fp32_to_e4m3(x_t[i] / input_scale), saturating.
 * The rounded rows live in one buffer per call (malloc'd; out of memory
 * aborts, as the backend's scratch does: the op cannot return an error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define MATMUL_PIECE 4096

/* Four fp32 lanes (GCC vector extension: SSE on x86-64, NEON on arm64);
 * loaded with memcpy because rows need not be 16-byte aligned. */
typedef float F32x4 __attribute__((vector_size(16)));

static F32x4 load4(const float *p) {
    F32x4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The eight partial sums (lanes of lo and hi) combined pairwise, then the
 * tail x[i..n) . w[i..n). */
static float finish_dot(F32x4 lo, F32x4 hi, const float *x, const float *w, int64_t i, int64_t n) {
    float r = ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
    for (; i < n; i++) r += x[i] * w[i];
    return r;
}

/* w . x in fp32 over eight independent partial sums. */
static float dot_f32(const float *w, const float *x, int64_t n) {
    F32x4 lo = {0}, hi = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        lo += load4(x + i) * load4(w + i);
        hi += load4(x + i + 4) * load4(w + i + 4);
    }
    return finish_dot(lo, hi, x, w, i, n);
}

/* out[r] = w . x_r for four rows at once, each weight load serving four
 * products. Lane for lane the same operations as dot_f32, so a row's result
 * does not depend on whether it fell in a group of four. */
static void dot4_f32(const float *w, const float *x0, const float *x1, const float *x2, const float *x3,
                     int64_t n, float out[4]) {
    F32x4 lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0}, lo2 = {0}, hi2 = {0}, lo3 = {0}, hi3 = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        F32x4 wlo = load4(w + i), whi = load4(w + i + 4);
        lo0 += load4(x0 + i) * wlo;
        hi0 += load4(x0 + i + 4) * whi;
        lo1 += load4(x1 + i) * wlo;
        hi1 += load4(x1 + i + 4) * whi;
        lo2 += load4(x2 + i) * wlo;
        hi2 += load4(x2 + i + 4) * whi;
        lo3 += load4(x3 + i) * wlo;
        hi3 += load4(x3 + i + 4) * whi;
    }
    out[0] = finish_dot(lo0, hi0, x0, w, i, n);
    out[1] = finish_dot(lo1, hi1, x1, w, i, n);
    out[2] = finish_dot(lo2, hi2, x2, w, i, n);
    out[3] = finish_dot(lo3, hi3, x3, w, i, n);
}

typedef struct {
    float *y;                    /* [T][rows] */
    const float *x;              /* [T][cols]; FP8 weights: the e4m3 values of x's codes */
    const CpuMatrix *w;
    const float *bias;           /* [rows] or NULL */
    int T;
    const float *x_scale;        /* FP8 weights: [T] the scale of each row of x; else NULL */
} MatmulJob;

/* y[t][r] (+)= wrow[0..n) . x[t][c0 .. c0+n) for every t; `add` accumulates
 * onto what the previous piece left. */
static void rows_times_piece(const MatmulJob *j, int64_t r, const float *wrow, int64_t c0, int64_t n, bool add) {
    int64_t cols = j->w->cols, rows = j->w->rows;
    const float *x = j->x + c0;
    int t = 0;
    for (; t + 4 <= j->T; t += 4) {
        float d[4];
        dot4_f32(wrow, x + t * cols, x + (t + 1) * cols, x + (t + 2) * cols, x + (t + 3) * cols, n, d);
        for (int k = 0; k < 4; k++) {
            float *yv = &j->y[(int64_t)(t + k) * rows + r];
            *yv = add ? *yv + d[k] : d[k];
        }
    }
    for (; t < j->T; t++) {
        float d = dot_f32(wrow, x + (int64_t)t * cols, n);
        float *yv = &j->y[(int64_t)t * rows + r];
        *yv = add ? *yv + d : d;
    }
}

static void matmul_rows(void *ctx, int64_t r0, int64_t r1) {
    const MatmulJob *j = ctx;
    const CpuMatrix *w = j->w;
    /* An unknown dtype (a caller bug) reads no bytes: dequantize_row gives NaN. */
    const DTypeInfo *info = dtype_info(w->type);
    int64_t block_elems = info ? info->block_elems : 1, block_bytes = info ? info->block_bytes : 0;
    float buf[MATMUL_PIECE];
    for (int64_t r = r0; r < r1; r++) {
        const char *row = (const char *)w->data + r * w->row_bytes;
        if (w->type == DT_F32) {
            rows_times_piece(j, r, (const float *)row, 0, w->cols, false);
        } else {
            for (int64_t c0 = 0; c0 < w->cols; c0 += MATMUL_PIECE) {
                int64_t n = w->cols - c0 < MATMUL_PIECE ? w->cols - c0 : MATMUL_PIECE;
                dequantize_row(w->type, row + c0 / block_elems * block_bytes, buf, n);
                rows_times_piece(j, r, buf, c0, n, c0 > 0);
            }
        }
        if (j->x_scale) /* FP8: the sum of code products times both scales */
            for (int t = 0; t < j->T; t++) j->y[(int64_t)t * w->rows + r] *= j->x_scale[t] * w->scale[r];
        if (j->bias)
            for (int t = 0; t < j->T; t++) j->y[(int64_t)t * w->rows + r] += j->bias[r];
    }
}

/* x [T][cols] rounded to e4m3 as the header says: xq gets the codes'
 * values (exact in fp32), s[t] each row's scale; codes is room for one row. */
static void fp8_activations(const float *x, int T, int64_t cols, float input_scale, float *xq, float *s,
                            uint8_t *codes) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (int64_t)t * cols;
        if (input_scale > 0.0f) {
            s[t] = input_scale;
            for (int64_t i = 0; i < cols; i++) codes[i] = fp32_to_e4m3(xt[i] / input_scale);
        } else {
            fp8_quantize_row(xt, (int)cols, codes, &s[t]);
        }
        for (int64_t i = 0; i < cols; i++) xq[(int64_t)t * cols + i] = e4m3_to_fp32(codes[i]);
    }
}

void cpu_matmul(ThreadPool *tp, float *y, const float *x, const CpuMatrix *w, const float *bias, int T) {
    if (T <= 0 || w->rows <= 0) return;
    MatmulJob j = {y, x, w, bias, T, NULL};
    float *xq = NULL;
    if (w->type == DT_F8_E4M3) {
        size_t n = (size_t)T * (size_t)w->cols;
        xq = malloc((n + (size_t)T) * sizeof *xq + (size_t)w->cols);
        if (!xq) {
            fprintf(stderr, "cllm: out of memory rounding %d activation rows to FP8\n", T);
            abort();
        }
        fp8_activations(x, T, w->cols, w->input_scale, xq, xq + n, (uint8_t *)(xq + n + T));
        j.x = xq;
        j.x_scale = xq + (size_t)T * (size_t)w->cols;
    }
    cpu_parallel_for(tp, w->rows, matmul_rows, &j);
    free(xq);
}

/* An id outside the table (a hostile prompt file can carry any number) gives a
 * zero row instead of a read out of bounds. */
void cpu_embed(float *out, const CpuMatrix *table, const int32_t *ids, int T, float scale) {
    for (int t = 0; t < T; t++) {
        float *o = out + (int64_t)t * table->cols;
        if (ids[t] < 0 || ids[t] >= table->rows) {
            memset(o, 0, (size_t)table->cols * sizeof *o);
            continue;
        }
        dequantize_row(table->type, (const char *)table->data + (int64_t)ids[t] * table->row_bytes, o, table->cols);
        if (scale != 1.0f)
            for (int64_t i = 0; i < table->cols; i++) o[i] *= scale;
    }
}
