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
 * stages, and SmolLM2 in 3 (layers 10/10/10) when present. */
#include <string.h>

#include "kernels/cpu/backend_cpu.h"
#include "model/forward.h"
#include "model/model.h"
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

/* One step through every stage; x and proj handed over between them. */
static int run_stages(Stage *st, int n, const int32_t *ids, const AttnBatch *b, const int32_t *rows, int n_logits,
                      float *logits, float *xbuf, float *pbuf, int C, Err *err) {
    int64_t T = b->n_tokens;
    for (int s = 0; s < n; s++) {
        Forward *fw = &st[s].fw;
        if (s > 0 && (fw->be->write(fw->be, fw->x, xbuf, T * C, err) || fw->be->write(fw->be, fw->proj, pbuf, T * C, err)))
            return -1;
        bool last = s == n - 1;
        if (forward_run(fw, ids, b, rows, last ? n_logits : 0, last ? logits : NULL, err)) return -1;
        if (!last && (fw->be->read(fw->be, xbuf, fw->x, T * C, err) || fw->be->read(fw->be, pbuf, fw->proj, T * C, err)))
            return -1;
    }
    return 0;
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
    int V = c->vocab, C = c->dim, steps = 0, differ = 0;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    float *xbuf = malloc((size_t)MAX_T * C * sizeof *xbuf), *pbuf = malloc((size_t)MAX_T * C * sizeof *pbuf);
    OneSeqSteps q;
    one_seq_init(&q, V, 99);
    while (ok && one_seq_next(&q)) {
        for (int i = 0; i < V; i++) want[i] = got[i] = NAN;
        ok = forward_run(&fw, q.ids, &q.b, &q.row, 1, want, &err) == 0 &&
             run_stages(st, n_stages, q.ids, &q.b, &q.row, 1, got, xbuf, pbuf, C, &err) == 0;
        CHECK(ok, "%s step %d: %s", path, steps, err.msg);
        if (ok && memcmp(want, got, (size_t)V * sizeof *got)) differ++;
        steps++;
    }
    printf("# %s in %d stages (layers", path, n_stages);
    for (int s = 0; ok && s < n_stages; s++) printf(" %d", plan.n_layers[s]);
    printf("): %d steps, %d with logits that differ from the whole model\n", steps, differ);
    CHECK(ok && steps == ONE_SEQ_STEPS && differ == 0, "%s: %d of %d steps differ", path, differ, steps);
    for (int s = 0; s < n_stages; s++) stage_close(&st[s]);
    if (fw.cfg) forward_free(&fw);
    if (whole) whole->destroy(whole);
    free(want); free(got); free(xbuf); free(pbuf);
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

static void test_stage_slices(void) {
    Err err = {{0}};
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny/gemma3.gguf", test_fixture_dir());
    Model m;
    if (model_load(&m, path, MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
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

int main(void) {
    RUN(test_stage_slices);
    RUN(test_tiny_models_in_two_stages);
    RUN(test_smollm2_in_three_stages);
    TEST_EXIT();
}
