/* test_real_models.c — the real models of models.txt on the CPU backend
 * against transformers (tests/fixtures/real/NAME.ref.json, made by
 * make_real_refs.py loading the same GGUF files):
 *   - teacher-forced top-1 agreement over 256 positions: at least 99%;
 *   - the greedy continuation of each committed prompt: identical for its
 *     first 32 tokens (a divergence at a near tie is reported, not excused
 *     beyond the first differing token).
 * and with an fp8 KV cache (--kv-dtype fp8) against the fp32 cache, the 256
 * positions of the fixed text and the committed prompts followed by the
 * reference's greedy continuation, teacher-forced through both:
 *   - top-1 agrees wherever the fp32 cache's top-2 margin exceeds 2^-4 of
 *     the row's max |logit| (each cached value moves by at most half an
 *     e4m3 step, 2^-4 relative: decisions closer than that are near-ties
 *     the rounding may flip, measured flips had margins <= 0.26 logits);
 *   - at least 90% raw agreement (a broken cache falls to chance), the
 *     share printed.
 * The model files come from models/fetch.sh ($CLLM_MODELS); a missing file
 * fails the test. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/model.h"
#include "tests/ref/ref_engine.h"
#include "tests/test.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static void read_ids(const JsonValue *arr, int32_t *out, int n) {
    for (int i = 0; i < n; i++) out[i] = (int32_t)json_at(arr, i)->u.number.num;
}

/* Runs ids[0..T) in chunks and stores each position's argmax in top1. */
static int teacher_forced(Engine *e, const int32_t *ids, int T, int *top1, Err *err) {
    const int chunk = 32;
    int V = e->model->cfg.vocab;
    float *logits = malloc((size_t)chunk * V * sizeof *logits);
    int32_t rows[32], pos[32], seqi[32] = {0};
    int64_t slot[32];
    Sequence s = {0};
    int rc = block_table_reserve(&s.bt, &e->pool, T, e->block_size);
    if (rc) err_set(err, "KV cache too small for %d tokens", T);
    for (int start = 0; rc == 0 && start < T; start += chunk) {
        int n = T - start < chunk ? T - start : chunk;
        for (int i = 0; i < n; i++) {
            rows[i] = i;
            pos[i] = start + i;
            slot[i] = block_table_slot(&s.bt, start + i, e->block_size);
        }
        const int32_t *tables[1] = {s.bt.blocks};
        AttnBatch b = {n, pos, seqi, slot, 1, tables, e->block_size};
        rc = forward_run(&e->fw, ids + start, &b, rows, n, logits, err);
        for (int i = 0; rc == 0 && i < n; i++) top1[start + i] = argmax(logits + (size_t)i * V, V);
    }
    block_table_release(&s.bt, &e->pool);
    block_table_free(&s.bt);
    free(logits);
    return rc;
}

typedef struct {
    int positions, agree;       /* positions compared, top-1 equal */
    int clear, clear_agree;     /* of those, the ones whose margin in a exceeds 2^-4 of max |logit| */
    double worst;               /* largest logit difference / max |logit| of a */
} PairStats;

/* Top-1 of a logits row and its margin over the runner-up. */
static int top2_margin(const float *x, int n, double *margin) {
    int b = argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    *margin = (double)x[b] - second;
    return b;
}

/* Runs ids[0..T) in chunks through a and b (their own sequences) and
 * compares the logits rows of positions from .. T-1 (PairStats). */
static int teacher_forced_pair(Engine *a, Engine *b, const int32_t *ids, int T, int from, PairStats *st, Err *err) {
    enum { CHUNK = 32 };
    int V = a->model->cfg.vocab, rc = 0;
    float *la = malloc((size_t)CHUNK * V * sizeof *la), *lb = malloc((size_t)CHUNK * V * sizeof *lb);
    int32_t rows[CHUNK], pos[CHUNK], seqi[CHUNK] = {0};
    int64_t slot[CHUNK];
    Sequence sa = {0}, sb = {0};
    if (!la || !lb) rc = err_set(err, "out of memory");
    if (rc == 0 && (block_table_reserve(&sa.bt, &a->pool, T, a->block_size) ||
                    block_table_reserve(&sb.bt, &b->pool, T, b->block_size)))
        rc = err_set(err, "KV cache too small for %d tokens", T);
    for (int start = 0; rc == 0 && start < T; start += CHUNK) {
        int n = T - start < CHUNK ? T - start : CHUNK;
        for (int k = 0; k < 2 && rc == 0; k++) {
            Engine *e = k ? b : a;
            Sequence *s = k ? &sb : &sa;
            for (int i = 0; i < n; i++) {
                rows[i] = i, pos[i] = start + i;
                slot[i] = block_table_slot(&s->bt, start + i, e->block_size);
            }
            const int32_t *tables[1] = {s->bt.blocks};
            AttnBatch batch = {n, pos, seqi, slot, 1, tables, e->block_size};
            rc = forward_run(&e->fw, ids + start, &batch, rows, n, k ? lb : la, err);
        }
        for (int i = 0; rc == 0 && i < n; i++) {
            if (start + i < from) continue;
            const float *ra = la + (size_t)i * V, *rb = lb + (size_t)i * V;
            double margin, top = 0;
            for (int v = 0; v < V; v++) top = fmax(top, fabs(ra[v]));
            bool same = top2_margin(ra, V, &margin) == argmax(rb, V), clear = margin > 0x1p-4 * top;
            st->positions++, st->agree += same;
            st->clear += clear, st->clear_agree += clear && same;
            double d = test_row_err(rb, ra, V);
            if (!(d <= st->worst)) st->worst = d;
        }
    }
    block_table_release(&sa.bt, &a->pool), block_table_free(&sa.bt);
    block_table_release(&sb.bt, &b->pool), block_table_free(&sb.bt);
    free(la), free(lb);
    return rc;
}

/* The fixed text's positions, and the committed prompts followed by the
 * reference's greedy continuation (the positions that predict it), with an
 * fp8 KV cache against the fp32 one (see the top of the file). */
static void check_fp8_kv(const Model *m, Engine *e32, const JsonValue *ref, const int32_t *ids, int T) {
    Err err = {{0}};
    Backend *be = backend_cpu_create(&m->shape, &m->w, 0, 16, 40, KV_DTYPE_FP8, KV_SCALES_DYNAMIC, &err);
    Engine e8;
    int ok = be && engine_init(&e8, m, be, 600, 64, &err) == 0;
    CHECK(ok, "%s", err.msg);
    PairStats text = {0}, gen = {0};
    if (ok) CHECK(teacher_forced_pair(e32, &e8, ids, T, 0, &text, &err) == 0, "%s", err.msg);
    const JsonValue *prompts = json_get(ref, "prompts");
    size_t n_prompts = getenv("CLLM_QUICK") ? 1 : json_len(prompts);
    for (size_t p = 0; ok && p < n_prompts; p++) {
        const JsonValue *pr = json_at(prompts, p);
        int n = (int)json_len(json_get(pr, "ids")), G = (int)json_len(json_get(pr, "greedy"));
        int32_t *seq = malloc((size_t)(n + G) * sizeof *seq);
        read_ids(json_get(pr, "ids"), seq, n);
        read_ids(json_get(pr, "greedy"), seq + n, G);
        CHECK(teacher_forced_pair(e32, &e8, seq, n + G - 1, n - 1, &gen, &err) == 0, "%s", err.msg);
        free(seq);
    }
    const PairStats *all[2] = {&text, &gen};
    const char *what[2] = {"fixed text", "greedy continuations"};
    for (int i = 0; i < 2; i++) {
        const PairStats *s = all[i];
        printf("# %s: fp8 KV vs fp32 KV, %s: top-1 agreement %d/%d (%.2f%%); %d/%d where the fp32 margin exceeds "
               "2^-4 of max |logit|; largest logit difference %.3g of max |logit|\n", m->cfg.name, what[i], s->agree,
               s->positions, 100.0 * s->agree / (s->positions ? s->positions : 1), s->clear_agree, s->clear, s->worst);
        CHECK(s->positions > 0 && s->clear_agree == s->clear && s->agree >= 0.9 * s->positions && s->worst > 0,
              "%s: fp8 KV top-1 agreement %d/%d, %d/%d beyond near-ties", what[i], s->agree, s->positions,
              s->clear_agree, s->clear);
    }
    if (ok) engine_free(&e8);
    if (be) be->destroy(be);
}

static void check_reference(const char *ref_path) {
    Err err = {{0}};
    Json *doc = json_parse_file(ref_path, &err);
    CHECK(doc != NULL, "%s", err.msg);
    if (!doc) return;
    const JsonValue *ref = json_root(doc);
    const char *dir = getenv("CLLM_MODELS") ? getenv("CLLM_MODELS") : "models/cache";
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, json_get_str(ref, "gguf", "?"));
    Model m;
    if (model_load(&m, path, MODEL_LOAD_NO_TOKENIZER, &err)) {
        CHECK(0, "%s (run models/fetch.sh)", err.msg);
        json_free(doc);
        return;
    }
    Backend *be = backend_cpu_create(&m.shape, &m.w, 0, 16, 40, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    Engine e;
    CHECK(be && engine_init(&e, &m, be, 600, 64, &err) == 0, "%s", err.msg);

    const JsonValue *tf = json_get(ref, "teacher_forced");
    int T = (int)json_len(json_get(tf, "top1"));
    if (getenv("CLLM_QUICK")) T = T < 64 ? T : 64; /* the sanitizer run checks fewer positions */
    int32_t *ids = malloc((T + 1) * sizeof *ids);
    int *top1 = malloc(T * sizeof *top1);
    read_ids(json_get(tf, "ids"), ids, T);
    int agree = 0;
    CHECK(teacher_forced(&e, ids, T, top1, &err) == 0, "%s", err.msg);
    for (int i = 0; i < T; i++) agree += top1[i] == (int)json_at(json_get(tf, "top1"), i)->u.number.num;
    printf("# %s: teacher-forced top-1 agreement %d/%d (%.2f%%)\n", json_get_str(ref, "model", "?"), agree, T,
           100.0 * agree / T);
    CHECK(agree >= 0.99 * T, "agreement %d/%d below 99%%", agree, T);
    check_fp8_kv(&m, &e, ref, ids, T);

    const JsonValue *prompts = json_get(ref, "prompts");
    size_t n_prompts = getenv("CLLM_QUICK") ? 1 : json_len(prompts);
    for (size_t p = 0; p < n_prompts; p++) {
        const JsonValue *pr = json_at(prompts, p), *want = json_get(pr, "greedy");
        int n = (int)json_len(json_get(pr, "ids")), G = (int)json_len(want);
        int32_t *pids = malloc(n * sizeof *pids);
        read_ids(json_get(pr, "ids"), pids, n);
        Sequence s = {0};
        int same = 0;
        if (engine_feed(&e, &s, pids, n, &err) == 0) {
            for (; same < G; same++) {
                int32_t tok = argmax(s.logits, m.cfg.vocab);
                if (tok != (int32_t)json_at(want, same)->u.number.num) break;
                if (engine_feed(&e, &s, &tok, 1, &err)) break;
            }
        }
        if (same < G)
            printf("# prompt %zu: first divergence at token %d (reference margin %.4f)\n", p, same,
                   json_at(json_get(pr, "greedy_margins"), same)->u.number.num);
        CHECK(same == G, "prompt %zu: greedy output matches for %d of %d tokens", p, same, G);
        sequence_release(&e, &s);
        free(pids);
    }
    free(ids);
    free(top1);
    engine_free(&e);
    if (be) be->destroy(be);
    model_free(&m);
    json_free(doc);
}

static void check_named(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/real/%s.ref.json", test_fixture_dir(), name);
    check_reference(path);
}

static void test_smollm2(void) { check_named("smollm2-135m-instruct"); }
static void test_gemma3(void) { check_named("gemma3-270m"); }

int main(void) {
    RUN(test_smollm2);
    RUN(test_gemma3);
    TEST_EXIT();
}
