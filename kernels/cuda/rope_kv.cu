/* rope_kv.cu — qk-norm, rope and the cache write by slot (rope_kv.cuh). */
#include "kernels/cuda/rope_kv.cuh"

#include <float.h>

#include "kernels/cuda/attention_common.cuh" /* warp_quantize_fp8 */
#include "kernels/cuda/block_reduce.cuh"
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
        if (store && fp8)
            warp_quantize_fp8(src, hdv, (uint8_t *)kv.v + at * hdv, kv.v_scale + at, kv.v_fixed ? kv.v_fixed + hv : nullptr);
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
        warp_quantize_fp8(x, hd, (uint8_t *)kv.k + at * hd, kv.k_scale + at, kv.k_fixed ? kv.k_fixed + hk : nullptr);
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

/* --kv-scales calibrate: block (h, K|V) takes max |x| over head h of the
 * rows that have a slot, scale = fp8_scale_of_amax (a nan is ignored by
 * fmaxf, as by the host's comparison). */
__global__ void kernel_kv_calibrate(const bf16 *k, const bf16 *v, const int64_t *slot, int T, int64_t n_slots,
                                    int n_kv_heads, int hd, int hdv, float *scales) {
    __shared__ float red[32];
    const int h = blockIdx.x, is_v = blockIdx.y, w = is_v ? hdv : hd;
    const bf16 *x = is_v ? v : k;
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < (int64_t)T * w; i += blockDim.x) {
        const int t = (int)(i / w);
        if (slot[t] < 0 || slot[t] >= n_slots) continue;
        amax = fmaxf(amax, fabsf(__bfloat162float(x[((int64_t)t * n_kv_heads + h) * w + i % w])));
    }
    amax = block_max(amax, red);
    if (threadIdx.x == 0)
        scales[is_v * n_kv_heads + h] = amax > 0.0f && amax <= FLT_MAX ? __fdiv_rn(amax, 448.0f) : 1.0f;
}

/* A warp per head vector of row t (blockIdx.x), K heads then V heads: to
 * the cache with the layer's static scales (kernel_rope_kv_write's store,
 * without the rope: k is roped already). */
__global__ void kernel_kv_store(const bf16 *k, const bf16 *v, KVLayerDev kv, const int64_t *slot, int n_kv_heads,
                                int hd, int hdv, int64_t n_slots) {
    const int t = blockIdx.x, warp = threadIdx.x / 32, h = blockIdx.y * RKV_WARPS + warp;
    if (h >= 2 * n_kv_heads) return;
    const int64_t s = slot[t];
    if (s < 0 || s >= n_slots) return;
    const bool is_v = h >= n_kv_heads;
    const int hh = is_v ? h - n_kv_heads : h, w = is_v ? hdv : hd;
    const bf16 *src = (is_v ? v : k) + ((int64_t)t * n_kv_heads + hh) * w;
    const int64_t at = s * n_kv_heads + hh;
    const float *fixed = is_v ? kv.v_fixed : kv.k_fixed;
    warp_quantize_fp8(src, w, (uint8_t *)(is_v ? kv.v : kv.k) + at * w, (is_v ? kv.v_scale : kv.k_scale) + at,
                      fixed ? fixed + hh : nullptr);
}

void cuda_rope_kv_calibrate(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, float *scales,
                            const DevAttnBatch *b, int n_heads, int n_kv_heads, int head_dim_k, int head_dim_v,
                            int rot_dim, const float *inv_freq, float mscale, bool neox, int64_t n_slots,
                            const QkNorm *qk, cudaStream_t s) {
    if (b->n_tokens <= 0) return;
    /* n_slots 0: qk-norm and rope in place, nothing stored yet */
    cuda_rope_kv_write(q, k, v, kv, b, n_heads, n_kv_heads, head_dim_k, head_dim_v, rot_dim, inv_freq, mscale, neox,
                       0, qk, s);
    kernel_kv_calibrate<<<dim3(n_kv_heads, 2), 256, 0, s>>>(k, v, b->slot, b->n_tokens, n_slots, n_kv_heads,
                                                            head_dim_k, head_dim_v, scales);
    KVLayerDev fixed = *kv;
    fixed.k_fixed = scales, fixed.v_fixed = scales + n_kv_heads;
    dim3 grid(b->n_tokens, (2 * n_kv_heads + RKV_WARPS - 1) / RKV_WARPS);
    kernel_kv_store<<<grid, RKV_WARPS * 32, 0, s>>>(k, v, fixed, b->slot, n_kv_heads, head_dim_k, head_dim_v,
                                                    n_slots);
}
