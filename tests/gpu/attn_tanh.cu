/* attn_tanh.cu — test-only: the soft-cap's tanh (attn_tanh, attention_common.cuh) over an array, so
 * test_attention can hold it against the C library's tanh. Compiled into the GPU checks only. */
#include "kernels/cuda/attention_common.cuh"
#include "tests/gpu/attn_tanh.h"

static __global__ void kernel_attn_tanh(float *y, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = attn_tanh(x[i]);
}

extern "C" void cuda_attn_tanh(float *y, const float *x, int n, cudaStream_t s) {
    if (n > 0) kernel_attn_tanh<<<(n + 255) / 256, 256, 0, s>>>(y, x, n);
}
