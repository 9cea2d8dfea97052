/* gpu_backend.h — the CUDA backend as the GPU checks make it: device 0,
 * a fixed KV cache, and the switches of CudaChecks. */
#ifndef CLLM_TESTS_GPU_BACKEND_H
#define CLLM_TESTS_GPU_BACKEND_H

#include "kernels/cuda/backend_cuda.h"

typedef struct {
    int block_size, n_blocks, max_tokens;
    bool no_graphs, generic_attention, bf16_weights, batch_invariant, rope_apart;
    KVDtype kv_dtype;
    KVScales kv_scales;
} GpuRig;

static inline Backend *gpu_backend(const ModelShape *s, const ModelWeights *w, const GpuRig *g, Err *err) {
    BackendOptions o = {.device = 0, .block_size = g->block_size, .n_blocks = g->n_blocks,
                        .max_tokens = g->max_tokens, .mem_util = 0.9f, .kv_dtype = g->kv_dtype, .kv_scales = g->kv_scales,
                        .bf16_weights = g->bf16_weights, .batch_invariant = g->batch_invariant};
    CudaChecks ck = {g->no_graphs, g->generic_attention, g->rope_apart};
    return backend_cuda_create(s, w, &o, &ck, err);
}

#endif
