/* attention_decode.cuh — the decode attention kernels' shared parts: the
 * block's shape (DecodeShape), the rope mode's staging and rope of the rows,
 * the per-tile step of a warp (scores, mask, online softmax, P V:
 * decode_tile and its parts) and the store of a warp's state for the 4-warp
 * merge. Two kernels use them: attention_decode.cu (any split count,
 * cascade rows, the split merge) and attention_decode_short.cu (one split,
 * no cascade: the short-context launches) run decode_tile and
 * decode_warp_store, so a row's output has the same bits from both
 * (test_attention checks it); attention_decode_rows.cu (a warp per item,
 * the heads as the n8 columns) has its own products on the same
 * arithmetic. Each part is __forceinline__ and was checked against the
 * kernels' SASS before it (instruction counts, registers; kernels/README.md
 * "Decode"). */
#ifndef CLLM_ATTENTION_DECODE_CUH
#define CLLM_ATTENTION_DECODE_CUH

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"

/* The output value of a row whose key range is one split, from the split's
 * running max m, sum l and unnormalized output o, with the sink: the block
 * finishes the row itself (no partials, no merge). */
static __device__ __forceinline__ float decode_finish_one(const AttnKParams &p, int h, float m, float l, float o) {
    const float sink = p.sinks ? p.sinks[h] * ATTN_LOG2E : -INFINITY, mm = fmaxf(sink, m);
    const float base = mm == -INFINITY ? 0.f : mm, e = exp2f(m - base);
    float sum = p.sinks ? exp2f(sink - base) : 0.f;
    sum += e * l;
    return e * o * (sum > 0.f ? 1.f / sum : 0.f);
}

/* Rope mode, right after pdl_wait (every thread): the block's query rows as
 * the qkv product wrote them into sQ (rows past nh zeroed) and, where the
 * block's split holds the row's new key (has_new), that key and its value
 * into nkv's raw area: one round of 16-byte loads for all of them, so the
 * rows wait for one L2 trip instead of one per warp's turn. */
template <int HDK, int HDV, int NT, int RAW>
static __device__ void decode_stage_rows(const AttnKParams &p, bf16 *sQ, unsigned char *nkv, int row, int kvh, int h0,
                                         int nh, bool has_new) {
    constexpr int CK = HDK / 8, CV = HDV / 8; /* 16-byte chunks of a head vector */
    const bf16 *q = p.q + ((int64_t)row * p.n_heads + h0) * HDK;
    for (int i = threadIdx.x; i < 16 * CK; i += NT) {
        const int hr = i / CK, c = i % CK;
        *(uint4 *)(sQ + hr * (HDK + 8) + 8 * c) = hr < nh ? *(const uint4 *)(q + hr * HDK + 8 * c) : make_uint4(0, 0, 0, 0);
    }
    if (!has_new) return;
    const bf16 *k = p.k_new + ((int64_t)row * p.n_kv_heads + kvh) * HDK;
    const bf16 *v = p.v_new + ((int64_t)row * p.n_kv_heads + kvh) * HDV;
    bf16 *raw = (bf16 *)(nkv + RAW);
    for (int i = threadIdx.x; i < CK + CV; i += NT)
        *(uint4 *)(raw + 8 * i) = i < CK ? *(const uint4 *)(k + 8 * i) : *(const uint4 *)(v + 8 * (i - CK));
}

/* Rope mode, after decode_stage_rows and a barrier: the query rows in sQ
 * qk-normed and roped in place as kernel_rope_kv_write does it (cs: the
 * lane's cos and sin of this position); where has_new, the new key roped and
 * its value into nkv (bf16, or fp8 codes then the two scales) for the last
 * tile, and (store) into the cache. */
template <int HDK, int HDV, bool FP8, int NW, int RAW>
static __device__ void decode_rope_rows(const AttnKParams &p, bf16 *sQ, float *buf, unsigned char *nkv, int row,
                                        int kvh, int nh, bool has_new, bool store, const RopeLaneCS &cs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    buf += warp * HDK;
    for (int hr = warp; hr < nh; hr += NW) {
        bf16 *qr = sQ + hr * (HDK + 8);
        for (int i = lane; i < HDK; i += 32) buf[i] = __bfloat162float(qr[i]);
        warp_norm_rope_cs(buf, HDK, p.q_norm, p.qk_eps, p.qk_offset, cs, p.freqs);
        for (int i = lane; i < HDK; i += 32) qr[i] = __float2bfloat16(buf[i]);
        __syncwarp(); /* buf is the next head's */
    }
    if (!has_new || warp > 1) return;
    const int64_t at = store ? p.slot[row] * p.n_kv_heads + kvh : 0;
    const bf16 *raw = (const bf16 *)(nkv + RAW);
    float *scales = (float *)(nkv + HDK + HDV);
    if (warp == 0) { /* the new key */
        for (int i = lane; i < HDK; i += 32) buf[i] = __bfloat162float(raw[i]);
        warp_norm_rope_cs(buf, HDK, p.k_norm, p.qk_eps, p.qk_offset, cs, p.freqs);
        if (FP8) {
            warp_quantize_fp8(buf, HDK, nkv, scales, p.k_fixed ? p.k_fixed + kvh : nullptr);
            __syncwarp();
            for (int i = lane; store && i < HDK; i += 32) ((uint8_t *)p.k)[at * HDK + i] = nkv[i];
            if (store && lane == 0) ((float *)p.k_scale)[at] = scales[0];
        } else {
            for (int i = lane; i < HDK; i += 32) {
                const bf16 x = __float2bfloat16(buf[i]);
                ((bf16 *)nkv)[i] = x;
                if (store) ((bf16 *)p.k)[at * HDK + i] = x;
            }
        }
    } else { /* the new value, as it is */
        const bf16 *src = raw + HDK;
        if (FP8) {
            warp_quantize_fp8(src, HDV, nkv + HDK, scales + 1, p.v_fixed ? p.v_fixed + kvh : nullptr);
            __syncwarp();
            for (int i = lane; store && i < HDV; i += 32) ((uint8_t *)p.v)[at * HDV + i] = nkv[HDK + i];
            if (store && lane == 0) ((float *)p.v_scale)[at] = scales[1];
        } else {
            for (int i = lane; i < HDV; i += 32) {
                ((bf16 *)nkv)[HDK + i] = src[i];
                if (store) ((bf16 *)p.v)[at * HDV + i] = src[i];
            }
        }
    }
}

/* Rope mode: the new key and value (nkv, from decode_rope_rows) into row r
 * of the landed tile (bf16: K and V tiles; fp8: the stage's codes and
 * scales, before their conversion); the loads left that row out. */
template <int HDK, int HDV, bool FP8, int NT, int RSK, int RSV>
static __device__ void decode_put_new(const unsigned char *nkv, bf16 *kt, bf16 *vt, uint8_t *k8, uint8_t *v8,
                                      float *ks, float *vs, int r) {
    const float *scales = (const float *)(nkv + HDK + HDV);
    if (FP8) {
        for (int i = threadIdx.x; i < HDK; i += NT) k8[r * RSK + i] = nkv[i];
        for (int i = threadIdx.x; i < HDV; i += NT) v8[r * RSV + i] = nkv[HDK + i];
        if (threadIdx.x == 0) ks[r] = scales[0], vs[r] = scales[1];
    } else {
        for (int i = threadIdx.x; i < HDK; i += NT) kt[r * (HDK + 8) + i] = ((const bf16 *)nkv)[i];
        for (int i = threadIdx.x; i < HDV; i += NT) vt[r * (HDV + 8) + i] = ((const bf16 *)nkv)[HDK + i];
    }
}

/* fp8: S += Q K^T for this warp's 16 keys, straight from the stage's e4m3
 * bytes ([BN][RSK]). ldmatrix x4 reads keys 0-7 and 8-15 of two 16-code
 * chunks; lane (g, t) gets codes 4t..4t+3 of key g in one word, whose two
 * halves are the B fragment's two registers: they stand for dimensions
 * 2t, 2t + 1, 2t + 8, 2t + 9 of the product, so Q was permuted to match.
 * s gets q . code (no scales yet). */
template <int HDK, int RSK, bool QREG>
static __device__ __forceinline__ void decode_scores_fp8(float (&s)[2][4], const uint32_t (*qf)[4], uint32_t q_addr,
                                                         const uint8_t *k8, int warp, int lane) {
    constexpr int CH = HDK / 16;
    const uint32_t k_addr = smem_u32(k8 + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RSK + (lane >> 4) * 16);
    auto q_frag = [&](int c, uint32_t(&a)[4]) {
        if (QREG) a[0] = qf[c][0], a[1] = qf[c][1], a[2] = qf[c][2], a[3] = qf[c][3];
        else ldsm_x4(q_addr + c * 32, a[0], a[1], a[2], a[3]);
    };
#pragma unroll
    for (int c = 0; c < CH; c += 2) {
        uint32_t w[4], a[4];
        ldsm_fp8_chunks<false>(k_addr + c * 16, c + 1 < CH, w); /* head size 80: the last chunk alone */
#pragma unroll
        for (int h = 0; h < (c + 1 < CH ? 2 : 1); h++) {
            q_frag(c + h, a);
            mma_f16(s[0], a, e4m3x2_to_f16x2(w[2 * h]), e4m3x2_to_f16x2(w[2 * h] >> 16));
            mma_f16(s[1], a, e4m3x2_to_f16x2(w[2 * h + 1]), e4m3x2_to_f16x2(w[2 * h + 1] >> 16));
        }
    }
}

/* fp8: O += P V from the stage's e4m3 value bytes ([BN][RSV]). ldmatrix
 * .trans on the bytes gives lane (g, t) keys 2t, 2t + 1 x dimensions 2g,
 * 2g + 1 of a 16-code chunk; a byte permute makes that two B registers, one
 * for dimension 2g (n-tile 2c) and one for 2g + 1 (n-tile 2c + 1). So column
 * j of o[2c + e] is dimension 16c + 2j + e (the merge puts it back). */
template <int HDV, int RSV>
static __device__ __forceinline__ void decode_pv_fp8(float (&o)[HDV / 8][4], const uint32_t (&a)[4], const uint8_t *v8,
                                                     int warp, int lane) {
    constexpr int CH = HDV / 16;
    const uint32_t v_addr = smem_u32(v8 + (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RSV + (lane >> 4) * 16);
#pragma unroll
    for (int c = 0; c < CH; c += 2) {
        uint32_t w[4];
        ldsm_fp8_chunks<true>(v_addr + c * 16, c + 1 < CH, w);
#pragma unroll
        for (int h = 0; h < (c + 1 < CH ? 2 : 1); h++) {
            uint32_t f[4];
            fp8_value_pairs(w[2 * h], w[2 * h + 1], f);
            mma_f16(o[2 * (c + h)], a, f[0], f[1]);
            mma_f16(o[2 * (c + h) + 1], a, f[2], f[3]);
        }
    }
}

template <int HDK, int HDV, bool FP8> struct DecodeShape {
    static constexpr int BN = ATTN_DECODE_TILE_N, NW = 4, NT = 32 * NW;
    static constexpr bool BIG = HDK > 128 || HDV > 128;
    /* fp8 at <= 128: 3 stages (~64 KB) let 3 blocks share an SM (12 warps to
     * hide the per-tile chain: the kernel is issue-latency bound there); at
     * 256 one block fits, so its ring is deeper */
    static constexpr int STAGES = FP8 ? (BIG ? 5 : 3) : (BIG ? 2 : 3);
    static constexpr int SK = HDK + 8, SV = HDV + 8;
    static constexpr int RSK = fp8_row_stride(HDK), RSV = fp8_row_stride(HDV); /* fp8 stage rows, bytes */
    static constexpr bool Q_IN_REGS = HDK <= 128;
    /* a ring stage: bf16 K|V tiles, or e4m3 K|V bytes and their 2 x BN scales */
    static constexpr int STAGE = FP8 ? BN * (RSK + RSV) + 2 * BN * 4 : BN * (SK + SV) * 2;
    static constexpr int RING = STAGES * STAGE;
    /* per-warp O (rows MS floats: HDV + 8 puts the 8-byte stores of a half-warp's 4 rows x 4 lanes on
     * distinct banks; HDV alone was an 8-way conflict on every store), m, l; reuses the ring */
    static constexpr int MS = HDV + 8;
    static constexpr int MERGE = NW * 16 * (MS + 2) * 4;
    /* rope: a warp's fp32 head buffer each, then the new key and value (fp8: codes, then 2 scales),
     * then (from RAW) the two as the qkv product wrote them (bf16) */
    static constexpr int RAW = FP8 ? HDK + HDV + 16 : (HDK + HDV) * 2;
    static constexpr int NEW_KV = RAW + (HDK + HDV) * 2;
    static constexpr int ROPE = NW * HDK * 4 + NEW_KV;
    static constexpr int QSC = 16 * 4; /* fp8: the queries' row factors (q_rows_to_f16) */
    static constexpr int SMEM = 16 * SK * 2 + QSC + ROPE + (RING > MERGE ? RING : MERGE);
    static_assert(RAW % 16 == 0 && NEW_KV % 16 == 0, "16-byte stores into nkv; the ring keeps 16-byte alignment");
    static_assert(BN == 16 * NW, "one warp per 16 keys of a tile");
    static_assert(HDK / 2 <= 32 * ROPE_LANE_PAIRS, "rope_lane_cs holds a lane's pairs of head sizes up to 256");
    static_assert(STAGE % 16 == 0, "stages keep 16-byte alignment");
    static_assert(STAGES >= 2, "the key loop's waits count on a group past the tile it reads");
};

/* A warp's 16 keys' logits: s (Q K^T; s[i][e] is key j0 + 8i + 2tg + (e & 1)
 * of rows g (e < 2) and g + 8) masked to [lo, hi) where edge (a tile that
 * may hold keys outside it), else soft-capped and scaled (fp8: times the
 * keys' scales sck and the rows' factors qr); tmax gets the lane's maxima of
 * rows g and g + 8. */
template <bool CAP, bool FP8>
static __device__ __forceinline__ void decode_logits(float (&s)[2][4], float (&tmax)[2], const float2 (&sck)[2],
                                                     const float (&qr)[2], int j0, int lo, int hi, bool edge,
                                                     const AttnKParams &p, int tg) {
    tmax[0] = tmax[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = j0 + i * 8 + 2 * tg + (e & 1);
            const float x = !edge || (j >= lo && j < hi)
                                ? (FP8 ? attn_logit_fp8<CAP>(s[i][e], e & 1 ? sck[i].y : sck[i].x, qr[e >> 1], p)
                                       : attn_logit<CAP>(s[i][e], p))
                                : -INFINITY;
            s[i][e] = x;
            tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
        }
}

/* P (s, after decode_online_softmax) as the A operand of O += P V: fp8 times
 * the keys' value scales scv over the warp's reference vref (fp8_v_ref moves
 * vref on and folds its rescale of O into alpha), as f16; bf16 as it is. */
template <bool FP8>
static __device__ __forceinline__ void decode_p_operand(uint32_t (&a)[4], float (&s)[2][4], const float2 (&scv)[2],
                                                        float &vref, float (&alpha)[2]) {
    if (FP8) {
        float rescale;
        const float inv = fp8_v_ref(fmaxf(fmaxf(scv[0].x, scv[0].y), fmaxf(scv[1].x, scv[1].y)), vref, &rescale);
        alpha[0] *= rescale, alpha[1] *= rescale;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            s[i][0] *= scv[i].x * inv, s[i][1] *= scv[i].y * inv;
            s[i][2] *= scv[i].x * inv, s[i][3] *= scv[i].y * inv;
        }
        a[0] = pack_f16(s[0][0], s[0][1]), a[1] = pack_f16(s[0][2], s[0][3]);
        a[2] = pack_f16(s[1][0], s[1][1]), a[3] = pack_f16(s[1][2], s[1][3]);
    } else {
        a[0] = pack_bf16(s[0][0], s[0][1]), a[1] = pack_bf16(s[0][2], s[0][3]);
        a[2] = pack_bf16(s[1][0], s[1][1]), a[3] = pack_bf16(s[1][2], s[1][3]);
    }
}

/* The online softmax step of a warp's 16 keys (s: their logits, tmax: the
 * lane's row maxima of them): rows g and g + 8's running max mx and sum l
 * moved on (l times alpha, the old terms' factor, plus the new exp2 terms),
 * s to exp2(s - max). The split and short kernels' one copy. */
static __device__ __forceinline__ void decode_online_softmax(float (&s)[2][4], const float (&tmax)[2], float (&mx)[2],
                                                             float (&l)[2], float (&alpha)[2]) {
    float base[2];
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
}

/* One key tile t (landed in the ring stage at `stage`) for this warp's 16
 * keys: S = Q K^T (qf: Q's A fragments when S::Q_IN_REGS, else read at
 * q_addr), the mask to [lo, hi), the online softmax and O += P V. The
 * warp's state: O (its 16 query rows x HDV, C fragments), the running max mx
 * and sum l of rows g and g + 8, (fp8) the rows' logit factors qr and the
 * warp's value-scale reference vref; plain arrays, as the split kernel had
 * them (in a struct ptxas gave its fp8 variants 1-2 more registers). The
 * split and the short kernel run it. */
template <int HDK, int HDV, bool CAP, bool FP8>
static __device__ __forceinline__ void decode_tile(float (&o)[HDV / 8][4], float (&mx)[2], float (&l)[2],
                                                   const float (&qr)[2], float &vref, const uint32_t (*qf)[4],
                                                   uint32_t q_addr, unsigned char *stage, int t, int lo, int hi,
                                                   const AttnKParams &p, int warp, int lane) {
    using S = DecodeShape<HDK, HDV, FP8>;
    constexpr int BN = S::BN, SK = S::SK, SV = S::SV;
    const int tg = lane & 3;
    bf16 *kbuf = (bf16 *)stage, *vbuf = kbuf + BN * SK;      /* bf16: K and V tiles */
    uint8_t *k8 = (uint8_t *)stage, *v8 = k8 + BN * S::RSK;  /* fp8: K bytes | V bytes | K scales | V scales */
    const float *ks = (const float *)(v8 + BN * S::RSV), *vs = ks + BN;

    /* S (16 heads x this warp's 16 keys) */
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    float2 sck[2], scv[2]; /* fp8: the scales of this lane's keys 2tg, 2tg + 1 and 8 + 2tg, 9 + 2tg */
    if (FP8) {
        decode_scores_fp8<HDK, S::RSK, S::Q_IN_REGS>(s, qf, q_addr, k8, warp, lane);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            sck[i] = *reinterpret_cast<const float2 *>(ks + warp * 16 + i * 8 + 2 * tg);
            scv[i] = *reinterpret_cast<const float2 *>(vs + warp * 16 + i * 8 + 2 * tg);
        }
    }
    const uint32_t k_addr = smem_u32(kbuf + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * SK + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int kk = 0; kk < (FP8 ? 0 : HDK / 16); kk++) {
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
    float tmax[2];
    /* fp8: only a tile across lo or hi can hold a key outside [lo, hi) (bf16 keeps its one select) */
    const bool edge = !FP8 || t * BN < lo || (t + 1) * BN > hi;
    decode_logits<CAP, FP8>(s, tmax, sck, qr, t * BN + warp * 16, lo, hi, edge, p, tg);
    float alpha[2];
    decode_online_softmax(s, tmax, mx, l, alpha);
    uint32_t a[4];
    decode_p_operand<FP8>(a, s, scv, vref, alpha);
    /* fp8: once the running max and vref settle, alpha stays 1: skip the
     * HDV / 2 multiplies (warp-uniform). bf16 rescales in the loop below. */
    if (FP8 && __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < HDV / 8; i++)
            o[i][0] *= alpha[0], o[i][1] *= alpha[0], o[i][2] *= alpha[1], o[i][3] *= alpha[1];
    }
    if (FP8) decode_pv_fp8<HDV, S::RSV>(o, a, v8, warp, lane);
    const uint32_t v_addr = smem_u32(vbuf + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SV + (lane >> 4) * 8);
#pragma unroll
    for (int nn = 0; nn < (FP8 ? 0 : HDV / 16); nn++) {
        o[2 * nn][0] *= alpha[0], o[2 * nn][1] *= alpha[0], o[2 * nn][2] *= alpha[1], o[2 * nn][3] *= alpha[1];
        o[2 * nn + 1][0] *= alpha[0], o[2 * nn + 1][1] *= alpha[0];
        o[2 * nn + 1][2] *= alpha[1], o[2 * nn + 1][3] *= alpha[1];
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(v_addr + nn * 32, b0, b1, b2, b3);
        mma_bf16(o[2 * nn], a, b0, b1);
        mma_bf16(o[2 * nn + 1], a, b2, b3);
    }
}

/* After the key loop (the ring free, a barrier passed): the warp's O (fp8:
 * times vref, its columns put back in order), running max and sum of its 16
 * rows into mo [4][16][MS] and mml [4][16][2], for the 4-warp merge. */
template <int HDV, bool FP8, int MS>
static __device__ __forceinline__ void decode_warp_store(const float (&o)[HDV / 8][4], const float (&mx)[2],
                                                         const float (&l)[2], float vref, float *mo, float *mml,
                                                         int warp, int lane) {
    const int g = lane >> 2, tg = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int hr = g + 8 * r;
        float sum = quad_sum(l[r]);
        if (tg == 0) mml[(warp * 16 + hr) * 2] = mx[r], mml[(warp * 16 + hr) * 2 + 1] = sum;
        float *mrow = mo + (warp * 16 + hr) * MS;
#pragma unroll
        for (int i = 0; i < HDV / 8; i++) {
            if (!FP8) { /* columns 2tg, 2tg + 1 of n-tile i */
                *(float2 *)(mrow + i * 8 + 2 * tg) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
                continue;
            }
            if (i & 1) continue;
#pragma unroll
            for (int b = 0; b < 2; b++) /* column 2tg + b of n-tiles i, i + 1: dimensions decode_pv_fp8 names */
                *(float2 *)(mrow + (i >> 1) * 16 + 4 * tg + 2 * b) =
                    make_float2(o[i][2 * r + b] * vref, o[i + 1][2 * r + b] * vref);
        }
    }
}

#endif
