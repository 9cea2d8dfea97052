/* nccl_link.cuh — what the CUDA backend calls of nccl_link.cu. */
#ifndef CLLM_NCCL_LINK_CUH
#define CLLM_NCCL_LINK_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/nccl_link.h"
#include "kernels/cuda/tp_peer_sum.cuh"

/* n values (fp32, or bf16) to / from rank peer, on stream: enqueued, not waited for. */
int nccl_link_send(NcclGroup *g, int rank, const void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err);
int nccl_link_recv(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err);
/* Waits for stream s of rank's GPU; past the group's deadline (or on an
 * NCCL error) aborts the communicator and fails. */
int nccl_link_wait(NcclGroup *g, int rank, cudaStream_t s, Err *err);

/* A communicator a stream's work may wait on: rank's of group g, named
 * `who` in messages ("tensor-parallel rank 1"). */
typedef struct {
    NcclGroup *g;
    int rank;
    const char *who;
} NcclWatch;
/* nccl_link_wait over several groups (a pipeline stage that is also a
 * tensor-parallel rank), which also gives up when stop(stop_ctx) turns
 * true (a rank of the same process failed and will never join): each
 * failure aborts every watched group, so no stream is left waiting. The
 * deadline is the longest of the groups'. */
int nccl_link_wait_all(const NcclWatch *w, int n, cudaStream_t s, bool (*stop)(void *), void *stop_ctx, Err *err);
/* Ends every communicator of g (idempotent); later calls on it fail. */
void nccl_link_abort(NcclGroup *g);

/* Collectives of the group, rank's part (enqueued on s, not waited for).
 * all_gather: recv [n ranks][count] = every rank's send [count] in rank
 * order (send may be recv + rank * count: in place). all_reduce_sum: buf =
 * NCCL's own sum over the ranks (its order, not rank order). broadcast:
 * every rank's buf [n] = rank 0's (in place). */
int nccl_link_all_gather(NcclGroup *g, int rank, const void *send, void *recv, size_t count, bool bf16,
                         cudaStream_t s, Err *err);
int nccl_link_all_reduce_sum(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, cudaStream_t s, Err *err);
int nccl_link_broadcast(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, cudaStream_t s, Err *err);

/* The one-shot peer sum's table (tp_peer_sum.cuh), for a group of one
 * process whose GPUs map each other's memory (nccl_peer_open, nccl_link.h).
 * Each rank registers its part buffer and flag area when its backend is
 * made; the table is whole once every rank has (false until then, or when
 * the group has no peer access). */
bool nccl_peer_register(NcclGroup *g, int rank, const void *part, unsigned *flags);
bool nccl_peer_table(const NcclGroup *g, int rank, TpPeers *p);

#endif
