/* test_weight_rows.c — a column slice read through its source stride
 * (kernels/weight_rows.h): what the GPU upload stages and the CPU ranks'
 * copies hold.
 *
 * Matrices of bf16, Q8_0 (blocks of 32 values) and F8_E4M3 (a scale per
 * row) are cut to a range of columns, as a tensor-parallel rank's Wo and
 * Wdown are (parallel/tp_plan.c): data at the first column, row_bytes the
 * slice's, src_stride the matrix's. A range of rows gathered, and the whole
 * slice packed on a thread pool and on one thread, must hold, dequantized,
 * exactly those columns of the matrix's rows. */
#include <string.h>

#include "base/dtype.h"
#include "base/quantize.h"
#include "base/thread_pool.h"
#include "kernels/weight_rows.h"
#include "tests/test.h"

#define ROWS 37 /* more rows than the pool has threads, and not a multiple of them */

/* The value at (r, c) of every test matrix: distinct and in e4m3 range. */
static float value_at(int64_t r, int64_t c) { return (float)((r * 131 + c * 17) % 97 - 48) * 0.125f; }

/* A ROWS x cols matrix of type t, each row quantized from value_at (FP8: codes of value / scale[r]). */
static void *make_matrix(DType t, int64_t cols, float *scale) {
    uint64_t rb = dtype_row_bytes(t, (uint64_t)cols);
    char *m = malloc(ROWS * rb);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; m && row && r < ROWS; r++) {
        if (scale) scale[r] = 0.5f + 0.25f * (float)(r % 4);
        for (int64_t c = 0; c < cols; c++) row[c] = value_at(r, c);
        if (t == DT_F8_E4M3)
            for (int64_t c = 0; c < cols; c++) ((uint8_t *)m)[r * rb + c] = fp32_to_e4m3(row[c] / scale[r]);
        else
            CHECK(quantize_row(t, row, m + r * rb, cols) == 0, "quantize a %s row", dtype_info(t)->name);
    }
    free(row);
    return m;
}

/* Row r of a matrix or packed slice (row_bytes) dequantized into out[n]. */
static void row_values(const WeightRef *w, const void *row, int64_t r, int64_t n, float *out) {
    if (w->type == DT_F8_E4M3) fp8_dequantize_row(row, (int)n, w->scale[r], out);
    else dequantize_row(w->type, row, out, n);
}

/* packed: rows [r0, r0 + n) of slice v (columns [c0, c0 + v->cols) of m) back to back; each must dequantize to
 * those columns of m's row. */
static bool same_columns(const WeightRef *m, const WeightRef *v, const char *packed, int64_t r0, int64_t n, int64_t c0) {
    float *whole = malloc((size_t)m->cols * sizeof *whole), *part = malloc((size_t)v->cols * sizeof *part);
    bool same = whole && part;
    for (int64_t i = 0; same && i < n; i++) {
        row_values(m, weight_row(m, r0 + i), r0 + i, m->cols, whole);
        row_values(v, packed + i * v->row_bytes, r0 + i, v->cols, part);
        same = !memcmp(whole + c0, part, (size_t)v->cols * sizeof *part);
    }
    free(whole);
    free(part);
    return same;
}

/* Columns [c0, c0 + n) of m, as tp_plan.c's columns_slice views them. */
static WeightRef column_view(const WeightRef *m, int64_t c0, int64_t n) {
    WeightRef v = *m;
    v.data = (const char *)m->data + dtype_row_bytes(m->type, (uint64_t)c0);
    v.cols = n;
    v.row_bytes = dtype_row_bytes(m->type, (uint64_t)n);
    v.src_stride = m->row_bytes;
    return v;
}

static void check_slices(DType t, int64_t cols, int64_t c0, int64_t n, ThreadPool *pool) {
    const char *name = dtype_info(t)->name;
    float scale[ROWS];
    void *data = make_matrix(t, cols, t == DT_F8_E4M3 ? scale : NULL);
    WeightRef m = {data, t, ROWS, cols, 1, dtype_row_bytes(t, (uint64_t)cols), "m", t == DT_F8_E4M3 ? scale : NULL, 0, 0};
    WeightRef v = column_view(&m, c0, n);
    char *got = calloc(ROWS, v.row_bytes), *one = calloc(ROWS, v.row_bytes);
    if (!data || !got || !one) {
        CHECK(0, "out of memory");
    } else {
        CHECK(weight_row(&v, 3) == (const char *)v.data + 3 * m.row_bytes, "%s: row 3 of the view", name);
        weight_rows_gather(&v, 5, 9, got);
        CHECK(same_columns(&m, &v, got, 5, 9, c0), "%s: rows 5-13 of columns %lld-%lld gathered", name, (long long)c0,
              (long long)(c0 + n - 1));
        weight_rows_pack(pool, &v, got);
        weight_rows_pack(NULL, &v, one);
        CHECK(same_columns(&m, &v, got, 0, ROWS, c0), "%s: the slice packed on the pool", name);
        CHECK(!memcmp(got, one, ROWS * v.row_bytes), "%s: the pool packs what one thread does", name);
        WeightRef packed = v;
        packed.data = got;
        packed.src_stride = 0;
        weight_rows_gather(&packed, 2, 4, one); /* packed rows: one copy of the range */
        CHECK(!memcmp(one, got + 2 * v.row_bytes, 4 * v.row_bytes), "%s: packed rows 2-5", name);
    }
    free(got);
    free(one);
    free(data);
}

static void test_column_slices(void) {
    Err err = {{0}};
    ThreadPool *pool = thread_pool_create(4, &err);
    CHECK(pool, "%s", err.msg);
    if (!pool) return;
    check_slices(DT_BF16, 40, 8, 16, pool);   /* a middle range */
    check_slices(DT_BF16, 40, 20, 20, pool);  /* the second of two ranks */
    check_slices(DT_Q8_0, 128, 32, 64, pool); /* whole blocks 1-2 of 4 */
    check_slices(DT_Q8_0, 128, 96, 32, pool); /* the last block */
    check_slices(DT_F8_E4M3, 48, 16, 16, pool);
    thread_pool_destroy(pool);
}

/* What the CPU backend refuses: a matrix whose rows lie apart, by name. */
static void test_strided_named(void) {
    static char bytes[8 * 64];
    LayerWeights layers[2];
    ModelWeights w = {0};
    memset(layers, 0, sizeof layers);
    w.layers = layers;
    WeightRef m = {bytes, DT_BF16, 8, 32, 1, 64, "blk.1.attn_output.weight", NULL, 0, 0};
    layers[1].wo = m;
    CHECK(weights_strided(&w, 2) == NULL, "packed rows: none named");
    layers[1].wo = column_view(&m, 16, 16);
    const char *name = weights_strided(&w, 2);
    CHECK(name && !strcmp(name, "blk.1.attn_output.weight"), "the view is named (%s)", name ? name : "none");
    CHECK(weights_strided(&w, 1) == NULL, "layers past n_layers are not read");
}

int main(void) {
    RUN(test_column_slices);
    RUN(test_strided_named);
    TEST_EXIT();
}
