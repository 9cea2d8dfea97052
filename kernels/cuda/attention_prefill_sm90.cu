/* attention_prefill_sm90.cu — the Hopper (sm_90a) prefill over the paged
 * KV cache, bf16 or fp8: the same tiles, masks and online softmax as
 * attention_prefill.cu (its FlashAttention-2 kernel stays the path for head
 * sizes 80/96, fp8 at head size 256 and other GPUs), with the products on
 * wgmma and the loads in a warp-specialised pipeline.
 *
 * A block: one tile of 128 query rows of one prefill run, one query head;
 * 384 threads in three warpgroups.
 *   - Warpgroup 0, the producer, fills NS stages of a K and a V tile of BN
 *     keys each, straight into wgmma's 128-byte-swizzled layout, and waits
 *     only on a stage's empty barrier, never on its own loads:
 *     bf16 cache with the layer's TMA maps (cuda_attention_kv_maps, built
 *     once per layer; TMA = true): warp 0 alone (setmaxnreg 32; the other
 *     three warps leave). The cache is viewed as pieces of R keys (R = the
 *     block size, or BN of a larger block: {head_dim, n_kv_heads, R,
 *     n_slots / R}, boxes of 64 values x R keys); lane j loads piece j of
 *     the tile when it lies wholly inside the tile's keys [lo, hi) (one
 *     table read, one box a 64-column chunk, K then V; a piece's rows start
 *     1024-byte aligned, so the TMA's swizzle is the tile's own). Lane 0
 *     first announces the bytes (mbarrier.arrive.expect_tx: pieces x R x
 *     head size x 2 for K, likewise V). A tile with a partial first or last
 *     block (a chunk starting mid-block, the last rows' end, a window's
 *     start) gets its other keys from the warp's 16-byte cp.async, zeros
 *     outside [lo, hi), so stale slots never reach P V; then each lane's
 *     cp.async.mbarrier.arrive.noinc. full_k / full_v count 33 arrivals
 *     (32 lanes + the announcing one) and complete when the copies and the
 *     announced bytes have landed. An interior tile costs the warp a few
 *     dozen instructions, where the cp.async gather issues one copy per 16 bytes.
 *     Otherwise (fp8, or a bf16 cache without maps: the backend always
 *     builds them, test_attention checks this path too; TMA = false):
 *     all 128 threads (setmaxnreg 96) gather each key row through the
 *     block table with 16-byte cp.async (keys outside [lo, hi) zero-filled),
 *     each thread's noinc arrival completing full_k / full_v (128); fp8
 *     streams codes into raw tiles and converts them to f16 (below).
 *   - Warpgroups 1 and 2, the consumers (setmaxnreg 232 with TMA, else
 *     200): rows 0-63 and 64-127. S = Q K^T by wgmma m64nBNk16 with Q and K from shared
 *     memory; the softmax in registers (fp32, exp2 domain, the masks of
 *     attention_prefill.cu); O += P V by wgmma with P from registers (the S
 *     accumulators of keys 16k..16k+15 are exactly the A fragment of step k)
 *     and V from shared memory read N-major (imm-trans-b), so V is never
 *     transposed. Within a warpgroup the loop is software-pipelined: S of
 *     tile i is issued with P V of tile i - 1, and the softmax of tile i
 *     runs while that P V finishes; then an arrive on tile i - 1's empty
 *     barrier. Between the two consumer warpgroups the SM's schedulers
 *     interleave one's softmax with the other's wgmma.
 * Shared memory: Q [128][HDK], NS x (K [BN][HDK], V [BN][HDV]) bf16, each
 * as 64-column chunks of [rows][128 bytes] with 16-byte unit u of row r at
 * u ^ (r % 8) (the 128-byte swizzle), chunk bases 1024-byte aligned; NS =
 * as many stages as fit in 227 KB, up to 4 (hd128: 3).
 * BN = 128 (64 when HDV = 256: O's 128 accumulators a thread leave no room
 * for S's 64); head sizes multiples of 64 (64, 128, 192, 256 for K; 64,
 * 128, 256 for V).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <string.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/wgmma.cuh"

template <int HDK, int HDV, bool FP8> struct Sm90Shape {
    /* fp8: 64-key tiles, so two raw tiles of codes fit beside the f16 stages */
    static constexpr int BM = 128, BN = FP8 || HDV > 128 ? 64 : 128, NT = 384;
    static constexpr int Q_BYTES = BM * HDK * 2, K_BYTES = BN * HDK * 2, V_BYTES = BN * HDV * 2;
    static constexpr int STAGE = K_BYTES + V_BYTES;
    /* fp8: per stage the keys' and values' scales; two raw tiles (codes K | V, scales K | V); Q's row factors */
    static constexpr int SC_BYTES = FP8 ? 2 * BN * 4 : 0, RAW = BN * (HDK + HDV) + 2 * BN * 4;
    static constexpr int EXTRA = FP8 ? 2 * RAW + BM * 4 : 0;
    /* as many stages as shared memory holds, up to 4 */
    static constexpr int NS_FIT = (227 * 1024 - 1024 - 128 - Q_BYTES - EXTRA) / (STAGE + SC_BYTES);
    static constexpr int NS = NS_FIT < 4 ? NS_FIT : 4;
    static constexpr int SMEM = 1024 + Q_BYTES + NS * (STAGE + SC_BYTES) + EXTRA + 3 * NS * 8;
    static_assert(BM == ATTN_TILE_M, "the metadata's tile height is the kernel's");
    static_assert(HDK % 64 == 0 && HDV % 64 == 0, "64-column swizzle chunks");
    static_assert(NS >= 2 && SMEM <= 227 * 1024, "two stages at least in one block's shared memory");
};

/* byte offset of 16-byte unit u of row r in a swizzled [R][HD] tile */
template <int R> __device__ __forceinline__ uint32_t swz(int r, int u) {
    return (uint32_t)((u >> 3) * R * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4));
}

#if WG_SM90A
/* cp.async writes through the generic proxy and wgmma reads through the
 * async one: a consumer fences after its barrier wait, before its wgmma */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

/* The cache vector (slot x n_kv_heads + kvh) of each of the tile's keys,
 * or -1 outside [lo, hi), or -2 for a key of tile rows [tma_lo, tma_hi)
 * (loaded by TMA: no copy here): lane l of producer warp w holds row
 * w x BN/4 + l. One table read a row, shared by the K and V loads through
 * shuffles. */
template <int BN>
__device__ __forceinline__ int64_t sm90_row_vec(const int32_t *tab, const AttnKParams &p, int kvh, int n0, int lo,
                                                int hi, int pt, int tma_lo = 0, int tma_hi = 0) {
    const int lane = pt & 31, r = (pt >> 5) * (BN / 4) + lane, j = n0 + r;
    if (lane >= BN / 4 || j < lo || j >= hi) return -1;
    if (r >= tma_lo && r < tma_hi) return -2;
    const int64_t slot = ((int64_t)tab[j >> p.block_shift] << p.block_shift) + (j & ((1 << p.block_shift) - 1));
    return slot * p.n_kv_heads + kvh;
}

/* The producer warp's BN/4 rows of a K or V tile into the swizzled [BN][HD]
 * tile: each warp copy is 512 contiguous-by-row bytes; rows without a
 * vector (-1) become zeros; SKIP: rows of -2 are left to the TMA copies */
template <int HD, int BN, bool SKIP = false>
__device__ __forceinline__ void sm90_load_rows(uint32_t dst, const bf16 *cache, int64_t vec, int pt) {
    constexpr int U = HD / 8, RW = BN / 4; /* 16-byte units a row, rows a warp */
    static_assert((RW * U) % 32 == 0, "whole warp copies");
    const int lane = pt & 31, r0 = (pt >> 5) * RW;
    constexpr int UNROLL = SKIP ? 1 : 16; /* SKIP (beside TMA, partial blocks only): few registers, not speed */
#pragma unroll UNROLL
    for (int it = 0; it < RW * U / 32; it++) {
        const int idx = it * 32 + lane, rl = idx / U, u = idx % U;
        const int64_t v = __shfl_sync(0xffffffffu, vec, rl);
        if (!SKIP || v != -2) cp_async16(dst + swz<BN>(r0 + rl, u), cache + (v >= 0 ? v * HD + u * 8 : 0), v >= 0);
    }
}

/* One TMA box (64 values x 2^tma_shift keys of cache block piece `piece`,
 * KV head kvh, 64-column chunk c) into dst, completing bytes on bar */
__device__ __forceinline__ void sm90_tma_box(uint32_t dst, const CUtensorMap *map, int c, int kvh, int piece,
                                             uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                 "%5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(64 * c), "r"(kvh), "r"(0), "r"(piece), "r"(bar)
                 : "memory");
}

/* The whole cache blocks (pieces of 2^tma_shift keys, each wholly inside
 * [lo, hi)) of the K and V tile at key n0 by TMA: lane j of the calling warp
 * loads piece j (one table read), every 64-column chunk of K, then of V, into
 * the swizzled tiles (a piece's rows are 1024-byte aligned: the TMA's
 * 128-byte swizzle is the tiles' own); lane 0 first announces the bytes on
 * full_k / full_v (an arrival of its own besides the warp's 32 cp.async ones).
 * Pieces [j_lo, j_hi) are the whole ones. */
template <int HDK, int HDV, int BN>
__device__ __forceinline__ void sm90_tma_tile(uint32_t sk, uint32_t sv, const CUtensorMap *tk, const CUtensorMap *tv,
                                              const int32_t *tab, const AttnKParams &p, int kvh, int n0, int j_lo,
                                              int j_hi, uint32_t bar_k, uint32_t bar_v, int lane) {
    const int rs = p.tma_shift, n = j_hi > j_lo ? j_hi - j_lo : 0;
    if (lane == 0) {
        mbar_expect_tx(bar_k, (uint32_t)(n << rs) * HDK * 2);
        mbar_expect_tx(bar_v, (uint32_t)(n << rs) * HDV * 2);
    }
    __syncwarp();
    if (lane < j_lo || lane >= j_hi) return;
    const int j = n0 + (lane << rs), bs = p.block_shift;
    /* the piece: block tab[j / bs] holds 2^(bs - rs) of them; j's is its (j % bs) >> rs */
    const int piece = (tab[j >> bs] << (bs - rs)) + ((j & ((1 << bs) - 1)) >> rs);
    const uint32_t row = (uint32_t)(lane << rs) * 128;
#pragma unroll
    for (int c = 0; c < HDK / 64; c++) sm90_tma_box(sk + c * BN * 128 + row, tk, c, kvh, piece, bar_k);
#pragma unroll
    for (int c = 0; c < HDV / 64; c++) sm90_tma_box(sv + c * BN * 128 + row, tv, c, kvh, piece, bar_v);
}

/* fp8: the producer warp's BN/4 rows of codes (HD bytes a row) into a raw
 * [BN][HD] byte tile, and (lanes < BN/4) their scales; rows without a
 * vector become code 0 with scale 0 */
template <int HD, int BN>
__device__ __forceinline__ void sm90_load_raw(uint8_t *dst, float *sc, const uint8_t *cache, const float *scales,
                                              int64_t vec, int pt) {
    constexpr int U = HD / 16, RW = BN / 4;
    static_assert((RW * U) % 32 == 0, "whole warp copies");
    const int lane = pt & 31, r0 = (pt >> 5) * RW;
#pragma unroll
    for (int it = 0; it < RW * U / 32; it++) {
        const int idx = it * 32 + lane, rl = idx / U, u = idx % U;
        const int64_t v = __shfl_sync(0xffffffffu, vec, rl);
        cp_async16(smem_u32(dst + (r0 + rl) * HD + u * 16), cache + (v >= 0 ? v * HD + u * 16 : 0), v >= 0);
    }
    if (lane < RW)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(sc + r0 + lane)),
                     "l"(scales + (vec >= 0 ? vec : 0)), "r"(vec >= 0 ? 4 : 0));
}

/* fp8: a raw [BN][HD] tile of codes into the swizzled f16 tile, exactly (8 codes a step) */
template <int HD, int BN> __device__ __forceinline__ void sm90_convert(uint8_t *smem, uint32_t dst, const uint8_t *raw,
                                                                       int pt) {
    constexpr int U = HD / 8;
    for (int i = pt; i < BN * U; i += 128) {
        const int r = i / U, u = i % U;
        const uint2 c = *reinterpret_cast<const uint2 *>(raw + r * HD + u * 8);
        *reinterpret_cast<uint4 *>(smem + (dst - smem_u32(smem)) + swz<BN>(r, u)) =
            make_uint4(e4m3x2_to_f16x2(c.x), e4m3x2_to_f16x2(c.x >> 16), e4m3x2_to_f16x2(c.y),
                       e4m3x2_to_f16x2(c.y >> 16));
    }
}

/* fp8: row r of the swizzled bf16 Q tile to f16 in place, times 2^(14 - e) with amax < 2^e (q_rows_to_f16's
 * rule: the largest value in [2^13, 2^14), f16's range kept); two threads a row (half = which half of its
 * 16-byte units), qsc[r] = 2^(e - 14) undoes it on the scores */
template <int HD, int R> __device__ __forceinline__ void sm90_q_to_f16(uint8_t *smem, float *qsc, int r, int half) {
    constexpr int U = HD / 8, H = U / 2;
    float amax = 0.f;
    for (int u = half * H; u < (half + 1) * H; u++) {
        const uint4 w = *reinterpret_cast<const uint4 *>(smem + swz<R>(r, u));
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(ws[k] << 16)), fabsf(__uint_as_float(ws[k] & 0xffff0000u))));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    float undo;
    const float f = q_row_f16_factor(amax, &undo);
    for (int u = half * H; u < (half + 1) * H; u++) {
        uint4 *p4 = reinterpret_cast<uint4 *>(smem + swz<R>(r, u));
        const uint4 w = *p4;
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        uint32_t o[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            o[k] = pack_f16(__uint_as_float(ws[k] << 16) * f, __uint_as_float(ws[k] & 0xffff0000u) * f);
        *p4 = make_uint4(o[0], o[1], o[2], o[3]);
    }
    if (half == 0) qsc[r] = undo;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* bf16, or f16 (fp8 cache: exact codes and Q in f16) */
template <int BN, bool F16>
__device__ __forceinline__ void wg_ss(float (&d)[BN / 2], uint64_t da, uint64_t db, int acc) {
    if constexpr (F16) {
        static_assert(BN == 64, "fp8 tiles are 64 keys");
        wg_ss_f16_n64(d, da, db, acc);
    } else if constexpr (BN == 128) wg_ss_n128(d, da, db, acc);
    else wg_ss_n64(d, da, db, acc);
}
template <int HDV, bool F16>
__device__ __forceinline__ void wg_rs_t(float (&d)[HDV / 2], const uint32_t (&a)[4], uint64_t db) {
    if constexpr (F16) {
        static_assert(HDV <= 128, "fp8: value heads up to 128");
        if constexpr (HDV == 128) wg_rs_t_f16_n128(d, a, db);
        else wg_rs_t_f16_n64(d, a, db);
    } else if constexpr (HDV == 256) wg_rs_t_n256(d, a, db);
    else if constexpr (HDV == 128) wg_rs_t_n128(d, a, db);
    else wg_rs_t_n64(d, a, db);
}
#endif

/* Registers: the block holds 384 x 168; the producer gives some back and the consumers take them
 * (setmaxnreg.inc waits for registers the block does not have: more would hang; 128 P + 256 C <= 384 x 168).
 * cp.async producers (fp8, and bf16 without TMA maps) keep 96 for their unrolled copies, consumers 200; with
 * TMA the producer is one warp issuing a few instructions a tile (cp.async only for partial blocks, not unrolled):
 * 32 (24 spilled at head 128/64), and the consumers 232 (head 256: no spills, wgmma not serialized). */
template <bool TMA> struct Sm90Regs {
    static constexpr int PRODUCER = TMA ? 32 : 96, CONSUMER = TMA ? 232 : 200;
    static_assert(128 * PRODUCER + 256 * CONSUMER <= 384 * 168, "the block's registers");
};

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8, bool TMA>
__global__ void __launch_bounds__(384, 1)
    attn_prefill_sm90_kernel(const AttnKParams p, const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv) {
#if WG_SM90A
    using S = Sm90Shape<HDK, HDV, FP8>;
    constexpr int BM = S::BM, BN = S::BN, NS = S::NS;
    extern __shared__ uint8_t sm90_smem_raw[];
    uint8_t *smem = sm90_smem_raw + ((1024 - (smem_u32(sm90_smem_raw) & 1023)) & 1023);
    const uint32_t sQ = smem_u32(smem), sKV = sQ + S::Q_BYTES;
    /* fp8: the stages' scales [NS][K | V][BN], two raw tiles, Q's row factors */
    float *stage_sc = (float *)(smem + S::Q_BYTES + NS * S::STAGE);
    uint8_t *raw = (uint8_t *)(stage_sc + NS * 2 * S::BN * FP8);
    float *qsc = (float *)(raw + 2 * S::RAW * FP8);
    const uint32_t bars = sQ + S::Q_BYTES + NS * (S::STAGE + S::SC_BYTES) + S::EXTRA;
    auto sK = [&](int s) { return sKV + s * S::STAGE; };
    auto sV = [&](int s) { return sKV + s * S::STAGE + S::K_BYTES; };
    auto full_k = [&](int s) { return bars + 8 * s; };
    auto full_v = [&](int s) { return bars + 8 * (NS + s); };
    auto empty = [&](int s) { return bars + 8 * (2 * NS + s); };

    /* the last tiles of a run see the most keys: launched first, so the short ones fill the tail */
    const PrefillTile pt_ = prefill_tile<BM, WIN>(p, gridDim.x - 1 - blockIdx.x);
    const int h = pt_.h, kvh = pt_.kvh, m0 = pt_.m0, q_start = pt_.q_start, rows = pt_.rows;
    const int p_first = pt_.p_first, p_last = pt_.p_last, lo = pt_.lo, hi = pt_.hi;
    const int32_t *tab = pt_.tab;
    const int t_begin = lo / BN, n_t = (hi + BN - 1) / BN - t_begin;
    const int wg = threadIdx.x >> 7;

    static_assert(!(TMA && FP8), "TMA loads bf16 caches only");
    if (threadIdx.x == 0) {
        if constexpr (TMA) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tk) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tv) : "memory");
        }
        for (int s = 0; s < NS; s++) {
            /* every producer thread's cp.async arrival; TMA: warp 0's alone, and its announcing lane's */
            mbar_init(full_k(s), TMA ? 33 : 128), mbar_init(full_v(s), TMA ? 33 : 128);
            mbar_init(empty(s), 256);                             /* every consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) { /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Sm90Regs<TMA>::PRODUCER));
        const int pt = threadIdx.x;
        if constexpr (FP8) {
            /* codes of tile i + 1 stream into one raw tile while tile i's are converted from the other; the f16
             * tiles are written by the threads (generic proxy): fence, then a plain arrive */
            auto raw_k = [&](int b) { return raw + b * S::RAW; };
            auto raw_v = [&](int b) { return raw_k(b) + BN * HDK; };
            auto raw_ks = [&](int b) { return (float *)(raw_v(b) + BN * HDV); };
            auto load = [&](int b, int t) {
                const int64_t vec = sm90_row_vec<BN>(tab, p, kvh, t * BN, lo, hi, pt);
                sm90_load_raw<HDK, BN>(raw_k(b), raw_ks(b), (const uint8_t *)p.k, p.k_scale, vec, pt);
                sm90_load_raw<HDV, BN>(raw_v(b), raw_ks(b) + BN, (const uint8_t *)p.v, p.v_scale, vec, pt);
            };
            load(0, t_begin);
            cp_async_commit();
            for (int i = 0; i < n_t; i++) {
                const int s = i % NS, b = i & 1;
                if (i + 1 < n_t) load(b ^ 1, t_begin + i + 1);
                cp_async_commit();
                cp_async_wait<1>();
                asm volatile("bar.sync 5, 128;\n" ::: "memory"); /* every thread's copies of tile i landed */
                if (i >= NS) mbar_wait(empty(s), (i / NS - 1) & 1);
                sm90_convert<HDK, BN>(smem, sK(s), raw_k(b), pt);
                sm90_convert<HDV, BN>(smem, sV(s), raw_v(b), pt);
                for (int j = pt; j < 2 * BN; j += 128) stage_sc[s * 2 * BN + j] = raw_ks(b)[j];
                fence_proxy_async();
                mbar_arrive(full_k(s));
                mbar_arrive(full_v(s));
                asm volatile("bar.sync 5, 128;\n" ::: "memory"); /* raw tile b read: the next load may refill it */
            }
        } else if constexpr (TMA) {
            /* warp 0 alone (the others leave: no waits polling the issue slots): pieces of R = 2^tma_shift keys
             * (one cache block, or BN keys of a larger one) wholly inside [lo, hi) by TMA; the rest of the tile (a
             * partial first or last block; keys outside [lo, hi) as zeros) by its cp.async, a quarter of the rows
             * at a time (the 4-warp helpers' rows of warp q), so stale slots never reach P V */
            if (pt >= 32) return;
            const int rs = p.tma_shift, n_pieces = BN >> rs;
            for (int i = 0; i < n_t; i++) {
                const int s = i % NS, n0 = (t_begin + i) * BN;
                if (i >= NS) mbar_wait(empty(s), (i / NS - 1) & 1);
                const int j_lo = lo <= n0 ? 0 : (lo - n0 + (1 << rs) - 1) >> rs;
                const int j_hi = min(n_pieces, (hi - n0) >> rs);
                sm90_tma_tile<HDK, HDV, BN>(sK(s), sV(s), &tk, &tv, tab, p, kvh, n0, j_lo, j_hi, full_k(s), full_v(s),
                                            pt);
                if (j_lo > 0 || j_hi < n_pieces) /* a partial tile */
#pragma unroll 1
                    for (int q = 0; q < 4; q++) {
                        const int64_t vec = sm90_row_vec<BN>(tab, p, kvh, n0, lo, hi, 32 * q + pt, j_lo << rs,
                                                             j_hi << rs);
                        sm90_load_rows<HDK, BN, true>(sK(s), (const bf16 *)p.k, vec, 32 * q + pt);
                        sm90_load_rows<HDV, BN, true>(sV(s), (const bf16 *)p.v, vec, 32 * q + pt);
                    }
                cp_async_arrive_noinc(full_k(s)); /* K's and V's copies alike: a partial tile is rare */
                cp_async_arrive_noinc(full_v(s));
            }
        } else {
            for (int i = 0; i < n_t; i++) {
                const int s = i % NS, n0 = (t_begin + i) * BN;
                if (i >= NS) mbar_wait(empty(s), (i / NS - 1) & 1);
                /* each barrier completes when all 128 threads' copies so far have landed */
                const int64_t vec = sm90_row_vec<BN>(tab, p, kvh, n0, lo, hi, pt);
                sm90_load_rows<HDK, BN>(sK(s), (const bf16 *)p.k, vec, pt);
                cp_async_arrive_noinc(full_k(s));
                sm90_load_rows<HDV, BN>(sV(s), (const bf16 *)p.v, vec, pt);
                cp_async_arrive_noinc(full_v(s));
            }
        }
        cp_async_wait<0>(); /* the block's shared memory outlives every copy */
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Sm90Regs<TMA>::CONSUMER));
    const int w = wg - 1, ct = threadIdx.x - 128 * wg; /* consumer warpgroup, its thread */
    const int lane = ct & 31, wi = ct >> 5, g = lane >> 2, tg = lane & 3;
    const int wrow = 64 * w; /* the warpgroup's first tile row */
    { /* this warpgroup's 64 rows of Q; rows past the run are zeros */
        constexpr int U = HDK / 8;
        const bf16 *q = p.q + ((int64_t)(q_start + m0) * p.n_heads + h) * HDK;
        for (int i = ct; i < 64 * U; i += 128) {
            const int r = wrow + i / U, u = i % U;
            const bool ok = r < rows;
            cp_async16(sQ + swz<BM>(r, u), ok ? q + (int64_t)r * p.n_heads * HDK + u * 8 : q, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
        if constexpr (FP8) { /* Q to f16 in place, row r x 2^(14 - e_r) (attention_common.cuh q_rows_to_f16's rule) */
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + w) : "memory");
            sm90_q_to_f16<HDK, BM>(smem, qsc, wrow + (ct >> 1), ct & 1);
        }
        fence_proxy_async();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + w) : "memory");
    }

    float o[HDV / 2];
#pragma unroll
    for (int i = 0; i < HDV / 2; i++) o[i] = 0.f;
    /* the sink enters as a logit with a zero value: its exp counts once per row (lane tg == 0 of the quad) */
    const float sink = p.sinks ? p.sinks[h] * ATTN_LOG2E : -INFINITY;
    float mx[2] = {sink, sink}, l[2];
    l[0] = l[1] = p.sinks && tg == 0 ? 1.f : 0.f;
    const int r0 = wrow + 16 * wi + g; /* this thread's rows r0 and r0 + 8 */
    const int qpos0 = p_first + r0, qpos1 = qpos0 + 8;
    const int w_first = p_first + wrow, w_last = min(p_last, w_first + 63); /* the warpgroup's positions */
    /* fp8: the rows' logit factors (attn_row_factor_fp8) and the warp's value-scale reference */
    float qr[2] = {0.f, 0.f}, vref = 0.f;
    if constexpr (FP8) qr[0] = attn_row_factor_fp8<CAP>(qsc[r0], p), qr[1] = attn_row_factor_fp8<CAP>(qsc[r0 + 8], p);

    /* S_i = Q K_i^T into sc (async) */
    auto qk = [&](float (&sc)[BN / 2], int s, uint32_t ph) {
        mbar_wait(full_k(s), ph);
        fence_proxy_async();
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HDK / 16; kk++) {
            const uint32_t off = (kk & 3) * 32; /* k16 steps inside a 64-column chunk */
            wg_ss<BN, FP8>(sc, wg_desc_sw128(sQ + (kk >> 2) * BM * 128 + wrow * 128 + off, 16, 1024),
                      wg_desc_sw128(sK(s) + (kk >> 2) * BN * 128 + off, 16, 1024), kk > 0);
        }
        wg_commit();
    };
    /* O += P V_i (async): keys 16kk.. are rows 16kk.. of V's tile (two 8-row groups, 2048 bytes) */
    auto pv = [&](const uint32_t (&pa)[BN / 16][4], int s, uint32_t ph) {
        mbar_wait(full_v(s), ph);
        fence_proxy_async();
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wg_rs_t<HDV, FP8>(o, pa[kk], wg_desc_sw128(sV(s) + kk * 2048, BN * 128, 1024));
        wg_commit();
    };
    /* logits, masks and the online softmax of tile t (rows r0, r0 + 8): sc becomes P's fp32 values, alpha
     * the factor O must take before P V is added */
    float vinv = 1.f; /* fp8: 1 / vref for the P of the tile the last softmax took */
    auto softmax = [&](float (&sc)[BN / 2], int t, int s, float (&alpha)[2]) {
        /* without a soft-cap the logit is q.k x scale_log2 (scale > 0): the max is taken on the raw scores
         * and the scale goes into one FFMA with the max, p = 2^(s scale - m); fp8: the key's scale and the
         * row's factor first (attn_logit_fp8: the FA2 kernel's multiplies) */
        const float *ks = stage_sc + s * 2 * BN, *vs = ks + BN;
        const bool edge = (t + 1) * BN - 1 > w_first || (WIN && t * BN <= w_last - p.window);
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x;
                if constexpr (FP8) x = attn_logit_fp8<CAP>(sc[4 * j + e], ks[8 * j + 2 * tg + (e & 1)], qr[e >> 1], p);
                else x = CAP ? attn_logit<true>(sc[4 * j + e], p) : sc[4 * j + e];
                if (edge) {
                    const int key = t * BN + 8 * j + 2 * tg + (e & 1), qp = e < 2 ? qpos0 : qpos1;
                    if (key > qp || (WIN && qp - key >= p.window)) x = -INFINITY;
                }
                sc[4 * j + e] = x;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
            }
        const float f = CAP || FP8 ? 1.f : p.scale_log2;
        float vfac = 1.f; /* fp8: O to the new value-scale reference */
        if constexpr (FP8) {
            float vmax = 0.f;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) vmax = fmaxf(vmax, fmaxf(vs[8 * j + 2 * tg], vs[8 * j + 2 * tg + 1]));
            vinv = fp8_v_ref(vmax, vref, &vfac);
        }
        float nbase[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mnew = fmaxf(mx[r], quad_max(tmax[r]) * f);
            const float base = mnew == -INFINITY ? 0.f : mnew; /* a row with nothing seen yet: no inf - inf */
            const float a = fast_exp2(mx[r] - base);
            alpha[r] = a * vfac; /* fp8: O also moves to the new value-scale reference; the sum is of p alone */
            mx[r] = mnew;
            l[r] *= a;
            nbase[r] = -base;
        }
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sc[4 * j + e] = fast_exp2(fmaf(sc[4 * j + e], f, nbase[e >> 1]));
                l[e >> 1] += sc[4 * j + e];
            }
    };
    auto pack = [&](uint32_t (&pa)[BN / 16][4], const float (&sc)[BN / 2], int s) {
        if constexpr (FP8) { /* p x value scale / vref, in f16 (keys 2tg, 2tg + 1 of n-tiles 2kk and 2kk + 1) */
            const float *vs = stage_sc + s * 2 * BN + BN;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                const float v0 = vs[16 * kk + 2 * tg] * vinv, v1 = vs[16 * kk + 2 * tg + 1] * vinv;
                const float v2 = vs[16 * kk + 8 + 2 * tg] * vinv, v3 = vs[16 * kk + 9 + 2 * tg] * vinv;
                pa[kk][0] = pack_f16(sc[8 * kk] * v0, sc[8 * kk + 1] * v1);
                pa[kk][1] = pack_f16(sc[8 * kk + 2] * v0, sc[8 * kk + 3] * v1);
                pa[kk][2] = pack_f16(sc[8 * kk + 4] * v2, sc[8 * kk + 5] * v3);
                pa[kk][3] = pack_f16(sc[8 * kk + 6] * v2, sc[8 * kk + 7] * v3);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                pa[kk][0] = pack_bf16(sc[8 * kk], sc[8 * kk + 1]);
                pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
                pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
                pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
            }
        }
    };

    /* ping-pong (both warpgroups have rows): a warpgroup issues its wgmma only on its turn and passes the
     * turn when they are issued, so one's softmax runs while the other's products hold the tensor cores;
     * named barriers 3 (warpgroup 0's turn) and 4 (warpgroup 1's), warpgroup 0 first */
    const bool pingpong = rows > 64;
    auto turn_wait = [&]() {
        if (pingpong) asm volatile("bar.sync %0, 256;\n" ::"r"(3 + w) : "memory");
    };
    auto turn_pass = [&](bool last) { /* warpgroup 1's last pass has no wait to meet */
        if (pingpong && !(last && w == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(4 - w) : "memory");
    };
    if (pingpong && w == 1) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    if (wrow < rows) {
        /* software pipeline within the warpgroup: S of tile i is computed on the tensor cores while P V of
         * tile i - 1 is too, and the softmax of tile i runs while P V of tile i - 1 finishes */
        float sc[BN / 2], alpha[2];
        uint32_t pa[BN / 16][4];
        turn_wait();
        qk(sc, 0, 0);
        turn_pass(false);
        wg_wait<0>();
        wg_hold<BN / 2>(sc);
        softmax(sc, t_begin, 0, alpha);
        pack(pa, sc, 0);
        for (int i = 1; i < n_t; i++) {
            const int s = i % NS, sp = (i - 1) % NS;
            turn_wait();
            qk(sc, s, (i / NS) & 1);
            pv(pa, sp, ((i - 1) / NS) & 1);
            turn_pass(false);
            wg_wait<1>(); /* S_i is in */
            wg_hold<BN / 2>(sc);
            softmax(sc, t_begin + i, s, alpha);
            wg_wait<0>(); /* P V of tile i - 1 is in: its stage is free, O takes this tile's factor */
            wg_hold<HDV / 2>(o);
            mbar_arrive(empty(sp));
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) /* no row's max moved: nothing to scale */
#pragma unroll
                for (int j = 0; j < HDV / 8; j++)
                    o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0], o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
            pack(pa, sc, s);
        }
        const int sl = (n_t - 1) % NS;
        turn_wait();
        pv(pa, sl, ((n_t - 1) / NS) & 1);
        turn_pass(true);
        wg_wait<0>();
        wg_hold<HDV / 2>(o);
        mbar_arrive(empty(sl));
    } else {
        /* no rows here (a short tile): keep the stages' phases moving with the other warpgroup */
        for (int i = 0; i < n_t; i++) {
            mbar_wait(full_v(i % NS), (i / NS) & 1);
            mbar_arrive(empty(i % NS));
        }
    }

    /* normalize and write the rows this tile owns */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float sum = quad_sum(l[r]), inv = sum > 0.f ? (FP8 ? vref : 1.f) / sum : 0.f; /* fp8: O x vref */
        const int row = r0 + 8 * r;
        if (row >= rows) continue;
        bf16 *dst = p.out + ((int64_t)(q_start + m0 + row) * p.n_heads + h) * HDV + 2 * tg;
#pragma unroll
        for (int j = 0; j < HDV / 8; j++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * j) =
                __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
#endif
}

/* ---- launchers ---- */

/* The keys of a TMA box for a bf16 cache of blocks of block_size: a whole
 * block, or a tile's share of a larger one. */
static int sm90_tma_rows(int head_dim_v, int block_size) {
    const int bn = head_dim_v > 128 ? Sm90Shape<256, 256, false>::BN : Sm90Shape<128, 128, false>::BN;
    return block_size < bn ? block_size : bn;
}

template <int HDK, int HDV, bool FP8>
static int sm90_variant(const AttnKParams *kp, int n_tiles, cudaStream_t s, Err *err) {
    using S = Sm90Shape<HDK, HDV, FP8>;
    AttnKParams p = *kp;
    CUtensorMap tk, tv;
    memset(&tk, 0, sizeof tk), memset(&tv, 0, sizeof tv);
    const AttnKVMaps *m = (const AttnKVMaps *)kp->maps;
    p.tma_shift = 0;
    if (!FP8 && m && m->rows > 0) {
        if (m->k_base != kp->k || m->v_base != kp->v || m->block_size != 1 << kp->block_shift ||
            m->rows != sm90_tma_rows(HDV, m->block_size))
            return err_set(err, "attention: the layer's TMA maps (block size %d, %d keys a box) were built for "
                           "another cache or block size (%d)", m->block_size, m->rows, 1 << kp->block_shift);
        while ((1 << p.tma_shift) < m->rows) p.tma_shift++;
        memcpy(&tk, m->k, sizeof tk), memcpy(&tv, m->v, sizeof tv);
    }
    return attn_cap_win(&p, [&](auto cap, auto win) {
        auto kernel = attn_prefill_sm90_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, FP8, false>;
        if constexpr (!FP8)
            if (p.tma_shift) kernel = attn_prefill_sm90_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, false, true>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM), err);
        kernel<<<dim3(n_tiles, p.n_heads), S::NT, S::SMEM, s>>>(p, tk, tv);
        CUDA_CHECK(cudaGetLastError(), err);
        return 0;
    });
}

/* fp8 caches: head sizes whose tiles fit (value heads up to 128) */
template <int HDK, int HDV> static int sm90_fp8(const AttnKParams *kp, int n_tiles, cudaStream_t s, Err *err) {
    if constexpr (HDV > 128) return err_set(err, "attention: no sm_90a fp8 kernel for head size %d", HDV);
    else return sm90_variant<HDK, HDV, true>(kp, n_tiles, s, err);
}

/* The kernel has a body only in an sm_90a build, and only that build's code runs on a 9.0 device. */
static bool sm90_available(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, attn_prefill_sm90_kernel<128, 128, false, false, false, false>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90;
}

static bool sm90_has(const AttnKParams *kp, int head_dim_k, int head_dim_v) {
    /* the binary and the device do not change within a process; a static set once, thread-safely (C++11):
     * tensor-parallel ranks make their caches (TMA maps) on threads of their own at once */
    static const bool available = sm90_available();
    if (!available) return false;
    if (kp->fp8 && head_dim_v > 128) return false; /* fp8 tiles of head 256 leave no room for two stages */
#define SM90_HD(K, V) if (head_dim_k == K && head_dim_v == V) return true;
    SM90_HD(64, 64) SM90_HD(128, 128) SM90_HD(256, 256) SM90_HD(128, 64) SM90_HD(192, 128)
#undef SM90_HD
    return false;
}

/* A 4-D map of one bf16 cache part, {hd values, n_kv heads, rows keys, n_slots / rows pieces}, box {64, 1,
 * rows, 1}: a piece of a block is rows consecutive slots, so its coordinate is (slot / rows); 128-byte swizzle
 * (64 bf16 values, one swizzle row, a box row). */
static int sm90_kv_map(PFN_cuTensorMapEncodeTiled_v12000 enc, uint64_t *out, const void *base, int hd, int n_kv,
                       int rows, int64_t n_slots, const char *what, Err *err) {
    CUtensorMap m;
    const uint64_t row = (uint64_t)hd * 2, slot = row * n_kv;
    cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)n_kv, (cuuint64_t)rows, (cuuint64_t)(n_slots / rows)};
    cuuint64_t strides[3] = {row, slot, slot * rows};
    cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, es[4] = {1, 1, 1, 1};
    CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return err_set(err, "attention: TMA map of the %s cache (head %d, %d KV heads, %lld slots, %d keys a box): "
                       "CUresult %d", what, hd, n_kv, (long long)n_slots, rows, (int)r);
    memcpy(out, &m, sizeof m);
    return 0;
}

extern "C" int cuda_attention_kv_maps(AttnKVMaps *m, const KVLayerDev *kv, int64_t n_slots, int block_size,
                                      const AttnParams *p, Err *err) {
    memset(m, 0, sizeof *m);
    static_assert(sizeof(CUtensorMap) == sizeof m->k, "AttnKVMaps holds a CUtensorMap");
    AttnKParams kp = {};
    if (kv->dtype != KV_DTYPE_BF16 || !sm90_has(&kp, p->head_dim_k, p->head_dim_v)) return 0;
    if (block_size < 8 || (block_size & (block_size - 1)) || n_slots <= 0 || n_slots % block_size)
        return err_set(err, "attention: TMA maps for %lld slots in blocks of %d", (long long)n_slots, block_size);
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q), err);
    if (!fn || q != cudaDriverEntryPointSuccess) return err_set(err, "attention: the driver has no cuTensorMapEncodeTiled");
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const int rows = sm90_tma_rows(p->head_dim_v, block_size);
    if (sm90_kv_map(enc, m->k, kv->k, p->head_dim_k, p->n_kv_heads, rows, n_slots, "key", err) ||
        sm90_kv_map(enc, m->v, kv->v, p->head_dim_v, p->n_kv_heads, rows, n_slots, "value", err))
        return -1;
    m->k_base = kv->k, m->v_base = kv->v, m->rows = rows, m->block_size = block_size;
    return 0;
}

extern "C" bool attn_prefill_sm90_has(int head_dim_k, int head_dim_v, bool fp8) {
    AttnKParams kp = {};
    kp.fp8 = fp8;
    return sm90_has(&kp, head_dim_k, head_dim_v);
}

/* 1: ran (or queued) the launch; 0: no sm_90a kernel for this case (the
 * caller runs attention_prefill.cu's); -1: error in err. */
extern "C" int attn_prefill_sm90_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_tiles,
                                        cudaStream_t s, Err *err) {
    if (!sm90_has(kp, head_dim_k, head_dim_v)) return 0;
#define SM90_HD(K, V) \
    if (head_dim_k == K && head_dim_v == V)                                                                        \
        return (kp->fp8 ? sm90_fp8<K, V>(kp, n_tiles, s, err) : sm90_variant<K, V, false>(kp, n_tiles, s, err)) ? -1 : 1;
    SM90_HD(64, 64) SM90_HD(128, 128) SM90_HD(256, 256) SM90_HD(128, 64) SM90_HD(192, 128)
#undef SM90_HD
    return 0;
}
