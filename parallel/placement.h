/* placement.h — where the backends of `--pp P --tp N` run, and how a
 * tensor-parallel group's ranks exchange their partial sums.
 *
 * There are P x N backends, made stage by stage, rank by rank: rank r of
 * stage s runs on GPU dev[s * N + r], from the --gpus list (one entry per
 * backend in that order; a GPU may be named more than once: its backends
 * then share it, each taking a share of its memory) or 0, 1, ... A group
 * whose ranks are on GPUs of their own (no other backend of the run on
 * them) talks over NCCL; a group with a shared GPU exchanges through host
 * memory instead: slower, the same values, and what lets `--tp 2 --gpus
 * 0,0` run a group on one GPU.
 */
#ifndef CLLM_PLACEMENT_H
#define CLLM_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "parallel/stage_plan.h"
#include "parallel/tp_plan.h"

#define PLACEMENT_MAX (STAGE_MAX * TP_MAX)

/* The GPU of every backend of `stages` stages of `tp` ranks (tp 1: a
 * pipeline's stages) into dev[stages * tp]: the --gpus list gpus, or NULL:
 * 0, 1, ... n_gpus: the GPUs this machine has (0: the CPU; only the list's
 * form is checked). A GPU the list names must be one of them, and without
 * a list a tensor-parallel run needs a GPU per backend (a pipeline alone
 * keeps 0, 1, ...: its stage says which GPU is missing). -1 with err naming
 * the option and what to do. */
int placement_devices(const char *gpus, int stages, int tp, int n_gpus, int *dev, Err *err);

/* One process per backend (--world-size): the GPU of this process, rank
 * `rank` of `stages` stages of `tp` ranks: its --gpus entry, else the
 * launcher's local rank (several hosts), else the rank (one host); -1 with
 * err for a bad list. */
int placement_own_device(const char *gpus, int stages, int tp, int rank, Err *err);

/* A tensor-parallel group as placed: what tp_ranks_open needs to know. */
typedef struct {
    int devices[TP_MAX];    /* rank r's GPU (< 0: a CPU backend) */
    int gpu_share[TP_MAX];  /* backends still to be made on that GPU, rank r's group included
                               (BackendOptions.gpu_share: the KV cache takes that share) */
    bool nccl;              /* on GPUs of their own: NCCL (if it loads) */
    char why[200];          /* else, for GPU ranks, a line saying why the host transport ("" for CPU ranks) */
    double timeout_s;       /* NCCL: a peer silent this long fails the step (CLLM_PP_TIMEOUT) */
} TpPlacement;

/* The group of backends dev[first .. first + n) of a run of n_all (dev as
 * placement_devices made it; the backends before `first` exist already). */
void placement_group(const int *dev, int n_all, int first, int n, TpPlacement *p);

/* Every rank on GPU device (< 0: the CPU), as a test places a group. */
void placement_same(int device, int n, TpPlacement *p);

#endif
