/* fp8_gemv.cu — the FP8 weight GEMV of decode (fp8.cuh's fp8_gemv): y =
 * x @ W^T for T <= FP8_GEMV_MAX_T rows of x, W e4m3 codes with a scale a row.
 *
 * It is a stream over W's bytes (the floor is their size over the memory
 * bandwidth), built like quant_gemv_x8.cu:
 *   - a persistent grid (up to two blocks an SM, fewer when the rows are
 *     fewer); each block quantizes x itself into shared memory as e4m3
 *     codes, T x cols bytes, by the same rule as the GEMM's quantize kernel
 *     (fp8.cuh), so the GEMV and the GEMM multiply the same codes. A kernel
 *     of its own for that would put its launch and drain on the critical
 *     path of every decode GEMV (1-3 us each for the dp4a GEMV's rounding);
 *     here the first weight rows are asked into L2 before pdl_wait, and the
 *     rounding (one or two reads of x from L2) runs under them;
 *   - a warp takes R rows at a time (R = 1 up to T = 2, then 2: each x chunk
 *     read from shared memory then serves R rows; 4 rows at T = 8 spill
 *     past the 128 registers a 512-thread block allows), every lane
 *     keeping 64 bytes of weight loads in flight (16-byte loads that bypass
 *     L1: each byte is read once) before converting the first;
 *   - codes become fp32 exactly (e4m3 -> f16x2 by one cvt on sm_89+, then
 *     f16 -> f32), products and sums in fp32 (exact products: 4-bit
 *     significands), a shuffle reduction, then a_scale[t] x scale[row] x sum;
 *   - GLU variant (W = Wgate | Wup): a warp takes gate row r and up row
 *     F + r and stores act(gate + bg, up + bu) from the fp32 sums, as the
 *     dp4a GEMV's GLU does (no bf16 round trip, no GLU kernel).
 * At T >= 3 the fp32 FMAs (T a weight byte) bound it, not bytes: an
 * e4m3 mma.sync (sm_89+) is the lever there. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/pdl.cuh"

#define FG_THREADS 512
#define FG_WARPS (FG_THREADS / 32)
#define FG_LANE_BYTES 64               /* weight bytes a lane has in flight (R rows x U loads of 16) */
#define FG_PREFETCH 2048               /* bytes of each first row asked into L2 before pdl_wait */
#define FG_MAX_SMEM (200 * 1024)       /* x codes of T rows: T x cols bytes */
#define FG_BLOCKS_PER_SM 2             /* each block quantizes x again: more blocks, more of that; 2 x 16 warps an SM
                                          keep 64 KB of weight loads in flight */

static __device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

static __device__ __forceinline__ uint32_t word_of(uint4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* The block's x rows as codes in xs [NT][K] and their scales in a_scale
 * [NT]: one pass for each row's amax (dynamic scale), one for the codes. */
template <int NT>
static __device__ __forceinline__ void quantize_x_block(const __nv_bfloat16 *x, int K, float input_scale,
                                                        uint8_t *xs, float *a_scale, float (*red)[NT]) {
    const int n8 = K / 8, lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    if (input_scale > 0.0f) {
        if (threadIdx.x < NT) a_scale[threadIdx.x] = input_scale;
    } else {
        float am[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) am[t] = 0.0f;
        for (int c = threadIdx.x; c < n8; c += FG_THREADS)
#pragma unroll
            for (int t = 0; t < NT; t++) am[t] = bf16x8_amax(__ldg((const uint4 *)(x + (int64_t)t * K) + c), am[t]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) am[t] = fmaxf(am[t], __shfl_xor_sync(0xffffffffu, am[t], o));
            if (lane == 0) red[wib][t] = am[t];
        }
        __syncthreads();
        if (threadIdx.x < NT) {
            float m = 0.0f;
            for (int w = 0; w < FG_WARPS; w++) m = fmaxf(m, red[w][threadIdx.x]);
            a_scale[threadIdx.x] = __fdiv_rn(m, 448.0f); /* as fp8_quantize_row: amax / 448, IEEE */
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < n8; c += FG_THREADS)
#pragma unroll
        for (int t = 0; t < NT; t++)
            *((uint2 *)(xs + (int64_t)t * K) + c) = fp8_encode8(__ldg((const uint4 *)(x + (int64_t)t * K) + c),
                                                                a_scale[t]);
    __syncthreads();
}

/* acc[r][t] += this lane's share of row r . x row t (codes); c0 = lane. */
template <int NT, int R, int U>
static __device__ __forceinline__ void fp8_rows(float (*acc)[NT], const uint8_t *const *wrow, const uint8_t *xs,
                                                int K, int lane) {
    const int n16 = K / 16;
    for (int c0 = lane; c0 < n16; c0 += 32 * U) {
        uint4 wv[R][U];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + 32 * u;
                wv[r][u] = c < n16 ? ld_stream((const uint4 *)wrow[r] + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            if (c >= n16) break;
#pragma unroll
            for (int h = 0; h < 2; h++) { /* 8 codes at a time: fewer live registers */
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    fp8x4_to_f32(word_of(wv[r][u], 2 * h), wf[r]);
                    fp8x4_to_f32(word_of(wv[r][u], 2 * h + 1), wf[r] + 4);
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint2 xv = *((const uint2 *)(xs + (int64_t)t * K + 16 * c) + h);
                    float xf[8];
                    fp8x4_to_f32(xv.x, xf);
                    fp8x4_to_f32(xv.y, xf + 4);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wf[r][i], xf[i], acc[r][t]);
                }
            }
        }
    }
}

template <int NT, int R>
__global__ void __launch_bounds__(FG_THREADS)
kernel_fp8_gemv(const uint8_t *Wq, const float *wscale, int rows, int K, const __nv_bfloat16 *x, float input_scale,
                GemvOut out) {
    constexpr int U = FG_LANE_BYTES / 16 / R;
    extern __shared__ __align__(16) uint8_t fg_xs[];
    __shared__ float red[FG_WARPS][NT];
    __shared__ float a_scale[NT];
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    const int stride = gridDim.x * FG_WARPS, n_groups = (rows + R - 1) / R;
    int g = blockIdx.x * FG_WARPS + wib;
    if (g < n_groups) /* the weights are constant: ask for the first rows before the inputs are ready */
        for (int r = 0; r < R; r++)
            prefetch_l2_span(Wq + (int64_t)(g * R + r < rows ? g * R + r : rows - 1) * K, K, FG_PREFETCH, lane);
    pdl_wait();
    quantize_x_block<NT>(x, K, input_scale, fg_xs, a_scale, red);
    pdl_launch_dependents();
    for (; g < n_groups; g += stride) {
        float acc[R][NT];
        const uint8_t *wrow[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = g * R + r;
            wrow[r] = Wq + (int64_t)(row < rows ? row : rows - 1) * K; /* past the end: a duplicate, never stored */
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        }
        fp8_rows<NT, R, U>(acc, wrow, fg_xs, K, lane);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
        if (lane != 0) continue;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = g * R + r;
            if (row >= rows) break;
            const float ws = wscale[row];
#pragma unroll
            for (int t = 0; t < NT; t++) gemv_out_store(out, t, row, a_scale[t] * ws * acc[r][t]);
        }
    }
}

/* GLU: W is Wgate | Wup (2F rows); warp g takes gate row g and up row F + g,
 * out [T][F] = act(a_scale x scale x sum + bias) of the pair. */
template <int NT>
__global__ void __launch_bounds__(FG_THREADS)
kernel_fp8_gemv_glu(const uint8_t *Wq, const float *wscale, int F, int K, const __nv_bfloat16 *x, float input_scale,
                    __nv_bfloat16 *out, const float *bg, const float *bu, Activation act, float limit) {
    constexpr int U = FG_LANE_BYTES / 16 / 2;
    extern __shared__ __align__(16) uint8_t fg_xs[];
    __shared__ float red[FG_WARPS][NT];
    __shared__ float a_scale[NT];
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32, stride = gridDim.x * FG_WARPS;
    int g = blockIdx.x * FG_WARPS + wib;
    if (g < F) {
        prefetch_l2_span(Wq + (int64_t)g * K, K, FG_PREFETCH, lane);
        prefetch_l2_span(Wq + (int64_t)(F + g) * K, K, FG_PREFETCH, lane);
    }
    pdl_wait();
    quantize_x_block<NT>(x, K, input_scale, fg_xs, a_scale, red);
    pdl_launch_dependents();
    for (; g < F; g += stride) {
        float acc[2][NT];
        const uint8_t *wrow[2] = {Wq + (int64_t)g * K, Wq + (int64_t)(F + g) * K};
#pragma unroll
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = 0.0f;
        fp8_rows<NT, 2, U>(acc, wrow, fg_xs, K, lane);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
        if (lane != 0) continue;
        const float wg = wscale[g], wu = wscale[F + g], b0 = bg ? bg[g] : 0.0f, b1 = bu ? bu[g] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            out[(int64_t)t * F + g] = __float2bfloat16_rn(
                act_glu(a_scale[t] * wg * acc[0][t] + b0, a_scale[t] * wu * acc[1][t] + b1, act, limit));
    }
}

static size_t fg_smem(int T, int64_t K) { return (size_t)T * (size_t)K; }

static bool fg_takes(const QuantMatrix *W, int T) {
    return W->type == DT_F8_E4M3 && T >= 1 && T <= FP8_GEMV_MAX_T && W->cols % 16 == 0 && W->rows >= 1 &&
           W->rows <= INT32_MAX && fg_smem(T, W->cols) <= FG_MAX_SMEM;
}

template <int NT>
static int fg_launch(const QuantMatrix *W, const void *x, const GemvOut &out, cudaStream_t s, Err *err) {
    constexpr int R = NT <= 2 ? 1 : 2;
    auto kernel = kernel_fp8_gemv<NT, R>;
    const size_t smem = fg_smem(NT, W->cols);
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, FG_THREADS, smem), err);
    if (per_sm > FG_BLOCKS_PER_SM) per_sm = FG_BLOCKS_PER_SM;
    if (per_sm < 1) return err_set(err, "fp8_gemv: a block of %zu bytes of x codes does not fit an SM", smem);
    const int64_t groups = (W->rows + R - 1) / R, want = (groups + FG_WARPS - 1) / FG_WARPS;
    const int64_t fit = (int64_t)sms * per_sm, blocks = want < fit ? want : fit;
    CUDA_CHECK(launch_pdl(kernel, dim3((unsigned)blocks), dim3(FG_THREADS), smem, s, (const uint8_t *)W->qs,
                          (const float *)W->sc, (int)W->rows, (int)W->cols, (const __nv_bfloat16 *)x,
                          W->input_scale, out), err);
    return 0;
}

template <int NT>
static int fg_launch_glu(const QuantMatrix *W, const void *x, void *out, const float *bg, const float *bu,
                         Activation act, float limit, cudaStream_t s, Err *err) {
    auto kernel = kernel_fp8_gemv_glu<NT>;
    const size_t smem = fg_smem(NT, W->cols);
    const int F = (int)(W->rows / 2);
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, FG_THREADS, smem), err);
    if (per_sm > FG_BLOCKS_PER_SM) per_sm = FG_BLOCKS_PER_SM;
    if (per_sm < 1) return err_set(err, "fp8_gemv_glu: a block of %zu bytes of x codes does not fit an SM", smem);
    const int64_t want = ((int64_t)F + FG_WARPS - 1) / FG_WARPS, fit = (int64_t)sms * per_sm;
    const int64_t blocks = want < fit ? want : fit;
    CUDA_CHECK(launch_pdl(kernel, dim3((unsigned)blocks), dim3(FG_THREADS), smem, s, (const uint8_t *)W->qs,
                          (const float *)W->sc, F, (int)W->cols, (const __nv_bfloat16 *)x, W->input_scale,
                          (__nv_bfloat16 *)out, bg, bu, act, limit), err);
    return 0;
}

extern "C" bool fp8_gemv_takes(const QuantMatrix *W, int T) { return fg_takes(W, T); }

extern "C" int fp8_gemv(const QuantMatrix *W, const void *x, const GemvOut *out, int T, cudaStream_t s, Err *err) {
    if (!fg_takes(W, T))
        return err_set(err, "fp8_gemv: %s [%lld][%lld] at %d rows of x (F8_E4M3, columns a multiple of 16, "
                            "1..%d rows, rows x columns <= %d)", dtype_info(W->type) ? dtype_info(W->type)->name : "?",
                       (long long)W->rows, (long long)W->cols, T, FP8_GEMV_MAX_T, FG_MAX_SMEM);
    if ((uintptr_t)x % 16 || (uintptr_t)W->qs % 16) return err_set(err, "fp8_gemv: x and W must be 16-byte aligned");
    if (out->end[2] != W->rows) return err_set(err, "fp8_gemv: the output parts end at %lld, not the matrix's %lld rows",
                                               (long long)out->end[2], (long long)W->rows);
    switch (T) {
    case 1: return fg_launch<1>(W, x, *out, s, err);
    case 2: return fg_launch<2>(W, x, *out, s, err);
    case 3: return fg_launch<3>(W, x, *out, s, err);
    case 4: return fg_launch<4>(W, x, *out, s, err);
    case 5: return fg_launch<5>(W, x, *out, s, err);
    case 6: return fg_launch<6>(W, x, *out, s, err);
    case 7: return fg_launch<7>(W, x, *out, s, err);
    default: return fg_launch<8>(W, x, *out, s, err);
    }
}

extern "C" int fp8_gemv_glu(const QuantMatrix *W, const void *x, void *out, const float *bg, const float *bu,
                            Activation act, float limit, int T, cudaStream_t s, Err *err) {
    if (!fg_takes(W, T) || W->rows % 2)
        return err_set(err, "fp8_gemv_glu: [%lld][%lld] at %d rows of x (F8_E4M3 Wgate | Wup: an even row count, "
                            "columns a multiple of 16, 1..%d rows)", (long long)W->rows, (long long)W->cols, T,
                       FP8_GEMV_MAX_T);
    if ((uintptr_t)x % 16 || (uintptr_t)W->qs % 16) return err_set(err, "fp8_gemv_glu: x and W must be 16-byte aligned");
    switch (T) {
    case 1: return fg_launch_glu<1>(W, x, out, bg, bu, act, limit, s, err);
    case 2: return fg_launch_glu<2>(W, x, out, bg, bu, act, limit, s, err);
    case 3: return fg_launch_glu<3>(W, x, out, bg, bu, act, limit, s, err);
    case 4: return fg_launch_glu<4>(W, x, out, bg, bu, act, limit, s, err);
    case 5: return fg_launch_glu<5>(W, x, out, bg, bu, act, limit, s, err);
    case 6: return fg_launch_glu<6>(W, x, out, bg, bu, act, limit, s, err);
    case 7: return fg_launch_glu<7>(W, x, out, bg, bu, act, limit, s, err);
    default: return fg_launch_glu<8>(W, x, out, bg, bu, act, limit, s, err);
    }
}
