/* tp.h — a tensor-parallel group: N ranks, a backend each, running every
 * step together (parallel/tp_plan.h says what each holds).
 *
 * The caller drives rank 0: its backend (be[0]) is the one the engine, or a
 * pipeline stage, runs its Forward on. Ranks 1..N-1 live here, a thread and
 * a Forward each; tp_ranks_run hands them the step (the same ids, batch and
 * block tables: one block manager serves every rank's cache, each holding
 * its own KV heads), runs rank 0's Forward on the caller's thread, and waits
 * for the others. The ranks meet in their backends' all_reduce and
 * all_gather, so the step's logits come out whole on rank 0.
 */
#ifndef CLLM_TP_H
#define CLLM_TP_H

#include <pthread.h>
#include <stdbool.h>

#include "kernels/backend.h"
#include "model/forward.h"
#include "parallel/placement.h"
#include "parallel/tp_plan.h"

typedef struct TpRanks TpRanks;

typedef struct {
    TpRanks *t;
    int rank;
} TpRankThread;

struct TpRanks {
    TpPlan plan;
    TpGroup *group;
    TpRankModel rm[TP_MAX];
    Backend *be[TP_MAX];         /* be[0]: the caller's to destroy; 1..n-1 these */
    Forward fw[TP_MAX];          /* ranks 1..n-1 */
    TpRankThread rt[TP_MAX];
    pthread_t thread[TP_MAX];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t steps;              /* steps handed to the threads */
    int n_done;
    ForwardStep step;
    bool failed[TP_MAX];
    Err err[TP_MAX];
    bool stopping, broken;
    float *x_host, *proj_host;   /* a stage after the first: rank 0's inputs, copied to the others */
    int dim, max_tokens;
    ForwardStep pending;              /* tp_stages: the step launched, not yet finished */
    bool has_pending;
    BackendLinks *links;         /* NCCL between the ranks' GPUs, or NULL: they exchange through host memory */
    char note[320];              /* GPU ranks through host memory: why, one line for the user ("" otherwise) */
};

/* Splits model (c, shape, w) over n ranks, makes each rank's backend
 * (o, with the group, the rank and its GPU set) and starts ranks 1..n-1 for
 * steps of up to max_tokens rows. where: each rank's GPU and the transport
 * (placement.h; NULL: every rank on o->device). GPU ranks talk over NCCL
 * where where->nccl and NCCL connects them, else through host memory (note
 * says why); with o->n_blocks <= 0 every rank's KV cache gets the blocks
 * the tightest rank's share of its GPU holds, so all hold the same. what
 * names the part split in messages ("the model", "stage 1"). */
int tp_ranks_open(TpRanks *t, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w, int n,
                  const BackendOptions *o, const TpPlacement *where, const char *what, Err *err);
/* One step on every rank; rank0 is rank 0's Forward (the caller's, on
 * be[0]); the others take its from_prev / to_next and, with from_prev, its
 * x and proj. A failed rank fails this step and every later one. */
int tp_ranks_run(TpRanks *t, Forward *rank0, const ForwardStep *s, Err *err);
/* rank 0's config (its heads and MLP columns): what its Forward is made with. */
const ModelConfig *tp_ranks_cfg(const TpRanks *t);
/* ForwardStages.launch of a group: the step held for finish (one in flight; a second is an error). */
int tp_hold_step(ForwardStep *pending, bool *has_pending, const int32_t *ids, const AttnBatch *b,
                 const int32_t *logit_rows, int n_logits, float *logits_out, Err *err);
/* ForwardStages.finish of a group: the step held (NULL with err when none is). */
const ForwardStep *tp_take_step(const ForwardStep *pending, bool *has_pending, Err *err);
/* The group alone as the engine's stages (no pipeline): one step in flight. */
ForwardStages tp_stages(TpRanks *t);
/* Stops the threads; frees ranks 1..n-1 (Forwards, backends), the slices, the NCCL links and the group. */
void tp_ranks_free(TpRanks *t);

#endif
