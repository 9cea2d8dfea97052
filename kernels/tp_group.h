/* tp_group.h — the ranks of a tensor-parallel group inside one process.
 *
 * With `--tp N` each rank's backend holds a slice of every layer (its
 * attention heads, its share of the MLP's columns, its vocabulary range of
 * the LM head) and its partial sums meet in an all-reduce after attention
 * and after the MLP. The ranks run a step concurrently, a thread each, and
 * meet here: a rank publishes its buffer, waits for the others at a
 * barrier, sums a share of the elements over every rank's buffer and writes
 * the sum back to all of them, then waits again. The host form (this file)
 * serves backends whose buffers are host memory (the CPU backend); a GPU
 * backend would put its communicator (NCCL) in the group instead.
 *
 * Sums are in rank order, ((b0 + b1) + b2) + ..., whichever rank computes
 * them, so every rank gets the same bits and a run is deterministic.
 */
#ifndef CLLM_TP_GROUP_H
#define CLLM_TP_GROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

#ifdef __cplusplus
extern "C" { /* the CUDA backend's host transport calls these */
#endif

#define TP_GROUP_MAX 16

typedef struct TpGroup TpGroup;

TpGroup *tp_group_create(int n_ranks, Err *err);

/* A group whose other ranks run in other processes: this process holds one
 * rank, and every collective goes through the caller's link (kernels/ knows
 * no sockets: parallel/tp_link.h makes one over the rendezvous' connections).
 * The link sums in rank order as the host group does, so a rank's bits do
 * not depend on where the others run. A link op that fails (a peer gone or
 * silent past its deadline) breaks the group as tp_group_abort does; abort
 * lets the link tell the peers at once (NULL: they find out at their
 * deadline). */
typedef struct {
    void *ctx;
    int (*all_reduce_f32)(void *ctx, float *buf, int64_t n);
    int (*all_gather_f32)(void *ctx, float *dst, const float *src, int64_t rows, int64_t cols);
    void (*abort)(void *ctx);
} TpGroupLink;
TpGroup *tp_group_create_linked(int n_ranks, const TpGroupLink *link, Err *err);
void tp_group_free(TpGroup *g);
int tp_group_size(const TpGroup *g);
/* A rank that cannot go on (its step failed before the ops) breaks the
 * group: the others' waits return at once, their reduces do nothing, and
 * tp_group_broken says so from then on (the step's result is unusable). */
void tp_group_abort(TpGroup *g);
bool tp_group_broken(const TpGroup *g);

/* Every rank calls each with its own buf and the same n, in the same
 * order (a linked group: its one rank, whatever rank says). all_reduce: buf[i] = sum over ranks of buf[i] (fp32, rank order),
 * on every rank. all_gather: dst [rows][sum of cols] gets each rank's src
 * [rows][cols of that rank] side by side in rank order, on every rank. */
void tp_group_all_reduce_f32(TpGroup *g, int rank, float *buf, int64_t n);
void tp_group_all_gather_f32(TpGroup *g, int rank, float *dst, const float *src, int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif

#endif
