/* test_pipeline_stages.c — a model split into pipeline stages computes what
 * the whole model computes (CPU backend: fp32, so bit for bit).
 *
 * Each stage gets its own backend holding only its layers (weights, KV
 * cache, rope tables) and its own Forward; the residual stream x and the
 * pending sublayer output proj are copied from stage to stage through host
 * memory (what NCCL send/recv does between GPUs). Steps: a 13-token prompt
 * in chunks of 5 (chunked prefill), then 6 decode steps; every logit of
 * every step must equal the unsplit model's. Models: every tiny golden
 * model (window layers, sinks, MoE, soft-caps, qk-norm, post-norms) in 2
 * stages, and SmolLM2 in 3 (layers 10/10/10) when present.
 *
 * Then the pipeline's own assembly with the stages' backends made a thread
 * each (pipeline_make_backends' concurrent path, which `--pp` takes for
 * GPUs of their own), on CPU backends: the pipeline's logits equal the
 * whole model's (--tp 2 groups: within 1e-5), and a stage that cannot be
 * made is the one reported, its neighbours made and freed (ASan: no leak). */
#include <string.h>

#include "base/thread_each.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/pipeline_open.h"
#include "parallel/stage.h"
#include "tests/one_seq_steps.h"
#include "tests/test.h"

#define BLOCK ONE_SEQ_BLOCK
#define N_BLOCKS ONE_SEQ_N_BLOCKS
#define MAX_T ONE_SEQ_MAX_T

typedef struct {
    StageModel sm;
    Backend *be;
    Forward fw;
} Stage;

static int stage_open(Stage *st, const Model *m, const StagePlan *p, int s, Err *err) {
    memset(st, 0, sizeof *st);
    if (stage_model_make(&st->sm, &m->cfg, &m->shape, &m->w, p, s, err)) return -1;
    st->be = backend_cpu_create(&st->sm.shape, &st->sm.w, 2, BLOCK, N_BLOCKS, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, err);
    if (!st->be || forward_init(&st->fw, &st->sm.cfg, st->be, MAX_T, err)) return -1;
    st->fw.from_prev = !st->sm.first;
    st->fw.to_next = !st->sm.last;
    return 0;
}

static void stage_close(Stage *st) {
    if (st->fw.cfg) forward_free(&st->fw);
    if (st->be) st->be->destroy(st->be);
}

/* Stages 0..n-1 of one model, run by hand: x and proj handed over between
 * them through host buffers of MAX_T rows. */
typedef struct {
    Stage *st;
    int n, C;
    float *xbuf, *pbuf;
} ByHand;

/* One step through every stage (a StepsRun). */
static int run_stages(void *ctx, const OneSeqSteps *q, float *logits, Err *err) {
    ByHand *h = ctx;
    int64_t n = (int64_t)q->b.n_tokens * h->C;
    for (int s = 0; s < h->n; s++) {
        Forward *fw = &h->st[s].fw;
        if (s > 0 && (fw->be->write(fw->be, fw->x, h->xbuf, n, err) || fw->be->write(fw->be, fw->proj, h->pbuf, n, err)))
            return -1;
        bool last = s == h->n - 1;
        if (forward_run(fw, q->ids, &q->b, &q->row, last ? 1 : 0, last ? logits : NULL, err)) return -1;
        if (!last && (fw->be->read(fw->be, h->xbuf, fw->x, n, err) || fw->be->read(fw->be, h->pbuf, fw->proj, n, err)))
            return -1;
    }
    return 0;
}

/* The step q on the way under test: its last row's logits. */
typedef int (*StepsRun)(void *ctx, const OneSeqSteps *q, float *logits, Err *err);

/* Every step of one sequence on the whole model (whole) and through run;
 * the logits must be equal bit for bit (tol 0), or within tol of the row's
 * largest. */
static void compare_steps(const char *what, Forward *whole, StepsRun run, void *ctx, double tol) {
    Err err = {{0}};
    int V = whole->cfg->vocab, steps = 0, differ = 0;
    double worst = 0;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    bool ok = want && got;
    OneSeqSteps q;
    one_seq_init(&q, V, 99);
    while (ok && one_seq_next(&q)) {
        for (int i = 0; i < V; i++) want[i] = got[i] = NAN;
        ok = forward_run(whole, q.ids, &q.b, &q.row, 1, want, &err) == 0 && run(ctx, &q, got, &err) == 0;
        CHECK(ok, "%s step %d: %s", what, steps, err.msg);
        double e = ok ? test_row_err(got, want, V) : 0;
        worst = e > worst ? e : worst;
        if (ok && (tol > 0 ? e > tol : memcmp(want, got, (size_t)V * sizeof *got) != 0)) differ++;
        steps++;
    }
    printf("# %s: %d steps, %d with logits that differ from the whole model (largest error %.3g of the row's "
           "largest)\n", what, steps, differ, worst);
    CHECK(ok && steps == ONE_SEQ_STEPS && differ == 0, "%s: %d of %d steps differ", what, differ, steps);
    free(want); free(got);
}

static void check_split(const char *path, const int *counts, int n_stages) {
    Err err = {{0}};
    Model m;
    if (model_load(&m, path, MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
    const ModelConfig *c = &m.cfg;
    StagePlan plan;
    Stage st[4];
    memset(st, 0, sizeof st);
    Backend *whole = backend_cpu_create(&m.shape, &m.w, 2, BLOCK, N_BLOCKS, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    Forward fw = {0};
    bool ok = whole && forward_init(&fw, c, whole, MAX_T, &err) == 0;
    ok = ok && (counts ? stage_plan_from_counts(&plan, c, &m.w, n_stages, counts, &err)
                       : stage_plan_balanced(&plan, c, &m.w, n_stages, &err)) == 0;
    for (int s = 0; ok && s < n_stages; s++) ok = stage_open(&st[s], &m, &plan, s, &err) == 0;
    CHECK(ok, "%s: %s", path, err.msg);
    ByHand h = {st, n_stages, c->dim, malloc((size_t)MAX_T * c->dim * sizeof(float)),
                malloc((size_t)MAX_T * c->dim * sizeof(float))};
    if (ok && h.xbuf && h.pbuf) {
        char what[1200];
        int len = snprintf(what, sizeof what, "%s in %d stages (layers", path, n_stages);
        for (int s = 0; s < n_stages; s++) len += snprintf(what + len, sizeof what - len, " %d", plan.n_layers[s]);
        snprintf(what + len, sizeof what - len, ")");
        compare_steps(what, &fw, run_stages, &h, 0);
    }
    for (int s = 0; s < n_stages; s++) stage_close(&st[s]);
    if (fw.cfg) forward_free(&fw);
    if (whole) whole->destroy(whole);
    free(h.xbuf); free(h.pbuf);
    model_free(&m);
}

static void test_tiny_models_in_two_stages(void) {
    const char *archs[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt-oss"};
    char path[1024];
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "%s/tiny/%s.gguf", test_fixture_dir(), archs[i]);
        check_split(path, NULL, 2);
    }
}

static void test_smollm2_in_three_stages(void) {
    const char *dir = getenv("CLLM_MODELS") ? getenv("CLLM_MODELS") : "models/cache";
    char path[1024];
    snprintf(path, sizeof path, "%s/smollm2-135m-instruct.gguf", dir);
    int counts[3] = {10, 10, 10};
    check_split(path, counts, 3);
}

/* A tiny golden model (tests/fixtures/tiny/NAME.gguf), its tokenizer left out. */
static bool load_tiny(Model *m, const char *name) {
    Err err = {{0}};
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny/%s.gguf", test_fixture_dir(), name);
    if (model_load(m, path, MODEL_LOAD_NO_TOKENIZER, &err) == 0) return true;
    CHECK(0, "%s", err.msg);
    return false;
}

static void test_stage_slices(void) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, "gemma3")) return;
    StagePlan p;
    int counts[2] = {1, m.cfg.n_layers - 1};
    CHECK(stage_plan_from_counts(&p, &m.cfg, &m.w, 2, counts, &err) == 0, "%s", err.msg);
    StageModel a, b;
    CHECK(stage_model_make(&a, &m.cfg, &m.shape, &m.w, &p, 0, &err) == 0 && stage_model_make(&b, &m.cfg, &m.shape, &m.w, &p, 1, &err) == 0,
          "%s", err.msg);
    CHECK(a.first && !a.last && a.w.tok_embd.data && !a.w.output.data && !a.w.output_norm.data, "stage 0 parts");
    bool tied = m.w.output.data == m.w.tok_embd.data;
    CHECK(!b.first && b.last && b.w.output.data && b.w.output_norm.data, "stage 1 parts");
    CHECK(tied ? b.w.tok_embd.data == b.w.output.data : !b.w.tok_embd.data, "stage 1: the embedding only as a tied head");
    CHECK(b.cfg.n_layers == m.cfg.n_layers - 1 && b.w.layers == m.w.layers + 1 && b.first_layer == 1, "stage 1 layers");
    for (int l = 0; l < b.cfg.n_layers; l++)
        CHECK(b.cfg.layer_window[l] == m.cfg.layer_window[l + 1], "layer %d window %d vs %d", l, b.cfg.layer_window[l],
              m.cfg.layer_window[l + 1]);
    CHECK(stage_model_make(&a, &m.cfg, &m.shape, &m.w, &p, 2, &err) == -1 && strstr(err.msg, "outside"), "'%s'", err.msg);
    model_free(&m);
}

/* thread_each: every item once, however many. */
static void count_item(void *ctx, int i) { __atomic_add_fetch(&((int *)ctx)[i], 1, __ATOMIC_RELAXED); }

static void test_thread_each(void) {
    for (int n = 0; n <= 9; n += 3) {
        int seen[9] = {0};
        thread_each(n, count_item, seen);
        for (int i = 0; i < 9; i++) CHECK(seen[i] == (i < n), "n %d: item %d ran %d times", n, i, seen[i]);
    }
}

#define PP 4 /* gemma3's 6 layers in 4 stages */

static PipelineOptions cpu_stages(int tp) {
    return (PipelineOptions){.n_stages = PP, .cpu = true, .tp = tp,
                             .backend = {.device = -1, .threads = 1, .block_size = BLOCK, .max_tokens = MAX_T},
                             .ctx_tokens = (N_BLOCKS - 1) * BLOCK}; /* N_BLOCKS blocks each (stage_backend_options) */
}

/* The pipeline's stages before the last, then the last on the test's own
 * Forward (the engine's part), as a StepsRun. */
typedef struct {
    Pipeline *p;
    Forward *last;
} Piped;

static int run_pipeline(void *ctx, const OneSeqSteps *q, float *logits, Err *err) {
    Piped *pp = ctx;
    return pipeline_launch(pp->p, q->ids, &q->b, &q->row, 1, logits, err) || pipeline_finish(pp->p, pp->last, err);
}

/* A device transport's broadcast (kernels/backend.h), played on CPU ranks:
 * every rank but 0 zeroes buf, then the group's rank-order sum gives every
 * rank rank 0's values. Installed on a stage group's ranks, it makes
 * tp_ranks_run leave the stage's input to forward_ops's broadcast (as a GPU
 * group over NCCL does) instead of copying it through the host. */
#define BCAST_MAX (PP * 2)
static struct {
    Backend *be[BCAST_MAX];
    int rank[BCAST_MAX], n, calls;
} bcast;

static void test_broadcast(Backend *be, void *buf, int64_t n, BufKind kind) {
    for (int i = 0; i < bcast.n; i++)
        if (bcast.be[i] == be && bcast.rank[i] > 0) memset(buf, 0, (size_t)n * sizeof(float)); /* CPU: fp32 */
    __atomic_add_fetch(&bcast.calls, 1, __ATOMIC_RELAXED);
    be->all_reduce(be, buf, n, kind);
}

static void install_broadcast(Pipeline *p, int tp) {
    bcast.n = bcast.calls = 0;
    for (int s = 0; s < PP; s++)
        for (int r = 0; p->tp[s] && r < tp && bcast.n < BCAST_MAX; r++) {
            p->tp[s]->be[r]->broadcast = test_broadcast;
            bcast.be[bcast.n] = p->tp[s]->be[r];
            bcast.rank[bcast.n++] = r;
        }
}

/* The stages made concurrently on CPU backends, then run as a pipeline:
 * the whole model's logits (tp 1: bit for bit; tp 2: within 1e-5; with
 * broadcast, the stages' inputs broadcast by forward_ops). */
static void check_concurrent_stages(int tp, bool broadcast) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, "gemma3")) return;
    const ModelConfig *c = &m.cfg;
    PipelineOptions o = cpu_stages(tp);
    int dev[PP * 2] = {-1, -1, -1, -1, -1, -1, -1, -1};
    StagePlan plan;
    Pipeline p;
    Forward fw = {0}, last = {0};
    Backend *whole = backend_cpu_create(&m.shape, &m.w, 1, BLOCK, N_BLOCKS, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    bool sliced = whole && forward_init(&fw, c, whole, MAX_T, &err) == 0 &&
                  stage_plan_balanced(&plan, c, &m.w, PP, &err) == 0 && pipeline_slice(&p, &m, &plan, &err) == 0;
    bool made = sliced && pipeline_make_backends(&p, &o, dev, 0, true, &err) == 0;
    bool ok = made && pipeline_start(&p, MAX_T, &err) == 0 &&
              forward_init(&last, pipeline_stage_cfg(&p, PP - 1), p.be[PP - 1], MAX_T, &err) == 0;
    CHECK(ok, "--pp %d --tp %d: %s", PP, tp, err.msg);
    CHECK(!made || (p.concurrent && p.made_s >= 0), "made concurrently: %d, in %g s", p.concurrent, p.made_s);
    for (int s = 0; made && s < PP; s++) CHECK(p.be[s] && (tp > 1) == (p.tp[s] != NULL), "stage %d's backend", s);
    if (ok && broadcast) install_broadcast(&p, tp);
    if (ok) {
        last.from_prev = true;
        Piped pp = {&p, &last};
        char what[96];
        snprintf(what, sizeof what, "gemma3 --pp %d --tp %d, made concurrently%s", PP, tp,
                 broadcast ? ", inputs broadcast" : "");
        compare_steps(what, &fw, run_pipeline, &pp, tp > 1 ? 1e-5 : 0);
    }
    /* x and proj, on each rank of the 3 stages after the first, at every step */
    if (ok && broadcast) CHECK(bcast.calls > 0 && bcast.calls % (2 * (PP - 1) * tp) == 0, "broadcasts: %d", bcast.calls);
    if (last.cfg) forward_free(&last);
    if (sliced) pipeline_close(&p);
    if (fw.cfg) forward_free(&fw);
    if (whole) whole->destroy(whole);
    model_free(&m);
}

static void test_stages_made_concurrently(void) {
    check_concurrent_stages(1, false);
    check_concurrent_stages(2, false);
    check_concurrent_stages(2, true);
}

/* Stage 2 cannot be made (tp 1: a layer's rows are a strided view, which
 * the CPU backend refuses, and stage 3's too; tp 2: 3 query heads do not
 * split over 2 ranks): the error names stage 2, the first by stage order
 * whichever thread ends first; the other stages are made, and
 * pipeline_close frees them (and stage 2's group) concurrently. */
static void check_stage_2_fails(int tp) {
    Err err = {{0}};
    Model m;
    if (!load_tiny(&m, "gemma3")) return;
    PipelineOptions o = cpu_stages(tp);
    int dev[PP * 2] = {-1, -1, -1, -1, -1, -1, -1, -1};
    StagePlan plan;
    Pipeline p;
    bool sliced = stage_plan_balanced(&plan, &m.cfg, &m.w, PP, &err) == 0 && pipeline_slice(&p, &m, &plan, &err) == 0;
    CHECK(sliced, "%s", err.msg);
    if (!sliced) { model_free(&m); return; }
    /* the stages' slices point at the model's layers */
    WeightRef *wq2 = &m.w.layers[plan.first_layer[2]].wq, *wq3 = &m.w.layers[plan.first_layer[3]].wq;
    if (tp == 1) wq2->src_stride = wq3->src_stride = 2 * wq2->row_bytes;
    else p.sm[2].cfg.n_heads = 3;
    int rc = pipeline_make_backends(&p, &o, dev, 0, true, &err);
    char want[64];
    snprintf(want, sizeof want, "stage 2 (layers %d-%d)", plan.first_layer[2], plan.first_layer[2] + plan.n_layers[2] - 1);
    CHECK(rc == -1 && strncmp(err.msg, want, strlen(want)) == 0, "--tp %d: '%s'", tp, err.msg);
    CHECK(strstr(err.msg, tp == 1 ? "lie apart" : "3 attention heads do not split"), "--tp %d: why: '%s'", tp, err.msg);
    printf("# --pp %d --tp %d, stage 2 impossible: %s\n", PP, tp, err.msg);
    for (int s = 0; s < PP; s++)
        CHECK((p.be[s] != NULL) == (tp == 1 ? s < 2 : s != 2), "--tp %d: stage %d made: %d", tp, s, p.be[s] != NULL);
    pipeline_close(&p);
    wq2->src_stride = wq3->src_stride = 0;
    model_free(&m);
}

static void test_failed_stage_named(void) {
    check_stage_2_fails(1);
    check_stage_2_fails(2);
}

int main(void) {
    RUN(test_stage_slices);
    RUN(test_tiny_models_in_two_stages);
    RUN(test_smollm2_in_three_stages);
    RUN(test_thread_each);
    RUN(test_stages_made_concurrently);
    RUN(test_failed_stage_named);
    TEST_EXIT();
}
