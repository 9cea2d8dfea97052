/* norm.cu — RMSNorm kernels (norm.cuh): one block per row. The residual
 * row is read and written once, then read again (from L1/L2) to normalize.
 * Rows whose width is a multiple of 4 with aligned pointers take the
 * vectorized kernels (every load of a thread issued first); the general
 * ones take the rest. Mirrors kernels/cpu/norm.c. The vector kernels' sum
 * order and arithmetic are norm_fold.cuh's (the GEMVs that normalize x
 * themselves must get the same bits). */
#include "kernels/cuda/norm.cuh"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/norm_fold.cuh"
#include "kernels/cuda/pdl.cuh"

/* The general kernel, for rows whose width is not a multiple of 4 or whose
 * pointers are not aligned for it. */
__global__ void kernel_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int C, float eps,
                                   float offset) {
    pdl_enter();
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * C;
    const bf16 *dr = delta ? delta + (int64_t)blockIdx.x * C : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = xr[i];
        if (dr) { v += __bfloat162float(dr[i]); xr[i] = v; }
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
    bf16 *o = out + (int64_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = __float2bfloat16(xr[i] * inv * (w[i] + offset));
}
static __device__ __forceinline__ float4 weights4(const float *w, int i, int c4) { /* group i of w, or zeros past c4 */
    return i < c4 ? __ldg(reinterpret_cast<const float4 *>(w) + i) : make_float4(0, 0, 0, 0);
}

static __device__ __forceinline__ float4 row4(const float *r, int i) { return reinterpret_cast<const float4 *>(r)[i]; }
static __device__ __forceinline__ float4 row4(const bf16 *r, int i) { return bf16x4_load(r + 4 * i); }

/* The vectorized kernels' start: the thread's N groups of the row and of
 * the weights (zeros past the row's c4 groups), every load issued first. */
template <int N, typename T>
static __device__ __forceinline__ void rms_load_vec(float4 *v, float4 *g, const T *row, const float *w, int c4) {
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < c4 ? row4(row, i) : make_float4(0, 0, 0, 0);
        g[k] = weights4(w, i, c4);
    }
}

/* The vectorized kernels' end: the block's sum of squares -> the row's
 * scale, then the thread's N groups v (weights g) normalized into o. */
template <int N>
static __device__ __forceinline__ void rms_store_vec(bf16 *o, const float4 *v, const float4 *g, float ss, int C,
                                                     float eps, float offset, float *red) {
    float inv = rms_inv(block_sum(ss, red), C, eps);
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < C / 4) bf16x4_store(o + 4 * i, rms_norm4(v[k], inv, g[k], offset));
    }
}

/* The same for C % 4 == 0 and aligned rows: a thread holds N groups of 4
 * (C / 4 / blockDim.x rounded up), and every load of the row and of the
 * weights is issued before the first use. Why: at decode a row is one
 * block, and the loop above is a chain of dependent round trips to memory
 * (kernels/README.md "norms"). */
template <int N>
__global__ void kernel_add_rmsnorm_vec(float *x, const bf16 *delta, bf16 *out, const float *w, int C, float eps,
                                       float offset) {
    pdl_enter();
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * C;
    const bf16 *dr = delta ? delta + (int64_t)blockIdx.x * C : NULL;
    float4 v[N], g[N];
    rms_load_vec<N>(v, g, xr, w, C / 4);
    float ss = 0;
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (dr && i < C / 4) {
            float4 d = bf16x4_load(dr + 4 * i);
            v[k] = make_float4(v[k].x + d.x, v[k].y + d.y, v[k].z + d.z, v[k].w + d.w);
            reinterpret_cast<float4 *>(xr)[i] = v[k];
        }
        ss = __fadd_rn(ss, rms_sumsq4(v[k]));
    }
    rms_store_vec<N>(out + (int64_t)blockIdx.x * C, v, g, ss, C, eps, offset, red);
}

/* In place is safe: each thread reads the elements it later writes. */
__global__ void kernel_rmsnorm(bf16 *out, const bf16 *x, const float *w, int C, float eps, float offset) {
    pdl_enter();
    __shared__ float red[32];
    const bf16 *xr = x + (int64_t)blockIdx.x * C;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) { float v = __bfloat162float(xr[i]); ss += v * v; }
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
    bf16 *o = out + (int64_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * (w[i] + offset));
}

/* kernel_rmsnorm for C % 4 == 0 and aligned rows, loads first as above. */
template <int N>
__global__ void kernel_rmsnorm_vec(bf16 *out, const bf16 *x, const float *w, int C, float eps, float offset) {
    pdl_enter();
    __shared__ float red[32];
    float4 v[N], g[N];
    rms_load_vec<N>(v, g, x + (int64_t)blockIdx.x * C, w, C / 4);
    float ss = 0;
#pragma unroll
    for (int k = 0; k < N; k++) ss = __fadd_rn(ss, rms_sumsq4(v[k]));
    rms_store_vec<N>(out + (int64_t)blockIdx.x * C, v, g, ss, C, eps, offset, red);
}

/* The vectorized row kernels' shape for width C: threads (C / 4 rounded up
 * to warps, at most 1024) and groups of 4 per thread (1, 2, 4 or 8); 0 when
 * they do not apply (C % 4, C > 32768 or an unaligned pointer). */
static int vec_groups(int C, const void *a, const void *b, const void *c, const void *d, int *threads) {
    bool aligned = (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 8 == 0 && (uintptr_t)d % 8 == 0;
    if (C % 4 || C > 32768 || !aligned) return 0;
    int c4 = C / 4;
    *threads = rms_vec_threads(C); /* the fold (norm_fold.cuh) plays these threads: keep them one rule */
    int n = (c4 + *threads - 1) / *threads;
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
}

void cuda_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int T, int C, float eps, float offset,
                      cudaStream_t s) {
    if (T <= 0) return;
    int nt = 0, n = vec_groups(C, x, w, delta, out, &nt);
    if (n == 1) launch_pdl(kernel_add_rmsnorm_vec<1>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 2) launch_pdl(kernel_add_rmsnorm_vec<2>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 4) launch_pdl(kernel_add_rmsnorm_vec<4>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 8) launch_pdl(kernel_add_rmsnorm_vec<8>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else launch_pdl(kernel_add_rmsnorm, T, row_threads(C), 0, s, x, delta, out, w, C, eps, offset);
}

void cuda_rmsnorm(bf16 *out, const bf16 *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s) {
    if (rows <= 0) return;
    int nt = 0, n = vec_groups(C, w, w, x, out, &nt);
    if (n == 1) launch_pdl(kernel_rmsnorm_vec<1>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 2) launch_pdl(kernel_rmsnorm_vec<2>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 4) launch_pdl(kernel_rmsnorm_vec<4>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 8) launch_pdl(kernel_rmsnorm_vec<8>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else launch_pdl(kernel_rmsnorm, rows, row_threads(C), 0, s, out, x, w, C, eps, offset);
}
