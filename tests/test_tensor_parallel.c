/* test_tensor_parallel.c — a model split over tensor-parallel ranks computes
 * what the whole model computes, and the split refuses what it cannot do.
 *
 * Every tiny golden dense model (4 query heads, 2 KV heads) over 2 ranks
 * (a KV head each) and 4 (each KV head replicated on 2 ranks): CPU backends
 * in one group, rank 0 driven here, ranks 1..N-1 on their threads
 * (parallel/tp.h). Steps: a 13-token prompt in chunks of 5, then 6 decode
 * steps; the logits of every step must be within 1e-5 (relative to the
 * row's largest) of the whole model's, with the same argmax: the partial
 * sums of the o-proj and the MLP add in another order, nothing else
 * differs. Also: the plan's ranges, the refusals (MoE, heads, KV heads,
 * ffn_dim, a quantized block cut), the column copies' bytes, and the
 * column views a GPU rank uploads (their stride, FP8 row scales, Q8_0
 * blocks; the CPU backend refuses them). */
#include <string.h>

#include "kernels/cpu/backend_cpu.h"
#include "kernels/weight_rows.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/tp.h"
#include "tests/one_seq_steps.h"
#include "tests/test.h"

#define MAX_T ONE_SEQ_MAX_T

/* tests/fixtures/tiny/NAME without its tokenizer; false (a failed check) when it does not load. */
static bool load_tiny(Model *m, const char *name, int flags) {
    Err err = {{0}};
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny/%s", test_fixture_dir(), name);
    if (model_load(m, path, MODEL_LOAD_NO_TOKENIZER | flags, &err) == 0) return true;
    CHECK(0, "%s", err.msg);
    return false;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Every FP8 matrix of the layers gets a static activation scale. */
static void set_input_scales(Model *m, float scale) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        LayerWeights *lw = &m->w.layers[l];
        WeightRef *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++) {
            CHECK(mats[i]->type == DT_F8_E4M3, "layer %d matrix %d is not FP8", l, i);
            mats[i]->input_scale = scale;
        }
    }
}

/* flags: model_load's; input_scale > 0: FP8 weights with that static
 * activation scale. The logits must be within 1e-5 of the row's largest
 * and the greedy token the same. */
static void check_tp(const char *name, int flags, float input_scale, int n_ranks) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, name, flags)) return;
    if (input_scale > 0) set_input_scales(&m, input_scale);
    const ModelConfig *c = &m.cfg;
    Backend *whole = backend_cpu_create(&m.shape, &m.w, 1, ONE_SEQ_BLOCK, ONE_SEQ_N_BLOCKS, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    Forward fw = {0}, rank0 = {0};
    TpRanks t;
    BackendOptions bo = {.device = -1, .threads = 1, .block_size = ONE_SEQ_BLOCK, .n_blocks = ONE_SEQ_N_BLOCKS,
                         .max_tokens = MAX_T};
    bool ok = whole && forward_init(&fw, c, whole, MAX_T, &err) == 0;
    bool opened = ok && tp_ranks_open(&t, c, &m.shape, &m.w, n_ranks, &bo, NULL, "the model", &err) == 0;
    ok = opened && forward_init(&rank0, tp_ranks_cfg(&t), t.be[0], MAX_T, &err) == 0;
    CHECK(ok, "%s --tp %d: %s", name, n_ranks, err.msg);
    int V = c->vocab, steps = 0, differ = 0;
    double worst = 0;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    OneSeqSteps q;
    one_seq_init(&q, V, 7);
    while (ok && one_seq_next(&q)) {
        ForwardStep s = {q.ids, q.b, &q.row, 1, got};
        ok = forward_run(&fw, q.ids, &q.b, &q.row, 1, want, &err) == 0 && tp_ranks_run(&t, &rank0, &s, &err) == 0;
        CHECK(ok, "%s --tp %d step %d: %s", name, n_ranks, steps, err.msg);
        double e = ok ? test_row_err(got, want, V) : 0;
        worst = e > worst ? e : worst;
        if (ok && (e > 1e-5 || argmax(got, V) != argmax(want, V))) differ++;
        steps++;
    }
    printf("# %s --tp %d: %d steps, largest logit error %.3g of the row's largest, %d steps differ\n", name, n_ranks,
           steps, worst, differ);
    CHECK(ok && steps == ONE_SEQ_STEPS && differ == 0, "%s --tp %d: %d of %d steps differ (largest error %.3g)", name, n_ranks,
          differ, steps, worst);
    if (rank0.cfg) forward_free(&rank0);
    if (opened) {
        Backend *b0 = t.be[0];
        tp_ranks_free(&t);
        if (b0) b0->destroy(b0);
    }
    if (fw.cfg) forward_free(&fw);
    if (whole) whole->destroy(whole);
    free(want); free(got);
    model_free(&m);
}

static void test_tiny_models_tp2_tp4(void) {
    const char *files[] = {"llama.gguf", "llama-mlp-bias.gguf", "mistral.gguf", "qwen2.gguf", "qwen3.gguf",
                           "gemma2.gguf", "gemma3.gguf"};
    for (int i = 0; i < 7; i++)
        for (int n = 2; n <= 4; n += 2) check_tp(files[i], 0, 0, n);
}

/* FP8 weights (--weights fp8): each row's scale goes with its row. With
 * static activation scales the ranks quantize their inputs exactly as one
 * backend does, so the sums differ only in order. (With dynamic per-token
 * scales, the default, a rank's Wo and Wdown scale their input slice by the
 * slice's own largest value, as vLLM's row-parallel layers do: the results
 * move by e4m3 roundings, which tests/cli/tensor_parallel.sh tolerates.) */
static void test_fp8_weights(void) {
    check_tp("mistral", MODEL_LOAD_WEIGHTS_FP8, 0.02f, 2);
    check_tp("mistral", MODEL_LOAD_WEIGHTS_FP8, 0.02f, 4);
}

/* Rank 3's slices without copies (a GPU rank's): Wo and Wdown are views of
 * the model's rows (their stride), which pack into the copies' bytes (a CPU
 * rank's, in copied); the CPU backend refuses them by name. */
static void check_views(const Model *m, const TpPlan *p, const TpRankModel *copied) {
    Err err = {{0}};
    TpRankModel rm;
    CHECK(tp_rank_make(&rm, &m->cfg, &m->shape, &m->w, p, 3, false, &err) == 0, "%s", err.msg);
    const LayerWeights *s = &m->w.layers[1], *v = &rm.layers[1], *c = &copied->layers[1];
    const WeightRef *views[2] = {&v->wo, &v->w_down}, *copies[2] = {&c->wo, &c->w_down}, *whole[2] = {&s->wo, &s->w_down};
    for (int i = 0; i < 2; i++) {
        const WeightRef *w = views[i];
        CHECK(w->src_stride == whole[i]->row_bytes && w->row_bytes == copies[i]->row_bytes && !copies[i]->src_stride,
              "%s: a view of rows %llu bytes apart", w->name, (unsigned long long)w->src_stride);
        char *packed = malloc((size_t)(w->rows * w->row_bytes));
        if (packed) weight_rows_pack(NULL, w, packed);
        CHECK(packed && !memcmp(packed, copies[i]->data, (size_t)(w->rows * w->row_bytes)), "%s: packed as copied", w->name);
        free(packed);
    }
    BackendOptions bo = {.device = -1, .threads = 1, .block_size = ONE_SEQ_BLOCK, .n_blocks = ONE_SEQ_N_BLOCKS};
    Backend *be = backend_create(&rm.shape, &rm.w, &bo, &err);
    CHECK(!be && strstr(err.msg, "lie apart") && strstr(err.msg, m->w.layers[0].wo.name), "the CPU backend refuses views: %s", err.msg);
    if (be) be->destroy(be);
    tp_rank_free(&rm);
}

/* A rank's column views of an FP8 Wo (a scale per row: every row keeps its
 * own) and a Q8_0 Wdown (whole blocks of 32): each row's byte range, at the
 * source's stride. */
static void test_column_views(void) {
    Err err = {{0}};
    ModelConfig c = {.n_layers = 1, .dim = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim_k = 16, .head_dim_v = 16,
                     .ffn_dim = 128, .vocab = 100};
    static char wo[64 * 64], down[64 * 136];
    static float scale[64];
    LayerWeights lw;
    memset(&lw, 0, sizeof lw);
    lw.wo = (WeightRef){wo, DT_F8_E4M3, 64, 64, 1, 64, "blk.0.attn_output.weight", scale, 0, 0};
    lw.w_down = (WeightRef){down, DT_Q8_0, 64, 128, 1, dtype_row_bytes(DT_Q8_0, 128), "blk.0.ffn_down.weight", NULL, 0, 0};
    ModelWeights w = {.layers = &lw};
    ModelShape shape = {.n_layers = 1};
    TpPlan p;
    TpRankModel rm;
    CHECK(tp_plan_make(&p, &c, &w, 2, &err) == 0 && tp_rank_make(&rm, &c, &shape, &w, &p, 1, false, &err) == 0, "%s",
          err.msg);
    const WeightRef *o = &rm.layers[0].wo, *d = &rm.layers[0].w_down;
    CHECK(o->data == wo + 32 && o->cols == 32 && o->row_bytes == 32 && o->src_stride == 64 && o->scale == scale,
          "Wo: columns 32-63, row scales whole");
    CHECK(d->data == down + 68 && d->cols == 64 && d->row_bytes == 68 && d->src_stride == 136, "Wdown: blocks 2-3");
    tp_rank_free(&rm);
}

/* Ranges: 4 heads / 2 KV heads over 4 ranks replicate each KV head on 2. */
static void test_plan_ranges(void) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, "qwen2.gguf", 0)) return;
    TpPlan p;
    CHECK(tp_plan_make(&p, &m.cfg, &m.w, 4, &err) == 0, "%s", err.msg);
    int V = m.cfg.vocab, F = m.cfg.ffn_dim, sum_v = 0;
    for (int r = 0; r < 4; r++) {
        CHECK(p.head0[r] == r && p.n_heads[r] == 1, "rank %d heads %d+%d", r, p.head0[r], p.n_heads[r]);
        CHECK(p.kv0[r] == r / 2 && p.n_kv[r] == 1, "rank %d KV heads %d+%d", r, p.kv0[r], p.n_kv[r]);
        CHECK(p.ffn0[r] == r * F / 4 && p.n_ffn[r] == F / 4, "rank %d columns %d+%d", r, p.ffn0[r], p.n_ffn[r]);
        CHECK(p.vocab0[r] == sum_v, "rank %d vocab from %d", r, p.vocab0[r]);
        sum_v += p.n_vocab[r];
    }
    CHECK(sum_v == V, "vocab ranges cover %d of %d", sum_v, V);
    TpRankModel rm;
    CHECK(tp_rank_make(&rm, &m.cfg, &m.shape, &m.w, &p, 3, true, &err) == 0, "%s", err.msg);
    const LayerWeights *s = &m.w.layers[1], *d = &rm.layers[1];
    int D = m.cfg.head_dim_k;
    CHECK(d->wq.rows == D && (const char *)d->wq.data == (const char *)s->wq.data + 3 * D * s->wq.row_bytes, "Wq rows of head 3");
    CHECK(d->wk.rows == D && (const char *)d->wk.data == (const char *)s->wk.data + D * s->wk.row_bytes, "Wk rows of KV head 1");
    CHECK(d->bq.cols == D && (const float *)d->bq.data == (const float *)s->bq.data + 3 * D, "bq of head 3");
    CHECK(d->wo.cols == D && d->wo.rows == s->wo.rows && !d->bo.data, "Wo: %lld columns, no bias off rank 0", (long long)d->wo.cols);
    bool same = true;
    for (int64_t i = 0; i < d->wo.rows; i++)
        same &= !memcmp((const char *)d->wo.data + i * d->wo.row_bytes, (const char *)s->wo.data + i * s->wo.row_bytes + 3 * D * 4, D * 4);
    CHECK(same, "Wo's copy holds each row's columns of head 3");
    CHECK(d->w_down.cols == F / 4 && d->w_gate.rows == F / 4, "MLP slices");
    CHECK(rm.w.output.rows == p.n_vocab[3] && rm.cfg.n_heads == 1 && rm.cfg.n_kv_heads == 1 && rm.shape.ffn_dim == F / 4,
          "rank config");
    check_views(&m, &p, &rm);
    tp_rank_free(&rm);
    CHECK(p.bytes[0] > 0 && p.bytes[0] < m.weight_bytes, "rank 0 holds %llu bytes", (unsigned long long)p.bytes[0]);
    model_free(&m);
}

static void expect_refused(const ModelConfig *c, const ModelWeights *w, int n, const char *want) {
    Err err = {{0}};
    TpPlan p;
    int rc = tp_plan_make(&p, c, w, n, &err);
    CHECK(rc == -1 && strstr(err.msg, want), "--tp %d: rc %d, '%s' (want '%s')", n, rc, err.msg, want);
}

static void test_refusals(void) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, "gpt-oss.gguf", 0)) return;
    expect_refused(&m.cfg, &m.w, 2, "mixture-of-experts model (4 experts)");
    model_free(&m);
    /* counts checked before any weight is read: a config alone */
    ModelConfig c = {.n_layers = 0, .dim = 64, .n_heads = 12, .n_kv_heads = 4, .head_dim_k = 16, .head_dim_v = 16,
                     .ffn_dim = 96, .vocab = 100};
    ModelWeights w = {0};
    expect_refused(&c, &w, 5, "the model's 12 attention heads do not split evenly over 5 ranks");
    expect_refused(&c, &w, 3, "the model's 4 KV heads neither split evenly over 3 ranks nor replicate on them (4 % 3 or 3 % 4");
    c.n_kv_heads = 6;
    expect_refused(&c, &w, 4, "the model's 6 KV heads neither split evenly over 4 ranks nor replicate");
    c.n_kv_heads = 4;
    c.ffn_dim = 98;
    expect_refused(&c, &w, 4, "the MLP's 98 columns (ffn_dim) do not split evenly over 4 ranks");
    expect_refused(&c, &w, 0, "between 1 and");
    expect_refused(&c, &w, 17, "between 1 and");
    /* a quantized Wdown (Q8_0, blocks of 32) whose 96 columns split in 48 */
    static char bytes[64 * 102];
    LayerWeights lw = {0};
    lw.w_down = (WeightRef){bytes, DT_Q8_0, 64, 96, 1, dtype_row_bytes(DT_Q8_0, 96), "blk.0.ffn_down.weight", NULL, 0, 0};
    c.ffn_dim = 96;
    c.n_layers = 1;
    w.layers = &lw;
    expect_refused(&c, &w, 2, "rank 0: blk.0.ffn_down.weight (Q8_0) would be split at column 48, inside its blocks of 32");
    c.n_kv_heads = 12;
    CHECK(tp_plan_make(&(TpPlan){0}, &c, &w, 3, &err) == 0, "96 / 3 = 32 columns: whole blocks (%s)", err.msg);
}

int main(void) {
    RUN(test_plan_ranges);
    RUN(test_refusals);
    RUN(test_column_views);
    RUN(test_tiny_models_tp2_tp4);
    RUN(test_fp8_weights);
    TEST_EXIT();
}
