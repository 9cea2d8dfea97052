/* quant_gemv_x8.cu — the dp4a quantized GEMV (QGEMV_X8 of quant.cuh, and
 * quant_gemv_x8 / quant_gemv_x8_glu with the norm or the gated activation
 * fused): each block rounds x
 * to two int8 terms per 32 values into shared memory, then a warp per weight
 * row sums integer dot products (dp4a) of the codes with those terms; the
 * lane arithmetic is kernels/quant_x8.h (replayed on the CPU by
 * tests/test_quant_x8.c). The weights are the split layout of quant.cuh
 * (Q4_K and Q5_K blocks whole, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q6_K codes
 * and scales in two planes).
 *
 * One block of QX_THREADS per SM (a persistent grid): the rounding is
 * repeated per block, so few big blocks keep it cheap (~0.4 us for 14336
 * values), and it runs while the first weight loads, issued before
 * pdl_wait, are in flight. Rounding in a kernel of its own cost 1-3 us per
 * GEMV (its launch and completion on the critical path).
 * Each warp walks its rows' steps with the next step's loads in flight; the
 * weights bypass L1 (read once). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ld_stream.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_gemv_kernels.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/quant_x8.h"

#define QX_THREADS 1024 /* one block per SM: 64 registers a thread fill the register file */
#define QX_WARPS (QX_THREADS / 32)
#define QX_MAX_COLS 65536 /* x rounded in shared memory: 2.25 bytes a value */
#define QX_MAX_ROWS (1 << 24)

/* x rounded, in shared memory: q1, q2 [cols padded to a tile] int8 in the
 * tiled order of K pieces per lane (qx_x_offset); dxs, sx [cols / 32] */
typedef struct {
    int8_t *q1, *q2;
    float *dxs, *sx;
} QxPlanes;

typedef struct {
    const uint8_t *qs;          /* the qs plane */
    const unsigned short *sc;   /* Q8_0: the scales */
    int64_t rows;               /* rows of y (GLU: F, half the matrix's) */
    int nblk;                   /* blocks per row */
} QxWeights;

/* GLU mode: W is Wgate | Wup (2F rows); out[r] = act(gate_r + bg[r], up_r + bu[r]) */
typedef struct {
    __nv_bfloat16 *out;
    const float *bg, *bu;
    Activation act;
    float limit;
} QxGlu;

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __host__ __device__ int64_t qx_padded(int64_t cols) {
    return (cols + QX_TILE_VALUES - 1) / QX_TILE_VALUES * QX_TILE_VALUES;
}
static __host__ __device__ size_t qx_smem_bytes(int64_t cols) {
    return 2 * (size_t)qx_padded(cols) + 2 * (size_t)(cols / QX_GROUP) * 4;
}

static __device__ QxPlanes qx_planes(char *smem, int64_t cols) {
    const int64_t pad = qx_padded(cols);
    float *f = (float *)(smem + 2 * pad);
    QxPlanes p = {(int8_t *)smem, (int8_t *)smem + pad, f, f + cols / QX_GROUP};
    return p;
}

/* 1 / rms of x [cols] fp32 (every thread gets it; red: 32 floats of shared
 * memory). Thread i sums groups of 4 i, i + 1024, ... and the warps' sums
 * meet by xor-shuffle trees, as in add_rmsnorm's vector kernel (1024
 * threads: its widest block; at narrower rows its missing warps are zeros
 * here), with its arithmetic (norm_fold.cuh), so the bits match it. */
static __device__ float qx_norm_inv(const float *x, int64_t cols, float eps, float *red) {
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) ss = __fadd_rn(ss, rms_sumsq4(((const float4 *)x)[i]));
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = warp_sum(threadIdx.x % 32 < blockDim.x / 32 ? red[threadIdx.x % 32] : 0.f);
    return rms_inv(ss, (int)cols, eps);
}

/* x's values 8 c8 .. 8 c8 + 7 as bf16 words: read from xg, or (n.x) the
 * residual row normalized as add_rmsnorm's out would be, x inv (w + offset)
 * rounded to bf16. */
static __device__ __forceinline__ uint4 qx_x8(const __nv_bfloat16 *xg, const QxNorm &n, float inv, int64_t c8) {
    if (!n.x) return *(const uint4 *)(xg + 8 * c8);
    const float4 a = ((const float4 *)n.x)[2 * c8], b = ((const float4 *)n.x)[2 * c8 + 1];
    const float4 ga = __ldg((const float4 *)n.w + 2 * c8), gb = __ldg((const float4 *)n.w + 2 * c8 + 1);
    const float4 na = rms_norm4(a, inv, ga, n.offset), nb = rms_norm4(b, inv, gb, n.offset);
    const float v[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *(const uint32_t *)&h;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* x rounded to two int8 terms (qx_split) by a warp, 8 values a lane: the
 * lanes 4g .. 4g + 3 hold one group of 32 and agree on its max by two
 * shuffles. w: the lane's 8 bf16 values (4 words, in order); q1, q2: their
 * terms; *dx: the group's scale; returns the group's sum of 128 q1 + q2.
 * Every lane of the warp must call it (lanes out of range pass zeros). */
static __device__ __forceinline__ int x8_round_lane8(const uint32_t w[4], int q1[8], int q2[8], float *dx) {
    float v[8], amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float inv = qx_inv(amax);
    *dx = qx_scale(amax);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) qx_split(v[i], inv, *dx, &q1[i], &q2[i]), s += 128 * q1[i] + q2[i];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return s;
}

/* The block rounds x [cols] bf16 into p: a thread takes 8 values (a 16-byte
 * load), the 4 threads of a group of 32 agree on its max by two shuffles.
 * The loop's condition is the same for a whole warp (the shuffles need every
 * lane); a group's 4 lanes are all in range or all out. */
static __device__ void qx_round_block(const __nv_bfloat16 *x, const QxNorm &n, float inv, int64_t cols, int t,
                                      const QxPlanes &p) {
    const int lane = threadIdx.x & 31;
    const int64_t n8 = cols / 8;
    for (int64_t c8 = threadIdx.x; c8 - lane < n8; c8 += blockDim.x) {
        const bool in = c8 < n8;
        const uint4 raw = in ? qx_x8(x, n, inv, c8) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        int a[8], b[8];
        float dx;
        const int s = x8_round_lane8(w, a, b, &dx);
        if (!in) continue;
        const int64_t o = qx_x_offset(t, 8 * c8);
        *(uint2 *)(p.q1 + o) = make_uint2(qx_pack(a[0], a[1], a[2], a[3]), qx_pack(a[4], a[5], a[6], a[7]));
        *(uint2 *)(p.q2 + o) = make_uint2(qx_pack(b[0], b[1], b[2], b[3]), qx_pack(b[4], b[5], b[6], b[7]));
        if ((c8 & 3) == 0) {
            const float d = dx * 0.0078125f;
            p.dxs[c8 / 4] = d, p.sx[c8 / 4] = (float)s * d;
        }
    }
}

/* The rows of a warp: w, w + warps, ... (whole rows, so no partial sums
 * cross warps); its work is those rows' steps in order, and the loads of
 * the next step (maybe the next row's first) are issued before the current
 * one is computed. */
typedef struct {
    int row, step;
} QxItem;

static __device__ __forceinline__ QxItem qx_next(QxItem it, int steps, int warps) {
    if (++it.step == steps) it.step = 0, it.row += warps;
    return it;
}

/* The lane's 4 pieces of x (64 values, 4 words a piece) of a step's tile,
 * for the types of 4 pieces a lane (Q4_K, Q6_K). */
static __device__ __forceinline__ void qx_x_pieces4(const QxPlanes &x, int step, int lane, uint32_t x1[16],
                                                    uint32_t x2[16]) {
    const int64_t tile = (int64_t)step * QX_TILE_VALUES;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint4 a = *(const uint4 *)(x.q1 + tile + 16 * (32 * k + lane));
        const uint4 c = *(const uint4 *)(x.q2 + tile + 16 * (32 * k + lane));
        x1[4 * k] = a.x, x1[4 * k + 1] = a.y, x1[4 * k + 2] = a.z, x1[4 * k + 3] = a.w;
        x2[4 * k] = c.x, x2[4 * k + 1] = c.y, x2[4 * k + 2] = c.z, x2[4 * k + 3] = c.w;
    }
}

/* x for a Q4_K / Q5_K lane: chunk j of block b's 64 values, groups 2j, 2j + 1 */
typedef struct {
    uint32_t x1[16], x2[16];
    float dxs[2], sx[2];
} QxChunkX;

static __device__ __forceinline__ void qx_chunk_x(QxChunkX &c, const QxPlanes &x, int step, int lane, int b, int j) {
    qx_x_pieces4(x, step, lane, c.x1, c.x2);
    const float2 d2 = *(const float2 *)(x.dxs + 8 * b + 2 * j), s2 = *(const float2 *)(x.sx + 8 * b + 2 * j);
    c.dxs[0] = d2.x, c.dxs[1] = d2.y, c.sx[0] = s2.x, c.sx[1] = s2.y;
}

typedef struct {
    uint4 h, a, b;
} Q4kLoad;

static __device__ __forceinline__ int qx_steps(const Q4kLoad &, int nblk) { return (nblk + 7) / 8; }
static __device__ __forceinline__ int qx_type(const Q4kLoad &) { return DT_Q4_K; }

static __device__ __forceinline__ void qx_load(Q4kLoad &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 8 * it.step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return;
    const uint8_t *p = W.qs + ((int64_t)it.row * W.nblk + b) * 144;
    L.h = ld_stream(p);
    L.a = ld_stream(p + 16 + 32 * j);
    L.b = ld_stream(p + 32 + 32 * j);
}

static __device__ __forceinline__ float qx_compute(const Q4kLoad &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 8 * step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return 0.f;
    QxChunkX cx;
    qx_chunk_x(cx, x, step, lane, b, j);
    const uint32_t q[8] = {L.a.x, L.a.y, L.a.z, L.a.w, L.b.x, L.b.y, L.b.z, L.b.w};
    const uint32_t hdr[4] = {L.h.x, L.h.y, L.h.z, L.h.w};
    return qx_q4k_chunk(q, hdr, j, cx.x1, cx.x2, cx.dxs, cx.sx);
}

/* Q5_K: as Q4_K (a step is 8 blocks, lane = 4 block + chunk j), and each
 * lane reads its block's 32 qh bytes too (the block's 4 lanes, one line). */
typedef struct {
    uint4 h, a, b, ha, hb;
} Q5kLoad;

static __device__ __forceinline__ int qx_steps(const Q5kLoad &, int nblk) { return (nblk + 7) / 8; }
static __device__ __forceinline__ int qx_type(const Q5kLoad &) { return DT_Q5_K; }

static __device__ __forceinline__ void qx_load(Q5kLoad &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 8 * it.step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return;
    const uint8_t *p = W.qs + ((int64_t)it.row * W.nblk + b) * 176;
    L.h = ld_stream(p);
    L.ha = ld_stream(p + 16);
    L.hb = ld_stream(p + 32);
    L.a = ld_stream(p + 48 + 32 * j);
    L.b = ld_stream(p + 64 + 32 * j);
}

static __device__ __forceinline__ float qx_compute(const Q5kLoad &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 8 * step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return 0.f;
    QxChunkX cx;
    qx_chunk_x(cx, x, step, lane, b, j);
    const uint32_t q[8] = {L.a.x, L.a.y, L.a.z, L.a.w, L.b.x, L.b.y, L.b.z, L.b.w};
    const uint32_t hb[8] = {L.ha.x, L.ha.y, L.ha.z, L.ha.w, L.hb.x, L.hb.y, L.hb.z, L.hb.w};
    const uint32_t hdr[4] = {L.h.x, L.h.y, L.h.z, L.h.w};
    return qx_q5k_chunk(q, hb, hdr, j, cx.x1, cx.x2, cx.dxs, cx.sx);
}

/* Q6_K: a step is 8 blocks (one x tile); lane = 4 (block of the step) +
 * quarter j = 2h + c (qx_q6k_quarter): 48 bytes of codes, the half's 8
 * scales, d from the scale plane. */
typedef struct {
    uint4 a, b, h;
    uint2 s;
    unsigned short d;
} Q6kLoad;

static __device__ __forceinline__ int qx_steps(const Q6kLoad &, int nblk) { return (nblk + 7) / 8; }
static __device__ __forceinline__ int qx_type(const Q6kLoad &) { return DT_Q6_K; }

static __device__ __forceinline__ void qx_load(Q6kLoad &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 8 * it.step + (lane >> 2), h = (lane >> 1) & 1, c = lane & 1;
    if (b >= W.nblk) return;
    const int64_t blk = (int64_t)it.row * W.nblk + b;
    const uint8_t *p = W.qs + blk * 208;
    L.a = ld_stream(p + 64 * h + 16 * c);
    L.b = ld_stream(p + 64 * h + 32 + 16 * c);
    L.h = ld_stream(p + 128 + 32 * h + 16 * c);
    L.s = __ldg((const uint2 *)(p + 192 + 8 * h));
    L.d = __ldg(W.sc + blk);
}

static __device__ __forceinline__ float qx_compute(const Q6kLoad &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 8 * step + (lane >> 2), h = (lane >> 1) & 1;
    if (b >= W.nblk) return 0.f;
    uint32_t x1[16], x2[16];
    qx_x_pieces4(x, step, lane, x1, x2);
    const float4 d4 = *(const float4 *)(x.dxs + 8 * b + 4 * h);
    const float dxs[4] = {d4.x, d4.y, d4.z, d4.w};
    const uint32_t a[4] = {L.a.x, L.a.y, L.a.z, L.a.w}, bq[4] = {L.b.x, L.b.y, L.b.z, L.b.w};
    const uint32_t hb[4] = {L.h.x, L.h.y, L.h.z, L.h.w}, sc8[2] = {L.s.x, L.s.y};
    return qx_q6k_quarter(a, bq, hb, sc8, lane & 1, qm_half(L.d), x1, x2, dxs);
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 (Q): as Q8_0, a lane a block: 16 code bytes
 * and the scale plane's d (and m; Q5: and qh). */
template <int Q> struct Q4Load {
    uint4 a;
    uint32_t s, qh;
};

template <int Q> static __device__ __forceinline__ int qx_steps(const Q4Load<Q> &, int nblk) { return (nblk + 31) / 32; }
template <int Q> static __device__ __forceinline__ int qx_type(const Q4Load<Q> &) { return Q; }

template <int Q>
static __device__ __forceinline__ void qx_load(Q4Load<Q> &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 32 * it.step + lane;
    if (b >= W.nblk) return;
    const int64_t blk = (int64_t)it.row * W.nblk + b;
    L.a = ld_stream(W.qs + blk * 16);
    if (quant_q5_32(Q)) {
        const uint2 rec = quant_q5_record<Q>((const uint8_t *)W.sc, blk);
        L.s = rec.x, L.qh = rec.y;
    } else {
        L.s = Q == DT_Q4_1 ? __ldg((const uint32_t *)W.sc + blk) : (uint32_t)__ldg(W.sc + blk);
    }
}

template <int Q>
static __device__ __forceinline__ float qx_compute(const Q4Load<Q> &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 32 * step + lane;
    if (b >= W.nblk) return 0.f;
    const int64_t tile = (int64_t)step * 512 * qx_pieces(Q);
    const uint4 a0 = *(const uint4 *)(x.q1 + tile + 16 * lane), a1 = *(const uint4 *)(x.q1 + tile + 16 * (32 + lane));
    const uint4 c0 = *(const uint4 *)(x.q2 + tile + 16 * lane), c1 = *(const uint4 *)(x.q2 + tile + 16 * (32 + lane));
    const uint32_t x1[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t x2[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const uint32_t q[4] = {L.a.x, L.a.y, L.a.z, L.a.w};
    const float d = qm_half(L.s & 0xffffu);
    const float m = quant_has_min(Q) ? qm_half(L.s >> 16) : (Q == DT_Q5_0 ? -16.f : -8.f) * d;
    return qx_q4_block(q, quant_q5_32(Q) ? L.qh : 0u, d, m, x1, x2, x.dxs[b], x.sx[b]);
}

/* Q8_0: a step is 32 blocks (one x tile); lane = block of the step. */
typedef struct {
    uint4 a, b;
    unsigned short d;
} Q8Load;

static __device__ __forceinline__ int qx_steps(const Q8Load &, int nblk) { return (nblk + 31) / 32; }
static __device__ __forceinline__ int qx_type(const Q8Load &) { return DT_Q8_0; }

static __device__ __forceinline__ void qx_load(Q8Load &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 32 * it.step + lane;
    if (b >= W.nblk) return;
    const uint8_t *p = W.qs + ((int64_t)it.row * W.nblk + b) * 32;
    L.a = ld_stream(p);
    L.b = ld_stream(p + 16);
    L.d = __ldg(W.sc + (int64_t)it.row * W.nblk + b);
}

static __device__ __forceinline__ float qx_compute(const Q8Load &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 32 * step + lane;
    if (b >= W.nblk) return 0.f;
    const int64_t tile = (int64_t)step * 512 * qx_pieces(DT_Q8_0); /* 32 lanes x K pieces of 16 */
    const uint4 a0 = *(const uint4 *)(x.q1 + tile + 16 * lane), a1 = *(const uint4 *)(x.q1 + tile + 16 * (32 + lane));
    const uint4 c0 = *(const uint4 *)(x.q2 + tile + 16 * lane), c1 = *(const uint4 *)(x.q2 + tile + 16 * (32 + lane));
    const uint32_t x1[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t x2[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const uint32_t q[8] = {L.a.x, L.a.y, L.a.z, L.a.w, L.b.x, L.b.y, L.b.z, L.b.w};
    return qx_q8_block(q, qm_half(L.d), x1, x2, x.dxs[b]);
}


/* A warp walks its rows' steps in order (Load: the type's registers of a
 * step); the next step's loads are issued before the current one is
 * computed, the first before pdl_wait (the weights are constant).
 * GLU: warps go in pairs (even: gate rows, odd: the up rows F below), a
 * pair taking the rows a warp would, so the work spreads as evenly as
 * without the fusion (whole gate+up rows per warp were 8 rows' time where
 * the plain GEMV took 7: measured 2.4% slower per 8B decode step); each
 * warp keeps its sums in shared memory (sums_per_warp of them) and after a
 * barrier the gate warp stores act(gate, up). */
template <typename Load, bool GLU>
__global__ void __launch_bounds__(QX_THREADS) kernel_gemv_x8(QxWeights W, const __nv_bfloat16 *xg, QxNorm nrm,
                                                            int64_t cols, GemvOut out, QxGlu glu, int sums_per_warp) {
    extern __shared__ __align__(16) char qx_smem[];
    __shared__ float red[QX_WARPS];
    const int lane = threadIdx.x & 31, wib = threadIdx.x / 32;
    const int warps = gridDim.x * QX_WARPS, w = blockIdx.x * QX_WARPS + wib, rows = (int)W.rows;
    const int stride = GLU ? warps / 2 : warps, first = GLU ? w / 2 : w, off = GLU && (w & 1) ? rows : 0;
    Load cur, nxt;
    const int S = qx_steps(cur, W.nblk);
    const int n_rows = first < rows ? (rows - first + stride - 1) / stride : 0, n_items = n_rows * S;
    QxItem it = {first, 0};
    if (n_items > 0) qx_load(cur, W, QxItem{first + off, 0}, lane);
    pdl_wait();
    const QxPlanes x = qx_planes(qx_smem, cols);
    const float inv = nrm.x ? qx_norm_inv(nrm.x, cols, nrm.eps, red) : 0.f;
    qx_round_block(xg, nrm, inv, cols, qx_type(cur), x);
    __syncthreads();
    pdl_launch_dependents();
    float acc = 0.f;
    for (int i = 0; i < n_items; i++) {
        const QxItem nx = qx_next(it, S, stride);
        if (i + 1 < n_items) qx_load(nxt, W, QxItem{nx.row + off, nx.step}, lane);
        acc += qx_compute(cur, x, W, it.step, lane);
        if (it.step == S - 1) {
            acc = warp_sum(acc);
            if (lane == 0 && GLU) ((float *)(qx_smem + qx_smem_bytes(cols)))[wib * sums_per_warp + i / S] = acc;
            else if (lane == 0) gemv_out_store(out, 0, it.row, acc);
            acc = 0.f;
        }
        cur = nxt;
        it = nx;
    }
    if (!GLU) return;
    __syncthreads();
    if (w & 1) return;
    const float *sums = (const float *)(qx_smem + qx_smem_bytes(cols)) + wib * sums_per_warp;
    for (int k = lane; k < n_rows; k += 32) {
        const int r = first + k * stride;
        const float g = sums[k] + (glu.bg ? glu.bg[r] : 0.f), u = sums[sums_per_warp + k] + (glu.bu ? glu.bu[r] : 0.f);
        glu.out[r] = __float2bfloat16_rn(act_glu(g, u, glu.act, glu.limit));
    }
}

/* One block per SM (fewer if the rows are fewer): warps then take several
 * rows each, pipelined across them. A block of 1024 threads at 64 registers
 * fills an SM, so no occupancy query is needed (a launch that did not fit
 * would fail, not run short). GLU: twice the warps for the rows, and room
 * for each warp's sums after x. */
template <typename Load, bool GLU>
static int qx_launch(const QxWeights &W, const void *x, const QxNorm &n, int64_t cols, const GemvOut &out,
                     const QxGlu &glu, cudaStream_t s, Err *err) {
    int dev = 0, sms = 0;
    auto kernel = kernel_gemv_x8<Load, GLU>;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    const int64_t want = ((GLU ? 2 : 1) * W.rows + QX_WARPS - 1) / QX_WARPS; /* blocks for a warp per row */
    const int64_t blocks = want < sms ? want : sms;
    const int64_t pairs = blocks * QX_WARPS / 2;
    const int sums_per_warp = GLU ? (int)((W.rows + pairs - 1) / pairs) : 0;
    const size_t smem = qx_smem_bytes(cols) + (size_t)QX_WARPS * sums_per_warp * sizeof(float);
    if (smem > 200 * 1024)
        return err_set(err, "quant_gemv_x8: %lld columns, %lld rows: too big a block", (long long)cols, (long long)W.rows);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    CUDA_CHECK(launch_pdl(kernel, dim3((unsigned)blocks), dim3(QX_THREADS), smem, s, W, (const __nv_bfloat16 *)x, n,
                          cols, out, glu, sums_per_warp), err);
    return 0;
}

static bool qx_type_cols(DType t, int64_t cols) {
    return cols <= QX_MAX_COLS && qx_pieces(t) > 0 && cols % quant_block_elems(t) == 0;
}

bool quant_gemv_x8_takes(DType t, int64_t rows, int64_t cols, int T, bool x_f32) {
    return qx_type_cols(t, cols) && rows <= QX_MAX_ROWS && T == 1 && !x_f32;
}

static int qx_check(const QuantMatrix *W, const void *x, const QxNorm *n, int T, Err *err) {
    if (!qx_type_cols(W->type, W->cols))
        return err_set(err, "quant_gemv_x8: %s with %lld columns (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_0 up to "
                            "%d columns)",
                       dtype_info(W->type)->name, (long long)W->cols, QX_MAX_COLS);
    if (T != 1) return err_set(err, "quant_gemv_x8: %d rows of x (one row only)", T);
    if (n && (!n->x || !n->w || (uintptr_t)n->x % 16 || (uintptr_t)n->w % 16))
        return err_set(err, "quant_gemv_x8: the residual row and the norm weights must be 16-byte aligned");
    if (!n && (uintptr_t)x % 16) return err_set(err, "quant_gemv_x8: x not 16-byte aligned");
    if (W->rows > QX_MAX_ROWS) return err_set(err, "quant_gemv_x8: %lld rows (at most 2^24)", (long long)W->rows);
    return 0;
}

static QxWeights qx_weights(const QuantMatrix *W, int64_t rows) {
    QxWeights w = {(const uint8_t *)W->qs, (const unsigned short *)W->sc, rows,
                   (int)(W->cols / quant_block_elems(W->type))};
    return w;
}

static QxNorm qx_norm_of(const QxNorm *n) {
    const QxNorm none = {NULL, NULL, 0.f, 0.f};
    return n ? *n : none;
}

/* The kernel of W's type (qx_check took it). */
template <bool GLU>
static int qx_run(DType t, const QxWeights &w, const void *x, const QxNorm &n, int64_t cols, const GemvOut &out,
                  const QxGlu &glu, cudaStream_t s, Err *err) {
    switch (t) {
    case DT_Q4_K: return qx_launch<Q4kLoad, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q4_0: return qx_launch<Q4Load<DT_Q4_0>, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q4_1: return qx_launch<Q4Load<DT_Q4_1>, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q5_0: return qx_launch<Q4Load<DT_Q5_0>, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q5_1: return qx_launch<Q4Load<DT_Q5_1>, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q5_K: return qx_launch<Q5kLoad, GLU>(w, x, n, cols, out, glu, s, err);
    case DT_Q6_K: return qx_launch<Q6kLoad, GLU>(w, x, n, cols, out, glu, s, err);
    default: return qx_launch<Q8Load, GLU>(w, x, n, cols, out, glu, s, err); /* Q8_0 */
    }
}

int quant_gemv_x8(const QuantMatrix *W, const void *x, const QxNorm *n, const GemvOut *out, int T, cudaStream_t s,
                  Err *err) {
    if (qx_check(W, x, n, T, err)) return -1;
    const QxGlu none = {NULL, NULL, NULL, ACT_SILU, 0.f};
    return qx_run<false>(W->type, qx_weights(W, W->rows), x, qx_norm_of(n), W->cols, *out, none, s, err);
}

int quant_gemv_x8_glu(const QuantMatrix *W, const void *x, const QxNorm *n, void *out, const float *bg,
                      const float *bu, Activation act, float limit, cudaStream_t s, Err *err) {
    if (qx_check(W, x, n, 1, err)) return -1;
    if (W->rows % 2) return err_set(err, "quant_gemv_x8_glu: %lld rows (gate and up: an even count)", (long long)W->rows);
    const QxGlu glu = {(__nv_bfloat16 *)out, bg, bu, act, limit};
    const GemvOut none = gemv_out_one(NULL, false, NULL, 0);
    return qx_run<true>(W->type, qx_weights(W, W->rows / 2), x, qx_norm_of(n), W->cols, none, glu, s, err);
}
