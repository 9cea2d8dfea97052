/* quant_gemv.cu — the scalar quantized GEMV (QGEMV_SCALAR: fused
 * dequantize + matrix x few-vectors product over the split layout of
 * quant.cuh), quant.cuh's quant_gemv and quant_gemv_takes for all three GEMV
 * kernels, and the dequantize-to-bf16 kernel (the bf16 scratch of the
 * dequantizing GEMM route).
 *
 * The GEMV is a stream over the quantized weights (the floor is their bytes
 * over the memory bandwidth), so:
 *   - each lane handles one "unit" (quant_layout.cuh) per step: one 16-byte
 *     load from the qs plane plus its block's scales, R rows at once (R rows
 *     per warp share each x value loaded: 2, or 4 from T = 5); several tiles
 *     of those loads are issued before any of their arithmetic (gemv_tiles:
 *     one tile ahead was slower);
 *   - x is staged in shared memory as fp32, permuted so that slot k of lane
 *     L sits at [k][L]: every lane reads its 4 x values with one conflict-free
 *     16-byte load whatever the block layout. Rows longer than the staging
 *     buffer go in chunks of whole 32-unit tiles;
 *   - codes become floats with the 2^23 trick (a byte placed in the mantissa
 *     of 2^23 by one byte-permute, no int->float conversion); per run of
 *     codes under one scale, sum(x q) times the scale (plus the min times
 *     sum(x)) where that saves work, else each weight dequantized, w = mul *
 *     (f - sub) + add, and T fp32 FMAs;
 *   - warp-shuffle reduction, lane 0 writes the R x T outputs.
 * The dequantize kernel uses the same unit decode with correctly rounded
 * operations in dtype.c's order, so it is bit-exact with dequantize_row. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_gemv_kernels.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/quant_x8.h"

#define QG_WARPS 8
#define QG_XSMEM (96 * 1024)        /* staging bytes for x: few chunk barriers at T > 1; two blocks still fit an SM */
#define QG_SMEM_DEFAULT (48 * 1024) /* dynamic shared memory a kernel may take without opting in */
#define QG_PREFETCH 2048        /* bytes of each row's codes asked into L2 before pdl_wait (pdl.cuh) */
#define MAGIC 8388608.0f     /* 2^23: a byte b in the low mantissa bits reads as 2^23 + b */

/* The raw bytes of one unit of one row. */
typedef struct {
    uint4 q;    /* the 16-byte chunk of the qs plane */
    uint4 h;    /* K types: the block's header (Q4_K/Q5_K) or its qh chunk (Q6_K) */
    uint4 g;    /* Q5_K: the qh chunk; Q6_K: the 16 scales */
    uint32_t s; /* sc plane: d (low 16 bits), m (high, Q4_1, Q5_1) */
    uint32_t qh; /* Q5_0 / Q5_1: the fifth bits, bit j of value j */
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
    if (quant_block_elems(Q) == 32) {
        r.q = __ldcs((const uint4 *)qs + u);
        int64_t b = Q == DT_Q8_0 ? u / 2 : u;
        if (quant_q5_32(Q)) {
            const uint2 rec = quant_q5_record<Q>(sc, b);
            r.s = rec.x;
            r.qh = rec.y;
        } else {
            r.s = Q == DT_Q4_1 ? __ldg((const uint32_t *)sc + b) : (uint32_t)__ldg((const unsigned short *)sc + b);
        }
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

/* Q4_K/Q5_K 6-bit scale and min of sub-block j (base/dtype.c kquant_scale_min);
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
    if (quant_q5_32(Q)) /* word k holds values 4k .. 4k + 3 (k >= 4: 16 + 4(k - 4), the same 4k) */
#pragma unroll
        for (int k = 0; k < 8; k++) d.code[k] |= qx_fifth_bits(r.qh >> (4 * k));
    if (quant_block_elems(Q) == 32) {
        d.mul[0] = d.mul[1] = half_lo(r.s);
        d.add[0] = d.add[1] = quant_has_min(Q) ? half_hi(r.s) : 0.0f;
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
    return Q == DT_Q8_0 ? MAGIC + 128.0f : Q == DT_Q4_0 ? MAGIC + 8.0f : Q == DT_Q5_0 ? MAGIC + 16.0f
         : Q == DT_Q6_K ? MAGIC + 32.0f : MAGIC;
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

/* acc[r][t] += mul * sum(x * q) (+ add * sum(x)) per run: one FMA per
 * value and row instead of two (sum(x) is shared by the R rows). */
template <int Q, int T, int R>
static __device__ __forceinline__ void unit_fma_sums(float (*acc)[T], const UnitRaw *raw, int p, const float4 *xs,
                                                     int stride_t, int lane) {
    const int K = quant_unit_k(Q), NRUN = quant_block_elems(Q) == 256 ? 2 : 1;
    const bool ADD = quant_has_min(Q);
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

/* tiles of loads in flight per lane: 4 x R rows of units, fewer where the
 * K types' bigger units would spill registers */
static constexpr int gemv_tiles(int q, int r) { return quant_block_elems(q) == 256 ? (r == 2 ? 2 : 1) : (r == 4 ? 2 : 4); }

/* gemv_tiles tiles of loads in flight per lane before any arithmetic, and
 * sum-then-scale where it saves work (always without a min; with a min while
 * T <= 2, where the extra sums are cheaper than a dequantize FMA per value). */
template <int Q, int T, int R>
static __device__ __forceinline__ void gemv_chunk(float (*acc)[T], const GemvArgs &a, const uint8_t *const *qs,
                                                     const uint8_t *const *sc, const float4 *xs, int tile0, int nt,
                                                     int stride_t, int lane) {
    const int K = quant_unit_k(Q), upb = quant_units_per_block(Q), U = gemv_tiles(Q, R);
    const bool SUMS = !quant_has_min(Q) || T <= 2;
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

template <int Q, int T, int R>
__global__ void __launch_bounds__(QG_WARPS * 32)
kernel_quant_gemv(GemvArgs a) {
    extern __shared__ float4 xs[];
    const int K = quant_unit_k(Q);
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
        gemv_chunk<Q, T, R>(acc, a, qs, sc, xs, tile0, nt, stride_t, lane);
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

/* A block decodes 256 consecutive units (a contiguous run of the flattened
 * [n_rows][cols] output: units tile it in order) into shared memory, then
 * writes the run with coalesced 16-byte stores (a thread's own stores of its
 * unit, 8 bytes each, land 64 bytes apart across a warp: several times
 * slower). 4 bf16 of padding per 32 values keep the scattered shared-memory
 * writes to 2-way bank conflicts. */
#define DQ_UNITS 256
static __device__ __forceinline__ int dq_pad(int e) { return e + 4 * (e / 32); }

template <int Q>
__global__ void __launch_bounds__(DQ_UNITS)
kernel_quant_dequant_bf16(__nv_bfloat16 *dst, const uint8_t *qs_base, const uint8_t *sc_base, int64_t row0,
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
                if (quant_has_min(Q)) e = __fadd_rn(e, un.add[run]);
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

template <int Q, int T, int R>
static int launch_gemv(const GemvArgs &a0, cudaStream_t s, Err *err) {
    GemvArgs a = a0;
    int tile_bytes = T * quant_unit_k(Q) * 32 * 16;
    a.chunk_tiles = QG_XSMEM / tile_bytes;
    int n_tiles = (a.units + 31) / 32;
    if (a.chunk_tiles > n_tiles) a.chunk_tiles = n_tiles;
    size_t smem = (size_t)a.chunk_tiles * tile_bytes;
    if (smem > QG_SMEM_DEFAULT) /* above the default limit: opt in (cheap, and legal during graph capture) */
        CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemv<Q, T, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem), err);
    int64_t groups = (a.rows + R - 1) / R, blocks = (groups + QG_WARPS - 1) / QG_WARPS;
    CUDA_CHECK(launch_pdl(kernel_quant_gemv<Q, T, R>, (unsigned)blocks, QG_WARPS * 32, smem, s, a), err);
    return 0;
}

/* 2 rows a warp, 4 from T = 5 (x's loads from shared memory shared by more rows) */
template <int Q>
static int launch_gemv_t(const GemvArgs &a, int T, cudaStream_t s, Err *err) {
    switch (T) {
    case 1: return launch_gemv<Q, 1, 2>(a, s, err);
    case 2: return launch_gemv<Q, 2, 2>(a, s, err);
    case 3: return launch_gemv<Q, 3, 2>(a, s, err);
    case 4: return launch_gemv<Q, 4, 2>(a, s, err);
    case 5: return launch_gemv<Q, 5, 4>(a, s, err);
    case 6: return launch_gemv<Q, 6, 4>(a, s, err);
    case 7: return launch_gemv<Q, 7, 4>(a, s, err);
    case 8: return launch_gemv<Q, 8, 4>(a, s, err);
    default: return err_set(err, "quant_gemv: %d rows of x (1..%d)", T, QUANT_GEMV_MAX_T);
    }
}

static int quant_gemv_scalar(const QuantMatrix *W, const void *x, bool x_f32, const GemvOut *out, int T,
                             cudaStream_t s, Err *err) {
    GemvArgs a = {(const uint8_t *)W->qs, (const uint8_t *)W->sc, x, *out, W->rows, (int)W->cols, 0, 0, x_f32};
    a.units = (int)(W->cols / quant_block_elems(W->type) * quant_units_per_block(W->type));
    switch (W->type) {
    case DT_Q8_0: return launch_gemv_t<DT_Q8_0>(a, T, s, err);
    case DT_Q4_0: return launch_gemv_t<DT_Q4_0>(a, T, s, err);
    case DT_Q4_1: return launch_gemv_t<DT_Q4_1>(a, T, s, err);
    case DT_Q5_0: return launch_gemv_t<DT_Q5_0>(a, T, s, err);
    case DT_Q5_1: return launch_gemv_t<DT_Q5_1>(a, T, s, err);
    case DT_Q4_K: return launch_gemv_t<DT_Q4_K>(a, T, s, err);
    case DT_Q5_K: return launch_gemv_t<DT_Q5_K>(a, T, s, err);
    case DT_Q6_K: return launch_gemv_t<DT_Q6_K>(a, T, s, err);
    default: return err_set(err, "quant_gemv: unsupported type");
    }
}

bool quant_gemv_takes(QuantGemvKernel k, const QuantMatrix *W, int T, bool x_f32) {
    Err e = {};
    size_t bytes;
    if (W->type == DT_F8_E4M3 || quant_matrix_bytes(W->type, W->rows, W->cols, &bytes, &e)) return false; /* fp8.cuh's */
    switch (k) {
    case QGEMV_SCALAR: return T >= 1 && T <= QUANT_GEMV_MAX_T;
    case QGEMV_MMA: return quant_gemv_mma_takes(W->type, W->cols, T, x_f32);
    case QGEMV_X8: return quant_gemv_x8_takes(W->type, W->rows, W->cols, T, x_f32);
    }
    return false;
}

int quant_gemv(const QuantMatrix *W, const void *x, bool x_f32, const GemvOut *out, int T, QuantGemvKernel k,
               cudaStream_t s, Err *err) {
    static const char *const names[3] = {"scalar", "mma", "x8"};
    size_t bytes;
    if (quant_matrix_bytes(W->type, W->rows, W->cols, &bytes, err)) return -1;
    if ((uintptr_t)x % 16 || (uintptr_t)W->qs % 16)
        return err_set(err, "quant_gemv: x and the weights must be 16-byte aligned");
    if (out->end[0] > out->end[1] || out->end[1] > out->end[2] || out->end[2] != W->rows)
        return err_set(err, "quant_gemv: output parts end at %lld, %lld, %lld for %lld rows", (long long)out->end[0],
                       (long long)out->end[1], (long long)out->end[2], (long long)W->rows);
    if ((unsigned)k > QGEMV_X8) return err_set(err, "quant_gemv: kernel %d", (int)k);
    if (!quant_gemv_takes(k, W, T, x_f32))
        return err_set(err, "quant_gemv: the %s kernel does not take %s [%lld][%lld] at %d rows of %s x", names[k],
                       dtype_info(W->type)->name, (long long)W->rows, (long long)W->cols, T, x_f32 ? "fp32" : "bf16");
    if (k == QGEMV_X8) return quant_gemv_x8(W, x, NULL, out, T, s, err);
    if (k == QGEMV_MMA) return quant_gemv_mma(W, x, out, T, s, err);
    return quant_gemv_scalar(W, x, x_f32, out, T, s, err);
}

template <int Q>
static int launch_dequant(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err) {
    int units = (int)(W->cols / quant_block_elems(Q) * quant_units_per_block(Q));
    int64_t n = n_rows * units;
    kernel_quant_dequant_bf16<Q><<<(unsigned)((n + DQ_UNITS - 1) / DQ_UNITS), DQ_UNITS, 0, s>>>(
        (__nv_bfloat16 *)dst, (const uint8_t *)W->qs, (const uint8_t *)W->sc, row0, n_rows, (int)W->cols, units);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

int quant_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err) {
    size_t bytes;
    if (quant_matrix_bytes(W->type, W->rows, W->cols, &bytes, err)) return -1;
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > W->rows)
        return err_set(err, "quant_dequant_bf16: rows [%lld, %lld) outside the matrix's %lld", (long long)row0,
                       (long long)(row0 + n_rows), (long long)W->rows);
    if ((uintptr_t)dst % 16) return err_set(err, "quant_dequant_bf16: dst must be 16-byte aligned");
    if (n_rows == 0) return 0;
    switch (W->type) {
    case DT_F8_E4M3: return fp8_dequant_bf16(W, row0, n_rows, dst, s, err);
    case DT_Q8_0: return launch_dequant<DT_Q8_0>(W, row0, n_rows, dst, s, err);
    case DT_Q4_0: return launch_dequant<DT_Q4_0>(W, row0, n_rows, dst, s, err);
    case DT_Q4_1: return launch_dequant<DT_Q4_1>(W, row0, n_rows, dst, s, err);
    case DT_Q5_0: return launch_dequant<DT_Q5_0>(W, row0, n_rows, dst, s, err);
    case DT_Q5_1: return launch_dequant<DT_Q5_1>(W, row0, n_rows, dst, s, err);
    case DT_Q4_K: return launch_dequant<DT_Q4_K>(W, row0, n_rows, dst, s, err);
    case DT_Q5_K: return launch_dequant<DT_Q5_K>(W, row0, n_rows, dst, s, err);
    case DT_Q6_K: return launch_dequant<DT_Q6_K>(W, row0, n_rows, dst, s, err);
    default: return err_set(err, "quant_dequant_bf16: unsupported type");
    }
}
