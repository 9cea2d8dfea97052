/* test_scheduler.c — engine/scheduler.c on the tiny golden models (fp32 CPU
 * backend). The reference of every request is the same request run alone
 * through generate_reply; the scheduler must give IDENTICAL tokens, text and
 * finish reasons:
 *   - 64 prompts (16 with CLLM_QUICK) with a shared system prefix, greedy,
 *     stop strings, sampled requests with their own seeds;
 *   - prompts sharing a prefix submitted together compute it once (prompt
 *     rows counted), and give the same outputs with cascade attention;
 *   - a small KV cache that forces preemption and recompute;
 *   - random request streams (fixed seeds): random budgets, cache sizes and
 *     arrival times; every step within its budgets, no deadlock, no block
 *     leaked at the end;
 *   - a model whose every layer is windowed (tiny mistral) gives blocks back
 *     behind the window and still matches. */
#include <stdint.h>

#include "engine/virtual_engines.h"
#include "tests/ref/ref_engine.h"
#include "tests/test.h"
#include "tests/tiny_rig.h"

#define BS TINY_RIG_BLOCK

/* One request and what it gave alone and through the scheduler. */
typedef struct {
    int32_t prompt[96];
    int n_prompt;
    GenParams p;
    const char *stop[1];
    char stop_text[8];
    int32_t want[64];
    int n_want;
    char want_text[1024];
    const char *want_reason;
    bool done;
    SchedRequest *req;
} Case;

typedef struct { char *text; size_t len, cap; } Text;

static int collect(void *ctx, const char *s, size_t n) {
    Text *t = ctx;
    if (t->len + n < t->cap) { memcpy(t->text + t->len, s, n); t->len += n; t->text[t->len] = 0; }
    return 0;
}

/* Runs c alone through generate_reply (the reference). */
static int run_alone(Engine *e, Case *c) {
    Sequence s = {0};
    GenStats st;
    Err err = {{0}};
    Text t = {c->want_text, 0, sizeof c->want_text};
    c->want_text[0] = 0;
    int rc = generate_reply(e, &s, c->prompt, c->n_prompt, &c->p, collect, &t, NULL, &st, &err);
    if (rc) printf("  reference: %s\n", err.msg);
    c->n_want = (int)s.tokens.n - c->n_prompt;
    if (c->n_want > 64) c->n_want = 64;
    memcpy(c->want, s.tokens.ids + c->n_prompt, (size_t)c->n_want * sizeof *c->want);
    c->want_reason = st.finish_reason;
    sequence_release(e, &s);
    return rc;
}

/* Random prompts; the first `shared` tokens of each are a common prefix. */
static void make_cases(Case *cs, int n, int vocab, uint64_t seed, int shared, bool variety) {
    int32_t prefix[32];
    for (int i = 0; i < 32; i++) prefix[i] = 3 + (int32_t)(rng_next(&seed) % (vocab - 3));
    for (int k = 0; k < n; k++) {
        Case *c = &cs[k];
        memset(c, 0, sizeof *c);
        int extra = 1 + (int)(rng_next(&seed) % 40);
        c->n_prompt = shared + extra;
        for (int i = 0; i < c->n_prompt; i++)
            c->prompt[i] = i < shared ? prefix[i] : 3 + (int32_t)(rng_next(&seed) % (vocab - 3));
        c->p = (GenParams){.sampling = sampler_params_default(), .max_tokens = 2 + (int)(rng_next(&seed) % 20),
                           .ignore_eos = true};
        c->p.sampling.temperature = 0;
        if (variety && k % 4 == 1) { /* sampled, each with its own seed */
            c->p.sampling.temperature = 0.9f;
            c->p.sampling.seed = 1000 + k;
        }
        if (variety && k % 4 == 2) c->p.ignore_eos = false;
    }
}

/* Stop strings: the 2 bytes at the middle of the reference text. */
static void add_stops(Case *cs, int n) {
    for (int k = 3; k < n; k += 4) {
        Case *c = &cs[k];
        size_t len = strlen(c->want_text);
        if (len < 4) continue;
        memcpy(c->stop_text, c->want_text + len / 2, 2);
        c->stop_text[2] = 0;
        c->stop[0] = c->stop_text;
        c->p.stop = c->stop;
        c->p.n_stop = 1;
    }
}

/* Checks that per-step statistics respect the budgets. */
typedef struct {
    int steps, max_rows, max_seqs, over_budget;
    int lone_prompt_rows;  /* one-row chunks of a longer prompt (engine_prompt_chunk forbids them) */
    int64_t preemptions, hits;
    int64_t prefill_rows; /* prompt rows computed (recomputed ones too) */
    int max_blocks_one;  /* most blocks any running request held */
    int max_blocks_used; /* most blocks in use at once (all engines) */
    int max_held[FORWARD_MAX_STAGES]; /* most blocks each virtual engine's requests held at once */
} Watch;

static void watch_step(const VirtualEngines *g, Watch *w) {
    const SchedStats *st = &g->stats;
    const SchedOptions *o = &g->ve[0].o;
    w->steps++;
    w->prefill_rows += st->n_prefill;
    if (st->n_tokens > w->max_rows) w->max_rows = st->n_tokens;
    if (st->n_seqs > w->max_seqs) w->max_seqs = st->n_seqs;
    if (st->blocks_used > w->max_blocks_used) w->max_blocks_used = st->blocks_used;
    w->over_budget += st->n_tokens > o->max_batched_tokens || st->n_seqs > o->max_seqs ||
                      st->blocks_used > st->blocks_total;
    for (int k = 0; k < g->n; k++) {
        const Scheduler *s = &g->ve[k];
        for (int i = 0; i < s->n_running; i++) {
            int held = s->running[i]->bt.n_blocks - s->running[i]->n_dropped;
            if (held > w->max_blocks_one) w->max_blocks_one = held;
        }
        int held = vengines_blocks_held(g, k);
        if (held > w->max_held[k]) w->max_held[k] = held;
    }
    w->preemptions = st->preemptions;
    w->hits = st->prefix_hit_tokens;
    const Scheduler *s = &g->ve[g->last]; /* the engine whose step just completed */
    for (int k = 0; st->n_tokens > 0 && k < s->n_sel; k++) { /* its rows: n_cached - chunk .. n_cached of each request */
        const SchedRequest *r = s->sel[k];
        int p0 = r->n_cached - s->sel_chunk[k];
        w->lone_prompt_rows += s->sel_chunk[k] == 1 && p0 < r->n_prompt && r->n_prompt > 1 && o->max_batched_tokens >= 4;
    }
}

/* Compares a finished request with its reference; returns mismatches. */
static int compare(Case *c, int k) {
    SchedRequest *r = c->req;
    int bad = 0;
    int got = (int)r->tokens.n - r->n_prompt;
    if (got != c->n_want || memcmp(r->tokens.ids + r->n_prompt, c->want, (size_t)c->n_want * sizeof(int32_t))) {
        printf("  request %d: %d tokens, reference %d; first difference at", k, got, c->n_want);
        for (int i = 0; i < got && i < c->n_want; i++)
            if (r->tokens.ids[r->n_prompt + i] != c->want[i]) { printf(" %d", i); break; }
        printf("\n");
        bad++;
    }
    const char *text = r->text.data ? r->text.data : "";
    if (strcmp(text, c->want_text)) { printf("  request %d: text '%s' vs '%s'\n", k, text, c->want_text); bad++; }
    if (strcmp(r->finish_reason, c->want_reason)) {
        printf("  request %d: finish %s vs %s (%s)\n", k, r->finish_reason, c->want_reason, r->error);
        bad++;
    }
    return bad;
}

/* Submits cases (all at once, or a few per step when `trickle`) to n_ve
 * virtual engines (all to the first one when `first_only`), steps until
 * idle, compares. Returns mismatches; fills w. */
static int run_engines(Engine *e, Case *cs, int n, const SchedOptions *o, uint64_t trickle_seed, int n_ve,
                       bool first_only, Watch *w) {
    VirtualEngines g;
    Err err = {{0}};
    memset(w, 0, sizeof *w);
    if (vengines_init(&g, e, o, n_ve, &err)) { printf("  %s\n", err.msg); return 1; }
    int next = 0, bad = 0, finished = 0;
    uint64_t seed = trickle_seed;
    while (finished < n && w->steps < 20000) {
        int burst = trickle_seed ? (int)(rng_next(&seed) % 4) : n;
        for (int i = 0; i < burst && next < n; i++, next++) {
            Case *c = &cs[next];
            c->req = first_only ? scheduler_submit(&g.ve[0], c->prompt, c->n_prompt, &c->p, c, &err)
                                : vengines_submit(&g, c->prompt, c->n_prompt, &c->p, c, &err);
            if (!c->req) { printf("  submit %d: %s\n", next, err.msg); bad++; finished++; }
        }
        if (vengines_step(&g, &err)) { printf("  step: %s\n", err.msg); bad++; break; }
        watch_step(&g, w);
        SchedRequest *r;
        while ((r = vengines_pop_finished(&g))) {
            Case *c = r->user;
            bad += compare(c, (int)(c - cs));
            c->req = NULL;
            sched_request_free(r);
            finished++;
        }
    }
    if (finished < n) { printf("  %d of %d requests finished after %d steps\n", finished, n, w->steps); bad++; }
    const BlockManager *bm = g.ve[0].bm;
    if (block_manager_used(bm) != 0 || e->pool.n_free + bm->n_lru != e->pool.n_blocks) {
        printf("  blocks leaked: used %d, free %d + cached %d of %d\n", block_manager_used(bm), e->pool.n_free,
               bm->n_lru, e->pool.n_blocks);
        bad++;
    }
    for (int k = 0; k < g.n; k++)
        if (vengines_blocks_held(&g, k)) { printf("  engine %d still holds %d blocks\n", k, vengines_blocks_held(&g, k)); bad++; }
    vengines_free(&g);
    if (e->pool.n_free != e->pool.n_blocks) { printf("  scheduler_free kept %d blocks\n", e->pool.n_blocks - e->pool.n_free); bad++; }
    return bad;
}

static int run_scheduled(Engine *e, Case *cs, int n, const SchedOptions *o, uint64_t trickle_seed, Watch *w) {
    return run_engines(e, cs, n, o, trickle_seed, 1, false, w);
}

static bool quick(void) { return getenv("CLLM_QUICK") != NULL; }

static int prepare(Rig *r, Case *cs, int n, uint64_t seed, int shared, bool variety) {
    make_cases(cs, n, r->m.cfg.vocab, seed, shared, variety);
    for (int k = 0; k < n; k++)
        if (run_alone(&r->e, &cs[k])) return -1;
    if (variety) {
        add_stops(cs, n);
        for (int k = 3; k < n; k += 4)
            if (cs[k].p.n_stop && run_alone(&r->e, &cs[k])) return -1;
    }
    return 0;
}

/* 64 prompts one at a time vs all through the scheduler: identical. */
static void test_same_as_one_at_a_time(void) {
    Rig r;
    int n = quick() ? 16 : 64;
    Case *cs = calloc(64, sizeof *cs);
    if (rig_open(&r, "llama", 512, 256, 64) || prepare(&r, cs, n, 7, 16, true)) {
        CHECK(0, "setup failed");
    } else {
        SchedOptions o = {.max_seqs = 16, .max_batched_tokens = 48};
        Watch w;
        int bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
        CHECK(bad == 0, "%d mismatches", bad);
        CHECK(w.over_budget == 0, "%d steps over budget", w.over_budget);
        CHECK(w.max_seqs > 1 && w.max_rows > 16, "batches should mix sequences: max %d seqs, %d rows", w.max_seqs,
              w.max_rows);
        CHECK(w.hits >= (n - 4) * 16, "the shared 16-token prefix should be reused: %lld tokens hit",
              (long long)w.hits);
        CHECK(w.preemptions == 0, "an ample cache should not preempt (%lld)", (long long)w.preemptions);
        /* chunked prefill with a budget below the prompt lengths */
        o = (SchedOptions){.max_seqs = 5, .max_batched_tokens = 7, .no_prefix_cache = true};
        bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
        CHECK(bad == 0 && w.over_budget == 0 && w.max_rows <= 7, "budget 7: %d mismatches, max rows %d", bad,
              w.max_rows);
        CHECK(w.lone_prompt_rows == 0, "budget 7: %d one-row prompt chunks", w.lone_prompt_rows);
    }
    free(cs);
    rig_close(&r);
}

/* Prompts sharing a prefix, all submitted at once: the prefix is computed
 * once. The first request computes it; the others wait while its blocks are
 * in flight and then take them from the prefix cache, so the prompt rows
 * computed are the first prompt's plus every other prompt's uncached tail.
 * Outputs equal the one-at-a-time reference; with budgets above and below
 * the prefix (chunked prefill of the prefix: the others wait block by
 * block); and with the prefix cache off every prompt is computed whole. */
static void test_shared_prefix_computed_once(void) {
    Rig r;
    int n = quick() ? 8 : 24, shared = 32;
    Case *cs = calloc(24, sizeof *cs);
    if (rig_open(&r, "llama", 512, 256, 64) || prepare(&r, cs, n, 23, shared, true)) {
        CHECK(0, "setup failed");
    } else {
        int64_t all = 0, once = 0;
        for (int k = 0; k < n; k++) {
            int matched = (cs[k].n_prompt - 2) / BS * BS; /* request_match_prefix leaves 2 tokens to compute */
            if (matched > shared / BS * BS) matched = shared / BS * BS;
            all += cs[k].n_prompt;
            once += k == 0 ? cs[k].n_prompt : cs[k].n_prompt - matched;
        }
        int budgets[] = {64, 20, 9};
        for (int i = 0; i < 3; i++) {
            SchedOptions o = {.max_seqs = 16, .max_batched_tokens = budgets[i]};
            Watch w;
            int bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
            CHECK(bad == 0, "budget %d: %d mismatches", budgets[i], bad);
            CHECK(w.preemptions == 0, "budget %d: %lld preemptions", budgets[i], (long long)w.preemptions);
            CHECK(w.prefill_rows == once, "budget %d: %lld prompt rows computed, want %lld (the prefix once; %lld "
                  "with it computed by every prompt)", budgets[i], (long long)w.prefill_rows, (long long)once,
                  (long long)all);
        }
        SchedOptions o = {.max_seqs = 16, .max_batched_tokens = 64, .no_prefix_cache = true};
        Watch w;
        int bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
        CHECK(bad == 0 && w.prefill_rows == all, "no prefix cache: %d mismatches, %lld prompt rows (want %lld)", bad,
              (long long)w.prefill_rows, (long long)all);
    }
    free(cs);
    rig_close(&r);
}

/* Cascade attention forced on every group (CLLM_CASCADE=always: the tiny
 * prefixes are far below the rule's threshold) in batches of prompts sharing
 * a prefix: outputs identical to each request run alone (no group there),
 * on a global model, one with a window and soft-caps (gemma2) and one with
 * sinks and a window (gpt-oss); the cascade path must have run. */
static void test_cascade_identical(void) {
    const char *archs[] = {"llama", "gemma2", "gpt-oss"};
    setenv("CLLM_CASCADE", "always", 1);
    for (int a = 0; a < 3; a++) {
        Rig r;
        int n = quick() ? 8 : 16;
        Case *cs = calloc(16, sizeof *cs);
        if (rig_open(&r, archs[a], 512, 256, 64) || prepare(&r, cs, n, 31 + a, 32, true)) {
            CHECK(0, "%s: setup failed", archs[a]);
        } else {
            int64_t before = backend_cpu_cascade_rows(r.be);
            SchedOptions o = {.max_seqs = 16, .max_batched_tokens = 64};
            Watch w;
            int bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
            int64_t rows = backend_cpu_cascade_rows(r.be) - before;
            CHECK(bad == 0, "%s: %d mismatches with cascade", archs[a], bad);
            CHECK(rows > 0, "%s: no row went through a cascade group", archs[a]);
            printf("  %s: %lld rows x layers through cascade groups\n", archs[a], (long long)rows);
        }
        free(cs);
        rig_close(&r);
    }
    unsetenv("CLLM_CASCADE");
}

/* A cache too small for everyone at once: the newest requests are
 * preempted and recomputed; outputs stay identical. Also with 2 and 3
 * virtual engines over the one pool (preemption across engines), and with
 * the whole load on one of two engines. */
static void test_preemption_identical(void) {
    Rig r;
    int n = quick() ? 12 : 32;
    Case *cs = calloc(32, sizeof *cs);
    /* 20 blocks of 4 = 80 tokens; the longest request needs 16 + 40 + 21 = 77 */
    if (rig_open(&r, "llama", 20, 256, 64) || prepare(&r, cs, n, 11, 16, true)) {
        CHECK(0, "setup failed");
    } else {
        for (int n_ve = 1; n_ve <= 3; n_ve++) {
            SchedOptions o = {.max_seqs = 8, .max_batched_tokens = 32};
            Watch w;
            int bad = run_engines(&r.e, cs, n, &o, 0, n_ve, false, &w);
            CHECK(bad == 0, "%d engine(s): %d mismatches", n_ve, bad);
            CHECK(w.preemptions > 0, "%d engine(s): the small cache should force preemption", n_ve);
            CHECK(w.over_budget == 0, "%d engine(s): %d steps over budget", n_ve, w.over_budget);
            for (int k = 0; k < n_ve; k++) CHECK(w.max_held[k] > 0, "%d engines: engine %d never ran", n_ve, k);
            printf("  %d engine(s): %d steps, %lld preemptions, %lld prefix tokens reused, peak %d of 20 blocks\n",
                   n_ve, w.steps, (long long)w.preemptions, (long long)w.hits, w.max_blocks_used);
        }
        /* Every request on one of two engines: it uses the whole pool (a fixed
         * half per engine would cap it at 10 of 20 blocks). No prefix cache:
         * a held block is then held by one request only. */
        SchedOptions o = {.max_seqs = 8, .max_batched_tokens = 32, .no_prefix_cache = true};
        Watch w;
        int bad = run_engines(&r.e, cs, n, &o, 0, 2, true, &w);
        CHECK(bad == 0, "unbalanced: %d mismatches", bad);
        CHECK(w.max_held[0] >= 18, "the loaded engine held at most %d of 20 blocks", w.max_held[0]);
        CHECK(w.max_held[1] == 0, "the idle engine held %d blocks", w.max_held[1]);
        printf("  all requests on engine 0 of 2: it held up to %d of 20 blocks\n", w.max_held[0]);
    }
    free(cs);
    rig_close(&r);
}

/* Random streams: budgets, cache sizes, arrivals from fixed seeds; 1, 2 or
 * 3 virtual engines. */
static void test_random_streams(void) {
    int n_streams = quick() ? 3 : 12;
    for (int st = 0; st < n_streams; st++) {
        uint64_t seed = 1000 + st;
        int n_blocks = 20 + (int)(rng_next(&seed) % 40);
        Rig r;
        int n = 8 + (int)(rng_next(&seed) % 16);
        Case *cs = calloc(n, sizeof *cs);
        if (rig_open(&r, st % 3 == 2 ? "qwen3" : "llama", n_blocks, 256, 32) ||
            prepare(&r, cs, n, seed, (int)(rng_next(&seed) % 2) * 12, st % 2 == 0)) {
            CHECK(0, "setup failed");
        } else {
            SchedOptions o = {.max_seqs = 1 + (int)(rng_next(&seed) % 8),
                              .max_batched_tokens = 1 + (int)(rng_next(&seed) % 32),
                              .no_prefix_cache = rng_next(&seed) % 4 == 0};
            Watch w;
            int n_ve = 1 + st % 3;
            int bad = run_engines(&r.e, cs, n, &o, seed | 1, n_ve, false, &w);
            CHECK(bad == 0 && w.over_budget == 0, "stream %d (%d engines, %d blocks, %d seqs, %d tokens): %d mismatches, "
                  "%d over budget", st, n_ve, n_blocks, o.max_seqs, o.max_batched_tokens, bad, w.over_budget);
            CHECK(w.lone_prompt_rows == 0, "stream %d: %d one-row prompt chunks", st, w.lone_prompt_rows);
        }
        free(cs);
        rig_close(&r);
    }
}

/* Tiny mistral: a window of 6 on every layer. A request holds at most the
 * blocks its window spans (plus the one being filled), output unchanged. */
static void test_window_gives_blocks_back(void) {
    Rig r;
    int n = quick() ? 6 : 16;
    Case *cs = calloc(16, sizeof *cs);
    if (rig_open(&r, "mistral", 64, 256, 32) || prepare(&r, cs, n, 5, 8, false)) {
        CHECK(0, "setup failed");
    } else {
        for (int k = 0; k < n; k++) CHECK(r.e.model->cfg.layer_window[0] == 6, "fixture window");
        SchedOptions o = {.max_seqs = 4, .max_batched_tokens = 1};
        Watch w;
        int bad = run_scheduled(&r.e, cs, n, &o, 0, &w);
        CHECK(bad == 0, "%d mismatches", bad);
        /* one row per step: a request holds the window's blocks + the one written */
        CHECK(w.max_blocks_one <= (6 + BS - 1) / BS + 2, "a request held %d blocks", w.max_blocks_one);
        o = (SchedOptions){.max_seqs = 4, .max_batched_tokens = 16};
        bad = run_scheduled(&r.e, cs, n, &o, 3, &w);
        CHECK(bad == 0, "%d mismatches (budget 16)", bad);
    }
    free(cs);
    rig_close(&r);
}

/* Submissions that can never run are refused with a reason. */
static void test_submit_errors(void) {
    Rig r;
    if (rig_open(&r, "llama", 8, 64, 16)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    Scheduler s;
    Err err = {{0}};
    SchedOptions o = {0};
    CHECK(scheduler_init(&s, &r.e, &o, &err) == 0, "%s", err.msg);
    CHECK(s.o.max_batched_tokens == 16, "budget capped at the engine's chunk: %d", s.o.max_batched_tokens);
    int32_t p[80] = {0};
    GenParams gp = {.sampling = sampler_params_default(), .max_tokens = 4, .ignore_eos = true};
    CHECK(!scheduler_submit(&s, p, 0, &gp, NULL, &err) && strstr(err.msg, "empty"), "empty: %s", err.msg);
    CHECK(!scheduler_submit(&s, p, 64, &gp, NULL, &err) && strstr(err.msg, "context"), "context: %s", err.msg);
    CHECK(!scheduler_submit(&s, p, 40, &gp, NULL, &err) && strstr(err.msg, "KV cache"), "cache: %s", err.msg);
    /* a request that outgrows the whole cache ends with "context" */
    gp.max_tokens = 60;
    gp.sampling.temperature = 0;
    SchedRequest *q = scheduler_submit(&s, p, 20, &gp, NULL, &err);
    CHECK(q != NULL, "%s", err.msg);
    for (int i = 0; i < 200 && !scheduler_idle(&s); i++) scheduler_step(&s, &err);
    SchedRequest *f = scheduler_pop_finished(&s);
    CHECK(f == q && f && !strcmp(f->finish_reason, "context") && f->tokens.n <= 33, "finish %s at %zu tokens",
          f ? f->finish_reason : "-", f ? f->tokens.n : 0);
    sched_request_free(f);
    scheduler_free(&s);
    CHECK(r.e.pool.n_free == 8, "blocks back: %d", r.e.pool.n_free);
    rig_close(&r);
}

/* Prompt chunks: never one row of a longer prompt, never a one-row rest. */
static void test_prompt_chunk(void) {
    CHECK(engine_prompt_chunk(10, 64, 64) == 10, "fits");
    CHECK(engine_prompt_chunk(1, 64, 64) == 1 && engine_prompt_chunk(1, 1, 64) == 1, "a decode row");
    CHECK(engine_prompt_chunk(10, 9, 64) == 8, "a rest of 1 -> 2: %d", engine_prompt_chunk(10, 9, 64));
    CHECK(engine_prompt_chunk(10, 1, 64) == 0, "one row of 10: wait");
    CHECK(engine_prompt_chunk(3, 2, 64) == 0, "2 of 3 would leave one: wait");
    CHECK(engine_prompt_chunk(10, 5, 64) == 5 && engine_prompt_chunk(2, 2, 64) == 2, "plain");
    CHECK(engine_prompt_chunk(10, 0, 64) == 0, "no budget");
    CHECK(engine_prompt_chunk(10, 1, 3) == 1 && engine_prompt_chunk(3, 2, 3) == 2, "tiny budgets: rule off");
    /* a whole prompt fed through one sequence: every chunk >= 2 rows */
    for (int n = 2; n < 40; n++)
        for (int mc = 4; mc < 12; mc++) {
            int left = n, bad = 0;
            while (left > 0) {
                int c = engine_prompt_chunk(left, mc, mc);
                bad += c < 2 || c > mc;
                if (c <= 0) break;
                left -= c;
            }
            CHECK(bad == 0 && left == 0, "prompt %d, chunk %d: %d bad chunks, %d left", n, mc, bad, left);
        }
}

/* The default step limits from the KV cache (engine_auto_*). */
static void test_auto_limits(void) {
    /* 8B on an H200: ~780k tokens of cache hold 761 sequences of 1024 -> 512; an fp8 cache twice that -> the cap */
    CHECK(engine_auto_max_seqs(48750, 16, 4096) == 512, "big cache: %d", engine_auto_max_seqs(48750, 16, 4096));
    CHECK(engine_auto_max_seqs(2 * 48750, 16, 4096) == ENGINE_AUTO_MAX_SEQS, "twice that: %d",
          engine_auto_max_seqs(2 * 48750, 16, 4096));
    /* 120k tokens hold 117 sequences of 1024: a power of two below */
    CHECK(engine_auto_max_seqs(7500, 16, 4096) == 64, "117 -> 64: %d", engine_auto_max_seqs(7500, 16, 4096));
    CHECK(engine_auto_max_seqs(64 * 200, 16, 8192) == 128, "200 -> 128: %d", engine_auto_max_seqs(64 * 200, 16, 8192));
    CHECK(engine_auto_max_seqs(64 * 1023, 16, 8192) == 512, "1023 -> 512: %d", engine_auto_max_seqs(64 * 1023, 16, 8192));
    /* never below the floor */
    CHECK(engine_auto_max_seqs(64 * 40, 16, 4096) == 32, "40 -> 32: %d", engine_auto_max_seqs(64 * 40, 16, 4096));
    CHECK(engine_auto_max_seqs(257, 16, 4096) == ENGINE_AUTO_MIN_SEQS, "one context of cache (the CPU): %d",
          engine_auto_max_seqs(257, 16, 4096));
    CHECK(engine_auto_max_seqs(0, 16, 4096) == ENGINE_AUTO_MIN_SEQS, "no cache");
    /* a context shorter than the nominal sequence: sequences of the context */
    CHECK(engine_auto_max_seqs(64 * 8, 16, 256) == 32, "ctx 256: 32 fit: %d", engine_auto_max_seqs(64 * 8, 16, 256));
    CHECK(engine_auto_max_seqs(100, 16, 0) == ENGINE_AUTO_MIN_SEQS, "no context limit: the nominal length");
    /* deterministic and monotone in the cache */
    int prev = 0, bad = 0;
    for (int64_t b = 0; b < 100000; b += 97) {
        int n = engine_auto_max_seqs(b, 16, 4096);
        bad += n < prev || n < ENGINE_AUTO_MIN_SEQS || n > ENGINE_AUTO_MAX_SEQS || n != engine_auto_max_seqs(b, 16, 4096);
        prev = n;
    }
    CHECK(bad == 0, "%d non-monotone or out-of-range answers", bad);
    CHECK(engine_auto_max_batched_tokens(48750, 16) == ENGINE_AUTO_BATCHED_TOKENS, "big cache: the default");
    CHECK(engine_auto_max_batched_tokens(257, 16) == 4112, "a small cache: its tokens");
    CHECK(engine_auto_max_batched_tokens(0, 16) == 1, "no cache: one row");
    /* a scheduler left to the defaults takes them from its engine */
    Rig r;
    if (rig_open(&r, "llama", 40, 64, 64)) { CHECK(0, "setup failed"); rig_close(&r); return; }
    Scheduler s;
    Err err = {{0}};
    SchedOptions o = {0};
    CHECK(scheduler_init(&s, &r.e, &o, &err) == 0, "%s", err.msg);
    CHECK(s.o.max_seqs == 16 && s.o.max_batched_tokens == 64, "defaults of a 40-block cache: %d seqs, %d tokens",
          s.o.max_seqs, s.o.max_batched_tokens);
    scheduler_free(&s);
    rig_close(&r);
}

int main(void) {
    RUN(test_prompt_chunk);
    RUN(test_auto_limits);
    RUN(test_same_as_one_at_a_time);
    RUN(test_shared_prefix_computed_once);
    RUN(test_cascade_identical);
    RUN(test_preemption_identical);
    RUN(test_random_streams);
    RUN(test_window_gives_blocks_back);
    RUN(test_submit_errors);
    TEST_EXIT();
}
