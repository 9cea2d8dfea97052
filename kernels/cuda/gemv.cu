/* gemv.cu — bf16 matrix x few-vectors products for decode (T <= GEMV_MAX_T):
 * y[t][m] = sum_k W[m][k] x[t][k], the weights read once for all T rows.
 *
 * At small T a GEMM is a stream over the weights, so the kernel is built to
 * keep the memory system busy: one warp per output row (two rows, gate and
 * up, in the GLU variant), each lane loading 16 bytes (8 bf16) of the row at
 * a time with UNROLL loads in flight before the first use, fp32 multiply-add
 * against the x rows (small, re-read from L1/L2 by every warp), and a
 * warp-shuffle reduction at the end. Weights are loaded with the streaming
 * cache hint: each byte is used once per step. Rows whose length is not a
 * multiple of 8 (or misaligned data) take the scalar variant. T is a
 * template parameter so the accumulators stay in registers.
 * kernels/README.md has the rates against the copy bandwidth. */
#include "kernels/cuda/gemv.cuh"

#include <stdint.h>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

#define GEMV_WARPS 8
#define GEMV_UNROLL 4
#define GEMV_PREFETCH 2048 /* bytes of each row asked into L2 before pdl_wait (pdl.cuh) */

static __device__ __forceinline__ void dot8(float *acc, uint4 w, uint4 x) {
    const __nv_bfloat162 *w2 = (const __nv_bfloat162 *)&w, *x2 = (const __nv_bfloat162 *)&x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 a = __bfloat1622float2(w2[i]), b = __bfloat1622float2(x2[i]);
        *acc = fmaf(a.x, b.x, *acc);
        *acc = fmaf(a.y, b.y, *acc);
    }
}

/* Values 8c .. 8c + 7 of x row t: from global memory (through the
 * read-only path), or (XS) from the block's shared copy. */
template <bool XS> static __device__ __forceinline__ uint4 gemv_x8(const bf16 *x, int t, int K, int c) {
    return XS ? ((const uint4 *)(x + (int64_t)t * K))[c] : __ldg((const uint4 *)(x + (int64_t)t * K) + c);
}

/* One round of a warp's weight loads: 16 bytes of each of its NR rows at
 * chunks c0 + 32u (u < GEMV_UNROLL), zeros past the row's n8 chunks. */
template <int NR>
static __device__ __forceinline__ void gemv_load_round(uint4 (&wv)[NR][GEMV_UNROLL], const bf16 *const *wrow, int c0,
                                                       int n8) {
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int c = c0 + u * 32;
            wv[r][u] = c < n8 ? __ldcs((const uint4 *)wrow[r] + c) : make_uint4(0, 0, 0, 0);
        }
}

template <int NT, int NR, bool XS>
static __device__ __forceinline__ void gemv_use_round(float (*acc)[NT], const uint4 (&wv)[NR][GEMV_UNROLL],
                                                      const bf16 *x, int K, int c0, int n8) {
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int c = c0 + u * 32;
        if (c >= n8) break;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const uint4 xv = gemv_x8<XS>(x, t, K, c);
#pragma unroll
            for (int r = 0; r < NR; r++) dot8(&acc[r][t], wv[r][u], xv);
        }
    }
}

template <int NT, int NR>
static __device__ __forceinline__ void gemv_reduce(float (*acc)[NT]) {
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
}

/* acc[r][t] += W row r . x row t over the whole row, this lane's share, then
 * summed over the warp; VEC: a round of 16-byte loads at a time (the
 * registers of more rows or x rows hold no second one), else one value a
 * lane at a time. XS: x is in shared memory (the folded kernels below). */
template <int NT, int NR, bool VEC, bool XS = false>
static __device__ __forceinline__ void gemv_rows(float (*acc)[NT], const bf16 *const *wrow, const bf16 *x, int K,
                                                 int lane) {
    if (VEC) {
        const int n8 = K / 8;
        for (int c0 = lane; c0 < n8; c0 += 32 * GEMV_UNROLL) {
            uint4 wv[NR][GEMV_UNROLL];
            gemv_load_round<NR>(wv, wrow, c0, n8);
            gemv_use_round<NT, NR, XS>(acc, wv, x, K, c0, n8);
        }
    } else {
        for (int c = lane; c < K; c += 32) {
            float wf[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) wf[r] = __bfloat162float(wrow[r][c]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float xf = __bfloat162float(x[(int64_t)t * K + c]);
#pragma unroll
                for (int r = 0; r < NR; r++) acc[r][t] = fmaf(wf[r], xf, acc[r][t]);
            }
        }
    }
    gemv_reduce<NT, NR>(acc);
}

/* One row and one x row (batch 1) with the round `cur` already issued
 * (gemv_row_begin: before pdl_wait, or before the previous row's stores):
 * the next round's loads go out before the current one is used, two rounds
 * in flight. The same sums in the same order as gemv_rows<1, 1, true, XS>. */
typedef struct {
    uint4 w[1][GEMV_UNROLL];
} GemvRound;

static __device__ __forceinline__ void gemv_row_begin(GemvRound &first, const bf16 *row, int K, int lane) {
    gemv_load_round<1>(first.w, &row, lane, K / 8);
}

template <bool XS>
static __device__ __forceinline__ void gemv_row_ahead(float (*acc)[1], GemvRound &cur, const bf16 *row, const bf16 *x,
                                                      int K, int lane) {
    const int n8 = K / 8;
    for (int c0 = lane; c0 < n8; c0 += 32 * GEMV_UNROLL) {
        GemvRound next;
        gemv_load_round<1>(next.w, &row, c0 + 32 * GEMV_UNROLL, n8);
        gemv_use_round<1, 1, XS>(acc, cur.w, x, K, c0, n8);
        cur = next;
    }
    gemv_reduce<1, 1>(acc);
}

/* R consecutive rows per warp: each x load then serves R rows, which keeps
 * the L1 traffic of x (T loads per weight load) from limiting larger T. */
template <int NT, int R, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
kernel_gemv(GemvOut o, const bf16 *W, const bf16 *x, int M, int K) {
    int lane = threadIdx.x % 32, m0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * R;
    if (m0 >= M) return;
    float acc[R][NT];
    const bf16 *wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wrow[r] = W + (int64_t)(m0 + r < M ? m0 + r : m0) * K; /* past the end: a duplicate, never written */
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        prefetch_l2_span(wrow[r], 2 * (int64_t)K, GEMV_PREFETCH, lane);
    }
    pdl_enter(); /* no first round ahead here: it measured no faster (O, down: kernels/README.md) */
    gemv_rows<NT, R, VEC>(acc, wrow, x, K, lane);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int m = m0 + r;
        if (m >= M) break;
#pragma unroll
        for (int t = 0; t < NT; t++) gemv_out_store(o, t, m, acc[r][t]);
    }
}

/* P (gate, up) row pairs per warp. */
template <int NT, int P, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
kernel_gemv_glu(bf16 *out, const bf16 *W, const bf16 *x, const float *bg, const float *bu, int F, int K,
                Activation act, float limit) {
    int lane = threadIdx.x % 32, m0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * P;
    if (m0 >= F) return;
    float acc[2 * P][NT];
    const bf16 *wrow[2 * P];
#pragma unroll
    for (int p = 0; p < P; p++) {
        int m = m0 + p < F ? m0 + p : m0;
        wrow[2 * p] = W + (int64_t)m * K;
        wrow[2 * p + 1] = W + (int64_t)(F + m) * K;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[2 * p][t] = acc[2 * p + 1][t] = 0.0f;
        prefetch_l2_span(wrow[2 * p], 2 * (int64_t)K, GEMV_PREFETCH, lane);
        prefetch_l2_span(wrow[2 * p + 1], 2 * (int64_t)K, GEMV_PREFETCH, lane);
    }
    pdl_enter();
    gemv_rows<NT, 2 * P, VEC>(acc, wrow, x, K, lane);
    if (lane != 0) return;
#pragma unroll
    for (int p = 0; p < P; p++) {
        int m = m0 + p;
        if (m >= F) break;
        float g0 = bg ? bg[m] : 0.0f, u0 = bu ? bu[m] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++)
            out[(int64_t)t * F + m] = __float2bfloat16(act_glu(acc[2 * p][t] + g0, acc[2 * p + 1][t] + u0, act, limit));
    }
}

/* ---------------- the norm folded in (norm_fold.cuh) ----------------
 * x is made by each block from the fp32 residual rows, normalized and
 * rounded as add_rmsnorm stores it, into shared memory as bf16 [NT][K].
 * Why a persistent grid (a few blocks an SM, each warp striding over the
 * row groups): that work is then done a few times an SM, not once per 8
 * rows (a one-block-per-8-rows grid would read the residual 768 times for
 * q|k|v). x then comes from shared memory, not through L1 (the plain
 * kernels' T loads of x per weight load). The weights stream as above. */
#define GEMV_NORM_THREADS 512
#define GEMV_NORM_BLOCKS_PER_SM 4      /* registers allow 2 at T <= 2 (GEMV_NORM_MINB); each block normalizes x again */
#define GEMV_NORM_MAX_SMEM (160 * 1024) /* x of T rows: T x K x 2 bytes */
#define GEMV_NORM_MINB(NT) ((NT) <= 2 ? 2 : 1) /* blocks an SM the registers must allow: 64 a thread up to T = 2 */

/* The block's T rows of x, normalized, into xs [NT][K]; nper: the norm's
 * groups a virtual thread (norm_fold.cuh: 1 or 2). */
template <int NT, int NPER>
static __device__ __forceinline__ void gemv_fold_rows(bf16 *xs, const RowNorm &n, int K, float *red) {
    constexpr int BT = GEMV_NORM_THREADS, VJ = RMS_VJ(BT);
    const int nt = rms_vec_threads(K), c4 = K / 4;
#pragma unroll 1
    for (int t = 0; t < NT; t++) {
        float4 v[VJ * NPER];
        rms_fold_row<BT, NPER>(v, n.x + (int64_t)t * K, n.w, K, n.eps, n.offset, red,
                               t + 1 < NT ? n.x + (int64_t)(t + 1) * K : NULL);
#pragma unroll
        for (int j = 0; j < VJ; j++)
#pragma unroll
            for (int k = 0; k < NPER; k++) {
                const int i = rms_slot_group<BT, NPER>(j, k, nt, c4);
                if (i >= 0) bf16x4_store(xs + (int64_t)t * K + 4 * i, v[j * NPER + k]); /* bf16 values: exact */
            }
    }
}

template <int NT>
static __device__ __forceinline__ void gemv_fold_x(bf16 *xs, const RowNorm &n, int K, float *red) {
    if (rms_groups_per_thread(K) == 1) gemv_fold_rows<NT, 1>(xs, n, K, red);
    else gemv_fold_rows<NT, 2>(xs, n, K, red);
    __syncthreads();
}

/* Group g's rows: R rows from gR (past the end: duplicates of row gR, never written). */
template <int R>
static __device__ __forceinline__ void gemv_group_rows(const bf16 *(&wrow)[R], const bf16 *W, int g, int M, int K) {
#pragma unroll
    for (int r = 0; r < R; r++) wrow[r] = W + (int64_t)(g * R + r < M ? g * R + r : g * R) * K;
}

/* kernel_gemv with the norm folded in: R rows per warp, the warps of the
 * grid striding over the groups of R rows. */
template <int NT, int R>
__global__ void __launch_bounds__(GEMV_NORM_THREADS, GEMV_NORM_MINB(NT))
kernel_gemv_norm(GemvOut o, const bf16 *W, RowNorm n, int M, int K) {
    extern __shared__ __align__(16) uint8_t gemv_smem[];
    __shared__ float red[32];
    bf16 *xs = (bf16 *)gemv_smem;
    const int lane = threadIdx.x % 32, w0 = blockIdx.x * (GEMV_NORM_THREADS / 32) + threadIdx.x / 32;
    const int n_warps = gridDim.x * (GEMV_NORM_THREADS / 32), groups = (M + R - 1) / R;
    for (int r = 0; w0 < groups && r < R; r++) /* the first group's rows, before the inputs are ready */
        prefetch_l2_span(W + (int64_t)min(w0 * R + r, M - 1) * K, 2 * (int64_t)K, GEMV_PREFETCH, lane);
    /* batch 1: a warp's first round before pdl_wait, and each next row's before the stores (gemv_row_ahead;
     * at more rows or x rows the registers would spill) */
    constexpr bool ahead = R == 1 && NT == 1;
    const bf16 *wrow[R];
    GemvRound first;
    gemv_group_rows<R>(wrow, W, w0, M, K);
    if (ahead && w0 < groups) gemv_row_begin(first, wrow[0], K, lane);
    pdl_wait();
    gemv_fold_x<NT>(xs, n, K, red);
    pdl_launch_dependents();
    for (int g = w0; g < groups; g += n_warps) {
        float acc[R][NT] = {};
        if constexpr (ahead) {
            gemv_row_ahead<true>(acc, first, wrow[0], xs, K, lane);
            gemv_group_rows<R>(wrow, W, g + n_warps, M, K);
            if (g + n_warps < groups) gemv_row_begin(first, wrow[0], K, lane);
        } else {
            const bf16 *rows[R];
            gemv_group_rows<R>(rows, W, g, M, K);
            gemv_rows<NT, R, true, true>(acc, rows, xs, K, lane);
        }
        if (lane != 0) continue;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (g * R + r >= M) break;
#pragma unroll
            for (int t = 0; t < NT; t++) gemv_out_store(o, t, g * R + r, acc[r][t]);
        }
    }
}

/* kernel_gemv_glu with the norm folded in: P (gate, up) pairs per warp. */
template <int NT, int P>
__global__ void __launch_bounds__(GEMV_NORM_THREADS, GEMV_NORM_MINB(NT))
kernel_gemv_glu_norm(bf16 *out, const bf16 *W, RowNorm n, const float *bg, const float *bu, int F, int K,
                     Activation act, float limit) {
    extern __shared__ __align__(16) uint8_t gemv_smem[];
    __shared__ float red[32];
    bf16 *xs = (bf16 *)gemv_smem;
    const int lane = threadIdx.x % 32, w0 = blockIdx.x * (GEMV_NORM_THREADS / 32) + threadIdx.x / 32;
    const int n_warps = gridDim.x * (GEMV_NORM_THREADS / 32), groups = (F + P - 1) / P;
    for (int p = 0; w0 < groups && p < P; p++) {
        const int64_t m = min(w0 * P + p, F - 1);
        prefetch_l2_span(W + m * K, 2 * (int64_t)K, GEMV_PREFETCH, lane);
        prefetch_l2_span(W + (F + m) * K, 2 * (int64_t)K, GEMV_PREFETCH, lane);
    }
    pdl_wait(); /* no first round before: held across the fold it would spill (64 registers) */
    gemv_fold_x<NT>(xs, n, K, red);
    pdl_launch_dependents();
    for (int g = w0; g < groups; g += n_warps) {
        const int m0 = g * P;
        float acc[2 * P][NT];
        const bf16 *wrow[2 * P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int m = m0 + p < F ? m0 + p : m0;
            wrow[2 * p] = W + (int64_t)m * K;
            wrow[2 * p + 1] = W + (int64_t)(F + m) * K;
#pragma unroll
            for (int t = 0; t < NT; t++) acc[2 * p][t] = acc[2 * p + 1][t] = 0.0f;
        }
        gemv_rows<NT, 2 * P, true, true>(acc, wrow, xs, K, lane);
        if (lane != 0) continue;
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int m = m0 + p;
            if (m >= F) break;
            const float g0 = bg ? bg[m] : 0.0f, u0 = bu ? bu[m] : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++)
                out[(int64_t)t * F + m] = __float2bfloat16(act_glu(acc[2 * p][t] + g0, acc[2 * p + 1][t] + u0, act, limit));
        }
    }
}

/* MoE experts of decode: one (token, choice) pair per blockIdx.y; pair p
 * runs expert sel[p] on x row p / x_div. GLU: gate rows of Wa, up rows of
 * Wb (each [E][M][K]), out = act(gate + ba) * (up + bb); else out = Wa x + ba. */
template <bool GLU, bool VEC>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
kernel_gemv_experts(bf16 *out, const bf16 *Wa, const bf16 *Wb, const float *ba, const float *bb, const bf16 *x,
                    int x_div, const int32_t *sel, int M, int K, Activation act, float limit) {
    pdl_enter();
    int lane = threadIdx.x % 32, m = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, p = blockIdx.y, e = sel[p];
    if (m >= M) return;
    const int NR = GLU ? 2 : 1;
    float acc[NR][1];
    const bf16 *wrow[NR];
    wrow[0] = Wa + ((int64_t)e * M + m) * K;
    if (GLU) wrow[NR - 1] = Wb + ((int64_t)e * M + m) * K;
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r][0] = 0.0f;
    gemv_rows<1, NR, VEC>(acc, wrow, x + (int64_t)(p / x_div) * K, K, lane);
    if (lane != 0) return;
    float a = acc[0][0] + (ba ? ba[(int64_t)e * M + m] : 0.0f);
    if (GLU) a = act_glu(a, acc[NR - 1][0] + (bb ? bb[(int64_t)e * M + m] : 0.0f), act, limit);
    out[(int64_t)p * M + m] = __float2bfloat16(a);
}

/* ---------------- launchers ---------------- */

static bool gemv_vec_ok(const void *W, const void *x, int K) {
    return K % 8 == 0 && ((uintptr_t)W % 16) == 0 && ((uintptr_t)x % 16) == 0;
}

/* Rows per warp: 1 up to T = 2, then 2 (T <= 4), then 4. */
template <int NT>
static void launch_gemv(const GemvOut &o, const bf16 *W, const bf16 *x, int M, int K, cudaStream_t s) {
    const int R = NT <= 2 ? 1 : NT <= 4 ? 2 : 4;
    int blocks = (M + GEMV_WARPS * R - 1) / (GEMV_WARPS * R);
    if (gemv_vec_ok(W, x, K)) launch_pdl(kernel_gemv<NT, R, true>, blocks, GEMV_WARPS * 32, 0, s, o, W, x, M, K);
    else launch_pdl(kernel_gemv<NT, R, false>, blocks, GEMV_WARPS * 32, 0, s, o, W, x, M, K);
}

template <int NT>
static void launch_gemv_glu(bf16 *out, const bf16 *W, const bf16 *x, const float *bg, const float *bu, int F, int K,
                            Activation act, float limit, cudaStream_t s) {
    const int P = NT <= 2 ? 1 : 2;
    int blocks = (F + GEMV_WARPS * P - 1) / (GEMV_WARPS * P);
    if (gemv_vec_ok(W, x, K))
        launch_pdl(kernel_gemv_glu<NT, P, true>, blocks, GEMV_WARPS * 32, 0, s, out, W, x, bg, bu, F, K, act, limit);
    else
        launch_pdl(kernel_gemv_glu<NT, P, false>, blocks, GEMV_WARPS * 32, 0, s, out, W, x, bg, bu, F, K, act, limit);
}

void cuda_gemv_parts(const GemvOut *o, const bf16 *W, const bf16 *x, int M, int K, int T, cudaStream_t s) {
    switch (T) {
    case 1: launch_gemv<1>(*o, W, x, M, K, s); break;
    case 2: launch_gemv<2>(*o, W, x, M, K, s); break;
    case 3: launch_gemv<3>(*o, W, x, M, K, s); break;
    case 4: launch_gemv<4>(*o, W, x, M, K, s); break;
    case 5: launch_gemv<5>(*o, W, x, M, K, s); break;
    case 6: launch_gemv<6>(*o, W, x, M, K, s); break;
    case 7: launch_gemv<7>(*o, W, x, M, K, s); break;
    case 8: launch_gemv<8>(*o, W, x, M, K, s); break;
    default: break; /* callers route T > GEMV_MAX_T to cuBLASLt */
    }
}

void cuda_gemv(void *y, bool y_f32, const bf16 *W, const bf16 *x, const float *bias, int M, int K, int T,
               cudaStream_t s) {
    GemvOut o = gemv_out_one(y, y_f32, bias, M);
    cuda_gemv_parts(&o, W, x, M, K, T, s);
}

void cuda_gemv_glu(bf16 *out, const bf16 *W, const bf16 *x, const float *bg, const float *bu, int F, int K, int T,
                   Activation act, float limit, cudaStream_t s) {
    switch (T) {
    case 1: launch_gemv_glu<1>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 2: launch_gemv_glu<2>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 3: launch_gemv_glu<3>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 4: launch_gemv_glu<4>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 5: launch_gemv_glu<5>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 6: launch_gemv_glu<6>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 7: launch_gemv_glu<7>(out, W, x, bg, bu, F, K, act, limit, s); break;
    case 8: launch_gemv_glu<8>(out, W, x, bg, bu, F, K, act, limit, s); break;
    default: break;
    }
}

void cuda_gemv_experts(bf16 *out, const bf16 *Wa, const bf16 *Wb, const float *ba, const float *bb, const bf16 *x,
                       int x_div, const int32_t *sel, int n_pairs, int M, int K, Activation act, float limit,
                       cudaStream_t s) {
    dim3 grid((M + GEMV_WARPS - 1) / GEMV_WARPS, n_pairs);
    bool vec = gemv_vec_ok(Wa, x, K) && (!Wb || gemv_vec_ok(Wb, x, K));
    auto *k = Wb ? (vec ? kernel_gemv_experts<true, true> : kernel_gemv_experts<true, false>)
                 : (vec ? kernel_gemv_experts<false, true> : kernel_gemv_experts<false, false>);
    launch_pdl(k, grid, GEMV_WARPS * 32, 0, s, out, Wa, Wb, ba, Wb ? bb : NULL, x, x_div, sel, M, K, act, limit);
}

/* ---------------- the norm folded in: launchers ---------------- */

static size_t gemv_norm_smem(int T, int K) { return (size_t)T * (size_t)K * sizeof(bf16); }

bool cuda_gemv_norm_takes(const void *W, const RowNorm *n, int K, int T) {
    return n && n->x && T >= 1 && T <= GEMV_MAX_T && gemv_vec_ok(W, W, K) && rms_fold_takes(K, n->x, n->w, 2) &&
           gemv_norm_smem(T, K) <= GEMV_NORM_MAX_SMEM;
}

/* A persistent grid: as many blocks as fit an SM (up to GEMV_NORM_BLOCKS_PER_SM), no more than the
 * groups of rows need. */
template <typename Kernel>
static int gemv_norm_launch_dims(Kernel kernel, size_t smem, int64_t groups, int *blocks, Err *err) {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GEMV_NORM_THREADS, smem), err);
    if (per_sm > GEMV_NORM_BLOCKS_PER_SM) per_sm = GEMV_NORM_BLOCKS_PER_SM;
    if (per_sm < 1) return err_set(err, "gemv with the norm: %zu bytes of x do not fit an SM", smem);
    const int64_t per_block = GEMV_NORM_THREADS / 32, need = (groups + per_block - 1) / per_block;
    *blocks = (int)(need < (int64_t)sms * per_sm ? need : (int64_t)sms * per_sm);
    return 0;
}

template <int NT>
static int launch_gemv_norm(const GemvOut &o, const bf16 *W, const RowNorm &n, int M, int K, cudaStream_t s,
                            Err *err) {
    const int R = NT <= 2 ? 1 : NT <= 4 ? 2 : 4;
    auto kernel = kernel_gemv_norm<NT, R>;
    const size_t smem = gemv_norm_smem(NT, K);
    int blocks = 0;
    if (gemv_norm_launch_dims(kernel, smem, (M + R - 1) / R, &blocks, err)) return -1;
    CUDA_CHECK(launch_pdl(kernel, blocks, GEMV_NORM_THREADS, smem, s, o, W, n, M, K), err);
    return 0;
}

template <int NT>
static int launch_gemv_glu_norm(bf16 *out, const bf16 *W, const RowNorm &n, const float *bg, const float *bu, int F,
                                int K, Activation act, float limit, cudaStream_t s, Err *err) {
    const int P = NT <= 2 ? 1 : 2;
    auto kernel = kernel_gemv_glu_norm<NT, P>;
    const size_t smem = gemv_norm_smem(NT, K);
    int blocks = 0;
    if (gemv_norm_launch_dims(kernel, smem, (F + P - 1) / P, &blocks, err)) return -1;
    CUDA_CHECK(launch_pdl(kernel, blocks, GEMV_NORM_THREADS, smem, s, out, W, n, bg, bu, F, K, act, limit), err);
    return 0;
}

static int gemv_norm_check(const void *W, const RowNorm *n, int K, int T, Err *err) {
    if (cuda_gemv_norm_takes(W, n, K, T)) return 0;
    return err_set(err, "gemv with the norm: K %d, T %d (K a multiple of 8 up to 8192, T 1..%d, T x K x 2 bytes "
                        "<= %d; W, the residual and the norm weight 16-byte aligned)", K, T, GEMV_MAX_T,
                   GEMV_NORM_MAX_SMEM);
}

int cuda_gemv_parts_norm(const GemvOut *o, const bf16 *W, const RowNorm *n, int M, int K, int T, cudaStream_t s,
                         Err *err) {
    if (gemv_norm_check(W, n, K, T, err)) return -1;
    switch (T) {
    case 1: return launch_gemv_norm<1>(*o, W, *n, M, K, s, err);
    case 2: return launch_gemv_norm<2>(*o, W, *n, M, K, s, err);
    case 3: return launch_gemv_norm<3>(*o, W, *n, M, K, s, err);
    case 4: return launch_gemv_norm<4>(*o, W, *n, M, K, s, err);
    case 5: return launch_gemv_norm<5>(*o, W, *n, M, K, s, err);
    case 6: return launch_gemv_norm<6>(*o, W, *n, M, K, s, err);
    case 7: return launch_gemv_norm<7>(*o, W, *n, M, K, s, err);
    default: return launch_gemv_norm<8>(*o, W, *n, M, K, s, err);
    }
}

int cuda_gemv_glu_norm(bf16 *out, const bf16 *W, const RowNorm *n, const float *bg, const float *bu, int F, int K,
                       int T, Activation act, float limit, cudaStream_t s, Err *err) {
    if (gemv_norm_check(W, n, K, T, err)) return -1;
    switch (T) {
    case 1: return launch_gemv_glu_norm<1>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 2: return launch_gemv_glu_norm<2>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 3: return launch_gemv_glu_norm<3>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 4: return launch_gemv_glu_norm<4>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 5: return launch_gemv_glu_norm<5>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 6: return launch_gemv_glu_norm<6>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    case 7: return launch_gemv_glu_norm<7>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    default: return launch_gemv_glu_norm<8>(out, W, *n, bg, bu, F, K, act, limit, s, err);
    }
}
