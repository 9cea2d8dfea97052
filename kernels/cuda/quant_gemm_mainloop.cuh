/* quant_gemm_mainloop.cuh — the main loop of the fused quantized GEMM's
 * blocks (quant_gemm.cu, the only includer): the stage layout, the loads by
 * TMA, each thread's A fragments dequantized in registers, and the wgmma
 * loop; with the sm_90a instructions it issues (wgmma, mbarriers, TMA).
 *
 * A block: 256 threads, two warpgroups of 64 W rows each, 128 W rows by BN
 * tokens (16 .. 256). Thread 0 also loads each stage (64 values of k) by TMA
 * (x's tile in wgmma's 128-byte swizzle; Q4_K: the stage's 32 code bytes a
 * row and the block's 16-byte header; Q8_0: 64 codes a row, 16-byte chunks
 * swizzled by (row / 2) % 4 so the fragment reads below do not conflict, and
 * 16 scale bytes a row of which the stage's are 4 (kt % 4) ..; Q5_K, Q6_K:
 * qr_load), S - 1 stages ahead, on mbarriers (full: the bytes landed;
 * empty: all 256 threads are done with it). Each multiplying thread reads
 * the bytes of its fragment of A (wgmma m64nNk16, A from registers: rows g
 * and g + 8 of its warp's 16, k = 2t, 2t + 1, 2t + 8, 2t + 9 of each k16
 * step), dequantizes them with bf16x2 arithmetic and issues the wgmma. No
 * bf16 W tile in shared memory (a warpgroup dequantizing into shared memory
 * for two multiplying ones was bound by that one warp a scheduler), no copy
 * instructions and no block barrier in the loop. */
#ifndef CLLM_QUANT_GEMM_MAINLOOP_CUH
#define CLLM_QUANT_GEMM_MAINLOOP_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/tensor_core.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "base/dtype.h"

#define QM_WGMMA WG_SM90A

#define QM_BM 128 /* W rows a block */
/* A stage is x's tile and W's raw bytes, 128 rows of 32 codes + 16 header
 * bytes (Q4_K) or 64 codes + 16 scale bytes (Q8_0); Q6_K: 64 ql bytes, then
 * 32 qh bytes, then the block's 16 scales (d by plain loads); Q5_K: Q4_K's
 * 32 codes, the block's 32 qh bytes, then its header */
#define QR_THREADS 256 /* two warpgroups; thread 0 also issues the loads */
template <int Q> static __host__ __device__ constexpr int qr_codes_bytes() {
    return Q == DT_Q4_K ? QM_BM * 32 : Q == DT_Q6_K ? QM_BM * 96 : QM_BM * 64; /* Q5_K: 32 codes + 32 qh */
}
template <int Q> static __host__ __device__ constexpr int qr_w_bytes() { return qr_codes_bytes<Q>() + QM_BM * 16; }
/* BN tokens a block: 16, 32, 64, 128 (one wgmma of n = BN a k16 step) or
 * 256 (two of n = 128); x's tile is BN rows of 128 bytes */
template <int BN> static __host__ __device__ constexpr int qr_halves() { return BN > 128 ? 2 : 1; }
template <int BN> static __host__ __device__ constexpr int qr_wn() { return BN > 128 ? 128 : BN; }
template <int Q, int BN> static __host__ __device__ constexpr int qr_stage_bytes() {
    return BN * 128 + ((qr_w_bytes<Q>() + 1023) & ~1023); /* x's tile first: keeps the 1024-byte atoms */
}
#define QR_SMEM_MAX (227 * 1024 - 1024 - 256) /* less the alignment and the mbarriers */
/* a multiple of 4 (the multipliers' loop takes S stages a turn, so buffers,
 * descriptors and kt % 4 are constants), at most 8 */
/* MB blocks an SM: 1, or 2 (64- and 128-token tiles of Q4_K and Q8_0: half the shared memory each, 128
 * registers; quant_gemm takes it for launches of more tiles than SMs and no split of K) */
#define QR_SMEM_MAX2 (112 * 1024 - 1024 - 256)
template <int Q, int BN, int MB = 1> static __host__ __device__ constexpr int qr_stages() {
    constexpr int fit = (MB == 2 ? QR_SMEM_MAX2 : QR_SMEM_MAX) / qr_stage_bytes<Q, BN>();
    return fit >= 8 ? 8 : fit / 4 * 4;
}
/* the rows of x's box: BN, or T where a launch's one token tile is shorter (the tensor map's box and
 * each stage's expected bytes must agree) */
template <int BN> static __host__ __device__ int qr_x_rows(int T) { return T < BN ? T : BN; }

template <int Q, int BN, int MB = 1> static __host__ __device__ constexpr int qr_smem_bytes() {
    return qr_stages<Q, BN, MB>() * qr_stage_bytes<Q, BN>() + 16 * qr_stages<Q, BN, MB>() + 1024;
}

/* ---- wgmma (PTX ISA 8.0, sm_90a); everything below is device code of the
 * sm_90a target only ---- */
#if QM_WGMMA

/* Shared-memory matrix descriptor of a K-major bf16 tile with rows of 128
 * bytes, 128-byte swizzle: start address, stride between 8-row groups 1024. */
static __device__ __forceinline__ uint64_t qm_desc(uint32_t saddr) {
    return (uint64_t)((saddr >> 4) & 0x3fff) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
/* the 64 fp32 accumulators of an m64n128 wgmma: operands %0-%63 of the asm */
#define QM_ACC_OPERANDS                                                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"  \
    "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,"    \
    "%57,%58,%59,%60,%61,%62,%63},"
#define QM_ACC8(d, i)                                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]),         \
        "+f"(d[i + 7])
#define QM_ACC_CONSTRAINTS(d)                                                                                          \
    QM_ACC8(d, 0), QM_ACC8(d, 8), QM_ACC8(d, 16), QM_ACC8(d, 24), QM_ACC8(d, 32), QM_ACC8(d, 40), QM_ACC8(d, 48),      \
        QM_ACC8(d, 56)

static __device__ __forceinline__ float qm_half(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
/* (a & k) | m in one LOP3 (the compiler splits two immediates into two) */
static __device__ __forceinline__ uint32_t qm_and_or(uint32_t a, uint32_t k, uint32_t m) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(k), "r"(m));
    return d;
}

static __device__ __forceinline__ uint32_t bf16_pair(float a, float b) {
    __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&p;
}

/* B's descriptor from its low word (qm_desc's, + offset / 16): the high
 * word is a constant, so the per-wgmma additions stay 32-bit; m64nNk16 with
 * N = 2 NA (NA accumulators a thread) */
template <int NA>
static __device__ __forceinline__ void wg_mma_rs(float (&d)[NA], const uint32_t (&a)[4], uint32_t db_lo, int add) {
    const uint32_t hi = (uint32_t)(qm_desc(0) >> 32);
    if constexpr (NA == 64) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %69, 0;\nmov.b64 db, {%68, %70};\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            QM_ACC_OPERANDS
            " {%64,%65,%66,%67}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC_CONSTRAINTS(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else if constexpr (NA == 32) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %37, 0;\nmov.b64 db, {%36, %38};\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0), QM_ACC8(d, 8), QM_ACC8(d, 16), QM_ACC8(d, 24)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else if constexpr (NA == 16) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %21, 0;\nmov.b64 db, {%20, %22};\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0), QM_ACC8(d, 8)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else {
        static_assert(NA == 8, "m64n16, n32, n64 or n128");
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %13, 0;\nmov.b64 db, {%12, %14};\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    }
}

/* the TMA tile load */
static __device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Stage kt's loads into buffer b (thread 0), its byte count announced on
 * b's full barrier. x: box {64 values, xrows tokens} at (64 kt, n0) (xrows = BN,
 * or T where a launch's one token tile is shorter: rows past T stay stale and
 * feed only tokens that are not stored); Q4_K
 * codes {32, 128} at block kt / 4's bytes 16 + 32 (kt % 4), headers {16, 128}
 * at its byte 0; Q8_0 codes {64, 128} at 64 kt, scales {16, 128} at byte
 * 16 (kt / 4) of the row's (4 stages' scales: a box's inner start must be
 * 16-byte aligned, and one at 4 kt faulted; past the row: zeros); Q6_K
 * ql {64, 128} (64-byte swizzle), qh {32, 128} (32-byte swizzle), scales
 * {16, 128} of half kt / 2 % 2 of block kt / 4. */
/* A plane of W's stage: one box of 128 rows at m0, or with two (a gated pair:
 * the tensor maps' boxes are 64 rows) 64 rows at m0 and 64 at m1 */
static __device__ __forceinline__ void qr_load_w(uint32_t dst, const CUtensorMap *map, int c0, int m0, int m1, bool two,
                                                 int row_bytes, uint32_t bar) {
    tma_load_2d(dst, map, c0, m0, bar);
    if (two) tma_load_2d(dst + 64 * row_bytes, map, c0, m1, bar);
}

template <int Q, int BN, int MB>
static __device__ __forceinline__ void qr_load(uint8_t *smem, const CUtensorMap *tx, const CUtensorMap *tw,
                                               const CUtensorMap *tw2, const CUtensorMap *tw3, int n0, int xrows, int m0,
                                               int m1, bool two, int kt, int b) {
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>();
    const uint32_t full = smem_u32(smem) + S * SB + 8 * b, st = smem_u32(smem) + b * SB, w = st + BN * 128;
    mbar_expect_tx(full, xrows * 128 + qr_w_bytes<Q>());
    tma_load_2d(st, tx, kt * 64, n0, full);
    if (Q == DT_Q4_K) {
        qr_load_w(w, tw, (kt >> 2) * 144 + 16 + (kt & 3) * 32, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 144, m0, m1, two, 16, full);
    } else if (Q == DT_Q5_K) {
        qr_load_w(w, tw, (kt >> 2) * 176 + 48 + (kt & 3) * 32, m0, m1, two, 32, full);
        qr_load_w(w + QM_BM * 32, tw3, (kt >> 2) * 176 + 16, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 176, m0, m1, two, 16, full);
    } else if (Q == DT_Q6_K) { /* half h = kt / 2 % 2 of block kt / 4: ql[64h ..], qh[32h ..], all 16 scales */
        const int blk = (kt >> 2) * 208, h = (kt >> 1) & 1;
        qr_load_w(w, tw, blk + 64 * h, m0, m1, two, 64, full);
        qr_load_w(w + QM_BM * 64, tw3, blk + 128 + 32 * h, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, blk + 192, m0, m1, two, 16, full);
    } else {
        qr_load_w(w, tw, kt * 64, m0, m1, two, 64, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 16, m0, m1, two, 16, full); /* starts 16-byte aligned */
    }
}

/* bf16x2 arithmetic (sm_90), round to nearest even */
static __device__ __forceinline__ uint32_t bf2_sub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t bf2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#define QR_BF16_128 0x43004300u /* bf16 128.0 twice: OR a 7-bit q into the mantissa and it reads 128 + q */

/* Q4_K sub-block j's 6-bit scale and min (base/dtype.c kquant_scale_min)
 * as the bf16 pair (128 + scale, 128 + min): header bytes gathered into the
 * two halves by PRMTs, masked and OR-ed onto 128.0 by LOP3s (j is a
 * compile-time constant) */
static __device__ __forceinline__ uint32_t q4k_scale_min_bf16x2(uint4 h, int j) {
    if (j < 4) /* scale = sc[j] & 63 (h.y byte j), min = sc[j + 4] & 63 (h.z byte j) */
        return qm_and_or(__byte_perm(h.y, h.z, 0x1100 * (4 + j) + 0x11 * j), 0x003f003fu, QR_BF16_128);
    const int i = j - 4; /* sc[j + 4] = h.w byte i, sc[j - 4] = h.y byte i, sc[j] = h.z byte i */
    const uint32_t b = __byte_perm(h.w, 0, 0x1111 * i), hi = __byte_perm(h.y, h.z, 0x1100 * (4 + i) + 0x11 * i);
    /* scale = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4, min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4 */
    return qm_and_or(hi >> 2, 0x00300030u, qm_and_or(b >> 4, 0x000f0000u, qm_and_or(b, 0xfu, QR_BF16_128)));
}

/* The fragments of row `row` (r = 0: g, 1: g + 8): the codes' byte pair
 * (k = 2t, 2t + 1) spread to the two halves by one PRMT, 128 + q made by one
 * LOP3 and q by an exact bf16x2 subtraction; then Q4_K fma(q, s, c) with s =
 * bf16(scale bf16(d)), c = bf16(min bf16(-dmin)) (the scale and min of both
 * sub-blocks made the same way, as pairs), Q8_0 q bf16(d); rounded once
 * each (2 and 2.5 instructions a value; fp32 operations rounding as
 * dequantize_row does took 3.5, 10-15% slower a layer; values within ~2^-8
 * of those, which are quant_dequant_bf16's). A Q8_0 code is L - 128 s (L its
 * low 7 bits, s its sign bit): (128 + L) - (128 + 128 s), exact. */
#define QR_BF16_160 0x43204320u /* bf16 160.0 twice: (128 + q) - 160 = q - 32, a Q6_K code */

/* Q6_K: stage kt is half h = kt / 2 % 2 of its block, nibble n =
 * kt % 2 of ql[64h ..] (k16 step p: bytes 16p + 8e + 2t, +1, in the 64-byte
 * swizzle), the qh bits 2(2n + p / 2), + 1 of qh[32h + 16 (p % 2) ..] (32-byte
 * swizzle), scale sc[8h + 4n + p]; 128 + q made by two LOP3s, q - 32 by an
 * exact bf16x2 subtraction, times s = bf16(sc bf16(d)) (sc exact in bf16 as
 * Q8_0's codes are), rounded once. */
static __device__ __forceinline__ void q6k_frags_bf16x2(uint32_t (&a)[4][4], const uint8_t *w, int row, int r, int t,
                                                        int kt, float d) {
    const int n = kt & 1, h = (kt >> 1) & 1;
    const uint32_t sw = *(const uint32_t *)(w + qr_codes_bytes<DT_Q6_K>() + row * 16 + 8 * h + 4 * n);
    const uint32_t d2 = bf16_pair(d, d);
    uint32_t s2[2]; /* steps (0, 1), (2, 3): (sc, sc') * bf16(d) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t v = __byte_perm(sw, 0, i ? 0x4342 : 0x4140);
        s2[i] = bf2_mul(bf2_sub(qm_and_or(v, 0x007f007fu, QR_BF16_128), qm_and_or(v, 0x00800080u, QR_BF16_128)), d2);
    }
    const uint8_t *ql = w + row * 64, *qh = w + QM_BM * 64 + row * 32;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const uint32_t s = __byte_perm(s2[p >> 1], 0, p & 1 ? 0x3232 : 0x1010);
        const int k = 2 * n + (p >> 1); /* qh bits 2k, 2k + 1 */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            uint32_t v = __byte_perm(*(const uint16_t *)(ql + ((p ^ ((row >> 1) & 3)) << 4) + 8 * e + 2 * t), 0, 0x4140);
            uint32_t hv = __byte_perm(*(const uint16_t *)(qh + (((p & 1) ^ ((row >> 2) & 1)) << 4) + 8 * e + 2 * t), 0, 0x4140);
            if (n) v >>= 4;
            hv = k < 2 ? hv << (4 - 2 * k) : hv >> (2 * k - 4);
            const uint32_t code = qm_and_or(v, 0x000f000fu, qm_and_or(hv, 0x00300030u, QR_BF16_128));
            a[p][r + 2 * e] = bf2_mul(bf2_sub(code, QR_BF16_160), s);
        }
    }
}

template <int Q>
static __device__ __forceinline__ void qr_frags_bf16x2(uint32_t (&a)[4][4], const uint8_t *w, int row, int r, int t,
                                                       int kt) {
    if (Q == DT_Q4_K || Q == DT_Q5_K) {
        const uint8_t *rw = w + row * 32;
        const uint4 h = *(const uint4 *)(w + qr_codes_bytes<Q>() + row * 16);
        const float2 d_dmin = __half22float2(*(const __half2 *)&h.x);
        const uint32_t dm = bf16_pair(d_dmin.x, -d_dmin.y);
        uint32_t s2[2], c2[2];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const uint32_t sm = bf2_mul(bf2_sub(q4k_scale_min_bf16x2(h, 2 * (kt & 3) + n), QR_BF16_128), dm);
            s2[n] = __byte_perm(sm, 0, 0x1010), c2[n] = __byte_perm(sm, 0, 0x3232);
        }
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t v = __byte_perm(*(const uint16_t *)(rw + 16 * p + 8 * e + 2 * t), 0, 0x4140), vh = v >> 4;
                uint32_t lo = QR_BF16_128, hi = QR_BF16_128;
                if (Q == DT_Q5_K) { /* the fifth bits: qh[l] bits 2j (low nibbles), 2j + 1 (high), j = kt % 4 */
                    const int j = kt & 3, off = ((p ^ ((row >> 2) & 1)) << 4) + 8 * e + 2 * t; /* 32-byte swizzle */
                    const uint32_t b = __byte_perm(*(const uint16_t *)(w + QM_BM * 32 + row * 32 + off), 0, 0x4140);
                    lo = qm_and_or(2 * j <= 4 ? b << (4 - 2 * j) : b >> (2 * j - 4), 0x00100010u, lo);
                    hi = qm_and_or(2 * j + 1 <= 4 ? b << (3 - 2 * j) : b >> (2 * j - 3), 0x00100010u, hi);
                }
                a[p][r + 2 * e] = bf2_fma(bf2_sub(qm_and_or(v, 0x000f000fu, lo), QR_BF16_128), s2[0], c2[0]);
                a[p + 2][r + 2 * e] = bf2_fma(bf2_sub(qm_and_or(vh, 0x000f000fu, hi), QR_BF16_128), s2[1], c2[1]);
            }
    } else {
        const uint8_t *rw = w + row * 64;
        const uint32_t dd = *(const uint32_t *)(w + qr_codes_bytes<Q>() + row * 16 + 4 * (kt & 3));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float d = qm_half(k & 2 ? dd >> 16 : dd & 0xffff);
            const uint32_t d2 = bf16_pair(d, d);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t u = *(const uint16_t *)(rw + ((k ^ ((row >> 1) & 3)) << 4) + 8 * e + 2 * t);
                const uint32_t v = __byte_perm(u, 0, 0x4140);
                a[k][r + 2 * e] = bf2_mul(bf2_sub(qm_and_or(v, 0x007f007fu, QR_BF16_128), qm_and_or(v, 0x00800080u, QR_BF16_128)), d2);
            }
        }
    }
}

/* This thread's A fragments of the stage, a[k] for k16 step k: registers 0, 1
 * rows g, g + 8 at k = 2t, 2t + 1; 2, 3 the same rows at 2t + 8, 2t + 9
 * (wgmma's A layout, each warp 16 rows). w: the stage's raw bytes, row0:
 * the block row of g. Q4_K: the stage's 64 values are the low nibbles of its
 * 32 code bytes (sub-block 2 (kt % 4)), then the high ones (+ 1), so bytes
 * 16p + 8e + 2t, +1 give step p's (low) and p + 2's (high) pair e. Q8_0:
 * step k is chunk k of the row (block k / 2), pair e its bytes 8e + 2t, +1. */
template <int Q>
static __device__ __forceinline__ void qr_frags(uint32_t (&a)[4][4], const uint8_t *w, int row0, int t, int kt,
                                                const float (&d6)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if constexpr (Q == DT_Q6_K) {
            q6k_frags_bf16x2(a, w, row, r, t, kt, d6[r]);
        } else {
            qr_frags_bf16x2<Q>(a, w, row, r, t, kt);
        }
    }
}

/* keeps A registers live (unchanged) up to here */
static __device__ __forceinline__ void qr_hold(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" ::"r"(a[k][i]) : "memory");
}

/* Q6_K's d of rows row, row + 8 (of the block's) in block b, as floats */
static __device__ __forceinline__ void q6k_d(float (&d)[2], const unsigned short *dq, int nb, int row, int b) {
#pragma unroll
    for (int r = 0; r < 2; r++) d[r] = qm_half(__ldg(dq + (int64_t)(row + 8 * r) * nb + b));
}

/* Thread j of 256: wait for stage kt's bytes, multiply, and release kt - 1's
 * buffer once the wait for its products is over; thread 0 then refills it
 * with stage kt - 1 + S when all 256 have (S - 1 stages ahead). Stages kt0
 * .. kt1 - 1 (the block's split of K). A turn of the loop is 4 stages (kt0
 * and kt1 are multiples of 4: cols % 256 == 0) in buffers
 * q .. q + 3, q = 4 (turn % (S / 4)): kt % 4 and the offsets of every
 * descriptor and barrier from q's are constants. */
template <int Q, int BN, int MB>
static __device__ __forceinline__ void qr_multiply(float (&acc)[qr_halves<BN>()][qr_wn<BN>() / 2], uint8_t *smem,
                                                   const CUtensorMap *tx, const CUtensorMap *tw, const CUtensorMap *tw2,
                                                   const CUtensorMap *tw3, const unsigned short *dq, int nb, int n0,
                                                   int xrows, int m0, int m1, bool two, int kt0, int kt1) {
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>(), NH = qr_halves<BN>(), WN = qr_wn<BN>();
    const int j = threadIdx.x, wg = j >> 7, warp = (j >> 5) & 3, lane = j & 31;
    const int row0 = 64 * wg + 16 * warp + (lane >> 2), t = lane & 3;
    const int wrow = (wg ? m1 - 64 : m0) + row0; /* the thread's row of W (Q6_K's d) */
    const uint32_t bars = smem_u32(smem) + S * SB;
    const uint32_t d0 = (uint32_t)qm_desc(smem_u32(smem));
    /* a[kt % 2]: wgmma reads its A registers after issue, until its group is
     * waited for, and ptxas does not know it (a Q8_0 loop that reused one set
     * failed test_quant_gemm): two sets, each held live until the wait that
     * covers its stage. */
    uint32_t a[2][4][4];
    constexpr int G = S / 4; /* turns a buffer's use count advances by one */
    static_assert(S % 4 == 0, "buffers in fours");
    float d6[2] = {0.f, 0.f}, d6_next[2] = {0.f, 0.f}; /* Q6_K: the turn's block's d, the next turn's (a turn ahead) */
    if (Q == DT_Q6_K) q6k_d(d6, dq, nb, wrow, kt0 >> 2);
    for (int k0 = kt0, turn = 0; k0 < kt1; k0 += 4, turn++) {
        const int q = 4 * (turn % G), n = turn / G;                 /* buffers q + u, their use count */
        const int qp = q ? q - 4 : S - 4, np = q ? n : n - 1;        /* the turn before's */
        if (Q == DT_Q6_K && k0 + 4 < kt1) q6k_d(d6_next, dq, nb, wrow, (k0 >> 2) + 1);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int kt = k0 + u;
            mbar_wait(bars + 8 * (q + u), n & 1);
            qr_frags<Q>(a[u & 1], smem + (q + u) * SB + BN * 128, row0, t, u, d6);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int h = 0; h < NH; h++)
                    wg_mma_rs(acc[h], a[u & 1][k], d0 + (((q + u) * SB + h * WN * 128 + 32 * k) >> 4), (kt - kt0) | k);
            wg_commit();
            wg_wait<1>();
            qr_hold(a[(u + 1) & 1]); /* stage kt - 1's registers: free only from here */
            if (kt > kt0) {
                const int prev = u ? q + u - 1 : qp + 3, pn = u ? n : np; /* kt - 1's buffer and use count */
                mbar_arrive(bars + 8 * (S + prev));
                if (j == 0 && kt - 1 + S < kt1) {
                    mbar_wait(bars + 8 * (S + prev), pn & 1);
                    qr_load<Q, BN, MB>(smem, tx, tw, tw2, tw3, n0, xrows, m0, m1, two, kt - 1 + S, prev);
                }
            }
        }
        d6[0] = d6_next[0], d6[1] = d6_next[1];
    }
    wg_wait<0>();
    qr_hold(a[0]);
    qr_hold(a[1]);
#pragma unroll
    for (int h = 0; h < NH; h++) wg_hold(acc[h]);
}

#endif /* QM_WGMMA */

#endif
