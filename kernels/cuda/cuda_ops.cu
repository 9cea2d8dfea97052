/* cuda_ops.cu — the CUDA backend's small kernels: embedding, bf16
 * conversion, bias, RMSNorm, residual add, rope, KV-cache write by slot,
 * attention over the paged cache, gated activations, soft-cap, row gather and
 * the MoE combine. Each mirrors its CPU reference in kernels/cpu/.
 *
 * This first version favours obvious correctness: fp32 activations and a
 * straightforward attention kernel (one block per query row and head,
 * keys in tiles of 128 with an online softmax). The FlashAttention-style
 * tensor-core kernels replace it (kernels/NOTES.md tracks versions). */
#include <math.h>

#include "kernels/cuda/cuda_ops.cuh"

/* ---------------- kernels ---------------- */

__global__ void kernel_embed(float *out, const __nv_bfloat16 *table, const int32_t *ids, int C, float scale) {
    int t = blockIdx.y;
    const __nv_bfloat16 *row = table + (int64_t)ids[t] * C;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)t * C + c] = __bfloat162float(row[c]) * scale;
}

__global__ void kernel_to_bf16(__nv_bfloat16 *out, const float *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(x[i]);
}

__global__ void kernel_add_bias(float *y, const float *bias, int T, int n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)T * n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
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

__global__ void kernel_rmsnorm(float *out, const float *x, const float *w, int C, float eps, float offset) {
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * C;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss, red) / C + eps);
    float *o = out + (int64_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = xr[i] * inv * (w[i] + offset);
}

__global__ void kernel_add(float *x, const float *d, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += d[i];
}

__global__ void kernel_rope(float *x, const int32_t *pos, int n_heads, int head_dim, int half, const float *inv_freq,
                            float mscale, bool neox) {
    int t = blockIdx.y, h = blockIdx.x, i = threadIdx.x;
    if (i >= half) return;
    float s, c;
    sincosf((float)pos[t] * inv_freq[i], &s, &c);
    s *= mscale;
    c *= mscale;
    float *v = x + ((int64_t)t * n_heads + h) * head_dim;
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

__global__ void kernel_kv_write(float *kc, float *vc, const int64_t *slot, const float *k, const float *v, int kw, int vw) {
    int t = blockIdx.x;
    for (int i = threadIdx.x; i < kw; i += blockDim.x) kc[slot[t] * kw + i] = k[(int64_t)t * kw + i];
    for (int i = threadIdx.x; i < vw; i += blockDim.x) vc[slot[t] * vw + i] = v[(int64_t)t * vw + i];
}

#define ATT_TILE 128

/* One block per (query row, head): keys in tiles of ATT_TILE, one key per
 * thread for the scores, one output channel per thread for the sum. */
__global__ void kernel_attention(float *out, const float *q, const float *kc, const float *vc, DevAttnBatch b,
                                 AttnParams p, const float *sinks) {
    extern __shared__ float smem[]; /* q [Dk] | scores [ATT_TILE] | acc [Dv] | red [32] */
    float *qs = smem, *sc = qs + p.head_dim_k, *acc = sc + ATT_TILE, *red = acc + p.head_dim_v;
    int row = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int pos = b.pos[row], kvh = h / (p.n_heads / p.n_kv_heads);
    int first = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const int32_t *table = b.tables + (int64_t)b.seq[row] * b.max_blocks;
    const float *qr = q + ((int64_t)row * p.n_heads + h) * p.head_dim_k;
    for (int d = tid; d < p.head_dim_k; d += blockDim.x) qs[d] = qr[d];
    for (int d = tid; d < p.head_dim_v; d += blockDim.x) acc[d] = 0.0f;
    float m = sinks ? sinks[h] : -INFINITY, denom = sinks ? 1.0f : 0.0f;
    __syncthreads();
    int kstride = p.n_kv_heads * p.head_dim_k, vstride = p.n_kv_heads * p.head_dim_v;
    for (int t0 = first; t0 <= pos; t0 += ATT_TILE) {
        int j = t0 + tid;
        float s = -INFINITY;
        if (tid < ATT_TILE && j <= pos) {
            int64_t slot = (int64_t)table[j / b.block_size] * b.block_size + j % b.block_size;
            const float *kr = kc + slot * kstride + (int64_t)kvh * p.head_dim_k;
            s = 0;
            for (int d = 0; d < p.head_dim_k; d++) s += qs[d] * kr[d];
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
                a += sc[jj] * vc[slot * vstride + (int64_t)kvh * p.head_dim_v + d];
            }
            acc[d] = a;
        }
        m = new_m;
        __syncthreads();
    }
    float *o = out + ((int64_t)row * p.n_heads + h) * p.head_dim_v;
    for (int d = tid; d < p.head_dim_v; d += blockDim.x) o[d] = acc[d] / denom;
}

__global__ void kernel_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i], a;
        if (act == ACT_GELU_TANH) {
            a = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
        } else if (act == ACT_SWIGLU_OAI) {
            if (limit > 0) { g = fminf(g, limit); u = fminf(fmaxf(u, -limit), limit); }
            a = (u + 1.0f) * g / (1.0f + expf(-1.702f * g));
        } else {
            a = g / (1.0f + expf(-g)) * u;
        }
        out[i] = a;
    }
}

__global__ void kernel_softcap(float *x, int64_t n, float cap) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

__global__ void kernel_gather_rows(float *dst, const float *src, const int32_t *rows, int C) {
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        dst[(int64_t)i * C + c] = src[(int64_t)rows[i] * C + c];
}

__global__ void kernel_scatter_add(float *out, const float *src, const int32_t *rows, const float *w, int C) {
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)rows[i] * C + c] += w[i] * src[(int64_t)i * C + c];
}

/* ---------------- launchers ---------------- */

static int grid_for(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    return (int)(g > 65535 ? 65535 : g < 1 ? 1 : g);
}

void cuda_embed(float *out, const __nv_bfloat16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s) {
    kernel_embed<<<dim3(grid_for(C, 256), T), 256, 0, s>>>(out, table, ids, C, scale);
}

void cuda_to_bf16(__nv_bfloat16 *out, const float *x, int64_t n, cudaStream_t s) {
    kernel_to_bf16<<<grid_for(n, 256), 256, 0, s>>>(out, x, n);
}

void cuda_add_bias(float *y, const float *bias, int T, int n, cudaStream_t s) {
    kernel_add_bias<<<grid_for((int64_t)T * n, 256), 256, 0, s>>>(y, bias, T, n);
}

void cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int C, float eps, float offset, cudaStream_t s) {
    kernel_rmsnorm<<<rows, 256, 0, s>>>(out, x, w, C, eps, offset);
}

void cuda_add(float *x, const float *d, int64_t n, cudaStream_t s) {
    kernel_add<<<grid_for(n, 256), 256, 0, s>>>(x, d, n);
}

void cuda_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim, const float *inv_freq,
               float mscale, bool neox, cudaStream_t s) {
    int half = rot_dim / 2;
    if (half <= 0) return;
    kernel_rope<<<dim3(n_heads, T), half, 0, s>>>(x, pos, n_heads, head_dim, half, inv_freq, mscale, neox);
}

void cuda_kv_write(float *kc, float *vc, const int64_t *slot, const float *k, const float *v, int T, int kw, int vw,
                   cudaStream_t s) {
    kernel_kv_write<<<T, 256, 0, s>>>(kc, vc, slot, k, v, kw, vw);
}

void cuda_attention(float *out, const float *q, const float *kc, const float *vc, const DevAttnBatch *b,
                    const AttnParams *p, const float *sinks, cudaStream_t s) {
    size_t shm = (p->head_dim_k + ATT_TILE + p->head_dim_v + 32) * sizeof(float);
    kernel_attention<<<dim3(b->n_tokens, p->n_heads), ATT_TILE, shm, s>>>(out, q, kc, vc, *b, *p, sinks);
}

void cuda_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit, cudaStream_t s) {
    kernel_glu<<<grid_for(n, 256), 256, 0, s>>>(out, gate, up, n, act, limit);
}

void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s) {
    kernel_softcap<<<grid_for(n, 256), 256, 0, s>>>(x, n, cap);
}

void cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int C, cudaStream_t s) {
    if (n > 0) kernel_gather_rows<<<dim3(grid_for(C, 256), n), 256, 0, s>>>(dst, src, rows, C);
}

void cuda_scatter_add(float *out, const float *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s) {
    if (n > 0) kernel_scatter_add<<<dim3(grid_for(C, 256), n), 256, 0, s>>>(out, src, rows, w, C);
}
