/* matmul.c — y = x @ W^T (+ bias) on the CPU, and the embedding lookup.
 *
 * Parallel over W's rows. Each weight row is turned into fp32 once per call
 * (F32 rows are read in place; other dtypes are dequantized into a buffer on
 * the worker's stack) and dotted with all T input rows, four x rows at a time
 * so each weight value loaded serves four products. Accumulation is fp32 in
 * eight independent lanes, which gcc turns into SIMD without -ffast-math.
 *
 * Quantized rows are decoded in pieces of MATMUL_PIECE values: a fixed stack
 * buffer whatever the row length, so there is no allocation (and no failure
 * path) in an op that cannot return an error. A piece is a multiple of every
 * block size, so pieces start on block boundaries.
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define MATMUL_PIECE 4096
#define LANES 8

/* sum_i a[i] * b[i] in fp32, LANES partial sums combined pairwise. */
static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* out[r] = w . x_r for the four rows x0..x3 (same order of operations as
 * dot_f32, so a row's result does not depend on which group it falls in). */
static void dot4_f32(const float *w, const float *x0, const float *x1, const float *x2, const float *x3,
                     int64_t n, float out[4]) {
    float s0[LANES] = {0}, s1[LANES] = {0}, s2[LANES] = {0}, s3[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) {
            float wk = w[i + k];
            s0[k] += x0[i + k] * wk;
            s1[k] += x1[i + k] * wk;
            s2[k] += x2[i + k] * wk;
            s3[k] += x3[i + k] * wk;
        }
    float *s[4] = {s0, s1, s2, s3};
    const float *x[4] = {x0, x1, x2, x3};
    for (int r = 0; r < 4; r++) {
        float *p = s[r];
        float acc = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        for (int64_t j = i; j < n; j++) acc += x[r][j] * w[j];
        out[r] = acc;
    }
}

typedef struct {
    float *y;                    /* [T][rows] */
    const float *x;              /* [T][cols] */
    const CpuMatrix *w;
    const float *bias;           /* [rows] or NULL */
    int T;
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
    const DTypeInfo *info = dtype_info(w->type);
    float buf[MATMUL_PIECE];
    for (int64_t r = r0; r < r1; r++) {
        const char *row = (const char *)w->data + r * w->row_bytes;
        if (w->type == DT_F32) {
            rows_times_piece(j, r, (const float *)row, 0, w->cols, false);
        } else {
            for (int64_t c0 = 0; c0 < w->cols; c0 += MATMUL_PIECE) {
                int64_t n = w->cols - c0 < MATMUL_PIECE ? w->cols - c0 : MATMUL_PIECE;
                dequantize_row(w->type, row + c0 / info->block_elems * info->block_bytes, buf, n);
                rows_times_piece(j, r, buf, c0, n, c0 > 0);
            }
        }
        if (j->bias)
            for (int t = 0; t < j->T; t++) j->y[(int64_t)t * w->rows + r] += j->bias[r];
    }
}

void cpu_matmul(ThreadPool *tp, float *y, const float *x, const CpuMatrix *w, const float *bias, int T) {
    if (T <= 0 || w->rows <= 0) return;
    MatmulJob j = {y, x, w, bias, T};
    cpu_parallel_for(tp, w->rows, matmul_rows, &j);
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
