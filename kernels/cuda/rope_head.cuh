/* rope_head.cuh — the qk-norm and rope of one head vector by one warp, in
 * the warp's fp32 buffer: shared by the rope + KV-write kernel (cuda_ops.cu)
 * and the decode attention kernel that does the same for its own rows
 * (attention_decode.cu), so both store the same bits. */
#ifndef CLLM_ROPE_HEAD_CUH
#define CLLM_ROPE_HEAD_CUH

#include <cuda_bf16.h>

/* The rotation of one position: pairs (i, i + half) (neox) or (2i, 2i + 1)
 * for i < half, angle pos * inv_freq[i], cos and sin scaled by mscale. */
typedef struct {
    const float *inv_freq;
    float mscale;
    int half;
    bool neox;
} RopeFreqs;

/* buf [hd]: bf16 values in, bf16 values out (held as fp32). w != NULL: the
 * head's rmsnorm first, rounded to bf16 as a separate op would store it;
 * then each rotated value rounded to bf16. Every lane of the warp calls it. */
static __device__ __forceinline__ void warp_norm_rope(float *buf, int hd, const float *w, float eps, float offset,
                                                      float pos, const RopeFreqs &f) {
    const int lane = threadIdx.x % 32;
    if (w) { /* each lane reads and writes its own elements: no sync needed before */
        float ss = 0;
        for (int i = lane; i < hd; i += 32) ss += buf[i] * buf[i];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float inv = rsqrtf(ss / hd + eps);
        for (int i = lane; i < hd; i += 32) buf[i] = __bfloat162float(__float2bfloat16(buf[i] * inv * (w[i] + offset)));
    }
    __syncwarp(); /* a pair's two values come from different lanes */
    for (int i = lane; i < f.half; i += 32) {
        float s, c;
        sincosf(pos * f.inv_freq[i], &s, &c);
        s *= f.mscale;
        c *= f.mscale;
        int ia = f.neox ? i : 2 * i, ib = f.neox ? i + f.half : 2 * i + 1;
        float x0 = buf[ia], x1 = buf[ib];
        buf[ia] = __bfloat162float(__float2bfloat16(x0 * c - x1 * s));
        buf[ib] = __bfloat162float(__float2bfloat16(x0 * s + x1 * c));
    }
    __syncwarp();
}

#endif
