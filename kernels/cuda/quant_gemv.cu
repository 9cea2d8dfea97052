/* quant_gemv.cu — fused dequantize + matrix x few-vectors product over the
 * split layout of quant.cuh, and the dequantize-to-bf16 kernel for prefill.
 *
 * The GEMV is a stream over the quantized weights (the floor is their bytes
 * over the memory bandwidth), so:
 *   - each lane handles one "unit" (quant_layout.cuh) per step: one 16-byte
 *     load from the qs plane plus its block's scales, R rows at once (R rows
 *     per warp share each x value loaded); the next step's loads are issued
 *     before the current step's arithmetic (register double buffer);
 *   - x is staged in shared memory as fp32, permuted so that slot k of lane
 *     L sits at [k][L]: every lane reads its 4 x values with one conflict-free
 *     16-byte load whatever the block layout. Rows longer than the staging
 *     buffer go in chunks of whole 32-unit tiles;
 *   - codes become floats with the 2^23 trick (a byte placed in the mantissa
 *     of 2^23 by one byte-permute, no int->float conversion), then
 *     w = mul * (f - sub) + add with the run's scale/min, then T fp32 FMAs;
 *   - warp-shuffle reduction, lane 0 writes the R x T outputs.
 * The dequantize kernel uses the same unit decode with correctly rounded
 * operations in dtype.c's order, so it is bit-exact with dequantize_row. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_layout.cuh"

#define QG_WARPS 8
#define QG_XSMEM (48 * 1024)    /* v1 staging bytes for x: the default limit, no opt-in needed */
#define QG_XSMEM_V2 (96 * 1024) /* v2: fewer chunk barriers at T > 1; two blocks still fit an SM */
#define QG_PREFETCH 2048        /* bytes of each row's codes asked into L2 before pdl_wait (pdl.cuh) */
#define MAGIC 8388608.0f     /* 2^23: a byte b in the low mantissa bits reads as 2^23 + b */

/* The raw bytes of one unit of one row. */
typedef struct {
    uint4 q;    /* the 16-byte chunk of the qs plane */
    uint4 h;    /* K types: the block's header (Q4_K/Q5_K) or its qh chunk (Q6_K) */
    uint4 g;    /* Q5_K: the qh chunk; Q6_K: the 16 scales */
    uint32_t s; /* sc plane: d (low 16 bits), m (high, Q4_1) */
} UnitRaw;

/* A unit decoded: 4 codes per 32-bit word (slot k), and per run (k / 4 for
 * the K types, one run otherwise) value = mul * (code - sub) + add. */
typedef struct {
    uint32_t code[8];
    float mul[2], add[2];
} Unit;

static __device__ __forceinline__ uint32_t word_of(uint4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

static __device__ __forceinline__ float half_lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffff))); }
static __device__ __forceinline__ float half_hi(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }

static __device__ __forceinline__ uint32_t byte_of(uint4 v, int i) { return (word_of(v, i / 4) >> (8 * (i % 4))) & 0xff; }

/* Loads unit u of the row whose planes start at qs, sc. */
template <int Q>
static __device__ __forceinline__ UnitRaw unit_load(const uint8_t *qs, const uint8_t *sc, int64_t u) {
    UnitRaw r;
    if (Q == DT_Q8_0 || Q == DT_Q4_0 || Q == DT_Q4_1) {
        r.q = __ldcs((const uint4 *)qs + u);
        int64_t b = Q == DT_Q8_0 ? u / 2 : u;
        r.s = Q == DT_Q4_1 ? __ldg((const uint32_t *)sc + b) : (uint32_t)__ldg((const unsigned short *)sc + b);
    } else {
        int64_t b = u / 8;
        int p = (int)(u % 8);
        const uint8_t *blk = qs + b * quant_qs_bytes(Q);
        if (Q == DT_Q4_K) {
            r.h = __ldg((const uint4 *)blk);
            r.q = __ldcs((const uint4 *)(blk + 16) + p);
        } else if (Q == DT_Q5_K) {
            r.h = __ldg((const uint4 *)blk);
            r.g = __ldg((const uint4 *)(blk + 16) + p % 2);
            r.q = __ldcs((const uint4 *)(blk + 48) + p);
        } else { /* Q6_K */
            r.q = __ldcs((const uint4 *)blk + p);
            r.h = __ldg((const uint4 *)(blk + 128) + 2 * (p / 4) + p % 2);
            r.g = __ldg((const uint4 *)(blk + 192));
            r.s = (uint32_t)__ldg((const unsigned short *)sc + b);
        }
    }
    return r;
}

/* Q4_K/Q5_K 6-bit scale and min of sub-block j (kernels/dtype.c k_scale_min);
 * the header's bytes 4..15 are the 12 packed scale bytes. */
static __device__ __forceinline__ void k_scale_min(uint4 hdr, int j, int *scale, int *min) {
    uint4 sc = make_uint4(hdr.y, hdr.z, hdr.w, 0);
    if (j < 4) {
        *scale = byte_of(sc, j) & 63;
        *min = byte_of(sc, j + 4) & 63;
    } else {
        *scale = (byte_of(sc, j + 4) & 0xf) | (byte_of(sc, j - 4) >> 6) << 4;
        *min = (byte_of(sc, j + 4) >> 4) | (byte_of(sc, j) >> 6) << 4;
    }
}

/* Decodes unit u (p = u % 8 for the K types). Scale products use correctly
 * rounded multiplies so the dequantize kernel matches dtype.c exactly. */
template <int Q>
static __device__ __forceinline__ Unit unit_decode(const UnitRaw &r, int p) {
    Unit d;
    const uint32_t lo = 0x0f0f0f0fu;
    uint32_t w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
    if (Q == DT_Q8_0) {
#pragma unroll
        for (int k = 0; k < 4; k++) d.code[k] = w[k] ^ 0x80808080u; /* int8 -> unsigned, code = q + 128 */
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            d.code[k] = w[k] & lo;
            d.code[k + 4] = (w[k] >> 4) & lo;
        }
    }
    if (Q == DT_Q8_0 || Q == DT_Q4_0 || Q == DT_Q4_1) {
        d.mul[0] = d.mul[1] = half_lo(r.s);
        d.add[0] = d.add[1] = Q == DT_Q4_1 ? half_hi(r.s) : 0.0f;
    } else if (Q == DT_Q4_K || Q == DT_Q5_K) {
        float dd = half_lo(r.h.x), dmin = half_hi(r.h.x);
#pragma unroll
        for (int run = 0; run < 2; run++) {
            int j = 2 * (p / 2) + run, scale, min; /* sub-block of this run */
            k_scale_min(r.h, j, &scale, &min);
            d.mul[run] = __fmul_rn(dd, (float)scale);
            d.add[run] = -__fmul_rn(dmin, (float)min);
            if (Q == DT_Q5_K) {
                uint32_t g[4] = {r.g.x, r.g.y, r.g.z, r.g.w};
#pragma unroll
                for (int k = 0; k < 4; k++) d.code[4 * run + k] |= ((g[k] >> j) & 0x01010101u) << 4;
            }
        }
    } else { /* Q6_K */
        float dd = half_lo(r.s);
        uint32_t h[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
#pragma unroll
        for (int run = 0; run < 2; run++) {
            int j = (p / 2) % 2 + 2 * run; /* 32-group of the 128-half */
#pragma unroll
            for (int k = 0; k < 4; k++) d.code[4 * run + k] |= ((h[k] >> (2 * j)) & 0x03030303u) << 4;
            int8_t sc = (int8_t)byte_of(r.g, 8 * (p / 4) + 2 * j + p % 2);
            d.mul[run] = __fmul_rn(dd, (float)sc);
            d.add[run] = 0.0f;
        }
    }
    return d;
}

/* code - sub is the signed quant value (exact in fp32) */
template <int Q>
static __device__ __forceinline__ constexpr float code_sub() {
    return Q == DT_Q8_0 ? MAGIC + 128.0f : Q == DT_Q4_0 ? MAGIC + 8.0f : Q == DT_Q6_K ? MAGIC + 32.0f : MAGIC;
}

/* 2^23 + byte i of c, as a float */
static __device__ __forceinline__ float code_float(uint32_t c, int i) {
    return __uint_as_float(__byte_perm(c, 0x4b000000u, 0x7650u + i));
}

/* ---------------- GEMV ---------------- */

typedef struct {
    const uint8_t *qs, *sc;
    const void *x;
    GemvOut out;
    int64_t rows;
    int cols;
    int units;        /* units per row */
    int chunk_tiles;  /* 32-unit tiles of x staged per pass */
    int x_f32;
} GemvArgs;

/* Stages slots of the tiles [tile0, tile0 + n_tiles) of x rows 0..T-1 into
 * xs[t][tile][k][lane] (zeros past the row's last unit). */
template <int Q, int T>
static __device__ void stage_x(float4 *xs, const GemvArgs &a, int tile0, int n_tiles) {
    const int K = quant_unit_k(Q);
    int per_t = n_tiles * K * 32;
    for (int i = threadIdx.x; i < T * per_t; i += blockDim.x) {
        int t = i / per_t, s = i % per_t, lane = s % 32, k = (s / 32) % K, tile = s / (32 * K);
        int64_t u = (int64_t)(tile0 + tile) * 32 + lane;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (u < a.units) {
            int64_t off = (int64_t)t * a.cols + quant_unit_xoff<Q>(u, k);
            if (a.x_f32) {
                v = __ldg((const float4 *)((const float *)a.x + off));
            } else {
                uint2 b = __ldg((const uint2 *)((const __nv_bfloat16 *)a.x + off));
                v = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                                __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
            }
        }
        xs[(int64_t)t * (a.chunk_tiles * K * 32) + s] = v;
    }
}

/* acc[r][t] += unit of row r . x slots of this lane */
template <int Q, int T, int R>
static __device__ __forceinline__ void unit_fma(float (*acc)[T], const UnitRaw *raw, int p, const float4 *xs,
                                                int stride_t, int lane) {
    const int K = quant_unit_k(Q);
    Unit un[R];
#pragma unroll
    for (int r = 0; r < R; r++) un[r] = unit_decode<Q>(raw[r], p);
#pragma unroll
    for (int k = 0; k < K; k++) {
        float4 xv[T];
#pragma unroll
        for (int t = 0; t < T; t++) xv[t] = xs[t * stride_t + k * 32 + lane];
        int run = K == 8 ? k / 4 : 0;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float w[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                w[i] = fmaf(un[r].mul[run], code_float(un[r].code[k], i) - code_sub<Q>(), un[r].add[run]);
#pragma unroll
            for (int t = 0; t < T; t++) {
                acc[r][t] = fmaf(w[0], xv[t].x, acc[r][t]);
                acc[r][t] = fmaf(w[1], xv[t].y, acc[r][t]);
                acc[r][t] = fmaf(w[2], xv[t].z, acc[r][t]);
                acc[r][t] = fmaf(w[3], xv[t].w, acc[r][t]);
            }
        }
    }
}

/* v2: acc[r][t] += mul * sum(x * q) (+ add * sum(x)) per run: one FMA per
 * value and row instead of two (sum(x) is shared by the R rows). */
template <int Q, int T, int R>
static __device__ __forceinline__ void unit_fma_sums(float (*acc)[T], const UnitRaw *raw, int p, const float4 *xs,
                                                     int stride_t, int lane) {
    const int K = quant_unit_k(Q), NRUN = quant_block_elems(Q) == 256 ? 2 : 1;
    const bool ADD = Q == DT_Q4_1 || Q == DT_Q4_K || Q == DT_Q5_K;
    Unit un[R];
#pragma unroll
    for (int r = 0; r < R; r++) un[r] = unit_decode<Q>(raw[r], p);
    float sq[R][T][NRUN], sx[T][NRUN];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int run = 0; run < NRUN; run++) {
            sx[t][run] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) sq[r][t][run] = 0.0f;
        }
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int run = NRUN == 2 ? k / 4 : 0;
        float4 xv[T];
#pragma unroll
        for (int t = 0; t < T; t++) {
            xv[t] = xs[t * stride_t + k * 32 + lane];
            if (ADD) sx[t][run] += (xv[t].x + xv[t].y) + (xv[t].z + xv[t].w);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float q[4];
#pragma unroll
            for (int i = 0; i < 4; i++) q[i] = code_float(un[r].code[k], i) - code_sub<Q>();
#pragma unroll
            for (int t = 0; t < T; t++) {
                sq[r][t][run] = fmaf(q[0], xv[t].x, sq[r][t][run]);
                sq[r][t][run] = fmaf(q[1], xv[t].y, sq[r][t][run]);
                sq[r][t][run] = fmaf(q[2], xv[t].z, sq[r][t][run]);
                sq[r][t][run] = fmaf(q[3], xv[t].w, sq[r][t][run]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int run = 0; run < NRUN; run++) {
                acc[r][t] = fmaf(un[r].mul[run], sq[r][t][run], acc[r][t]);
                if (ADD) acc[r][t] = fmaf(un[r].add[run], sx[t][run], acc[r][t]);
            }
}

/* v2: U tiles of loads in flight per lane before any arithmetic (v1 keeps
 * one tile ahead), and sum-then-scale where it saves work (always without a
 * min; with a min while T <= 2, where the extra sums are cheaper than a
 * dequantize FMA per value). */
template <int Q, int T, int R, int U>
static __device__ __forceinline__ void gemv_chunk_v2(float (*acc)[T], const GemvArgs &a, const uint8_t *const *qs,
                                                     const uint8_t *const *sc, const float4 *xs, int tile0, int nt,
                                                     int stride_t, int lane) {
    const int K = quant_unit_k(Q), upb = quant_units_per_block(Q);
    const bool SUMS = !(Q == DT_Q4_1 || Q == DT_Q4_K || Q == DT_Q5_K) || T <= 2;
    for (int tile = 0; tile < nt; tile += U) {
        UnitRaw raw[U][R];
#pragma unroll
        for (int v = 0; v < U; v++) {
            int64_t u = (int64_t)(tile0 + tile + v) * 32 + lane;
            if (tile + v < nt && u < a.units)
#pragma unroll
                for (int r = 0; r < R; r++) raw[v][r] = unit_load<Q>(qs[r], sc[r], u);
        }
#pragma unroll
        for (int v = 0; v < U; v++) {
            int64_t u = (int64_t)(tile0 + tile + v) * 32 + lane;
            if (tile + v >= nt || u >= a.units) break;
            const float4 *x = xs + (tile + v) * K * 32;
            if (SUMS) unit_fma_sums<Q, T, R>(acc, raw[v], (int)(u % upb), x, stride_t, lane);
            else unit_fma<Q, T, R>(acc, raw[v], (int)(u % upb), x, stride_t, lane);
        }
    }
}

template <int Q, int T, int R, int U>
__global__ void __launch_bounds__(QG_WARPS * 32)
kernel_quant_gemv(GemvArgs a) {
    extern __shared__ float4 xs[];
    const int K = quant_unit_k(Q), upb = quant_units_per_block(Q);
    int lane = threadIdx.x % 32;
    int64_t row0 = ((int64_t)blockIdx.x * QG_WARPS + threadIdx.x / 32) * R;
    int64_t nb = a.cols / quant_block_elems(Q);
    const uint8_t *qs[R], *sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) { /* rows past the end compute row rows-1 and store nothing */
        int64_t row = min(row0 + r, a.rows - 1);
        qs[r] = a.qs + row * nb * quant_qs_bytes(Q);
        sc[r] = a.sc ? a.sc + row * nb * quant_sc_bytes(Q) : NULL;
        prefetch_l2_span(qs[r], nb * quant_qs_bytes(Q), QG_PREFETCH, lane);
        if (sc[r]) prefetch_l2_span(sc[r], nb * quant_sc_bytes(Q), QG_PREFETCH / 4, lane);
    }
    pdl_enter(); /* the weights are constant: asked into L2 above, while the previous kernel ran */
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    int n_tiles = (a.units + 31) / 32, stride_t = a.chunk_tiles * K * 32;
    for (int tile0 = 0; tile0 < n_tiles; tile0 += a.chunk_tiles) {
        int nt = min(a.chunk_tiles, n_tiles - tile0);
        __syncthreads(); /* the previous chunk's readers are done */
        stage_x<Q, T>(xs, a, tile0, nt);
        __syncthreads();
        if constexpr (U > 0) {
            gemv_chunk_v2<Q, T, R, U>(acc, a, qs, sc, xs, tile0, nt, stride_t, lane);
            continue;
        }
        UnitRaw cur[R], nxt[R];
        int64_t u = (int64_t)tile0 * 32 + lane;
        if (u < a.units)
#pragma unroll
            for (int r = 0; r < R; r++) cur[r] = unit_load<Q>(qs[r], sc[r], u);
        for (int tile = 0; tile < nt; tile++, u += 32) {
            if (tile + 1 < nt && u + 32 < a.units)
#pragma unroll
                for (int r = 0; r < R; r++) nxt[r] = unit_load<Q>(qs[r], sc[r], u + 32);
            if (u < a.units) unit_fma<Q, T, R>(acc, cur, (int)(u % upb), xs + tile * K * 32, stride_t, lane);
#pragma unroll
            for (int r = 0; r < R; r++) cur[r] = nxt[r];
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t row = row0 + r;
        if (row >= a.rows) break;
#pragma unroll
        for (int t = 0; t < T; t++) gemv_out_store(a.out, t, row, acc[r][t]);
    }
}

/* ---------------- dequantize to bf16 ---------------- */

template <int Q>
__global__ void kernel_quant_dequant_bf16(__nv_bfloat16 *dst, const uint8_t *qs_base, const uint8_t *sc_base,
                                          int64_t row0, int64_t n_rows, int cols, int units) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n_rows * units) return;
    int64_t r = i / units, u = i % units, nb = cols / quant_block_elems(Q);
    const uint8_t *qs = qs_base + (row0 + r) * nb * quant_qs_bytes(Q);
    const uint8_t *sc = sc_base ? sc_base + (row0 + r) * nb * quant_sc_bytes(Q) : NULL;
    int p = (int)(u % quant_units_per_block(Q));
    Unit un = unit_decode<Q>(unit_load<Q>(qs, sc, u), p);
    const int K = quant_unit_k(Q);
#pragma unroll
    for (int k = 0; k < K; k++) {
        int run = K == 8 ? k / 4 : 0;
        __nv_bfloat16 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float q = code_float(un.code[k], j) - code_sub<Q>(); /* exact */
            float e = __fmul_rn(un.mul[run], q);
            if (Q == DT_Q4_1 || Q == DT_Q4_K || Q == DT_Q5_K) e = __fadd_rn(e, un.add[run]);
            v[j] = __float2bfloat16_rn(e);
        }
        *(uint2 *)(dst + r * cols + quant_unit_xoff<Q>(u, k)) = *(const uint2 *)v;
    }
}

/* v2: a block decodes 256 consecutive units (a contiguous run of the
 * flattened [n_rows][cols] output: units tile it in order) into shared
 * memory, then writes the run with coalesced 16-byte stores (v1's 8-byte
 * stores land 64 bytes apart across a warp). 4 bf16 of padding per 32
 * values keep the scattered shared-memory writes to 2-way bank conflicts. */
#define DQ_UNITS 256
static __device__ __forceinline__ int dq_pad(int e) { return e + 4 * (e / 32); }

template <int Q>
__global__ void __launch_bounds__(DQ_UNITS)
kernel_quant_dequant_bf16_v2(__nv_bfloat16 *dst, const uint8_t *qs_base, const uint8_t *sc_base, int64_t row0,
                             int64_t n_rows, int cols, int units) {
    const int E = quant_unit_k(Q) * 4, K = quant_unit_k(Q);
    __shared__ __align__(16) __nv_bfloat16 buf[DQ_UNITS * E + DQ_UNITS * E / 8];
    int64_t first = (int64_t)blockIdx.x * DQ_UNITS, total = n_rows * units, i = first + threadIdx.x;
    if (i < total) {
        int64_t r = i / units, u = i % units, nb = cols / quant_block_elems(Q);
        const uint8_t *qs = qs_base + (row0 + r) * nb * quant_qs_bytes(Q);
        const uint8_t *sc = sc_base ? sc_base + (row0 + r) * nb * quant_sc_bytes(Q) : NULL;
        Unit un = unit_decode<Q>(unit_load<Q>(qs, sc, u), (int)(u % quant_units_per_block(Q)));
        /* this unit's first value sits at flat element E*i: local = E*i + (xoff - E*u) - E*first */
        int local0 = (int)(E * (i - first) - E * u);
#pragma unroll
        for (int k = 0; k < K; k++) {
            int run = K == 8 ? k / 4 : 0;
            __nv_bfloat16 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float e = __fmul_rn(un.mul[run], code_float(un.code[k], j) - code_sub<Q>());
                if (Q == DT_Q4_1 || Q == DT_Q4_K || Q == DT_Q5_K) e = __fadd_rn(e, un.add[run]);
                v[j] = __float2bfloat16_rn(e);
            }
            *(uint2 *)(buf + dq_pad(local0 + (int)quant_unit_xoff<Q>(u, k))) = *(const uint2 *)v;
        }
    }
    __syncthreads();
    int64_t n_el = (total - first < DQ_UNITS ? total - first : DQ_UNITS) * E;
    __nv_bfloat16 *out = dst + first * E;
    for (int e = threadIdx.x * 8; e < n_el; e += DQ_UNITS * 8) { /* 8 values: two padded 4-runs, one 16-byte store */
        uint2 lo = *(const uint2 *)(buf + dq_pad(e)), hi = *(const uint2 *)(buf + dq_pad(e + 4));
        *(uint4 *)(out + e) = make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
}

/* ---------------- launchers ---------------- */

/* tiles of loads in flight per lane in v2: 4 x R rows of units, fewer where
 * the K types' bigger units would spill registers */
static constexpr int gemv_v2_tiles(int q, int r) {
    return quant_block_elems(q) == 256 ? (r == 1 ? 4 : r == 2 ? 2 : 1) : (r == 4 ? 2 : 4);
}

template <int Q, int T, int R, int U>
static int launch_gemv(const GemvArgs &a0, cudaStream_t s, Err *err) {
    GemvArgs a = a0;
    int tile_bytes = T * quant_unit_k(Q) * 32 * 16;
    a.chunk_tiles = (U > 0 ? QG_XSMEM_V2 : QG_XSMEM) / tile_bytes;
    int n_tiles = (a.units + 31) / 32;
    if (a.chunk_tiles > n_tiles) a.chunk_tiles = n_tiles;
    size_t smem = (size_t)a.chunk_tiles * tile_bytes;
    if (smem > QG_XSMEM) /* above the default limit: opt in (cheap, and legal during graph capture) */
        CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemv<Q, T, R, U>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem), err);
    int64_t groups = (a.rows + R - 1) / R, blocks = (groups + QG_WARPS - 1) / QG_WARPS;
    CUDA_CHECK(launch_pdl(kernel_quant_gemv<Q, T, R, U>, (unsigned)blocks, QG_WARPS * 32, smem, s, a), err);
    return 0;
}

template <int Q, int T, int R>
static int launch_gemv_v(const GemvArgs &a, int version, cudaStream_t s, Err *err) {
    if (version == 0) version = 2; /* the default (measured faster on the H200): kernels/NOTES.md "quantized GEMV" */
    if (version == 1) return launch_gemv<Q, T, R, 0>(a, s, err);
    if (version == 2) return launch_gemv<Q, T, R, gemv_v2_tiles(Q, R)>(a, s, err);
    return err_set(err, "quant_gemv: version %d (1, 2, 3 or 4)", version);
}

template <int Q, int T>
static int launch_gemv_r(const GemvArgs &a, int version, int R, cudaStream_t s, Err *err) {
    if (R == 0) R = T >= 5 ? 4 : 2; /* the default; kernels/NOTES.md "quantized GEMV" */
    switch (R) {
    case 1: return launch_gemv_v<Q, T, 1>(a, version, s, err);
    case 2: return launch_gemv_v<Q, T, 2>(a, version, s, err);
    case 4: return launch_gemv_v<Q, T, 4>(a, version, s, err);
    default: return err_set(err, "quant_gemv: rows per warp %d (1, 2 or 4)", R);
    }
}

template <int Q>
static int launch_gemv_t(const GemvArgs &a, int T, int version, int R, cudaStream_t s, Err *err) {
    switch (T) {
    case 1: return launch_gemv_r<Q, 1>(a, version, R, s, err);
    case 2: return launch_gemv_r<Q, 2>(a, version, R, s, err);
    case 3: return launch_gemv_r<Q, 3>(a, version, R, s, err);
    case 4: return launch_gemv_r<Q, 4>(a, version, R, s, err);
    case 5: return launch_gemv_r<Q, 5>(a, version, R, s, err);
    case 6: return launch_gemv_r<Q, 6>(a, version, R, s, err);
    case 7: return launch_gemv_r<Q, 7>(a, version, R, s, err);
    case 8: return launch_gemv_r<Q, 8>(a, version, R, s, err);
    default: return err_set(err, "quant_gemv: %d rows of x (1..%d)", T, QUANT_GEMV_MAX_T);
    }
}

bool quant_gemv_picks_x8(const QuantMatrix *W, int T) {
    return T == 1 && quant_gemv_x8_supported(W->type, W->cols) &&
           (W->type != DT_Q8_0 || W->rows >= 16384);
}

/* quant_gemv_variant with the output as a GemvOut (quant.cuh). */
static int quant_gemv_out_v(const QuantMatrix *W, const void *x, bool x_f32, const GemvOut *out, int T, int version,
                            int rows_per_warp, cudaStream_t s, Err *err) {
    size_t bytes;
    if (quant_matrix_bytes(W->type, W->rows, W->cols, &bytes, err)) return -1;
    if ((uintptr_t)x % 16 || (uintptr_t)W->qs % 16)
        return err_set(err, "quant_gemv: x and the weights must be 16-byte aligned");
    if (out->end[0] > out->end[1] || out->end[1] > out->end[2] || out->end[2] != W->rows)
        return err_set(err, "quant_gemv: output parts end at %lld, %lld, %lld for %lld rows", (long long)out->end[0],
                       (long long)out->end[1], (long long)out->end[2], (long long)W->rows);
    /* the default: v3 where measured faster on the H200 (kernels/NOTES.md "v3 measured"): Q4_K; Q8_0 from
     * T = 2, and at T = 1 on big matrices (from 16384 rows or 8192 columns: 3-6% there, 8-16% slower below) */
    bool big = W->rows >= 16384 || W->cols >= 8192;
    /* v5 (dp4a) at one row: Q4_K always, Q8_0 on tall matrices (measured: 1-4% faster there, 9-17% slower on
     * 4096-row ones; kernels/NOTES.md "v5") */
    if (version == 0 && !x_f32 && quant_gemv_picks_x8(W, T)) version = 5;
    if (version == 0 && quant_gemv_mma_supported(W->type, W->cols, x_f32) && (W->type == DT_Q4_K || T >= 2 || big))
        version = 3;
    if (version == 5) {
        if (x_f32) return err_set(err, "quant_gemv v5: x must be bf16");
        return quant_gemv_x8(W, x, NULL, out, T, s, err);
    }
    if (version == 3 || version == 4) { /* quant_gemv_mma checks the type, the columns and T */
        if (x_f32) return err_set(err, "quant_gemv v%d: x must be bf16", version);
        return quant_gemv_mma(W, x, out, T, version == 4, s, err);
    }
    GemvArgs a = {(const uint8_t *)W->qs, (const uint8_t *)W->sc, x, *out, W->rows, (int)W->cols, 0, 0, x_f32};
    a.units = (int)(W->cols / quant_block_elems(W->type) * quant_units_per_block(W->type));
    switch (W->type) {
    case DT_Q8_0: return launch_gemv_t<DT_Q8_0>(a, T, version, rows_per_warp, s, err);
    case DT_Q4_0: return launch_gemv_t<DT_Q4_0>(a, T, version, rows_per_warp, s, err);
    case DT_Q4_1: return launch_gemv_t<DT_Q4_1>(a, T, version, rows_per_warp, s, err);
    case DT_Q4_K: return launch_gemv_t<DT_Q4_K>(a, T, version, rows_per_warp, s, err);
    case DT_Q5_K: return launch_gemv_t<DT_Q5_K>(a, T, version, rows_per_warp, s, err);
    case DT_Q6_K: return launch_gemv_t<DT_Q6_K>(a, T, version, rows_per_warp, s, err);
    default: return err_set(err, "quant_gemv: unsupported type");
    }
}

int quant_gemv_variant(const QuantMatrix *W, const void *x, bool x_f32, void *y, bool y_f32, const float *bias,
                       int T, int version, int rows_per_warp, cudaStream_t s, Err *err) {
    GemvOut out = gemv_out_one(y, y_f32, bias, W->rows);
    return quant_gemv_out_v(W, x, x_f32, &out, T, version, rows_per_warp, s, err);
}

int quant_gemv_parts(const QuantMatrix *W, const void *x, const GemvOut *out, int T, int version, cudaStream_t s,
                     Err *err) {
    return quant_gemv_out_v(W, x, false, out, T, version, 0, s, err);
}

int quant_gemv(const QuantMatrix *W, const void *x, bool x_f32, void *y, bool y_f32, const float *bias, int T,
               cudaStream_t s, Err *err) {
    return quant_gemv_variant(W, x, x_f32, y, y_f32, bias, T, 0, 0, s, err);
}

template <int Q>
static int launch_dequant(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, int version, cudaStream_t s,
                          Err *err) {
    int units = (int)(W->cols / quant_block_elems(Q) * quant_units_per_block(Q));
    int64_t n = n_rows * units;
    if (version == 0) version = 2; /* the default (measured faster on the H200): kernels/NOTES.md "quantized GEMV" */
    if (version == 2 && (uintptr_t)dst % 16) return err_set(err, "quant_dequant_bf16 v2: dst must be 16-byte aligned");
    if (version == 1)
        kernel_quant_dequant_bf16<Q><<<(unsigned)((n + 255) / 256), 256, 0, s>>>(
            (__nv_bfloat16 *)dst, (const uint8_t *)W->qs, (const uint8_t *)W->sc, row0, n_rows, (int)W->cols, units);
    else if (version == 2)
        kernel_quant_dequant_bf16_v2<Q><<<(unsigned)((n + DQ_UNITS - 1) / DQ_UNITS), DQ_UNITS, 0, s>>>(
            (__nv_bfloat16 *)dst, (const uint8_t *)W->qs, (const uint8_t *)W->sc, row0, n_rows, (int)W->cols, units);
    else
        return err_set(err, "quant_dequant_bf16: version %d (1 or 2)", version);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

int quant_dequant_bf16_variant(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, int version,
                               cudaStream_t s, Err *err) {
    size_t bytes;
    if (quant_matrix_bytes(W->type, W->rows, W->cols, &bytes, err)) return -1;
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > W->rows)
        return err_set(err, "quant_dequant_bf16: rows [%lld, %lld) outside the matrix's %lld", (long long)row0,
                       (long long)(row0 + n_rows), (long long)W->rows);
    if ((uintptr_t)dst % 8) return err_set(err, "quant_dequant_bf16: dst must be 8-byte aligned");
    if (n_rows == 0) return 0;
    switch (W->type) {
    case DT_Q8_0: return launch_dequant<DT_Q8_0>(W, row0, n_rows, dst, version, s, err);
    case DT_Q4_0: return launch_dequant<DT_Q4_0>(W, row0, n_rows, dst, version, s, err);
    case DT_Q4_1: return launch_dequant<DT_Q4_1>(W, row0, n_rows, dst, version, s, err);
    case DT_Q4_K: return launch_dequant<DT_Q4_K>(W, row0, n_rows, dst, version, s, err);
    case DT_Q5_K: return launch_dequant<DT_Q5_K>(W, row0, n_rows, dst, version, s, err);
    case DT_Q6_K: return launch_dequant<DT_Q6_K>(W, row0, n_rows, dst, version, s, err);
    default: return err_set(err, "quant_dequant_bf16: unsupported type");
    }
}

int quant_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err) {
    return quant_dequant_bf16_variant(W, row0, n_rows, dst, 0, s, err);
}
