/* tp_plan.c — the split of a model's layers over tensor-parallel ranks and
 * each rank's slice of the weights (parallel/tp_plan.h). */
#include "parallel/tp_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/thread_pool.h"
#include "kernels/weight_rows.h"
#include "parallel/stage_plan.h"

/* Rows [r0, r0 + n) of matrix w: a view (a row is whole in every type). */
static WeightRef rows_view(const WeightRef *w, int64_t r0, int64_t n) {
    WeightRef v = *w;
    if (!w->data) return v;
    v.data = weight_row(w, r0);
    v.rows = n;
    if (w->scale) v.scale = w->scale + r0;
    return v;
}

/* Elements [c0, c0 + n) of vector w (a bias, the sinks): a view. */
static int vector_view(WeightRef *v, const WeightRef *w, int64_t c0, int64_t n, Err *err) {
    *v = *w;
    if (!w->data) return 0;
    const DTypeInfo *ti = dtype_info(w->type);
    if (w->rows != 1 || !ti || ti->block_elems != 1)
        return err_set(err, "%s is a %lld x %lld %s tensor; a split vector must be one row of plain values",
                       w->name, (long long)w->rows, (long long)w->cols, ti ? ti->name : "unknown");
    v->data = (const char *)w->data + dtype_row_bytes(w->type, (uint64_t)c0);
    v->cols = n;
    v->row_bytes = dtype_row_bytes(w->type, (uint64_t)n);
    return 0;
}

/* Columns [c0, c0 + n) of matrix w (Wo, Wdown): every row's byte range,
 * a view whose rows lie the model's row stride apart (what the GPU upload
 * reads); with pool, packed into a buffer rm owns instead (the CPU backend
 * computes from packed rows), rows copied on pool's threads. Row scales
 * (FP8) stay whole: a row keeps its scale. Quantized blocks are not cut: c0
 * and n must be whole blocks. */
static int columns_slice(TpRankModel *rm, WeightRef *v, const WeightRef *w, int64_t c0, int64_t n, ThreadPool *pool,
                         Err *err) {
    *v = *w;
    if (!w->data) return 0;
    const DTypeInfo *ti = dtype_info(w->type);
    int be = ti ? ti->block_elems : 1;
    if (c0 % be || n % be)
        return err_set(err, "%s (%s) would be split at column %lld, inside its blocks of %d values", w->name,
                       ti ? ti->name : "?", (long long)(c0 % be ? c0 : c0 + n), be);
    uint64_t rb = dtype_row_bytes(w->type, (uint64_t)n);
    v->data = (const char *)w->data + dtype_row_bytes(w->type, (uint64_t)c0);
    v->cols = n;
    v->row_bytes = rb;
    v->src_stride = weight_row_stride(w);
    if (!pool) return 0;
    char *buf = malloc((size_t)(w->rows * rb));
    void **grown = realloc(rm->owned, (size_t)(rm->n_owned + 1) * sizeof *grown);
    if (!buf || !grown) {
        free(buf);
        if (grown) rm->owned = grown;
        return err_set(err, "out of memory for a copy of %s's columns (%llu bytes)", w->name,
                       (unsigned long long)(w->rows * rb));
    }
    rm->owned = grown;
    rm->owned[rm->n_owned++] = buf;
    weight_rows_pack(pool, v, buf);
    v->data = buf;
    v->src_stride = 0;
    return 0;
}

/* Layer l of rank r: its heads' rows of Wq/Wk/Wv, their columns of Wo, its
 * MLP rows of Wgate/Wup and columns of Wdown. */
static int slice_layer(TpRankModel *rm, LayerWeights *d, const LayerWeights *s, const ModelConfig *c, const TpPlan *p,
                       int r, ThreadPool *pool, Err *err) {
    int64_t Dk = c->head_dim_k, Dv = c->head_dim_v, h0 = p->head0[r], nh = p->n_heads[r];
    int64_t k0 = p->kv0[r], nk = p->n_kv[r], f0 = p->ffn0[r], nf = p->n_ffn[r];
    *d = *s;
    d->wq = rows_view(&s->wq, h0 * Dk, nh * Dk);
    d->wk = rows_view(&s->wk, k0 * Dk, nk * Dk);
    d->wv = rows_view(&s->wv, k0 * Dv, nk * Dv);
    d->w_gate = rows_view(&s->w_gate, f0, nf);
    d->w_up = rows_view(&s->w_up, f0, nf);
    if (r > 0) { /* added once, after the reduce: rank 0's */
        memset(&d->bo, 0, sizeof d->bo);
        memset(&d->b_down, 0, sizeof d->b_down);
    }
    if (vector_view(&d->bq, &s->bq, h0 * Dk, nh * Dk, err) || vector_view(&d->bk, &s->bk, k0 * Dk, nk * Dk, err) ||
        vector_view(&d->bv, &s->bv, k0 * Dv, nk * Dv, err) || vector_view(&d->sinks, &s->sinks, h0, nh, err) ||
        vector_view(&d->b_gate, &s->b_gate, f0, nf, err) || vector_view(&d->b_up, &s->b_up, f0, nf, err) ||
        columns_slice(rm, &d->wo, &s->wo, h0 * Dv, nh * Dv, pool, err) ||
        columns_slice(rm, &d->w_down, &s->w_down, f0, nf, pool, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "--tp %d: rank %d: %s", p->n_ranks, r, why);
    }
    return 0;
}

int tp_rank_make(TpRankModel *rm, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                 const TpPlan *p, int r, bool copy, Err *err) {
    memset(rm, 0, sizeof *rm);
    if (r < 0 || r >= p->n_ranks) return err_set(err, "--tp %d: rank %d outside the group", p->n_ranks, r);
    rm->rank = r;
    rm->cfg = *c;
    rm->cfg.n_heads = p->n_heads[r];
    rm->cfg.n_kv_heads = p->n_kv[r];
    rm->cfg.ffn_dim = p->n_ffn[r];
    rm->shape = *shape;
    rm->shape.n_heads = p->n_heads[r];
    rm->shape.n_kv_heads = p->n_kv[r];
    rm->shape.ffn_dim = p->n_ffn[r];
    rm->layers = calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *rm->layers);
    if (!rm->layers) return err_set(err, "out of memory");
    rm->w = *w;
    rm->w.layers = rm->layers;
    rm->w.output = rows_view(&w->output, p->vocab0[r], p->n_vocab[r]);
    ThreadPool *pool = copy ? thread_pool_create(0, err) : NULL;
    int rc = copy && !pool ? -1 : 0;
    for (int l = 0; rc == 0 && l < c->n_layers; l++) rc = slice_layer(rm, &rm->layers[l], &w->layers[l], c, p, r, pool, err);
    thread_pool_destroy(pool);
    if (rc) tp_rank_free(rm);
    return rc;
}

void tp_rank_free(TpRankModel *rm) {
    for (int i = 0; i < rm->n_owned; i++) free(rm->owned[i]);
    free(rm->owned);
    free(rm->layers);
    memset(rm, 0, sizeof *rm);
}

int tp_plan_make(TpPlan *p, const ModelConfig *c, const ModelWeights *w, int n, Err *err) {
    memset(p, 0, sizeof *p);
    int H = c->n_heads, KV = c->n_kv_heads, F = c->ffn_dim, V = c->vocab;
    if (n < 1 || n > TP_MAX) return err_set(err, "--tp %d: between 1 and %d ranks", n, TP_MAX);
    if (c->n_experts > 0)
        return err_set(err, "--tp %d: a mixture-of-experts model (%d experts); tensor parallelism splits dense MLPs "
                       "only so far (--pp splits this one)", n, c->n_experts);
    if (H % n) return err_set(err, "--tp %d: the model's %d attention heads do not split evenly over %d ranks", n, H, n);
    if (KV <= 0 || (KV % n && n % KV))
        return err_set(err, "--tp %d: the model's %d KV heads neither split evenly over %d ranks nor replicate on "
                       "them (%d %% %d or %d %% %d must be 0)", n, KV, n, KV, n, n, KV);
    if (F % n) return err_set(err, "--tp %d: the MLP's %d columns (ffn_dim) do not split evenly over %d ranks", n, F, n);
    if (V < n) return err_set(err, "--tp %d: a vocabulary of %d tokens", n, V);
    p->n_ranks = n;
    p->head = w->output.data != NULL;
    for (int r = 0; r < n; r++) {
        p->head0[r] = r * (H / n);
        p->n_heads[r] = H / n;
        p->kv0[r] = KV >= n ? r * (KV / n) : p->head0[r] / (H / KV); /* the one KV head its query heads share */
        p->n_kv[r] = KV >= n ? KV / n : 1;
        p->ffn0[r] = r * (F / n);
        p->n_ffn[r] = F / n;
        p->vocab0[r] = (int)((int64_t)r * V / n);
        p->n_vocab[r] = (int)((int64_t)(r + 1) * V / n) - p->vocab0[r];
    }
    ModelShape none = {0};
    for (int r = 0; r < n; r++) { /* every slice is checked (quantized blocks) and counted */
        TpRankModel rm;
        if (tp_rank_make(&rm, c, &none, w, p, r, false, err)) return -1;
        for (int l = 0; l < c->n_layers; l++) p->bytes[r] += layer_device_bytes(&rm.layers[l]);
        /* a tied head's rows are a view of the rank's whole table (the CUDA backend's upload) */
        bool tied = w->output.data && w->output.data == w->tok_embd.data;
        p->bytes[r] += table_device_bytes(&w->tok_embd) + weight_device_bytes(&w->output_norm) +
                       (tied ? 0 : weight_device_bytes(&rm.w.output));
        tp_rank_free(&rm);
    }
    return 0;
}

/* "a-b", or "a" for one */
static const char *span(char *buf, size_t cap, int first, int n) {
    if (n == 1) snprintf(buf, cap, "%d", first);
    else snprintf(buf, cap, "%d-%d", first, first + n - 1);
    return buf;
}

uint64_t tp_plan_kv_bytes(const TpPlan *p, const ModelConfig *c, int r, int64_t kv_tokens, KVDtype kv_dtype) {
    uint64_t kv_head = kv_head_token_bytes(kv_dtype, c->head_dim_k, c->head_dim_v) * (uint64_t)c->n_layers;
    return kv_head * p->n_kv[r] * (uint64_t)kv_tokens;
}

void tp_plan_print(FILE *out, const TpPlan *p, const ModelConfig *c, int64_t kv_tokens, KVDtype kv_dtype,
                   int pp_stage) {
    if (pp_stage < 0)
        fprintf(out, "tensor parallel        %d ranks, KV cache of %lld tokens (%s)\n", p->n_ranks,
                (long long)kv_tokens, kv_dtype_name(kv_dtype));
    for (int r = 0; r < p->n_ranks; r++) {
        uint64_t kv = tp_plan_kv_bytes(p, c, r, kv_tokens, kv_dtype);
        char label[32], h[32], k[32], f[32], v[32];
        snprintf(label, sizeof label, "%srank %d", pp_stage >= 0 ? "    " : "  ", r);
        fprintf(out, "%-22s heads %s, KV heads %s, MLP columns %s", label, span(h, sizeof h, p->head0[r], p->n_heads[r]),
                span(k, sizeof k, p->kv0[r], p->n_kv[r]), span(f, sizeof f, p->ffn0[r], p->n_ffn[r]));
        if (p->head) fprintf(out, ", LM head vocab %s", span(v, sizeof v, p->vocab0[r], p->n_vocab[r]));
        fprintf(out, ": ");
        plan_print_memory(out, p->bytes[r], kv);
    }
}
