/* attention_decode.cu — split-KV flash-decoding over the paged KV cache
 * (bf16, or fp8 e4m3 with scales; DESIGN.md "Attention"), then a combine
 * kernel.
 *
 * One block of 4 warps handles one decode row, one KV head, up to 16 of that
 * KV head's query heads (GQA / MQA: the K/V bytes are read once for the whole
 * group, as the 16 rows of one m16n8k16 tile) and one split of the row's key
 * range. Key tiles of 64 keys stream through a 3-stage cp.async ring (2 at
 * head size 256); each warp takes 16 keys of a tile with its own online
 * softmax, and the 4 warps merge through shared memory at the end. Each
 * split writes its unnormalized output, running max and sum; the combine
 * kernel merges the splits and adds the sink (with one split in the grid
 * the decode kernel finishes its rows itself: decode_finish_one). The grid is (n_splits,
 * n_kv_heads x head groups, n_decode): it depends on no per-step value, so a
 * captured launch replays for any context up to the one n_splits was chosen
 * for. A windowed row visits only the tiles of its window.
 *
 * fp8 cache (FP8 = true): the ring holds the tiles' e4m3 bytes and scales
 * (half the bytes of bf16, so a stage is half the size and the ring one
 * stage deeper); once a tile has landed the block converts it to one bf16
 * tile (attention_common.cuh convert_kv_tile_fp8) and the math below runs
 * on that unchanged. Decode is bound by the bytes read, so the conversion
 * (~2 instructions per value) hides under the loads of the next stages.
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

/* ---- kernels ---- */

/* Splits of a decode row of nt key tiles: the step's n_splits, or (batch-
 * invariant mode) a count from the row's own range, never above the grid's. */
static __device__ __forceinline__ int decode_row_splits(const AttnKParams &p, int nt) {
    return p.split_tiles > 0 ? min(p.n_splits, attn_row_splits(nt, p.split_tiles)) : p.n_splits;
}

/* The combine of a row whose key range is one split: its output value from
 * the split's running max m, sum l and unnormalized output o, with the
 * sink. The decode kernel calls it itself when the grid has one split (no
 * combine launch: ~3.4 us a layer at short contexts on the H200), and the
 * combine kernel for its one-split rows, so a row's bits do not depend on
 * which kernel finished it (the batch-invariant mode relies on that). */
static __device__ __forceinline__ float decode_finish_one(const AttnKParams &p, int h, float m, float l, float o) {
    const float sink = p.sinks ? p.sinks[h] * ATTN_LOG2E : -INFINITY, mm = fmaxf(sink, m);
    const float base = mm == -INFINITY ? 0.f : mm, e = exp2f(m - base);
    float sum = p.sinks ? exp2f(sink - base) : 0.f;
    sum += e * l;
    return e * o * (sum > 0.f ? 1.f / sum : 0.f);
}

template <int HDK, int HDV, bool FP8> struct DecodeShape {
    static constexpr int BN = ATTN_DECODE_TILE_N, NW = 4, NT = 32 * NW;
    static constexpr bool BIG = HDK > 128 || HDV > 128;
    static constexpr int STAGES = FP8 ? (BIG ? 3 : 4) : (BIG ? 2 : 3);
    static constexpr int SK = HDK + 8, SV = HDV + 8;
    static constexpr bool Q_IN_REGS = HDK <= 128;
    /* a ring stage: bf16 K|V tiles, or e4m3 K|V bytes and their 2 x BN scales */
    static constexpr int STAGE = FP8 ? BN * (HDK + HDV) + 2 * BN * 4 : BN * (SK + SV) * 2;
    static constexpr int TILE = FP8 ? BN * (SK + SV) * 2 : 0; /* fp8: the converted bf16 K|V tile */
    static constexpr int RING = STAGES * STAGE + TILE;
    static constexpr int MERGE = NW * 16 * (HDV + 2) * 4; /* per-warp O, m, l; reuses the ring */
    static constexpr int SMEM = 16 * SK * 2 + (RING > MERGE ? RING : MERGE);
    static_assert(BN == 16 * NW, "one warp per 16 keys of a tile");
    static_assert(STAGE % 16 == 0, "stages keep 16-byte alignment");
};

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__global__ void __launch_bounds__(128) attn_decode_kernel(const AttnKParams p) {
    pdl_enter();
    using S = DecodeShape<HDK, HDV, FP8>;
    constexpr int BN = S::BN, NT = S::NT, SK = S::SK, SV = S::SV, ST = S::STAGES;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem;
    unsigned char *ring = (unsigned char *)(sQ + 16 * SK);

    const int split = blockIdx.x, kvh = blockIdx.y / p.n_groups, grp = blockIdx.y % p.n_groups, d = blockIdx.z;
    const int32_t *dec = p.meta + p.off_decode + 3 * d;
    const int row = dec[0], pos = dec[2];
    const int32_t *tab = p.meta + p.off_tables + (int64_t)dec[1] * p.table_width;
    const int h0 = kvh * p.group + grp * 16, nh = min(16, p.group - grp * 16);
    const int lo = WIN ? max(0, pos - p.window + 1) : 0, hi = pos + 1;
    const int tb = lo / BN, nt = (hi + BN - 1) / BN - tb, ns = decode_row_splits(p, nt);
    if (split >= ns) return; /* past this row's own splits (batch-invariant mode): the whole block leaves */
    const int per = (nt + ns - 1) / ns;
    const int ts = tb + split * per, te = min(ts + per, tb + nt);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tg = lane & 3;
    /* bf16: stage st's K and V tiles; fp8: the converted tile (one for all stages) */
    bf16 *tile = (bf16 *)(ring + ST * S::STAGE);
    auto kbuf = [&](int st) { return FP8 ? tile : (bf16 *)(ring + st * S::STAGE); };
    auto vbuf = [&](int st) { return FP8 ? tile + BN * SK : (bf16 *)(ring + st * S::STAGE) + BN * SK; };
    /* fp8 stage st: K bytes | V bytes | K scales | V scales */
    auto k8 = [&](int st) { return (uint8_t *)(ring + st * S::STAGE); };
    auto v8 = [&](int st) { return k8(st) + BN * HDK; };
    auto ks = [&](int st) { return (float *)(v8(st) + BN * HDV); };
    auto vs = [&](int st) { return ks(st) + BN; };
    auto load_stage = [&](int st, int t) {
        if (FP8) {
            load_kv_tile_fp8<HDK, BN, NT>(k8(st), ks(st), (const uint8_t *)p.k, p.k_scale, tab, p, kvh, t * BN, lo, hi);
            load_kv_tile_fp8<HDV, BN, NT>(v8(st), vs(st), (const uint8_t *)p.v, p.v_scale, tab, p, kvh, t * BN, lo, hi);
        } else {
            load_kv_tile<HDK, BN, NT>(kbuf(st), (const bf16 *)p.k, tab, p, kvh, t * BN, lo, hi);
            load_kv_tile<HDV, BN, NT>(vbuf(st), (const bf16 *)p.v, tab, p, kvh, t * BN, lo, hi);
        }
    };

    load_rows<HDK, 16, NT>(sQ, p.q + ((int64_t)row * p.n_heads + h0) * HDK, HDK, nh);
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (ts + st < te) load_stage(st, ts + st);
        cp_async_commit(); /* empty groups keep the wait counts uniform */
    }

    uint32_t qf[S::Q_IN_REGS ? HDK / 16 : 1][4];
    float o[HDV / 8][4];
#pragma unroll
    for (int i = 0; i < HDV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const uint32_t q_addr = smem_u32(sQ + (lane & 15) * SK + (lane >> 4) * 8);

    for (int t = ts; t < te; t++) {
        const int st = (t - ts) % ST;
        cp_async_wait<ST - 2>();
        __syncthreads(); /* tile t landed for all threads; stage of t - 1 is free */
        if (t + ST - 1 < te) load_stage((t + ST - 1 - ts) % ST, t + ST - 1);
        cp_async_commit();
        if (FP8) { /* every thread is past tile t - 1's math (the barrier above): the bf16 tile is free */
            convert_kv_tile_fp8<HDK, BN, NT>(tile, k8(st), ks(st));
            convert_kv_tile_fp8<HDV, BN, NT>(tile + BN * SK, v8(st), vs(st));
            __syncthreads();
        }
        if (S::Q_IN_REGS && t == ts) {
#pragma unroll
            for (int kk = 0; kk < (S::Q_IN_REGS ? HDK / 16 : 0); kk++)
                ldsm_x4(q_addr + kk * 32, qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
        }

        /* S (16 heads x this warp's 16 keys) */
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const uint32_t k_addr =
            smem_u32(kbuf(st) + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * SK + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int kk = 0; kk < HDK / 16; kk++) {
            uint32_t a[4];
            if (S::Q_IN_REGS) {
                a[0] = qf[S::Q_IN_REGS ? kk : 0][0], a[1] = qf[S::Q_IN_REGS ? kk : 0][1];
                a[2] = qf[S::Q_IN_REGS ? kk : 0][2], a[3] = qf[S::Q_IN_REGS ? kk : 0][3];
            } else {
                ldsm_x4(q_addr + kk * 32, a[0], a[1], a[2], a[3]);
            }
            uint32_t b0, b1, b2, b3;
            ldsm_x4(k_addr + kk * 32, b0, b1, b2, b3);
            mma_bf16(s[0], a, b0, b1);
            mma_bf16(s[1], a, b2, b3);
        }
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = t * BN + warp * 16 + i * 8 + 2 * tg + (e & 1);
                float x = j >= lo && j < hi ? attn_logit<CAP>(s[i][e], p) : -INFINITY;
                s[i][e] = x;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
            }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mnew = fmaxf(mx[r], quad_max(tmax[r]));
            base[r] = mnew == -INFINITY ? 0.f : mnew;
            alpha[r] = exp2f(mx[r] - base[r]);
            mx[r] = mnew;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[i][e] = exp2f(s[i][e] - base[e >> 1]);
                l[e >> 1] += s[i][e];
            }
        uint32_t a[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                         pack_bf16(s[1][2], s[1][3])};
        const uint32_t v_addr =
            smem_u32(vbuf(st) + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SV + (lane >> 4) * 8);
#pragma unroll
        for (int nn = 0; nn < HDV / 16; nn++) {
            o[2 * nn][0] *= alpha[0], o[2 * nn][1] *= alpha[0], o[2 * nn][2] *= alpha[1], o[2 * nn][3] *= alpha[1];
            o[2 * nn + 1][0] *= alpha[0], o[2 * nn + 1][1] *= alpha[0];
            o[2 * nn + 1][2] *= alpha[1], o[2 * nn + 1][3] *= alpha[1];
            uint32_t b0, b1, b2, b3;
            ldsm_x4_t(v_addr + nn * 32, b0, b1, b2, b3);
            mma_bf16(o[2 * nn], a, b0, b1);
            mma_bf16(o[2 * nn + 1], a, b2, b3);
        }
    }

    /* merge the 4 warps' states through shared memory (the ring is free now) */
    cp_async_wait<0>();
    __syncthreads();
    float *mo = (float *)ring;                    /* [4][16][HDV] */
    float *mml = mo + 4 * 16 * HDV;               /* [4][16][2] */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int hr = g + 8 * r;
        float sum = quad_sum(l[r]);
        if (tg == 0) mml[(warp * 16 + hr) * 2] = mx[r], mml[(warp * 16 + hr) * 2 + 1] = sum;
#pragma unroll
        for (int i = 0; i < HDV / 8; i++) {
            mo[(warp * 16 + hr) * HDV + i * 8 + 2 * tg] = o[i][2 * r];
            mo[(warp * 16 + hr) * HDV + i * 8 + 2 * tg + 1] = o[i][2 * r + 1];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * HDV; i += NT) {
        int hr = i / HDV, c = i % HDV;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++) m = fmaxf(m, mml[(w * 16 + hr) * 2]);
        float base = m == -INFINITY ? 0.f : m, acc = 0.f, sum = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float f = exp2f(mml[(w * 16 + hr) * 2] - base);
            acc += f * mo[(w * 16 + hr) * HDV + c];
            sum += f * mml[(w * 16 + hr) * 2 + 1];
        }
        if (p.n_splits == 1) { /* the whole key range: finish here, no combine */
            p.out[((int64_t)row * p.n_heads + h0 + hr) * HDV + c] =
                __float2bfloat16(decode_finish_one(p, h0 + hr, m, sum, acc));
            continue;
        }
        int64_t at = ((int64_t)d * p.n_heads + h0 + hr) * p.n_splits + split;
        p.part_o[at * HDV + c] = acc;
        if (c == 0) p.part_ml[at * 2] = m, p.part_ml[at * 2 + 1] = sum;
    }
}

/* out[row][h] = sum over splits of exp2(m_s - M) o_s / (sum of exp2(m_s - M) l_s + exp2(sink - M)). */
template <int HDV>
__global__ void __launch_bounds__(128) attn_decode_combine_kernel(const AttnKParams p) {
    pdl_enter();
    const int d = blockIdx.x, h = blockIdx.y;
    const int row = p.meta[p.off_decode + 3 * d], pos = p.meta[p.off_decode + 3 * d + 2];
    const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0, BN = ATTN_DECODE_TILE_N;
    const int ns = decode_row_splits(p, (pos + BN) / BN - lo / BN); /* the kernel's nt: keys lo..pos */
    const int64_t at = ((int64_t)d * p.n_heads + h) * p.n_splits;
    const float *ml = p.part_ml + at * 2;
    if (ns == 1) {
        for (int c = threadIdx.x; c < HDV; c += blockDim.x)
            p.out[((int64_t)row * p.n_heads + h) * HDV + c] =
                __float2bfloat16(decode_finish_one(p, h, ml[0], ml[1], p.part_o[at * HDV + c]));
        return;
    }
    float m = p.sinks ? p.sinks[h] * ATTN_LOG2E : -INFINITY;
    for (int s = 0; s < ns; s++) m = fmaxf(m, ml[2 * s]);
    float base = m == -INFINITY ? 0.f : m;
    float sum = p.sinks ? exp2f(p.sinks[h] * ATTN_LOG2E - base) : 0.f;
    for (int s = 0; s < ns; s++) sum += exp2f(ml[2 * s] - base) * ml[2 * s + 1];
    float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int c = threadIdx.x; c < HDV; c += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < ns; s++) acc += exp2f(ml[2 * s] - base) * p.part_o[(at + s) * HDV + c];
        p.out[((int64_t)row * p.n_heads + h) * HDV + c] = __float2bfloat16(acc * inv);
    }
}

/* ---- launchers ---- */

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
static int decode_launch(const AttnKParams *kp, int n_decode, cudaStream_t s, Err *err) {
    constexpr int SMEM = DecodeShape<HDK, HDV, FP8>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel<HDK, HDV, CAP, WIN, FP8>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM),
               err);
    CUDA_CHECK(launch_pdl(attn_decode_kernel<HDK, HDV, CAP, WIN, FP8>,
                          dim3(kp->n_splits, kp->n_kv_heads * kp->n_groups, n_decode), 128, SMEM, s, *kp),
               err);
    if (kp->n_splits == 1) return 0; /* the decode kernel finished every row */
    CUDA_CHECK(launch_pdl(attn_decode_combine_kernel<HDV>, dim3(n_decode, kp->n_heads), 128, 0, s, *kp), err);
    return 0;
}

template <int HDK, int HDV, bool FP8>
static int decode_variant(const AttnKParams *kp, int n_decode, cudaStream_t s, Err *err) {
    bool cap = kp->cap_in != 0.f, win = kp->window > 0;
    if (cap && win) return decode_launch<HDK, HDV, true, true, FP8>(kp, n_decode, s, err);
    if (cap) return decode_launch<HDK, HDV, true, false, FP8>(kp, n_decode, s, err);
    if (win) return decode_launch<HDK, HDV, false, true, FP8>(kp, n_decode, s, err);
    return decode_launch<HDK, HDV, false, false, FP8>(kp, n_decode, s, err);
}

extern "C" int attn_decode_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode, cudaStream_t s,
                                  Err *err) {
    if (n_decode == 0) return 0;
#define ATTN_HD(K, V)                                                                                  \
    if (head_dim_k == K && head_dim_v == V)                                                            \
        return kp->fp8 ? decode_variant<K, V, true>(kp, n_decode, s, err) : decode_variant<K, V, false>(kp, n_decode, s, err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return err_set(err, "attention: head sizes k=%d v=%d have no decode kernel (supported: %s)", head_dim_k, head_dim_v,
                   ATTN_HEAD_DIMS_TEXT);
}
