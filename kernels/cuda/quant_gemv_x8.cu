/* quant_gemv_x8.cu — quant_gemv version 5 (quant.cuh): x rounded to two int8
 * terms per 32 values by kernel_round_x8, then a warp per weight row sums
 * integer dot products (dp4a) of the codes with those terms; the lane
 * arithmetic is kernels/quant_x8.h (replayed on the CPU by
 * tests/test_quant_x8.c). The weights are the split layout of quant.cuh
 * (Q4_K blocks whole, Q8_0 codes and scales in two planes).
 *
 * A warp walks its row U steps at a time: all loads of the U steps are
 * issued (the first batch before pdl_wait: the weights are constant), then
 * consumed; the many resident warps (one row each) keep the bytes in flight.
 * x (a few KB, shared by every warp) is read through L1; the weights bypass
 * it (read once). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/quant_x8.h"

#define QX_WARPS 4 /* rows (warps) per block */

typedef struct {
    const int8_t *q1, *q2;
    const float *dxs, *sx;
} QxPlanes;

typedef struct {
    const uint8_t *qs;          /* the qs plane */
    const unsigned short *sc;   /* Q8_0: the scales */
    int64_t rows;
    int nblk;                   /* blocks per row */
} QxWeights;

static __host__ __device__ int64_t qx_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* plane offsets in bytes: q1 0, q2, dxs, sx; returns the total */
static size_t qx_layout(int64_t cols, int T, size_t off[4]) {
    int64_t G = cols / QX_GROUP, row = qx_round_up(cols, QX_TILE_VALUES);
    off[0] = 0;
    off[1] = (size_t)T * row;
    off[2] = 2 * (size_t)T * row;
    off[3] = off[2] + (size_t)qx_round_up((int64_t)T * G, 4) * 4;
    return off[3] + (size_t)qx_round_up((int64_t)T * G, 4) * 4;
}

size_t quant_x_bytes(int64_t cols, int T) {
    size_t off[4];
    return qx_layout(cols, T, off);
}

static QxPlanes qx_planes(const QuantX *xq) {
    size_t off[4];
    qx_layout(xq->cols, xq->T, off);
    const char *b = (const char *)xq->buf;
    QxPlanes p = {(const int8_t *)b, (const int8_t *)(b + off[1]), (const float *)(b + off[2]),
                  (const float *)(b + off[3])};
    return p;
}

static __device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp per group of 32 values of one x row (blockIdx.y); the int8
 * terms go to the tiled order of K pieces per lane (qx_x_offset). */
__global__ void kernel_round_x8(const __nv_bfloat16 *x, int64_t cols, int K, int8_t *q1, int8_t *q2, float *dxs,
                                float *sx) {
    pdl_enter();
    const int lane = threadIdx.x & 31, t = blockIdx.y;
    const int64_t G = cols / QX_GROUP, g = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= G) return;
    const int64_t i = g * QX_GROUP + lane, o = t * qx_round_up(cols, QX_TILE_VALUES) + qx_x_offset(K, i);
    const float v = __bfloat162float(x[t * cols + i]);
    float amax = fabsf(v);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, k));
    int a, b;
    qm_i8_split(v, qm_i8_inv(amax), qm_i8_scale(amax), &a, &b);
    q1[o] = (int8_t)a;
    q2[o] = (int8_t)b;
    int s = 128 * a + b;
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if (lane == 0) {
        const float d = qm_i8_scale(amax) * 0.0078125f;
        dxs[t * G + g] = d;
        sx[t * G + g] = (float)s * d;
    }
}

/* The rows of a warp: w, w + warps, ... (whole rows, so no partial sums
 * cross warps); its work is those rows' steps in order, and the loads of
 * the next step (maybe the next row's first) are issued before the current
 * one is computed. */
typedef struct {
    int64_t row;
    int step;
} QxItem;

static __device__ __forceinline__ QxItem qx_next(QxItem it, int steps, int64_t warps) {
    if (++it.step == steps) it.step = 0, it.row += warps;
    return it;
}

/* Q4_K: a step is 8 blocks (one x tile); lane = 4 (block of the step) + chunk j. */
typedef struct {
    uint4 h, a, b;
} Q4kLoad;

static __device__ __forceinline__ int qx_steps(const Q4kLoad &, int nblk) { return (nblk + 7) / 8; }

static __device__ __forceinline__ void qx_load(Q4kLoad &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 8 * it.step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return;
    const uint8_t *p = W.qs + (it.row * W.nblk + b) * 144;
    L.h = ld_stream(p);
    L.a = ld_stream(p + 16 + 32 * j);
    L.b = ld_stream(p + 32 + 32 * j);
}

static __device__ __forceinline__ float qx_compute(const Q4kLoad &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 8 * step + (lane >> 2), j = lane & 3;
    if (b >= W.nblk) return 0.f;
    uint32_t x1[16], x2[16];
    const int64_t tile = (int64_t)step * QX_TILE_VALUES;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint4 a = *(const uint4 *)(x.q1 + tile + 16 * (32 * k + lane));
        const uint4 c = *(const uint4 *)(x.q2 + tile + 16 * (32 * k + lane));
        x1[4 * k] = a.x, x1[4 * k + 1] = a.y, x1[4 * k + 2] = a.z, x1[4 * k + 3] = a.w;
        x2[4 * k] = c.x, x2[4 * k + 1] = c.y, x2[4 * k + 2] = c.z, x2[4 * k + 3] = c.w;
    }
    const float2 d2 = *(const float2 *)(x.dxs + 8 * b + 2 * j), s2 = *(const float2 *)(x.sx + 8 * b + 2 * j);
    const float dxs[2] = {d2.x, d2.y}, sx[2] = {s2.x, s2.y};
    const uint32_t q[8] = {L.a.x, L.a.y, L.a.z, L.a.w, L.b.x, L.b.y, L.b.z, L.b.w};
    const uint32_t hdr[4] = {L.h.x, L.h.y, L.h.z, L.h.w};
    return qx_q4k_chunk(q, hdr, j, x1, x2, dxs, sx);
}

/* Q8_0: a step is 32 blocks (one x tile); lane = block of the step. */
typedef struct {
    uint4 a, b;
    unsigned short d;
} Q8Load;

static __device__ __forceinline__ int qx_steps(const Q8Load &, int nblk) { return (nblk + 31) / 32; }

static __device__ __forceinline__ void qx_load(Q8Load &L, const QxWeights &W, QxItem it, int lane) {
    const int b = 32 * it.step + lane;
    if (b >= W.nblk) return;
    const uint8_t *p = W.qs + (it.row * W.nblk + b) * 32;
    L.a = ld_stream(p);
    L.b = ld_stream(p + 16);
    L.d = __ldg(W.sc + it.row * W.nblk + b);
}

static __device__ __forceinline__ float qx_compute(const Q8Load &L, const QxPlanes &x, const QxWeights &W, int step,
                                                   int lane) {
    const int b = 32 * step + lane;
    if (b >= W.nblk) return 0.f;
    const int64_t tile = (int64_t)step * 1024;
    const uint4 a0 = *(const uint4 *)(x.q1 + tile + 16 * lane), a1 = *(const uint4 *)(x.q1 + tile + 16 * (32 + lane));
    const uint4 c0 = *(const uint4 *)(x.q2 + tile + 16 * lane), c1 = *(const uint4 *)(x.q2 + tile + 16 * (32 + lane));
    const uint32_t x1[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const uint32_t x2[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const uint32_t q[8] = {L.a.x, L.a.y, L.a.z, L.a.w, L.b.x, L.b.y, L.b.z, L.b.w};
    return qx_q8_block(q, qm_half(L.d), x1, x2, x.dxs[b]);
}

/* A warp walks its rows' steps in order (Load: the type's registers of a
 * step); the next step's loads are issued before the current one is
 * computed, the first before pdl_wait (the weights are constant). */
template <typename Load>
__global__ void __launch_bounds__(QX_WARPS * 32) kernel_gemv_x8(QxWeights W, QxPlanes x, GemvOut out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * QX_WARPS, w = (int64_t)blockIdx.x * QX_WARPS + threadIdx.x / 32;
    Load cur, nxt;
    const int steps = qx_steps(cur, W.nblk);
    const int64_t n_items = w < W.rows ? (W.rows - w + warps - 1) / warps * steps : 0;
    if (n_items == 0) return;
    QxItem it = {w, 0};
    qx_load(cur, W, it, lane);
    pdl_enter();
    float acc = 0.f;
    for (int64_t i = 0; i < n_items; i++) {
        const QxItem nx = qx_next(it, steps, warps);
        if (i + 1 < n_items) qx_load(nxt, W, nx, lane);
        acc += qx_compute(cur, x, W, it.step, lane);
        if (it.step == steps - 1) {
            acc = warp_sum(acc);
            if (lane == 0) gemv_out_store(out, 0, it.row, acc);
            acc = 0.f;
        }
        cur = nxt;
        it = nx;
    }
}

int quant_x_round(QuantX *xq, const void *x, int T, int64_t cols, DType w_type, cudaStream_t s, Err *err) {
    const int K = qx_pieces(w_type);
    if (K == 0) return err_set(err, "quant_x_round: no v5 kernel for %s weights", dtype_info(w_type)->name);
    if (T < 1 || T > QUANT_GEMV_MAX_T || cols <= 0 || cols % QX_GROUP)
        return err_set(err, "quant_x_round: %d rows of %lld values (1..%d rows, a multiple of %d)", T, (long long)cols,
                       QUANT_GEMV_MAX_T, QX_GROUP);
    if (quant_x_bytes(cols, T) > xq->bytes)
        return err_set(err, "quant_x_round: %d x %lld values need %zu bytes, the buffer has %zu", T, (long long)cols,
                       quant_x_bytes(cols, T), xq->bytes);
    if ((uintptr_t)x % 16 || (uintptr_t)xq->buf % 256) return err_set(err, "quant_x_round: misaligned buffers");
    xq->cols = cols;
    xq->T = T;
    xq->type = w_type;
    QxPlanes p = qx_planes(xq);
    const int64_t G = cols / QX_GROUP;
    dim3 grid((unsigned)((G + 7) / 8), (unsigned)T);
    CUDA_CHECK(launch_pdl(kernel_round_x8, grid, dim3(256), 0, s, (const __nv_bfloat16 *)x, cols, K, (int8_t *)p.q1,
                          (int8_t *)p.q2, (float *)p.dxs, (float *)p.sx), err);
    return 0;
}

bool quant_gemv_x8_supported(DType t, int64_t cols) {
    return (t == DT_Q4_K && cols % 256 == 0) || (t == DT_Q8_0 && cols % 32 == 0);
}

/* Blocks for rows: a block per QX_WARPS rows, at most what fits on the GPU
 * at once (warps then take several rows each, pipelined across them). */
template <typename Load>
static int qx_launch(const QxWeights &W, const QxPlanes &p, const GemvOut *out, cudaStream_t s, Err *err) {
    int dev = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_gemv_x8<Load>, QX_WARPS * 32, 0), err);
    int64_t blocks = (W.rows + QX_WARPS - 1) / QX_WARPS, fit = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
    if (blocks > fit) blocks = fit;
    CUDA_CHECK(launch_pdl(kernel_gemv_x8<Load>, dim3((unsigned)blocks), dim3(QX_WARPS * 32), 0, s, W, p, *out), err);
    return 0;
}

int quant_gemv_x8(const QuantMatrix *W, const QuantX *xq, const GemvOut *out, int T, cudaStream_t s, Err *err) {
    if (!quant_gemv_x8_supported(W->type, W->cols))
        return err_set(err, "quant_gemv v5: %s with %lld columns (Q4_K, Q8_0 only)", dtype_info(W->type)->name,
                       (long long)W->cols);
    if (T != 1 || xq->T != T || xq->cols != W->cols || xq->type != W->type)
        return err_set(err, "quant_gemv v5: x rounded as %d x %lld for %s, not one row of %lld for %s", xq->T,
                       (long long)xq->cols, dtype_info(xq->type)->name, (long long)W->cols, dtype_info(W->type)->name);
    if (out->end[0] > out->end[1] || out->end[1] > out->end[2] || out->end[2] != W->rows)
        return err_set(err, "quant_gemv v5: output parts end at %lld, %lld, %lld for %lld rows",
                       (long long)out->end[0], (long long)out->end[1], (long long)out->end[2], (long long)W->rows);
    const QxPlanes p = qx_planes(xq);
    const QxWeights w = {(const uint8_t *)W->qs, (const unsigned short *)W->sc, W->rows,
                         (int)(W->cols / quant_block_elems(W->type))};
    return W->type == DT_Q4_K ? qx_launch<Q4kLoad>(w, p, out, s, err) : qx_launch<Q8Load>(w, p, out, s, err);
}
