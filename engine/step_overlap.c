/* step_overlap.c — overlapped steps (see step_overlap.h): the step loop that
 * launches step t+1 before it takes step t's tokens, and the draw in flight. */
#include "engine/step_overlap.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/scheduler_internal.h"

int step_overlap_init(StepOverlap *ov, int max_seqs, Err *err) {
    memset(ov, 0, sizeof *ov);
    size_t S = (size_t)max_seqs;
    ov->req = calloc(S, sizeof *ov->req);
    ov->tokens = malloc(S * sizeof *ov->tokens);
    ov->drew = malloc(S * sizeof *ov->drew);
    ov->keep = malloc(S * sizeof *ov->keep);
    ov->feed_rows = malloc(S * sizeof *ov->feed_rows);
    ov->feed_src = malloc(S * sizeof *ov->feed_src);
    if (!ov->req || !ov->tokens || !ov->drew || !ov->keep || !ov->feed_rows || !ov->feed_src) {
        step_overlap_free(ov);
        return err_set(err, "scheduler: out of memory for overlapped steps of %d sequences", max_seqs);
    }
    return 0;
}

void step_overlap_free(StepOverlap *ov) {
    free(ov->req);
    free(ov->tokens);
    free(ov->drew);
    free(ov->keep);
    free(ov->feed_rows);
    free(ov->feed_src);
    memset(ov, 0, sizeof *ov);
}

int step_overlap_knob(const char *value, bool *on, Err *err) {
    *on = true;
    if (!value || !*value || !strcmp(value, "on")) return 0;
    if (!strcmp(value, "off")) { *on = false; return 0; }
    return err_set(err, "CLLM_ASYNC_STEPS '%s': on or off", value);
}

/* Each drawing row's token replaces its request's placeholder and is
 * applied as a synchronous draw's would be: the generator advances where
 * the draw used it, the penalty window takes the token, its logprobs entry
 * (from the kept logits, in s->logits), then the stop conditions. A request
 * that goes on has its blocks indexed now that the token is known. */
int sched_overlap_take(Scheduler *s, Err *err) {
    StepOverlap *ov = &s->ov;
    Backend *be = s->e->be;
    size_t V = (size_t)s->e->model->cfg.vocab;
    ov->pending = false;
    if (be->sample_result(be, ov->tokens, ov->drew, ov->kept ? s->logits : NULL, ov->n, err)) return -1;
    for (int i = 0; i < ov->n; i++) {
        SchedRequest *r = ov->req[i];
        if (!r) continue;
        ov->req[i] = NULL;
        r->tokens.n -= r->n_pending;
        r->n_pending = 0;
        int32_t id = ov->tokens[i];
        if (ov->drew[i]) sampler_uniform_skip(&r->sampler);
        sampler_accept(&r->sampler, id);
        if (r->params.logprobs && sched_record_logprob(s, r, id, s->logits + i * V)) {
            sched_request_fail(s, r, "out of memory");
            continue;
        }
        const char *why = sched_accept_token(s, r, id);
        if (why) sched_request_end(s, r, why);
        else if (r->state == REQ_RUNNING) sched_after_compute(s, r);
    }
    return 0;
}

void sched_overlap_drop(Scheduler *s) {
    StepOverlap *ov = &s->ov;
    if (!ov->pending) return;
    Err err = {{0}};
    ov->pending = false;
    (void)s->e->be->sample_result(s->e->be, ov->tokens, ov->drew, NULL, ov->n, &err); /* its error ends nothing now */
    for (int i = 0; i < ov->n; i++) ov->req[i] = NULL;
}

void sched_overlap_forget(Scheduler *s, SchedRequest *r) {
    StepOverlap *ov = &s->ov;
    if (r->pending_row >= 0 && r->pending_row < ov->n && ov->req[r->pending_row] == r) ov->req[r->pending_row] = NULL;
    r->tokens.n -= r->n_pending;
    r->n_pending = 0;
}

int sched_overlap_step(Scheduler *s, Err *err) {
    double t0 = now_seconds();
    Forward *fw = &s->e->fw;
    SchedBatch b;
    int rows = scheduler_prepare(s, &b), n = s->step_logits; /* prepare counts its own time */
    double t_fw = now_seconds(), wait = 0;
    if (rows > 0) {
        StepFeed feed = {s->ov.feed_rows, s->ov.feed_src, s->ov.n_feed};
        if (forward_launch_fed(fw, b.ids, &b.b, b.logit_rows, n, &feed, err)) return -1;
        if (s->ov.pending) s->stats.overlapped++;
        sched_commit_rows(s); /* later steps run after this one on the backend */
    }
    double t_take = now_seconds();
    if (s->ov.pending && sched_overlap_take(s, err)) return -1;
    if (rows > 0) {
        /* prompt logprobs: the step's logits come here, and it completes now */
        double t_wait = now_seconds();
        if (b.logits_out && forward_wait(fw, n, b.logits_out, err)) return -1;
        wait = now_seconds() - t_wait;
        sched_select_draws(s, n);
        sched_ready_draws(s, n);
        int rc = b.logits_out || n == 0 ? 1 : sched_draw_launch(s, n, err);
        if (rc < 0 || (rc == 1 && sched_draw_now(s, n, b.logits_out != NULL, err))) return -1;
    }
    double t_end = now_seconds();
    s->stats.sample_seconds = t_end - t_take - wait; /* taking the last draw, launching this one */
    sched_step_stats(s, rows, t_end - t0, t_take - t_fw + wait);
    s->step_rows = s->step_logits = 0;
    return 0;
}
