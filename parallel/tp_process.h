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
 */
#ifndef CLLM_TP_PROCESS_H
#define CLLM_TP_PROCESS_H

#include <stdbool.h>

#include "kernels/backend.h"
#include "model/forward.h"
#include "parallel/tp_link.h"
#include "parallel/tp_plan.h"

typedef struct {
    int rank, n;
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
    char note[320];              /* GPU ranks through host memory: why, one line for the user ("" otherwise) */
} TpProcess;

/* This process's rank (o: every backend's options; the device is this
 * rank's) of model (c, shape, w) split over n processes meeting at master. */
int tp_process_open(TpProcess *t, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w, int n,
                    int rank, const char *master, const BackendOptions *o, double timeout_s, Err *err);
/* The driver's steps as the engine's stages (one step in flight). */
ForwardStages tp_process_stages(TpProcess *t);
/* A rank server's loop over the driver's steps: 0 when told to stop. */
int tp_process_serve(TpProcess *t, int max_tokens, Err *err);
/* The driver tells the servers to stop; then everything is freed. */
void tp_process_close(TpProcess *t);

#endif
