/* scheduler.h — continuous batching: many requests share each forward step.
 *
 * Requests wait in a queue, then run. Every step builds ONE batch under a
 * token budget (max_batched_tokens rows) and a sequence limit (max_seqs):
 *   1. one row for every running request that is decoding,
 *   2. prefill chunks of running requests whose prompt is partly computed,
 *   3. prefill chunks of waiting requests, admitted in order while blocks,
 *      budget and sequence slots last (chunked prefill: a long prompt takes
 *      several steps and never stalls the decodes of the others).
 * One forward runs the mixed rows; each request whose rows reach the end of
 * its tokens gets logits and samples its next token with its own Sampler
 * (own seed and penalty window) and stop conditions, exactly as
 * generate_reply does for one sequence. A finished request leaves at once
 * (its blocks are released) and waits in the finished list for the caller.
 *
 * KV blocks come from a BlockManager over the engine's pool. A waiting
 * request first takes the full blocks of its prompt that the prefix cache
 * holds (a shared system prompt is computed once). Blocks are indexed after
 * the step that computes them, so a request whose next prompt block is being
 * computed by a running request waits (passed over, the requests behind it
 * admitted) until that block is cached: prompts sharing a prefix submitted
 * together compute it once, the first of them, and the others share its
 * blocks (what cascade attention needs: kernels/attn_cascade.h). When a running request
 * needs a block and none is left, the newest running request is preempted:
 * its blocks are released (full ones stay in the prefix cache) and it goes
 * back to the head of the queue to recompute its tokens later; its sampler
 * state is kept, so greedy outputs equal those of an uninterrupted run.
 * Priority is submission order: the oldest request is never preempted for a
 * newer one, so every request finishes.
 *
 * Models whose every layer has a sliding window give back the blocks wholly
 * behind the window as a sequence grows.
 *
 * Log-probabilities (GenParams.logprobs, prompt_logprobs; engine/logprobs.h):
 * a step where a request wants them brings the step's logits to the host
 * (the host-sampling copy; on a backend that samples, the draw still happens
 * there), and the entries are computed there, so other steps pay nothing. A
 * request scoring its prompt gets a logits row for each prompt row: its
 * chunks are held to the logits rows a step has (max_seqs), and it takes
 * nothing from the prefix cache until its prompt is scored.
 */
#ifndef CLLM_SCHEDULER_H
#define CLLM_SCHEDULER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/block_manager.h"
#include "engine/engine.h"
#include "engine/logprobs.h"
#include "engine/request.h"
#include "engine/step_overlap.h"
#include "engine/stop.h"

typedef struct {
    int max_seqs;             /* sequences per step; <= 0: from the KV cache (engine_auto_max_seqs) */
    int max_batched_tokens;   /* rows per step; <= 0: engine_auto_max_batched_tokens; at most the engine's max_chunk */
    bool no_prefix_cache;     /* turn prefix caching off */
    int sample_threads;       /* threads drawing the tokens of a step; <= 0: one per core, 1: none */
    bool host_sampling;       /* draw on the host even where the backend samples (its logits copied here) */
    bool sync_steps;          /* each step completes before the next is built (as CLLM_ASYNC_STEPS=off) */
} SchedOptions;

/* Penalty-window entries a step's rows may hand the backend's sampler, per
 * row on average (beyond: that step is drawn on the host). */
#define SCHED_DRAW_PEN 256

typedef enum { REQ_WAITING, REQ_RUNNING, REQ_FINISHED } ReqState;

typedef struct SchedRequest {
    void *user;                   /* the caller's tag */
    GenParams params;             /* stop strings borrowed until the request is freed */
    GenEmit emit;                 /* optional: streams the text as it becomes final */
    void *emit_ctx;
    volatile sig_atomic_t *interrupt; /* optional: nonzero ends the reply ("interrupted") */
    uint64_t order;               /* submission number: priority (lower first) */
    ReqState state;
    TokenIds tokens;              /* the prompt, then every generated token */
    int n_prompt;
    int n_cached;                 /* tokens[0..n_cached) have K/V in the cache */
    BlockTable bt;                /* blocks in position order */
    int n_dropped;                /* leading entries given back behind the window (stale ids) */
    int n_chained;                /* leading full blocks the prefix-cache chain covers */
    BlockChain chain;
    bool sampler_ready;
    Sampler sampler;
    StopMatcher sm;
    Detok dt;
    TextBuf text;                 /* the reply text */
    int n_generated;
    int n_pending;                /* tokens at the end of `tokens` drawn by a step in flight, not yet taken
                                     (placeholders, -1; 0 or 1: engine/step_overlap.h) */
    int pending_row;              /* that draw's row in the launch */
    TokenLogprobs lp;             /* params.logprobs: one entry per generated token, in order */
    TokenLogprob *prompt_lp;      /* params.prompt_logprobs: [n_prompt]; entry 0 has logprob NAN */
    int n_prompt_lp;              /* prompt_lp[0..n_prompt_lp) are filled */
    int cached_tokens;            /* prompt tokens found in the prefix cache (last admission) */
    int n_preempted;
    const char *finish_reason;    /* "stop", "length", "context", "interrupted", "error" */
    char error[1024];             /* when finish_reason is "error" */
    double t_submit, t_first, t_done;
} SchedRequest;

/* What one step did, and where the scheduler stands after it. */
typedef struct {
    int n_seqs, n_tokens;         /* sequences and rows in the batch */
    int n_decode, n_prefill;      /* decode rows, prefill rows */
    int n_draws;                  /* rows that drew a token (overlapped steps: launched a draw) */
    int n_running, n_waiting, n_finished; /* after the step; finished = not yet popped */
    int blocks_used, blocks_cached, blocks_total;
    int64_t preemptions;          /* ever */
    int64_t prefix_hit_tokens;    /* ever: prompt tokens taken from the prefix cache */
    int64_t tokens_generated;     /* ever */
    int64_t overlapped;           /* ever: steps launched before the previous step's tokens were taken */
    double seconds;               /* of this step */
    double forward_seconds;       /* of it in the forward pass (host metadata, kernels, the wait for them) */
    double sample_seconds;        /* of it drawing tokens (device or host) */
    double own_seconds;           /* of it in the scheduler's own work (preparing, accepting) */
    double busy_seconds, scheduler_seconds; /* ever: steps, and their time outside forward and sampling */
} SchedStats;

typedef struct {
    Engine *e;
    BlockManager *bm;             /* bm_own, or one shared with other schedulers (virtual engines) */
    BlockManager bm_own;
    SchedOptions o;
    int window;                   /* > 0: every layer is windowed; the widest window */
    SchedRequest **waiting, **running, **finished, **sel; /* queues, sorted by order */
    int n_waiting, n_running, n_finished, cap_queue;
    int *sel_chunk;               /* [max_seqs] rows this step gives each selected request */
    int *sel_logits;              /* [max_seqs] logits rows each selected request takes (at least 1) */
    int n_sel_logits;             /* their sum: at most max_seqs (the logits buffer's rows) */
    int n_sel;
    int32_t *ids, *pos, *seq, *logit_rows; /* [max_batched_tokens] step rows */
    int64_t *slot;
    const int32_t **tables;       /* [max_seqs] */
    float *logits;                /* [max_seqs][vocab] */
    SchedRequest **logit_req;     /* [max_seqs] the request of each logits row */
    int32_t *logit_pos;           /* [max_seqs] the position of each logits row's token */
    bool step_host_logits;        /* a prompt row of this step is scored: its logits come to the host */
    bool step_logprobs;           /* a request of this step wants logprobs (stepping synchronously: its
                                     logits come to the host; overlapped: kept by the backend's draw) */
    bool step_logits_here;        /* the prepared step's logits are copied to `logits` (else they stay on the backend) */
    SchedRequest **draw_req;      /* [max_seqs] the request of each logits row (NULL: no draw) */
    int32_t *drawn;               /* [max_seqs] the token drawn for each row */
    bool device_sampling;         /* the backend draws; logits stay in its memory */
    SampleRow *draw_rows;         /* [max_seqs] each row's draw for the backend (idle: rows not drawn) */
    bool *draw_used;              /* [max_seqs] whether the backend's draw used the row's uniform */
    int32_t *draw_pen;            /* [2][SCHED_DRAW_PEN * max_seqs] the rows' penalty windows: ids, then counts */
    Sampler idle;                 /* greedy; stands in for rows that do not draw */
    struct ThreadPool *pool;      /* samples requests in parallel; NULL: on the caller */
    uint64_t next_order;
    uint64_t *order_counter;      /* next_order, or one shared with the other virtual engines */
    uint64_t peers_oldest;        /* the oldest running request of the other virtual engines (UINT64_MAX: none) */
    int step_rows, step_logits;   /* the step prepared and not yet completed */
    double t_prepare;             /* when it was prepared */
    bool async;                   /* steps overlap (step_overlap.h); else each completes before the next */
    StepOverlap ov;               /* the draw in flight and the feeds of the step being built */
    SchedStats stats;
} Scheduler;

/* The rows of a prepared step, for the forward pass: pointers into the
 * scheduler's arrays, valid until the step is completed. */
typedef struct {
    const int32_t *ids;
    AttnBatch b;
    const int32_t *logit_rows;
    int n_logits;
    float *logits_out;            /* where forward_run copies the logits; NULL: they stay on the device */
} SchedBatch;

int scheduler_init(Scheduler *s, Engine *e, const SchedOptions *o, Err *err);
/* Before any submission: draw blocks from bm and submission numbers from
 * *order_counter, both shared with other schedulers over the same engine
 * pool (virtual engines: one pool for all of them). */
void scheduler_share(Scheduler *s, BlockManager *bm, uint64_t *order_counter);
/* Frees every request still queued (finished ones too). */
void scheduler_free(Scheduler *s);

/* Queues a request for prompt[0..n) (copied). NULL with err when it can never
 * run: empty, as long as the context, more blocks than the cache holds, or
 * out of memory. */
SchedRequest *scheduler_submit(Scheduler *s, const int32_t *prompt, int n, const GenParams *p, void *user,
                               Err *err);
/* Runs one step (nothing when idle). -1 with err only when the forward pass
 * fails: the scheduler cannot go on. The same as scheduler_prepare, the
 * engine's forward pass of the batch, scheduler_complete; with s->async, a
 * step overlapped with the next (step_overlap.h): it launches a step and
 * completes the one launched by the call before (stats: the one launched). */
int scheduler_step(Scheduler *s, Err *err);
/* Turns overlapped steps off (before the first step): the caller drives
 * the steps with prepare and complete. */
void scheduler_sync_steps(Scheduler *s);
/* Builds the next step (its blocks reserved) into *b; returns its rows, 0
 * when there is nothing to run now. With prepare and complete called by the
 * caller, the steps are synchronous (each completed before the next). */
int scheduler_prepare(Scheduler *s, SchedBatch *b);
/* After the forward pass of the prepared step (the logits in the engine's
 * last Forward, or copied to b->logits_out): accepts its rows, samples and
 * applies the stop conditions. -1 with err when sampling fails. */
int scheduler_complete(Scheduler *s, Err *err);
/* No request waiting or running. */
static inline bool scheduler_idle(const Scheduler *s) { return s->n_waiting == 0 && s->n_running == 0; }
/* Requests queued, running or finished and not yet popped. */
static inline int scheduler_pending(const Scheduler *s) { return s->n_waiting + s->n_running + s->n_finished; }
/* The oldest finished request not yet returned, or NULL; the caller frees it. */
SchedRequest *scheduler_pop_finished(Scheduler *s);
void sched_request_free(SchedRequest *r);

#endif
