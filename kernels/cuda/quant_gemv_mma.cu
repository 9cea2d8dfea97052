/* quant_gemv_mma.cu — the tensor-core quantized GEMV (QGEMV_MMA of
 * quant.cuh): the matrix x few vectors product on bf16 mma.sync, for Q4_K
 * and Q8_0, bf16 x, columns a multiple of 256.
 *
 * Why: the scalar kernel (quant_gemv.cu) issues ~5-6 instructions per 4-bit
 * weight and holds its loads in registers, so its warps alternate between
 * waiting and computing and Q4_K streams at 20% of the bandwidth. Here:
 *   - the weights travel global -> shared memory by cp.async, several
 *     stages ahead per warp, so loads stay in flight while the warp
 *     computes (no registers held, no block-wide barrier in the loop);
 *   - a weight costs about one integer op: kernels/quant_mma.h turns nibble
 *     pairs into bf16 pairs (128 + code) for mma.sync m16n8k16, and the
 *     multiply-adds for all T x rows are the mma's; per sub-block an mma
 *     with A = ones gives sum(x), which removes the 128 and applies the min
 *     (the CPU test tests/test_quant_mma.c replays this mapping).
 * Work split: a block = 8 warps over 16 x MT rows (MT = 1 or 2:
 * launch_mma_mt); warp w takes the 256-value stages w, w + 8, ... of those
 * rows (split-K), and the 8 partial sums are added in a fixed order at the
 * end (deterministic).
 * Shared memory of a stage: the rows' bytes (Q4_K: the 144-byte block, row
 * stride 160; Q8_0: 8 x 32 qs bytes then the 8 fp16 scales, stride 288:
 * both strides are 32 mod 128 bytes, so the 8-byte weight reads of a
 * half-warp hit 32 different banks), then T rows of 256 x values (stride
 * 576: a quarter-warp's 16-byte x reads hit distinct banks). Q4_K also keeps
 * a per-warp table of the stage's decoded (mul, add - 128 mul) pairs.
 */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_gemv_kernels.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/cuda/tensor_core.cuh"
#include "kernels/quant_mma.h"

#define QM_WARPS 8
#define QM_BLOCK_SMEM (74 * 1024) /* three blocks per SM (228 KB) where the stages allow: Q4_K, T <= 2 */
#define QM_TALL_ROWS 16384 /* rows from which Q4_K takes two m-tiles per warp below T = 4 */
#define QM_X_STRIDE 576            /* bytes per x row of a stage */
#define QM_SCL_STRIDE 9            /* float2 per row of the Q4_K scale table: 8 + 1 of padding (no bank conflicts) */

static __host__ __device__ constexpr int qm_row_stride(int q) { return q == DT_Q4_K ? 160 : 288; }
static __host__ __device__ constexpr int qm_stage_bytes(int q, int t, int mt) {
    return 16 * mt * qm_row_stride(q) + t * QM_X_STRIDE;
}
static __host__ __device__ constexpr int qm_scl_bytes(int q, int mt) {
    return q == DT_Q4_K ? 16 * mt * QM_SCL_STRIDE * 8 : 0;
}
static __host__ __device__ constexpr int qm_stages(int q, int t, int mt) { /* as many as fit the budget, 2..4 */
    int fit = (QM_BLOCK_SMEM / QM_WARPS - qm_scl_bytes(q, mt)) / qm_stage_bytes(q, t, mt);
    return fit < 2 ? 2 : fit > 4 ? 4 : fit;
}
static __host__ __device__ constexpr int qm_warp_bytes(int q, int t, int mt) {
    return qm_stages(q, t, mt) * qm_stage_bytes(q, t, mt) + qm_scl_bytes(q, mt);
}
/* Blocks an SM holds by shared memory (227 KB, 1 KB reserved per block),
 * at most 3 (the registers' limit at 85 a thread): the launch bound. */
static __host__ __device__ constexpr int qm_blocks_per_sm(int q, int t, int mt) {
    int n = 227 * 1024 / (QM_WARPS * qm_warp_bytes(q, t, mt) + 1024);
    return n < 1 ? 1 : n > 3 ? 3 : n;
}

typedef struct {
    const uint8_t *qs, *sc;
    const __nv_bfloat16 *x;
    GemvOut out;
    int64_t rows;
    int cols;
} MmaArgs;

/* The lane's share of a stage's weight copies, the same for every stage:
 * each copy instruction takes whole rows' pieces (RPI rows of PER_ROW
 * 16-byte chunks: lanes past RPI x PER_ROW idle), so a row's bytes are read
 * by neighbouring lanes at once (spreading a row over several instructions
 * was measured 5-30% slower); the lane's row grows by RPI per instruction.
 * src / dst: the lane's first chunk from the stage's first byte in the
 * block's first row, and in the stage; step: the source stride per
 * instruction. Rows past the last are zero-filled (from no address: the
 * block's first byte stands in), never stored. Computed
 * once: the per-chunk divisions and multiplies were ~15% of the loop. */
template <int Q, int MT>
struct QmCopies {
    static constexpr int ROWS = 16 * MT, PER_ROW = Q == DT_Q4_K ? 9 : 16, RPI = 32 / PER_ROW;
    static constexpr int N = (ROWS + RPI - 1) / RPI;
    uint32_t src, dst, step, sc_src;
    int row;
};

template <int Q, int MT>
static __device__ __forceinline__ void qm_copies_init(QmCopies<Q, MT> &c, int cols, int last_r, int lane) {
    const uint32_t row_bytes = (uint32_t)(cols / QM_SB) * (Q == DT_Q4_K ? 144u : 256u);
    c.row = lane < c.RPI * c.PER_ROW ? lane / c.PER_ROW : 1 << 20; /* idle lanes: past every row */
    const int ch = lane % c.PER_ROW;
    c.src = (uint32_t)min(c.row, last_r) * row_bytes + ch * 16;
    c.dst = min(c.row, c.ROWS) * qm_row_stride(Q) + ch * 16;
    c.step = c.RPI * row_bytes;
    c.sc_src = (uint32_t)min(lane, last_r) * (row_bytes / 16);
}

/* Starts the copies of stage sb (values 256 sb .. 256 sb + 255) of the
 * block's 16 MT rows into st. w0 = the block's first row in the qs plane,
 * s0 in the sc plane (Q8_0). */
template <int Q, int MT>
static __device__ __forceinline__ void qm_stage_load_w(uint8_t *st, const QmCopies<Q, MT> &c, const uint8_t *w0,
                                                       const uint8_t *s0, int last_r, int sb, int lane) {
    constexpr int ROWS = c.ROWS, RS = qm_row_stride(Q);
    const uint32_t dst = smem_u32(st);
    const uint8_t *src = w0 + (int64_t)sb * (Q == DT_Q4_K ? 144 : 256);
#pragma unroll
    for (int it = 0; it < c.N; it++) {
        const int r = c.row + it * c.RPI;
        if (r < ROWS) cp_async16(dst + c.dst + it * c.RPI * RS, r <= last_r ? src + c.src + it * c.step : w0, r <= last_r);
    }
    if (Q == DT_Q8_0 && lane < ROWS) cp_async16(dst + lane * RS + 256, s0 + (int64_t)sb * 16 + c.sc_src, lane <= last_r);
}

/* ... and of the T x rows (after the weights of the stage's rows). */
template <int Q, int T, int MT>
static __device__ __forceinline__ void qm_stage_load_x(uint8_t *st, const MmaArgs &a, int sb, int lane) {
    const uint32_t dst = smem_u32(st) + 16 * MT * qm_row_stride(Q);
    const __nv_bfloat16 *x = a.x + (int64_t)sb * QM_SB + lane * 8;
#pragma unroll
    for (int t = 0; t < T; t++) cp_async16(dst + t * QM_X_STRIDE + lane * 16, x + (int64_t)t * a.cols, true);
}

/* The lane's 8 x values of sub-block (block) j, as 4 bf16 pairs; zeros for
 * the lanes of the C columns t >= T, which are never stored. */
template <int T>
static __device__ __forceinline__ void qm_lane_x(const uint8_t *xs, int j, int lane, uint32_t X[4]) {
    int g = lane / 4, c = lane % 4;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (g < T) v = *reinterpret_cast<const uint4 *>(xs + g * QM_X_STRIDE + 2 * qm_x_off(j, c));
    X[0] = v.x, X[1] = v.y, X[2] = v.z, X[3] = v.w;
}

/* The lane's two words of rows g and g + 8 of m-tile m at byte offset off of a row. */
template <int Q>
static __device__ __forceinline__ void qm_lane_words(const uint8_t *st, int m, int off, int lane, uint32_t wg[2],
                                                     uint32_t wg8[2]) {
    const uint8_t *p = st + (16 * m + lane / 4) * qm_row_stride(Q) + off;
    uint2 u = *reinterpret_cast<const uint2 *>(p), v = *reinterpret_cast<const uint2 *>(p + 8 * qm_row_stride(Q));
    wg[0] = u.x, wg[1] = u.y, wg8[0] = v.x, wg8[1] = v.y;
}

/* qm_acc / qm_acc_scaled; with one x row only column t = 0 (c[0], c[2]) is
 * ever stored, so the other two FMAs are left out. */
template <int T>
static __device__ __forceinline__ void qm_acc_t(float acc[4], const float C[4], const float S[4], float mg, float ag,
                                                float mg8, float ag8) {
    if (T == 1) {
        acc[0] = fmaf(mg, C[0], fmaf(ag, S[0], acc[0]));
        acc[2] = fmaf(mg8, C[2], fmaf(ag8, S[2], acc[2]));
    } else {
        qm_acc(acc, C, S, mg, ag, mg8, ag8);
    }
}
template <int T>
static __device__ __forceinline__ void qm_acc_scaled_t(float acc[4], const float C[4], float d, float d8) {
    if (T == 1) {
        acc[0] = fmaf(d, C[0], acc[0]);
        acc[2] = fmaf(d8, C[2], acc[2]);
    } else {
        qm_acc_scaled(acc, C, d, d8);
    }
}

/* Q4_K: the lane's two words of chunk q of rows g and g + 8 of each m-tile. */
template <int MT>
static __device__ __forceinline__ void qm_q4k_chunk_words(const uint8_t *st, int q, int lane, uint32_t (*wg)[2],
                                                          uint32_t (*wg8)[2]) {
#pragma unroll
    for (int m = 0; m < MT; m++) qm_lane_words<DT_Q4_K>(st, m, qm_q4k_word_off(q, lane % 4), lane, wg[m], wg8[m]);
}

/* Q4_K: every row's (mul, add - 128 mul) of the stage into scl; lane pair
 * (2r, 2r + 1) decodes the two halves of row r's header. */
template <int MT>
static __device__ __forceinline__ void qm_q4k_stage_scales(const uint8_t *st, float2 *scl, int lane) {
#pragma unroll
    for (int m = 0; m < MT; m++) {
        int r = 16 * m + lane / 2, half = lane % 2;
        uint4 h = *reinterpret_cast<const uint4 *>(st + r * qm_row_stride(DT_Q4_K));
        uint32_t hdr[4] = {h.x, h.y, h.z, h.w};
        float mul[4], addp[4];
        qm_q4k_scales(hdr, half, mul, addp);
#pragma unroll
        for (int k = 0; k < 4; k++) scl[r * QM_SCL_STRIDE + 4 * half + k] = make_float2(mul[k], addp[k]);
    }
}

template <int T, int MT>
static __device__ __forceinline__ void qm_stage_q4k(float (*acc)[4], const uint8_t *st, float2 *scl, int lane) {
    const uint8_t *xs = st + 16 * MT * qm_row_stride(DT_Q4_K);
    const uint32_t ones[4] = {QM_BF16_ONES, QM_BF16_ONES, QM_BF16_ONES, QM_BF16_ONES};
    const int g = lane / 4;
    qm_q4k_stage_scales<MT>(st, scl, lane);
    __syncwarp();
#pragma unroll 1 /* rolled: unrolled needs ~98 registers and spills under the 3-blocks-per-SM bound */
    for (int q = 0; q < 4; q++) {
        uint32_t wg[MT][2], wg8[MT][2];
        qm_q4k_chunk_words<MT>(st, q, lane, wg, wg8);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = 2 * q + h;
            uint32_t X[4], b0[2], b1[2];
            qm_lane_x<T>(xs, j, lane, X);
            qm_q4k_b(X, 0, b0);
            qm_q4k_b(X, 1, b1);
            float S[4] = {0.f, 0.f, 0.f, 0.f};
            mma_bf16(S, ones, b0[0], b0[1]);
            mma_bf16(S, ones, b1[0], b1[1]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                float C[4] = {0.f, 0.f, 0.f, 0.f};
                uint32_t a[4];
                qm_q4k_a(wg[m], wg8[m], 0, h, a);
                mma_bf16(C, a, b0[0], b0[1]);
                qm_q4k_a(wg[m], wg8[m], 1, h, a);
                mma_bf16(C, a, b1[0], b1[1]);
                float2 sg = scl[(16 * m + g) * QM_SCL_STRIDE + j], sg8 = scl[(16 * m + g + 8) * QM_SCL_STRIDE + j];
                qm_acc_t<T>(acc[m], C, S, sg.x, sg.y, sg8.x, sg8.y);
            }
        }
    }
    __syncwarp(); /* the scale table is rewritten by the next stage */
}

template <int T, int MT>
static __device__ __forceinline__ void qm_stage_q8(float (*acc)[4], const uint8_t *st, int lane) {
    constexpr int RS = qm_row_stride(DT_Q8_0);
    const uint8_t *xs = st + 16 * MT * RS;
    const int g = lane / 4, c = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t X[4], b0[2], b1[2];
        qm_lane_x<T>(xs, j, lane, X);
        qm_q8_b(X, 0, b0);
        qm_q8_b(X, 1, b1);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            uint32_t wg[2], wg8[2], a[4];
            qm_lane_words<DT_Q8_0>(st, m, qm_q8_word_off(j, c), lane, wg, wg8);
            float C[4] = {0.f, 0.f, 0.f, 0.f};
            qm_q8_a(wg, wg8, 0, a);
            mma_bf16(C, a, b0[0], b0[1]);
            qm_q8_a(wg, wg8, 1, a);
            mma_bf16(C, a, b1[0], b1[1]);
            const uint8_t *dg = st + (16 * m + g) * RS + 256 + 2 * j;
            float d = qm_half(*reinterpret_cast<const unsigned short *>(dg));
            float d8 = qm_half(*reinterpret_cast<const unsigned short *>(dg + 8 * RS));
            qm_acc_scaled_t<T>(acc[m], C, d, d8);
        }
    }
}

/* The 8 warps' partial sums of the block's rows, added in warp order, plus
 * the bias, stored as y[t][row]. red: [warps][rows][8] floats. */
template <int T, int MT>
static __device__ __forceinline__ void qm_reduce_store(float *red, const float (*acc)[4], const MmaArgs &a,
                                                       int64_t row0) {
    constexpr int ROWS = 16 * MT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 4; r++) red[(warp * ROWS + 16 * m + g + 8 * (r / 2)) * 8 + 2 * c + r % 2] = acc[m][r];
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * T; i += blockDim.x) {
        int r = i / T, t = i % T;
        int64_t row = row0 + r;
        if (row >= a.rows) continue;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < QM_WARPS; w++) s += red[(w * ROWS + r) * 8 + t];
        gemv_out_store(a.out, t, row, s);
    }
}

template <int Q, int T, int MT>
__global__ void __launch_bounds__(QM_WARPS * 32, qm_blocks_per_sm(Q, T, MT)) kernel_quant_gemv_mma(MmaArgs a) {
    constexpr int S = qm_stages(Q, T, MT), STAGE = qm_stage_bytes(Q, T, MT);
    extern __shared__ __align__(16) uint8_t qm_smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint8_t *ring = qm_smem + warp * qm_warp_bytes(Q, T, MT);
    float2 *scl = reinterpret_cast<float2 *>(ring + S * STAGE);
    const int64_t row0 = (int64_t)blockIdx.x * 16 * MT;
    const int nsb = a.cols / QM_SB, n_my = warp < nsb ? (nsb - warp + QM_WARPS - 1) / QM_WARPS : 0;
    const int last_r = (int)min((int64_t)16 * MT, a.rows - row0) - 1;
    const uint8_t *w0 = a.qs + row0 * nsb * (Q == DT_Q4_K ? 144 : 256), *s0 = a.sc ? a.sc + row0 * nsb * 16 : NULL;
    QmCopies<Q, MT> cp;
    qm_copies_init<Q, MT>(cp, a.cols, last_r, lane);
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
    /* prologue: S - 1 stages in flight; their weights (constant) before
     * pdl_wait, so they stream in while the previous kernel finishes (pdl.cuh) */
#pragma unroll
    for (int i = 0; i < S - 1; i++)
        if (i < n_my) qm_stage_load_w<Q, MT>(ring + i * STAGE, cp, w0, s0, last_r, warp + i * QM_WARPS, lane);
    pdl_enter();
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < n_my) qm_stage_load_x<Q, T, MT>(ring + i * STAGE, a, warp + i * QM_WARPS, lane);
        cp_async_commit();
    }
    for (int i = 0; i < n_my; i++) {
        int next = i + S - 1; /* into the slot computed last iteration (the __syncwarp below) */
        if (next < n_my) {
            qm_stage_load_w<Q, MT>(ring + (next % S) * STAGE, cp, w0, s0, last_r, warp + next * QM_WARPS, lane);
            qm_stage_load_x<Q, T, MT>(ring + (next % S) * STAGE, a, warp + next * QM_WARPS, lane);
        }
        cp_async_commit();
        cp_async_wait<S - 1>(); /* this lane's copies of stage i have landed ... */
        __syncwarp();           /* ... and every lane's */
        uint8_t *st = ring + (i % S) * STAGE;
        if (Q == DT_Q4_K) qm_stage_q4k<T, MT>(acc, st, scl, lane);
        else qm_stage_q8<T, MT>(acc, st, lane);
        __syncwarp();
    }
    cp_async_wait<0>();
    __syncthreads(); /* every warp is done with its ring: it becomes the reduction buffer */
    qm_reduce_store<T, MT>(reinterpret_cast<float *>(qm_smem), acc, a, row0);
}

template <int Q, int T, int MT>
static int launch_mma(const MmaArgs &a, cudaStream_t s, Err *err) {
    constexpr int smem = QM_WARPS * qm_warp_bytes(Q, T, MT), rows = 16 * MT;
    static_assert(smem >= QM_WARPS * rows * 8 * 4, "the reduction buffer fits in the rings");
    static_assert(smem <= 227 * 1024, "shared memory of one block");
    CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemv_mma<Q, T, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               err);
    int64_t blocks = (a.rows + rows - 1) / rows;
    CUDA_CHECK(launch_pdl(kernel_quant_gemv_mma<Q, T, MT>, (unsigned)blocks, QM_WARPS * 32, smem, s, a), err);
    return 0;
}

/* m-tiles per warp: 2 from T = 4 (x read from shared memory half as often
 * per weight); below, 2 for tall Q4_K matrices (the LM head, gate+up: x's
 * conversions shared by two tiles and twice the bytes in flight per stage,
 * measured 10-20% faster there) and 1 elsewhere (more blocks for short
 * matrices; Q8_0 measured slower with 2). */
template <int Q, int T>
static int launch_mma_mt(const MmaArgs &a, cudaStream_t s, Err *err) {
    if constexpr (Q == DT_Q4_K && T < 4)
        if (a.rows >= QM_TALL_ROWS) return launch_mma<Q, T, 2>(a, s, err);
    return launch_mma<Q, T, T >= 4 ? 2 : 1>(a, s, err);
}

template <int Q>
static int launch_mma_t(const MmaArgs &a, int T, cudaStream_t s, Err *err) {
    switch (T) {
    case 1: return launch_mma_mt<Q, 1>(a, s, err);
    case 2: return launch_mma_mt<Q, 2>(a, s, err);
    case 3: return launch_mma_mt<Q, 3>(a, s, err);
    case 4: return launch_mma_mt<Q, 4>(a, s, err);
    case 5: return launch_mma_mt<Q, 5>(a, s, err);
    case 6: return launch_mma_mt<Q, 6>(a, s, err);
    case 7: return launch_mma_mt<Q, 7>(a, s, err);
    case 8: return launch_mma_mt<Q, 8>(a, s, err);
    default: return err_set(err, "quant_gemv (mma): %d rows of x (1..%d)", T, QUANT_GEMV_MAX_T);
    }
}

bool quant_gemv_mma_takes(DType t, int64_t cols, int T, bool x_f32) {
    return (t == DT_Q4_K || t == DT_Q8_0) && cols % QM_SB == 0 && !x_f32 && T >= 1 && T <= QUANT_GEMV_MAX_T;
}

int quant_gemv_mma(const QuantMatrix *W, const void *x, const GemvOut *out, int T, cudaStream_t s, Err *err) {
    if (!quant_gemv_mma_takes(W->type, W->cols, T, false))
        return err_set(err, "quant_gemv (mma): type %d with %lld columns at %d rows (Q4_K or Q8_0, a multiple of %d; "
                            "1..%d rows)", (int)W->type, (long long)W->cols, T, QM_SB, QUANT_GEMV_MAX_T);
    if ((uintptr_t)x % 16 || (uintptr_t)W->qs % 16 || (W->sc && (uintptr_t)W->sc % 16))
        return err_set(err, "quant_gemv (mma): x and the weight planes must be 16-byte aligned");
    MmaArgs a = {(const uint8_t *)W->qs, (const uint8_t *)W->sc, (const __nv_bfloat16 *)x, *out, W->rows,
                 (int)W->cols};
    return W->type == DT_Q4_K ? launch_mma_t<DT_Q4_K>(a, T, s, err) : launch_mma_t<DT_Q8_0>(a, T, s, err);
}
