/* backend_cuda.h — the CUDA backend (C interface of the .cu files of kernels/cuda). */
#ifndef CLLM_BACKEND_CUDA_H
#define CLLM_BACKEND_CUDA_H

#include <stdint.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device;            /* CUDA device index */
    int block_size;        /* tokens per KV block */
    int n_blocks;          /* KV blocks; <= 0: as many as fit in mem_util of the GPU's memory */
    int max_seq_tokens;    /* longest sequence (block-table width); <= 0: n_blocks * block_size */
    int max_tokens;        /* rows of one step */
    float mem_util;        /* fraction of the GPU's memory cllm may use (weights, activations, KV); <= 0: 0.9 */
    bool no_graphs;        /* issue every step's kernels instead of replaying captured decode steps */
    bool generic_attention;/* the simple attention kernel even where attention.cuh has one (checks) */
    bool bf16_weights;     /* every matrix as bf16, also those quant.cuh could keep quantized (checks) */
    bool batch_invariant;  /* every row's results independent of the other rows of its step and of how its
                              prompt was chunked (gemm_bi.cuh for every GEMM, per-row decode splits) */
    KVDtype kv_dtype;      /* KV cache elements: bf16 (default), or fp8 e4m3 with a scale per (token, KV head) */
} CudaOptions;

/* Uploads the model's weights to the GPU (matrices as bf16, with Wq|Wk|Wv and
 * Wgate|Wup concatenated for one GEMM each, or, for Q8_0/Q4_0/Q4_1/Q4_K/
 * Q5_K/Q6_K matrices, in their blocks; vectors as fp32) through pinned
 * staging buffers, allocates the step buffers and a bf16 or fp8 KV cache.
 * load_gbps (optional) receives the upload rate. */
Backend *backend_cuda_create_opts(const ModelConfig *c, const ModelWeights *host, const CudaOptions *o,
                                  double *load_gbps, Err *err);

/* The same with a fixed KV cache of n_blocks blocks (no memory budget). */
Backend *backend_cuda_create(const ModelConfig *c, const ModelWeights *host, int device, int block_size,
                             int n_blocks, int max_tokens, double *load_gbps, Err *err);

/* Device bytes of the weights of a CUDA backend (as uploaded). */
uint64_t cuda_weight_bytes(const Backend *be);

/* The same, planned from the host weights before any upload. */
uint64_t cuda_weight_bytes_planned(const ModelConfig *c, const ModelWeights *w, bool bf16_weights);

/* Tokens of KV cache of kv_dtype that fit on `device` beside weight_bytes
 * of weights (cuda_weight_bytes_planned) and the activations of max_tokens
 * rows, within mem_util of its memory (what backend_cuda_create_opts would
 * allocate); 0 when none fit. */
int cuda_kv_tokens_that_fit(const ModelConfig *c, uint64_t weight_bytes, int device, float mem_util,
                            int max_tokens, int block_size, KVDtype kv_dtype, int64_t *tokens, Err *err);

#ifdef __cplusplus
}
#endif

#endif
