/* norm_fold.cuh — add_rmsnorm's output (no delta) made inside the kernel
 * that reads it: the decode GEMVs (bf16: gemv.cu, FP8: fp8_gemv.cu) take
 * the fp32 residual rows and the norm weight and normalize x themselves, so
 * the one-block norm launch between two GEMVs (a pure dependency hop at
 * decode) goes away.
 *
 * Bit for bit: the norm's vector kernel (norm.cu, one block of nt threads a
 * row) sums squares in a fixed tree: thread i adds groups of 4 i, i + nt,
 * ... (sumsq4 each), each warp's 32 threads by an xor-shuffle tree, then
 * the warps' sums by a second tree over 32 slots. A folding block of BT
 * threads plays those nt "virtual" threads: its thread tid holds virtual
 * threads tid, tid + BT, ... (each with its groups), and runs the same two
 * trees, so 1 / rms and every normalized value equal add_rmsnorm's. The
 * arithmetic is spelled with _rn intrinsics here and in norm.cu, so neither
 * depends on which multiply the compiler fuses.
 *
 * Held in registers: a thread keeps its groups of a row (rms_fold_takes:
 * at most 2 groups a virtual thread, so widths up to 8192; 1, up to 4096,
 * where the kernel's registers are short). Plain C for the struct and the
 * shape rules; the rest is CUDA. */
#ifndef CLLM_NORM_FOLD_CUH
#define CLLM_NORM_FOLD_CUH

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define RMS_HD __host__ __device__
#else
#define RMS_HD
#endif

/* The residual rows x [T][C] fp32 and the norm weight w [C] a kernel
 * normalizes itself: bf16(x / rms(x) * (w + offset)), as add_rmsnorm
 * without delta; both 16-byte aligned. x NULL: no fold. */
typedef struct {
    const float *x, *w;
    float eps, offset;
} RowNorm;

/* norm.cu's vector kernels' threads for a row of C (a multiple of 4). */
static inline RMS_HD int rms_vec_threads(int C) {
    const int c4 = C / 4;
    return c4 >= 1024 ? 1024 : (c4 + 31) / 32 * 32;
}

/* Groups of 4 a virtual thread sums (norm.cu pads to 1, 2, 4 or 8 with
 * zero groups: +0 changes no sum). */
static inline RMS_HD int rms_groups_per_thread(int C) {
    const int nt = rms_vec_threads(C);
    return (C / 4 + nt - 1) / nt;
}

/* Whether a kernel can fold the norm of rows of width C with pointers x, w
 * (the vector kernel's case: C % 4, 16-byte alignment; and at most
 * max_groups groups a virtual thread, what the kernel keeps in registers:
 * 2 for widths up to 8192, 1 up to 4096). */
static inline bool rms_fold_takes(int C, const void *x, const void *w, int max_groups) {
    return C >= 4 && C % 4 == 0 && C <= 4096 * max_groups && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

#ifdef __CUDACC__
#include <cuda_bf16.h>

/* The norm's arithmetic, shared with norm.cu (see the top). */
static __device__ __forceinline__ float rms_sumsq4(float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.x, v.x, __fmul_rn(v.y, v.y))));
}
static __device__ __forceinline__ float rms_inv(float sum, int C, float eps) {
    return rsqrtf(__fadd_rn(__fdiv_rn(sum, (float)C), eps));
}
static __device__ __forceinline__ float4 rms_norm4(float4 v, float inv, float4 g, float offset) {
    return make_float4(__fmul_rn(__fmul_rn(v.x, inv), __fadd_rn(g.x, offset)),
                       __fmul_rn(__fmul_rn(v.y, inv), __fadd_rn(g.y, offset)),
                       __fmul_rn(__fmul_rn(v.z, inv), __fadd_rn(g.z, offset)),
                       __fmul_rn(__fmul_rn(v.w, inv), __fadd_rn(g.w, offset)));
}

/* Virtual threads a real one of a BT-thread block plays (nt <= 1024). */
#define RMS_VJ(BT) ((1024 + (BT) - 1) / (BT))

/* The group of 4 held in slot j * NPER + k of this thread (virtual thread
 * threadIdx.x + j BT, its k-th group), or -1 (none). */
template <int BT, int NPER>
static __device__ __forceinline__ int rms_slot_group(int j, int k, int nt, int c4) {
    const int vt = (int)threadIdx.x + j * BT, i = vt + k * nt;
    return vt < nt && i < c4 ? i : -1;
}

/* Row x [C] normalized into v (this thread's slots, zeros where none), the
 * values rounded to bf16 (held as floats) exactly as add_rmsnorm stores
 * them. red: 32 floats of shared memory; every thread of the block must
 * call it (it has barriers), blockDim.x == BT. x_next (or NULL): the row
 * the block normalizes next, asked into L1 now, so that rows after the
 * first are not each a round trip to L2 behind the previous one's
 * barriers. */
template <int BT, int NPER>
static __device__ __forceinline__ void rms_fold_row(float4 (&v)[RMS_VJ(BT) * NPER], const float *x, const float *w,
                                                    int C, float eps, float offset, float *red, const float *x_next) {
    constexpr int VJ = RMS_VJ(BT);
    const int nt = rms_vec_threads(C), c4 = C / 4, lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    float4 g[VJ * NPER];
#pragma unroll
    for (int j = 0; j < VJ; j++)
#pragma unroll
        for (int k = 0; k < NPER; k++) { /* every load first: the row and the weight are a round trip to L2 */
            const int i = rms_slot_group<BT, NPER>(j, k, nt, c4);
            v[j * NPER + k] = i >= 0 ? reinterpret_cast<const float4 *>(x)[i] : make_float4(0, 0, 0, 0);
            g[j * NPER + k] = i >= 0 ? __ldg(reinterpret_cast<const float4 *>(w) + i) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
    for (int j = 0; j < VJ; j++)
#pragma unroll
        for (int k = 0; k < NPER; k++) {
            const int i = rms_slot_group<BT, NPER>(j, k, nt, c4);
            if (x_next && i >= 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(x_next + 4 * i));
        }
#pragma unroll
    for (int j = 0; j < VJ; j++) {
        float ss = 0.0f; /* virtual thread j's sum, then its warp's (norm.cu: ss += sumsq4, block_sum) */
#pragma unroll
        for (int k = 0; k < NPER; k++) ss = __fadd_rn(ss, rms_sumsq4(v[j * NPER + k]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        const int vw = wib + j * (BT / 32);
        if (lane == 0 && vw < nt / 32) red[vw] = ss;
    }
    __syncthreads();
    float s = lane < nt / 32 ? red[lane] : 0.0f; /* the warps' sums: the same tree in every warp */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    __syncthreads(); /* red is free for the next row */
    const float inv = rms_inv(s, C, eps);
#pragma unroll
    for (int q = 0; q < VJ * NPER; q++) {
        const float4 n = rms_norm4(v[q], inv, g[q], offset);
        const __nv_bfloat162 a = __floats2bfloat162_rn(n.x, n.y), b = __floats2bfloat162_rn(n.z, n.w);
        const float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
        v[q] = make_float4(fa.x, fa.y, fb.x, fb.y);
    }
}
#endif

#endif
