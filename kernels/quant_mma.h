/* quant_mma.h — how the tensor-core quantized GEMV (kernels/cuda/
 * quant_gemv_mma.cu, QGEMV_MMA) lays Q4_K and Q8_0 blocks onto mma.sync
 * m16n8k16 fragments. Plain C shared by the kernel and by the CPU test
 * (tests/test_quant_mma.c) that runs these same functions for the 32 lanes
 * of a warp through an emulated mma, so the mapping is checked in CI. Also
 * the fp16 and function-attribute helpers that kernels/quant_x8.h (the dp4a
 * GEMV's lane arithmetic) builds on.
 *
 * Why tensor cores for a matrix-vector product: the scalar kernel
 * (quant_gemv.cu) spends ~5-6 instructions per 4-bit weight (code -> float, dequantize,
 * FMA per x row, scale unpacking), as much issue time as the weights take
 * to stream, so it never reaches the bandwidth. Here a weight costs about
 * one integer op (a nibble pair becomes a bf16 pair with one LOP3), and
 * the multiply-adds for all T <= 8 x rows are one mma per 256 weights.
 *
 * Fragments (PTX ISA, m16n8k16 .bf16, fp32 accumulate; lane = 4 g + c):
 *   A (16 weight rows x 16 k): a[0] row g, k 2c..2c+1; a[1] row g+8 same k;
 *                              a[2] row g, k 2c+8..2c+9; a[3] row g+8.
 *   B (16 k x 8 x rows t):     b[0] k 2c..2c+1, t = g; b[1] k 2c+8..2c+9.
 *   C (16 rows x 8 t, fp32):   c[0], c[1] row g, t 2c, 2c+1; c[2], c[3] row g+8.
 * The dot product does not care which k is which, only that A and B agree,
 * so the k of an mma step are mapped onto the values of a block however
 * makes the weight bytes cheap to unpack:
 *
 * Q4_K (256 values: header d, dmin, 12 bytes of 6-bit scales/mins; then 4
 * chunks of 32 bytes, byte m of chunk q holding value 64q + m (low nibble,
 * sub-block 2q) and 64q + 32 + m (high nibble, sub-block 2q + 1)). Lane c
 * reads bytes 8c..8c+7 of a chunk (two words) for rows g and g+8. Sub-block
 * j = 2q + h is two mma steps s = 0, 1 over word s: a[0] takes the nibbles
 * (h) of bytes 0 and 2 of the word (values m0, m0 + 2 with m0 = 8c + 4s),
 * a[2] those of bytes 1 and 3 (m0 + 1, m0 + 3). A nibble pair becomes bf16
 * (128 + code) with one AND-OR (0x4300 is 128 in bf16, whose 7 mantissa
 * bits hold the code exactly). B takes x[m0], x[m0 + 2] and x[m0 + 1],
 * x[m0 + 3] of the sub-block: one 16-byte load of 8 x values per lane and
 * step pair, regrouped by byte permutes.
 *   Per sub-block the two steps run into a fresh C, and a second mma with
 *   A = all ones gives S = sum of x over the sub-block (per t). With
 *   mul = d sc_j and add = -dmin m_j (dequantize: value = mul q + add),
 *     sum_k (mul q_k + add) x_k = mul C + (add - 128 mul) S,
 *   two fp32 FMAs per accumulator (qm_q4k_scales gives mul and add - 128 mul).
 *   The codes enter the tensor cores exactly, so the error is fp32
 *   accumulation only (C carries 128 S, cancelled in fp32: ~2^-16 of sum|x|).
 *
 * Q8_0 (32 values: d, 32 int8). Lane c reads bytes 8c..8c+7 of the block's
 * 32 (two words); step s takes word s: a[0] = values (m0, m0 + 1), a[2] =
 * (m0 + 2, m0 + 3), each int8 made an exact float by the 2^23 trick and cut
 * to bf16 (|q| <= 128 has 8 significant bits: exact). B is x[m0 .. m0 + 3]
 * in order: two 4-byte words of the lane's 16-byte load. C of the block's
 * two steps times d goes into the accumulator.
 */
#ifndef CLLM_QUANT_MMA_H
#define CLLM_QUANT_MMA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define QM_FN static __host__ __device__ __forceinline__
#else
#define QM_FN static inline
#endif

#define QM_SB 256            /* values of a stage: a Q4_K block, eight Q8_0 blocks */
#define QM_BF16_ONES 0x3f803f80u /* two bf16 1.0: the A of the sum-of-x mma */

QM_FN uint32_t qm_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
#endif
}

QM_FN float qm_half(uint32_t h16) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h16));
#else
    return fp16_to_fp32((uint16_t)h16);
#endif
}

/* Nibbles at bits 0-3 and 16-19 of v -> bf16 pair (128 + each). On the GPU
 * one LOP3 (the compiler splits the AND-OR with two immediates into two). */
QM_FN uint32_t qm_q4_pair(uint32_t v) {
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "n"(0x000f000f), "r"(0x43004300u)); /* (a & b) | c */
    return r;
#else
    return (v & 0x000f000fu) | 0x43004300u;
#endif
}

/* The A fragment of Q4_K step s of the half h (0 low nibbles, 1 high) of a
 * chunk: wg, wg8 the lane's two words of rows g and g + 8. */
QM_FN void qm_q4k_a(const uint32_t wg[2], const uint32_t wg8[2], int s, int h, uint32_t a[4]) {
    uint32_t vg = wg[s] >> (4 * h), vg8 = wg8[s] >> (4 * h);
    a[0] = qm_q4_pair(vg);
    a[1] = qm_q4_pair(vg8);
    a[2] = qm_q4_pair(vg >> 8);
    a[3] = qm_q4_pair(vg8 >> 8);
}

/* Q4_K B of step s from the lane's 8 x values X (4 bf16 pairs, in order):
 * (x0, x2), (x1, x3) for s = 0; (x4, x6), (x5, x7) for s = 1. */
QM_FN void qm_q4k_b(const uint32_t X[4], int s, uint32_t b[2]) {
    uint32_t lo = X[2 * s], hi = X[2 * s + 1];
#ifdef __CUDA_ARCH__ /* one byte permute each (the compiler makes four ops of the masks and shifts) */
    b[0] = __byte_perm(lo, hi, 0x5410u);
    b[1] = __byte_perm(lo, hi, 0x7632u);
#else
    b[0] = (lo & 0xffffu) | (hi << 16);
    b[1] = (lo >> 16) | (hi & 0xffff0000u);
#endif
}

/* Q4_K: mul and add - 128 mul of 4 sub-blocks (half 0: 0..3, 1: 4..7) of
 * the block whose 16-byte header is hdr (base/dtype.c's 6-bit unpacking,
 * four at a time as bytes of a word). */
QM_FN void qm_q4k_scales(const uint32_t hdr[4], int half, float mul[4], float addp[4]) {
    uint32_t sc, mn;
    if (half == 0) {
        sc = hdr[1] & 0x3f3f3f3fu;
        mn = hdr[2] & 0x3f3f3f3fu;
    } else {
        sc = (hdr[3] & 0x0f0f0f0fu) | ((hdr[1] >> 2) & 0x30303030u);
        mn = ((hdr[3] >> 4) & 0x0f0f0f0fu) | ((hdr[2] >> 2) & 0x30303030u);
    }
    float d = qm_half(hdr[0] & 0xffffu), dmin = qm_half(hdr[0] >> 16);
    for (int k = 0; k < 4; k++) {
        mul[k] = d * (float)((sc >> (8 * k)) & 0xffu);
        addp[k] = -(dmin * (float)((mn >> (8 * k)) & 0xffu)) - 128.f * mul[k];
    }
}

/* Byte p of code (int8 q + 128) -> q as a float, exact. On the GPU one
 * byte permute and one add: 2^23 + code read as a float, minus 2^23 + 128. */
QM_FN float qm_q8_code_value(uint32_t code, int p) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(__byte_perm(code, 0x4b000000u, 0x7650u + (unsigned)p)) - 8388736.0f;
#else
    return (float)((int)(code >> (8 * p) & 0xffu) - 128);
#endif
}

/* int8 byte p of w -> float, exact. */
QM_FN float qm_q8_value(uint32_t w, int p) { return qm_q8_code_value(w ^ 0x80808080u, p); }

/* two floats with at most 8 significant bits -> bf16 pair, exact (the top halves) */
QM_FN uint32_t qm_bf16_pair_exact(float lo, float hi) {
#ifdef __CUDA_ARCH__
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632u);
#else
    return (qm_bits(lo) >> 16) | (qm_bits(hi) & 0xffff0000u);
#endif
}

/* The A fragment of Q8_0 step s: wg, wg8 the lane's two words of rows g, g + 8. */
QM_FN void qm_q8_a(const uint32_t wg[2], const uint32_t wg8[2], int s, uint32_t a[4]) {
    uint32_t u = wg[s] ^ 0x80808080u, v = wg8[s] ^ 0x80808080u;
    a[0] = qm_bf16_pair_exact(qm_q8_code_value(u, 0), qm_q8_code_value(u, 1));
    a[1] = qm_bf16_pair_exact(qm_q8_code_value(v, 0), qm_q8_code_value(v, 1));
    a[2] = qm_bf16_pair_exact(qm_q8_code_value(u, 2), qm_q8_code_value(u, 3));
    a[3] = qm_bf16_pair_exact(qm_q8_code_value(v, 2), qm_q8_code_value(v, 3));
}

/* Q8_0 B of step s: x values in order. */
QM_FN void qm_q8_b(const uint32_t X[4], int s, uint32_t b[2]) {
    b[0] = X[2 * s];
    b[1] = X[2 * s + 1];
}

/* acc += mul C + addp S for rows g (c[0], c[1]) and g + 8 (c[2], c[3]):
 * two FMAs each. */
QM_FN void qm_acc(float acc[4], const float C[4], const float S[4], float mul_g, float addp_g, float mul_g8,
                  float addp_g8) {
    acc[0] = fmaf(mul_g, C[0], fmaf(addp_g, S[0], acc[0]));
    acc[1] = fmaf(mul_g, C[1], fmaf(addp_g, S[1], acc[1]));
    acc[2] = fmaf(mul_g8, C[2], fmaf(addp_g8, S[2], acc[2]));
    acc[3] = fmaf(mul_g8, C[3], fmaf(addp_g8, S[3], acc[3]));
}

/* acc += d C (Q8_0: no offset, no min). */
QM_FN void qm_acc_scaled(float acc[4], const float C[4], float d_g, float d_g8) {
    acc[0] = fmaf(d_g, C[0], acc[0]);
    acc[1] = fmaf(d_g, C[1], acc[1]);
    acc[2] = fmaf(d_g8, C[2], acc[2]);
    acc[3] = fmaf(d_g8, C[3], acc[3]);
}

/* Byte offsets in a block of the lane's two weight words (lane c of its
 * quad): Q4_K chunk q, Q8_0 block j of a stage's row of 8 blocks; and the
 * element offset in a stage of the lane's 8 x values for sub-block / block j. */
QM_FN int qm_q4k_word_off(int q, int c) { return 16 + 32 * q + 8 * c; }
QM_FN int qm_q8_word_off(int j, int c) { return 32 * j + 8 * c; }
QM_FN int qm_x_off(int j, int c) { return 32 * j + 8 * c; }

#endif
