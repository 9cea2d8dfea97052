/* attn_tanh.h — test-only (tests/gpu/attn_tanh.cu). */
#ifndef CLLM_TESTS_GPU_ATTN_TANH_H
#define CLLM_TESTS_GPU_ATTN_TANH_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
/* y[i] = attn_tanh(x[i]) (the soft-cap's tanh, attention_common.cuh), x and y device memory. */
void cuda_attn_tanh(float *y, const float *x, int n, cudaStream_t s);
#ifdef __cplusplus
}
#endif

#endif
