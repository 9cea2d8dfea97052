/* quant_gemm.cu — the prefill GEMM on quantized weights, for Hopper (sm_90a):
 * y[T][rows] = x[T][cols] @ W^T with W kept in its GGUF blocks (quant.cuh's
 * split layout), Q4_K, Q5_K, Q6_K and Q8_0; this file: the kernel around a
 * tile's main loop (quant_gemm_mainloop.cuh), its epilogues, the split of K,
 * and the host side (tile size and split picker, tensor maps, launches).
 *
 * Why: the other prefill route dequantizes each matrix to a bf16 scratch and
 * runs cuBLASLt on it: 16 GB of bf16 written and read back per 512-token step
 * of an 8B model, ~5 ms of a ~17.5 ms step, and up to two 256 MiB scratch
 * buffers. Here each multiplying thread dequantizes its own wgmma A fragment
 * in registers (bf16x2 arithmetic, values within ~2^-8 of
 * quant_dequant_bf16's), so the quantized bytes are the only weight traffic
 * and no scratch exists. The stages come by TMA, and K may be split over
 * blocks for GEMMs of few tiles. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_gemm_mainloop.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/cuda/tensor_core.cuh"

/* The epilogue beyond plain y (quant_gemm_epi): with parts, y's rows in GemvOut's three parts with
 * biases (end[2] = rows); with glu_f > 0, W = Wgate|Wup of 2 glu_f rows, whose tile i multiplies gate rows
 * 64 i .. (warpgroup 0) and up rows glu_f + 64 i .. (warpgroup 1), and out = y[0] [T][glu_f] gets act(gate +
 * bg, up + bu). Replaces the QKV split and GLU kernels (a read and a write of y each) at prefill. */
typedef struct {
    void *y[3];
    const float *bias[3];
    int end[3];
    int parts, glu_f, act;
    const float *bg, *bu;
    float limit;
} QrEpi;

/* ---- the epilogues ---- */

#if QM_WGMMA

/* A warpgroup's accumulators to y: acc[h][4c + e] is W row m0 + 16 warp + g
 * (e < 2) or + 8, token n0 + 2 NA h + 8c + 2t + e % 2 (NA accumulators a
 * wgmma: n = 2 NA tokens); only tokens in [lo, T) stored */
template <int NH, int NA>
static __device__ __forceinline__ void qm_store(void *y, bool y_f32, const float (&acc)[NH][NA], int T, int M, int n0,
                                                int lo, int m0) {
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mA = m0 + 16 * warp + g;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int c = 0; c < NA / 4; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int n = n0 + 2 * NA * h + 8 * c + 2 * t + (e & 1), m = mA + (e >> 1) * 8;
                if (n < lo || n >= T) continue;
                size_t o = (size_t)n * M + m;
                if (y_f32) ((float *)y)[o] = acc[h][4 * c + e];
                else ((__nv_bfloat16 *)y)[o] = __float2bfloat16_rn(acc[h][4 * c + e]);
            }
}

/* bf16 y: the block's [2 NA NH tokens][128 rows] tile through
 * shared memory (the stage buffers, free once every thread is past the
 * loop), so y's rows go out in 16-byte stores (qm_store's 2-byte ones
 * scatter over half-used sectors). stmatrix .trans takes each 8 x 8
 * accumulator block (rows g, tokens 2t, 2t + 1) and stores it as 8 token rows
 * of 8 W rows; token rows are QR_Y_STRIDE bytes apart (16 of padding: the 8
 * rows of one stmatrix phase fall on distinct banks). */
#define QR_Y_STRIDE (128 * 2 + 16)
template <int NH, int NA>
static __device__ __forceinline__ void qr_stage_y(const float (&acc)[NH][NA], uint8_t *smem) {
    const int j = threadIdx.x, lane = j & 31, i = lane >> 3, r = lane & 7;
    const int m = 64 * (j >> 7) + 16 * ((j >> 5) & 3) + 8 * (i & 1); /* lane's matrix: W rows m .. m + 7 */
    static_assert(NA % 8 == 0, "stmatrix x4 takes two 8-token groups");
    __syncthreads(); /* every warpgroup's wgmma done with the stages */
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int c = 0; c < NA / 4; c += 2) {
            const int tok = 2 * NA * h + 8 * (c + (i >> 1)) + r;
            const uint32_t addr = smem_u32(smem + tok * QR_Y_STRIDE + 2 * m);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                         "r"(bf16_pair(acc[h][4 * c], acc[h][4 * c + 1])), "r"(bf16_pair(acc[h][4 * c + 2], acc[h][4 * c + 3])),
                         "r"(bf16_pair(acc[h][4 * c + 4], acc[h][4 * c + 5])), "r"(bf16_pair(acc[h][4 * c + 6], acc[h][4 * c + 7]))
                         : "memory");
        }
    __syncthreads();
}

template <int NH, int NA>
static __device__ __forceinline__ void qr_store_bf16(__nv_bfloat16 *y, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                     int M, int n0, int lo, int m0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 4
    for (int k = threadIdx.x; k < 2 * NA * NH * 16; k += QR_THREADS) { /* 16 chunks of 16 bytes a token row */
        const int tok = k >> 4, ch = k & 15;
        if (n0 + tok >= lo && n0 + tok < T)
            *(uint4 *)(y + (size_t)(n0 + tok) * M + m0 + 8 * ch) = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
    }
}

/* y's rows in parts (Wq|Wk|Wv: q, k, v, each with its bias; the split kernel's values): a 16-byte chunk is
 * 8 rows of one part (the parts' ends are multiples of 8, quant_gemm_epi checks) */
template <int NH, int NA>
static __device__ __forceinline__ void qr_store_parts(const QrEpi &e, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                      int n0, int lo, int m0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 2
    for (int k = threadIdx.x; k < 2 * NA * NH * 16; k += QR_THREADS) {
        const int tok = k >> 4, ch = k & 15, row = m0 + 8 * ch;
        if (n0 + tok < lo || n0 + tok >= T) continue;
        const GemvPart<int> p = gemv_part(e.y, e.bias, e.end, row);
        uint4 v = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
        if (p.bias) {
            __nv_bfloat16 *ve = (__nv_bfloat16 *)&v;
#pragma unroll
            for (int c = 0; c < 8; c++) ve[c] = __float2bfloat16(__bfloat162float(ve[c]) + p.bias[p.r + c]);
        }
        *(uint4 *)((__nv_bfloat16 *)p.y + (size_t)(n0 + tok) * p.n + p.r) = v;
    }
}

/* A gated pair's tile (warpgroup 0: gate rows f0 .., 1: up rows glu_f + f0 ..): out[t][f0 ..] =
 * act(gate + bg, up + bu) of the bf16 products, as the GLU kernel computes it */
template <int NH, int NA>
static __device__ __forceinline__ void qr_store_glu(const QrEpi &e, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                    int n0, int lo, int f0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 2
    for (int k = threadIdx.x; k < 2 * NA * NH * 8; k += QR_THREADS) { /* 8 chunks of 8 gate and 8 up values a token */
        const int tok = k >> 3, ch = k & 7, f = f0 + 8 * ch;
        if (n0 + tok < lo || n0 + tok >= T) continue;
        const uint4 gv = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
        const uint4 uv = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 128 + 16 * ch);
        const __nv_bfloat16 *ge = (const __nv_bfloat16 *)&gv, *ue = (const __nv_bfloat16 *)&uv;
        uint4 o;
        __nv_bfloat16 *oe = (__nv_bfloat16 *)&o;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            float g = __bfloat162float(ge[c]), u = __bfloat162float(ue[c]);
            if (e.bg) g += e.bg[f + c];
            if (e.bu) u += e.bu[f + c];
            oe[c] = __float2bfloat16(act_glu(g, u, (Activation)e.act, e.limit));
        }
        *(uint4 *)((__nv_bfloat16 *)e.y[0] + (size_t)(n0 + tok) * e.glu_f + f) = o;
    }
}
#endif

/* Split K (`split` of `splits`; `tile`: the tile among the split ones): the block's fp32
 * accumulators to its place in `part` (at (tile splits + split) 256 PF float4s,
 * PF = NH NA / 4 a thread, thread j's float4 i at i 256 + j: coalesced), then
 * the last split of the tile to count itself in (a counter per tile, back to
 * 0 after it) adds every split's partial in split order: the same sums
 * whichever arrives last (tokens past T too: skipping them cost the loop 70
 * registers). Returns whether this block holds the tile's sums. */
template <int NH, int NA>
static __device__ bool qr_split_reduce(float (&acc)[NH][NA], float *part, unsigned *count, int tile, int split,
                                       int splits) {
    constexpr int PF = NH * NA / 4, C = NA / 4;
    const int j = threadIdx.x;
    float4 *mine = (float4 *)part + ((size_t)tile * splits + split) * (PF * QR_THREADS);
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < C; i++)
            __stcg(mine + (C * h + i) * QR_THREADS + j,
                       make_float4(acc[h][4 * i], acc[h][4 * i + 1], acc[h][4 * i + 2], acc[h][4 * i + 3]));
    __threadfence();
    /* every thread's partial stored and fenced before thread 0 counts the block in: counting inside the
     * __syncthreads_or (as before) let it do so before the other threads had stored, so a last split
     * could read stale partials (the tail-split branch's 16-token tiles hit it) */
    __syncthreads();
    const bool last = j == 0 && atomicAdd(count + tile, 1u) == (unsigned)splits - 1;
    if (!__syncthreads_or(last)) return false;
    __threadfence(); /* the other splits' partials, visible once their counts are */
    const float4 *all = (const float4 *)part + (size_t)tile * splits * (PF * QR_THREADS);
    /* a split's loads issued together, then added in split order: about one
     * L2 round trip a split, not one a float4 */
#pragma unroll
    for (int h = 0; h < NH; h++)
        for (int z = 0; z < splits; z++) {
            float4 w[C];
#pragma unroll
            for (int i = 0; i < C; i++)
                w[i] = __ldcg(all + (size_t)z * (PF * QR_THREADS) + (C * h + i) * QR_THREADS + j);
#pragma unroll
            for (int i = 0; i < C; i++) {
                float *a = &acc[h][4 * i];
                if (z == 0) a[0] = w[i].x, a[1] = w[i].y, a[2] = w[i].z, a[3] = w[i].w;
                else a[0] += w[i].x, a[1] += w[i].y, a[2] += w[i].z, a[3] += w[i].w;
            }
        }
    if (j == 0) count[tile] = 0;
    return true;
}

/* ---- the kernel ---- */

template <int Q, int BN, int MB>
__global__ void __launch_bounds__(QR_THREADS, MB)
kernel_quant_gemm(void *y, bool y_f32, const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                  const __grid_constant__ CUtensorMap tw2, const __grid_constant__ CUtensorMap tw3, const unsigned short *dq,
                  int T, int M, int K, float *part, unsigned *count, int n_whole, int z, const QrEpi epi) {
#if QM_WGMMA
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>(), NH = qr_halves<BN>(), NA = qr_wn<BN>() / 2;
    extern __shared__ uint8_t qm_smem_raw[];
    uint8_t *smem = qm_smem_raw + ((1024 - (smem_u32(qm_smem_raw) & 1023)) & 1023);
    /* blocks [0, n_whole): tiles whole; then z blocks a tile, each a split of K (QrSplit) */
    const int b = blockIdx.x, whole = b < n_whole, gx = (T + BN - 1) / BN;
    const int tile = whole ? b : n_whole + (b - n_whole) / z, split = whole ? 0 : (b - n_whole) % z, splits = whole ? 1 : z;
    const int n0 = tile % gx * BN, turns = K / 256; /* turns of 4 stages */
    const bool two = epi.glu_f > 0; /* a gated pair: 64 gate rows from m0, the 64 up rows from m1 */
    const int m0 = two ? tile / gx * 64 : tile / gx * QM_BM, m1 = two ? epi.glu_f + m0 : m0 + 64;
    /* x's box: the last token tile's ends at T where T >= BN, over tokens of the tile before it (computed
     * again, not stored): a box past T is filled out of bounds by the TMA unit, and that is slow (gate+up
     * at T = 257 in 256-token tiles 1.7x the time with the rows past T in bounds) */
    const int nx = n0 + BN > T && T >= BN ? T - BN : n0, xrows = qr_x_rows<BN>(T);
    const int kt0 = 4 * (split * turns / splits), kt1 = 4 * ((split + 1) * turns / splits);
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) {
            mbar_init(smem_u32(smem) + S * SB + 8 * i, 1);         /* full: thread 0's expect_tx */
            mbar_init(smem_u32(smem) + S * SB + 8 * (S + i), 256); /* empty: every thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int kt = kt0; kt < kt0 + S && kt < kt1; kt++) qr_load<Q, BN, MB>(smem, &tx, &tw, &tw2, &tw3, nx, xrows, m0, m1, two, kt, kt - kt0);
    }
    __syncthreads();
    float acc[NH][NA]; /* written first by the wgmma of kt = kt0, k = 0 (add = 0) */
    qr_multiply<Q, BN, MB>(acc, smem, &tx, &tw, &tw2, &tw3, dq, K / 256, nx, xrows, m0, m1, two, kt0, kt1);
    if (splits > 1 && !qr_split_reduce<NH, NA>(acc, part, count, tile - n_whole, split, splits)) return;
    static_assert(BN * QR_Y_STRIDE <= S * SB, "y's tile in the stage buffers");
    if (two) qr_store_glu<NH, NA>(epi, acc, smem, T, nx, n0, m0);
    else if (epi.parts) qr_store_parts<NH, NA>(epi, acc, smem, T, nx, n0, m0);
    else if (y_f32 || (uintptr_t)y % 16) qm_store<NH, NA>(y, y_f32, acc, T, M, nx, n0, m0 + 64 * (threadIdx.x >> 7));
    else qr_store_bf16<NH, NA>((__nv_bfloat16 *)y, acc, smem, T, M, nx, n0, m0);
#endif
}

/* ---- host side ---- */

bool quant_gemm_available(void) {
    /* the kernel has a body only in an sm_90a build, and only that build's code runs on the device */
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel_quant_gemm<DT_Q4_K, 128, 1>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90 && fa.ptxVersion >= 90;
}

/* W is loaded by TMA: rows in 128-row boxes, and a Q8_0 scale plane's rows (cols / 16 bytes) must be 16-byte
 * multiples (the other types' blocks are 256 values already) */
bool quant_gemm_supported(DType t, int64_t rows, int64_t cols) {
    if (t != DT_Q4_K && t != DT_Q8_0 && t != DT_Q5_K && t != DT_Q6_K) return false;
    return rows > 0 && cols > 0 && rows % QM_BM == 0 && rows <= 65535LL * QM_BM && cols % 256 == 0 && cols <= (1 << 30);
}

/* A 2D tensor map: dims {inner, outer} of dt, rows `stride` bytes apart, box {bi, bo}. */
static int qr_map(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, CUtensorMapDataType dt, const void *base,
                  uint64_t inner, uint64_t outer, uint64_t stride, uint32_t bi, uint32_t bo, CUtensorMapSwizzle sw,
                  const char *what, Err *err) {
    cuuint64_t dims[2] = {inner, outer}, strides[1] = {stride};
    cuuint32_t box[2] = {bi, bo}, es[2] = {1, 1};
    CUresult r = enc(m, dt, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return err_set(err, "quant_gemm: tensor map of %s: CUresult %d", what, (int)r);
    return 0;
}

/* A launch: the first n_whole tiles whole, every later one in `splits`
 * splits of K; their partials and tile counters (split K only) */
typedef struct {
    int splits;
    int64_t n_whole;
    float *part;
    unsigned *count;
    int mb; /* blocks an SM: 2 for quant_gemm's pick below, else 1 */
} QrSplit;

template <int Q, int BN, int MB>
static int qr_launch(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QrSplit *sp, const QrEpi *epi,
                     cudaStream_t s, Err *err) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q), err);
    if (!fn || q != cudaDriverEntryPointSuccess) return err_set(err, "quant_gemm: the driver has no cuTensorMapEncodeTiled");
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const uint64_t K = (uint64_t)W->cols, rows = (uint64_t)W->rows, nb = K / quant_block_elems(Q);
    const uint32_t bm = epi->glu_f ? 64 : QM_BM; /* a gated pair's W rows come in two boxes of 64 */
    CUtensorMap tx, tw, tw2, tw3;
    /* a token tile shorter than BN (T < BN): a box of T rows, not one past the end of x (slow: kernel_quant_gemm) */
    if (qr_map(enc, &tx, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, K, (uint64_t)T, K * 2, 64, (uint32_t)qr_x_rows<BN>(T),
               CU_TENSOR_MAP_SWIZZLE_128B, "x", err))
        return -1;
    if (Q == DT_Q5_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W codes", err) ||
            qr_map(enc, &tw3, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_32B, "W qh", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W headers", err))
            return -1;
    } else if (Q == DT_Q6_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 64, bm,
                   CU_TENSOR_MAP_SWIZZLE_64B, "W ql", err) ||
            qr_map(enc, &tw3, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_32B, "W qh", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W scales", err))
            return -1;
    } else if (Q == DT_Q4_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 144, rows, nb * 144, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W codes", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 144, rows, nb * 144, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W headers", err))
            return -1;
    } else if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 32, rows, nb * 32, 64, bm,
                      CU_TENSOR_MAP_SWIZZLE_64B, "W codes", err) ||
               qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->sc, nb * 2, rows, nb * 2, 16, bm,
                      CU_TENSOR_MAP_SWIZZLE_NONE, "W scales", err))
        return -1;
    if (Q != DT_Q5_K && Q != DT_Q6_K) tw3 = tw2; /* unused */
    const int smem = qr_smem_bytes<Q, BN, MB>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemm<Q, BN, MB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err);
    const int64_t tiles = (int64_t)((T + BN - 1) / BN) * (W->rows / QM_BM);
    const int64_t blocks = sp->n_whole + (tiles - sp->n_whole) * sp->splits;
    kernel_quant_gemm<Q, BN, MB><<<(unsigned)blocks, QR_THREADS, smem, s>>>(
        y, y_f32, tx, tw, tw2, tw3, (const unsigned short *)W->sc, T, (int)W->rows, (int)W->cols, sp->part, sp->count,
        (int)sp->n_whole, sp->splits, *epi);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* two blocks an SM (sp->mb) only for 64- and 128-token tiles of Q4_K and Q8_0 (qm_run) */
template <int Q, int BN>
static int qm_launch(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QrSplit *sp,
                     const QrEpi *epi, cudaStream_t s, Err *err) {
    if constexpr ((Q == DT_Q4_K || Q == DT_Q8_0) && (BN == 64 || BN == 128))
        if (sp->mb == 2) return qr_launch<Q, BN, 2>(W, x, T, y, y_f32, sp, epi, s, err);
    return qr_launch<Q, BN, 1>(W, x, T, y, y_f32, sp, epi, s, err);
}

template <int Q>
static int qm_launch_bn(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, const QrSplit *sp,
                        const QrEpi *epi, cudaStream_t s, Err *err) {
    switch (bn) {
    case 16: return qm_launch<Q, 16>(W, x, T, y, y_f32, sp, epi, s, err);
    case 32: return qm_launch<Q, 32>(W, x, T, y, y_f32, sp, epi, s, err);
    case 64: return qm_launch<Q, 64>(W, x, T, y, y_f32, sp, epi, s, err);
    case 128: return qm_launch<Q, 128>(W, x, T, y, y_f32, sp, epi, s, err);
    default: return qm_launch<Q, 256>(W, x, T, y, y_f32, sp, epi, s, err);
    }
}

static int qm_sm_count(Err *err) {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    return sms;
}

/* tokens per block: up to 128 tokens the least of 16, 32, 64, 128 that
 * holds them (a W tile is dequantized once whatever the block's tokens, and
 * wider blocks only add multiplications of padding); above, 256 from about
 * two thirds of a tile per SM (at 512 tokens qkv's 96 tiles of 256 beat 192
 * of 128 by half), and 256 where K can be split (with a work space) into at
 * least two blocks a tile and 256-token tiles hold no more padding than
 * 128-token ones: a tile of 256 dequantizes W once for twice the tokens
 * (with fewer, split tiles faster on the down and o shapes; at 320 tokens,
 * 512 slots against 384, slower); with K of 8192 or more also at up to 4/3
 * the slots, where the longer K pays for the padding. Else 128. */
static int qm_pick_bn(const QuantMatrix *W, int T, int sms, bool can_split) {
    if (T <= 128) return T > 64 ? 128 : T > 32 ? 64 : T > 16 ? 32 : 16;
    int64_t tiles256 = (int64_t)((T + 255) / 256) * (W->rows / QM_BM);
    if (3 * tiles256 >= 2 * sms) return 256;
    const int slots256 = (T + 255) / 256 * 256, slots128 = (T + 127) / 128 * 128;
    const bool padding_ok = slots256 == slots128 || (W->cols >= 8192 && 3 * slots256 <= 4 * slots128);
    return can_split && padding_ok && 2 * tiles256 <= sms ? 256 : 128;
}

/* The work space: a counter for each of up to 4 sms tiles (quant_gemm's own
 * splits take at most sms / 2; asked-for ones are checked), then the
 * partials. A fixed counter region: one sized by each launch's tiles let a
 * larger launch count on the partials a smaller one left. */
static size_t qm_count_bytes(int sms) { return (size_t)(4 * sms * 4 + 255) / 256 * 256; }

/* partials: at most sms split blocks a launch (a wave), of up to 128 x 256 values */
size_t quant_gemm_work_bytes(int sms) { return qm_count_bytes(sms) + (size_t)sms * 128 * 256 * sizeof(float); }

/* Splits of K: as many as fit beside the tiles in one wave of blocks (one a
 * SM), so a GEMM of few tiles (a small batch) still streams W on every SM;
 * at most one a turn of 4 stages, and 16. (A wave of all the blocks an SM
 * holds at once, three of 16 tokens, was no faster.) */
static int qm_pick_splits(int64_t tiles, int turns, int sms) {
    int64_t z = sms / tiles;
    return (int)(z < 1 ? 1 : z > 16 ? (turns < 16 ? turns : 16) : z > turns ? turns : z);
}

static int qm_run(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int splits,
                  const QrEpi *epi, const QuantGemmWork *work, cudaStream_t s, Err *err) {
    if (!quant_gemm_supported(W->type, W->rows, W->cols))
        return err_set(err, "quant_gemm: %s [%lld][%lld] not supported (Q4_K, Q5_K, Q6_K or Q8_0; rows a multiple of 128, "
                            "cols of 256)", dtype_info(W->type)->name, (long long)W->rows, (long long)W->cols);
    if (!quant_gemm_available()) return err_set(err, "quant_gemm: needs an sm_90a build on a compute-capability 9.0 GPU");
    if (T <= 0) return T == 0 ? 0 : err_set(err, "quant_gemm: T = %d", T);
    if ((uintptr_t)x % 16 || (W->cols * 2) % 16) return err_set(err, "quant_gemm: x must be 16-byte aligned");
    const int sms = qm_sm_count(err);
    if (sms <= 0) return -1;
    if (bn == 0) bn = qm_pick_bn(W, T, sms, work && work->buf);
    if (bn != 16 && bn != 32 && bn != 64 && bn != 128 && bn != 256)
        return err_set(err, "quant_gemm: tokens per block %d (16, 32, 64, 128 or 256)", bn);
    const int64_t tiles = (int64_t)((T + bn - 1) / bn) * (W->rows / QM_BM);
    const int turns = (int)(W->cols / 256);
    /* Split K where a wave of blocks is not full: a GEMM of fewer tiles than SMs (up to 128 tokens a
     * block, or 256 where two splits a tile fit in a wave) splits every tile; one of more tiles splits
     * the last, partial wave's (tiles % sms) so that its blocks fill the SMs (gate+up at 512 tokens: 448 tiles of 256, 3 waves and 52 tiles
     * that left 60% of the SMs idle for a whole tile's time, now 104 blocks of half a tile). At most a
     * wave of split blocks, tiles x splits <= sms: the work space holds their partials. */
    int64_t n_whole = 0;
    if (splits == 0) {
        const bool few = tiles < sms && (bn <= 128 || 2 * tiles <= sms), tail = tiles > sms && tiles % sms;
        splits = work && (few || tail) ? qm_pick_splits(few ? tiles : tiles % sms, turns, sms) : 1;
        n_whole = splits > 1 && tail ? tiles - tiles % sms : n_whole;
    }
    if (splits == 1) n_whole = tiles;
    /* Two blocks an SM (4 stages, 128 registers) for 64- and 128-token tiles of Q4_K and Q8_0 where more
     * tiles than SMs go unsplit: 4 warps a scheduler hide the fragment chains that bound one block (ncu:
     * 0.31 issued a cycle, 0.39 of 2 warps eligible; gate+up 10-15% faster); with few tiles split over the
     * SMs it was slower, hence only here. */
    const int mb = (bn == 64 || bn == 128) && (W->type == DT_Q4_K || W->type == DT_Q8_0) && splits == 1 && tiles > sms
                       ? 2 : 1;
    QrSplit sp = {splits, n_whole, NULL, NULL, mb};
    if (splits < 1 || (splits > 1 && n_whole == 0 && splits > turns))
        return err_set(err, "quant_gemm: %d splits of K (at most cols / 256 = %d)", splits, turns);
    if (splits > 1 && tiles - n_whole > 4 * sms)
        return err_set(err, "quant_gemm: %d splits of %lld tiles (at most %d tiles split)", splits,
                       (long long)(tiles - n_whole), 4 * sms);
    if (splits > 1) {
        size_t need = qm_count_bytes(sms) + (size_t)((tiles - n_whole) * splits) * 128 * bn * sizeof(float);
        if (!work || !work->buf || work->bytes < need)
            return err_set(err, "quant_gemm: %d splits of %lld tiles need %zu bytes of work space, not %zu", splits,
                           (long long)(tiles - n_whole), need, work ? work->bytes : 0);
        sp.count = (unsigned *)work->buf;
        sp.part = (float *)((char *)work->buf + qm_count_bytes(sms));
    }
    if (W->type == DT_Q4_K) return qm_launch_bn<DT_Q4_K>(W, x, T, y, y_f32, bn, &sp, epi, s, err);
    if (W->type == DT_Q5_K) return qm_launch_bn<DT_Q5_K>(W, x, T, y, y_f32, bn, &sp, epi, s, err);
    if (W->type == DT_Q6_K) return qm_launch_bn<DT_Q6_K>(W, x, T, y, y_f32, bn, &sp, epi, s, err);
    return qm_launch_bn<DT_Q8_0>(W, x, T, y, y_f32, bn, &sp, epi, s, err);
}

/* qm_run with tokens per block and splits its own (bn = splits = 0). Where that takes 256-token tiles and
 * the last T % 256 tokens are at most 128, those go in a launch of their own after the 256-token head (64-
 * or 128-token tiles), instead of a whole 256-token tile of padding per row tile: y, the parts and the GLU
 * output continue at token h. */
static int qm_run_auto(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QrEpi *epi,
                       const QuantGemmWork *work, cudaStream_t s, Err *err) {
    const int r = T % 256, h = T - r;
    int sms = 0;
    if (T < 256 || r == 0 || r > 128 || !quant_gemm_supported(W->type, W->rows, W->cols) ||
        (sms = qm_sm_count(err)) <= 0 || qm_pick_bn(W, T, sms, work && work->buf) != 256)
        return sms < 0 ? -1 : qm_run(W, x, T, y, y_f32, 0, 0, epi, work, s, err);
    if (qm_run(W, x, h, y, y_f32, 0, 0, epi, work, s, err)) return -1;
    QrEpi tail = *epi;
    const int64_t width[3] = {epi->end[0], epi->end[1] - epi->end[0], epi->end[2] - epi->end[1]};
    for (int i = 0; i < 3 && epi->parts; i++) tail.y[i] = (__nv_bfloat16 *)epi->y[i] + (int64_t)h * width[i];
    if (epi->glu_f) tail.y[0] = (__nv_bfloat16 *)epi->y[0] + (int64_t)h * epi->glu_f;
    void *yt = epi->parts || epi->glu_f ? tail.y[0] : (char *)y + (int64_t)h * W->rows * (y_f32 ? 4 : 2);
    return qm_run(W, (const __nv_bfloat16 *)x + (int64_t)h * W->cols, r, yt, y_f32, 0, 0, &tail, work, s, err);
}

int quant_gemm(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int splits,
               const QuantGemmWork *work, cudaStream_t s, Err *err) {
    const QrEpi none = {};
    if (bn == 0 && splits == 0) return qm_run_auto(W, x, T, y, y_f32, &none, work, s, err);
    return qm_run(W, x, T, y, y_f32, bn, splits, &none, work, s, err);
}

/* The kernel's epilogue from the caller's: checked (16-byte stores of 8 rows of one part, or of a gated
 * pair's 64 rows) */
static int qm_epi_make(const QuantMatrix *W, const QuantGemmEpi *e, QrEpi *q, Err *err) {
    *q = QrEpi{};
    if (e->glu == (e->parts != NULL)) return err_set(err, "quant_gemm_epi: one of parts and glu");
    if (e->glu) {
        if (!e->out || (uintptr_t)e->out % 16 || W->rows % 128)
            return err_set(err, "quant_gemm_epi: glu needs a 16-byte aligned out and rows a multiple of 128, not %lld",
                           (long long)W->rows);
        q->y[0] = e->out, q->glu_f = (int)(W->rows / 2), q->bg = e->bg, q->bu = e->bu, q->act = (int)e->act;
        q->limit = e->limit;
        return 0;
    }
    const GemvOut *o = e->parts;
    int64_t r0 = 0;
    for (int i = 0; i < 3; i++) {
        if (o->end[i] < r0 || o->end[i] % 8 || (uintptr_t)o->y[i] % 16)
            return err_set(err, "quant_gemm_epi: part %d ends at row %lld (a multiple of 8 from the last, y 16-byte "
                                "aligned)", i, (long long)o->end[i]);
        q->y[i] = o->y[i], q->bias[i] = o->bias[i], q->end[i] = (int)o->end[i], r0 = o->end[i];
    }
    if (o->end[2] != W->rows || o->f32 || o->add)
        return err_set(err, "quant_gemm_epi: parts end at row %lld of %lld, bf16, not added", (long long)o->end[2],
                       (long long)W->rows);
    q->parts = 1;
    return 0;
}

bool quant_gemm_epi_takes(const QuantMatrix *W, const QuantGemmEpi *e) {
    Err err = {};
    QrEpi q;
    return quant_gemm_supported(W->type, W->rows, W->cols) && qm_epi_make(W, e, &q, &err) == 0;
}

int quant_gemm_epi(const QuantMatrix *W, const void *x, int T, const QuantGemmEpi *e, int bn, int splits,
                   const QuantGemmWork *work, cudaStream_t s, Err *err) {
    QrEpi q;
    if (qm_epi_make(W, e, &q, err)) return -1;
    if (bn == 0 && splits == 0) return qm_run_auto(W, x, T, q.y[0], false, &q, work, s, err);
    return qm_run(W, x, T, q.y[0], false, bn, splits, &q, work, s, err);
}
