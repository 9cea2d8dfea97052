/* tp_link.h — a tensor-parallel group's collectives between processes, over
 * the connections parallel/rendezvous.c leaves open (`--tp N` as N
 * processes: one rank each).
 *
 * Rank 0 is the hub: fds[r] reaches rank r; a rank r > 0 has fds[0] only.
 * For an all-reduce every other rank sends its buffer to rank 0, which sums
 * element i as ((b0 + b1) + b2) + ... in fp32, the host group's formula
 * (kernels/tp_group.c), so the result has the bits of a one-process group,
 * and sends the sum back; an all-gather lays the ranks' columns side by
 * side on rank 0 and sends the rows back. Each op starts with its counts,
 * checked on rank 0, so ranks that disagree fail instead of misreading. A
 * peer that closes its connection, or is silent for timeout_s, fails the op
 * with an error naming it (the group then breaks: no hang); tp_group_abort
 * shuts the connections, so the peers learn it at once.
 */
#ifndef CLLM_TP_LINK_H
#define CLLM_TP_LINK_H

#include "base/err.h"
#include "kernels/tp_group.h"

typedef struct TpLink TpLink;

/* Rank `rank` of n_ranks over fds (borrowed: they stay the caller's). */
TpLink *tp_link_open(int rank, int n_ranks, const int *fds, double timeout_s, Err *err);
/* Peers named "stage S's tensor-parallel rank R" (a pipeline stage's group
 * of processes); stage < 0: "tensor-parallel rank R". */
void tp_link_name_stage(TpLink *l, int stage);
/* The ops for tp_group_create_linked. */
TpGroupLink tp_link_ops(TpLink *l);
/* The first failure, one line ("" while none). */
const char *tp_link_error(const TpLink *l);
void tp_link_free(TpLink *l);

#endif
