/* fp8_gemv.cu — the FP8 weight GEMV of decode (fp8.cuh's fp8_gemv): y =
 * x @ W^T for T <= FP8_GEMV_MAX_T rows of x, W e4m3 codes with a scale a row.
 *
 * It is a stream over W's bytes (the floor is their size over the memory
 * bandwidth):
 *   - a persistent grid (up to two blocks an SM, no more than tiles); each
 *     block quantizes x itself into shared memory as e4m3 codes, T x cols
 *     bytes, by the same rule as the GEMM's quantize kernel (fp8.cuh), so
 *     the GEMV and the GEMM multiply the same codes. A kernel of its own for
 *     that would put its launch and drain on the critical path of every
 *     decode GEMV; here the first tile's rows are asked into L2 before
 *     pdl_wait, and the rounding (one or two reads of x from L2) runs under
 *     them;
 *   - a block takes a tile of 16 rows at a time (GLU: 16 gate rows and the
 *     16 up rows they pair with), its warps splitting K in 64-byte chunks
 *     (neighbouring warps, neighbouring chunks), each lane with 128 bytes of
 *     loads in flight (16-byte loads that bypass L1: each byte is read once);
 *     block sizes below (FG_THREADS_*);
 *   - the products by FP8 tensor cores (mma m16n8k32 e4m3, fp32 accumulate):
 *     x's T rows are the 8 columns of B, so T = 1..8 costs the same and no
 *     weight byte is converted. An fp32 FFMA loop before it converted every
 *     code and was bound by that (on an H200 at T = 8 it ran at 0.8-1.2 TB/s
 *     and a batch-8 decode step of the 8B shape took 7.7 ms);
 *   - with a RowNorm (norm_fold.cuh) x is not read: each block normalizes
 *     the fp32 residual rows itself as add_rmsnorm would (no bf16 copy:
 *     the normalized row is rounded, its amax taken and coded in
 *     registers), which saves the norm's launch at decode;
 *   - the warps' partial sums meet in shared memory, then a_scale[t] x
 *     scale[row] x sum is stored through GemvOut (bias, parts, residual
 *     add), or, for the GLU, act(gate + bg, up + bu) from the fp32 values. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/ld_stream.cuh"
#include "kernels/cuda/norm_fold.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_core.cuh"

/* Threads a block and blocks an SM the registers must allow (__launch_bounds__' second argument):
 *   - the GEMV 512 threads; two blocks an SM (64 registers) up to T = 2, one (88) above, where the
 *     capped build's spills and re-loads cost more than the second block gains;
 *   - the GLU 256 threads, four blocks an SM (64 registers) at every T.
 * Bytes in flight bound these loops: 128 a lane, so the more warps an SM holds the nearer the copy
 * rate. Measured on an H200 (8B shapes, us at T = 1 / 8; in one call against one block an SM for
 * both): o 6.1 / 14.4 vs 7.2 / 11.7, qkv 9.9 / 16.8 vs 10.4 / 15.0, down 19.8 / 38.4 vs 21.0 / 38.3,
 * gate|up 32.1 / 42.0 vs 41.1 / 46.3 (3.66 TB/s at T = 1, 86% of copy). Tried and lost: 256-thread
 * GEMV blocks, four an SM (down at T = 8 54 us); 128-thread blocks, eight an SM (every shape slower);
 * 256 bytes in flight a lane at two 256-thread blocks an SM (gate|up T = 8 40.2, others slower). */
#define FG_THREADS_GEMV 512
#define FG_THREADS_GLU 256
#define FG_MINB_GEMV(NT) ((NT) <= 2 ? 2 : 1)
#define FG_MINB_GLU 4
#define FG_PREFETCH 2048               /* bytes of each first row asked into L2 before pdl_wait */
#define FG_MAX_SMEM (200 * 1024)       /* x codes of T rows: T x cols bytes */
#define FG_BLOCKS_PER_SM 4             /* each block quantizes x again: more blocks, more of that */

/* The block's x rows as codes in xs [NT][K] and their scales in a_scale
 * [NT]: one pass for each row's amax (dynamic scale), one for the codes. */
template <int NT, int WARPS>
static __device__ __forceinline__ void quantize_x_block(const __nv_bfloat16 *x, int K, float input_scale,
                                                        uint8_t *xs, float *a_scale, float (*red)[NT]) {
    const int n8 = K / 8, lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    if (input_scale > 0.0f) {
        if (threadIdx.x < NT) a_scale[threadIdx.x] = input_scale;
    } else {
        float am[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) am[t] = 0.0f;
        for (int c = threadIdx.x; c < n8; c += (WARPS * 32))
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
            for (int w = 0; w < WARPS; w++) m = fmaxf(m, red[w][threadIdx.x]);
            a_scale[threadIdx.x] = __fdiv_rn(m, 448.0f); /* as fp8_quantize_row: amax / 448, IEEE */
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < n8; c += (WARPS * 32))
#pragma unroll
        for (int t = 0; t < NT; t++)
            *((uint2 *)(xs + (int64_t)t * K) + c) = fp8_encode8(__ldg((const uint4 *)(x + (int64_t)t * K) + c),
                                                                a_scale[t]);
    __syncthreads();
}

/* quantize_x_block with the norm folded in (norm_fold.cuh): row t of x is
 * add_rmsnorm's output (no delta) of the residual row n.x + t K, made in
 * registers and never stored as bf16; its amax and codes are those of
 * that bf16 row, so the codes equal quantize_x_block's of add_rmsnorm's
 * output. nred: 32 floats of shared memory. */
template <int NT, int WARPS, int NPER>
static __device__ __forceinline__ void quantize_x_norm_rows(const RowNorm &n, int K, float input_scale, uint8_t *xs,
                                                            float *a_scale, float (*red)[NT], float *nred) {
    constexpr int BT = WARPS * 32, VJ = RMS_VJ(BT);
    const int nt = rms_vec_threads(K), c4 = K / 4, lane = threadIdx.x % 32, wib = threadIdx.x / 32;
#pragma unroll 1
    for (int t = 0; t < NT; t++) {
        float4 v[VJ * NPER];
        rms_fold_row<BT, NPER>(v, n.x + (int64_t)t * K, n.w, K, n.eps, n.offset, nred,
                               t + 1 < NT ? n.x + (int64_t)(t + 1) * K : NULL);
        float sc = input_scale;
        if (!(input_scale > 0.0f)) { /* the row's amax (any order: a max) / 448, as fp8_quantize_row */
            float am = 0.0f;
#pragma unroll
            for (int q = 0; q < VJ * NPER; q++)
                am = fmaxf(am, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
            if (lane == 0) red[wib][t] = am;
            __syncthreads();
            float m = 0.0f;
            for (int w = 0; w < WARPS; w++) m = fmaxf(m, red[w][t]);
            sc = __fdiv_rn(m, 448.0f);
        }
        if (threadIdx.x == 0) a_scale[t] = sc;
#pragma unroll
        for (int j = 0; j < VJ; j++)
#pragma unroll
            for (int k = 0; k < NPER; k++) {
                const int i = rms_slot_group<BT, NPER>(j, k, nt, c4);
                const float4 f = v[j * NPER + k];
                if (i >= 0)
                    *(uint32_t *)(xs + (int64_t)t * K + 4 * i) = fp8_encode(f.x, sc) | fp8_encode(f.y, sc) << 8 |
                                                                 fp8_encode(f.z, sc) << 16 | fp8_encode(f.w, sc) << 24;
            }
    }
    __syncthreads();
}

/* The block's x codes: quantize_x_block, or (n.x) the norm folded in, up
 * to FG_NORM_GROUPS(WARPS) groups a virtual thread (the GLU's 256-thread
 * blocks hold 4 virtual threads each: 2 groups of each spilled). */
#define FG_NORM_GROUPS(WARPS) ((WARPS) >= 16 ? 2 : 1)
template <int NT, int WARPS>
static __device__ __forceinline__ void quantize_x_any(const __nv_bfloat16 *x, const RowNorm &n, int K,
                                                      float input_scale, uint8_t *xs, float *a_scale, float (*red)[NT],
                                                      float *nred) {
    if (!n.x) quantize_x_block<NT, WARPS>(x, K, input_scale, xs, a_scale, red);
    else if (FG_NORM_GROUPS(WARPS) == 1 || rms_groups_per_thread(K) == 1)
        quantize_x_norm_rows<NT, WARPS, 1>(n, K, input_scale, xs, a_scale, red, nred);
    else if constexpr (FG_NORM_GROUPS(WARPS) >= 2)
        quantize_x_norm_rows<NT, WARPS, 2>(n, K, input_scale, xs, a_scale, red, nred);
}

/* ---- a 16-row tile by FP8 tensor cores ----
 *
 * mma.sync m16n8k32 e4m3 x e4m3 -> fp32: A = 16 weight rows x 32 k, B = 32 k
 * x 8 rows of x (T <= 8: the columns past T are zeros), C fp32. A dot
 * product does not care in which order its k are summed, so the k slots of
 * the fragments are mapped to whatever keeps the loads plain: lane (g, q)
 * (g = lane / 4, q = lane % 4) loads 16 contiguous bytes of rows g and g + 8
 * at k = kb + 16q (the four lanes of a row cover 64 contiguous bytes) and 16
 * bytes of x row g at the same k; bytes 0-7 feed one mma (slots 4q.., 16 +
 * 4q..), bytes 8-15 a second. Each weight byte is loaded once and never
 * converted. */

/* c += A B, m16n8k32, e4m3 in, fp32 accumulate. Before sm_89 (no FP8 mma):
 * the codes to f16 (exact) and two m16n8k16, the same slots in A and B. */
static __device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    const uint32_t lo[4] = {e4m3x2_to_f16x2(a[0]), e4m3x2_to_f16x2(a[1]), e4m3x2_to_f16x2(a[0] >> 16),
                            e4m3x2_to_f16x2(a[1] >> 16)};
    const uint32_t hi[4] = {e4m3x2_to_f16x2(a[2]), e4m3x2_to_f16x2(a[3]), e4m3x2_to_f16x2(a[2] >> 16),
                            e4m3x2_to_f16x2(a[3] >> 16)};
    mma_f16(c, lo, e4m3x2_to_f16x2(b0), e4m3x2_to_f16x2(b0 >> 16));
    mma_f16(c, hi, e4m3x2_to_f16x2(b1), e4m3x2_to_f16x2(b1 >> 16));
#endif
}

/* The two mmas of one lane's 16 bytes of rows g (w0) and g + 8 (w1) against x's (xv). */
static __device__ __forceinline__ void mma_chunk(float (&c)[4], uint4 w0, uint4 w1, uint4 xv) {
    const uint32_t a0[4] = {w0.x, w1.x, w0.y, w1.y}, a1[4] = {w0.z, w1.z, w0.w, w1.w};
    mma_e4m3(c, a0, xv.x, xv.y);
    mma_e4m3(c, a1, xv.z, xv.w);
}

/* This warp's share of NR tiles of 16 rows (tile i at rows[i]: its row g
 * and g + 8, already clamped to the matrix) over K: 64-byte chunks w, w +
 * WARPS, ... (the block's warps read neighbouring chunks), 4 / NR chunks
 * in flight. c[i]: tile i's C fragment. */
template <int NT, int NR, int WARPS>
static __device__ __forceinline__ void fp8_tile_k(float (&c)[NR][4], const uint8_t *const *r0,
                                                  const uint8_t *const *r1, const uint8_t *xs, int K, int wib,
                                                  int lane) {
    constexpr int FG_U = 4 / NR; /* 128 bytes of loads in flight a lane */
    const int q = lane % 4, n = lane / 4, n_chunks = (K + 63) / 64;
    const uint8_t *xrow = xs + (int64_t)(n < NT ? n : 0) * K;
    for (int ch0 = wib; ch0 < n_chunks; ch0 += WARPS * FG_U) {
        uint4 w0[FG_U][NR], w1[FG_U][NR];
#pragma unroll
        for (int u = 0; u < FG_U; u++) {
            const int k = (ch0 + u * WARPS) * 64 + 16 * q;
            const bool in = ch0 + u * WARPS < n_chunks && k < K;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                w0[u][i] = in ? ld_stream(r0[i] + k) : make_uint4(0, 0, 0, 0);
                w1[u][i] = in ? ld_stream(r1[i] + k) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < FG_U; u++) {
            const int k = (ch0 + u * WARPS) * 64 + 16 * q;
            if (ch0 + u * WARPS >= n_chunks) break;
            const uint4 xv = n < NT && k < K ? *(const uint4 *)(xrow + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int i = 0; i < NR; i++) mma_chunk(c[i], w0[u][i], w1[u][i], xv);
        }
    }
}

/* The block's warps' C fragments summed: red [NR][WARPS][16][8] gets them,
 * then sum(i, row, t) reads the total of tile i, row, column t. */
template <int NR, int WARPS>
static __device__ __forceinline__ void fp8_tile_spill(float (*red)[WARPS][16][8], const float (&c)[NR][4], int wib,
                                                      int lane) {
    const int g = lane / 4, t = 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < NR; i++) {
        red[i][wib][g][t] = c[i][0];
        red[i][wib][g][t + 1] = c[i][1];
        red[i][wib][g + 8][t] = c[i][2];
        red[i][wib][g + 8][t + 1] = c[i][3];
    }
}

template <int WARPS>
static __device__ __forceinline__ float fp8_tile_sum(const float (*red)[WARPS][16][8], int i, int row, int t) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) s += red[i][w][row][t];
    return s;
}

/* Rows r and r + 8 of tile `tile` (clamped: past the end a duplicate of the last row, never stored). */
static __device__ __forceinline__ const uint8_t *fp8_row(const uint8_t *W, int tile, int r, int rows, int K) {
    const int row = tile * 16 + r;
    return W + (int64_t)(row < rows ? row : rows - 1) * K;
}

template <int NT>
__global__ void __launch_bounds__(FG_THREADS_GEMV, FG_MINB_GEMV(NT))
kernel_fp8_gemv(const uint8_t *Wq, const float *wscale, int rows, int K, const __nv_bfloat16 *x, RowNorm nrm,
                float input_scale, GemvOut out) {
    constexpr int WARPS = FG_THREADS_GEMV / 32;
    extern __shared__ __align__(16) uint8_t fg_xs[];
    __shared__ float red[1][WARPS][16][8];
    __shared__ float xred[WARPS][NT];
    __shared__ float a_scale[NT];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32, n_tiles = (rows + 15) / 16;
    if ((int)blockIdx.x < n_tiles) /* the weights are constant: ask for the first tile before the inputs are ready */
        for (int r = wib; r < 16; r += WARPS) prefetch_l2_span(fp8_row(Wq, blockIdx.x, r, rows, K), K, FG_PREFETCH, lane);
    pdl_wait();
    quantize_x_any<NT, WARPS>(x, nrm, K, input_scale, fg_xs, a_scale, xred, nred);
    pdl_launch_dependents();
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        float c[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        const uint8_t *r0[1] = {fp8_row(Wq, tile, lane / 4, rows, K)}, *r1[1] = {fp8_row(Wq, tile, lane / 4 + 8, rows, K)};
        fp8_tile_k<NT, 1, WARPS>(c, r0, r1, fg_xs, K, wib, lane);
        fp8_tile_spill<1, WARPS>(red, c, wib, lane);
        __syncthreads();
        if (threadIdx.x < 16 * NT) {
            const int r = threadIdx.x % 16, t = threadIdx.x / 16, row = tile * 16 + r;
            if (row < rows) gemv_out_store(out, t, row, a_scale[t] * wscale[row] * fp8_tile_sum(red, 0, r, t));
        }
        __syncthreads(); /* red is the next tile's */
    }
}

/* GLU: W is Wgate | Wup (2F rows); a tile is gate rows 16j.. and up rows F +
 * 16j.., out [T][F] = act(a_scale x scale x sum + bias) of each pair. */
template <int NT>
__global__ void __launch_bounds__(FG_THREADS_GLU, FG_MINB_GLU)
kernel_fp8_gemv_glu(const uint8_t *Wq, const float *wscale, int F, int K, const __nv_bfloat16 *x, RowNorm nrm,
                    float input_scale, __nv_bfloat16 *out, const float *bg, const float *bu, Activation act, float limit) {
    constexpr int WARPS = FG_THREADS_GLU / 32;
    extern __shared__ __align__(16) uint8_t fg_xs[];
    __shared__ float red[2][WARPS][16][8];
    __shared__ float xred[WARPS][NT];
    __shared__ float a_scale[NT];
    __shared__ float nred[32];
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32, n_tiles = (F + 15) / 16;
    const uint8_t *Wu = Wq + (int64_t)F * K;
    for (int r = wib; (int)blockIdx.x < n_tiles && r < 16; r += WARPS) {
        prefetch_l2_span(fp8_row(Wq, blockIdx.x, r, F, K), K, FG_PREFETCH, lane);
        prefetch_l2_span(fp8_row(Wu, blockIdx.x, r, F, K), K, FG_PREFETCH, lane);
    }
    pdl_wait();
    quantize_x_any<NT, WARPS>(x, nrm, K, input_scale, fg_xs, a_scale, xred, nred);
    pdl_launch_dependents();
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const int g = lane / 4;
        const uint8_t *r0[2] = {fp8_row(Wq, tile, g, F, K), fp8_row(Wu, tile, g, F, K)};
        const uint8_t *r1[2] = {fp8_row(Wq, tile, g + 8, F, K), fp8_row(Wu, tile, g + 8, F, K)};
        fp8_tile_k<NT, 2, WARPS>(c, r0, r1, fg_xs, K, wib, lane);
        fp8_tile_spill<2, WARPS>(red, c, wib, lane);
        __syncthreads();
        if (threadIdx.x < 16 * NT) {
            const int r = threadIdx.x % 16, t = threadIdx.x / 16, row = tile * 16 + r;
            if (row < F) {
                const float a = a_scale[t];
                const float gv = a * wscale[row] * fp8_tile_sum(red, 0, r, t) + (bg ? bg[row] : 0.0f);
                const float uv = a * wscale[F + row] * fp8_tile_sum(red, 1, r, t) + (bu ? bu[row] : 0.0f);
                out[(int64_t)t * F + row] = __float2bfloat16_rn(act_glu(gv, uv, act, limit));
            }
        }
        __syncthreads();
    }
}

static size_t fg_smem(int T, int64_t K) { return (size_t)T * (size_t)K; }

static bool fg_takes(const QuantMatrix *W, int T) {
    return W->type == DT_F8_E4M3 && T >= 1 && T <= FP8_GEMV_MAX_T && W->cols % 16 == 0 && W->rows >= 1 &&
           W->rows <= INT32_MAX && fg_smem(T, W->cols) <= FG_MAX_SMEM;
}

/* A persistent grid over the tiles of 16 rows: up to FG_BLOCKS_PER_SM blocks an SM, no more than tiles. */
template <typename Kernel>
static int fg_blocks(Kernel kernel, int threads, size_t smem, int64_t n_tiles, const char *what, int64_t *blocks,
                     Err *err) {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    /* the static arrays count against the 48 KB default too: opt in whatever the size */
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), err);
    if (per_sm > FG_BLOCKS_PER_SM) per_sm = FG_BLOCKS_PER_SM;
    if (per_sm < 1) return err_set(err, "%s: a block of %zu bytes of x codes does not fit an SM", what, smem);
    const int64_t fit = (int64_t)sms * per_sm;
    *blocks = n_tiles < fit ? n_tiles : fit;
    return 0;
}

template <int NT>
static int fg_launch(const QuantMatrix *W, const void *x, const RowNorm &n, const GemvOut &out, cudaStream_t s,
                     Err *err) {
    auto kernel = kernel_fp8_gemv<NT>;
    const size_t smem = fg_smem(NT, W->cols);
    int64_t blocks = 0;
    if (fg_blocks(kernel, FG_THREADS_GEMV, smem, (W->rows + 15) / 16, "fp8_gemv", &blocks, err)) return -1;
    CUDA_CHECK(launch_pdl(kernel, dim3((unsigned)blocks), dim3(FG_THREADS_GEMV), smem, s, (const uint8_t *)W->qs,
                          (const float *)W->sc, (int)W->rows, (int)W->cols, (const __nv_bfloat16 *)x, n,
                          W->input_scale, out), err);
    return 0;
}

template <int NT>
static int fg_launch_glu(const QuantMatrix *W, const void *x, const RowNorm &n, void *out, const float *bg,
                         const float *bu, Activation act, float limit, cudaStream_t s, Err *err) {
    auto kernel = kernel_fp8_gemv_glu<NT>;
    const size_t smem = fg_smem(NT, W->cols);
    const int F = (int)(W->rows / 2);
    int64_t blocks = 0;
    if (fg_blocks(kernel, FG_THREADS_GLU, smem, ((int64_t)F + 15) / 16, "fp8_gemv_glu", &blocks, err)) return -1;
    CUDA_CHECK(launch_pdl(kernel, dim3((unsigned)blocks), dim3(FG_THREADS_GLU), smem, s, (const uint8_t *)W->qs,
                          (const float *)W->sc, F, (int)W->cols, (const __nv_bfloat16 *)x, n, W->input_scale,
                          (__nv_bfloat16 *)out, bg, bu, act, limit), err);
    return 0;
}

extern "C" bool fp8_gemv_takes(const QuantMatrix *W, int T) { return fg_takes(W, T); }

/* Groups of the norm a virtual thread the kernel holds (FG_NORM_GROUPS). */
static int fg_norm_groups(bool glu) { return glu ? FG_NORM_GROUPS(FG_THREADS_GLU / 32) : FG_NORM_GROUPS(FG_THREADS_GEMV / 32); }

extern "C" bool fp8_gemv_norm_takes(const QuantMatrix *W, const RowNorm *n, bool glu, int T) {
    return fg_takes(W, T) && (!glu || W->rows % 2 == 0) && n && n->x &&
           rms_fold_takes((int)W->cols, n->x, n->w, fg_norm_groups(glu));
}

/* The norm the kernels get (x NULL: none), or an error naming what does not fit. */
static int fg_norm_of(const char *what, const QuantMatrix *W, const void *x, const RowNorm *n, bool glu, RowNorm *nn,
                      Err *err) {
    *nn = RowNorm{NULL, NULL, 0.0f, 0.0f};
    if (n && n->x) {
        if (!rms_fold_takes((int)W->cols, n->x, n->w, fg_norm_groups(glu)))
            return err_set(err, "%s with the norm: %lld columns (up to %d), the residual and the norm weight "
                                "16-byte aligned", what, (long long)W->cols, 4096 * fg_norm_groups(glu));
        *nn = *n;
    } else if ((uintptr_t)x % 16) {
        return err_set(err, "%s: x and W must be 16-byte aligned", what);
    }
    if ((uintptr_t)W->qs % 16) return err_set(err, "%s: x and W must be 16-byte aligned", what);
    return 0;
}

extern "C" int fp8_gemv(const QuantMatrix *W, const void *x, const RowNorm *n, const GemvOut *out, int T,
                        cudaStream_t s, Err *err) {
    RowNorm nn;
    if (!fg_takes(W, T))
        return err_set(err, "fp8_gemv: %s [%lld][%lld] at %d rows of x (F8_E4M3, columns a multiple of 16, "
                            "1..%d rows, rows x columns <= %d)", dtype_info(W->type) ? dtype_info(W->type)->name : "?",
                       (long long)W->rows, (long long)W->cols, T, FP8_GEMV_MAX_T, FG_MAX_SMEM);
    if (fg_norm_of("fp8_gemv", W, x, n, false, &nn, err)) return -1;
    if (out->end[2] != W->rows) return err_set(err, "fp8_gemv: the output parts end at %lld, not the matrix's %lld rows",
                                               (long long)out->end[2], (long long)W->rows);
    switch (T) {
    case 1: return fg_launch<1>(W, x, nn, *out, s, err);
    case 2: return fg_launch<2>(W, x, nn, *out, s, err);
    case 3: return fg_launch<3>(W, x, nn, *out, s, err);
    case 4: return fg_launch<4>(W, x, nn, *out, s, err);
    case 5: return fg_launch<5>(W, x, nn, *out, s, err);
    case 6: return fg_launch<6>(W, x, nn, *out, s, err);
    case 7: return fg_launch<7>(W, x, nn, *out, s, err);
    default: return fg_launch<8>(W, x, nn, *out, s, err);
    }
}

extern "C" int fp8_gemv_glu(const QuantMatrix *W, const void *x, const RowNorm *n, void *out, const float *bg,
                            const float *bu, Activation act, float limit, int T, cudaStream_t s, Err *err) {
    RowNorm nn;
    if (!fg_takes(W, T) || W->rows % 2)
        return err_set(err, "fp8_gemv_glu: [%lld][%lld] at %d rows of x (F8_E4M3 Wgate | Wup: an even row count, "
                            "columns a multiple of 16, 1..%d rows)", (long long)W->rows, (long long)W->cols, T,
                       FP8_GEMV_MAX_T);
    if (fg_norm_of("fp8_gemv_glu", W, x, n, true, &nn, err)) return -1;
    switch (T) {
    case 1: return fg_launch_glu<1>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 2: return fg_launch_glu<2>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 3: return fg_launch_glu<3>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 4: return fg_launch_glu<4>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 5: return fg_launch_glu<5>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 6: return fg_launch_glu<6>(W, x, nn, out, bg, bu, act, limit, s, err);
    case 7: return fg_launch_glu<7>(W, x, nn, out, bg, bu, act, limit, s, err);
    default: return fg_launch_glu<8>(W, x, nn, out, bg, bu, act, limit, s, err);
    }
}
