/* quant_layout.cuh — the split layout of quant.cuh as compile-time numbers,
 * and the reader of Q5_0 / Q5_1 scale records (shared by quant_repack.cu
 * and the kernels; C++/CUDA only).
 *
 * A "unit" is the work of one lane: one 16-byte load of the qs plane (16 or
 * 32 values) plus the block's scales. UNIT_K(q) float4 slots of x go with a
 * unit: slot k holds the values whose 4 codes sit in one 32-bit word of the
 * decoded unit, and quant_unit_xoff gives where slot k's 4 values start in the
 * row. */
#ifndef CLLM_QUANT_LAYOUT_CUH
#define CLLM_QUANT_LAYOUT_CUH

#include <stdint.h>

#include "base/dtype.h"

static __host__ __device__ constexpr int quant_block_elems(int q) { return q == DT_Q4_K || q == DT_Q5_K || q == DT_Q6_K ? 256 : 32; }
static __host__ __device__ constexpr int quant_native_bytes(int q) {
    return q == DT_Q8_0 ? 34 : q == DT_Q4_0 ? 18 : q == DT_Q4_1 ? 20 : q == DT_Q5_0 ? 22 : q == DT_Q5_1 ? 24
         : q == DT_Q4_K ? 144 : q == DT_Q5_K ? 176 : 210;
}
/* the 32-value types whose codes are nibbles (Q5_0 / Q5_1: plus a fifth bit a value in qh) */
static __host__ __device__ constexpr bool quant_nibbles32(int q) {
    return q == DT_Q4_0 || q == DT_Q4_1 || q == DT_Q5_0 || q == DT_Q5_1;
}
/* Q5_0 / Q5_1: the fifth bits in the sc plane's record (quant_q5_record) */
static __host__ __device__ constexpr bool quant_q5_32(int q) { return q == DT_Q5_0 || q == DT_Q5_1; }
/* value = d q + min (Q4_1, Q5_1: the block's m; Q4_K, Q5_K: minus the sub-block's dmin m) */
static __host__ __device__ constexpr bool quant_has_min(int q) {
    return q == DT_Q4_1 || q == DT_Q5_1 || q == DT_Q4_K || q == DT_Q5_K;
}
/* bytes per block in the qs plane (multiple of 16) and in the sc plane */
static __host__ __device__ constexpr int quant_qs_bytes(int q) {
    return q == DT_Q8_0 ? 32 : quant_nibbles32(q) ? 16 : q == DT_Q4_K ? 144 : q == DT_Q5_K ? 176 : 208;
}
static __host__ __device__ constexpr int quant_sc_bytes(int q) {
    return q == DT_Q8_0 || q == DT_Q4_0 || q == DT_Q6_K ? 2 : q == DT_Q4_1 ? 4 : q == DT_Q5_0 ? 6 : q == DT_Q5_1 ? 8 : 0;
}
/* units per block and x float4 slots per unit */
static __host__ __device__ constexpr int quant_units_per_block(int q) { return q == DT_Q8_0 ? 2 : quant_block_elems(q) == 256 ? 8 : 1; }
static __host__ __device__ constexpr int quant_unit_k(int q) { return q == DT_Q8_0 ? 4 : 8; }

/* Element offset in the row of slot k of unit u (see quant.cuh for the block
 * layouts; K types: unit p of block b covers the 16-byte chunk p of qs). */
template <int Q>
static __host__ __device__ __forceinline__ int64_t quant_unit_xoff(int64_t u, int k) {
    if (Q == DT_Q8_0) return 16 * u + 4 * k;
    if (quant_nibbles32(Q)) return 32 * u + 4 * k; /* k < 4: low nibbles, else high */
    int64_t b = u / 8;
    int p = (int)(u % 8);
    if (Q == DT_Q4_K || Q == DT_Q5_K) /* qs[c*32 + h*16 + m]: low nibble -> c*64 + h*16 + m, high -> +32 */
        return 256 * b + 64 * (p / 2) + 16 * (p % 2) + 32 * (k / 4) + 4 * (k % 4);
    /* Q6_K: ql[h*64 + jl*32 + ls + m]: low nibble -> h*128 + jl*32 + ls + m, high -> + 64 */
    return 256 * b + 128 * (p / 4) + 32 * ((p / 2) % 2 + 2 * (k / 4)) + 16 * (p % 2) + 4 * (k % 4);
}

/* Q5_0 / Q5_1: block b's record in the sc plane of a row (sc: the row's
 * start), as {d (low 16 bits) | m (high 16 bits, Q5_1), qh}. Q5_1's records
 * are 8 bytes {d, m, qh}: one aligned 8-byte load. Q5_0's are the GGUF
 * block's 6 bytes {d, qh}, unpadded (quant.cuh): a record starts 0 or 2
 * bytes past a 4-byte boundary, so it is read as the two aligned words that
 * hold it (a warp's loads still cover its records' bytes contiguously) and
 * shifted into place; the plane is sized to a multiple of 4 bytes, so the
 * second word of the last record stays inside it. */
template <int Q>
static __device__ __forceinline__ uint2 quant_q5_record(const uint8_t *sc, int64_t b) {
    if (Q == DT_Q5_1) return __ldg((const uint2 *)sc + b);
    const uintptr_t p = (uintptr_t)(sc + 6 * b);
    const uint32_t *w = (const uint32_t *)(p & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(p & 2) * 8, w0 = __ldg(w), w1 = __ldg(w + 1); /* sh: 0 or 16 */
    return make_uint2((w0 >> sh) & 0xffffu, __funnelshift_rc(w0, w1, sh + 16));
}

#endif
