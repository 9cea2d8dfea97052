/* attention_generic.cu — the simple, obviously-correct attention kernel
 * over the paged cache: one block per (query row, head), keys in tiles of
 * 128 with an online softmax. The backend runs the FlashAttention-style
 * kernels (attention_prefill.cu, attention_decode.cu) wherever they have the
 * head sizes and block size, and this one elsewhere; it mirrors
 * kernels/cpu/attention.c. */
#include <math.h>

#include <cuda_fp8.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/pdl.cuh"

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

extern "C" void cuda_attention_generic(void *out, const void *q, const KVLayerDev *kv, const DevAttnBatch *b, const AttnParams *p,
                            cudaStream_t s) {
    size_t shm = (p->head_dim_k + ATT_TILE + p->head_dim_v + 32) * sizeof(float);
    launch_pdl(kernel_attention, dim3(b->n_tokens, p->n_heads), ATT_TILE, shm, s, (bf16 *)out, (const bf16 *)q, *kv, *b,
               *p);
}
