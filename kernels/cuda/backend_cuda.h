/* backend_cuda.h — the CUDA backend (C interface of the .cu files of kernels/cuda). */
#ifndef CLLM_BACKEND_CUDA_H
#define CLLM_BACKEND_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Uploads the model's weights to GPU `device` (matrices as bf16, vectors as
 * fp32) through pinned staging buffers, and allocates a KV cache of n_blocks
 * blocks of block_size tokens. max_tokens bounds the rows of one step.
 * load_gbps (optional) receives the upload rate. */
Backend *backend_cuda_create(const ModelConfig *c, const ModelWeights *host, int device, int block_size,
                             int n_blocks, int max_tokens, double *load_gbps, Err *err);

#ifdef __cplusplus
}
#endif

#endif
