/* pipeline.h — a model run as a chain of pipeline stages, one backend each.
 *
 * The engine owns the last stage (its backend samples and its Forward holds
 * the logits); the stages before it live here, each on a thread of its own.
 * A step goes in at stage 0 (pipeline_launch) and comes out at the last
 * (pipeline_finish, on the caller's thread); on its way every stage runs its
 * layers, then passes the residual stream x (fp32) and the pending sublayer
 * output proj of the step's rows to the next stage: over the backends' own
 * link (NCCL send/recv on each GPU's stream) where both have one, else
 * through host memory (read, then write). Up to STAGE_MAX steps may be in
 * flight, so with one step per virtual engine every stage is busy once the
 * pipeline fills; every stage runs the steps in launch order, which is what
 * lets steps of different virtual engines share one KV block pool.
 *
 * Use: pipeline_slice (the stages' model slices), make a backend for each
 * slice into be[s], pipeline_start, engine_init_pipeline.
 */
#ifndef CLLM_PIPELINE_H
#define CLLM_PIPELINE_H

#include <pthread.h>
#include <stdbool.h>

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/stage.h"
#include "parallel/stage_plan.h"
#include "parallel/tp.h"
#include "parallel/tp_process.h"

/* One step on its way through the stages: the caller's arrays, untouched
 * until the step is finished. */
typedef struct {
    ForwardStep step;
    int slot;                     /* host hand-over buffers of the step */
    bool failed;                  /* a stage before failed: the rest skip it */
} StageJob;

/* The steps waiting for one stage, oldest first. */
typedef struct {
    StageJob job[STAGE_MAX];
    int head, n;
    bool stopping;                /* the pipeline is stopping: a pop with nothing queued returns */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} JobQueue;

typedef struct Pipeline Pipeline;

typedef struct {
    Pipeline *p;
    int stage;
} StageThread;

struct Pipeline {
    StagePlan plan;
    StageModel sm[STAGE_MAX];     /* every stage's slice, the last included */
    Backend *be[STAGE_MAX];       /* every stage's backend; the caller makes them after pipeline_slice */
    TpRanks *tp[STAGE_MAX];       /* --tp: each stage a tensor-parallel group, be[s] its rank 0 (else NULL) */
    Forward fw[STAGE_MAX];        /* stages 0 .. n-2 (the last stage's Forward is the engine's) */
    int dim, max_tokens;
    JobQueue q[STAGE_MAX];        /* q[s]: steps for stage s; q[n-1]: finished by the caller */
    float *x_host[STAGE_MAX][STAGE_MAX], *proj_host[STAGE_MAX][STAGE_MAX]; /* [boundary][slot] host hand-over */
    StageThread st[STAGE_MAX];
    pthread_t thread[STAGE_MAX];
    int n_threads;
    int in_flight, next_slot;
    /* multi-process (pipeline_set_remote): this process runs the last stage
     * and drives stages 0..n-2 in other processes over peer_fd */
    bool remote;
    int peer_fd[STAGE_MAX];
    int remote_kv_blocks[STAGE_MAX];
    double peer_timeout;
    void *msg;                    /* the encoded step */
    size_t msg_cap;
    pthread_mutex_t err_mu;
    bool failed;
    Err err;                      /* the first error of a stage thread */
    BackendLinks *links;          /* the backends' links (pipeline_open), or NULL: host hand-over */
    bool concurrent;              /* the backends were made a thread each (GPUs of their own): freed so too */
    double made_s;                /* seconds their making took (pipeline_make_backends) */
    TpProcess *tpp;               /* --pp P --tp N as processes: this process's rank of its stage's group (it
                                     owns be[its stage]); NULL otherwise */
    bool serving;                 /* one process per stage, not the driver: this one serves serve_stage */
    int serve_fd, serve_stage, serve_chunk;
};

/* The slices of plan's stages (plan has at least 2). */
int pipeline_slice(Pipeline *p, const Model *m, const StagePlan *plan, Err *err);
/* Before pipeline_start: stages 0..n-2 run in other processes (parallel/
 * stage_server.h), reached over fds[s]; only be[n-1] is set here. Reads
 * each one's hello (its KV blocks and block size). */
int pipeline_set_remote(Pipeline *p, const int *fds, double timeout_s, Err *err);
/* After be[] is set: the Forwards of the stages before the last, host
 * hand-over buffers where two neighbours have no link, and the stage
 * threads, for steps of up to max_tokens rows. */
int pipeline_start(Pipeline *p, int max_tokens, Err *err);
/* Sends a step into stage 0 and returns (at most STAGE_MAX in flight);
 * arguments as forward_run's, kept by pointer until pipeline_finish. */
int pipeline_launch(Pipeline *p, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                    float *logits_out, Err *err);
/* Waits for the oldest step launched to leave the stages before the last,
 * then runs it on last (the last stage's Forward, from_prev set). */
int pipeline_finish(Pipeline *p, Forward *last, Err *err);
/* The config stage s's Forward runs with: its slice's, or with --tp its rank 0's. */
const ModelConfig *pipeline_stage_cfg(const Pipeline *p, int s);
/* Fewest KV blocks of any stage's backend (the engine's pool). */
int pipeline_kv_blocks(const Pipeline *p);
/* The stages before the last, as the engine drives them. */
ForwardStages pipeline_stages(Pipeline *p);
/* Stops the threads; frees the Forwards, the tensor-parallel groups and
 * every stage's backend, the last included (free the engine that runs on it
 * first), except one a TpProcess owns; with concurrent, a thread per stage
 * (each stage's group, Forward and backend in that order). The links stay
 * (pipeline_close closes them after). */
void pipeline_free(Pipeline *p);

#endif
