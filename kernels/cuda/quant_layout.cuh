/* quant_layout.cuh — the split layout of quant.cuh as compile-time numbers
 * (shared by quant_repack.cu and quant_gemv.cu; C++/CUDA only).
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
    return q == DT_Q8_0 ? 34 : q == DT_Q4_0 ? 18 : q == DT_Q4_1 ? 20 : q == DT_Q4_K ? 144 : q == DT_Q5_K ? 176 : 210;
}
/* bytes per block in the qs plane (multiple of 16) and in the sc plane */
static __host__ __device__ constexpr int quant_qs_bytes(int q) {
    return q == DT_Q8_0 ? 32 : q == DT_Q4_0 || q == DT_Q4_1 ? 16 : q == DT_Q4_K ? 144 : q == DT_Q5_K ? 176 : 208;
}
static __host__ __device__ constexpr int quant_sc_bytes(int q) {
    return q == DT_Q8_0 || q == DT_Q4_0 || q == DT_Q6_K ? 2 : q == DT_Q4_1 ? 4 : 0;
}
/* units per block and x float4 slots per unit */
static __host__ __device__ constexpr int quant_units_per_block(int q) { return q == DT_Q8_0 ? 2 : quant_block_elems(q) == 256 ? 8 : 1; }
static __host__ __device__ constexpr int quant_unit_k(int q) { return q == DT_Q8_0 ? 4 : 8; }

/* Element offset in the row of slot k of unit u (see quant.cuh for the block
 * layouts; K types: unit p of block b covers the 16-byte chunk p of qs). */
template <int Q>
static __host__ __device__ __forceinline__ int64_t quant_unit_xoff(int64_t u, int k) {
    if (Q == DT_Q8_0) return 16 * u + 4 * k;
    if (Q == DT_Q4_0 || Q == DT_Q4_1) return 32 * u + 4 * k; /* k < 4: low nibbles, else high */
    int64_t b = u / 8;
    int p = (int)(u % 8);
    if (Q == DT_Q4_K || Q == DT_Q5_K) /* qs[c*32 + h*16 + m]: low nibble -> c*64 + h*16 + m, high -> +32 */
        return 256 * b + 64 * (p / 2) + 16 * (p % 2) + 32 * (k / 4) + 4 * (k % 4);
    /* Q6_K: ql[h*64 + jl*32 + ls + m]: low nibble -> h*128 + jl*32 + ls + m, high -> + 64 */
    return 256 * b + 128 * (p / 4) + 32 * ((p / 2) % 2 + 2 * (k / 4)) + 16 * (p % 2) + 4 * (k % 4);
}

#endif
