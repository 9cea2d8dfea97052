/* tp_process.h — `--tp N --world-size N`: a tensor-parallel group whose
 * ranks are processes (one per GPU, e.g. under mpirun), not threads.
 *
 * Every process loads the model and builds its own rank's slice and
 * backend; the ranks meet in their collectives through parallel/tp_link.c
 * over the connections the rendezvous leaves open (rank 0 listens at
 * --master). Rank 0 drives: the engine runs on its backend, and each step
 * goes first to ranks 1..N-1 (step_msg.h: ids, batch, block tables, then
 * the logit rows, which every rank's LM-head slice computes), then through
 * rank 0's own Forward. A rank server says hello (its KV blocks and block
 * size), then runs the steps it is sent until told to stop. A rank that
 * fails or dies breaks the group: the others' collectives fail naming it
 * (at once for a closed connection, else at the deadline), never hang.
 * GPU ranks sum over NCCL when rank 0 can make an id (it travels in the
 * rendezvous, every rank joins with ncclCommInitRank; the sums are the
 * rank-order ones of the host transport, --tp-nccl-sum NCCL's own), else
 * through host memory and the link, as CPU ranks do (note says why).
 *
 * With `--pp P --tp N --world-size P*N` each pipeline stage is such a group
 * (parallel/process_grid.h says who is who): the group splits the stage's
 * slice, its rank 0 (the stage's hub) takes the steps from the pipeline's
 * driver (or is the driver, for the last stage) and hands each to its ranks
 * as above, with the hidden state (x, proj) the stage received from the
 * one before: every rank of a group holds the same x after its reduces, so
 * the hub alone passes it on.
 */
#ifndef CLLM_TP_PROCESS_H
#define CLLM_TP_PROCESS_H

#include <stdbool.h>

#include "kernels/backend.h"
#include "model/forward.h"
#include "parallel/placement.h"
#include "parallel/tp_link.h"
#include "parallel/tp_plan.h"

/* Where a process's rank sits. */
typedef struct {
    int n, rank;                 /* the group's ranks, this process's */
    int stage, n_stages;         /* the pipeline stage the group runs (0 of 1: the whole model) */
    const char *master;          /* ADDR:PORT where the group's rank 0 listens */
    double timeout_s;            /* a peer silent this long fails the op (CLLM_PP_TIMEOUT) */
    const TpPlacement *where;    /* the group as --gpus places it (placement_group, as `cllm info` shows it): GPU
                                    ranks sharing a GPU exchange through host memory; NULL: a GPU each */
} TpProcessAt;

typedef struct {
    int rank, n;
    int stage, n_stages;         /* as TpProcessAt */
    int fds[TP_MAX];             /* rank 0: fds[r] to rank r; another rank: fds[0] */
    double timeout_s;
    TpPlan plan;
    TpRankModel rm;              /* this process's slice */
    TpLink *link;                /* the collectives through host memory and the sockets ... */
    BackendLinks *nccl;          /* ... or, GPU ranks where rank 0 could make an NCCL id, NCCL (ncclCommInitRank) */
    TpGroup *group;
    Backend *be;                 /* this rank's; the driver's is the engine's (tp_process_close destroys it) */
    int kv_blocks;               /* the driver: the fewest KV blocks of any rank (what the engine may use) */
    ForwardStep pending;         /* the driver: the step launched, not yet finished */
    bool has_pending, broken;
    void *msg;                   /* encoded steps (the driver) or received ones (a server) */
    size_t cap;
    void *hidden;                /* a stage after the first: x or proj of a step on the host (sent or received) */
    size_t hidden_cap;
    char hub[80];                /* rank 0 as its ranks name it */
    char note[512];              /* GPU ranks through host memory: why, one line for the user ("" otherwise) */
} TpProcess;

/* This process's rank (o: every backend's options; the device is this
 * rank's) of model (c, shape, w: a pipeline stage's slice with
 * at->n_stages > 1) split over at->n processes meeting at at->master. */
int tp_process_open(TpProcess *t, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                    const TpProcessAt *at, const BackendOptions *o, Err *err);
/* Rank 0: one step on every rank, fw rank 0's Forward (with from_prev, its
 * x and proj go to the others first). A failure breaks the group for good. */
int tp_process_run(TpProcess *t, Forward *fw, const ForwardStep *s, Err *err);
/* The driver's steps as the engine's stages (one step in flight; no pipeline). */
ForwardStages tp_process_stages(TpProcess *t);
/* A rank server's loop over the driver's steps: 0 when told to stop. */
int tp_process_serve(TpProcess *t, int max_tokens, Err *err);
/* The driver tells the servers to stop; then everything is freed. */
void tp_process_close(TpProcess *t);

#endif
