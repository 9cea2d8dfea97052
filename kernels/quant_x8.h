/* quant_x8.h — the integer dot-product quantized GEMV (kernels/cuda/
 * quant_gemv_x8.cu, QGEMV_X8) for one x row: the rounding of x and the
 * arithmetic of a lane, in plain C shared by the kernel and by the CPU test
 * (tests/test_quant_x8.c) that replays it for every lane of a row.
 *
 * Why: at batch 1 the tensor-core kernel (quant_gemv_mma.cu) issues ~650
 * warp instructions per 4096 Q4_K weights (ncu), more issue time than the
 * 2.3 KB of those weights take to stream at 4.26 TB/s on the short matrices;
 * it is issue-bound at 30-50% of the bandwidth. Here x is rounded once per
 * block (into shared memory, before the rows), so a weight word costs one AND and two
 * dp4a (one per int8 term of x) and a lane's 64 Q4_K weights ~100
 * instructions with the scales: ~200 warp instructions per 4096 weights.
 *
 * x: each group of 32 values is rounded to two int8 terms (qx_split: x ~
 * dx (128 q1 + q2) / 128, ~15 bits, finer than the bf16 x itself; one term
 * alone leaves ~7 bits a group, 4-7e-3 relative error on the products and
 * top-1 flips on an 8B model). Per group the kernel also keeps
 * dxs = dx / 128 and sx = the sum of the rounded values (for the Q4_K
 * mins). Then for a weight row
 *   sum_i w_i x_i = sum over groups of dxs * sum_i w_i (128 q1_i + q2_i),
 * and with w_i = mul q_i - mn (a Q4_K sub-block of 32; Q8_0: mn = 0) the
 * integer part sum_i q_i q1_i and sum_i q_i q2_i are exact dp4a sums, so the
 * result is dequantize_row(W) times the rounded x up to fp32 rounding.
 *
 * Lanes: Q4_K, one 64-value chunk j of a block (its 32 bytes: low nibbles
 * are sub-block 2j, values 64j + m, high nibbles sub-block 2j + 1, values
 * 64j + 32 + m), the block's 16-byte header read by the block's 4 lanes.
 * The high nibbles are used in place (word & 0xf0f0f0f0 = 16 q as unsigned
 * bytes), the 16 taken out of the scale. Q5_K: as Q4_K, with the block's
 * 32 qh bytes read by its 4 lanes (qx_q5k_chunk). Q8_0: one 32-value block.
 * Q6_K: a quarter of a block (qx_q6k_quarter), 4 lanes a block as for Q4_K.
 * Q4_0 / Q4_1 / Q5_0 / Q5_1: one 32-value block, as Q8_0 (qx_q4_block; Q5's
 * fifth bits put onto the nibbles by qx_fifth_bits).
 *
 * The int8 planes of x are stored so that each 16-byte load of a warp is
 * 512 contiguous bytes: a lane's values are K 16-byte pieces (Q4_K K = 4:
 * 64 values, Q8_0 K = 2: 32), so pieces are transposed in tiles of 32 K:
 * piece n of a tile (values 16 n .. 16 n + 15) is stored at position
 * 32 (n % K) + n / K, and lane L's k-th load of a tile is position 32 k + L
 * (measured: with x in value order a warp's load touched 16 lines, and
 * Q4_K ran at 40% of the bandwidth where Q8_0 ran at 90%). */
#ifndef CLLM_QUANT_X8_H
#define CLLM_QUANT_X8_H

#include <stdbool.h>

#include "kernels/quant_mma.h"

#define QX_GROUP 32 /* x values per rounding group */

/* Rounding x to int8, one group of 32 values with largest magnitude amax:
 * q1 = rint(x * inv), inv = 127 / amax, dx = amax / 127 (round to nearest
 * even, as llama.cpp rounds its activations); the remainder r = x - q1 dx
 * (one fma) gives q2 = rint(r * 128 inv), |q2| <= 64; the value is
 * (128 q1 + q2) dx / 128 (qx_value). */
QM_FN float qx_inv(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }
QM_FN float qx_scale(float amax) { return amax / 127.f; }
QM_FN int qx_round(float v, float inv) {
#ifdef __CUDA_ARCH__
    return __float2int_rn(v * inv);
#else
    return (int)lrintf(v * inv);
#endif
}
QM_FN void qx_split(float v, float inv, float dx, int *q1, int *q2) {
    *q1 = qx_round(v, inv);
    *q2 = qx_round(fmaf(-(float)*q1, dx, v), 128.f * inv);
}
QM_FN float qx_value(int q1, int q2, float dx) { return (float)(128 * q1 + q2) * (dx * 0.0078125f); }
QM_FN uint32_t qx_pack(int q0, int q1, int q2, int q3) {
    return (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 | (uint32_t)(q2 & 0xff) << 16 | (uint32_t)q3 << 24;
}

/* c + the sum of the 4 byte products; b's bytes signed, a's signed or
 * (a_signed false) unsigned. a_signed is a constant at every call. */
QM_FN int qx_dp4a(uint32_t a, uint32_t b, int c, bool a_signed) {
#ifdef __CUDA_ARCH__
    int r;
    if (a_signed) asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    else asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    for (int k = 0; k < 4; k++) {
        int ak = a_signed ? (int)(int8_t)(uint8_t)(a >> (8 * k)) : (int)((a >> (8 * k)) & 0xffu);
        c += ak * (int)(int8_t)(uint8_t)(b >> (8 * k));
    }
    return c;
#endif
}

#define QX_TILE_VALUES 2048 /* the largest tile (K = 4); planes are padded to it */

/* x values per lane and step (pieces of 16 = K) of weight type t; 0: none */
QM_FN int qx_pieces(int t) {
    if (t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K) return 4;
    return t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 ? 2 : 0;
}

/* Byte offset in a plane row of x value i for weight type t: tiles of K
 * pieces a lane. Q6_K: the lane of quarter j = 2h + c of a block takes the
 * pieces 8h + c + 2k (k = 0..3, its codes' values: qx_q6k_quarter), so a
 * block's 16 pieces are first reordered to lane-major (piece r -> 4j + k). */
QM_FN int64_t qx_x_offset(int t, int64_t i) {
    const int K = qx_pieces(t);
    int64_t n = i >> 4, tile = n / (32 * K), w = n % (32 * K);
    if (t == DT_Q6_K) {
        const int r = (int)(w & 15);
        w = (w & ~(int64_t)15) | (4 * (2 * (r >> 3) + (r & 1)) + ((r >> 1) & 3));
    }
    return tile * (512 * K) + 16 * (32 * (w % K) + w / K) + (i & 15);
}

/* Rounds one group of 32 x values: the two int8 terms, dxs and sx as the
 * kernel stores them (the CPU version of qx_round_block in quant_gemv_x8.cu). */
static inline void qx_round_group(const float x[QX_GROUP], int8_t q1[QX_GROUP], int8_t q2[QX_GROUP], float *dxs,
                                  float *sx) {
    float amax = 0.f;
    for (int i = 0; i < QX_GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv = qx_inv(amax), dx = qx_scale(amax);
    int s = 0;
    for (int i = 0; i < QX_GROUP; i++) {
        int a, b;
        qx_split(x[i], inv, dx, &a, &b);
        q1[i] = (int8_t)a, q2[i] = (int8_t)b;
        s += 128 * a + b;
    }
    *dxs = dx * 0.0078125f;
    *sx = (float)s * *dxs;
}

/* mul (d sc) and mn (dmin m) of sub-blocks 2j and 2j + 1 of a Q4_K block
 * whose 16-byte header is hdr (base/dtype.c's 6-bit unpacking, as in
 * qm_q4k_scales, without branches on j: it differs between lanes). */
QM_FN void qx_q4k_scales(const uint32_t hdr[4], int j, float mul[2], float mn[2]) {
    uint32_t sc = j < 2 ? hdr[1] & 0x3f3f3f3fu : (hdr[3] & 0x0f0f0f0fu) | ((hdr[1] >> 2) & 0x30303030u);
    uint32_t m = j < 2 ? hdr[2] & 0x3f3f3f3fu : ((hdr[3] >> 4) & 0x0f0f0f0fu) | ((hdr[2] >> 2) & 0x30303030u);
    int sh = 16 * (j & 1);
    float d = qm_half(hdr[0] & 0xffffu), dmin = qm_half(hdr[0] >> 16);
    mul[0] = d * (float)((sc >> sh) & 0xffu);
    mul[1] = d * (float)((sc >> (sh + 8)) & 0xffu);
    mn[0] = dmin * (float)((m >> sh) & 0xffu);
    mn[1] = dmin * (float)((m >> (sh + 8)) & 0xffu);
}

/* The chunk's value from its two sub-blocks' integer sums lo, hi (the high
 * one's codes scaled by hi_scale as dp4a saw them): scales, x scales, mins. */
QM_FN float qx_k_chunk_sum(const uint32_t hdr[4], int j, int lo, int hi, float hi_scale, const float dxs[2],
                           const float sx[2]) {
    float mul[2], mn[2];
    qx_q4k_scales(hdr, j, mul, mn);
    const float lo_part = (dxs[0] * mul[0]) * (float)lo, hi_part = (dxs[1] * mul[1] * hi_scale) * (float)hi;
    return lo_part + hi_part - (mn[0] * sx[0] + mn[1] * sx[1]);
}

/* A lane's Q4_K chunk j: q the chunk's 32 bytes (8 words), hdr the block's
 * header; x1, x2 the int8 terms of x at values 64j .. 64j + 63 of the block
 * (16 words each, in value order); dxs, sx of groups 2j and 2j + 1.
 * Integers stay in range: |sum| <= 32 * 240 * (128 * 127 + 64) < 2^27. */
QM_FN float qx_q4k_chunk(const uint32_t q[8], const uint32_t hdr[4], int j, const uint32_t x1[16],
                         const uint32_t x2[16], const float dxs[2], const float sx[2]) {
    int a1 = 0, a2 = 0, b1 = 0, b2 = 0;
    for (int i = 0; i < 8; i++) {
        uint32_t lo = q[i] & 0x0f0f0f0fu, hi = q[i] & 0xf0f0f0f0u;
        a1 = qx_dp4a(lo, x1[i], a1, false);
        a2 = qx_dp4a(lo, x2[i], a2, false);
        b1 = qx_dp4a(hi, x1[8 + i], b1, false);
        b2 = qx_dp4a(hi, x2[8 + i], b2, false);
    }
    return qx_k_chunk_sum(hdr, j, 128 * a1 + a2, 128 * b1 + b2, 0.0625f, dxs, sx);
}

/* A lane's Q5_K chunk j (as qx_q4k_chunk, the header laid out alike): the
 * fifth bit of each code is bit 2j (low nibbles) or 2j + 1 (high) of
 * qh[l] (hb: the block's 32 qh bytes, 8 words, in l order, as q's). Codes
 * go to dp4a as unsigned bytes 0..31 (the high nibbles shifted down, so no
 * factor 16 in the scale). |sum| <= 32 * 31 * (128 * 127 + 64) < 2^24. */
QM_FN float qx_q5k_chunk(const uint32_t q[8], const uint32_t hb[8], const uint32_t hdr[4], int j,
                         const uint32_t x1[16], const uint32_t x2[16], const float dxs[2], const float sx[2]) {
    int a1 = 0, a2 = 0, b1 = 0, b2 = 0;
    for (int i = 0; i < 8; i++) {
        const uint32_t h = hb[i] >> (2 * j);
        const uint32_t lo = (q[i] & 0x0f0f0f0fu) | ((h & 0x01010101u) << 4);
        const uint32_t hi = ((q[i] >> 4) & 0x0f0f0f0fu) | ((h & 0x02020202u) << 3);
        a1 = qx_dp4a(lo, x1[i], a1, false);
        a2 = qx_dp4a(lo, x2[i], a2, false);
        b1 = qx_dp4a(hi, x1[8 + i], b1, false);
        b2 = qx_dp4a(hi, x2[8 + i], b2, false);
    }
    return qx_k_chunk_sum(hdr, j, 128 * a1 + a2, 128 * b1 + b2, 1.f, dxs, sx);
}

/* The fifth bits of 4 values onto their word of 4 nibble codes (Q5_0 /
 * Q5_1): bit 4 of byte i = bit i of the low 4 bits of h. The multiply puts
 * copies of those bits 7 apart, which land bit i at bit 8i and nowhere else
 * on a byte's bit 0 (no carries: the copies do not overlap). */
QM_FN uint32_t qx_fifth_bits(uint32_t h) { return ((h & 0xfu) * 0x00204081u & 0x01010101u) << 4; }

/* A lane's Q4_0 / Q4_1 / Q5_0 / Q5_1 block: q its 16 code bytes (4 words;
 * value j is the low nibble of byte j, value 16 + j its high nibble), qh the
 * fifth bits (bit j of value j; 0 for Q4), value = d code + m (Q4_0: m =
 * -8 d, Q5_0: -16 d); x1, x2 the int8 terms of its 32 values, dxs and sx
 * their group's. |sum| <= 32 * 31 * (128 * 127 + 64) < 2^24. */
QM_FN float qx_q4_block(const uint32_t q[4], uint32_t qh, float d, float m, const uint32_t x1[8], const uint32_t x2[8],
                        float dxs, float sx) {
    int a1 = 0, a2 = 0;
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = (q[i] & 0x0f0f0f0fu) | qx_fifth_bits(qh >> (4 * i));
        const uint32_t hi = ((q[i] >> 4) & 0x0f0f0f0fu) | qx_fifth_bits(qh >> (16 + 4 * i));
        a1 = qx_dp4a(lo, x1[i], a1, false);
        a2 = qx_dp4a(lo, x2[i], a2, false);
        a1 = qx_dp4a(hi, x1[4 + i], a1, false);
        a2 = qx_dp4a(hi, x2[4 + i], a2, false);
    }
    return (d * dxs) * (float)(128 * a1 + a2) + m * sx;
}

/* A lane's Q8_0 block: q its 32 int8 codes (8 words), d its scale; x1, x2
 * the int8 terms of its 32 x values, dxs their group's. */
QM_FN float qx_q8_block(const uint32_t q[8], float d, const uint32_t x1[8], const uint32_t x2[8], float dxs) {
    int a1 = 0, a2 = 0;
    for (int i = 0; i < 8; i++) {
        a1 = qx_dp4a(q[i], x1[i], a1, true);
        a2 = qx_dp4a(q[i], x2[i], a2, true);
    }
    return (d * dxs) * (float)(128 * a1 + a2);
}

/* A lane's Q6_K quarter j = 2h + c of a block (value = d sc (q - 32), q =
 * 4 bits of ql | 2 bits of qh << 4, 16 values a scale): a = ql[64h + 16c ..
 * + 15], b = ql[64h + 32 + 16c ..], hb = qh[32h + 16c ..] (4 words each);
 * sc8 = scales[8h .. 8h + 7] (2 words). Piece k (k = 0..3) is the values
 * 128h + 32k + 16c + m: low nibbles of a, b (k = 0, 1), high nibbles of a, b
 * (k = 2, 3), qh bits 2k, 2k + 1; scale sc[8h + c + 2k]. A code byte is made
 * as 4 (q - 32) in signed int8: the nibble in bits 2..5, the two qh bits in
 * bits 6..7 with the top one flipped (q ^ 32 is q - 32 in 6-bit two's
 * complement), so dp4a takes it as it is and no sum of x is needed.
 * x1, x2: the int8 terms of the 4 pieces (4 words each, piece k at 4k);
 * dxs: the groups' of the pieces (group 4h + k of the block).
 * |sum| per piece <= 16 * 128 * (128 * 127 + 64) < 2^26. */
QM_FN float qx_q6k_quarter(const uint32_t a[4], const uint32_t b[4], const uint32_t hb[4], const uint32_t sc8[2],
                           int c, float d, const uint32_t x1[16], const uint32_t x2[16], const float dxs[4]) {
    float acc = 0.f;
    for (int k = 0; k < 4; k++) {
        int s1 = 0, s2 = 0;
        for (int i = 0; i < 4; i++) {
            const uint32_t ql = k & 1 ? b[i] : a[i], hf = hb[i] ^ 0xaaaaaaaau;
            const uint32_t lo = k < 2 ? ql << 2 : ql >> 2;                       /* nibble at bits 2..5 */
            const uint32_t hi = (hf & (0x03030303u << 2 * k)) << (6 - 2 * k);     /* bits 2k, 2k+1 at 6..7 */
            const uint32_t code = (lo & 0x3c3c3c3cu) | hi;
            s1 = qx_dp4a(code, x1[4 * k + i], s1, true);
            s2 = qx_dp4a(code, x2[4 * k + i], s2, true);
        }
        const int sc = (int)(int8_t)(uint8_t)(sc8[k >> 1] >> (8 * (c + 2 * (k & 1))));
        acc += (dxs[k] * (float)sc) * (float)(128 * s1 + s2);
    }
    return 0.25f * d * acc;
}

#endif
