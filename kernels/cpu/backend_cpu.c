/* backend_cpu.c — the CPU backend: the Backend ops of kernels/backend.h on
 * host fp32 buffers, implemented by the reference ops of kernels/cpu/ (each
 * fused op is its plain ops in sequence, so this stays the oracle of the
 * fused GPU kernels). Weights are read in the model file's own dtype
 * (cpu_matmul dequantizes a row at a time). Both buffer kinds are fp32.
 *
 * Cascade attention (kernels/attn_cascade.h) is on by default: each layer's
 * plan is built from the step's batch (once per distinct window in a step)
 * and groups that pay attend their shared prefix once. CLLM_CASCADE, read at
 * creation: "off" (the plain path, for A/B runs), "on", "always" (every
 * group that can be formed, pays or not: tests).
 *
 * Overlapped steps (sample_launch, sample_result, feed_tokens): the CPU
 * runs a step's ops inside forward_launch and draws inside sample_launch
 * (kernels/sample_row.c, the rows over the thread pool), so nothing
 * overlaps here; the ops exist so that the engine's overlapped path (which
 * schedules step t+1 before it has taken step t's tokens) runs in CI. */
#include "kernels/cpu/backend_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/sample_row.h"

typedef struct {
    ThreadPool *tp;
    KVCacheHost kv;
    const ModelShape *shape;
    const int32_t *ids;       /* the step's inputs (begin_step) */
    const AttnBatch *batch;
    const int32_t *logit_rows;
    float *scratch;           /* gate/up of gate_up; MoE: router, rows, gate/up, out */
    int64_t scratch_elems;
    AttnCascadeMode cascade;
    AttnCascadePlan plan;     /* of this step, for layers of window plan_window */
    int plan_window;
    bool plan_built;          /* plan is this step's (begin_step clears it) */
    int64_t cascade_rows;     /* rows x layers attended through a group, ever */
    TpGroup *tp_group;        /* its tensor-parallel group (backend_cpu_join_tp), or NULL */
    int tp_rank;
    bool *calibrate;          /* --kv-scales calibrate: [n_layers] the layer's scales are still to be set; else NULL */
    int32_t *fed_ids;         /* [fed_cap] the step's ids with the fed rows replaced (feed_tokens) */
    int fed_cap;
    int32_t *drawn;           /* [drawn_cap] the last launched draw's tokens (-1: its row ran out of memory) */
    bool *drew;               /* [drawn_cap] and whether each used its uniform */
    int drawn_cap, n_drawn;   /* n_drawn: rows launched and not yet taken */
    float *kept;              /* [kept_cap][vocab] the launched draw's kept logits rows, in row order */
    int32_t *kept_row;        /* [drawn_cap] the row each of them is */
    int kept_cap, n_kept;
} CpuBackend;

static CpuBackend *cpu(Backend *be) { return be->ctx; }

static CpuMatrix cpu_matrix(const WeightRef *w, int mat) {
    return (CpuMatrix){(const char *)w->data + (uint64_t)mat * w->rows * w->row_bytes, w->type, w->rows, w->cols,
                       w->row_bytes, w->scale ? w->scale + (int64_t)mat * w->rows : NULL, w->input_scale};
}

/* Scratch of at least n floats; activations were sized at init and this is
 * of their order, so failing here is fatal. */
static float *cpu_scratch(CpuBackend *cb, int64_t n) {
    if (n > cb->scratch_elems) {
        free(cb->scratch);
        cb->scratch = malloc(n * sizeof(float));
        cb->scratch_elems = cb->scratch ? n : 0;
        if (!cb->scratch) abort();
    }
    return cb->scratch;
}

static void *cpu_alloc(Backend *be, int64_t n, BufKind kind) { return n > 0 ? calloc((size_t)n, sizeof(float)) : NULL; }
static void cpu_release(Backend *be, void *p) { free(p); }

static int cpu_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows,
                          int n_logits, StepRows *rows, Err *err) {
    CpuBackend *cb = cpu(be);
    cb->ids = ids;
    cb->batch = b;
    cb->logit_rows = logit_rows;
    cb->plan_built = false;
    *rows = (StepRows){b->n_tokens, n_logits};
    return 0;
}

static bool cpu_graph_replay(Backend *be) { return false; }
static void cpu_graph_capture(Backend *be, bool begin) {}

static void cpu_be_embed(Backend *be, void *out, const WeightRef *table, int T, float scale) {
    CpuMatrix m = cpu_matrix(table, 0);
    cpu_embed(out, &m, cpu(be)->ids, T, scale);
}

static void cpu_be_matmul(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias,
                          int T) {
    CpuMatrix m = cpu_matrix(w, mat);
    const float *b = bias && bias->data ? (const float *)bias->data + (int64_t)mat * bias->cols : NULL;
    cpu_matmul(cpu(be)->tp, y, x, &m, b, T);
}

/* x += the product (what add_rmsnorm would add later, in the same fp32 op):
 * the order of the fused ops runs in CI (forward.c's matmul_add branch). */
static bool cpu_be_matmul_add(Backend *be, void *x, const void *in, const WeightRef *w, int mat, const WeightRef *bias,
                              int T) {
    int64_t n = (int64_t)T * w->rows;
    float *y = cpu_scratch(cpu(be), n);
    cpu_be_matmul(be, y, in, w, mat, bias, T);
    cpu_add(x, y, n);
    return true;
}

static void cpu_be_add_rmsnorm(Backend *be, void *x, const void *delta, void *out, const WeightRef *w, int T, int C,
                               float eps, float offset) {
    if (delta) cpu_add_rmsnorm(x, delta, out, w->data, T, C, eps, offset);
    else cpu_rmsnorm(out, x, w->data, T, C, eps, offset);
}

static void cpu_be_rmsnorm(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                           float offset) {
    cpu_rmsnorm(out, x, w->data, rows, C, eps, offset);
}

static void cpu_be_qkv(Backend *be, void *q, void *k, void *v, const void *x, const LayerWeights *lw, int T) {
    cpu_be_matmul(be, q, x, &lw->wq, 0, &lw->bq, T);
    cpu_be_matmul(be, k, x, &lw->wk, 0, &lw->bk, T);
    cpu_be_matmul(be, v, x, &lw->wv, 0, &lw->bv, T);
}

static void cpu_be_rope_kv_write(Backend *be, int layer, void *q, void *k, const void *v, int T) {
    CpuBackend *cb = cpu(be);
    const ModelShape *c = cb->shape;
    const float *f = c->rope_inv_freq + (size_t)layer * (c->rope_dim / 2);
    const int32_t *pos = cb->batch->pos;
    const LayerWeights *lw = &be->weights->layers[layer];
    if (lw->q_norm.data) cpu_rmsnorm(q, q, lw->q_norm.data, T * c->n_heads, c->head_dim_k, c->norm_eps, c->norm_offset);
    if (lw->k_norm.data) cpu_rmsnorm(k, k, lw->k_norm.data, T * c->n_kv_heads, c->head_dim_k, c->norm_eps, c->norm_offset);
    cpu_rope(q, pos, T, c->n_heads, c->head_dim_k, c->rope_dim, f, c->rope_mscale[layer], c->rope_neox);
    cpu_rope(k, pos, T, c->n_kv_heads, c->head_dim_k, c->rope_dim, f, c->rope_mscale[layer], c->rope_neox);
    if (cb->calibrate && cb->calibrate[layer] && cpu_kv_calibrate(&cb->kv, layer, cb->batch, k, v))
        cb->calibrate[layer] = false; /* fixed from the first step that writes this layer on */
    cpu_kv_write(&cb->kv, layer, cb->batch, k, v);
}

/* The step's cascade plan for a layer of p's window; NULL when cascade is
 * off or the plan cannot be built (the plain path then runs: same result). */
static const AttnCascadePlan *cascade_plan(CpuBackend *cb, const AttnParams *p) {
    if (cb->cascade == ATTN_CASCADE_OFF) return NULL;
    if (cb->plan_built && cb->plan_window == p->window) return &cb->plan;
    attn_cascade_free(&cb->plan);
    AttnCascadeOpts o = {cb->cascade == ATTN_CASCADE_ALWAYS, thread_pool_size(cb->tp),
                         CPU_CASCADE_UNIT_ROWS * (p->n_heads / p->n_kv_heads), 64};
    Err err = {{0}};
    cb->plan_built = attn_cascade_plan(&cb->plan, cb->batch, p, &o, &err) == 0;
    cb->plan_window = p->window;
    return cb->plan_built ? &cb->plan : NULL;
}

static void cpu_be_attention(Backend *be, void *out, const void *q, int layer, const AttnParams *p, int T) {
    CpuBackend *cb = cpu(be);
    const AttnCascadePlan *plan = cascade_plan(cb, p);
    for (int g = 0; plan && g < plan->n_groups; g++) cb->cascade_rows += plan->groups[g].n_rows;
    cpu_attention_cascade(cb->tp, out, q, &cb->kv, layer, cb->batch, p, plan);
}

static void cpu_be_gate_up(Backend *be, void *out, const void *x, const LayerWeights *lw, int mat, int T,
                           Activation act, float limit) {
    int64_t n = (int64_t)T * lw->w_gate.rows;
    float *up = cpu_scratch(cpu(be), n);
    cpu_be_matmul(be, out, x, &lw->w_gate, mat, &lw->b_gate, T);
    cpu_be_matmul(be, up, x, &lw->w_up, mat, &lw->b_up, T);
    cpu_glu(out, out, up, n, act, limit);
}

static void cpu_be_gather_rows(Backend *be, void *dst, const void *src, int n, int C) {
    const int32_t *rows = cpu(be)->logit_rows;
    for (int i = 0; i < n; i++)
        memmove((float *)dst + (int64_t)i * C, (const float *)src + (int64_t)rows[i] * C, C * sizeof(float));
}

static void cpu_be_logits(Backend *be, void *logits, const void *x, const WeightRef *w, int n, float cap) {
    cpu_be_matmul(be, logits, x, w, 0, NULL, n);
    if (cap > 0) cpu_softcap(logits, (int64_t)n * w->rows, cap);
}

static int cpu_be_read(Backend *be, float *host, const void *buf, int64_t n, Err *err) {
    if (cpu(be)->tp_group && tp_group_broken(cpu(be)->tp_group))
        return err_set(err, "%s: tensor-parallel rank %d: another rank of its group failed", be->name, cpu(be)->tp_rank);
    if (n > 0) memcpy(host, buf, n * sizeof(float));
    return 0;
}

static int cpu_be_write(Backend *be, void *buf, const float *host, int64_t n, Err *err) {
    if (n > 0) memcpy(buf, host, n * sizeof(float));
    return 0;
}

/* ---- overlapped steps: the draw kept here, fed to the next step ---- */

typedef struct {
    CpuBackend *cb;
    float *logits;
    const SampleRow *rows;
} CpuDraw;

/* Rows [begin, end) of a launched draw; each row writes only its own outputs. */
static void cpu_draw_rows(void *ctx, int64_t begin, int64_t end) {
    CpuDraw *d = ctx;
    int V = d->cb->shape->vocab;
    SampleCand *cand = malloc((size_t)V * sizeof *cand);
    float *prob = malloc((size_t)V * sizeof *prob);
    for (int64_t i = begin; i < end; i++)
        d->cb->drawn[i] = cand && prob ? sample_row_draw(&d->rows[i], d->logits + i * V, V, cand, prob, &d->cb->drew[i])
                                       : -1;
    free(cand);
    free(prob);
}

/* Room for a draw of n rows, k of them kept. */
static int cpu_draw_room(CpuBackend *cb, int n, int k) {
    if (n > cb->drawn_cap) {
        int32_t *t = realloc(cb->drawn, (size_t)n * sizeof *t);
        if (t) cb->drawn = t;
        bool *d = realloc(cb->drew, (size_t)n * sizeof *d);
        if (d) cb->drew = d;
        int32_t *r = realloc(cb->kept_row, (size_t)n * sizeof *r);
        if (r) cb->kept_row = r;
        if (!t || !d || !r) return -1;
        cb->drawn_cap = n;
    }
    if (k > cb->kept_cap) {
        float *f = realloc(cb->kept, (size_t)k * cb->shape->vocab * sizeof *f);
        if (!f) return -1;
        cb->kept = f;
        cb->kept_cap = k;
    }
    return 0;
}

static int cpu_be_sample_launch(Backend *be, void *logits, int n, const SampleRow *rows, const bool *keep, Err *err) {
    CpuBackend *cb = cpu(be);
    int V = cb->shape->vocab, k = 0;
    for (int i = 0; keep && i < n; i++) k += keep[i];
    if (cpu_draw_room(cb, n, k)) return err_set(err, "%s: out of memory for a draw of %d rows", be->name, n);
    cb->n_kept = 0;
    for (int i = 0; keep && i < n; i++) /* before the draw penalizes them in place */
        if (keep[i]) {
            memcpy(cb->kept + (size_t)cb->n_kept * V, (const float *)logits + (size_t)i * V, (size_t)V * sizeof(float));
            cb->kept_row[cb->n_kept++] = i;
        }
    CpuDraw d = {cb, logits, rows};
    cpu_parallel_for(cb->tp, n, cpu_draw_rows, &d);
    cb->n_drawn = n;
    return 0;
}

static int cpu_be_sample_result(Backend *be, int32_t *tokens, bool *drew, float *kept, int n, Err *err) {
    CpuBackend *cb = cpu(be);
    if (n != cb->n_drawn) return err_set(err, "%s: %d drawn rows taken, %d launched", be->name, n, cb->n_drawn);
    cb->n_drawn = 0;
    for (int i = 0; i < n; i++)
        if (cb->drawn[i] < 0) return err_set(err, "%s: out of memory drawing row %d", be->name, i);
    memcpy(tokens, cb->drawn, (size_t)n * sizeof *tokens);
    memcpy(drew, cb->drew, (size_t)n * sizeof *drew);
    size_t V = (size_t)cb->shape->vocab;
    for (int j = 0; kept && j < cb->n_kept; j++)
        memcpy(kept + cb->kept_row[j] * V, cb->kept + j * V, V * sizeof *kept);
    return 0;
}

/* The step's ids are the caller's: copied here, then the fed rows replaced. */
static int cpu_be_feed_tokens(Backend *be, const int32_t *rows, const int32_t *src, int n, Err *err) {
    CpuBackend *cb = cpu(be);
    int T = cb->batch->n_tokens;
    if (T > cb->fed_cap) {
        int32_t *f = realloc(cb->fed_ids, (size_t)T * sizeof *f);
        if (!f) return err_set(err, "%s: out of memory for %d fed ids", be->name, T);
        cb->fed_ids = f;
        cb->fed_cap = T;
    }
    if (cb->ids != cb->fed_ids) memcpy(cb->fed_ids, cb->ids, (size_t)T * sizeof *cb->fed_ids);
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= T || src[i] < 0 || src[i] >= cb->n_drawn || cb->drawn[src[i]] < 0)
            return err_set(err, "%s: feed of row %d from drawn row %d (step of %d rows, %d drawn)", be->name, rows[i],
                           src[i], T, cb->n_drawn);
        cb->fed_ids[rows[i]] = cb->drawn[src[i]];
    }
    cb->ids = cb->fed_ids;
    return 0;
}

/* Top-k of the router logits of one token, then a softmax over those k (as
 * gpt-oss routes). */
static void moe_route(const float *logits, int E, int k, int *ids, float *weights) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        ids[j] = best;
        weights[j] = logits[best];
    }
    cpu_softmax(weights, k);
}

/* Groups the tokens routed to each expert and runs that expert's MLP once
 * over its rows. Scratch: router [T][E], rows [T][C], gate/up [T][F], out [T][C]. */
static void cpu_be_moe(Backend *be, void *out_, const void *x_, const LayerWeights *lw, int T) {
    CpuBackend *cb = cpu(be);
    const ModelShape *c = cb->shape;
    int E = c->n_experts, K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    float *router = cpu_scratch(cb, (int64_t)T * (E + 2 * C + 2 * F + 2 * K) + T), *rows = router + (int64_t)T * E, *gate = rows + (int64_t)T * C;
    float *up = gate + (int64_t)T * F, *eout = up + (int64_t)T * F, *wts = eout + (int64_t)T * C;
    int *sel = (int *)(wts + (int64_t)T * K), *members = sel + (int64_t)T * K;
    const float *x = x_;
    float *out = out_;
    cpu_be_matmul(be, router, x, &lw->router, 0, &lw->router_bias, T);
    for (int t = 0; t < T; t++) moe_route(router + (int64_t)t * E, E, K, sel + (int64_t)t * K, wts + (int64_t)t * K);
    memset(out, 0, (size_t)T * C * sizeof(float));
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) {
                    members[n] = t * K + j;
                    memcpy(rows + (int64_t)n++ * C, x + (int64_t)t * C, C * sizeof(float));
                }
        if (n == 0) continue;
        cpu_be_matmul(be, gate, rows, &lw->w_gate, e, &lw->b_gate, n);
        cpu_be_matmul(be, up, rows, &lw->w_up, e, &lw->b_up, n);
        cpu_glu(gate, gate, up, (int64_t)n * F, c->act == ACT_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU,
                c->act_limit);
        cpu_be_matmul(be, eout, gate, &lw->w_down, e, &lw->b_down, n);
        for (int i = 0; i < n; i++) {
            int t = members[i] / K;
            float wgt = wts[members[i]];
            for (int ch = 0; ch < C; ch++) out[(int64_t)t * C + ch] += wgt * eout[(int64_t)i * C + ch];
        }
    }
}

static void cpu_be_all_reduce(Backend *be, void *buf, int64_t n, BufKind kind) {
    tp_group_all_reduce_f32(cpu(be)->tp_group, cpu(be)->tp_rank, buf, n);   /* both kinds are fp32 here */
}

static void cpu_be_all_gather(Backend *be, void *dst, const void *src, int rows, int cols) {
    tp_group_all_gather_f32(cpu(be)->tp_group, cpu(be)->tp_rank, dst, src, rows, cols);
}

void backend_cpu_join_tp(Backend *be, TpGroup *g, int rank) {
    cpu(be)->tp_group = g;
    cpu(be)->tp_rank = rank;
    be->all_reduce = cpu_be_all_reduce;
    be->all_gather = cpu_be_all_gather;
}

static void cpu_destroy(Backend *be) {
    CpuBackend *cb = cpu(be);
    thread_pool_destroy(cb->tp);
    kv_cache_host_free(&cb->kv);
    attn_cascade_free(&cb->plan);
    free(cb->calibrate);
    free(cb->scratch);
    free(cb->fed_ids);
    free(cb->drawn);
    free(cb->drew);
    free(cb->kept);
    free(cb->kept_row);
    free(cb);
    free(be);
}

/* The cache's static scales as kv_scales asks: the checkpoint's copied, or
 * calibration pending on every layer. */
static int cpu_kv_scales(CpuBackend *cb, const ModelWeights *w, KVScales kv_scales, Err *err) {
    if (kv_scales == KV_SCALES_DYNAMIC) return 0;
    if (kv_cache_host_fix_scales(&cb->kv, err)) return -1;
    int L = cb->kv.n_layers, KV = cb->kv.n_kv_heads;
    if (kv_scales == KV_SCALES_CALIBRATE) {
        if (!(cb->calibrate = malloc((size_t)L * sizeof *cb->calibrate))) return err_set(err, "out of memory");
        for (int l = 0; l < L; l++) cb->calibrate[l] = true;
        return 0;
    }
    for (int l = 0; l < L; l++) {
        const WeightRef *s = &w->layers[l].kv_scales;
        if (!s->data || s->type != DT_F32 || s->cols != 2 * KV)
            return err_set(err, "--kv-scales checkpoint: layer %d has no KV cache scales (k_scale / v_scale)", l);
        memcpy(cb->kv.k_fixed + (size_t)l * KV, s->data, (size_t)KV * sizeof(float));
        memcpy(cb->kv.v_fixed + (size_t)l * KV, (const float *)s->data + KV, (size_t)KV * sizeof(float));
    }
    return 0;
}

Backend *backend_cpu_create(const ModelShape *c, const ModelWeights *w, int n_threads, int block_size, int n_blocks,
                            KVDtype kv_dtype, KVScales kv_scales, Err *err) {
    Backend *be = calloc(1, sizeof *be);
    CpuBackend *cb = calloc(1, sizeof *cb);
    if (!be || !cb) { free(be); free(cb); err_set(err, "out of memory"); return NULL; }
    cb->shape = c;
    if (attn_cascade_mode(getenv("CLLM_CASCADE"), &cb->cascade, err)) { free(cb); free(be); return NULL; }
    cb->tp = thread_pool_create(n_threads, err);
    if (!cb->tp ||
        kv_cache_host_alloc(&cb->kv, c->n_layers, c->n_kv_heads, c->head_dim_k, c->head_dim_v, block_size, n_blocks,
                            kv_dtype, err) || cpu_kv_scales(cb, w, kv_scales, err)) {
        thread_pool_destroy(cb->tp);
        kv_cache_host_free(&cb->kv);
        free(cb->calibrate);
        free(cb); free(be);
        return NULL;
    }
    *be = (Backend){
        .name = "cpu", .device = -1, .ctx = cb, .weights = w, .kv_block_size = block_size, .kv_n_blocks = n_blocks,
        .alloc = cpu_alloc, .release = cpu_release, .begin_step = cpu_begin_step,
        .graph_replay = cpu_graph_replay, .graph_capture = cpu_graph_capture, .embed = cpu_be_embed,
        .add_rmsnorm = cpu_be_add_rmsnorm, .rmsnorm = cpu_be_rmsnorm, .qkv = cpu_be_qkv, .matmul = cpu_be_matmul,
        .matmul_add = cpu_be_matmul_add,
        .rope_kv_write = cpu_be_rope_kv_write, .attention = cpu_be_attention, .gate_up = cpu_be_gate_up,
        .moe = cpu_be_moe, .gather_rows = cpu_be_gather_rows, .logits = cpu_be_logits, .read = cpu_be_read,
        .write = cpu_be_write, .sample_launch = cpu_be_sample_launch, .sample_result = cpu_be_sample_result,
        .feed_tokens = cpu_be_feed_tokens, .destroy = cpu_destroy,
    };
    return be;
}

int64_t backend_cpu_cascade_rows(const Backend *be) {
    return be && be->destroy == cpu_destroy ? cpu((Backend *)be)->cascade_rows : 0;
}
