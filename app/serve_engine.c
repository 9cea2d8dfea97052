/* serve_engine.c — the engine thread of `cllm serve` (serve_engine.h): takes
 * the queued jobs, submits one scheduler request per choice, steps the
 * virtual engines, hands each choice's text to its connection as it is
 * made, and finishes choices; cancels what a connection gave up on (a
 * client that went away), and after SIGTERM's grace period everything. */
#include "app/serve_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"

ServeJob *serve_job_new(ApiRequest *req, TokenIds *ids) {
    ServeJob *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->req = *req;
    j->ids = *ids;
    memset(req, 0, sizeof *req);
    memset(ids, 0, sizeof *ids);
    pthread_cond_init(&j->cv, NULL);
    for (int i = 0; i < API_MAX_N; i++) j->ch[i] = (ServeChoice){.job = j, .index = i};
    return j;
}

static void job_free(ServeJob *j) {
    for (int i = 0; i < API_MAX_N; i++) textbuf_free(&j->ch[i].pending), token_logprobs_free(&j->ch[i].lp);
    api_request_free(&j->req);
    token_ids_free(&j->ids);
    pthread_cond_destroy(&j->cv);
    free(j);
}

int serve_job_enqueue(Server *s, ServeJob *j) {
    pthread_mutex_lock(&s->mu);
    bool refuse = s->stopping || s->engine_failed;
    if (!refuse) {
        if (s->queue_tail) s->queue_tail->next = j;
        else s->queue = j;
        s->queue_tail = j;
        j->mu = &s->mu;
        s->m.queued += j->req.n;
        pthread_cond_signal(&s->engine_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return refuse ? -1 : 0;
}

void serve_job_release(Server *s, ServeJob *j) {
    pthread_mutex_lock(&s->mu);
    j->conn_released = true;
    j->cancel = true;
    bool engine_done = !j->mu || (j->submitted && j->n_done == j->req.n); /* mu: set once queued */
    pthread_mutex_unlock(&s->mu);
    if (engine_done) job_free(j);
}

/* Copies (under mu) the scheduler's logprob entries c has not yet: the
 * connection reads c->lp, the engine thread grows sr->lp. -1: out of memory. */
static int choice_take_logprobs(ServeChoice *c, const SchedRequest *sr) {
    while (sr && c->lp.n < sr->lp.n) {
        TokenLogprob *e = token_logprobs_push(&c->lp);
        if (!e) return -1;
        *e = sr->lp.v[c->lp.n - 1];
    }
    return 0;
}

/* A choice's new text (the scheduler's emit callback, on the engine thread). */
static int choice_emit(void *ctx, const char *text, size_t len) {
    ServeChoice *c = ctx;
    pthread_mutex_lock(c->job->mu);
    int rc = textbuf_append(&c->pending, text, len) || choice_take_logprobs(c, c->sr);
    c->emitted += len;
    bool cancel = c->job->cancel;
    pthread_cond_broadcast(&c->job->cv);
    pthread_mutex_unlock(c->job->mu);
    return rc || cancel; /* nonzero ends the reply ("interrupted") */
}

/* Choice c is over (under mu): its finish reason, tokens, and any text the
 * callback has not seen (the reply text is the authority). */
static void choice_finish_locked(ServeChoice *c, const SchedRequest *sr) {
    if (!strcmp(sr->finish_reason, "error")) snprintf(c->error, sizeof c->error, "%.900s", sr->error);
    if (sr->text.len > c->emitted && !textbuf_append(&c->pending, sr->text.data + c->emitted, sr->text.len - c->emitted))
        c->emitted = sr->text.len;
    /* "interrupted" is a reply cut short (a cancel, the server stopping): OpenAI has no word for it */
    c->finish_reason = !strcmp(sr->finish_reason, "stop") ? "stop" : "length";
    c->completion_tokens = sr->n_generated;
    choice_take_logprobs(c, sr); /* out of memory: the entries so far */
    c->sr = NULL;
    c->done = true;
    c->job->n_done++;
    pthread_cond_broadcast(&c->job->cv);
}

/* Whether the engine's last hold on j went with this choice and the
 * connection let go already: then the caller frees it. */
static bool job_orphaned(const ServeJob *j) { return j->n_done == j->req.n && j->conn_released; }

/* One scheduler request per choice; a refusal (a prompt too long for the
 * context) fails the job: the ones already queued are interrupted. */
static void job_submit(Server *s, ServeJob *j) {
    Err err = {{0}};
    int ok = 0;
    for (; ok < j->req.n; ok++) {
        ServeChoice *c = &j->ch[ok];
        SchedRequest *sr = vengines_submit(&s->ve, j->ids.ids, (int)j->ids.n, &j->params[ok], c, &err);
        if (!sr) break;
        sr->emit = choice_emit;
        sr->emit_ctx = c;
        c->sr = sr;
        sr->interrupt = &j->interrupt;
    }
    pthread_mutex_lock(&s->mu);
    s->m.queued -= j->req.n;
    if (ok < j->req.n) {
        snprintf(j->submit_error, sizeof j->submit_error, "%.900s", err.msg);
        j->interrupt = 1;
        for (int i = ok; i < j->req.n; i++) {
            j->ch[i].done = true;
            j->ch[i].finish_reason = "length";
            j->n_done++;
        }
    } else {
        s->m.prompt_tokens += (long long)j->ids.n * j->req.n;
        s->m.requests++;
    }
    j->submitted = true;
    bool orphan = job_orphaned(j);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&s->mu);
    if (orphan) job_free(j);
}

/* Calls fn on every request the schedulers hold (engine thread). */
static void each_request(Server *s, void (*fn)(Server *, SchedRequest *, void *), void *arg) {
    for (int k = 0; k < s->ve.n; k++) {
        Scheduler *sc = &s->ve.ve[k];
        SchedRequest **qs[3] = {sc->waiting, sc->running, sc->finished};
        int ns[3] = {sc->n_waiting, sc->n_running, sc->n_finished};
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < ns[q]; i++) fn(s, qs[q][i], arg);
    }
}

/* Under mu: a job its connection gave up on (or, after the grace period,
 * every job) ends at its next token. */
static void cancel_one(Server *s, SchedRequest *sr, void *all) {
    ServeJob *j = ((ServeChoice *)sr->user)->job;
    if (j->cancel || *(bool *)all) j->interrupt = 1;
}

/* Under mu, after a failed forward pass: every choice ends with the error;
 * jobs their connections already let go are listed for freeing. */
static void fail_one(Server *s, SchedRequest *sr, void *orphans) {
    ServeChoice *c = sr->user;
    if (c->done) return;
    snprintf(c->error, sizeof c->error, "the engine failed; every request now fails");
    c->finish_reason = "length";
    c->done = true;
    c->job->n_done++;
    pthread_cond_broadcast(&c->job->cv);
    if (job_orphaned(c->job)) {
        c->job->next = *(ServeJob **)orphans;
        *(ServeJob **)orphans = c->job;
    }
}

static void fail_all(Server *s, const char *msg) {
    fprintf(stderr, "cllm serve: %s; every request now fails\n", msg);
    ServeJob *orphans = NULL;
    pthread_mutex_lock(&s->mu);
    s->engine_failed = true;
    each_request(s, fail_one, &orphans);
    pthread_mutex_unlock(&s->mu);
    while (orphans) {
        ServeJob *next = orphans->next;
        job_free(orphans);
        orphans = next;
    }
}

/* The finished requests of the last step go to their connections. */
static void finish_popped(Server *s) {
    SchedRequest *sr;
    while ((sr = vengines_pop_finished(&s->ve))) {
        ServeChoice *c = sr->user;
        ServeJob *j = c->job;
        pthread_mutex_lock(&s->mu);
        choice_finish_locked(c, sr);
        bool orphan = job_orphaned(j);
        pthread_mutex_unlock(&s->mu);
        sched_request_free(sr);
        if (orphan) job_free(j);
    }
}

/* Under mu: the gauges from the schedulers, the recent token rate. */
static void metrics_update(Server *s) {
    ServeMetrics *m = &s->m;
    m->waiting = m->running = 0;
    for (int k = 0; k < s->ve.n; k++) {
        m->waiting += s->ve.ve[k].n_waiting;
        m->running += s->ve.ve[k].n_running;
    }
    m->blocks_used = s->ve.stats.blocks_used;
    if (s->ve.stats.blocks_total > 0) m->blocks_total = s->ve.stats.blocks_total;
    m->generation_tokens = s->ve.stats.tokens_generated;
    double now = now_seconds();
    if (now - m->window_t0 >= 10.0) {
        m->tokens_per_s = (double)(m->generation_tokens - m->window_tokens0) / (now - m->window_t0);
        m->window_t0 = now;
        m->window_tokens0 = m->generation_tokens;
    }
}

/* Waits (under mu) for work or the stop; true when the loop must end. */
static bool wait_for_work(Server *s) {
    while (!s->queue && vengines_pending(&s->ve) == 0) {
        if (s->stopping) return true;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->engine_cv, &s->mu, &ts);
        metrics_update(s);
    }
    return false;
}

void *serve_engine_main(void *arg) {
    Server *s = arg;
    Err err = {{0}};
    pthread_mutex_lock(&s->mu);
    s->m.window_t0 = now_seconds();
    pthread_mutex_unlock(&s->mu);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (wait_for_work(s)) { pthread_mutex_unlock(&s->mu); break; }
        ServeJob *q = s->queue;
        s->queue = s->queue_tail = NULL;
        bool all = s->stopping && now_seconds() - s->t_stop > s->so->grace_seconds;
        each_request(s, cancel_one, &all);
        pthread_mutex_unlock(&s->mu);
        while (q) {
            ServeJob *next = q->next;
            job_submit(s, q);
            q = next;
        }
        if (vengines_pending(&s->ve) == 0) continue;
        if (vengines_step(&s->ve, &err)) { fail_all(s, err.msg); break; }
        finish_popped(s);
        pthread_mutex_lock(&s->mu);
        metrics_update(s);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

int serve_metrics_text(Server *s, TextBuf *out) {
    pthread_mutex_lock(&s->mu);
    ServeMetrics m = s->m;
    int conns = s->n_conns;
    pthread_mutex_unlock(&s->mu);
    char t[2048];
    int n = snprintf(t, sizeof t,
        "# HELP cllm_requests_waiting Sequences waiting to run (queued, not yet admitted, or preempted).\n"
        "# TYPE cllm_requests_waiting gauge\ncllm_requests_waiting %d\n"
        "# HELP cllm_requests_running Sequences running (prefill or decode).\n"
        "# TYPE cllm_requests_running gauge\ncllm_requests_running %d\n"
        "# HELP cllm_kv_blocks_used KV cache blocks in use.\n# TYPE cllm_kv_blocks_used gauge\ncllm_kv_blocks_used %d\n"
        "# HELP cllm_kv_blocks_total KV cache blocks.\n# TYPE cllm_kv_blocks_total gauge\ncllm_kv_blocks_total %d\n"
        "# HELP cllm_generation_tokens_total Tokens generated.\n"
        "# TYPE cllm_generation_tokens_total counter\ncllm_generation_tokens_total %lld\n"
        "# HELP cllm_prompt_tokens_total Prompt tokens of the sequences submitted.\n"
        "# TYPE cllm_prompt_tokens_total counter\ncllm_prompt_tokens_total %lld\n"
        "# HELP cllm_requests_total Generation requests accepted.\n"
        "# TYPE cllm_requests_total counter\ncllm_requests_total %lld\n"
        "# HELP cllm_tokens_per_second Tokens generated per second over the last 10 s window.\n"
        "# TYPE cllm_tokens_per_second gauge\ncllm_tokens_per_second %.3f\n"
        "# HELP cllm_http_connections Open HTTP connections.\n"
        "# TYPE cllm_http_connections gauge\ncllm_http_connections %d\n",
        m.waiting + m.queued, m.running, m.blocks_used, m.blocks_total, m.generation_tokens, m.prompt_tokens,
        m.requests, m.tokens_per_s, conns);
    return n > 0 && (size_t)n < sizeof t ? textbuf_append(out, t, (size_t)n) : -1;
}
