/* matmul.c — y = x @ W^T (+ bias) on the CPU, and the embedding lookup.
 *
 * Parallel over W's rows: each thread dequantizes one weight row at a time
 * into its own fp32 buffer (F32 rows are used in place) and dots it with all
 * T input rows, so a weight row is decoded once per call whatever T is. */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

/* Eight independent partial sums let the compiler vectorize. */
static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

typedef struct {
    float *y;
    const float *x;
    const CpuMatrix *w;
    const float *bias;
    int T;
} MatmulJob;

/* Quantized rows are decoded in pieces of this many values (a multiple of
 * every block size) into a stack buffer: no allocation in the hot loop. */
#define MATMUL_PIECE 4096

static void matmul_rows(void *ctx, int64_t r0, int64_t r1) {
    const MatmulJob *j = ctx;
    const CpuMatrix *w = j->w;
    int64_t cols = w->cols;
    float buf[MATMUL_PIECE];
    const DTypeInfo *info = dtype_info(w->type);
    for (int64_t r = r0; r < r1; r++) {
        const char *row = (const char *)w->data + r * w->row_bytes;
        float b = j->bias ? j->bias[r] : 0.0f;
        if (w->type == DT_F32) {
            for (int t = 0; t < j->T; t++)
                j->y[(int64_t)t * w->rows + r] = dot_f32(j->x + (int64_t)t * cols, (const float *)row, cols) + b;
            continue;
        }
        for (int t = 0; t < j->T; t++) j->y[(int64_t)t * w->rows + r] = b;
        for (int64_t c0 = 0; c0 < cols; c0 += MATMUL_PIECE) {
            int64_t n = cols - c0 < MATMUL_PIECE ? cols - c0 : MATMUL_PIECE;
            dequantize_row(w->type, row + c0 / info->block_elems * info->block_bytes, buf, n);
            for (int t = 0; t < j->T; t++) j->y[(int64_t)t * w->rows + r] += dot_f32(j->x + (int64_t)t * cols + c0, buf, n);
        }
    }
}

void cpu_matmul(ThreadPool *tp, float *y, const float *x, const CpuMatrix *w, const float *bias, int T) {
    MatmulJob j = {y, x, w, bias, T};
    cpu_parallel_for(tp, w->rows, matmul_rows, &j);
}

void cpu_embed(float *out, const CpuMatrix *table, const int32_t *ids, int T, float scale) {
    for (int t = 0; t < T; t++) {
        float *o = out + (int64_t)t * table->cols;
        dequantize_row(table->type, (const char *)table->data + (int64_t)ids[t] * table->row_bytes, o, table->cols);
        if (scale != 1.0f)
            for (int64_t i = 0; i < table->cols; i++) o[i] *= scale;
    }
}
