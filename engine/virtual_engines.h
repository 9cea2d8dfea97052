/* virtual_engines.h — the schedulers that keep every pipeline stage busy.
 *
 * With a pipeline of N stages, one step at a time would leave N - 1 GPUs
 * idle. Virtual engines are N groups of requests, each with its own
 * scheduler (queues, block tables, samplers): while stage s runs a step of
 * one engine, stage s - 1 runs the next engine's, so once the pipeline
 * fills there is one step of every engine in flight. An engine prepares its
 * next step as soon as its last one comes out of the last stage (its new
 * tokens are known then).
 *
 * Every engine draws its blocks from ONE BlockManager over the engine
 * pool: block ids mean the same on every stage, so each stage's KV cache is
 * one pool shared by all engines, and an engine with more work takes more
 * of it instead of starving inside a fixed slice. Sharing is safe because
 * every stage runs the steps in launch order: a block freed (or put in the
 * prefix cache) by one engine's step is reused only by a step launched
 * after it. The oldest request anywhere is never preempted for another
 * engine's (scheduler.h), so every request finishes.
 *
 * A new request goes to the engine with the fewest requests pending. With
 * one stage (or no pipeline) there is one engine and a step is exactly
 * scheduler_step.
 */
#ifndef CLLM_VIRTUAL_ENGINES_H
#define CLLM_VIRTUAL_ENGINES_H

#include "engine/scheduler.h"

typedef struct {
    Engine *e;
    int n;                        /* virtual engines */
    Scheduler ve[FORWARD_MAX_STAGES];
    BlockManager bm;              /* shared by all of them (n > 1) */
    uint64_t next_order;          /* submission numbers across all of them */
    bool in_flight[FORWARD_MAX_STAGES];
    SchedBatch batch[FORWARD_MAX_STAGES];  /* without a pipeline: the prepared step, run when it is completed */
    int fifo[FORWARD_MAX_STAGES], fifo_head, n_fifo; /* engines with a step in flight, oldest first */
    int last;                     /* the engine whose step completed last (its stats are the step's) */
    int next_prepare;             /* round robin start of the next prepare */
    double busy_seconds;          /* wall time inside vengines_step */
    SchedStats stats;             /* the last completed step's, with the counts and totals of all engines */
} VirtualEngines;

/* n_ve: the engine's pipeline stages (1 without one; <= 0 picks that). */
int vengines_init(VirtualEngines *g, Engine *e, const SchedOptions *o, int n_ve, Err *err);
void vengines_free(VirtualEngines *g);

/* scheduler_submit on the engine with the fewest requests pending. */
SchedRequest *vengines_submit(VirtualEngines *g, const int32_t *prompt, int n, const GenParams *p, void *user,
                              Err *err);
/* Launches a step of every engine that has none in flight and work to do,
 * then completes the oldest step in flight (nothing when idle). -1 with err
 * when a forward pass fails. */
int vengines_step(VirtualEngines *g, Err *err);
/* The oldest finished request of any engine, or NULL; the caller frees it. */
SchedRequest *vengines_pop_finished(VirtualEngines *g);
int vengines_pending(const VirtualEngines *g);
/* Blocks held by the requests of engine k (shared prefix blocks counted once per holder). */
int vengines_blocks_held(const VirtualEngines *g, int k);

#endif
