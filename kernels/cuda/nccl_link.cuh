/* nccl_link.cuh — what the CUDA backend calls of nccl_link.cu. */
#ifndef CLLM_NCCL_LINK_CUH
#define CLLM_NCCL_LINK_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/nccl_link.h"

/* n values (fp32, or bf16) to / from rank peer, on stream: enqueued, not waited for. */
int nccl_link_send(NcclGroup *g, int rank, const void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err);
int nccl_link_recv(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err);
/* Waits for stream s of rank's GPU; past the group's deadline (or on an
 * NCCL error) aborts the communicator and fails. */
int nccl_link_wait(NcclGroup *g, int rank, cudaStream_t s, Err *err);

#endif
