/* backend_cuda.h — the CUDA backend (C interface of kernels/cuda/backend_cuda*.cu).
 *
 * Weights are uploaded once: matrices as bf16 with each layer's Wq|Wk|Wv and
 * Wgate|Wup back to back (one GEMM each), or, for Q8_0/Q4_0/Q4_1/Q5_0/
 * Q5_1/Q4_K/Q5_K/Q6_K matrices, in their blocks (quant.cuh); vectors as
 * fp32. The KV cache is bf16 or fp8 e4m3 with a scale per (token, KV head),
 * sized by the memory budget. kernels/README.md describes the kernels each
 * op runs. */
#ifndef CLLM_BACKEND_CUDA_H
#define CLLM_BACKEND_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/nccl_link.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the GPU checks (tests/gpu) switch off to compare two paths. */
typedef struct {
    bool no_graphs;         /* issue every step's kernels instead of replaying captured decode steps */
    bool generic_attention; /* the simple attention kernel even where attention.cuh has one */
    bool rope_apart;        /* decode steps rope and write the cache in their own launch, as prefill does */
} CudaChecks;

/* The backend of o (o->device a CUDA device; o->n_blocks <= 0: a KV cache
 * as large as o->mem_util of its memory allows); checks may be NULL. */
Backend *backend_cuda_create(const ModelShape *shape, const ModelWeights *host, const BackendOptions *o,
                             const CudaChecks *checks, Err *err);

/* The same as rank o->tp_rank of tensor-parallel group o->tp_group: its
 * all_reduce, all_gather and matmul_all_reduce over comm (NCCL between the
 * group's GPUs, rank o->tp_rank of it; decode steps stay CUDA graphs, the
 * collectives captured in them) or, comm NULL, through host memory
 * (kernels/tp_group.h: any GPUs, several ranks on one GPU too; no graphs,
 * each reduce waits for the host). backend_cuda_create makes a rank so when
 * o->tp_group is set. */
Backend *backend_cuda_create_rank(const ModelShape *shape, const ModelWeights *host, const BackendOptions *o,
                                  const CudaChecks *checks, NcclGroup *comm, Err *err);

/* The device bytes backend_cuda_create would hold of w. */
uint64_t cuda_weight_bytes_planned(const ModelShape *shape, const ModelWeights *w, bool bf16_weights);

/* Tokens of KV cache of o->kv_dtype that fit on o->device beside
 * weight_bytes of weights and the caller's buffers (o->act_elems,
 * o->f32_elems) within o->mem_util of its memory; 0 when none fit. */
int cuda_kv_tokens_that_fit(const ModelShape *shape, uint64_t weight_bytes, const BackendOptions *o,
                            int64_t *tokens, Err *err);

/* Decode rows a CUDA backend attended through a cascade group, counted once
 * per step and layer window, ever (0 for any other backend): tests see the
 * cascade path ran. */
int64_t backend_cuda_cascade_rows(const Backend *be);
/* Whether tensor-parallel rank be sums small reduces over NVLink peers
 * (backend_cuda_tp.cu; false: NCCL or host memory for every one). */
bool backend_cuda_tp_peers(Backend *be);

#ifdef __cplusplus
}
#endif

#endif
