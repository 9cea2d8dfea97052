/* scheduler_internal.h — what the scheduler's files share (scheduler.c:
 * queues, blocks, building steps; step_draw.c: a step's draws;
 * step_overlap.c: overlapped steps). Not for use outside engine/. */
#ifndef CLLM_SCHEDULER_INTERNAL_H
#define CLLM_SCHEDULER_INTERNAL_H

#include "engine/scheduler.h"

/* scheduler.c */
void sched_request_fail(Scheduler *s, SchedRequest *r, const char *msg);
/* Applies the stop conditions to a freshly drawn token (pushed onto the
 * reply), in generate_reply's order: the finish reason, or NULL to go on. */
const char *sched_accept_token(Scheduler *s, SchedRequest *r, int32_t id);
/* Ends a request for why (sched_accept_token's reason): its text flushed. */
void sched_request_end(Scheduler *s, SchedRequest *r, const char *why);
/* After rows of r were computed (or launched): indexes its full blocks of
 * known tokens in the prefix cache, gives back blocks behind the window. */
void sched_after_compute(Scheduler *s, SchedRequest *r);
/* The prepared step's rows count as computed (n_cached advanced). */
void sched_commit_rows(Scheduler *s);
/* Per-step statistics; seconds: of the step, forward: of it in the forward pass. */
void sched_step_stats(Scheduler *s, int rows, double seconds, double forward);

/* step_draw.c */
/* Which of the step's n logits rows draw (draw_req; a request that ended
 * since its row was built draws nothing), the prompt logprobs of the
 * others recorded (the logits are on the host then). */
void sched_select_draws(Scheduler *s, int n);
/* Draws every drawing row now (on the device where it samples, else here
 * from s->logits, which must hold the step's logits unless logits_here is
 * false: then they are read first) and applies the tokens. */
int sched_draw_now(Scheduler *s, int n, bool logits_here, Err *err);
/* Launches the draws on the backend (sample_launch) and puts a placeholder
 * token on each drawing request (step_overlap.h): 0, or 1 when the backend
 * declines (nothing launched), or -1. */
int sched_draw_launch(Scheduler *s, int n, Err *err);
/* Appends the logprobs entry of token id drawn from logits row; -1: out of memory. */
int sched_record_logprob(Scheduler *s, SchedRequest *r, int32_t id, const float *row);
/* Sets up each drawing request's sampler, ends the interrupted ones (their
 * rows then draw nothing). */
void sched_ready_draws(Scheduler *s, int n);

/* step_overlap.c */
/* One overlapped step (step_overlap.h): scheduler_step when s->async. */
int sched_overlap_step(Scheduler *s, Err *err);
/* Takes the launched draw and applies its tokens. */
int sched_overlap_take(Scheduler *s, Err *err);
/* Waits for a launched draw and drops its tokens (the scheduler is freed). */
void sched_overlap_drop(Scheduler *s);
/* r ends with a draw in flight: its placeholder and its row are dropped. */
void sched_overlap_forget(Scheduler *s, SchedRequest *r);

#endif
