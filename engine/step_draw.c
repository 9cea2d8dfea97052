/* step_draw.c — a step's draws: which logits rows draw, the rows as the
 * backend's batched draw takes them, the draw made now (on the backend
 * where it samples, else here over the thread pool) or launched without a
 * wait (overlapped steps, step_overlap.h), and the tokens applied. */
#include <stdlib.h>

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
 * sampler, so rows run on any thread. */
static void draw_rows(void *ctx, int64_t begin, int64_t end) {
    Scheduler *s = ctx;
    int vocab = s->e->model->cfg.vocab;
    for (int64_t i = begin; i < end; i++) {
        SchedRequest *r = s->draw_req[i];
        if (!r) continue;
        int32_t id = sampler_sample(&r->sampler, s->logits + (size_t)i * vocab, vocab);
        sampler_accept(&r->sampler, id);
        s->drawn[i] = id;
    }
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

/* The entry of a drawn token, from its row's logits (on the host: the
 * step's logits were copied here, build_rows). */
static int record_logprob(Scheduler *s, SchedRequest *r, int32_t id, const float *row) {
    TokenLogprob *e = token_logprobs_push(&r->lp);
    if (!e) return -1;
    logprobs_row(row, s->e->model->cfg.vocab, id, r->params.top_logprobs, e);
    return 0;
}

/* On the device where the backend samples, or here in parallel when the
 * scheduler has a thread pool; then the stop conditions, in row order. */
int sched_draw_now(Scheduler *s, int n, bool logits_here, Err *err) {
    Backend *be = s->e->be;
    sched_ready_draws(s, n);
    int rc = s->device_sampling && n > 0 ? draw_on_device(s, n, err) : 1;
    if (rc < 0) return -1;
    if (rc == 1 && !logits_here && n > 0 &&
        be->read(be, s->logits, s->e->fw.logits, (int64_t)n * s->e->model->cfg.vocab, err))
        return -1;
    if (rc == 1 && s->pool && n > 1) cpu_parallel_for(s->pool, n, draw_rows, s);
    else if (rc == 1) draw_rows(s, 0, n);
    for (int i = 0; i < n; i++) {
        SchedRequest *r = s->draw_req[i];
        if (r && r->params.logprobs && record_logprob(s, r, s->drawn[i], s->logits + (size_t)i * s->e->model->cfg.vocab)) {
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
    if (pack_draw_rows(s, n)) return 1;
    int rc = be->sample_launch(be, s->e->fw.logits, n, s->draw_rows, err);
    if (rc != 0) return rc;
    StepOverlap *ov = &s->ov;
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
    }
    return 0;
}
