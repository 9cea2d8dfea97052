/* attention_decode_short.cu — the decode attention of a launch with one
 * split and no cascade rows (short contexts: attention.cu picks it when the
 * grid has n_splits == 1 and no cascade plan; AttnDecodeWork.no_short, set
 * by test_attention only, keeps attention_decode.cu's kernel).
 *
 * Why a kernel of its own: at batch 1 and a context of ~128 the decode
 * grid is one block per KV head, each SM runs the kernel once, and its time
 * is an instruction chain (ncu: 3.7k / 4.1k instructions a warp, bf16 /
 * fp8, ~23% of stall samples instruction-cache misses on a 6.3k / 9.5k
 * instruction body), not bytes. This body leaves out what such a launch
 * never runs and shortens the chain before the first tile:
 *  - no cascade, no split partials, no last-split merge (decode_merge_splits
 *    and its counter, fences and extra barriers): the block finishes its
 *    rows itself, two columns a thread (bf16x2 stores);
 *  - rope mode writes the new key and value straight into their row of the
 *    ring stage that holds the new key's tile (the loads leave that row
 *    alone: load_kv_tile's skip), so no decode_put_new pass and no barrier
 *    after it (rows whose new-key tile is past the up-front loads, ST tiles
 *    and more, keep that pass);
 *  - the rope pass is one list of work items over the 4 warps (the new key,
 *    the new value, then the query heads) through one code path (one copy of
 *    the norm + rope and of the quantizer), and with an fp8 cache each query
 *    head goes to f16 (the scaled, permuted form of q_rows_to_f16) in the
 *    warp that ropes it: no block-wide conversion pass and no barrier after
 *    it; without rope, fp8 queries take the same per-warp pass;
 *  - the first tile's wait and barrier, Q's fragments and fp8's row factors
 *    come before the key loop instead of as first-turn branches inside it;
 *    a row of at most ST tiles (all of them loaded up front) waits for them
 *    once and runs them with no barrier between tiles.
 * The key loop itself (the cp.async ring, 16 keys a warp a tile,
 * decode_tile) and the 4-warp merge are attention_decode.cuh's, the same
 * operations in the same order as attention_decode.cu: a row's output has
 * the same bits from either kernel (tests/gpu/test_attention.c checks it),
 * which the batch-invariant mode needs (a row may run in a grid of one split
 * or of several). Long rows in a one-split grid (many rows at once) run the
 * same ring as before. Not done for that reason: more warps a block (fewer
 * keys a warp at short contexts) would change the order of the sums.
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

/* A query row's bf16 values (as floats in the warp's buf) to f16 in place
 * in row, exactly as q_rows_to_f16<.., PERM> does it: times 2^(14 - e) for
 * amax < 2^e, value 16c + 4t + u at 16c + 2t + (u & 1) + 8 (u >> 1) (the
 * order decode_scores_fp8's K fragments hold the dimensions); *qsc gets the
 * scores' factor. Every lane of the warp calls it. */
template <int HD> static __device__ __forceinline__ void warp_q_row_to_f16(const float *buf, bf16 *row, float *qsc) {
    const int lane = threadIdx.x & 31;
    float amax = 0.f; /* fmaxf drops a nan, as q_rows_to_f16's does */
    for (int i = lane; i < HD; i += 32) amax = fmaxf(amax, fabsf(buf[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float undo;
    const float f = q_row_f16_factor(amax, &undo);
    __half *h = (__half *)row;
    for (int i = lane; i < HD; i += 32) {
        const int t = (i >> 2) & 3, u = i & 3;
        h[(i & ~15) + 2 * t + (u & 1) + 8 * (u >> 1)] = __float2half_rn(buf[i] * f);
    }
    if (lane == 0) *qsc = undo;
}

/* Where the rope pass puts the new key and value: their row of the ring
 * stage (direct), or nkv for decode_put_new; the cache slot `at` when store. */
typedef struct {
    unsigned char *k, *v; /* bf16 values, or e4m3 codes */
    float *ks, *vs;       /* fp8: their scales */
    int64_t at;
    bool store;
} ShortNewKV;

/* After decode_stage_rows and a barrier, work item `item` of the block's
 * rope / conversion pass, by one warp (buf: its fp32 head buffer): with
 * rope, item 0 the new key (qk-norm, rope, fp8 codes), item 1 the new
 * value, as decode_rope_rows does them; then the query heads: roped (rope
 * mode) and, with an fp8 cache, to f16 (warp_q_row_to_f16). One code path
 * for all of them (one copy of the norm + rope and of the quantizer: the
 * warps share the instruction cache, and it is cold). */
template <int HDK, int HDV, bool FP8, int RAW>
static __device__ void short_rows_item(const AttnKParams &p, int item, bf16 *sQ, float *qsc, float *buf,
                                       const unsigned char *nkv, const ShortNewKV &nw, int kvh, const RopeLaneCS &cs) {
    static_assert(HDV <= HDK, "buf holds HDK floats: the value's too");
    const int lane = threadIdx.x & 31;
    const bool is_key = p.rope && item == 0, is_value = p.rope && item == 1, is_q = !is_key && !is_value;
    const int hr = item - (p.rope ? 2 : 0), n = is_value ? HDV : HDK;
    bf16 *qr = sQ + hr * (HDK + 8); /* a query head's row (is_q) */
    const bf16 *raw = (const bf16 *)(nkv + RAW), *src = is_q ? qr : is_key ? raw : raw + HDK;
    for (int i = lane; i < n; i += 32) buf[i] = __bfloat162float(src[i]);
    __syncwarp(); /* a query row is read before any lane writes it (f16's order moves values across lanes) */
    if (p.rope && !is_value) warp_norm_rope_cs(buf, HDK, is_key ? p.k_norm : p.q_norm, p.qk_eps, p.qk_offset, cs, p.freqs);
    if (is_q) {
        if (FP8) warp_q_row_to_f16<HDK>(buf, qr, qsc + hr);
        else for (int i = lane; i < HDK; i += 32) qr[i] = __float2bfloat16(buf[i]);
    } else { /* the new key (roped) or value (as it is) into its place, and the cache (store) */
        unsigned char *dst = is_key ? nw.k : nw.v;
        if (FP8) {
            float *sc = is_key ? nw.ks : nw.vs;
            const float *fixed = is_key ? p.k_fixed : p.v_fixed;
            warp_quantize_fp8(buf, n, dst, sc, fixed ? fixed + kvh : nullptr);
            __syncwarp();
            uint8_t *cache = (uint8_t *)(is_key ? p.k : p.v) + nw.at * n;
            for (int i = lane; nw.store && i < n; i += 32) cache[i] = dst[i];
            if (nw.store && lane == 0) (is_key ? (float *)p.k_scale : (float *)p.v_scale)[nw.at] = *sc;
        } else {
            bf16 *cache = (bf16 *)(is_key ? p.k : p.v) + nw.at * n;
            for (int i = lane; i < n; i += 32) {
                const bf16 x = is_value ? src[i] : __float2bfloat16(buf[i]); /* the value's own bits, nans too */
                ((bf16 *)dst)[i] = x;
                if (nw.store) cache[i] = x;
            }
        }
    }
    __syncwarp(); /* buf is the next item's */
}

/* __launch_bounds__(128, 1): with the bare 128, ptxas held several variants to 96 or 128 registers and
 * spilled (4-28 bytes); with 1 it takes what it needs, spills none, and the fp8 variants at head size <= 128
 * stay under 168 registers, so their 3 blocks an SM (DecodeShape) still fit. */
template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__global__ void __launch_bounds__(128, 1) attn_decode_short_kernel(const AttnKParams p) {
    using S = DecodeShape<HDK, HDV, FP8>;
    constexpr int BN = S::BN, NT = S::NT, SK = S::SK, SV = S::SV, ST = S::STAGES;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem;
    float *qsc = (float *)(sQ + 16 * SK);                     /* fp8: 16 row factors of Q */
    float *rope_buf = qsc + 16;                               /* rope mode / fp8: S::NW x HDK */
    unsigned char *nkv = (unsigned char *)(rope_buf + S::NW * HDK); /* rope mode: the new key and value */
    unsigned char *ring = nkv + S::NEW_KV;

    /* the step's metadata was uploaded before the step: readable before pdl_wait */
    const int kvh = blockIdx.y / p.n_groups, grp = blockIdx.y % p.n_groups, d = blockIdx.z;
    const int32_t *dec = p.meta + p.off_decode + 3 * d;
    const int row = dec[0], pos = dec[2];
    const int32_t *tab = p.meta + p.off_tables + (int64_t)dec[1] * p.table_width;
    const int h0 = kvh * p.group + grp * 16, nh = min(16, p.group - grp * 16);
    const int lo = WIN ? max(pos - p.window + 1, 0) : 0, hi = pos + 1;
    const int ts = lo / BN, te = (hi + BN - 1) / BN; /* one split: the row's whole range */
    const int t_new = te - 1;                        /* the tile of the new key (pos = hi - 1) */
    /* rope mode: the new key's row is written by the rope pass (direct: into its tile's stage, one of the
     * up-front loads) or by decode_put_new at its turn; the loads never touch it */
    const bool direct = p.rope && t_new - ts < ST, late_new = p.rope && !direct;
    const int skip = p.rope ? pos : -1, r_new = pos - t_new * BN;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    auto stage = [&](int st) { return ring + st * S::STAGE; };
    /* bf16 stage: K tile | V tile; fp8 stage: K bytes | V bytes ([BN][RSK], [BN][RSV]) | K scales | V scales */
    auto kbuf = [&](int st) { return (bf16 *)stage(st); };
    auto vbuf = [&](int st) { return (bf16 *)stage(st) + BN * SK; };
    auto k8 = [&](int st) { return (uint8_t *)stage(st); };
    auto v8 = [&](int st) { return k8(st) + BN * S::RSK; };
    auto ks = [&](int st) { return (float *)(v8(st) + BN * S::RSV); };
    auto vs = [&](int st) { return ks(st) + BN; };
    auto load_stage = [&](int st, int t) {
        if (FP8) {
            load_kv_tile_fp8<HDK, BN, NT, S::RSK, true>(k8(st), ks(st), (const uint8_t *)p.k, p.k_scale, tab, p,
                                                        kvh, t * BN, lo, hi, skip);
            load_kv_tile_fp8<HDV, BN, NT, S::RSV, true>(v8(st), vs(st), (const uint8_t *)p.v, p.v_scale, tab, p,
                                                        kvh, t * BN, lo, hi, skip);
        } else {
            load_kv_tile<HDK, BN, NT, true>(kbuf(st), (const bf16 *)p.k, tab, p, kvh, t * BN, lo, hi, skip);
            load_kv_tile<HDV, BN, NT, true>(vbuf(st), (const bf16 *)p.v, tab, p, kvh, t * BN, lo, hi, skip);
        }
    };

    /* pdl_wait only (attention_decode.cu says why the dependents are not let go early) */
    if (!p.rope) {
        pdl_wait();
        if (!FP8) load_rows<HDK, 16, NT>(sQ, p.q + ((int64_t)row * p.n_heads + h0) * HDK, HDK, nh);
    }
#pragma unroll 1 /* one copy of the loads' code: unrolled, the ST copies were ~30% of the body (bf16) */
    for (int st = 0; st < ST; st++) {
        if (ts + st < te) load_stage(st, ts + st);
        cp_async_commit(); /* empty groups keep the wait counts uniform */
    }
    if (p.rope || FP8) { /* the cached keys are in flight; now the qkv product's rows */
        const RopeLaneCS cs = p.rope ? rope_lane_cs((float)pos, p.freqs) : RopeLaneCS{}; /* before the wait */
        ShortNewKV nw = {};
        if (p.rope) {
            const int64_t slot = p.slot[row];
            const int sn = t_new - ts;
            nw.store = grp == 0 && slot >= 0 && slot < p.n_slots;
            nw.at = nw.store ? slot * p.n_kv_heads + kvh : 0;
            if (!direct) { /* nkv, as decode_put_new reads it */
                nw.k = nkv, nw.v = nkv + (FP8 ? HDK : 2 * HDK);
                nw.ks = (float *)(nkv + (FP8 ? HDK + HDV : 2 * (HDK + HDV))), nw.vs = nw.ks + 1;
            } else if (FP8) {
                nw.k = k8(sn) + r_new * S::RSK, nw.v = v8(sn) + r_new * S::RSV;
                nw.ks = ks(sn) + r_new, nw.vs = vs(sn) + r_new;
            } else {
                nw.k = (unsigned char *)(kbuf(sn) + r_new * SK), nw.v = (unsigned char *)(vbuf(sn) + r_new * SV);
            }
            pdl_wait();
        }
        decode_stage_rows<HDK, HDV, NT, S::RAW>(p, sQ, nkv, row, kvh, h0, nh, p.rope);
        if (FP8) /* rows past nh stay zeros; their factor as q_rows_to_f16 gives it */
            for (int r = nh + (int)threadIdx.x; r < 16; r += NT) q_row_f16_factor(0.f, qsc + r);
        __syncthreads();
        const int items = nh + (p.rope ? 2 : 0);
        for (int it = warp; it < items; it += S::NW)
            short_rows_item<HDK, HDV, FP8, S::RAW>(p, it, sQ, qsc, rope_buf + warp * HDK, nkv, nw, kvh, cs);
    }

    /* every tile requested up front (at most ST: the short rows): wait for all of them once, then no ring
     * turns and no barriers between tiles (in rope mode up_front is direct: no put-new pass either) */
    const bool up_front = te - ts <= ST;
    if (up_front) cp_async_wait<0>();
    else cp_async_wait<ST - 1>(); /* tile ts (commit group 0) */
    __syncthreads();              /* ... Q and the rope pass's rows too: in place for every thread */
    float o[HDV / 8][4];
#pragma unroll
    for (int i = 0; i < HDV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float qr[2] = {1.f, 1.f}, vref = 0.f; /* fp8: rows g, g + 8's logit factors; the warp's value-scale reference */
    if (FP8) qr[0] = attn_row_factor_fp8<CAP>(qsc[g], p), qr[1] = attn_row_factor_fp8<CAP>(qsc[g + 8], p);
    uint32_t qf[S::Q_IN_REGS ? HDK / 16 : 1][4];
    const uint32_t q_addr = smem_u32(sQ + (lane & 15) * SK + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < (S::Q_IN_REGS ? HDK / 16 : 0); kk++)
        ldsm_x4(q_addr + kk * 32, qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);

    for (int t = ts; t < te; t++) {
        const int st = (t - ts) % ST;
        if (!up_front && t > ts) { /* the ring's turn, as attention_decode.cu counts its groups */
            cp_async_wait<ST - 2>();
            __syncthreads(); /* tile t landed for all threads; stage of t - 1 is free */
            if (t + ST - 1 < te) load_stage((t - 1 - ts) % ST, t + ST - 1);
            cp_async_commit();
        }
        if (late_new && t == t_new) {
            decode_put_new<HDK, HDV, FP8, NT, S::RSK, S::RSV>(nkv, kbuf(st), vbuf(st), k8(st), v8(st), ks(st), vs(st),
                                                              r_new);
            __syncthreads();
        }
        decode_tile<HDK, HDV, CAP, FP8>(o, mx, l, qr, vref, qf, q_addr, stage(st), t, lo, hi, p, warp, lane);
    }

    /* merge the 4 warps' states through shared memory (the ring is free now) and finish the rows */
    cp_async_wait<0>();
    __syncthreads();
    constexpr int MS = S::MS;
    float *mo = (float *)ring;     /* [4][16][MS] */
    float *mml = mo + 4 * 16 * MS; /* [4][16][2] */
    decode_warp_store<HDV, FP8, MS>(o, mx, l, vref, mo, mml, warp, lane);
    __syncthreads();
    for (int i = threadIdx.x; i < nh * (HDV / 2); i += NT) { /* columns c, c + 1 of row hr */
        const int hr = i / (HDV / 2), c = 2 * (i % (HDV / 2));
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++) m = fmaxf(m, mml[(w * 16 + hr) * 2]);
        float base = m == -INFINITY ? 0.f : m, acc0 = 0.f, acc1 = 0.f, sum = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float f = exp2f(mml[(w * 16 + hr) * 2] - base);
            const float2 o = *(const float2 *)(mo + (w * 16 + hr) * MS + c);
            acc0 += f * o.x, acc1 += f * o.y;
            sum += f * mml[(w * 16 + hr) * 2 + 1];
        }
        *(__nv_bfloat162 *)(p.out + ((int64_t)row * p.n_heads + h0 + hr) * HDV + c) = __floats2bfloat162_rn(
            decode_finish_one(p, h0 + hr, m, sum, acc0), decode_finish_one(p, h0 + hr, m, sum, acc1));
    }
}

template <int HDK, int HDV, bool FP8>
static int decode_short_variant(const AttnKParams *kp, int n_decode, cudaStream_t s, Err *err) {
    constexpr int SMEM = DecodeShape<HDK, HDV, FP8>::SMEM;
    return attn_cap_win(kp, [&](auto cap, auto win) {
        auto kernel = attn_decode_short_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, FP8>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM), err);
        CUDA_CHECK(launch_pdl(kernel, dim3(1, kp->n_kv_heads * kp->n_groups, n_decode), 128, SMEM, s, *kp), err);
        return 0;
    });
}

extern "C" int attn_decode_short_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode,
                                        cudaStream_t s, Err *err) {
    if (n_decode == 0) return 0;
    if (kp->n_splits != 1 || kp->casc)
        return err_set(err, "attention: the short decode kernel takes one split and no cascade (n_splits %d)",
                       kp->n_splits);
#define ATTN_HD(K, V)                                                                                        \
    if (head_dim_k == K && head_dim_v == V)                                                                  \
        return kp->fp8 ? decode_short_variant<K, V, true>(kp, n_decode, s, err)                              \
                       : decode_short_variant<K, V, false>(kp, n_decode, s, err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return err_set(err, "attention: head sizes k=%d v=%d have no decode kernel (supported: %s)", head_dim_k, head_dim_v,
                   ATTN_HEAD_DIMS_TEXT);
}
