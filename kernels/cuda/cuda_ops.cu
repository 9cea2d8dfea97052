/* cuda_ops.cu — the CUDA backend's small kernels: embedding, fused residual
 * add + RMSNorm, RMSNorm, QKV split, bias, fused rope + KV-cache write by
 * slot (bf16, or fp8 quantized per head vector), attention over the paged
 * cache, gated activations, soft-cap, row gather and the MoE combine. Each mirrors its CPU reference in
 * kernels/cpu/ (the fused ones mirror their plain ops in sequence).
 *
 * Activations in and out are bf16, all arithmetic fp32. The attention kernel
 * here is the simple, obviously-correct one (one block per query row and
 * head, keys in tiles of 128 with an online softmax); the backend runs the
 * FlashAttention-style kernels of kernels/cuda/attention*.cu instead wherever
 * they have the head sizes and block size, and this one elsewhere. */
#include <math.h>

#include <cuda_fp8.h>

#include "kernels/cuda/attention_common.cuh" /* warp_quantize_fp8 */
#include "kernels/cuda/cuda_ops.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_head.cuh"

/* ---------------- kernels ---------------- */

__global__ void kernel_embed(float *out, const bf16 *table, const int32_t *ids, int C, float scale) {
    pdl_enter();
    int t = blockIdx.y;
    const bf16 *row = table + (int64_t)ids[t] * C;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)t * C + c] = __bfloat162float(row[c]) * scale;
}

__device__ float block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int n_warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < n_warps ? shared[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

__device__ float block_max(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int n_warps = (blockDim.x + 31) / 32;
    v = threadIdx.x < n_warps ? shared[threadIdx.x] : -INFINITY;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

/* One block per row: the residual row is read and written once, then read
 * again (from L1/L2) to normalize. The general kernel, for rows whose width
 * is not a multiple of 4 or whose pointers are not aligned for it. */
__global__ void kernel_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int C, float eps,
                                   float offset) {
    pdl_enter();
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * C;
    const bf16 *dr = delta ? delta + (int64_t)blockIdx.x * C : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = xr[i];
        if (dr) { v += __bfloat162float(dr[i]); xr[i] = v; }
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
    bf16 *o = out + (int64_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = __float2bfloat16(xr[i] * inv * (w[i] + offset));
}

/* Four bf16 as floats (8-byte aligned), and back. */
static __device__ __forceinline__ float4 bf16x4_load(const bf16 *p) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
    float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ void bf16x4_store(bf16 *p, float4 v) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u = make_uint2(*reinterpret_cast<uint32_t *>(&a), *reinterpret_cast<uint32_t *>(&b));
    *reinterpret_cast<uint2 *>(p) = u;
}
static __device__ __forceinline__ float4 norm4(float4 v, float inv, float4 g, float offset) {
    return make_float4(v.x * inv * (g.x + offset), v.y * inv * (g.y + offset), v.z * inv * (g.z + offset),
                       v.w * inv * (g.w + offset));
}
static __device__ __forceinline__ float sumsq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
static __device__ __forceinline__ float4 weights4(const float *w, int i, int c4) { /* group i of w, or zeros past c4 */
    return i < c4 ? __ldg(reinterpret_cast<const float4 *>(w) + i) : make_float4(0, 0, 0, 0);
}

static __device__ __forceinline__ float4 row4(const float *r, int i) { return reinterpret_cast<const float4 *>(r)[i]; }
static __device__ __forceinline__ float4 row4(const bf16 *r, int i) { return bf16x4_load(r + 4 * i); }

/* The vectorized kernels' start: the thread's N groups of the row and of
 * the weights (zeros past the row's c4 groups), every load issued first. */
template <int N, typename T>
static __device__ __forceinline__ void rms_load_vec(float4 *v, float4 *g, const T *row, const float *w, int c4) {
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < c4 ? row4(row, i) : make_float4(0, 0, 0, 0);
        g[k] = weights4(w, i, c4);
    }
}

/* The vectorized kernels' end: the block's sum of squares -> the row's
 * scale, then the thread's N groups v (weights g) normalized into o. */
template <int N>
static __device__ __forceinline__ void rms_store_vec(bf16 *o, const float4 *v, const float4 *g, float ss, int C,
                                                     float eps, float offset, float *red) {
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < C / 4) bf16x4_store(o + 4 * i, norm4(v[k], inv, g[k], offset));
    }
}

/* The same for C % 4 == 0 and aligned rows: a thread holds N groups of 4
 * (C / 4 / blockDim.x rounded up), and every load of the row and of the
 * weights is issued before the first use. Why: at decode a row is one
 * block, and the loop above is a chain of dependent round trips to memory
 * (~15 us for C = 4096 on the H200, kernels/NOTES.md "row kernels"). */
template <int N>
__global__ void kernel_add_rmsnorm_vec(float *x, const bf16 *delta, bf16 *out, const float *w, int C, float eps,
                                       float offset) {
    pdl_enter();
    __shared__ float red[32];
    float *xr = x + (int64_t)blockIdx.x * C;
    const bf16 *dr = delta ? delta + (int64_t)blockIdx.x * C : NULL;
    float4 v[N], g[N];
    rms_load_vec<N>(v, g, xr, w, C / 4);
    float ss = 0;
#pragma unroll
    for (int k = 0; k < N; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (dr && i < C / 4) {
            float4 d = bf16x4_load(dr + 4 * i);
            v[k] = make_float4(v[k].x + d.x, v[k].y + d.y, v[k].z + d.z, v[k].w + d.w);
            reinterpret_cast<float4 *>(xr)[i] = v[k];
        }
        ss += sumsq4(v[k]);
    }
    rms_store_vec<N>(out + (int64_t)blockIdx.x * C, v, g, ss, C, eps, offset, red);
}

/* In place is safe: each thread reads the elements it later writes. */
__global__ void kernel_rmsnorm(bf16 *out, const bf16 *x, const float *w, int C, float eps, float offset) {
    pdl_enter();
    __shared__ float red[32];
    const bf16 *xr = x + (int64_t)blockIdx.x * C;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) { float v = __bfloat162float(xr[i]); ss += v * v; }
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
    bf16 *o = out + (int64_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * (w[i] + offset));
}

/* kernel_rmsnorm for C % 4 == 0 and aligned rows, loads first as above. */
template <int N>
__global__ void kernel_rmsnorm_vec(bf16 *out, const bf16 *x, const float *w, int C, float eps, float offset) {
    pdl_enter();
    __shared__ float red[32];
    float4 v[N], g[N];
    rms_load_vec<N>(v, g, x + (int64_t)blockIdx.x * C, w, C / 4);
    float ss = 0;
#pragma unroll
    for (int k = 0; k < N; k++) ss += sumsq4(v[k]);
    rms_store_vec<N>(out + (int64_t)blockIdx.x * C, v, g, ss, C, eps, offset, red);
}

__global__ void kernel_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk,
                                 const float *bv, int nq, int nk, int nv) {
    pdl_enter();
    int t = blockIdx.y, n = nq + nk + nv;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float a = __bfloat162float(qkv[(int64_t)t * n + i]);
        if (i < nq) q[(int64_t)t * nq + i] = __float2bfloat16(bq ? a + bq[i] : a);
        else if (i < nq + nk) k[(int64_t)t * nk + i - nq] = __float2bfloat16(bk ? a + bk[i - nq] : a);
        else v[(int64_t)t * nv + i - nq - nk] = __float2bfloat16(bv ? a + bv[i - nq - nk] : a);
    }
}

/* Eight values a thread (16-byte loads and stores) where every part's width is a
 * multiple of 8: the scalar kernel keeps ~2 KB in flight an SM, a third of the
 * bandwidth at prefill sizes. Same values as kernel_split_qkv. */
__global__ void kernel_split_qkv_x8(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk,
                                    const float *bv, int nq, int nk, int nv) {
    pdl_enter();
    int t = blockIdx.y, n = nq + nk + nv;
    for (int i = 8 * (blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 8 * gridDim.x * blockDim.x) {
        uint4 in = *(const uint4 *)(qkv + (int64_t)t * n + i);
        bf16 *dst;
        const float *b;
        int j;
        if (i < nq) dst = q + (int64_t)t * nq + i, b = bq, j = i;
        else if (i < nq + nk) dst = k + (int64_t)t * nk + i - nq, b = bk, j = i - nq;
        else dst = v + (int64_t)t * nv + i - nq - nk, b = bv, j = i - nq - nk;
        if (b) {
            bf16 *e = (bf16 *)&in;
#pragma unroll
            for (int c = 0; c < 8; c++) e[c] = __float2bfloat16(__bfloat162float(e[c]) + b[j + c]);
        }
        *(uint4 *)dst = in;
    }
}

__global__ void kernel_add_bias(void *y, bool y_f32, const float *bias, int T, int n) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)T * n; i += (int64_t)gridDim.x * blockDim.x) {
        if (y_f32) ((float *)y)[i] += bias[i % n];
        else ((bf16 *)y)[i] = __float2bfloat16(__bfloat162float(((bf16 *)y)[i]) + bias[i % n]);
    }
}

#define RKV_WARPS 8 /* head vectors per block of kernel_rope_kv_write */

/* A warp per head vector of row t (blockIdx.x): the q heads, then the k
 * heads, then the v heads (grid.y covers them RKV_WARPS at a time). A q or
 * k head goes to the warp's shared buffer, gets its qk-norm (rounded to
 * bf16, as a separate op would store it) and rope there, and is written
 * back; a k head, and a v head as is, also goes to the cache slot (fp8: a
 * warp quantizes the head vector). Why a warp per head and not a block per
 * row: at decode a row's ~50 head vectors were one block's chain of
 * dependent loads (~11 us for Llama-3-8B on the H200). */
__global__ void kernel_rope_kv_write(bf16 *q, bf16 *k, const bf16 *v, KVLayerDev kv, DevAttnBatch b, int n_heads,
                                     int n_kv_heads, int hd, int hdv, int half, const float *inv_freq, float mscale,
                                     bool neox, int64_t n_slots, QkNorm qk) {
    pdl_enter();
    extern __shared__ float rkv_buf[];
    const int t = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int h = blockIdx.y * RKV_WARPS + warp;
    if (h >= n_heads + 2 * n_kv_heads) return;
    const int64_t slot = b.slot[t];
    const bool store = slot >= 0 && slot < n_slots, fp8 = kv.dtype == KV_DTYPE_FP8;
    if (h >= n_heads + n_kv_heads) { /* a v head: to the cache */
        int hv = h - n_heads - n_kv_heads;
        const bf16 *src = v + ((int64_t)t * n_kv_heads + hv) * hdv;
        int64_t at = slot * n_kv_heads + hv;
        if (store && fp8) warp_quantize_fp8(src, hdv, (uint8_t *)kv.v + at * hdv, kv.v_scale + at);
        else if (store) for (int i = lane; i < hdv; i += 32) ((bf16 *)kv.v)[at * hdv + i] = src[i];
        return;
    }
    const bool is_q = h < n_heads;
    const int hk = h - n_heads;
    bf16 *x = is_q ? q + ((int64_t)t * n_heads + h) * hd : k + ((int64_t)t * n_kv_heads + hk) * hd;
    float *buf = rkv_buf + warp * hd;
    for (int i = lane; i < hd; i += 32) buf[i] = __bfloat162float(x[i]);
    const RopeFreqs f = {inv_freq, mscale, half, neox};
    warp_norm_rope(buf, hd, is_q ? qk.q : qk.k, qk.eps, qk.offset, (float)b.pos[t], f);
    for (int i = lane; i < hd; i += 32) x[i] = __float2bfloat16(buf[i]);
    if (is_q || !store) return;
    int64_t at = slot * n_kv_heads + hk;
    if (fp8) {
        __syncwarp(); /* the lanes' stores of x above, visible to the warp */
        warp_quantize_fp8(x, hd, (uint8_t *)kv.k + at * hd, kv.k_scale + at);
    } else {
        for (int i = lane; i < hd; i += 32) ((bf16 *)kv.k)[at * hd + i] = __float2bfloat16(buf[i]);
    }
}

#define ATT_TILE 128

/* Element i of a cache array: bf16, or e4m3 code x the scale of its head
 * vector (scales != NULL), exactly the host's e4m3_to_fp32(code) * scale. */
static __device__ __forceinline__ float kv_elem(const void *base, const float *scales, int64_t i, int64_t head_vec) {
    if (!scales) return __bfloat162float(((const bf16 *)base)[i]);
    __half_raw h = __nv_cvt_fp8_to_halfraw(((const uint8_t *)base)[i], __NV_E4M3);
    return __half2float(__half(h)) * scales[head_vec];
}

/* One block per (query row, head): keys in tiles of ATT_TILE, one key per
 * thread for the scores, one output channel per thread for the sum. */
__global__ void kernel_attention(bf16 *out, const bf16 *q, KVLayerDev kv, DevAttnBatch b, AttnParams p) {
    pdl_enter();
    extern __shared__ float smem[]; /* q [Dk] | scores [ATT_TILE] | acc [Dv] | red [32] */
    float *qs = smem, *sc = qs + p.head_dim_k, *acc = sc + ATT_TILE, *red = acc + p.head_dim_v;
    int row = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int pos = b.pos[row], kvh = h / (p.n_heads / p.n_kv_heads);
    int first = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const int32_t *table = b.tables + (int64_t)b.seq[row] * b.max_blocks;
    const bf16 *qr = q + ((int64_t)row * p.n_heads + h) * p.head_dim_k;
    for (int d = tid; d < p.head_dim_k; d += blockDim.x) qs[d] = __bfloat162float(qr[d]);
    for (int d = tid; d < p.head_dim_v; d += blockDim.x) acc[d] = 0.0f;
    float m = p.sinks ? p.sinks[h] : -INFINITY, denom = p.sinks ? 1.0f : 0.0f;
    __syncthreads();
    int kstride = p.n_kv_heads * p.head_dim_k, vstride = p.n_kv_heads * p.head_dim_v;
    for (int t0 = first; t0 <= pos; t0 += ATT_TILE) {
        int j = t0 + tid;
        float s = -INFINITY;
        if (tid < ATT_TILE && j <= pos) {
            int64_t slot = (int64_t)table[j / b.block_size] * b.block_size + j % b.block_size;
            int64_t kr = slot * kstride + (int64_t)kvh * p.head_dim_k, hv = slot * p.n_kv_heads + kvh;
            s = 0;
            for (int d = 0; d < p.head_dim_k; d++) s += qs[d] * kv_elem(kv.k, kv.k_scale, kr + d, hv);
            s *= p.scale;
            if (p.softcap > 0) s = p.softcap * tanhf(s / p.softcap);
        }
        float tile_max = block_max(s, red);
        float new_m = fmaxf(m, tile_max);
        float r = expf(m - new_m); /* m = -inf at first: r = 0 */
        float e = s == -INFINITY ? 0.0f : expf(s - new_m);
        if (tid < ATT_TILE) sc[tid] = e;
        float tile_sum = block_sum(e, red);
        denom = denom * r + tile_sum;
        int n = pos - t0 + 1 < ATT_TILE ? pos - t0 + 1 : ATT_TILE;
        for (int d = tid; d < p.head_dim_v; d += blockDim.x) {
            float a = acc[d] * r;
            for (int jj = 0; jj < n; jj++) {
                int jk = t0 + jj;
                int64_t slot = (int64_t)table[jk / b.block_size] * b.block_size + jk % b.block_size;
                a += sc[jj] * kv_elem(kv.v, kv.v_scale, slot * vstride + (int64_t)kvh * p.head_dim_v + d,
                                      slot * p.n_kv_heads + kvh);
            }
            acc[d] = a;
        }
        m = new_m;
        __syncthreads();
    }
    bf16 *o = out + ((int64_t)row * p.n_heads + h) * p.head_dim_v;
    for (int d = tid; d < p.head_dim_v; d += blockDim.x) o[d] = __float2bfloat16(acc[d] / denom);
}

__global__ void kernel_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu,
                           int F, Activation act, float limit) {
    pdl_enter();
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F; i += gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[(int64_t)t * ld + i]), u = __bfloat162float(up[(int64_t)t * ld + i]);
        if (bg) g += bg[i];
        if (bu) u += bu[i];
        out[(int64_t)t * F + i] = __float2bfloat16(act_glu(g, u, act, limit));
    }
}

/* Eight values a thread (16-byte loads and stores: see kernel_split_qkv_x8);
 * F and ld multiples of 8. Same values as kernel_glu. */
__global__ void kernel_glu_x8(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu,
                              int F, Activation act, float limit) {
    pdl_enter();
    int t = blockIdx.y;
    for (int i = 8 * (blockIdx.x * blockDim.x + threadIdx.x); i < F; i += 8 * gridDim.x * blockDim.x) {
        uint4 gv = *(const uint4 *)(gate + (int64_t)t * ld + i), uv = *(const uint4 *)(up + (int64_t)t * ld + i), o;
        const bf16 *ge = (const bf16 *)&gv, *ue = (const bf16 *)&uv;
        bf16 *oe = (bf16 *)&o;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            float g = __bfloat162float(ge[c]), u = __bfloat162float(ue[c]);
            if (bg) g += bg[i + c];
            if (bu) u += bu[i + c];
            oe[c] = __float2bfloat16(act_glu(g, u, act, limit));
        }
        *(uint4 *)(out + (int64_t)t * F + i) = o;
    }
}

__global__ void kernel_softcap(float *x, int64_t n, float cap) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

__global__ void kernel_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int C) {
    pdl_enter();
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        dst[(int64_t)i * C + c] = src[(int64_t)rows[i] * C + c];
}

__global__ void kernel_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int C) {
    pdl_enter();
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)rows[i] * C + c] += w[i] * __bfloat162float(src[(int64_t)i * C + c]);
}

__global__ void kernel_f32_to_bf16(bf16 *out, const float *x, int64_t n) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(x[i]);
}

/* One thread per row: E and k are small (gpt-oss: 32 / 4). Same choice as
 * the CPU's moe_route: repeated argmax, the lowest id on ties. */
__global__ void kernel_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k) {
    pdl_enter();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *lg = logits + (int64_t)t * E;
    int32_t *st = sel + (int64_t)t * k;
    float *wt = w + (int64_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= st[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        st[j] = best;
    }
    float m = lg[st[0]], sum = 0;
    for (int j = 0; j < k; j++) sum += wt[j] = expf(lg[st[j]] - m);
    for (int j = 0; j < k; j++) wt[j] /= sum;
}

__global__ void kernel_moe_combine(bf16 *out, const bf16 *y, const float *w, int k, int C) {
    pdl_enter();
    int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float a = 0;
        for (int j = 0; j < k; j++) a += w[t * k + j] * __bfloat162float(y[((int64_t)t * k + j) * C + c]);
        out[(int64_t)t * C + c] = __float2bfloat16(a);
    }
}

/* ---------------- launchers ---------------- */

static int grid_for(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    return (int)(g > 65535 ? 65535 : g < 1 ? 1 : g);
}

static bool aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

/* Threads for a per-row kernel: C rounded up to warps, at most 256. */
static int row_threads(int C) { return C >= 256 ? 256 : (C + 31) / 32 * 32; }

void cuda_embed(float *out, const bf16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s) {
    launch_pdl(kernel_embed, dim3(grid_for(C, 256), T), 256, 0, s, out, table, ids, C, scale);
}

/* The vectorized row kernels' shape for width C: threads (C / 4 rounded up
 * to warps, at most 1024) and groups of 4 per thread (1, 2, 4 or 8); 0 when
 * they do not apply (C % 4, C > 32768 or an unaligned pointer). */
static int vec_groups(int C, const void *a, const void *b, const void *c, const void *d, int *threads) {
    bool aligned = (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 8 == 0 && (uintptr_t)d % 8 == 0;
    if (C % 4 || C > 32768 || !aligned) return 0;
    int c4 = C / 4;
    *threads = c4 >= 1024 ? 1024 : (c4 + 31) / 32 * 32;
    int n = (c4 + *threads - 1) / *threads;
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
}

void cuda_add_rmsnorm(float *x, const bf16 *delta, bf16 *out, const float *w, int T, int C, float eps, float offset,
                      cudaStream_t s) {
    if (T <= 0) return;
    int nt = 0, n = vec_groups(C, x, w, delta, out, &nt);
    if (n == 1) launch_pdl(kernel_add_rmsnorm_vec<1>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 2) launch_pdl(kernel_add_rmsnorm_vec<2>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 4) launch_pdl(kernel_add_rmsnorm_vec<4>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else if (n == 8) launch_pdl(kernel_add_rmsnorm_vec<8>, T, nt, 0, s, x, delta, out, w, C, eps, offset);
    else launch_pdl(kernel_add_rmsnorm, T, row_threads(C), 0, s, x, delta, out, w, C, eps, offset);
}

void cuda_rmsnorm(bf16 *out, const bf16 *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s) {
    if (rows <= 0) return;
    int nt = 0, n = vec_groups(C, w, w, x, out, &nt);
    if (n == 1) launch_pdl(kernel_rmsnorm_vec<1>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 2) launch_pdl(kernel_rmsnorm_vec<2>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 4) launch_pdl(kernel_rmsnorm_vec<4>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else if (n == 8) launch_pdl(kernel_rmsnorm_vec<8>, rows, nt, 0, s, out, x, w, C, eps, offset);
    else launch_pdl(kernel_rmsnorm, rows, row_threads(C), 0, s, out, x, w, C, eps, offset);
}

void cuda_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk, const float *bv,
                    int T, int nq, int nk, int nv, cudaStream_t s) {
    if (nq % 8 == 0 && nk % 8 == 0 && nv % 8 == 0 && aligned16(q, k, v, qkv))
        launch_pdl(kernel_split_qkv_x8, dim3(grid_for((nq + nk + nv) / 8, 128), T), 128, 0, s, q, k, v, qkv, bq, bk,
                   bv, nq, nk, nv);
    else launch_pdl(kernel_split_qkv, dim3(grid_for(nq + nk + nv, 256), T), 256, 0, s, q, k, v, qkv, bq, bk, bv, nq, nk, nv);
}

void cuda_add_bias(void *y, bool y_f32, const float *bias, int T, int n, cudaStream_t s) {
    launch_pdl(kernel_add_bias, grid_for((int64_t)T * n, 256), 256, 0, s, y, y_f32, bias, T, n);
}

void cuda_rope_kv_write(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, const DevAttnBatch *b, int n_heads,
                        int n_kv_heads, int head_dim_k, int head_dim_v, int rot_dim, const float *inv_freq,
                        float mscale, bool neox, int64_t n_slots, const QkNorm *qk, cudaStream_t s) {
    if (b->n_tokens <= 0) return;
    dim3 grid(b->n_tokens, (n_heads + 2 * n_kv_heads + RKV_WARPS - 1) / RKV_WARPS);
    launch_pdl(kernel_rope_kv_write, grid, RKV_WARPS * 32, RKV_WARPS * head_dim_k * sizeof(float), s,
        q, k, v, *kv, *b, n_heads, n_kv_heads, head_dim_k, head_dim_v, rot_dim / 2, inv_freq, mscale, neox, n_slots,
        *qk);
}

void cuda_attention_generic(bf16 *out, const bf16 *q, const KVLayerDev *kv, const DevAttnBatch *b, const AttnParams *p,
                            cudaStream_t s) {
    size_t shm = (p->head_dim_k + ATT_TILE + p->head_dim_v + 32) * sizeof(float);
    launch_pdl(kernel_attention, dim3(b->n_tokens, p->n_heads), ATT_TILE, shm, s, out, q, *kv, *b, *p);
}

void cuda_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu, int T, int F,
              Activation act, float limit, cudaStream_t s) {
    if (T <= 0) return;
    if (F % 8 == 0 && ld % 8 == 0 && aligned16(out, gate, up, up))
        launch_pdl(kernel_glu_x8, dim3(grid_for(F / 8, 128), T), 128, 0, s, out, gate, up, ld, bg, bu, F, act, limit);
    else launch_pdl(kernel_glu, dim3(grid_for(F, 256), T), 256, 0, s, out, gate, up, ld, bg, bu, F, act, limit);
}

void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s) {
    launch_pdl(kernel_softcap, grid_for(n, 256), 256, 0, s, x, n, cap);
}

void cuda_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int n, int C, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_gather_rows, dim3(grid_for(C, 256), n), 256, 0, s, dst, src, rows, C);
}

void cuda_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_scatter_add, dim3(grid_for(C, 256), n), 256, 0, s, out, src, rows, w, C);
}

void cuda_f32_to_bf16(bf16 *out, const float *x, int64_t n, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_f32_to_bf16, grid_for(n, 256), 256, 0, s, out, x, n);
}

void cuda_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k, cudaStream_t s) {
    launch_pdl(kernel_moe_route, (T + 63) / 64, 64, 0, s, sel, w, logits, T, E, k);
}

void cuda_moe_combine(bf16 *out, const bf16 *y, const float *w, int T, int k, int C, cudaStream_t s) {
    if (T > 0) launch_pdl(kernel_moe_combine, dim3(grid_for(C, 256), T), 256, 0, s, out, y, w, k, C);
}
