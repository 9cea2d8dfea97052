/* tp_sum.cuh — the device half of a tensor-parallel group's collectives
 * (kernels/cuda/tp_sum.cu): after NCCL has gathered every rank's part side
 * by side, the sum in rank order and the logits' columns put in place. */
#ifndef CLLM_TP_SUM_CUH
#define CLLM_TP_SUM_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

/* out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... over n_ranks
 * parts of n values each (parts[k] = parts + k * n), fp32 adds in rank
 * order, rounded once to out's type: the bits the host's sum gives
 * (kernels/tp_group.c), on every rank. parts_bf16 / out_bf16: bf16 values,
 * else fp32. out may be one of the parts. */
void cuda_tp_sum(void *out, bool out_bf16, const void *parts, bool parts_bf16, int n_ranks, int64_t n,
                 cudaStream_t s);

/* Columns of a vocabulary split as tp_plan.h splits it: rank k holds
 * [k*V/N, (k+1)*V/N). */
static __host__ __device__ inline int tp_vocab0(int V, int n_ranks, int k) { return (int)((int64_t)k * V / n_ranks); }
static __host__ __device__ inline int tp_vocab_cols(int V, int n_ranks, int k) {
    return tp_vocab0(V, n_ranks, k + 1) - tp_vocab0(V, n_ranks, k);
}

/* dst [rows][V] (fp32) = every rank's logits side by side: rank k's
 * [rows][its columns] lie flat at parts + k * stride. */
void cuda_tp_place_cols(float *dst, const float *parts, int64_t stride, int n_ranks, int rows, int V, cudaStream_t s);

#endif
