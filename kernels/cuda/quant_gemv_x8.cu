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
#ifndef QX_U_Q4K
#define QX_U_Q4K 2 /* steps of 8 blocks per batch of loads */
#endif
#ifndef QX_U_Q8
#define QX_U_Q8 2  /* steps of 32 blocks */
#endif

typedef struct {
    const int8_t *q1, *q2;
    const float *dxs, *sx;
} QxPlanes;

static int64_t qx_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* plane offsets in bytes: q1 0, q2, dxs, sx; returns the total */
static size_t qx_layout(int64_t cols, int T, size_t off[4]) {
    int64_t G = cols / QX_GROUP;
    off[0] = 0;
    off[1] = (size_t)T * cols;
    off[2] = (size_t)qx_round_up(2 * (int64_t)T * cols, 16);
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

/* One warp per group of 32 values of one x row (blockIdx.y). */
__global__ void kernel_round_x8(const __nv_bfloat16 *x, int64_t cols, int8_t *q1, int8_t *q2, float *dxs, float *sx) {
    pdl_enter();
    const int lane = threadIdx.x & 31, t = blockIdx.y;
    const int64_t G = cols / QX_GROUP, g = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= G) return;
    const int64_t i = t * cols + g * QX_GROUP + lane;
    const float v = __bfloat162float(x[i]);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int a, b;
    qm_i8_split(v, qm_i8_inv(amax), qm_i8_scale(amax), &a, &b);
    q1[i] = (int8_t)a;
    q2[i] = (int8_t)b;
    int s = 128 * a + b;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        const float d = qm_i8_scale(amax) * 0.0078125f;
        dxs[t * G + g] = d;
        sx[t * G + g] = (float)s * d;
    }
}

/* Q4_K: lane = 4 (block of the step) + chunk j. */
__global__ void __launch_bounds__(QX_WARPS * 32) kernel_q4k_x8(const uint8_t *__restrict__ W, int64_t rows, int nsb,
                                                             QxPlanes x, GemvOut out) {
    const int lane = threadIdx.x & 31, j = lane & 3, sl = lane >> 2;
    const int64_t row = (int64_t)blockIdx.x * QX_WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    const uint8_t *wr = W + row * nsb * 144;
    float acc = 0.f;
    for (int b0 = 0; b0 < nsb; b0 += 8 * QX_U_Q4K) {
        uint4 h[QX_U_Q4K], qa[QX_U_Q4K], qb[QX_U_Q4K];
#pragma unroll
        for (int u = 0; u < QX_U_Q4K; u++) {
            const int b = b0 + 8 * u + sl;
            if (b < nsb) {
                const uint8_t *p = wr + (int64_t)b * 144;
                h[u] = ld_stream(p);
                qa[u] = ld_stream(p + 16 + 32 * j);
                qb[u] = ld_stream(p + 32 + 32 * j);
            }
        }
        if (b0 == 0) pdl_enter();
#pragma unroll
        for (int u = 0; u < QX_U_Q4K; u++) {
            const int b = b0 + 8 * u + sl;
            if (b >= nsb) continue;
            const int64_t c = (int64_t)b * 256 + 64 * j;
            uint32_t x1[16], x2[16];
            const uint4 *p1 = (const uint4 *)(x.q1 + c), *p2 = (const uint4 *)(x.q2 + c);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint4 a = p1[k], bb = p2[k];
                x1[4 * k] = a.x, x1[4 * k + 1] = a.y, x1[4 * k + 2] = a.z, x1[4 * k + 3] = a.w;
                x2[4 * k] = bb.x, x2[4 * k + 1] = bb.y, x2[4 * k + 2] = bb.z, x2[4 * k + 3] = bb.w;
            }
            const float2 d2 = *(const float2 *)(x.dxs + c / QX_GROUP), s2 = *(const float2 *)(x.sx + c / QX_GROUP);
            const float dxs[2] = {d2.x, d2.y}, sx[2] = {s2.x, s2.y};
            const uint32_t q[8] = {qa[u].x, qa[u].y, qa[u].z, qa[u].w, qb[u].x, qb[u].y, qb[u].z, qb[u].w};
            const uint32_t hdr[4] = {h[u].x, h[u].y, h[u].z, h[u].w};
            acc += qx_q4k_chunk(q, hdr, j, x1, x2, dxs, sx);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) gemv_out_store(out, 0, row, acc);
}

/* Q8_0: lane = block of the step. */
__global__ void __launch_bounds__(QX_WARPS * 32) kernel_q8_x8(const uint8_t *__restrict__ qs,
                                                            const unsigned short *__restrict__ sc, int64_t rows,
                                                            int nb, QxPlanes x, GemvOut out) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * QX_WARPS + threadIdx.x / 32;
    if (row >= rows) return;
    const uint8_t *wr = qs + row * nb * 32;
    const unsigned short *sr = sc + row * nb;
    float acc = 0.f;
    for (int b0 = 0; b0 < nb; b0 += 32 * QX_U_Q8) {
        uint4 w0[QX_U_Q8], w1[QX_U_Q8];
        unsigned short d[QX_U_Q8];
#pragma unroll
        for (int u = 0; u < QX_U_Q8; u++) {
            const int b = b0 + 32 * u + lane;
            if (b < nb) {
                w0[u] = ld_stream(wr + 32 * (int64_t)b);
                w1[u] = ld_stream(wr + 32 * (int64_t)b + 16);
                d[u] = __ldg(sr + b);
            }
        }
        if (b0 == 0) pdl_enter();
#pragma unroll
        for (int u = 0; u < QX_U_Q8; u++) {
            const int b = b0 + 32 * u + lane;
            if (b >= nb) continue;
            const uint4 *p1 = (const uint4 *)(x.q1 + 32 * (int64_t)b), *p2 = (const uint4 *)(x.q2 + 32 * (int64_t)b);
            const uint4 a0 = p1[0], a1 = p1[1], c0 = p2[0], c1 = p2[1];
            const uint32_t x1[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const uint32_t x2[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            const uint32_t q[8] = {w0[u].x, w0[u].y, w0[u].z, w0[u].w, w1[u].x, w1[u].y, w1[u].z, w1[u].w};
            acc += qx_q8_block(q, qm_half(d[u]), x1, x2, x.dxs[b]);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) gemv_out_store(out, 0, row, acc);
}

int quant_x_round(QuantX *xq, const void *x, int T, int64_t cols, cudaStream_t s, Err *err) {
    if (T < 1 || T > QUANT_GEMV_MAX_T || cols <= 0 || cols % QX_GROUP)
        return err_set(err, "quant_x_round: %d rows of %lld values (1..%d rows, a multiple of %d)", T, (long long)cols,
                       QUANT_GEMV_MAX_T, QX_GROUP);
    if (quant_x_bytes(cols, T) > xq->bytes)
        return err_set(err, "quant_x_round: %d x %lld values need %zu bytes, the buffer has %zu", T, (long long)cols,
                       quant_x_bytes(cols, T), xq->bytes);
    if ((uintptr_t)x % 16 || (uintptr_t)xq->buf % 256) return err_set(err, "quant_x_round: misaligned buffers");
    xq->cols = cols;
    xq->T = T;
    QxPlanes p = qx_planes(xq);
    const int64_t G = cols / QX_GROUP;
    dim3 grid((unsigned)((G + 7) / 8), (unsigned)T);
    CUDA_CHECK(launch_pdl(kernel_round_x8, grid, dim3(256), 0, s, (const __nv_bfloat16 *)x, cols, (int8_t *)p.q1,
                          (int8_t *)p.q2, (float *)p.dxs, (float *)p.sx), err);
    return 0;
}

bool quant_gemv_x8_supported(DType t, int64_t cols) {
    return (t == DT_Q4_K && cols % 256 == 0) || (t == DT_Q8_0 && cols % 32 == 0);
}

int quant_gemv_x8(const QuantMatrix *W, const QuantX *xq, const GemvOut *out, int T, cudaStream_t s, Err *err) {
    if (!quant_gemv_x8_supported(W->type, W->cols))
        return err_set(err, "quant_gemv v5: %s with %lld columns (Q4_K, Q8_0 only)", dtype_info(W->type)->name,
                       (long long)W->cols);
    if (T != 1 || xq->T != T || xq->cols != W->cols)
        return err_set(err, "quant_gemv v5: x rounded as %d x %lld for %d x %lld (one row)", xq->T,
                       (long long)xq->cols, T, (long long)W->cols);
    if (out->end[0] > out->end[1] || out->end[1] > out->end[2] || out->end[2] != W->rows)
        return err_set(err, "quant_gemv v5: output parts end at %lld, %lld, %lld for %lld rows",
                       (long long)out->end[0], (long long)out->end[1], (long long)out->end[2], (long long)W->rows);
    const QxPlanes p = qx_planes(xq);
    const dim3 grid((unsigned)((W->rows + QX_WARPS - 1) / QX_WARPS)), block(QX_WARPS * 32);
    if (W->type == DT_Q4_K)
        CUDA_CHECK(launch_pdl(kernel_q4k_x8, grid, block, 0, s, (const uint8_t *)W->qs, W->rows,
                              (int)(W->cols / 256), p, *out), err);
    else
        CUDA_CHECK(launch_pdl(kernel_q8_x8, grid, block, 0, s, (const uint8_t *)W->qs,
                              (const unsigned short *)W->sc, W->rows, (int)(W->cols / 32), p, *out), err);
    return 0;
}
