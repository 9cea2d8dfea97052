/* step_draw.c — a step's draws: which logits rows draw, the rows as the
 * backend's batched draw takes them, the draw made now (on the backend
 * where it samples, else here over the thread pool) or launched without a
 * wait (overlapped steps, step_overlap.h), and the tokens applied. */
#include <stdlib.h>
#include <string.h>

#include "base/thread_pool.h" /* samples many requests at once */
#include "engine/scheduler_internal.h"

/* Before a draw: a request interrupted ends without one; the sampler is set
 * up on first use (it counts every token so far for the penalties). Returns
 * whether the request draws. */
static bool request_ready_to_draw(Scheduler *s, SchedRequest *r) {
    if (r->interrupt && *r->interrupt) { sched_request_end(s, r, "interrupted"); return false; }
    if (r->sampler_ready) return true;
    Err err = {{0}};
    if (sampler_init(&r->sampler, &r->params.sampling, s->e->model->cfg.vocab, &err)) {
        sched_request_fail(s, r, err.msg);
        return false;
    }
    r->sampler_ready = true;
    for (size_t i = 0; i < r->tokens.n; i++) sampler_accept(&r->sampler, r->tokens.ids[i]);
    return true;
}

void sched_ready_draws(Scheduler *s, int n) {
    for (int i = 0; i < n; i++)
        if (s->draw_req[i] && !request_ready_to_draw(s, s->draw_req[i])) s->draw_req[i] = NULL;
}

/* The entry of the prompt token after position p. A recomputed row (after a
 * preemption) writes the same entry again. */
static void record_prompt_logprob(Scheduler *s, SchedRequest *r, int p, const float *row) {
    TokenLogprob *e = &r->prompt_lp[p + 1];
    logprobs_row(row, s->e->model->cfg.vocab, r->tokens.ids[p + 1], r->params.prompt_top, e);
    if (p + 2 > r->n_prompt_lp) r->n_prompt_lp = p + 2;
}

void sched_select_draws(Scheduler *s, int n) {
    for (int i = 0; i < n; i++) {
        SchedRequest *r = s->logit_req[i];
        s->draw_req[i] = NULL;
        if (r->state == REQ_FINISHED) continue; /* ended by the tokens taken after its row was launched */
        bool draws = s->logit_pos[i] == (int)r->tokens.n - 1;
        if (draws) s->draw_req[i] = r;
        else record_prompt_logprob(s, r, s->logit_pos[i], s->logits + (size_t)i * s->e->model->cfg.vocab);
    }
}

/* Draws for logits rows [begin, end): each request touches only its own
 * sampler, so rows run on any thread. The draw penalizes its row in place,
 * so a row whose logprobs are wanted (of the raw logits, logprobs.h) is
 * drawn from a copy. */
static void draw_rows(void *ctx, int64_t begin, int64_t end) {
    Scheduler *s = ctx;
    int vocab = s->e->model->cfg.vocab;
    float *copy = NULL;
    for (int64_t i = begin; i < end; i++) {
        SchedRequest *r = s->draw_req[i];
        if (!r) continue;
        float *row = s->logits + (size_t)i * vocab;
        if (r->params.logprobs && r->sampler.penalize) {
            if (!copy) copy = malloc((size_t)vocab * sizeof *copy);
            if (!copy) { s->drawn[i] = -1; continue; } /* out of memory: the request fails */
            row = memcpy(copy, row, (size_t)vocab * sizeof *copy);
        }
        int32_t id = sampler_sample(&r->sampler, row, vocab);
        sampler_accept(&r->sampler, id);
        s->drawn[i] = id;
    }
    free(copy);
}

/* Every row's draw as the backend takes it (rows that do not draw get the
 * idle greedy sampler, their token ignored); 1 when the penalty windows do
 * not fit (the step draws on the host). */
static int pack_draw_rows(Scheduler *s, int n) {
    int cap = SCHED_DRAW_PEN * s->o.max_seqs, used = 0;
    int32_t *ids = s->draw_pen, *counts = s->draw_pen + cap;
    for (int i = 0; i < n; i++) {
        const Sampler *sp = s->draw_req[i] ? &s->draw_req[i]->sampler : &s->idle;
        int k = sampler_row(sp, &s->draw_rows[i], ids + used, counts + used, cap - used);
        if (k > cap - used) return 1;
        used += k;
    }
    return 0;
}

/* The backend draws every row now and the drawn tokens are accepted; 1 when
 * it cannot (a sampler beyond it): nothing drawn. */
static int draw_on_device(Scheduler *s, int n, Err *err) {
    Backend *be = s->e->be;
    int rc = pack_draw_rows(s, n);
    if (rc == 0) rc = be->sample(be, s->e->fw.logits, n, s->draw_rows, s->drawn, s->draw_used, err);
    if (rc != 0) return rc;
    for (int i = 0; i < n; i++) {
        Sampler *sp = s->draw_req[i] ? &s->draw_req[i]->sampler : &s->idle;
        if (s->draw_used[i]) sampler_uniform_skip(sp);
        if (s->draw_req[i]) sampler_accept(sp, s->drawn[i]);
    }
    return 0;
}

int sched_record_logprob(Scheduler *s, SchedRequest *r, int32_t id, const float *row) {
    TokenLogprob *e = token_logprobs_push(&r->lp);
    if (!e) return -1;
    logprobs_row(row, s->e->model->cfg.vocab, id, r->params.top_logprobs, e);
    return 0;
}

/* On the device where the backend samples, or here in parallel when the
 * scheduler has a thread pool; then the stop conditions, in row order. The
 * logits come here first where a row wants logprobs or the draw is made
 * here. */
int sched_draw_now(Scheduler *s, int n, bool logits_here, Err *err) {
    Backend *be = s->e->be;
    sched_ready_draws(s, n);
    bool logprobs = false;
    for (int i = 0; i < n; i++) logprobs |= s->draw_req[i] && s->draw_req[i]->params.logprobs;
    bool device = s->device_sampling && n > 0;
    int64_t elems = (int64_t)n * s->e->model->cfg.vocab;
    if (n > 0 && !logits_here && (logprobs || !device)) {
        if (be->read(be, s->logits, s->e->fw.logits, elems, err)) return -1;
        logits_here = true;
    }
    int rc = device ? draw_on_device(s, n, err) : 1;
    if (rc < 0) return -1;
    if (rc == 1 && !logits_here && be->read(be, s->logits, s->e->fw.logits, elems, err)) return -1; /* declined */
    if (rc == 1 && s->pool && n > 1) cpu_parallel_for(s->pool, n, draw_rows, s);
    else if (rc == 1) draw_rows(s, 0, n);
    for (int i = 0; i < n; i++) {
        SchedRequest *r = s->draw_req[i];
        s->stats.n_draws += r != NULL;
        if (r && s->drawn[i] < 0) { sched_request_fail(s, r, "out of memory"); continue; }
        if (r && r->params.logprobs &&
            sched_record_logprob(s, r, s->drawn[i], s->logits + (size_t)i * s->e->model->cfg.vocab)) {
            sched_request_fail(s, r, "out of memory");
            continue;
        }
        const char *why = r ? sched_accept_token(s, r, s->drawn[i]) : NULL;
        if (why) sched_request_end(s, r, why);
    }
    return 0;
}

int sched_draw_launch(Scheduler *s, int n, Err *err) {
    Backend *be = s->e->be;
    StepOverlap *ov = &s->ov;
    if (pack_draw_rows(s, n)) return 1;
    ov->kept = false;
    for (int i = 0; i < n; i++) {
        ov->keep[i] = s->draw_req[i] && s->draw_req[i]->params.logprobs;
        ov->kept |= ov->keep[i];
    }
    int rc = be->sample_launch(be, s->e->fw.logits, n, s->draw_rows, ov->kept ? ov->keep : NULL, err);
    if (rc != 0) return rc;
    ov->pending = true;
    ov->n = n;
    for (int i = 0; i < n; i++) {
        SchedRequest *r = s->draw_req[i];
        ov->req[i] = NULL;
        if (!r) continue;
        if (token_ids_push(&r->tokens, -1)) { sched_request_fail(s, r, "out of memory"); continue; }
        r->n_pending = 1;
        r->pending_row = i;
        ov->req[i] = r;
        s->stats.n_draws++;
    }
    return 0;
}
