/* nccl_link.h — NCCL communicators between the pipeline stages, and
 * between the ranks of a tensor-parallel group (backend_cuda_tp.cu: its
 * all-gather and all-reduce).
 *
 * One process, a thread per GPU: nccl_group_open makes one communicator
 * per GPU (ncclCommInitAll; rank = stage, or tensor-parallel rank). One process per GPU
 * (several hosts): every process calls nccl_group_join with the same
 * unique id (made by rank 0 with nccl_unique_id and shared by
 * parallel/rendezvous.c) and holds its own rank only.
 * backend_cuda_link then gives a stage's CUDA backend its send_next /
 * recv_prev ops: ncclSend / ncclRecv on the backend's stream, and a `read`
 * that waits for the stream with a deadline: a peer that died or hangs
 * makes it abort the communicator and fail with a message, never hang.
 * NCCL is opened at run time (cuda_libs.h) by the first of these calls:
 * without libnccl.so.2 they fail with a message that names it.
 */
#ifndef CLLM_NCCL_LINK_H
#define CLLM_NCCL_LINK_H

#include <stddef.h>

#include "kernels/backend.h"
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CLLM_NCCL_ID_BYTES 128

typedef struct NcclGroup NcclGroup;

/* Communicators of ranks 0..n-1 on devs (distinct GPUs of this process).
 * (Loading NCCL sets NCCL_NVLS_ENABLE=0 unless the environment sets it: cuda_libs.c.) */
NcclGroup *nccl_group_open(const int *devs, int n, double timeout_s, Err *err);
/* Rank `rank` of n processes, all given the same id; device: this rank's GPU. */
int nccl_unique_id(unsigned char id[CLLM_NCCL_ID_BYTES], Err *err);
NcclGroup *nccl_group_join(const unsigned char id[CLLM_NCCL_ID_BYTES], int rank, int n, int device,
                           double timeout_s, Err *err);
void nccl_group_close(NcclGroup *g);
/* A tensor-parallel group of one process: peer access between all its GPUs
 * (NVLink or PCIe peers), for the one-shot sum of small reduces
 * (tp_peer_sum.cuh). False (and the group works through NCCL alone) when a
 * pair cannot, or the group spans processes. */
bool nccl_peer_open(NcclGroup *g);

/* Makes be (a CUDA backend, rank `rank` of g) send to rank + 1 and receive
 * from rank - 1. */
int backend_cuda_link(Backend *be, NcclGroup *g, int rank, Err *err);

#ifdef __cplusplus
}
#endif

#endif
