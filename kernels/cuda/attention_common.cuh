/* attention_common.cuh — device helpers shared by the prefill and decode
 * attention kernels (attention_prefill.cu, attention_decode.cu): the kernel
 * parameter block, tensor-core fragments (mma.sync m16n8k16 bf16 -> fp32
 * and cp.async come from tensor_core.cuh; ldmatrix here), and the paged K/V
 * tile loaders (bf16, and fp8), and the fp8 cache's exact-code arithmetic.
 *
 * Fragment layouts (PTX ISA, m16n8k16): lane = 4 * g + t (g = lane / 4,
 * t = lane % 4). A 16x16 row-major: a0 (row g, cols 2t, 2t+1), a1 (row g+8),
 * a2 (row g, cols 2t+8..), a3 (row g+8, cols 2t+8..). B 16x8: b0 (k 2t, 2t+1,
 * col g), b1 (k 2t+8..). C 16x8 fp32: c0, c1 (row g, cols 2t, 2t+1), c2, c3
 * (row g+8). A score tile's C fragments of keys 16j..16j+15 are exactly the A
 * fragment of P for the P.V product, so P never leaves registers.
 *
 * Shared-memory tiles are [rows][HD + 8] bf16: the 16-byte pad shifts each
 * row by 4 banks, so the 8 rows an ldmatrix phase reads hit 8 different
 * 16-byte bank groups for every head size used (64, 80, 96, 128, 256).
 *
 * fp8 cache (both kernels): the tensor cores take the e4m3 codes exactly, as
 * f16 (cvt.rn.f16x2.e4m3x2), and the scales go where they cost one multiply
 * per key instead of one per value: a key's scale times the score, a
 * value's scale into P (relative to a running per-warp reference, so P
 * stays in [0, 1] for its f16 form). Q goes to f16 times a power of two
 * per row (q_rows_to_f16). So a cached value is exactly code x scale, as on
 * the CPU (fp8_dequantize_row), with no rounding of the product.
 */
#ifndef CLLM_ATTENTION_COMMON_CUH
#define CLLM_ATTENTION_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/e4m3.cuh"
#include "kernels/cuda/rope_head.cuh"
#include "kernels/cuda/tensor_core.cuh"

#define ATTN_LOG2E 1.4426950408889634f

typedef __nv_bfloat16 bf16;

/* Everything a kernel reads; per-step values live in device memory (meta),
 * so a decode launch can be captured once and replayed. */
typedef struct {
    const bf16 *q;              /* [T][n_heads][head_dim_k] */
    bf16 *out;                  /* [T][n_heads][head_dim_v] */
    const void *k, *v;          /* this layer's cache: [n_blocks][block_size][n_kv_heads][head_dim], bf16 or e4m3 */
    bool fp8;                   /* k, v are e4m3 codes; k_scale, v_scale their scales */
    const float *k_scale, *v_scale; /* fp8: [n_blocks][block_size][n_kv_heads] */
    const float *k_fixed, *v_fixed; /* fp8 with static scales: [n_kv_heads] the new keys' / values' (rope); else NULL */
    const int32_t *meta;        /* device copy of AttnMeta.buf */
    int off_prefill, off_tiles, off_decode, off_tables, table_width;
    int block_shift;            /* log2(block_size) */
    const void *maps;           /* host: the layer's AttnKVMaps (KVLayerDev.maps) for the sm_90a launcher, or NULL */
    int tma_shift;              /* sm_90a prefill: log2 of the keys a TMA box (AttnKVMaps.rows); 0: no TMA */
    int n_heads, n_kv_heads, group; /* group = n_heads / n_kv_heads */
    float scale_log2;           /* scale * log2(e): scores live in the exp2 domain */
    float cap_in, cap_out;      /* soft-cap: s = cap_out * tanh(q.k * cap_in), cap_in = scale / cap, cap_out = cap * log2(e) */
    int window;                 /* > 0: keys pos - window < j <= pos */
    const float *sinks;         /* [n_heads] or NULL */
    float *part_o;              /* decode: [n_decode][n_heads][n_splits][head_dim_v] unnormalized */
    float *part_ml;             /* decode: [n_decode][n_heads][n_splits][2] running max (log2 domain), sum */
    int n_splits, n_groups;     /* decode: KV splits; blocks of <= 16 query heads per KV head */
    int split_tiles;            /* decode: 0: every row takes n_splits splits; > 0: a row takes
                                   attn_row_splits(its tiles, split_tiles) <= n_splits (the backend's mode) */
    int *done;                  /* decode, n_splits > 1: [n_decode][n_kv_heads x n_groups] splits finished */
    /* decode with rope (cuda_attention_decode_rope): q, k_new, v_new as the qkv product left them */
    bool rope;
    const bf16 *k_new, *v_new;
    const float *q_norm, *k_norm;
    float qk_eps, qk_offset;
    RopeFreqs freqs;
    const int64_t *slot;
    int64_t n_slots;
    /* cascade (cuda_attention_cascade): the packed plan (attn_cascade.h AttnCascadeMeta) on the device, or NULL */
    const int32_t *casc;
    int casc_units, casc_groups, casc_members, casc_rows; /* its sections' offsets */
    int casc_splits;            /* the shared pass's splits: partial slots a (member, query head) */
    float *casc_o;              /* [members][n_heads][casc_splits][head_dim_v] the shared pass's unnormalized outputs */
    float *casc_ml;             /* [members][n_heads][casc_splits][2] their running max (log2 domain) and sum */
    bool casc_shared;           /* prefill kernel: run the shared pass (plan units) instead of prefill tiles */
} AttnKParams;


__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}


__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

/* e4m3 codes of 16 rows (keys) of an fp8 tile, 16-byte chunks c and c + 1
 * at addr (the lane's row and chunk already in it, as ldmatrix wants):
 * w[0], w[1] chunk c's rows 0-7 and 8-15, w[2], w[3] chunk c + 1's; with
 * pair false (an odd head size's last chunk) chunk c alone. TRANS: the
 * .trans load (P V's B or A operand), else the plain one. */
template <bool TRANS> __device__ __forceinline__ void ldsm_fp8_chunks(uint32_t addr, bool pair, uint32_t (&w)[4]) {
    if (pair) TRANS ? ldsm_x4_t(addr, w[0], w[1], w[2], w[3]) : ldsm_x4(addr, w[0], w[1], w[2], w[3]);
    else TRANS ? ldsm_x2_t(addr, w[0], w[1]) : ldsm_x2(addr, w[0], w[1]);
}

/* A chunk of values from ldsm_fp8_chunks<true>: k0 (keys 0-7) and k8 (keys
 * 8-15) give lane (g, t) keys 2t, 2t + 1 x dimensions 2g, 2g + 1 (k8: keys
 * 2t + 8, 2t + 9); as f16 pairs over the keys: f[0] dimension 2g keys 2t..,
 * f[1] dimension 2g keys 2t + 8.., f[2], f[3] dimension 2g + 1 likewise. */
__device__ __forceinline__ void fp8_value_pairs(uint32_t k0, uint32_t k8, uint32_t (&f)[4]) {
    const uint32_t lo = __byte_perm(k0, 0, 0x3120), hi = __byte_perm(k8, 0, 0x3120);
    f[0] = e4m3x2_to_f16x2(lo), f[1] = e4m3x2_to_f16x2(hi);
    f[2] = e4m3x2_to_f16x2(lo >> 16), f[3] = e4m3x2_to_f16x2(hi >> 16);
}

/* Row stride in bytes of an fp8 tile in shared memory: an odd number of
 * 16-byte units, so the 8 rows of an ldmatrix phase hit 8 different bank
 * groups (80: 5 units as is; 64, 96, 128, 256: one unit of pad). */
__host__ __device__ constexpr int fp8_row_stride(int hd) { return (hd / 16) % 2 ? hd : hd + 16; }

/* Max / sum over the 4 lanes of a quad (the lanes that share a C row). */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* tanh for the soft-cap: tanh(x) = 1 - 2 / (2^(2 log2(e) x) + 1), two MUFU ops (ex2, rcp) and an FMA, where
 * libdevice's tanhf is a branch and ~25 instructions (H200: the soft-capped sm_90a prefill ran at 0.53x the
 * plain kernel). Absolute error under 1e-6 (ex2 and rcp are within 2 ulp; near 0 the subtraction cancels, but
 * absolutely), and absolute is what the logit's exp sees: s = cap_out tanh(.), so P moves by < 1e-4 relative,
 * under bf16's rounding of P. +-inf gives +-1, NaN stays NaN. Every step is an explicit instruction (no
 * contraction left to the compiler), so every kernel that takes the logit here gets its bits. */
__device__ __forceinline__ float attn_tanh(float x) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(x, 2.88539008177792681f)));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(__fadd_rn(e, 1.f)));
    return __fmaf_rn(-2.f, r, 1.f);
}

/* Raw q.k (fp32 accumulator) -> logit in the log2 domain. */
template <bool CAP> __device__ __forceinline__ float attn_logit(float s, const AttnKParams &p) {
    /* __fmul_rn: never fused into a later subtraction, so a key's logit has
     * the same bits on a tile that needs masking and on one that does not
     * (which tile a row's key lands on depends on how the prompt was chunked) */
    if (CAP) return __fmul_rn(p.cap_out, attn_tanh(__fmul_rn(s, p.cap_in)));
    return __fmul_rn(s, p.scale_log2);
}

/* fp8 cache: raw q' . code -> logit, with the key's scale sk and the row's
 * factor rf = the query row's q_rows_to_f16 factor x (cap_in, or
 * scale_log2): two multiplies, the same ones on every tile. */
template <bool CAP> __device__ __forceinline__ float attn_logit_fp8(float s, float sk, float rf, const AttnKParams &p) {
    const float x = __fmul_rn(__fmul_rn(s, sk), rf);
    return CAP ? __fmul_rn(p.cap_out, attn_tanh(x)) : x;
}
template <bool CAP> __device__ __forceinline__ float attn_row_factor_fp8(float qsc, const AttnKParams &p) {
    return qsc * (CAP ? p.cap_in : p.scale_log2);
}

/* Starts copying keys [n0, n0 + BN) of KV head kvh into a [BN][HD + 8]
 * shared tile, through the sequence's block table; keys outside [lo, hi)
 * become zeros (never read from the cache); with SKIP, key `skip`'s row is
 * left as it is (the short decode kernel writes its new key there itself;
 * a template flag, so the other callers' code has no such test). */
template <int HD, int BN, int NT, bool SKIP = false>
__device__ __forceinline__ void load_kv_tile(bf16 *sm, const bf16 *cache, const int32_t *tab, const AttnKParams &p,
                                             int kvh, int n0, int lo, int hi, int skip = -1) {
    constexpr int CH = HD / 8, STRIDE = HD + 8;
    static_assert((BN * CH) % NT == 0, "tile chunks must split evenly over the threads");
    const int bmask = (1 << p.block_shift) - 1;
#pragma unroll
    for (int it = 0; it < BN * CH / NT; it++) {
        int i = it * NT + (int)threadIdx.x;
        int r = i / CH, c = i % CH, j = n0 + r;
        bool ok = j >= lo && j < hi;
        const bf16 *src = cache;
        if (ok) {
            int64_t slot = ((int64_t)tab[j >> p.block_shift] << p.block_shift) + (j & bmask);
            src = cache + (slot * p.n_kv_heads + kvh) * HD + c * 8;
        }
        if (!SKIP || j != skip) cp_async16(smem_u32(sm + r * STRIDE + c * 8), src, ok);
    }
}

/* fp8 cache: starts copying the e4m3 bytes of keys [n0, n0 + BN) of KV head
 * kvh into a [BN][RS] byte tile (16-byte chunks; a row's chunks are
 * contiguous in the cache) and their scales into sc[BN] (4-byte copies: the
 * scales of one head are n_kv_heads floats apart). Keys outside [lo, hi)
 * become code 0 with scale 0; with SKIP, key `skip` is left as it is
 * (load_kv_tile). */
template <int HD, int BN, int NT, int RS = HD, bool SKIP = false>
__device__ __forceinline__ void load_kv_tile_fp8(uint8_t *sm, float *sc, const uint8_t *cache, const float *scales,
                                                 const int32_t *tab, const AttnKParams &p, int kvh, int n0, int lo,
                                                 int hi, int skip = -1) {
    constexpr int CH = HD / 16;
    const int bmask = (1 << p.block_shift) - 1;
    for (int i = (int)threadIdx.x; i < BN * CH; i += NT) {
        int r = i / CH, c = i % CH, j = n0 + r;
        bool ok = j >= lo && j < hi;
        const uint8_t *src = cache;
        if (ok) {
            int64_t slot = ((int64_t)tab[j >> p.block_shift] << p.block_shift) + (j & bmask);
            src = cache + (slot * p.n_kv_heads + kvh) * HD + c * 16;
        }
        if (!SKIP || j != skip) cp_async16(smem_u32(sm + r * RS + c * 16), src, ok);
    }
    for (int r = (int)threadIdx.x; r < BN; r += NT) {
        int j = n0 + r;
        bool ok = j >= lo && j < hi;
        const float *src = scales;
        if (ok) src = scales + (((int64_t)tab[j >> p.block_shift] << p.block_shift) + (j & bmask)) * p.n_kv_heads + kvh;
        if (!SKIP || j != skip)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(sc + r)), "l"(src),
                         "r"(ok ? 4 : 0));
    }
}

/* The landed fp8 tile's codes as f16, [BN][HD + 8] like a bf16 tile
 * (exact; the scales stay apart: see the top of this file). 8 codes per
 * step: one 8-byte shared load, four cvt e4m3x2 -> f16x2, one 16-byte store. */
template <int HD, int BN, int NT>
__device__ __forceinline__ void convert_kv_tile_fp8(__half *dst, const uint8_t *src) {
    constexpr int CH = HD / 8;
    for (int i = (int)threadIdx.x; i < BN * CH; i += NT) {
        int r = i / CH, c = i % CH;
        uint2 codes = *reinterpret_cast<const uint2 *>(src + r * HD + c * 8);
        *reinterpret_cast<uint4 *>(dst + r * (HD + 8) + c * 8) =
            make_uint4(e4m3x2_to_f16x2(codes.x), e4m3x2_to_f16x2(codes.x >> 16), e4m3x2_to_f16x2(codes.y),
                       e4m3x2_to_f16x2(codes.y >> 16));
    }
}

/* Rows [0, R) of a [R][HD + 8] bf16 tile (the queries) to f16 in place,
 * row r times 2^(14 - e_r) with amax_r < 2^e_r (so every value stays in
 * f16's range, the largest in [2^13, 2^14), and a bf16 value down to 2^-27
 * of the row's largest stays exact); qsc[r] = 2^(e_r - 14) undoes it on the
 * scores. PERM: within each 16 values, 4t..4t+3 go to 2t, 2t + 1, 2t + 8,
 * 2t + 9, the order in which decode's fp8 K fragments hold the dimensions
 * (attention_decode.cu). 8 lanes a row, each owning whole chunks of 16, so
 * no lane writes what another reads. R * 8 must be a multiple of NT. */
/* The factor 2^(14 - e) that takes a query row of largest magnitude amax <
 * 2^e into f16's range (its largest value in [2^13, 2^14)); *undo gets
 * 2^(e - 14), the scores' factor. An inf row stays inf. */
__device__ __forceinline__ float q_row_f16_factor(float amax, float *undo) {
    int e;
    frexpf(amax, &e);
    e = amax <= 3.0e38f ? max(-100, min(100, e)) : 0;
    *undo = __int_as_float((127 + e - 14) << 23);
    return __int_as_float((127 + 14 - e) << 23);
}

template <int HD, int R, int NT, bool PERM> __device__ void q_rows_to_f16(bf16 *sq, float *qsc) {
    constexpr int CH = HD / 16;
    static_assert((R * 8) % NT == 0, "every lane of a warp takes the same number of rows");
    const int l8 = threadIdx.x & 7;
    /* 16 bf16 of a row as floats, two 16-byte loads */
    auto load16 = [](const bf16 *src, float (&x)[16]) {
        const uint4 u[2] = {reinterpret_cast<const uint4 *>(src)[0], reinterpret_cast<const uint4 *>(src)[1]};
        const uint32_t *w = reinterpret_cast<const uint32_t *>(u);
#pragma unroll
        for (int i = 0; i < 8; i++) x[2 * i] = __uint_as_float(w[i] << 16), x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    };
    for (int r = threadIdx.x >> 3; r < R; r += NT / 8) {
        bf16 *row = sq + r * (HD + 8);
        float amax = 0.f, x[16]; /* fmaxf drops a nan: the nan itself still goes through below */
        for (int c = l8; c < CH; c += 8) {
            load16(row + 16 * c, x);
#pragma unroll
            for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[i]));
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float undo;
        const float f = q_row_f16_factor(amax, &undo);
        for (int c = l8; c < CH; c += 8) {
            load16(row + 16 * c, x);
#pragma unroll
            for (int i = 0; i < 16; i++) x[i] *= f;
            uint32_t w[8];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                if (PERM) w[t] = pack_f16(x[4 * t], x[4 * t + 1]), w[4 + t] = pack_f16(x[4 * t + 2], x[4 * t + 3]);
                else w[2 * t] = pack_f16(x[4 * t], x[4 * t + 1]), w[2 * t + 1] = pack_f16(x[4 * t + 2], x[4 * t + 3]);
            }
            uint4 *dst = reinterpret_cast<uint4 *>(row + 16 * c);
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
        if (l8 == 0) qsc[r] = undo;
    }
}

/* fp8 cache, P.V: the warp's reference for its values' scales, vref, is the
 * largest scale seen so far (uniform over the warp: every mma of the warp
 * sums over the same keys). Given the largest scale among this lane's keys
 * of the tile (the keys of its P fragments; the 4 lanes of a quad hold all
 * the warp's keys), raises vref to the tile's largest and returns 1 / vref;
 * *rescale gets old vref / new vref, the factor for O. P's entries go in as
 * p x scale / vref <= 1, and O x vref is the output's numerator.
 * fp8_v_ref_raise: the same given the warp's largest scale of the tile
 * already (the many-rows kernel's lanes hold other keys than a quad's). */
__device__ __forceinline__ float fp8_v_ref_raise(float m, float &vref, float *rescale) {
    const float nv = fmaxf(vref, m), inv = nv > 0.f ? 1.f / nv : 0.f;
    *rescale = nv > 0.f ? vref * inv : 1.f;
    vref = nv;
    return inv;
}
__device__ __forceinline__ float fp8_v_ref(float m, float &vref, float *rescale) {
    return fp8_v_ref_raise(quad_max(m), vref, rescale);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

/* fp8_quantize_row (base/dtype.c) by one warp, to the same bytes: amax
 * (nans ignored: a comparison with a nan is false), scale = amax / 448 and
 * code = e4m3(x / scale), both divisions IEEE-rounded like the host's; the
 * conversion is the GPU's round-to-nearest-even saturating one, its nan made
 * the host's 0x7f whatever the sign. fixed (static KV scales): that scale
 * instead of amax / 448 (fp8_quantize_row_fixed: the codes saturate). */
template <typename T>
__device__ __forceinline__ void warp_quantize_fp8(const T *x, int n, uint8_t *codes, float *scale,
                                                  const float *fixed = nullptr) {
    int lane = threadIdx.x % 32;
    float sc;
    if (fixed) {
        sc = *fixed;
    } else {
        float amax = 0.0f;
        for (int i = lane; i < n; i += 32) {
            float a = fabsf(to_f32(x[i]));
            if (a > amax) amax = a;
        }
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sc = __fdiv_rn(amax, 448.0f);
    }
    for (int i = lane; i < n; i += 32) {
        float v = to_f32(x[i]), e = sc > 0.0f ? __fdiv_rn(v, sc) : __fmul_rn(v, 0.0f);
        codes[i] = e != e ? 0x7f : __nv_cvt_float_to_fp8(e, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) *scale = sc;
}

/* A prefill tile (metadata entry i): its head, KV head, first row m0 of
 * its run, the run's first row in q, the tile's row count, the positions
 * of its first and last rows, the keys it sees [lo, hi) and the run's
 * block table. Both prefill kernels read their tile through it. */
typedef struct {
    int h, kvh, m0, q_start, rows, p_first, p_last, lo, hi;
    int pos_step;               /* row r's position is p_first + pos_step x r (cascade_tile: 0) */
    const int32_t *tab;
} PrefillTile;

template <int BM, bool WIN> __device__ __forceinline__ PrefillTile prefill_tile(const AttnKParams &p, int i) {
    PrefillTile t;
    const int32_t *tile = p.meta + p.off_tiles + 2 * i;
    const int32_t *run = p.meta + p.off_prefill + 4 * tile[0];
    t.h = blockIdx.y, t.kvh = t.h / p.group;
    t.m0 = tile[1], t.q_start = run[0];
    t.tab = p.meta + p.off_tables + (int64_t)run[3] * p.table_width;
    t.rows = min(BM, run[1] - t.m0);
    t.p_first = run[2] + t.m0, t.p_last = t.p_first + t.rows - 1;
    t.lo = WIN ? max(0, t.p_first - p.window + 1) : 0, t.hi = t.p_last + 1;
    t.pos_step = 1;
    return t;
}

/* Cascade's shared pass (p.casc_shared): the block of unit blockIdx.x, KV
 * head blockIdx.y and split blockIdx.z of the plan (attn_cascade.h
 * AttnCascadeMeta) as a tile: rows are the unit's (member, query head)
 * pairs (m0 the unit's first pair in its group, q_start the group's first
 * member, h unused), keys [lo, hi) the split's share of the prefix through
 * the group's table, and every row at position hi - 1 (pos_step 0), so the
 * causal mask only drops a partial last tile's keys >= hi. rows <= 0: a
 * split past the group's own, nothing to do. */
template <int BM> __device__ __forceinline__ PrefillTile cascade_tile(const AttnKParams &p) {
    PrefillTile t;
    const int32_t *unit = p.casc + p.casc_units + 2 * blockIdx.x;
    const int32_t *grp = p.casc + p.casc_groups + 5 * unit[0];
    t.h = -1, t.kvh = blockIdx.y;
    t.m0 = unit[1], t.q_start = grp[2];
    t.tab = p.meta + p.off_tables + (int64_t)grp[0] * p.table_width;
    t.lo = blockIdx.z * grp[4], t.hi = min(t.lo + grp[4], grp[1]);
    t.rows = t.lo < grp[1] ? min(BM, grp[3] - t.m0) : 0;
    t.p_first = t.p_last = t.hi - 1, t.pos_step = 0;
    return t;
}

/* Row r of a cascade tile t: the pair's member index, query head and
 * partial slot (attn_cascade.h: (member x n_heads + head) x splits + split). */
typedef struct {
    int member, h;
    int64_t slot;
} CascadePair;

__device__ __forceinline__ CascadePair cascade_pair(const AttnKParams &p, const PrefillTile &t, int r) {
    const int e = t.m0 + r;
    CascadePair c;
    c.member = t.q_start + e / p.group, c.h = t.kvh * p.group + e % p.group;
    c.slot = ((int64_t)c.member * p.n_heads + c.h) * p.casc_splits + blockIdx.z;
    return c;
}

/* Folds partial results (max m_s, sum l_s, output o_s, log2 domain) into a
 * running (m, l, o): the log-sum-exp merge of DESIGN.md "Cascade attention". */
__device__ __forceinline__ void lse_fold(float &m, float &l, float &o, float ms, float ls, float os) {
    const float mm = fmaxf(m, ms), base = mm == -INFINITY ? 0.f : mm;
    const float a = exp2f(m - base), b = exp2f(ms - base);
    l = l * a + ls * b, o = o * a + os * b, m = mm;
}

/* Launchers: run(cap, win) with std::true_type / std::false_type for kp's
 * soft-cap and window, so a kernel family's four mask variants are
 * instantiated and picked in one place. */
template <typename Run> static int attn_cap_win(const AttnKParams *kp, Run run) {
    const bool cap = kp->cap_in != 0.f, win = kp->window > 0;
    if (cap && win) return run(std::true_type{}, std::true_type{});
    if (cap) return run(std::true_type{}, std::false_type{});
    if (win) return run(std::false_type{}, std::true_type{});
    return run(std::false_type{}, std::false_type{});
}

/* One launch of an attention kernel with `smem` bytes of dynamic shared memory. */
template <typename Kernel>
static int attn_launch(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t s, const AttnKParams &kp,
                       Err *err) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err);
    kernel<<<grid, threads, smem, s>>>(kp);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* Copies rows [0, rows) of bf16 vectors of HD, row r at row_at(r), into a
 * [R][HD + 8] shared tile; rows >= rows are zeros (rows >= 1). */
template <int HD, int R, int NT, typename RowAt>
__device__ __forceinline__ void load_rows_at(bf16 *sm, RowAt row_at, int rows) {
    constexpr int CH = HD / 8;
    const bf16 *row0 = row_at(0);
    for (int i = (int)threadIdx.x; i < R * CH; i += NT) {
        int r = i / CH, c = i % CH;
        bool ok = r < rows;
        cp_async16(smem_u32(sm + r * (HD + 8) + c * 8), ok ? row_at(r) + c * 8 : row0, ok);
    }
}

/* The same for rows r at base + r * row_stride. */
template <int HD, int R, int NT>
__device__ __forceinline__ void load_rows(bf16 *sm, const bf16 *base, int64_t row_stride, int rows) {
    load_rows_at<HD, R, NT>(sm, [=](int r) { return base + r * row_stride; }, rows);
}

#endif
