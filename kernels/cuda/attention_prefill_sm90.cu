/* attention_prefill_sm90.cu — the Hopper (sm_90a) prefill over the paged
 * bf16 KV cache: the same tiles, masks and online softmax as
 * attention_prefill.cu (its FlashAttention-2 kernel stays the path for the
 * fp8 cache, other head sizes and other GPUs), with the products on wgmma
 * and the loads in a warp-specialised pipeline.
 *
 * A block: one tile of 128 query rows of one prefill run, one query head;
 * 384 threads in three warpgroups.
 *   - Warpgroup 0, the producer (setmaxnreg down to 96 registers): gathers
 *     each K and V tile of BN keys through the block table with 16-byte
 *     cp.async (keys outside [lo, hi) zero-filled, so any block size >= 8
 *     works and no tensor map is built per layer), straight into wgmma's
 *     128-byte-swizzled layout, up to NS stages ahead; each thread's
 *     cp.async.mbarrier.arrive.noinc makes the stage's full_k / full_v
 *     barrier complete when all its copies have landed, so the producer
 *     never waits on its own loads, only on a stage's empty barrier.
 *   - Warpgroups 1 and 2, the consumers (up to 200 registers): rows 0-63
 *     and 64-127. S = Q K^T by wgmma m64nBNk16 with Q and K from shared
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
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/wgmma.cuh"

template <int HDK, int HDV> struct Sm90Shape {
    static constexpr int BM = 128, BN = HDV > 128 ? 64 : 128, NT = 384;
    static constexpr int Q_BYTES = BM * HDK * 2, K_BYTES = BN * HDK * 2, V_BYTES = BN * HDV * 2;
    static constexpr int STAGE = K_BYTES + V_BYTES;
    /* as many stages as shared memory holds, up to 4 */
    static constexpr int NS_FIT = (227 * 1024 - 1024 - 128 - Q_BYTES) / STAGE, NS = NS_FIT < 4 ? NS_FIT : 4;
    static constexpr int SMEM = 1024 + Q_BYTES + NS * STAGE + 3 * NS * 8;
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
 * or -1 outside [lo, hi): lane l of producer warp w holds row w x BN/4 + l.
 * One table read a row, shared by the K and V loads through shuffles. */
template <int BN>
__device__ __forceinline__ int64_t sm90_row_vec(const int32_t *tab, const AttnKParams &p, int kvh, int n0, int lo,
                                                int hi, int pt) {
    const int lane = pt & 31, j = n0 + (pt >> 5) * (BN / 4) + lane;
    if (lane >= BN / 4 || j < lo || j >= hi) return -1;
    const int64_t slot = ((int64_t)tab[j >> p.block_shift] << p.block_shift) + (j & ((1 << p.block_shift) - 1));
    return slot * p.n_kv_heads + kvh;
}

/* The producer warp's BN/4 rows of a K or V tile into the swizzled [BN][HD]
 * tile: each warp copy is 512 contiguous-by-row bytes; rows without a
 * vector (-1) become zeros */
template <int HD, int BN>
__device__ __forceinline__ void sm90_load_rows(uint32_t dst, const bf16 *cache, int64_t vec, int pt) {
    constexpr int U = HD / 8, RW = BN / 4; /* 16-byte units a row, rows a warp */
    static_assert((RW * U) % 32 == 0, "whole warp copies");
    const int lane = pt & 31, r0 = (pt >> 5) * RW;
#pragma unroll 16
    for (int it = 0; it < RW * U / 32; it++) {
        const int idx = it * 32 + lane, rl = idx / U, u = idx % U;
        const int64_t v = __shfl_sync(0xffffffffu, vec, rl);
        cp_async16(dst + swz<BN>(r0 + rl, u), cache + (v >= 0 ? v * HD + u * 8 : 0), v >= 0);
    }
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <int BN> __device__ __forceinline__ void wg_ss(float (&d)[BN / 2], uint64_t da, uint64_t db, int acc) {
    if constexpr (BN == 128) wg_ss_n128(d, da, db, acc);
    else wg_ss_n64(d, da, db, acc);
}
template <int HDV> __device__ __forceinline__ void wg_rs_t(float (&d)[HDV / 2], const uint32_t (&a)[4], uint64_t db) {
    if constexpr (HDV == 256) wg_rs_t_n256(d, a, db);
    else if constexpr (HDV == 128) wg_rs_t_n128(d, a, db);
    else wg_rs_t_n64(d, a, db);
}
#endif

template <int HDK, int HDV, bool CAP, bool WIN>
__global__ void __launch_bounds__(384, 1) attn_prefill_sm90_kernel(const AttnKParams p) {
#if WG_SM90A
    using S = Sm90Shape<HDK, HDV>;
    constexpr int BM = S::BM, BN = S::BN, NS = S::NS;
    extern __shared__ uint8_t sm90_smem_raw[];
    uint8_t *smem = sm90_smem_raw + ((1024 - (smem_u32(sm90_smem_raw) & 1023)) & 1023);
    const uint32_t sQ = smem_u32(smem), sKV = sQ + S::Q_BYTES, bars = sKV + NS * S::STAGE;
    auto sK = [&](int s) { return sKV + s * S::STAGE; };
    auto sV = [&](int s) { return sKV + s * S::STAGE + S::K_BYTES; };
    auto full_k = [&](int s) { return bars + 8 * s; };
    auto full_v = [&](int s) { return bars + 8 * (NS + s); };
    auto empty = [&](int s) { return bars + 8 * (2 * NS + s); };

    const int h = blockIdx.y, kvh = h / p.group;
    /* the last tiles of a run see the most keys: launched first, so the short ones fill the tail */
    const int32_t *tile = p.meta + p.off_tiles + 2 * (gridDim.x - 1 - blockIdx.x);
    const int32_t *run = p.meta + p.off_prefill + 4 * tile[0];
    const int m0 = tile[1], q_start = run[0], q_len = run[1], pos0 = run[2];
    const int32_t *tab = p.meta + p.off_tables + (int64_t)run[3] * p.table_width;
    const int rows = min(BM, q_len - m0);
    const int p_first = pos0 + m0, p_last = p_first + rows - 1;
    const int lo = WIN ? max(0, p_first - p.window + 1) : 0, hi = p_last + 1;
    const int t_begin = lo / BN, n_t = (hi + BN - 1) / BN - t_begin;
    const int wg = threadIdx.x >> 7;

    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full_k(s), 128), mbar_init(full_v(s), 128); /* every producer thread */
            mbar_init(empty(s), 256);                             /* every consumer thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    /* registers: the block holds 384 x 168; the producer gives 128 x 72 back and the consumers take 256 x 32 of
     * them (setmaxnreg.inc waits for registers the block does not have: more would hang) */
    if (wg == 0) { /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 96;\n");
        const int pt = threadIdx.x;
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
        cp_async_wait<0>(); /* the block's shared memory outlives every copy */
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n");
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

    /* S_i = Q K_i^T into sc (async) */
    auto qk = [&](float (&sc)[BN / 2], int s, uint32_t ph) {
        mbar_wait(full_k(s), ph);
        fence_proxy_async();
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HDK / 16; kk++) {
            const uint32_t off = (kk & 3) * 32; /* k16 steps inside a 64-column chunk */
            wg_ss<BN>(sc, wg_desc_sw128(sQ + (kk >> 2) * BM * 128 + wrow * 128 + off, 16, 1024),
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
        for (int kk = 0; kk < BN / 16; kk++) wg_rs_t<HDV>(o, pa[kk], wg_desc_sw128(sV(s) + kk * 2048, BN * 128, 1024));
        wg_commit();
    };
    /* logits, masks and the online softmax of tile t (rows r0, r0 + 8): sc becomes P's fp32 values, alpha
     * the factor O must take before P V is added */
    auto softmax = [&](float (&sc)[BN / 2], int t, float (&alpha)[2]) {
        /* without a soft-cap the logit is q.k x scale_log2 (scale > 0): the max is taken on the raw scores
         * and the scale goes into one FFMA with the max, p = 2^(s scale - m) */
        const bool edge = (t + 1) * BN - 1 > w_first || (WIN && t * BN <= w_last - p.window);
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = CAP ? attn_logit<true>(sc[4 * j + e], p) : sc[4 * j + e];
                if (edge) {
                    const int key = t * BN + 8 * j + 2 * tg + (e & 1), qp = e < 2 ? qpos0 : qpos1;
                    if (key > qp || (WIN && qp - key >= p.window)) x = -INFINITY;
                }
                sc[4 * j + e] = x;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
            }
        const float f = CAP ? 1.f : p.scale_log2;
        float nbase[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mnew = fmaxf(mx[r], quad_max(tmax[r]) * f);
            const float base = mnew == -INFINITY ? 0.f : mnew; /* a row with nothing seen yet: no inf - inf */
            alpha[r] = fast_exp2(mx[r] - base);
            mx[r] = mnew;
            l[r] *= alpha[r];
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
    auto pack = [&](uint32_t (&pa)[BN / 16][4], const float (&sc)[BN / 2]) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[kk][0] = pack_bf16(sc[8 * kk], sc[8 * kk + 1]);
            pa[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
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
        softmax(sc, t_begin, alpha);
        pack(pa, sc);
        for (int i = 1; i < n_t; i++) {
            const int s = i % NS, sp = (i - 1) % NS;
            turn_wait();
            qk(sc, s, (i / NS) & 1);
            pv(pa, sp, ((i - 1) / NS) & 1);
            turn_pass(false);
            wg_wait<1>(); /* S_i is in */
            wg_hold<BN / 2>(sc);
            softmax(sc, t_begin + i, alpha);
            wg_wait<0>(); /* P V of tile i - 1 is in: its stage is free, O takes this tile's factor */
            wg_hold<HDV / 2>(o);
            mbar_arrive(empty(sp));
            if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) /* no row's max moved: nothing to scale */
#pragma unroll
                for (int j = 0; j < HDV / 8; j++)
                    o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0], o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
            pack(pa, sc);
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
        const float sum = quad_sum(l[r]), inv = sum > 0.f ? 1.f / sum : 0.f;
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

template <int HDK, int HDV, bool CAP, bool WIN>
static int sm90_launch(const AttnKParams *kp, int n_tiles, cudaStream_t s, Err *err) {
    using S = Sm90Shape<HDK, HDV>;
    CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_sm90_kernel<HDK, HDV, CAP, WIN>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM),
               err);
    attn_prefill_sm90_kernel<HDK, HDV, CAP, WIN><<<dim3(n_tiles, kp->n_heads), S::NT, S::SMEM, s>>>(*kp);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

template <int HDK, int HDV> static int sm90_variant(const AttnKParams *kp, int n_tiles, cudaStream_t s, Err *err) {
    const bool cap = kp->cap_in != 0.f, win = kp->window > 0;
    if (cap && win) return sm90_launch<HDK, HDV, true, true>(kp, n_tiles, s, err);
    if (cap) return sm90_launch<HDK, HDV, true, false>(kp, n_tiles, s, err);
    if (win) return sm90_launch<HDK, HDV, false, true>(kp, n_tiles, s, err);
    return sm90_launch<HDK, HDV, false, false>(kp, n_tiles, s, err);
}

/* The kernel has a body only in an sm_90a build, and only that build's code runs on a 9.0 device. */
static bool sm90_available(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, attn_prefill_sm90_kernel<128, 128, false, false>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90;
}

static bool sm90_has(const AttnKParams *kp, int head_dim_k, int head_dim_v) {
    static int available = -1; /* the binary and the device do not change within a process */
    if (kp->fp8) return false;
    if (available < 0) available = sm90_available();
    if (!available) return false;
#define SM90_HD(K, V) if (head_dim_k == K && head_dim_v == V) return true;
    SM90_HD(64, 64) SM90_HD(128, 128) SM90_HD(256, 256) SM90_HD(128, 64) SM90_HD(192, 128)
#undef SM90_HD
    return false;
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
    if (head_dim_k == K && head_dim_v == V) return sm90_variant<K, V>(kp, n_tiles, s, err) ? -1 : 1;
    SM90_HD(64, 64) SM90_HD(128, 128) SM90_HD(256, 256) SM90_HD(128, 64) SM90_HD(192, 128)
#undef SM90_HD
    return 0;
}
