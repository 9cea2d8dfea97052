/* tp_sum.cu — the rank-order sum and the column placement of a
 * tensor-parallel group's gathered parts (tp_sum.cuh). __fadd_rn keeps
 * each add a plain rounded fp32 add (never contracted or reordered), so the
 * sum has the bits of the host's loop. */
#include "kernels/cuda/tp_sum.cuh"

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/launch.cuh"

static __device__ __forceinline__ float load_f32(const void *p, bool is_bf16, int64_t i) {
    return is_bf16 ? __bfloat162float(((const bf16 *)p)[i]) : ((const float *)p)[i];
}

__global__ void kernel_tp_sum(void *out, bool out_bf16, const void *parts, bool parts_bf16, int n_ranks, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float s = load_f32(parts, parts_bf16, i);
        for (int k = 1; k < n_ranks; k++) s = __fadd_rn(s, load_f32(parts, parts_bf16, (int64_t)k * n + i));
        if (out_bf16) ((bf16 *)out)[i] = __float2bfloat16(s);
        else ((float *)out)[i] = s;
    }
}

void cuda_tp_sum(void *out, bool out_bf16, const void *parts, bool parts_bf16, int n_ranks, int64_t n,
                 cudaStream_t s) {
    if (n <= 0) return;
    kernel_tp_sum<<<grid_for(n, 256), 256, 0, s>>>(out, out_bf16, parts, parts_bf16, n_ranks, n);
}

/* One thread a (row, column): the column's rank from the split's own
 * formula (a first guess, then a step either way where V / N rounds). */
__global__ void kernel_tp_place_cols(float *dst, const float *parts, int64_t stride, int n_ranks, int rows, int V) {
    int64_t total = (int64_t)rows * V;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int r = (int)(i / V), v = (int)(i % V);
        int k = (int)((int64_t)v * n_ranks / V);
        while (k + 1 < n_ranks && v >= tp_vocab0(V, n_ranks, k + 1)) k++;
        while (k > 0 && v < tp_vocab0(V, n_ranks, k)) k--;
        int c0 = tp_vocab0(V, n_ranks, k), cols = tp_vocab_cols(V, n_ranks, k);
        dst[i] = parts[k * stride + (int64_t)r * cols + (v - c0)];
    }
}

void cuda_tp_place_cols(float *dst, const float *parts, int64_t stride, int n_ranks, int rows, int V, cudaStream_t s) {
    if (rows <= 0 || V <= 0) return;
    kernel_tp_place_cols<<<grid_for((int64_t)rows * V, 256), 256, 0, s>>>(dst, parts, stride, n_ranks, rows, V);
}
