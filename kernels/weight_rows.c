/* weight_rows.c — reading a weight's rows where they lie apart (kernels/weight_rows.h). */
#include "kernels/weight_rows.h"

#include <stdbool.h>
#include <string.h>

void weight_rows_gather(const WeightRef *w, int64_t r0, int64_t n, void *dst) {
    if (weight_row_stride(w) == w->row_bytes) { /* packed: one copy */
        memcpy(dst, weight_row(w, r0), (size_t)(n * w->row_bytes));
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy((char *)dst + (uint64_t)i * w->row_bytes, weight_row(w, r0 + i), w->row_bytes);
}

typedef struct {
    const WeightRef *w;
    char *dst;
} PackJob;

static void pack_rows(void *ctx, int64_t a, int64_t b) {
    const PackJob *j = ctx;
    weight_rows_gather(j->w, a, b - a, j->dst + (uint64_t)a * j->w->row_bytes);
}

void weight_rows_pack(ThreadPool *pool, const WeightRef *w, void *dst) {
    int64_t rows = w->rows * (w->n_mats > 0 ? w->n_mats : 1);
    PackJob job = {w, dst};
    if (pool) cpu_parallel_for(pool, rows, pack_rows, &job);
    else pack_rows(&job, 0, rows);
}

static bool strided(const WeightRef *w) { return w->data && weight_row_stride(w) != w->row_bytes; }

const char *weights_strided(const ModelWeights *w, int n_layers) {
    const WeightRef *whole[] = {&w->tok_embd, &w->output_norm, &w->output};
    for (int i = 0; i < 3; i++)
        if (strided(whole[i])) return whole[i]->name;
    for (int l = 0; w->layers && l < n_layers; l++) {
        const WeightRef *refs = (const WeightRef *)&w->layers[l];
        for (size_t i = 0; i < sizeof w->layers[l] / sizeof *refs; i++)
            if (strided(&refs[i])) return refs[i].name;
    }
    return NULL;
}
