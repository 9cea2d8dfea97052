/* fp8_weights.c — FP8 (e4m3) weight matrices: the scales of an FP8
 * checkpoint bound and checked, and --weights fp8's quantization at load.
 *
 * A checkpoint's F8_E4M3 matrix "<p>.weight" has its scale in
 * "<p>.weight_scale" (F32, BF16 or F16): one value (shape [] or [1]: per
 * tensor, repeated for every row here so the backends see one layout) or one
 * per output row (shape [rows, 1] or [rows]: per channel). With static
 * activations "<p>.input_scale" holds one value. Every scale must be a
 * positive finite number: a zero, negative or NaN scale would silently give
 * zero or NaN outputs, so it is a load error naming the tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/thread_pool.h"
#include "model/loader_internal.h"

/* "<name minus its trailing 'weight'><suffix>" ("q_proj.weight" ->
 * "q_proj.weight_scale" / "q_proj.input_scale"). */
static void scale_name(char *out, size_t cap, const char *name, const char *suffix) {
    size_t l = strlen(name), k = l >= 6 && !strcmp(name + l - 6, "weight") ? l - 6 : l;
    snprintf(out, cap, "%.*s%s", (int)k, name, suffix);
}

/* Value i of a scale tensor (F32, BF16, F16; the bytes may be unaligned). */
float fp8_scale_at(const TensorInfo *t, uint64_t i) {
    float v;
    dequantize_row(t->type, (const char *)t->data + i * (uint64_t)dtype_info(t->type)->block_bytes, &v, 1);
    return v;
}

/* Checks a scale tensor's dtype and every value. */
int fp8_check_scale_values(const Model *m, const TensorInfo *s, Err *err) {
    if (s->type != DT_F32 && s->type != DT_BF16 && s->type != DT_F16)
        return err_set(err, "%s: tensor '%s' is %s: a scale must be F32, BF16 or F16", m->path, s->name,
                       dtype_info(s->type)->name);
    uint64_t n = tensor_nelems(s);
    for (uint64_t i = 0; i < n; i++) {
        float v = fp8_scale_at(s, i);
        if (!(v > 0.0f) || !isfinite(v))
            return err_set(err, "%s: tensor '%s': value %llu is %g; a scale must be a positive finite number",
                           m->path, s->name, (unsigned long long)i, v);
    }
    return 0;
}

int fp8_bind_scales(Model *m, WeightRef *w, const TensorInfo *t, Err *err) {
    char name[512];
    scale_name(name, sizeof name, t->name, "weight_scale");
    const TensorInfo *s = model_find(m, name);
    if (!s)
        return err_set(err, "%s: tensor '%s' is F8_E4M3 but its scale '%s' is missing", m->path, t->name, name);
    model_mark_used(m, s);
    uint64_t n = tensor_nelems(s), rows = (uint64_t)w->rows;
    bool per_tensor = n == 1 && s->ne[2] == 1 && s->ne[3] == 1;
    bool per_row = n == rows && s->ne[2] == 1 && s->ne[3] == 1 && (s->ne[0] == rows || (s->ne[0] == 1 && s->ne[1] == rows));
    if (!per_tensor && !per_row)
        return err_set(err, "%s: tensor '%s' has shape [%llu, %llu] (innermost first); the scale of '%s' (%llu rows) "
                       "must have shape [] or [1] (per tensor), or [%llu, 1] or [%llu] (per channel)", m->path, name,
                       (unsigned long long)s->ne[0], (unsigned long long)s->ne[1], t->name, (unsigned long long)rows,
                       (unsigned long long)rows, (unsigned long long)rows);
    if (fp8_check_scale_values(m, s, err)) return -1;
    float *sc = malloc(rows * sizeof *sc);
    if (model_own(m, sc, err)) return -1;
    for (uint64_t r = 0; r < rows; r++) sc[r] = fp8_scale_at(s, per_tensor ? 0 : r);
    w->scale = sc;
    w->input_scale = 0;
    scale_name(name, sizeof name, t->name, "input_scale");
    const TensorInfo *in = model_find(m, name);
    if (in) model_mark_used(m, in);
    if (!m->quant.static_input) return 0; /* dynamic: any input_scale is not used */
    if (!in)
        return err_set(err, "%s: tensor '%s' is missing: quantization_config (quant_method '%s') has static "
                       "activation scales", m->path, name, m->quant.method);
    if (tensor_nelems(in) != 1)
        return err_set(err, "%s: tensor '%s' has %llu values; a static input scale is one value (shape [] or [1])",
                       m->path, name, (unsigned long long)tensor_nelems(in));
    if (fp8_check_scale_values(m, in, err)) return -1;
    w->input_scale = fp8_scale_at(in, 0);
    return 0;
}

/* Rows [begin, end) of one matrix to codes and scales: a thread pool's share
 * (an 8B model's 7e9 values took 100 s on one core). */
typedef struct {
    const WeightRef *w;
    uint8_t *codes;
    float *scale;
} QuantizeJob;

static void quantize_rows(void *ctx, int64_t begin, int64_t end) {
    const QuantizeJob *j = ctx;
    const int64_t cols = j->w->cols;
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) { /* scale stays NaN: the caller sees it */
        for (int64_t r = begin; r < end; r++) j->scale[r] = NAN;
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        dequantize_row(j->w->type, (const char *)j->w->data + r * j->w->row_bytes, row, cols);
        j->scale[r] = fp8_quantize_weight_row(row, cols, j->codes + r * cols);
    }
    free(row);
}

/* One matrix to e4m3 codes and per-row scales, in buffers the model owns. */
static int quantize_matrix(Model *m, ThreadPool *tp, WeightRef *w, Err *err) {
    if (!w->data || w->type == DT_F8_E4M3) return 0;
    if (w->type != DT_F32 && w->type != DT_F16 && w->type != DT_BF16)
        return err_set(err, "%s: --weights fp8: tensor '%s' is already quantized (%s); --weights fp8 quantizes "
                       "float (F32, F16, BF16) matrices only: load a float copy of the model", m->path, w->name,
                       dtype_info(w->type)->name);
    int64_t rows = w->rows * w->n_mats, cols = w->cols;
    uint8_t *codes = malloc((size_t)rows * (size_t)cols);
    float *scale = malloc((size_t)rows * sizeof *scale);
    if (model_own(m, codes, err) || model_own(m, scale, err)) return -1;
    QuantizeJob job = {w, codes, scale};
    cpu_parallel_for(tp, rows, quantize_rows, &job);
    for (int64_t r = 0; r < rows; r++)
        if (isnan(scale[r])) return err_set(err, "%s: out of memory quantizing '%s'", m->path, w->name);
    w->data = codes;
    w->type = DT_F8_E4M3;
    w->row_bytes = (uint64_t)cols;
    w->scale = scale;
    w->input_scale = 0;
    return 0;
}

int fp8_quantize_weights(Model *m, Err *err) {
    ThreadPool *tp = thread_pool_create(0, err);
    if (!tp) return -1;
    int rc = 0;
    for (int l = 0; rc == 0 && l < m->cfg.n_layers; l++) {
        LayerWeights *lw = &m->w.layers[l];
        WeightRef *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (size_t i = 0; rc == 0 && i < sizeof mats / sizeof *mats; i++) rc = quantize_matrix(m, tp, mats[i], err);
    }
    if (rc == 0 && m->w.output.data != m->w.tok_embd.data) /* tied: the embedding stays as it is */
        rc = quantize_matrix(m, tp, &m->w.output, err);
    thread_pool_destroy(tp);
    return rc;
}
