/* attention_decode_rows.cu — decode attention for steps of many (row, KV
 * head) items: a warp per item, end to end, no block-wide barrier in the key
 * loop (DESIGN.md "Attention"; kernels/README.md "Decode").
 *
 * Why: at 256 rows x 8 KV heads the split kernel (attention_decode.cu) has
 * ~10 tiles a block, each block paying its prologue (Q, the ring's fill) and
 * epilogue (4-warp merge, stores), and its per-tile __syncthreads keeps the
 * SM's 8-12 warps in lock-step: latency, not bytes, bounds it (~50% of the
 * copy rate bf16, ~30% fp8). Here the item is the unit of work and a warp
 * the worker:
 *
 * - An item is (decode row, KV head, up to ATTN_ROWS_HEADS = 8 of its
 *   query heads: GQA reads K/V once for them). The query heads are the n8
 *   columns of the products, S^T = K Q^T and O^T = V^T P^T, the keys and
 *   the value dimensions their m16 rows: with the heads as the m16 rows (the
 *   split kernel's way) an 8B layer's 4 heads of a KV head left 12 of 16
 *   rows padding, in O's registers and in the mma and softmax work. P^T
 *   goes from S^T's C fragments to the B operand, and O^T to rows of heads
 *   at the end, through movmatrix. One warp computes an item wholly: its own
 *   online softmax over all the row's keys, then the output (sink
 *   included), so results do not depend on which warp took which item, nor
 *   on the grid.
 * - Each warp has its own cp.async ring in its slice of shared memory:
 *   STAGES stages of 16 keys (bf16 K|V rows padded as attention_common.cuh
 *   says, or e4m3 bytes + the 2 x 16 scales). Tile t + STAGES - 1 is issued
 *   into the stage that tile t - 1 used once cp.async.wait_group says tile
 *   t landed and __syncwarp makes every lane's copies visible: no barrier
 *   wider than the warp anywhere after the start.
 * - Sizes (head size 128): a bf16 stage is 8.5 KB, 3 stages a warp, 4 warps
 *   a block (104 KB): 2 blocks, 8 warps an SM, each with 2 stages (17 KB) in
 *   flight while it computes on the third: ~139 KB in flight an SM, several
 *   times the ~30 KB that 4.2 TB/s x ~1 us of latency over 132 SMs needs,
 *   so a warp stalled on its chain leaves enough bytes moving. fp8: a stage
 *   is 4.6 KB, 3 stages, 3 blocks (12 warps) an SM, ~113 KB in flight.
 *   Shared memory, not registers, bounds both: 2 stages and more blocks (3
 *   bf16, 4-5 fp8) measured slower (H200: bf16 256 x 640 3.77 -> 3.38 TB/s,
 *   fp8 2.54 -> 2.15 / 2.06).
 *   Registers: O^T (HDV / 4 a lane), Q's B fragments (HDK / 8, loaded
 *   straight from global memory: no shared Q), S^T, the softmax state; at
 *   head 128 ptxas takes 174-176 bf16 and 150 fp8 of what 2 / 3 blocks an
 *   SM allow, no spills (3 / 4 blocks' bounds fit in 139 / 110).
 *   Head sizes above 128 (O and Q would not fit in registers) stay on the
 *   split kernel (attn_decode_rows_serves).
 * - A persistent grid (at most the GPU's resident warps, in even rounds:
 *   attn_rows_grid_warps) takes items from a
 *   counter (the work area's first split counter, p.done[0]: unused by a
 *   one-split launch). Items go longest first: each block sorts the step's
 *   decode rows by their tile counts (a counting sort over log-scale
 *   buckets in shared memory, from the metadata alone, before pdl_wait), so
 *   the long rows start first and short ones fill the tail. Each warp
 *   fetches its next ticket while it works on the current one, so exactly
 *   one fetch per warp fails; the warp whose failed fetch is the launch's
 *   last resets the counter for the next launch.
 * - fp8 cache: ldmatrix on the stage's bytes, cvt e4m3x2 -> f16x2 in
 *   registers, f16 products on the exact codes; key scales on the scores,
 *   value scales into P against the warp's running reference vref, Q in f16
 *   times a power of two a head, in the dimension order ldmatrix gives K's
 *   codes in (the split kernel's arithmetic, attention_decode.cuh).
 *
 * Soft-cap and window are template variants (a windowed row loads only its
 * window's tiles); sinks and any GQA group size at run time. Cascade rows
 * (p.casc): a member's keys from its suffix start, then the shared pass's
 * partials folded in before the sink (rows_fold_shared). Not here: rope
 * mode, several splits, the batch-invariant mode (attention.cu decode_rows
 * keeps those on the split kernel).
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/e4m3.cuh"
#include "kernels/cuda/tensor_core.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

template <int HDK, int HDV, bool FP8> struct RowsShape {
    static constexpr int KN = 16, NW = 4, NT = 32 * NW; /* keys a stage; warps (items at once) a block */
    static constexpr int STAGES = 3;
    static constexpr int SK = HDK + 8, SV = HDV + 8;                      /* bf16 stage rows, elements */
    static constexpr int RSK = fp8_row_stride(HDK), RSV = fp8_row_stride(HDV); /* fp8 stage rows, bytes */
    static constexpr int STAGE = FP8 ? KN * (RSK + RSV) + 2 * KN * 4 : KN * (SK + SV) * 2;
    static constexpr int RING = STAGES * STAGE; /* a warp's */
    static constexpr int ORDER_MAX = 1024, BUCKETS = 64; /* rows sorted longest first (more: step order) */
    static constexpr int HEAD = ORDER_MAX * 2 + BUCKETS * 4;
    static constexpr int SMEM = HEAD + NW * RING;
    static constexpr int MIN_BLOCKS = FP8 ? 3 : 2; /* an SM: shared memory allows no more (top of the file) */
    static_assert(HDK <= 128 && HDV <= 128, "O and Q's fragments in registers");
    static_assert(STAGE % 16 == 0 && HEAD % 16 == 0, "stages keep 16-byte alignment");
    static_assert(STAGES >= 2, "the key loop's wait counts on a group past the tile it reads");
    static_assert(ORDER_MAX % NT == 0, "every thread sorts the same number of rows");
};

/* Head sizes this kernel serves (O and Q in registers); the rest run on the
 * split kernel. */
extern "C" bool attn_decode_rows_serves(int head_dim_k, int head_dim_v) {
    return head_dim_k <= 128 && head_dim_v <= 128;
}

/* A decode row's cascade entry (attn_cascade.h): its suffix start, member
 * index and its group's shared splits; 0, -1, 0 outside a group. */
struct RowCascade {
    int lo, mi, npre;
    __device__ __forceinline__ RowCascade(const AttnKParams &p, int row) {
        const int32_t *c = p.casc ? p.casc + p.casc_rows + 3 * row : nullptr;
        lo = c ? c[0] : 0, mi = c ? c[1] : -1, npre = mi >= 0 ? c[2] : 0;
    }
};

/* A decode row's key range [lo, hi) and its 16-key tiles [t0, t1): a
 * cascade member's from its suffix start (the shared pass did the prefix). */
template <bool WIN, int KN> struct RowRange {
    int lo, hi, t0, t1;
    __device__ __forceinline__ RowRange(const AttnKParams &p, int pos, int casc_lo) {
        lo = max(WIN ? max(0, pos - p.window + 1) : 0, casc_lo), hi = pos + 1;
        t0 = lo / KN, t1 = pos / KN + 1;
    }
};

/* order[0 .. n_decode) = the step's decode rows, most tiles first (buckets
 * of 2^(1/4) in length: close enough to start the long ones first), rows of
 * one bucket in step order. Every block must reach the same order (a warp's
 * item names a row through it), so the scatter is stable: warp 0 walks the
 * rows 32 at a time, a row's place in its bucket the count of the rows
 * before it there (__match_any_sync), never an atomic's arrival order.
 * From the metadata alone (uploaded before the step, the cascade plan in
 * the same copy), so it runs before pdl_wait. Every thread of the block; ends with a barrier. */
template <bool WIN, typename S>
__device__ int rows_bucket(const AttnKParams &p, int d) {
    const int32_t *dec = p.meta + p.off_decode + 3 * d;
    const RowRange<WIN, S::KN> rr(p, dec[2], RowCascade(p, dec[0]).lo);
    return min(S::BUCKETS - 1, (int)(4.f * __log2f((float)(rr.t1 - rr.t0))));
}

template <bool WIN, typename S>
__device__ void rows_longest_first(const AttnKParams &p, int n_decode, int16_t *order, int *hist) {
    const int lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < S::BUCKETS; i += S::NT) hist[i] = 0;
    __syncthreads();
    if (threadIdx.x < 32) {
        for (int d = lane; d < n_decode; d += 32) atomicAdd(&hist[rows_bucket<WIN, S>(p, d)], 1); /* counts only */
        __syncwarp();
        /* hist[k] = rows in buckets above k (lane: buckets 63 - 2 lane, 62 - 2 lane) */
        static_assert(S::BUCKETS == 64, "two buckets a lane");
        const int a = hist[63 - 2 * lane], b = hist[62 - 2 * lane];
        int incl = a + b;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        __syncwarp();
        hist[63 - 2 * lane] = incl - a - b, hist[62 - 2 * lane] = incl - b;
        __syncwarp();
        for (int d0 = 0; d0 < n_decode; d0 += 32) {
            const int d = d0 + lane, key = d < n_decode ? rows_bucket<WIN, S>(p, d) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, key);
            const int before = __popc(peers & ((1u << lane) - 1u));
            const int at = key >= 0 ? hist[key] + before : 0;
            __syncwarp();
            if (key >= 0) {
                order[at] = (int16_t)d;
                if (before == 0) hist[key] += __popc(peers); /* the group's first lane moves the bucket on */
            }
            __syncwarp();
        }
    }
    __syncthreads();
}

/* Starts the copies of keys [n0, n0 + 16) of KV head kvh into a warp's
 * stage (keys outside [lo, hi): zeros, scale 0, never read). The 16 keys lie
 * in at most two cache blocks (block_size >= 8, n0 a multiple of 16): keys
 * n0..n0+7 at consecutive slots of one, n0+8..n0+15 of one; their table
 * entries are read once, at keys clamped into [lo, hi) so no entry outside
 * the row's range is read, and key n0 + r's head vector is v[r / 8] +
 * (r % 8) x n_kv_heads. */
template <int HDK, int HDV, bool FP8, typename S>
__device__ __forceinline__ void rows_load_tile(unsigned char *stage, const AttnKParams &p, const int32_t *tab, int kvh,
                                               int n0, int lo, int hi, int lane) {
    constexpr int KN = S::KN;
    const int bmask = (1 << p.block_shift) - 1;
    const int64_t blk0 = __ldg(tab + (min(max(n0, lo), hi - 1) >> p.block_shift));
    const int64_t blk1 = __ldg(tab + (min(max(n0 + 8, lo), hi - 1) >> p.block_shift));
    const int64_t v0 = ((blk0 << p.block_shift) + (n0 & bmask)) * p.n_kv_heads + kvh;
    const int64_t v1 = ((blk1 << p.block_shift) + ((n0 + 8) & bmask)) * p.n_kv_heads + kvh;
    /* key n0 + r's head vector starts (r % 8) x n_kv_heads vectors past v[r / 8]: that part of a lane's
     * offsets is the same every tile (the compiler keeps it out of the key loop), so a chunk's address is
     * one add to a base worked out once a tile */
    auto ok = [&](int r) { return n0 + r >= lo && n0 + r < hi; };
    if (!FP8) {
        auto copy = [&](bf16 *dst, const bf16 *cache, auto hd_c) {
            constexpr int HD = decltype(hd_c)::value, CH = HD / 8;
            static_assert((KN * CH) % 32 == 0, "a tile's chunks split evenly over the lanes");
            const bf16 *base0 = cache + v0 * HD, *base1 = cache + v1 * HD;
#pragma unroll
            for (int it = 0; it < KN * CH / 32; it++) {
                const int i = it * 32 + lane, r = i / CH, c = i % CH;
                const bool v = ok(r);
                const bf16 *src = (r < 8 ? base0 : base1) + ((r & 7) * p.n_kv_heads * HD + c * 8);
                cp_async16(smem_u32(dst + r * (HD + 8) + c * 8), v ? src : cache, v);
            }
        };
        bf16 *kt = (bf16 *)stage, *vt = kt + KN * S::SK;
        copy(kt, (const bf16 *)p.k, std::integral_constant<int, HDK>{});
        copy(vt, (const bf16 *)p.v, std::integral_constant<int, HDV>{});
        return;
    }
    uint8_t *k8 = stage, *v8 = k8 + KN * S::RSK;
    float *sc = (float *)(v8 + KN * S::RSV); /* K's 16 scales, then V's */
    auto copy = [&](uint8_t *dst, const uint8_t *cache, int rs, auto hd_c) {
        constexpr int HD = decltype(hd_c)::value, CH = HD / 16;
        const uint8_t *base0 = cache + v0 * HD, *base1 = cache + v1 * HD;
#pragma unroll
        for (int i = lane; i < KN * CH; i += 32) {
            const int r = i / CH, c = i % CH;
            const bool v = ok(r);
            const uint8_t *src = (r < 8 ? base0 : base1) + ((r & 7) * p.n_kv_heads * HD + c * 16);
            cp_async16(smem_u32(dst + r * rs + c * 16), v ? src : cache, v);
        }
    };
    copy(k8, (const uint8_t *)p.k, S::RSK, std::integral_constant<int, HDK>{});
    copy(v8, (const uint8_t *)p.v, S::RSV, std::integral_constant<int, HDV>{});
    const int r = lane & 15; /* lanes 0-15: K's scales, 16-31: V's */
    const bool v = ok(r);
    const float *scales = lane < 16 ? p.k_scale : p.v_scale;
    const float *src = v ? scales + (r < 8 ? v0 : v1) + (r & 7) * p.n_kv_heads : scales;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(sc + lane)), "l"(src),
                 "r"(v ? 4 : 0));
}

/* The transpose of the 8 x 8 b16 matrix whose mma fragment is x (lane 4g + t
 * holds row g, columns 2t and 2t + 1): the lane gets row g of the transpose,
 * i.e. the original's rows 2t and 2t + 1 of column g. */
static __device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* Max / sum over the 8 lanes of a C column (lanes t, t + 4, .. t + 28: the
 * keys of a tile, for one query head). */
static __device__ __forceinline__ float col_max(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
static __device__ __forceinline__ float col_sum(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Q as the B operand of S^T = K Q^T (an item's query heads are the n8
 * columns): qb[c] is query head h0 + g's dimensions of chunk c (16 a chunk)
 * that meet K's A fragment there: bf16 2t, 2t + 1 | 2t + 8, 2t + 9; fp8
 * 4t .. 4t + 3 (the order ldmatrix gives K's codes in, as the split kernel
 * has it), f16 times 2^(14 - e) a head (q_row_f16_factor: the quad of lanes
 * sharing g holds all of a head). Heads past nh: zeros. fp8: qr[e] gets head
 * 2t + e's logit factor (the C column this lane holds). */
template <int HDK, bool FP8, bool CAP>
__device__ __forceinline__ void rows_load_q(uint32_t (&qb)[HDK / 16][2], float (&qr)[2], const AttnKParams &p, int row,
                                            int h0, int nh, int lane) {
    const int g = lane >> 2, tg = lane & 3;
    const bf16 *q = p.q + ((int64_t)row * p.n_heads + h0 + g) * HDK;
    const bool v = g < nh;
    if (!FP8) {
#pragma unroll
        for (int c = 0; c < HDK / 16; c++) {
            qb[c][0] = v ? *(const uint32_t *)(q + 16 * c + 2 * tg) : 0u;
            qb[c][1] = v ? *(const uint32_t *)(q + 16 * c + 8 + 2 * tg) : 0u;
        }
        return;
    }
    float amax = 0.f;
#pragma unroll
    for (int c = 0; c < HDK / 16; c++) {
        const uint2 w = v ? *(const uint2 *)(q + 16 * c + 4 * tg) : make_uint2(0u, 0u);
        qb[c][0] = w.x, qb[c][1] = w.y;
#pragma unroll
        for (int k = 0; k < 2; k++)
            amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(qb[c][k] << 16)),
                                     fabsf(__uint_as_float(qb[c][k] & 0xffff0000u))));
    }
    float undo;
    const float f = q_row_f16_factor(quad_max(amax), &undo), factor = attn_row_factor_fp8<CAP>(undo, p);
    qr[0] = __shfl_sync(0xffffffffu, factor, 8 * tg), qr[1] = __shfl_sync(0xffffffffu, factor, 8 * tg + 4);
#pragma unroll
    for (int c = 0; c < HDK / 16; c++)
#pragma unroll
        for (int k = 0; k < 2; k++)
            qb[c][k] = pack_f16(__uint_as_float(qb[c][k] << 16) * f, __uint_as_float(qb[c][k] & 0xffff0000u) * f);
}

/* S^T (the tile's 16 keys x the item's query heads): sT[0..1] key g, heads
 * 2t, 2t + 1; sT[2..3] key g + 8. K is the A operand, straight from the
 * stage (bf16 by ldmatrix; fp8 codes by ldmatrix, then cvt to f16: exact),
 * two accumulators to halve the mma chain. */
template <int HDK, bool FP8, typename S>
__device__ __forceinline__ void rows_scores(float (&sT)[4], const uint32_t (&qb)[HDK / 16][2],
                                            const unsigned char *stage, int lane) {
    constexpr int CH = HDK / 16;
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (FP8) {
        const uint32_t k_addr = smem_u32(stage + (((lane >> 3) & 1) * 8 + (lane & 7)) * S::RSK + (lane >> 4) * 16);
#pragma unroll
        for (int c = 0; c < CH; c += 2) {
            uint32_t w[4];
            ldsm_fp8_chunks<false>(k_addr + c * 16, c + 1 < CH, w); /* head size 80: the last chunk alone */
#pragma unroll
            for (int h = 0; h < (c + 1 < CH ? 2 : 1); h++) {
                /* w[2h]: keys 0-7, w[2h + 1]: keys 8-15, codes 4t .. 4t + 3 of chunk c + h */
                const uint32_t a[4] = {e4m3x2_to_f16x2(w[2 * h]), e4m3x2_to_f16x2(w[2 * h + 1]),
                                       e4m3x2_to_f16x2(w[2 * h] >> 16), e4m3x2_to_f16x2(w[2 * h + 1] >> 16)};
                mma_f16(acc[(c + h) & 1], a, qb[c + h][0], qb[c + h][1]);
            }
        }
    } else {
        const uint32_t k_addr =
            smem_u32((const bf16 *)stage + ((lane & 7) + ((lane >> 4) << 3)) * S::SK + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int c = 0; c < CH; c++) {
            uint32_t r[4]; /* keys 0-7 | 0-7 | 8-15 | 8-15, dimensions 0-7 | 8-15 | 0-7 | 8-15 of chunk c */
            ldsm_x4(k_addr + c * 32, r[0], r[1], r[2], r[3]);
            const uint32_t a[4] = {r[0], r[2], r[1], r[3]};
            mma_bf16(acc[c & 1], a, qb[c][0], qb[c][1]);
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) sT[e] = acc[0][e] + acc[1][e];
}

/* O^T += V^T P^T: V is the A operand (ldmatrix .trans on the stage), P^T
 * the B one (b0: keys 2t, 2t + 1, b1: keys 2t + 8, 2t + 9 of head g). oT[c]
 * holds dimension rows g and g + 8 of chunk c (16 dimensions) x heads 2t,
 * 2t + 1: bf16 dimensions 16c + g, 16c + g + 8; fp8 16c + 2g, 16c + 2g + 1
 * (a byte permute of ldmatrix's pairs gives those two rows; rows_store puts
 * them back). */
template <int HDV, bool FP8, typename S>
__device__ __forceinline__ void rows_pv(float (&oT)[HDV / 16][4], uint32_t b0, uint32_t b1,
                                        const unsigned char *stage, int lane) {
    constexpr int CH = HDV / 16;
    if (FP8) {
        const uint8_t *v8 = stage + S::KN * S::RSK;
        const uint32_t v_addr = smem_u32(v8 + (((lane >> 3) & 1) * 8 + (lane & 7)) * S::RSV + (lane >> 4) * 16);
#pragma unroll
        for (int c = 0; c < CH; c += 2) {
            uint32_t w[4];
            ldsm_fp8_chunks<true>(v_addr + c * 16, c + 1 < CH, w);
#pragma unroll
            for (int h = 0; h < (c + 1 < CH ? 2 : 1); h++) {
                uint32_t f[4]; /* V^T's rows g, g + 8: dimensions 2g, 2g + 1 */
                fp8_value_pairs(w[2 * h], w[2 * h + 1], f);
                const uint32_t a[4] = {f[0], f[2], f[1], f[3]};
                mma_f16(oT[c + h], a, b0, b1);
            }
        }
    } else {
        const bf16 *vt = (const bf16 *)stage + S::KN * S::SK;
        const uint32_t v_addr = smem_u32(vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * S::SV + (lane >> 4) * 8);
#pragma unroll
        for (int c = 0; c < CH; c++) {
            uint32_t r[4]; /* keys 0-7 | 8-15 | 0-7 | 8-15, dimensions 0-7 | 0-7 | 8-15 | 8-15 of chunk c */
            ldsm_x4_t(v_addr + c * 32, r[0], r[1], r[2], r[3]);
            const uint32_t a[4] = {r[0], r[2], r[1], r[3]};
            mma_bf16(oT[c], a, b0, b1);
        }
    }
}

/* A cascade member's shared partials (the shared pass's npre splits of the
 * prefix, true units) folded into the item's state by log-sum-exp, as the
 * split kernel's finish folds them (lse_fold, the same order); l: the
 * columns' whole sums. fp8: O goes to true units first (x vref). Row rho of
 * chunk c is dimension 16c + rho, fp8 16c + 2 (rho & 7) + (rho >> 3) (the
 * order rows_pv's V^T rows hold them). */
template <int HDV, bool FP8>
__device__ __forceinline__ void rows_fold_shared(const AttnKParams &p, float (&oT)[HDV / 16][4], float (&m)[2],
                                                 float (&l)[2], float vref, const RowCascade &casc, int h0, int nh,
                                                 int lane) {
    const int g = lane >> 2, tg = lane & 3;
    if (FP8)
#pragma unroll
        for (int c = 0; c < HDV / 16; c++) oT[c][0] *= vref, oT[c][1] *= vref, oT[c][2] *= vref, oT[c][3] *= vref;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int hc = 2 * tg + e;
        if (hc >= nh) continue;
        const int64_t slot0 = ((int64_t)casc.mi * p.n_heads + h0 + hc) * p.casc_splits;
        for (int s = 0; s < casc.npre; s++) {
            const float *ml = p.casc_ml + (slot0 + s) * 2, *os = p.casc_o + (slot0 + s) * HDV;
            const float ms = __ldcg(ml), ls = __ldcg(ml + 1);
            const float mm = fmaxf(m[e], ms), base = mm == -INFINITY ? 0.f : mm;
            const float a = exp2f(m[e] - base), b = exp2f(ms - base);
            l[e] = l[e] * a + ls * b, m[e] = mm;
#pragma unroll
            for (int c = 0; c < HDV / 16; c++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int rho = g + 8 * half, dim = 16 * c + (FP8 ? 2 * (rho & 7) + (rho >> 3) : rho);
                    oT[c][2 * half + e] = oT[c][2 * half + e] * a + __ldcg(os + dim) * b;
                }
        }
    }
}

/* The item's output: query heads h0 + g (below nh), normalized with the
 * sink (o e / (e l + exp2(sink - M)), e = exp2(m - M), M = max(m, sink);
 * fp8: times vref), as bf16, after a cascade member's shared partials;
 * oT's columns are heads 2t, 2t + 1, so each chunk goes through movmatrix
 * to rows of heads. */
template <int HDV, bool FP8>
__device__ __forceinline__ void rows_store(const AttnKParams &p, float (&oT)[HDV / 16][4], const float (&mx)[2],
                                           const float (&l)[2], float vref, const RowCascade &casc, int row, int h0,
                                           int nh, int lane) {
    const int g = lane >> 2, tg = lane & 3;
    float m[2] = {mx[0], mx[1]}, sum_l[2] = {col_sum(l[0]), col_sum(l[1])};
    if (casc.mi >= 0) rows_fold_shared<HDV, FP8>(p, oT, m, sum_l, vref, casc, h0, nh, lane);
    const float vf = FP8 && casc.mi < 0 ? vref : 1.f; /* folded: O is in true units already */
    float f[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int hc = 2 * tg + e; /* this lane's column's head, of the item's */
        const float sink = p.sinks && hc < nh ? p.sinks[h0 + hc] * ATTN_LOG2E : -INFINITY;
        const float mm = fmaxf(sink, m[e]), base = mm == -INFINITY ? 0.f : mm, ex = exp2f(m[e] - base);
        const float sum = ex * sum_l[e] + (sink > -INFINITY ? exp2f(sink - base) : 0.f);
        f[e] = ex * (sum > 0.f ? 1.f / sum : 0.f) * vf;
    }
    bf16 *out = p.out + ((int64_t)row * p.n_heads + h0 + g) * HDV;
#pragma unroll
    for (int c = 0; c < HDV / 16; c++) {
        /* y0: head g's dimension rows 2t, 2t + 1; y1: rows 2t + 8, 2t + 9 */
        const uint32_t y0 = movmatrix_t(pack_bf16(oT[c][0] * f[0], oT[c][1] * f[1]));
        const uint32_t y1 = movmatrix_t(pack_bf16(oT[c][2] * f[0], oT[c][3] * f[1]));
        if (g >= nh) continue;
        if (FP8) /* rows 2t, 2t + 1, 2t + 8, 2t + 9 are dimensions 4t, 4t + 2, 4t + 1, 4t + 3 */
            *(uint2 *)(out + 16 * c + 4 * tg) = make_uint2(__byte_perm(y0, y1, 0x5410), __byte_perm(y0, y1, 0x7632));
        else
            *(uint32_t *)(out + 16 * c + 2 * tg) = y0, *(uint32_t *)(out + 16 * c + 8 + 2 * tg) = y1;
    }
}

/* One item, by one warp: decode entry d, KV head kvh, head group grp (of
 * ATTN_ROWS_HEADS). The query heads are the n8 columns of S^T = K Q^T and
 * O^T = V^T P^T (keys and dimensions the m16 rows): an 8B layer's 4 heads of
 * a KV head fill half the columns, where with heads as the rows of m16 tiles
 * 12 of 16 rows were padding, in registers and in mma work. */
template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__device__ __forceinline__ void rows_item(const AttnKParams &p, int d, int kvh, int grp, unsigned char *ring,
                                          int lane) {
    using S = RowsShape<HDK, HDV, FP8>;
    constexpr int KN = S::KN, ST = S::STAGES;
    const int32_t *dec = p.meta + p.off_decode + 3 * d;
    const int row = dec[0], pos = dec[2];
    const int32_t *tab = p.meta + p.off_tables + (int64_t)dec[1] * p.table_width;
    const int h0 = kvh * p.group + grp * ATTN_ROWS_HEADS;
    const int nh = min(ATTN_ROWS_HEADS, p.group - grp * ATTN_ROWS_HEADS);
    const RowCascade casc(p, row);
    const RowRange<WIN, KN> rr(p, pos, casc.lo);
    const int lo = rr.lo, hi = rr.hi, g = lane >> 2;

    auto load = [&](int st, int t) {
        rows_load_tile<HDK, HDV, FP8, S>(ring + st * S::STAGE, p, tab, kvh, t * KN, lo, hi, lane);
    };
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (rr.t0 + st < rr.t1) load(st, rr.t0 + st);
        cp_async_commit(); /* empty groups keep the wait counts uniform */
    }
    uint32_t qb[HDK / 16][2];
    float qr[2] = {1.f, 1.f}; /* fp8: heads 2t, 2t + 1's logit factors */
    rows_load_q<HDK, FP8, CAP>(qb, qr, p, row, h0, nh, lane);

    float oT[HDV / 16][4];
#pragma unroll
    for (int i = 0; i < HDV / 16; i++) oT[i][0] = oT[i][1] = oT[i][2] = oT[i][3] = 0.f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, vref = 0.f;

    for (int t = rr.t0, st = 0; t < rr.t1; t++, st = st + 1 == ST ? 0 : st + 1) {
        /* tile t0 + i is commit group i: ST - 1 up front, one a turn after; at turn i groups 0..i have
         * landed when at most ST - 2 are pending */
        cp_async_wait<ST - 2>();
        __syncwarp(); /* every lane's copies of tile t visible; every lane done with tile t - 1's stage */
        if (t + ST - 1 < rr.t1) load(st == 0 ? ST - 1 : st - 1, t + ST - 1);
        cp_async_commit();
        const unsigned char *stage = ring + st * S::STAGE;

        float sT[4];
        rows_scores<HDK, FP8, S>(sT, qb, stage, lane);
        float sk[2] = {1.f, 1.f}, sv[2] = {0.f, 0.f}; /* fp8: keys g and g + 8's scales */
        if (FP8) {
            const float *sc = (const float *)(stage + KN * (S::RSK + S::RSV)); /* K's 16 scales, then V's */
            sk[0] = sc[g], sk[1] = sc[g + 8], sv[0] = sc[KN + g], sv[1] = sc[KN + g + 8];
        }
        /* logits; only the first and last tiles can hold keys outside [lo, hi) */
        const bool edge = t * KN < lo || (t + 1) * KN > hi;
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = t * KN + g + 8 * (e >> 1);
            const float logit = FP8 ? attn_logit_fp8<CAP>(sT[e], sk[e >> 1], qr[e & 1], p) : attn_logit<CAP>(sT[e], p);
            const float x = !edge || (j >= lo && j < hi) ? logit : -INFINITY;
            sT[e] = x;
            tmax[e & 1] = fmaxf(tmax[e & 1], x);
        }
        /* the online softmax of heads 2t, 2t + 1 (l: this lane's keys' part, summed over the column at the end) */
        float alpha[2], base[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float mnew = fmaxf(mx[e], col_max(tmax[e]));
            base[e] = mnew == -INFINITY ? 0.f : mnew;
            alpha[e] = exp2f(mx[e] - base[e]);
            mx[e] = mnew;
            l[e] *= alpha[e];
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            sT[e] = exp2f(sT[e] - base[e & 1]);
            l[e & 1] += sT[e];
        }
        uint32_t b0, b1; /* P^T's B fragments: fp8 p x value scale / vref as f16, bf16 p as bf16 */
        if (FP8) {
            float rescale; /* vref: the largest value scale the warp has seen (a column's lanes hold all 16 keys) */
            const float inv = fp8_v_ref_raise(col_max(fmaxf(sv[0], sv[1])), vref, &rescale);
            alpha[0] *= rescale, alpha[1] *= rescale;
            b0 = movmatrix_t(pack_f16(sT[0] * (sv[0] * inv), sT[1] * (sv[0] * inv)));
            b1 = movmatrix_t(pack_f16(sT[2] * (sv[1] * inv), sT[3] * (sv[1] * inv)));
        } else {
            b0 = movmatrix_t(pack_bf16(sT[0], sT[1]));
            b1 = movmatrix_t(pack_bf16(sT[2], sT[3]));
        }
        /* once the running max (and fp8's vref) settle, alpha stays 1: skip the multiplies */
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < HDV / 16; i++)
                oT[i][0] *= alpha[0], oT[i][1] *= alpha[1], oT[i][2] *= alpha[0], oT[i][3] *= alpha[1];
        }
        rows_pv<HDV, FP8, S>(oT, b0, b1, stage, lane);
    }
    __syncwarp(); /* every lane done with the ring before the next item's copies land in it */
    rows_store<HDV, FP8>(p, oT, mx, l, vref, casc, row, h0, nh, lane);
}

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__global__ void __launch_bounds__(128, RowsShape<HDK, HDV, FP8>::MIN_BLOCKS)
    attn_decode_rows_kernel(const AttnKParams p, int n_decode) {
    using S = RowsShape<HDK, HDV, FP8>;
    extern __shared__ __align__(16) unsigned char smem[];
    int16_t *order = (int16_t *)smem;
    int *hist = (int *)(smem + S::ORDER_MAX * 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned char *ring = smem + S::HEAD + warp * S::RING;

    const bool sorted = n_decode <= S::ORDER_MAX;
    if (sorted) rows_longest_first<WIN, S>(p, n_decode, order, hist);
    pdl_wait(); /* q and the cache's newest keys come from the kernels before */

    const int groups = ATTN_ROWS_GROUPS(p.group), per_row = p.n_kv_heads * groups;
    const int n_items = n_decode * per_row;
    const int last_fetch = n_items + gridDim.x * S::NW - 1; /* every warp's one failed fetch counted */
    int *next = p.done;
    int item = __shfl_sync(0xffffffffu, lane == 0 ? atomicAdd(next, 1) : 0, 0);
    for (;;) {
        if (item >= n_items) {
            /* the launch's last fetch: nobody fetches again, so zero the counter for the next launch */
            if (lane == 0 && item == last_fetch) atomicExch(next, 0);
            break;
        }
        const int following = lane == 0 ? atomicAdd(next, 1) : 0; /* its latency hides under this item */
        const int dpos = item / per_row, r = item % per_row;
        rows_item<HDK, HDV, CAP, WIN, FP8>(p, sorted ? order[dpos] : dpos, r / groups, r % groups, ring, lane);
        item = __shfl_sync(0xffffffffu, following, 0);
    }
}

/* ---- launchers ---- */

template <int HDK, int HDV, bool FP8>
static int rows_variant(const AttnKParams *kp, int n_decode, int resident_warps, cudaStream_t s, Err *err) {
    using S = RowsShape<HDK, HDV, FP8>;
    const int64_t items = (int64_t)n_decode * kp->n_kv_heads * ATTN_ROWS_GROUPS(kp->group);
    const int blocks = (int)((attn_rows_grid_warps(items, resident_warps) + S::NW - 1) / S::NW);
    return attn_cap_win(kp, [&](auto cap, auto win) {
        auto kernel = attn_decode_rows_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, FP8>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM), err);
        CUDA_CHECK(launch_pdl(kernel, dim3(blocks), S::NT, S::SMEM, s, *kp, n_decode), err);
        return 0;
    });
}

/* Warps of the kernel the GPU holds at once: multiprocessors x blocks each
 * (the fewest of the four mask variants) x warps a block. */
template <int HDK, int HDV, bool FP8> static int rows_resident(Err *err) {
    using S = RowsShape<HDK, HDV, FP8>;
    int dev = 0, sms = 0, fewest = 1 << 30;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    void (*kernels[4])(const AttnKParams, int) = {
        attn_decode_rows_kernel<HDK, HDV, false, false, FP8>, attn_decode_rows_kernel<HDK, HDV, false, true, FP8>,
        attn_decode_rows_kernel<HDK, HDV, true, false, FP8>, attn_decode_rows_kernel<HDK, HDV, true, true, FP8>};
    for (int i = 0; i < 4; i++) {
        int per_sm = 0;
        CUDA_CHECK(cudaFuncSetAttribute(kernels[i], cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM), err);
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernels[i], S::NT, S::SMEM), err);
        fewest = per_sm < fewest ? per_sm : fewest;
    }
    return sms * (fewest > 0 ? fewest : 1) * S::NW;
}

/* The pairs of ATTN_HEAD_DIMS this kernel serves (a pair above 128 names
 * the 128 variant only so that the macro stays one expression: the
 * condition never lets it run). */
#define ROWS_HD(K, V) \
    if (head_dim_k == K && head_dim_v == V && K <= 128 && V <= 128)

extern "C" int cuda_attention_decode_rows_resident(int head_dim_k, int head_dim_v, bool fp8, Err *err) {
#define ATTN_HD(K, V) \
    ROWS_HD(K, V) return fp8 ? rows_resident<(K <= 128 ? K : 128), (V <= 128 ? V : 128), true>(err) \
                             : rows_resident<(K <= 128 ? K : 128), (V <= 128 ? V : 128), false>(err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return 0; /* head sizes it does not serve: the split kernel's */
}

extern "C" int attn_decode_rows_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode,
                                       int resident_warps, cudaStream_t s, Err *err) {
    if (n_decode == 0) return 0;
#define ATTN_HD(K, V)                                                                                          \
    ROWS_HD(K, V) return kp->fp8                                                                               \
        ? rows_variant<(K <= 128 ? K : 128), (V <= 128 ? V : 128), true>(kp, n_decode, resident_warps, s, err) \
        : rows_variant<(K <= 128 ? K : 128), (V <= 128 ? V : 128), false>(kp, n_decode, resident_warps, s, err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return err_set(err, "attention: head sizes k=%d v=%d have no many-rows decode kernel (it serves <= 128)",
                   head_dim_k, head_dim_v);
}
