/* block_reduce.cuh — sum and max over a thread block (warp shuffles, then
 * one value a warp through shared memory of 32 floats); every thread gets
 * the result. */
#ifndef CLLM_BLOCK_REDUCE_CUH
#define CLLM_BLOCK_REDUCE_CUH

#include <math.h>

static __device__ __forceinline__ float block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int n_warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < n_warps ? shared[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

static __device__ __forceinline__ float block_max(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int n_warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < n_warps ? shared[threadIdx.x] : -INFINITY;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

#endif
