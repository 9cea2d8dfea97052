/* rope_kv.cu — qk-norm, rope and the cache write by slot (rope_kv.cuh). */
#include "kernels/cuda/rope_kv.cuh"

#include "kernels/cuda/attention_common.cuh" /* warp_quantize_fp8 */
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope_head.cuh"

#define RKV_WARPS 8 /* head vectors per block of kernel_rope_kv_write */

/* A warp per head vector of row t (blockIdx.x): the q heads, then the k
 * heads, then the v heads (grid.y covers them RKV_WARPS at a time). A q or
 * k head goes to the warp's shared buffer, gets its qk-norm (rounded to
 * bf16, as a separate op would store it) and rope there, and is written
 * back; a k head, and a v head as is, also goes to the cache slot (fp8: a
 * warp quantizes the head vector). Why a warp per head and not a block per
 * row: at decode a row's ~50 head vectors were one block's chain of
 * dependent loads, the longest launch of a decode step. */
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


void cuda_rope_kv_write(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, const DevAttnBatch *b, int n_heads,
                        int n_kv_heads, int head_dim_k, int head_dim_v, int rot_dim, const float *inv_freq,
                        float mscale, bool neox, int64_t n_slots, const QkNorm *qk, cudaStream_t s) {
    if (b->n_tokens <= 0) return;
    dim3 grid(b->n_tokens, (n_heads + 2 * n_kv_heads + RKV_WARPS - 1) / RKV_WARPS);
    launch_pdl(kernel_rope_kv_write, grid, RKV_WARPS * 32, RKV_WARPS * head_dim_k * sizeof(float), s,
        q, k, v, *kv, *b, n_heads, n_kv_heads, head_dim_k, head_dim_v, rot_dim / 2, inv_freq, mscale, neox, n_slots,
        *qk);
}
