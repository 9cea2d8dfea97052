/* test_async_steps.c — overlapped steps (engine/step_overlap.h) against the
 * synchronous loop on the CPU backend (fp32), which implements the three ops
 * (sample_launch, sample_result, feed_tokens) so that the overlapped path runs
 * here: the same requests through both must give the same replies byte for
 * byte — tokens, text, finish reason, every logprob and prompt logprob entry.
 * Request streams from fixed seeds: arrivals spread over the steps, random
 * prompts (some sharing a prefix), lengths and max_tokens, greedy and seeded
 * draws, penalties, stop strings, EOS, logprobs and prompt logprobs, replies
 * cancelled mid-run through the interrupt flag and through the text callback;
 * a cache small enough to preempt, a context short enough to end replies, a
 * request longer than the whole cache, a model whose every layer is windowed.
 * The overlapped runs must have overlapped (steps launched before the last
 * step's tokens were taken), the synchronous ones not. */
#include <stdint.h>

#include "engine/virtual_engines.h"
#include "tests/test.h"
#include "tests/tiny_rig.h"

#define MAX_REQS 48
#define MAX_OUT 256

/* A request as submitted, and how it is cancelled (0: never). */
typedef struct {
    int32_t prompt[96];
    int n_prompt;
    GenParams p;
    const char *stop[1];
    char stop_text[8];
    int interrupt_after;          /* text bytes after which its interrupt flag is set */
    int refuse_after;             /* text bytes after which its callback returns nonzero */
} Spec;

/* What a reply gave. */
typedef struct {
    int32_t tokens[MAX_OUT];
    int n_tokens;
    char text[4096];
    char finish[16];
    int n_lp, n_prompt_lp;
    TokenLogprob lp[MAX_OUT], prompt_lp[96];
} Out;

/* A request's callback state (one per request and run). */
typedef struct {
    const Spec *spec;
    size_t emitted;
    volatile sig_atomic_t stop;
} Emit;

static int on_text(void *ctx, const char *text, size_t len) {
    Emit *e = ctx;
    (void)text;
    e->emitted += len;
    if (e->spec->interrupt_after > 0 && e->emitted >= (size_t)e->spec->interrupt_after) e->stop = 1;
    return e->spec->refuse_after > 0 && e->emitted >= (size_t)e->spec->refuse_after;
}

static void keep(Out *o, const SchedRequest *r) {
    memset(o, 0, sizeof *o);
    o->n_tokens = (int)r->tokens.n < MAX_OUT ? (int)r->tokens.n : MAX_OUT;
    memcpy(o->tokens, r->tokens.ids, (size_t)o->n_tokens * sizeof *o->tokens);
    snprintf(o->text, sizeof o->text, "%s", r->text.data ? r->text.data : "");
    snprintf(o->finish, sizeof o->finish, "%s", r->finish_reason);
    o->n_lp = r->lp.n < MAX_OUT ? r->lp.n : MAX_OUT;
    if (o->n_lp) memcpy(o->lp, r->lp.v, (size_t)o->n_lp * sizeof *o->lp);
    o->n_prompt_lp = r->n_prompt_lp < 96 ? r->n_prompt_lp : 96;
    if (o->n_prompt_lp) memcpy(o->prompt_lp, r->prompt_lp, (size_t)o->n_prompt_lp * sizeof *o->prompt_lp);
}

/* How a run went. */
typedef struct {
    int steps, bad;
    int64_t overlapped, preemptions;
    bool async;
} Run;

/* Runs the specs through one engine (requests arriving a few per step
 * from the seed), overlapped or not, until every one finished; keeps each
 * reply in outs. */
static Run run(Engine *e, const Spec *specs, int n, SchedOptions o, bool sync, uint64_t seed, Out *outs) {
    Run rn = {0};
    VirtualEngines g;
    Err err = {{0}};
    Emit emits[MAX_REQS];
    o.sync_steps = sync;
    if (vengines_init(&g, e, &o, 1, &err)) { printf("  %s\n", err.msg); rn.bad++; return rn; }
    rn.async = g.ve[0].async;
    int next = 0, finished = 0;
    while (finished < n && rn.steps < 20000) {
        int burst = (int)(rng_next(&seed) % 4);
        for (int i = 0; i < burst && next < n; i++, next++) {
            SchedRequest *r = vengines_submit(&g, specs[next].prompt, specs[next].n_prompt, &specs[next].p,
                                              (void *)(intptr_t)next, &err);
            if (!r) { printf("  submit %d: %s\n", next, err.msg); rn.bad++; finished++; continue; }
            emits[next] = (Emit){&specs[next], 0, 0};
            r->emit = on_text;
            r->emit_ctx = &emits[next];
            r->interrupt = &emits[next].stop;
        }
        if (vengines_step(&g, &err)) { printf("  step: %s\n", err.msg); rn.bad++; break; }
        rn.steps++;
        SchedRequest *r;
        while ((r = vengines_pop_finished(&g))) {
            keep(&outs[(intptr_t)r->user], r);
            sched_request_free(r);
            finished++;
        }
    }
    if (finished < n) { printf("  %d of %d requests finished\n", finished, n); rn.bad++; }
    rn.overlapped = g.ve[0].stats.overlapped;
    rn.preemptions = g.ve[0].stats.preemptions;
    if (block_manager_used(g.ve[0].bm) != 0) { printf("  %d blocks still used\n", block_manager_used(g.ve[0].bm)); rn.bad++; }
    vengines_free(&g);
    if (e->pool.n_free != e->pool.n_blocks) { printf("  %d blocks leaked\n", e->pool.n_blocks - e->pool.n_free); rn.bad++; }
    return rn;
}

/* Byte-for-byte equality of two replies; prints the first difference. */
static int same(const Out *a, const Out *b, int k) {
    const char *what = NULL;
    if (a->n_tokens != b->n_tokens || memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens))
        what = "tokens";
    else if (strcmp(a->text, b->text)) what = "text";
    else if (strcmp(a->finish, b->finish)) what = "finish reason";
    else if (a->n_lp != b->n_lp || memcmp(a->lp, b->lp, (size_t)a->n_lp * sizeof *a->lp)) what = "logprobs";
    else if (a->n_prompt_lp != b->n_prompt_lp || memcmp(a->prompt_lp, b->prompt_lp, (size_t)a->n_prompt_lp * sizeof *a->prompt_lp))
        what = "prompt logprobs";
    if (!what) return 0;
    printf("  request %d: %s differ (overlapped %d tokens '%s' %s, synchronous %d tokens '%s' %s)\n", k, what,
           a->n_tokens, a->text, a->finish, b->n_tokens, b->text, b->finish);
    return 1;
}

/* Random requests: `shared` leading tokens common to all, a mix of every
 * feature the overlapped loop must keep. */
static void make_specs(Spec *sp, int n, int vocab, uint64_t seed, int shared, int max_prompt) {
    int32_t prefix[32];
    for (int i = 0; i < 32; i++) prefix[i] = 3 + (int32_t)(rng_next(&seed) % (vocab - 3));
    for (int k = 0; k < n; k++) {
        Spec *s = &sp[k];
        memset(s, 0, sizeof *s);
        s->n_prompt = shared + 1 + (int)(rng_next(&seed) % (max_prompt - shared));
        for (int i = 0; i < s->n_prompt; i++)
            s->prompt[i] = i < shared ? prefix[i] : 3 + (int32_t)(rng_next(&seed) % (vocab - 3));
        GenParams *p = &s->p;
        *p = (GenParams){.sampling = sampler_params_default(), .max_tokens = 1 + (int)(rng_next(&seed) % 24),
                         .ignore_eos = rng_next(&seed) % 3 != 0};
        p->sampling.temperature = 0;
        int kind = (int)(rng_next(&seed) % 8);
        if (kind >= 3) { /* seeded draws */
            p->sampling.temperature = 0.8f;
            p->sampling.seed = 1 + k;
        }
        if (kind == 4 || kind == 5) { /* penalties: the window must hold the token in flight */
            p->sampling.repetition_penalty = 1.3f;
            p->sampling.presence_penalty = 0.4f;
            p->sampling.frequency_penalty = 0.2f;
            p->sampling.penalty_last_n = kind == 4 ? 8 : 0;
        }
        if (kind == 6) p->sampling.top_k = 0, p->sampling.top_p = 0.9f, p->sampling.min_p = 0;
        if (rng_next(&seed) % 5 == 0) p->logprobs = true, p->top_logprobs = 3;
        if (rng_next(&seed) % 9 == 0) p->prompt_logprobs = true, p->prompt_top = 2;
        if (rng_next(&seed) % 7 == 0) p->max_tokens = 0; /* until the context or a stop */
        int cancel = (int)(rng_next(&seed) % 10);
        if (cancel == 0) s->interrupt_after = 1 + (int)(rng_next(&seed) % 12);
        if (cancel == 1) s->refuse_after = 1 + (int)(rng_next(&seed) % 12);
    }
}

/* Stop strings: two bytes from the middle of a reply the synchronous loop gave. */
static void add_stops(Spec *sp, const Out *ref, int n, uint64_t seed) {
    for (int k = 0; k < n; k++) {
        size_t len = strlen(ref[k].text);
        if (len < 4 || rng_next(&seed) % 3 != 0) continue;
        memcpy(sp[k].stop_text, ref[k].text + len / 2, 2);
        sp[k].stop_text[2] = 0;
        sp[k].stop[0] = sp[k].stop_text;
        sp[k].p.stop = sp[k].stop;
        sp[k].p.n_stop = 1;
    }
}

/* One stream: its specs through the synchronous loop (twice: without and
 * with stop strings taken from the first run), then overlapped; returns
 * mismatches. */
static int compare_stream(const char *what, Engine *e, Spec *sp, int n, SchedOptions o, uint64_t seed,
                          int64_t *overlapped, int64_t *preempted) {
    Out *sync = calloc(MAX_REQS, sizeof *sync), *ov = calloc(MAX_REQS, sizeof *ov);
    int bad = 0;
    Run a = run(e, sp, n, o, true, seed, sync);
    add_stops(sp, sync, n, seed);
    a = run(e, sp, n, o, true, seed, sync);
    Run b = run(e, sp, n, o, false, seed ^ 0x9e37, ov); /* other arrival times too */
    bad += a.bad + b.bad;
    CHECK(!a.async && b.async, "%s: the synchronous run must not overlap (%d), the other must (%d)", what, a.async,
          b.async);
    CHECK(a.overlapped == 0, "%s: %lld synchronous steps overlapped", what, (long long)a.overlapped);
    for (int k = 0; k < n; k++) bad += same(&ov[k], &sync[k], k);
    printf("  %s: %d requests, %d / %d steps, %lld overlapped, %lld / %lld preemptions\n", what, n, b.steps, a.steps,
           (long long)b.overlapped, (long long)b.preemptions, (long long)a.preemptions);
    *overlapped += b.overlapped;
    *preempted += b.preemptions;
    free(sync);
    free(ov);
    return bad;
}

static bool quick(void) { return getenv("CLLM_QUICK") != NULL; }

/* Random streams on the tiny llama and qwen3: an ample cache, a cache that
 * preempts, chunked prefill, prefix sharing on and off, a short context. */
static void test_streams_identical(void) {
    int n_streams = quick() ? 3 : 10;
    int64_t overlapped = 0, preempted = 0;
    for (int st = 0; st < n_streams; st++) {
        uint64_t seed = 4242 + st;
        bool small = st % 3 == 1;
        int ctx = st % 5 == 4 ? 40 : 256;
        Rig r;
        Spec *sp = calloc(MAX_REQS, sizeof *sp);
        int n = quick() ? 12 : 16 + (int)(rng_next(&seed) % 24);
        if (rig_open(&r, st % 2 ? "qwen3" : "llama", small ? 24 : 400, ctx, 32)) {
            CHECK(0, "stream %d: setup failed", st);
        } else {
            make_specs(sp, n, r.m.cfg.vocab, seed, (st % 4) * 4, ctx < 60 ? 30 : 60);
            SchedOptions o = {.max_seqs = 2 + (int)(rng_next(&seed) % 7),
                              .max_batched_tokens = 8 + (int)(rng_next(&seed) % 25),
                              .no_prefix_cache = st % 4 == 3};
            char what[64];
            snprintf(what, sizeof what, "stream %d (%s%s)", st, small ? "small cache" : "ample cache",
                     ctx < 60 ? ", short context" : "");
            int bad = compare_stream(what, &r.e, sp, n, o, seed, &overlapped, &preempted);
            CHECK(bad == 0, "%s: %d mismatches", what, bad);
        }
        free(sp);
        rig_close(&r);
    }
    CHECK(overlapped > 0, "no step was launched before the previous one's tokens were taken");
    CHECK(preempted > 0, "the small caches should have preempted");
}

/* Every layer windowed (tiny mistral, window 6): blocks given back as rows
 * are launched, not after they ran. */
static void test_windowed_identical(void) {
    Rig r;
    Spec *sp = calloc(MAX_REQS, sizeof *sp);
    int64_t overlapped = 0, preempted = 0;
    if (rig_open(&r, "mistral", 40, 256, 16)) {
        CHECK(0, "setup failed");
    } else {
        make_specs(sp, 16, r.m.cfg.vocab, 77, 8, 40);
        SchedOptions o = {.max_seqs = 4, .max_batched_tokens = 12};
        int bad = compare_stream("mistral", &r.e, sp, 16, o, 77, &overlapped, &preempted);
        CHECK(bad == 0, "%d mismatches", bad);
        CHECK(overlapped > 0, "no overlap");
    }
    free(sp);
    rig_close(&r);
}

/* A request longer than the whole cache ends with "context" holding every
 * token it drew (its last one was in flight when the cache ran out). */
static void test_cache_too_small(void) {
    Rig r;
    Spec sp[2];
    Out sync[2], ov[2];
    if (rig_open(&r, "llama", 8, 64, 16)) {
        CHECK(0, "setup failed");
    } else {
        memset(sp, 0, sizeof sp);
        for (int k = 0; k < 2; k++) {
            sp[k].n_prompt = 20;
            for (int i = 0; i < 20; i++) sp[k].prompt[i] = 3 + i * (k + 1);
            sp[k].p = (GenParams){.sampling = sampler_params_default(), .max_tokens = 60, .ignore_eos = true};
            sp[k].p.sampling.temperature = k ? 0.8f : 0;
        }
        SchedOptions o = {.max_seqs = 2, .max_batched_tokens = 16};
        Run a = run(&r.e, sp, 2, o, true, 5, sync), b = run(&r.e, sp, 2, o, false, 5, ov);
        CHECK(a.bad == 0 && b.bad == 0 && b.overlapped > 0, "runs failed (%d, %d) or did not overlap", a.bad, b.bad);
        for (int k = 0; k < 2; k++) {
            CHECK(!same(&ov[k], &sync[k], k), "request %d differs", k);
            CHECK(!strcmp(ov[k].finish, "context"), "request %d: finish %s", k, ov[k].finish);
        }
    }
    rig_close(&r);
}

/* Whether a scheduler over e overlaps its steps with CLLM_ASYNC_STEPS at
 * value (NULL: unset); -1 when scheduler_init refuses (err says why). */
static int overlaps(Engine *e, const char *value, bool host_sampling, Err *err) {
    if (value) setenv("CLLM_ASYNC_STEPS", value, 1);
    else unsetenv("CLLM_ASYNC_STEPS");
    Scheduler s;
    SchedOptions o = {.max_seqs = 2, .host_sampling = host_sampling};
    int rc = scheduler_init(&s, e, &o, err);
    unsetenv("CLLM_ASYNC_STEPS");
    if (rc) return -1;
    rc = s.async;
    scheduler_free(&s);
    return rc;
}

/* CLLM_ASYNC_STEPS: off turns overlap off, anything but on / off is refused;
 * --host-sampling steps synchronously. */
static void test_knob(void) {
    Rig r;
    Err err = {{0}};
    if (rig_open(&r, "llama", 32, 64, 16) == 0) {
        CHECK(overlaps(&r.e, NULL, false, &err) == 1, "default: on (%s)", err.msg);
        CHECK(overlaps(&r.e, "on", false, &err) == 1, "on (%s)", err.msg);
        CHECK(overlaps(&r.e, "off", false, &err) == 0, "off (%s)", err.msg);
        CHECK(overlaps(&r.e, "maybe", false, &err) == -1 && strstr(err.msg, "CLLM_ASYNC_STEPS 'maybe'"), "%s", err.msg);
        CHECK(overlaps(&r.e, NULL, true, &err) == 0, "host sampling: synchronous (%s)", err.msg);
    } else {
        CHECK(0, "setup failed");
    }
    rig_close(&r);
}

int main(void) {
    unsetenv("CLLM_ASYNC_STEPS");
    RUN(test_knob);
    RUN(test_streams_identical);
    RUN(test_windowed_identical);
    RUN(test_cache_too_small);
    TEST_EXIT();
}
