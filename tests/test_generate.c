/* test_generate.c — one reply through generate_reply and the engine's
 * sequence bookkeeping, on the tiny llama model (tests/fixtures/tiny):
 * greedy tokens equal transformers' greedy continuation; max_tokens, stop
 * strings, end-of-generation tokens and a full context each end the reply
 * with the right reason; truncation and release return every block. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/backend_cpu.h"
#include "model/model.h"
#include "tests/ref/ref_engine.h"
#include "tests/test.h"

typedef struct {
    Model m;
    Backend *be;
    Engine e;
} Rig;

static int rig_open(Rig *r, int ctx) {
    char path[1024];
    Err err = {{0}};
    memset(r, 0, sizeof *r);
    snprintf(path, sizeof path, "%s/tiny/llama.gguf", test_fixture_dir());
    if (model_load(&r->m, path, 0, &err)) { printf("  %s\n", err.msg); return -1; }
    r->be = backend_cpu_create(&r->m.shape, &r->m.w, 2, 4, 64, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    if (!r->be || engine_init(&r->e, &r->m, r->be, ctx, 7, &err)) { printf("  %s\n", err.msg); return -1; }
    return 0;
}

static void rig_close(Rig *r) {
    engine_free(&r->e);
    if (r->be) r->be->destroy(r->be);
    model_free(&r->m);
}

typedef struct { char text[4096]; size_t len; } Collected;

static int collect(void *ctx, const char *s, size_t n) {
    Collected *c = ctx;
    if (c->len + n < sizeof c->text) { memcpy(c->text + c->len, s, n); c->len += n; c->text[c->len] = 0; }
    return 0;
}

/* The reference prompt and greedy continuation of tiny llama. */
static int load_ref(int32_t *prompt, int *n_prompt, int32_t *greedy, int *n_greedy) {
    char path[1024];
    Err err = {{0}};
    snprintf(path, sizeof path, "%s/tiny/llama.ref.json", test_fixture_dir());
    Json *doc = json_parse_file(path, &err);
    if (!doc) { printf("  %s\n", err.msg); return -1; }
    const JsonValue *ids = json_get(json_at(json_get(json_root(doc), "prompts"), 0), "ids");
    const JsonValue *g = json_get(json_get(json_root(doc), "greedy"), "ids");
    *n_prompt = (int)json_len(ids);
    *n_greedy = (int)json_len(g);
    for (int i = 0; i < *n_prompt; i++) prompt[i] = (int32_t)json_at(ids, i)->u.number.num;
    for (int i = 0; i < *n_greedy; i++) greedy[i] = (int32_t)json_at(g, i)->u.number.num;
    json_free(doc);
    return 0;
}

static GenParams greedy_params(int max_tokens) {
    GenParams p = {.sampling = sampler_params_default(), .max_tokens = max_tokens, .ignore_eos = true};
    p.sampling.temperature = 0;
    return p;
}

static void test_greedy_matches_reference(void) {
    Rig r;
    int32_t prompt[64], want[64];
    int np, ng;
    if (rig_open(&r, 200) || load_ref(prompt, &np, want, &ng)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    Sequence s = {0};
    GenStats st;
    Err err = {{0}};
    GenParams p = greedy_params(ng);
    CHECK(generate_reply(&r.e, &s, prompt, np, &p, NULL, NULL, NULL, &st, &err) == 0, "%s", err.msg);
    CHECK(st.completion_tokens == ng && !strcmp(st.finish_reason, "length"), "%d tokens, %s", st.completion_tokens,
          st.finish_reason);
    CHECK((int)s.tokens.n == np + ng, "sequence holds %zu tokens", s.tokens.n);
    for (int i = 0; i < ng && np + i < (int)s.tokens.n; i++)
        CHECK(s.tokens.ids[np + i] == want[i], "token %d: %d vs reference %d", i, s.tokens.ids[np + i], want[i]);
    sequence_release(&r.e, &s);
    CHECK(r.e.pool.n_free == r.e.pool.n_blocks, "blocks leaked");
    rig_close(&r);
}

static void test_stop_string_and_context(void) {
    Rig r;
    int32_t prompt[64], want[64];
    int np, ng;
    if (rig_open(&r, 200) || load_ref(prompt, &np, want, &ng)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    Err err = {{0}};
    GenStats st;
    /* The text of the first 6 greedy tokens; stopping on its last 2 bytes. */
    Collected full = {{0}, 0};
    Sequence s = {0};
    GenParams p = greedy_params(6);
    CHECK(generate_reply(&r.e, &s, prompt, np, &p, collect, &full, NULL, &st, &err) == 0, "%s", err.msg);
    sequence_release(&r.e, &s);
    CHECK(full.len >= 3, "reply text '%s' too short to test stop strings", full.text);
    char stop[8];
    snprintf(stop, sizeof stop, "%s", full.text + full.len - 2);
    const char *stops[1] = {stop};
    Collected cut = {{0}, 0};
    p = greedy_params(50);
    p.stop = stops;
    p.n_stop = 1;
    CHECK(generate_reply(&r.e, &s, prompt, np, &p, collect, &cut, NULL, &st, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(st.finish_reason, "stop"), "finish %s", st.finish_reason);
    const char *at = strstr(full.text, stop);
    CHECK(at && cut.len == (size_t)(at - full.text) && !memcmp(cut.text, full.text, cut.len),
          "stopped text '%s' should be '%.*s'", cut.text, at ? (int)(at - full.text) : 0, full.text);
    sequence_release(&r.e, &s);
    rig_close(&r);

    if (rig_open(&r, np + 5)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    p = greedy_params(0);
    CHECK(generate_reply(&r.e, &s, prompt, np, &p, NULL, NULL, NULL, &st, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(st.finish_reason, "context") && (int)s.tokens.n <= np + 5, "finish %s with %zu tokens",
          st.finish_reason, s.tokens.n);
    sequence_release(&r.e, &s);
    CHECK(engine_feed(&r.e, &s, prompt, np + 6 <= 64 ? np + 6 : np, &err) == -1 && strstr(err.msg, "context"),
          "an over-long prompt must fail: '%s'", err.msg);
    CHECK(s.tokens.n == 0 && r.e.pool.n_free == r.e.pool.n_blocks, "a failed feed leaves nothing behind");
    sequence_release(&r.e, &s);
    rig_close(&r);
}

static void test_truncate_reuses_prefix(void) {
    Rig r;
    int32_t prompt[64], want[64];
    int np, ng;
    if (rig_open(&r, 200) || load_ref(prompt, &np, want, &ng)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    Err err = {{0}};
    Sequence s = {0};
    CHECK(engine_feed(&r.e, &s, prompt, np, &err) == 0, "%s", err.msg);
    float *first = malloc(r.m.cfg.vocab * sizeof *first);
    memcpy(first, s.logits, r.m.cfg.vocab * sizeof *first);
    int32_t junk[5] = {3, 4, 5, 6, 7};
    CHECK(engine_feed(&r.e, &s, junk, 5, &err) == 0, "%s", err.msg);
    sequence_truncate(&r.e, &s, np - 1); /* keep all but the last prompt token */
    CHECK(s.n_cached == np - 1 && s.bt.n_blocks == (np - 1 + 3) / 4, "cached %d, blocks %d", s.n_cached, s.bt.n_blocks);
    CHECK(engine_feed(&r.e, &s, prompt + np - 1, 1, &err) == 0, "%s", err.msg);
    double md = 0;
    for (int v = 0; v < r.m.cfg.vocab; v++) md = fmax(md, fabs(s.logits[v] - first[v]));
    CHECK(md < 1e-5, "logits after truncate + refeed differ by %g", md);
    sequence_release(&r.e, &s);
    CHECK(r.e.pool.n_free == r.e.pool.n_blocks, "blocks leaked");
    free(first);
    rig_close(&r);
}

int main(void) {
    RUN(test_greedy_matches_reference);
    RUN(test_stop_string_and_context);
    RUN(test_truncate_reuses_prefix);
    TEST_EXIT();
}
