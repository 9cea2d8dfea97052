/* attention_decode.cu — split-KV flash-decoding over the paged KV cache
 * (bf16, or fp8 e4m3 with scales; DESIGN.md "Attention").
 *
 * One block of 4 warps handles one decode row, one KV head, up to 16 of that
 * KV head's query heads (GQA / MQA: the K/V bytes are read once for the whole
 * group, as the 16 rows of one m16n8k16 tile) and one split of the row's key
 * range. Key tiles of 64 keys stream through a 3-stage cp.async ring (2 at
 * head size 256); each warp takes 16 keys of a tile with its own online
 * softmax, and the 4 warps merge through shared memory at the end. Each
 * split writes its unnormalized output, running max and sum, and the last
 * split of a (row, KV head) to finish (a counter in the work area) merges
 * them and adds the sink; a row of one split finishes itself
 * (decode_finish_one). No second kernel: at decode a launch boundary costs
 * more than the merge. The grid is (n_splits, n_kv_heads x head groups,
 * n_decode): it depends on no per-step value, so a captured launch replays
 * for any context up to the one n_splits was chosen for. A windowed row
 * visits only the tiles of its window. A launch of one split and no cascade
 * runs attention_decode_short.cu's kernel instead (the short-context case:
 * this kernel's key loop and 4-warp merge, attention_decode.cuh's
 * decode_tile and decode_warp_store, without the split and cascade code);
 * this one serves every other launch. Both call those two, with the warp's
 * state in plain arrays: held in a struct, ptxas gave this kernel's fp8
 * variants 1-2 more registers (the SASS is otherwise the inline copy's it
 * had before: the same registers, at most 8 instructions fewer).
 *
 * With rope (cuda_attention_decode_rope) the kernel also does the rope +
 * KV-write kernel's work for its rows: the blocks rope their query heads into
 * shared memory, and the blocks whose split holds the row's new key rope it,
 * write it and its value to the cache (head group 0 only) and put them in the
 * last tile themselves (that row is not loaded from the cache). Since the
 * keys before the new one were written by earlier steps, the first tiles'
 * loads are issued before pdl_wait, while the qkv product still runs.
 *
 * fp8 cache (FP8 = true): the ring holds the tiles' e4m3 bytes and scales
 * (half the bytes of bf16: at head size <= 128 the 3-stage ring takes ~64 KB,
 * so 3 blocks share an SM; 5 stages at 256), and each warp reads its 16 keys straight from the ring: ldmatrix on the
 * bytes (an 8x8 b16 matrix is 8 keys x 16 codes), cvt e4m3x2 -> f16x2 in
 * registers, f16 tensor-core products on the exact codes, the scales applied
 * per key (attention_common.cuh). K's fragment holds a lane's dimensions
 * 4t..4t+3 of each 16, so Q is permuted to match (q_rows_to_f16); V's
 * transposed fragment holds 2 keys x 2 dimensions, one byte permute splits
 * them into two n-tiles, so O's columns come out permuted and are put back
 * at the merge. No block-wide conversion pass, no extra barrier.
 *
 * Cascade (p.casc, attention.cu cuda_attention_cascade): a member row of a
 * group attends here only to its own keys, from its suffix start on (the
 * plan's rows section); the shared pass (attention_prefill.cu) left the
 * prefix's partial results per (member, head, split), and the merge that
 * finishes the row (decode_finish_one's block, or the last split's
 * decode_merge_splits) folds them in with the row's own splits, the sink
 * counted there once. Rows outside a group run as before.
 */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"

/* ---- kernels ---- */

/* Splits of a decode row of nt key tiles: the step's n_splits, or (batch-
 * invariant mode) a count from the row's own range, never above the grid's. */
static __device__ __forceinline__ int decode_row_splits(const AttnKParams &p, int nt) {
    return p.split_tiles > 0 ? min(p.n_splits, attn_row_splits(nt, p.split_tiles)) : p.n_splits;
}

/* Cascade: the shared pass's partial results of member mi's head h, split s
 * (max and sum; the output's column c), read through L2: another kernel
 * wrote them. */
static __device__ __forceinline__ const float *casc_ml_at(const AttnKParams &p, int mi, int h, int s) {
    return p.casc_ml + (((int64_t)mi * p.n_heads + h) * p.casc_splits + s) * 2;
}
template <int HDV> static __device__ __forceinline__ float casc_o_at(const AttnKParams &p, int mi, int h, int s, int c) {
    return __ldcg(p.casc_o + (((int64_t)mi * p.n_heads + h) * p.casc_splits + s) * HDV + c);
}

/* After each split wrote its partials: the last of a row's ns splits (for
 * this KV head and head group) to count itself in merges them into out:
 * out[h] = sum_s exp2(m_s - M) o_s / (sum_s exp2(m_s - M) l_s + exp2(sink - M)),
 * s over the row's ns splits and (cascade member mi >= 0) the npre splits
 * of its group's shared pass. The merge is a chain of L2 round trips at the
 * end of every long row (b1 at 4k keys: ~16 splits), so its loads go out
 * together: one round for every (head, split)'s max and sum, then each
 * thread sums 4 columns of a head over the splits, 8 splits' loads in
 * flight (a loop of one scalar load per split cost ~10 us at 16 splits).
 * The sums keep their order (split 0 first, the shared pass's after).
 * sm: 2 x 16 x (ns + npre) + 16 floats of free shared memory. */
template <int HDV, int NT>
static __device__ void decode_merge_splits(const AttnKParams &p, int row, int d, int h0, int nh, int ns, int mi,
                                           int npre, float *sm) {
    static_assert(HDV % 4 == 0, "a thread sums 4 columns (float4 loads of the partials)");
    __shared__ int last;
    __threadfence(); /* this block's partials, visible to whichever block merges */
    __syncthreads();
    if (threadIdx.x == 0) {
        int *count = p.done + (int64_t)d * gridDim.y + blockIdx.y;
        last = atomicAdd(count, 1) == ns - 1;
        if (last) *count = 0; /* every split has counted: zero for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int nall = ns + npre;
    float *wt = sm, *ls = sm + 16 * nall, *inv = ls + 16 * nall;
    /* partials read through L2 (__ldcg): other blocks wrote them */
#pragma unroll 4
    for (int i = threadIdx.x; i < nh * nall; i += NT) {
        const int hr = i / nall, s = i % nall, h = h0 + hr;
        const float *ml = s < ns ? p.part_ml + (((int64_t)d * p.n_heads + h) * p.n_splits + s) * 2
                                 : casc_ml_at(p, mi, h, s - ns);
        wt[i] = __ldcg(ml), ls[i] = __ldcg(ml + 1);
    }
    __syncthreads();
    for (int hr = threadIdx.x; hr < nh; hr += NT) {
        const int h = h0 + hr;
        float m = p.sinks ? p.sinks[h] * ATTN_LOG2E : -INFINITY;
        for (int s = 0; s < nall; s++) m = fmaxf(m, wt[hr * nall + s]);
        const float base = m == -INFINITY ? 0.f : m;
        float sum = p.sinks ? exp2f(p.sinks[h] * ATTN_LOG2E - base) : 0.f;
        for (int s = 0; s < nall; s++) {
            const float w = exp2f(wt[hr * nall + s] - base);
            wt[hr * nall + s] = w;
            sum += w * ls[hr * nall + s];
        }
        inv[hr] = sum > 0.f ? 1.f / sum : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * (HDV / 4); i += NT) {
        const int hr = i / (HDV / 4), c = (i % (HDV / 4)) * 4;
        const float *o = p.part_o + ((int64_t)d * p.n_heads + h0 + hr) * p.n_splits * HDV + c;
        const float *w = wt + hr * nall;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
        for (int s = 0; s < ns; s++) {
            const float4 v = __ldcg((const float4 *)(o + (int64_t)s * HDV));
            acc[0] += w[s] * v.x, acc[1] += w[s] * v.y, acc[2] += w[s] * v.z, acc[3] += w[s] * v.w;
        }
        for (int s = 0; s < npre; s++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[k] += w[ns + s] * casc_o_at<HDV>(p, mi, h0 + hr, s, c + k);
        const float f = inv[hr];
        *(uint2 *)(p.out + ((int64_t)row * p.n_heads + h0 + hr) * HDV + c) =
            make_uint2(pack_bf16(acc[0] * f, acc[1] * f), pack_bf16(acc[2] * f, acc[3] * f));
    }
}

template <int HDK, int HDV, bool CAP, bool WIN, bool FP8>
__global__ void __launch_bounds__(128) attn_decode_kernel(const AttnKParams p) {
    using S = DecodeShape<HDK, HDV, FP8>;
    constexpr int BN = S::BN, NT = S::NT, SK = S::SK, ST = S::STAGES;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = (bf16 *)smem;
    float *qsc = (float *)(sQ + 16 * SK);                     /* fp8: 16 row factors of Q */
    float *rope_buf = qsc + 16;                               /* rope mode: S::NW x HDK */
    unsigned char *nkv = (unsigned char *)(rope_buf + S::NW * HDK); /* rope mode: the new key and value */
    unsigned char *ring = nkv + S::NEW_KV;

    /* the step's metadata was uploaded before the step: readable before pdl_wait */
    const int split = blockIdx.x, kvh = blockIdx.y / p.n_groups, grp = blockIdx.y % p.n_groups, d = blockIdx.z;
    const int32_t *dec = p.meta + p.off_decode + 3 * d;
    const int row = dec[0], pos = dec[2];
    const int32_t *tab = p.meta + p.off_tables + (int64_t)dec[1] * p.table_width;
    const int h0 = kvh * p.group + grp * 16, nh = min(16, p.group - grp * 16);
    /* cascade: a member's suffix start, member index and its group's shared splits (0, -1, 0 outside a group) */
    const int32_t *casc_row = p.casc ? p.casc + p.casc_rows + 3 * row : nullptr;
    const int casc_lo = casc_row ? casc_row[0] : 0, mi = casc_row ? casc_row[1] : -1, npre = mi >= 0 ? casc_row[2] : 0;
    const int lo = max(WIN ? pos - p.window + 1 : 0, casc_lo), hi = pos + 1;
    const int tb = lo / BN, nt = (hi + BN - 1) / BN - tb, ns = decode_row_splits(p, nt);
    if (split >= ns) return; /* past this row's own splits (the grid has the most any row takes): the block leaves */
    const int per = (nt + ns - 1) / ns;
    const int ts = tb + split * per, te = min(ts + per, tb + nt);
    const int t_new = pos / BN;                       /* the tile of the new key */
    const bool has_new = p.rope && ts <= t_new && t_new < te;
    const int hi_load = p.rope ? pos : hi;           /* rope mode: the new key comes from decode_rope_rows */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    /* bf16: stage st's K and V tiles */
    auto kbuf = [&](int st) { return (bf16 *)(ring + st * S::STAGE); };
    auto vbuf = [&](int st) { return (bf16 *)(ring + st * S::STAGE) + BN * SK; };
    /* fp8 stage st: K bytes | V bytes ([BN][RSK], [BN][RSV]) | K scales | V scales */
    auto k8 = [&](int st) { return (uint8_t *)(ring + st * S::STAGE); };
    auto v8 = [&](int st) { return k8(st) + BN * S::RSK; };
    auto ks = [&](int st) { return (float *)(v8(st) + BN * S::RSV); };
    auto vs = [&](int st) { return ks(st) + BN; };
    auto load_stage = [&](int st, int t) {
        if (FP8) {
            load_kv_tile_fp8<HDK, BN, NT, S::RSK>(k8(st), ks(st), (const uint8_t *)p.k, p.k_scale, tab, p, kvh,
                                                  t * BN, lo, hi_load);
            load_kv_tile_fp8<HDV, BN, NT, S::RSV>(v8(st), vs(st), (const uint8_t *)p.v, p.v_scale, tab, p, kvh,
                                                  t * BN, lo, hi_load);
        } else {
            load_kv_tile<HDK, BN, NT>(kbuf(st), (const bf16 *)p.k, tab, p, kvh, t * BN, lo, hi_load);
            load_kv_tile<HDV, BN, NT>(vbuf(st), (const bf16 *)p.v, tab, p, kvh, t * BN, lo, hi_load);
        }
    };

    /* pdl_wait only: the next kernel launches when this one has finished.
     * Let go at entry (or even after the key loop), the o-proj GEMV's
     * whole-SM blocks took the free SMs during the attention and the step was
     * slower at long contexts (kernels/README.md "attention"). */
    if (!p.rope) {
        pdl_wait();
        load_rows<HDK, 16, NT>(sQ, p.q + ((int64_t)row * p.n_heads + h0) * HDK, HDK, nh);
    }
    /* all ST stages: the one the loop's first turn would fill is free too */
#pragma unroll
    for (int st = 0; st < ST; st++) {
        if (ts + st < te) load_stage(st, ts + st);
        cp_async_commit(); /* empty groups keep the wait counts uniform */
    }
    if (p.rope) { /* the cached keys are in flight; now the qkv product's rows */
        const RopeLaneCS cs = rope_lane_cs((float)pos, p.freqs); /* the position's alone: before the wait */
        const int64_t slot = p.slot[row];
        const bool store = has_new && grp == 0 && slot >= 0 && slot < p.n_slots;
        pdl_wait();
        decode_stage_rows<HDK, HDV, NT, S::RAW>(p, sQ, nkv, row, kvh, h0, nh, has_new);
        __syncthreads();
        decode_rope_rows<HDK, HDV, FP8, S::NW, S::RAW>(p, sQ, rope_buf, nkv, row, kvh, nh, has_new, store, cs);
    }

    uint32_t qf[S::Q_IN_REGS ? HDK / 16 : 1][4];
    float o[HDV / 8][4];
#pragma unroll
    for (int i = 0; i < HDV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float qr[2] = {1.f, 1.f}, vref = 0.f; /* fp8: rows g, g + 8's logit factors; the warp's value-scale reference */
    const uint32_t q_addr = smem_u32(sQ + (lane & 15) * SK + (lane >> 4) * 8);

    for (int t = ts; t < te; t++) {
        const int st = (t - ts) % ST;
        /* Tile ts + i is commit group i: the first ST are the up-front loads, and turn i >= 1 commits group
         * ST + i - 1 (tile ts + i + ST - 1, or empty past te). So at turn i groups 0..i must have landed:
         * at most ST - 1 pending at the first turn (ST groups committed), ST - 2 after (ST + i - 1). */
        if (t == ts) cp_async_wait<ST - 1>();
        else cp_async_wait<ST - 2>();
        __syncthreads(); /* tile t landed for all threads; stage of t - 1 is free */
        if (t > ts) {
            if (t + ST - 1 < te) load_stage((t - 1 - ts) % ST, t + ST - 1);
            cp_async_commit();
        }
        if (has_new && t == t_new) {
            decode_put_new<HDK, HDV, FP8, NT, S::RSK, S::RSV>(nkv, kbuf(st), vbuf(st), k8(st), v8(st), ks(st), vs(st),
                                                              pos - t * BN);
            __syncthreads();
        }
        if (FP8 && t == ts) { /* Q has landed (the barrier above): to f16, in K's fragment order */
            q_rows_to_f16<HDK, 16, NT, true>(sQ, qsc);
            __syncthreads();
            qr[0] = attn_row_factor_fp8<CAP>(qsc[g], p), qr[1] = attn_row_factor_fp8<CAP>(qsc[g + 8], p);
        }
        if (S::Q_IN_REGS && t == ts) {
#pragma unroll
            for (int kk = 0; kk < (S::Q_IN_REGS ? HDK / 16 : 0); kk++)
                ldsm_x4(q_addr + kk * 32, qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
        }
        decode_tile<HDK, HDV, CAP, FP8>(o, mx, l, qr, vref, qf, q_addr, ring + st * S::STAGE, t, lo, hi, p, warp, lane);
    }

    /* merge the 4 warps' states through shared memory (the ring is free now) */
    cp_async_wait<0>();
    __syncthreads();
    constexpr int MS = S::MS;                     /* mo's row stride: float2 stores of a warp spread over the banks */
    float *mo = (float *)ring;                    /* [4][16][MS] */
    float *mml = mo + 4 * 16 * MS;                /* [4][16][2] */
    decode_warp_store<HDV, FP8, MS>(o, mx, l, vref, mo, mml, warp, lane);
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
            acc += f * mo[(w * 16 + hr) * MS + c];
            sum += f * mml[(w * 16 + hr) * 2 + 1];
        }
        if (ns == 1) { /* the whole key range: finish here (a cascade member with its shared partials) */
            for (int s = 0; s < npre; s++) {
                const float *ml = casc_ml_at(p, mi, h0 + hr, s);
                lse_fold(m, sum, acc, __ldcg(ml), __ldcg(ml + 1), casc_o_at<HDV>(p, mi, h0 + hr, s, c));
            }
            p.out[((int64_t)row * p.n_heads + h0 + hr) * HDV + c] =
                __float2bfloat16(decode_finish_one(p, h0 + hr, m, sum, acc));
            continue;
        }
        int64_t at = ((int64_t)d * p.n_heads + h0 + hr) * p.n_splits + split;
        p.part_o[at * HDV + c] = acc;
        if (c == 0) p.part_ml[at * 2] = m, p.part_ml[at * 2 + 1] = sum;
    }
    constexpr int MERGE_FLOATS = 2 * 16 * (ATTN_MAX_SPLITS + ATTN_CASCADE_MAX_SPLITS) + 16;
    static_assert((S::RING > S::MERGE ? S::RING : S::MERGE) >= MERGE_FLOATS * 4,
                  "the ring holds the split merge's weights and sums of every split");
    if (ns > 1) decode_merge_splits<HDV, NT>(p, row, d, h0, nh, ns, mi, npre, (float *)ring);
}

/* ---- launchers ---- */

template <int HDK, int HDV, bool FP8>
static int decode_variant(const AttnKParams *kp, int n_decode, cudaStream_t s, Err *err) {
    constexpr int SMEM = DecodeShape<HDK, HDV, FP8>::SMEM;
    return attn_cap_win(kp, [&](auto cap, auto win) {
        auto kernel = attn_decode_kernel<HDK, HDV, decltype(cap)::value, decltype(win)::value, FP8>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM), err);
        CUDA_CHECK(launch_pdl(kernel, dim3(kp->n_splits, kp->n_kv_heads * kp->n_groups, n_decode), 128, SMEM, s, *kp),
                   err);
        return 0;
    });
}

template <int HDK, int HDV, bool FP8> static int decode_resident(Err *err) {
    constexpr int SMEM = DecodeShape<HDK, HDV, FP8>::SMEM;
    auto kernel = attn_decode_kernel<HDK, HDV, false, false, FP8>; /* the variants share the shape */
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, SMEM), err);
    return sms * (per_sm > 0 ? per_sm : 1);
}

extern "C" int cuda_attention_decode_resident(int head_dim_k, int head_dim_v, bool fp8, Err *err) {
#define ATTN_HD(K, V) \
    if (head_dim_k == K && head_dim_v == V) return fp8 ? decode_resident<K, V, true>(err) : decode_resident<K, V, false>(err);
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return err_set(err, "attention: head sizes k=%d v=%d have no decode kernel (supported: %s)", head_dim_k, head_dim_v,
                   ATTN_HEAD_DIMS_TEXT);
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
