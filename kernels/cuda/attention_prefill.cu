/* attention_prefill.cu — varlen FlashAttention-2 prefill over the paged KV
 * cache (bf16, or fp8 e4m3 with scales; DESIGN.md "Attention"; metadata from
 * attention/attn_meta.h).
 *
 * One block computes one tile of ATTN_TILE_M (128) query rows of one
 * prefill run for one query head: 4 warps of 32 rows (two m16 tiles, so each
 * K/V fragment read from shared memory feeds two tensor-core ops), or 8
 * warps of 16 rows at head size 256. K/V tiles of
 * BN keys are copied from the cache's blocks with 16-byte cp.async into a
 * two-stage shared buffer (the next tile streams in while this one is
 * used). S = Q K^T and O += P V run on tensor cores (mma.sync m16n8k16,
 * bf16 in, fp32 accumulate); the softmax is online in fp32 in the exp2
 * domain. A run may start at any position (chunked prefill): its rows see
 * every cached key of the sequence up to their position. Only key tiles
 * between the window start of the tile's first row and the last row's
 * position are visited, so a windowed layer costs O(window) per tile.
 * Masks are evaluated only on tiles that cross the diagonal or the window
 * edge.
 *
 * fp8 cache (FP8 = true): the two cp.async stages hold e4m3 bytes and
 * scales; each landed tile's codes are converted once, exactly, into a
 * single f16 K/V tile (attention_common.cuh convert_kv_tile_fp8) while the
 * next one streams in. The products run in f16 on those codes and on Q in
 * f16 (q_rows_to_f16); the key scales multiply the scores and the value
 * scales go into P (fp8_v_ref), as in decode.
 *
 * Cascade's shared pass (p.casc_shared, attention.cu cuda_attention_cascade)
 * is this kernel with other rows and keys (attention_common.cuh
 * cascade_tile): a block's 128 rows are (member row, query head) pairs of
 * one KV head of a group (GQA heads and rows alike fill the tensor cores' M),
 * its keys a split of the group's shared prefix, read once for all of them;
 * no causal mask (every member is past the prefix), no sink (the merge adds
 * it once); it stores each row's unnormalized output, running max and sum
 * as a partial result for the decode kernel's merge.
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_check.h"

#include <stdlib.h>
#include <string.h>

/* ---- kernels ---- */

template <int HDK, int HDV, bool FP8> struct PrefillShape {
    static constexpr bool BIG = HDK > 128 || HDV > 128;
    /* MT m16 tiles per warp: every K/V fragment read from shared memory
     * feeds MT tensor-core ops (v1 had MT = 1 and ran at 0.6x SDPA); at 256
     * the O accumulators of two tiles would not fit in registers */
    static constexpr int NW = BIG ? 8 : 4, MT = BIG ? 1 : 2, NT = 32 * NW;
    static constexpr int BM = 16 * NW * MT;
    static constexpr int BN = BIG ? 32 : 64;
    static constexpr int SK = HDK + 8, SV = HDV + 8;
    /* bf16: Q, then two stages of K and V tiles; fp8: Q, one bf16 K and V
     * tile, then two stages of e4m3 K|V bytes and 2 x BN scales */
    static constexpr int STAGE8 = BN * (HDK + HDV) + 2 * BN * 4;
    static constexpr int SMEM = FP8 ? (BM * SK + BN * SK + BN * SV) * 2 + 2 * STAGE8 + BM * 4 /* Q's row factors */
                                    : (BM * SK + 2 * BN * SK + 2 * BN * SV) * 2;
    static_assert(BM == ATTN_TILE_M, "the metadata's tile height is the kernel's");
    static_assert(STAGE8 % 16 == 0, "fp8 stages keep 16-byte alignment");
};

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__global__ void __launch_bounds__(PrefillShape<HDK, HDV, FP8>::NT) attn_prefill_kernel(const AttnKParams p) {
    using S = PrefillShape<HDK, HDV, FP8>;
    constexpr int BM = S::BM, BN = S::BN, NT = S::NT, SK = S::SK, SV = S::SV, MT = S::MT;
    extern __shared__ __align__(16) unsigned char smem[];
    /* fp8: sK, sV are the one converted tile of f16 codes (stage offsets below are 0) */
    bf16 *sQ = (bf16 *)smem, *sK = sQ + BM * SK, *sV = sK + (FP8 ? 1 : 2) * BN * SK;
    uint8_t *stage8 = (uint8_t *)(sV + (FP8 ? 1 : 2) * BN * SV);
    float *qsc = (float *)(stage8 + 2 * S::STAGE8); /* fp8: Q's row factors */
    const bool casc = p.casc_shared;
    const PrefillTile pt_ = casc ? cascade_tile<BM>(p) : prefill_tile<BM, WIN>(p, blockIdx.x);
    if (pt_.rows <= 0) return; /* cascade: a split past its group's */
    const int h = pt_.h, kvh = pt_.kvh, m0 = pt_.m0, q_start = pt_.q_start, rows = pt_.rows;
    const int p_first = pt_.p_first, p_last = pt_.p_last, lo = pt_.lo, hi = pt_.hi;
    const int32_t *tab = pt_.tab;
    const int t_begin = lo / BN, t_end = (hi + BN - 1) / BN;
    /* fp8 stage b: K bytes | V bytes | K scales | V scales */
    auto k8 = [&](int b) { return stage8 + b * S::STAGE8; };
    auto v8 = [&](int b) { return k8(b) + BN * HDK; };
    auto ks = [&](int b) { return (float *)(v8(b) + BN * HDV); };
    auto vs = [&](int b) { return ks(b) + BN; };
    auto load_stage = [&](int b, int t) {
        if (FP8) {
            load_kv_tile_fp8<HDK, BN, NT>(k8(b), ks(b), (const uint8_t *)p.k, p.k_scale, tab, p, kvh, t * BN, lo, hi);
            load_kv_tile_fp8<HDV, BN, NT>(v8(b), vs(b), (const uint8_t *)p.v, p.v_scale, tab, p, kvh, t * BN, lo, hi);
        } else {
            load_kv_tile<HDK, BN, NT>(sK + b * BN * SK, (const bf16 *)p.k, tab, p, kvh, t * BN, lo, hi);
            load_kv_tile<HDV, BN, NT>(sV + b * BN * SV, (const bf16 *)p.v, tab, p, kvh, t * BN, lo, hi);
        }
    };

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tg = lane & 3;
    const int wrow = warp * 16 * MT; /* first tile row of this warp; m-tile mt adds 16 * mt */

    if (casc)
        load_rows_at<HDK, BM, NT>(sQ, [&](int r) {
            const CascadePair c = cascade_pair(p, pt_, r);
            return p.q + ((int64_t)p.casc[p.casc_members + c.member] * p.n_heads + c.h) * HDK;
        }, rows);
    else
        load_rows<HDK, BM, NT>(sQ, p.q + ((int64_t)(q_start + m0) * p.n_heads + h) * HDK, (int64_t)p.n_heads * HDK,
                               rows);
    load_stage(0, t_begin);
    cp_async_commit();

    float o[MT][HDV / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < HDV / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    /* the sink enters as a logit with a zero value: its exp counts once per
     * row, so only lane tg == 0 of the quad starts its partial sum at 1 */
    const bool has_sink = p.sinks && !casc; /* cascade: the merge adds it, once */
    const float sink = has_sink ? p.sinks[h] * ATTN_LOG2E : -INFINITY, l0 = has_sink && tg == 0 ? 1.f : 0.f;
    float mx[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) mx[mt][0] = mx[mt][1] = sink, l[mt][0] = l[mt][1] = l0;
    float qr[MT][2], vref = 0.f; /* fp8: rows' logit factors (attn_row_factor_fp8); the warp's value-scale reference */
    const uint32_t q_addr = smem_u32(sQ + (wrow + (lane & 15)) * SK + (lane >> 4) * 8);

    for (int t = t_begin; t < t_end; t++) {
        const int buf = FP8 ? 0 : (t - t_begin) & 1; /* the bf16 tile the math reads */
        const int b8 = (t - t_begin) & 1;             /* fp8: the stage of tile t (codes converted, scales read) */
        if (FP8) {
            /* tile t landed; every thread is past tile t - 1 (its stage and the f16 tile are free) */
            cp_async_wait<0>();
            __syncthreads();
            if (t + 1 < t_end) load_stage(b8 ^ 1, t + 1);
            cp_async_commit();
            convert_kv_tile_fp8<HDK, BN, NT>((__half *)sK, k8(b8));
            convert_kv_tile_fp8<HDV, BN, NT>((__half *)sV, v8(b8));
            if (t == t_begin) { /* Q has landed (the barrier above): to f16 */
                q_rows_to_f16<HDK, BM, NT, false>(sQ, qsc);
                __syncthreads();
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) qr[mt][r] = attn_row_factor_fp8<CAP>(qsc[wrow + mt * 16 + g + 8 * r], p);
            }
        } else if (t + 1 < t_end) {
            load_stage(buf ^ 1, t + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        /* S = Q K^T for this warp's MT x 16 rows and BN keys */
        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
        const bf16 *kt = sK + buf * BN * SK;
        const uint32_t k_addr = smem_u32(kt + ((lane & 7) + ((lane >> 4) << 3)) * SK + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int kk = 0; kk < HDK / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ldsm_x4(q_addr + (mt * 16 * SK + kk * 16) * 2, a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
            for (int nn = 0; nn < BN / 16; nn++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(k_addr + (nn * 16 * SK + kk * 16) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<FP8>(s[mt][2 * nn], a[mt], b0, b1);
                    mma_16816<FP8>(s[mt][2 * nn + 1], a[mt], b2, b3);
                }
            }
        }
        float vfac = 1.f, vinv = 1.f; /* fp8: O's rescale to the new vref, 1 / vref */
        if (FP8) {
            float vmax = 0.f;
#pragma unroll
            for (int i = 0; i < BN / 8; i++) {
                const float2 sv = *reinterpret_cast<const float2 *>(vs(b8) + i * 8 + 2 * tg);
                vmax = fmaxf(vmax, fmaxf(sv.x, sv.y));
            }
            vinv = fp8_v_ref(vmax, vref, &vfac);
        }

        /* logits, masks, online softmax (rows g and g + 8 of each m-tile) */
        const bool edge = (t + 1) * BN - 1 > p_first || (WIN && t * BN <= p_last - p.window);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int qpos0 = p_first + pt_.pos_step * (wrow + mt * 16 + g), qpos1 = qpos0 + 8 * pt_.pos_step;
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x;
                    if (FP8) { /* the key's scale and the row's factor (the same two multiplies on every tile) */
                        const float sk = ks(b8)[i * 8 + 2 * tg + (e & 1)];
                        x = attn_logit_fp8<CAP>(s[mt][i][e], sk, qr[mt][e >> 1], p);
                    } else {
                        x = attn_logit<CAP>(s[mt][i][e], p);
                    }
                    if (edge) {
                        int j = t * BN + i * 8 + 2 * tg + (e & 1), qp = e < 2 ? qpos0 : qpos1;
                        if (j > qp || (WIN && qp - j >= p.window)) x = -INFINITY;
                    }
                    s[mt][i][e] = x;
                    tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
                }
            float alpha[2], base[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mnew = fmaxf(mx[mt][r], quad_max(tmax[r]));
                base[r] = mnew == -INFINITY ? 0.f : mnew; /* a row with nothing seen yet: no inf - inf */
                alpha[r] = exp2f(mx[mt][r] - base[r]);
                mx[mt][r] = mnew;
                l[mt][r] *= alpha[r];
            }
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[mt][i][e] = exp2f(s[mt][i][e] - base[e >> 1]);
                    l[mt][e >> 1] += s[mt][i][e];
                }
            alpha[0] *= vfac, alpha[1] *= vfac; /* fp8: O to the new value-scale reference too */
#pragma unroll
            for (int i = 0; i < HDV / 8; i++)
                o[mt][i][0] *= alpha[0], o[mt][i][1] *= alpha[0], o[mt][i][2] *= alpha[1], o[mt][i][3] *= alpha[1];
        }

        /* O += P V: P's C fragments are the A fragments of the product */
        const bf16 *vt = sV + buf * BN * SV;
        const uint32_t v_addr = smem_u32(vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * SV + (lane >> 4) * 8);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (FP8) { /* p x value scale / vref: columns 2tg, 2tg + 1 of n-tiles 2kk and 2kk + 1 */
                    const float2 v0 = *reinterpret_cast<const float2 *>(vs(b8) + kk * 16 + 2 * tg);
                    const float2 v1 = *reinterpret_cast<const float2 *>(vs(b8) + kk * 16 + 8 + 2 * tg);
                    const float r0 = v0.x * vinv, r1 = v0.y * vinv, r2 = v1.x * vinv, r3 = v1.y * vinv;
                    a[mt][0] = pack_f16(s[mt][2 * kk][0] * r0, s[mt][2 * kk][1] * r1);
                    a[mt][1] = pack_f16(s[mt][2 * kk][2] * r0, s[mt][2 * kk][3] * r1);
                    a[mt][2] = pack_f16(s[mt][2 * kk + 1][0] * r2, s[mt][2 * kk + 1][1] * r3);
                    a[mt][3] = pack_f16(s[mt][2 * kk + 1][2] * r2, s[mt][2 * kk + 1][3] * r3);
                } else {
                    a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
            }
#pragma unroll
            for (int nn = 0; nn < HDV / 16; nn++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(v_addr + (kk * 16 * SV + nn * 16) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816<FP8>(o[mt][2 * nn], a[mt], b0, b1);
                    mma_16816<FP8>(o[mt][2 * nn + 1], a[mt], b2, b3);
                }
            }
        }
        __syncthreads(); /* the next iteration overwrites the other stage */
    }

    if (casc) { /* the partial results: O (x vref for fp8: the numerator), max and sum of each pair */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float sum = quad_sum(l[mt][r]), f = FP8 ? vref : 1.f;
                const int row = wrow + mt * 16 + g + 8 * r;
                if (row >= rows) continue;
                const int64_t slot = cascade_pair(p, pt_, row).slot;
                float *dst = p.casc_o + slot * HDV + 2 * tg;
#pragma unroll
                for (int i = 0; i < HDV / 8; i++)
                    *reinterpret_cast<float2 *>(dst + i * 8) = make_float2(o[mt][i][2 * r] * f, o[mt][i][2 * r + 1] * f);
                if (tg == 0) p.casc_ml[2 * slot] = mx[mt][r], p.casc_ml[2 * slot + 1] = sum;
            }
        return;
    }

    /* normalize and write the rows this tile owns */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = quad_sum(l[mt][r]);
            float inv = sum > 0.f ? (FP8 ? vref : 1.f) / sum : 0.f; /* fp8: O x vref is the numerator */
            int row = wrow + mt * 16 + g + 8 * r;
            if (row >= rows) continue;
            bf16 *dst = p.out + ((int64_t)(q_start + m0 + row) * p.n_heads + h) * HDV + 2 * tg;
#pragma unroll
            for (int i = 0; i < HDV / 8; i++)
                *reinterpret_cast<__nv_bfloat162 *>(dst + i * 8) =
                    __floats2bfloat162_rn(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
        }
}

/* ---- launchers ---- */

template <int HDK, int HDV, bool FP8>
static int prefill_variant(const AttnKParams *kp, dim3 grid, cudaStream_t s, Err *err) {
    using S = PrefillShape<HDK, HDV, FP8>;
    return attn_cap_win(kp, [&](auto cap, auto win) {
        return attn_launch(attn_prefill_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, FP8>, grid,
                           S::NT, S::SMEM, s, *kp, err);
    });
}

/* The prefill variant of kp's head sizes and cache over grid. */
static int prefill_dispatch(const AttnKParams *kp, int head_dim_k, int head_dim_v, dim3 grid, cudaStream_t s,
                            Err *err) {
#define ATTN_HD(K, V)                                                                                  \
    if (head_dim_k == K && head_dim_v == V)                                                            \
        return kp->fp8 ? prefill_variant<K, V, true>(kp, grid, s, err) : prefill_variant<K, V, false>(kp, grid, s, err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return err_set(err, "attention: head sizes k=%d v=%d have no prefill kernel (supported: %s)", head_dim_k, head_dim_v,
                   ATTN_HEAD_DIMS_TEXT);
}

/* CLLM_ATTENTION_PREFILL=fa2: this file's kernel even where the sm_90a one
 * has the variant (tests and benchmarks compare the two); read once */
static bool fa2_asked(void) {
    const char *v = getenv("CLLM_ATTENTION_PREFILL");
    return v && !strcmp(v, "fa2");
}

static bool prefill_fa2_forced(void) {
    static const bool forced = fa2_asked(); /* set once, thread-safely (C++11): ranks launch on threads of their own */
    return forced;
}

extern "C" const char *cuda_attention_prefill_kernel(int head_dim_k, int head_dim_v, bool fp8) {
    return !prefill_fa2_forced() && attn_prefill_sm90_has(head_dim_k, head_dim_v, fp8) ? "sm90a" : "fa2";
}

extern "C" int attn_prefill_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_tiles, cudaStream_t s,
                                   Err *err) {
    if (n_tiles == 0) return 0;
    const int sm90 = prefill_fa2_forced() ? 0 : attn_prefill_sm90_launch(kp, head_dim_k, head_dim_v, n_tiles, s, err);
    if (sm90) return sm90 < 0 ? -1 : 0;
    return prefill_dispatch(kp, head_dim_k, head_dim_v, dim3(n_tiles, kp->n_heads), s, err);
}

/* Cascade's shared pass: kp->casc_shared set, the plan's units x KV heads x
 * splits; always this file's kernel (the sm_90a one has no such mode). */
extern "C" int attn_cascade_shared_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_units,
                                          int n_splits, cudaStream_t s, Err *err) {
    if (n_units == 0) return 0;
    return prefill_dispatch(kp, head_dim_k, head_dim_v, dim3(n_units, kp->n_kv_heads, n_splits), s, err);
}
