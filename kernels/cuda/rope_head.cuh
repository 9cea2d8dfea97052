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

/* The head's rmsnorm in buf (w != NULL), rounded to bf16 as a separate op
 * would store it. Each lane reads and writes its own elements. */
static __device__ __forceinline__ void warp_head_norm(float *buf, int hd, const float *w, float eps, float offset) {
    const int lane = threadIdx.x % 32;
    if (!w) return;
    float ss = 0;
    for (int i = lane; i < hd; i += 32) ss += buf[i] * buf[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = rsqrtf(ss / hd + eps);
    for (int i = lane; i < hd; i += 32) buf[i] = __bfloat162float(__float2bfloat16(buf[i] * inv * (w[i] + offset)));
}

/* Pair i rotated by (c, s) (already scaled by mscale), each value rounded to bf16. */
static __device__ __forceinline__ void rope_pair(float *buf, int i, float c, float s, const RopeFreqs &f) {
    int ia = f.neox ? i : 2 * i, ib = f.neox ? i + f.half : 2 * i + 1;
    float x0 = buf[ia], x1 = buf[ib];
    buf[ia] = __bfloat162float(__float2bfloat16(x0 * c - x1 * s));
    buf[ib] = __bfloat162float(__float2bfloat16(x0 * s + x1 * c));
}

/* buf [hd]: bf16 values in, bf16 values out (held as fp32). w != NULL: the
 * head's rmsnorm first; then each rotated value rounded to bf16. Every lane
 * of the warp calls it. */
static __device__ __forceinline__ void warp_norm_rope(float *buf, int hd, const float *w, float eps, float offset,
                                                      float pos, const RopeFreqs &f) {
    warp_head_norm(buf, hd, w, eps, offset);
    __syncwarp(); /* a pair's two values come from different lanes */
    for (int i = threadIdx.x % 32; i < f.half; i += 32) {
        float s, c;
        sincosf(pos * f.inv_freq[i], &s, &c);
        rope_pair(buf, i, c * f.mscale, s * f.mscale, f);
    }
    __syncwarp();
}

/* A lane's cos and sin (times mscale) for pairs lane + 32 j, j < 4 (half <=
 * 128: head sizes up to 256), computed once per position: the decode
 * attention kernel does it before pdl_wait (they depend on the position
 * alone), so the inv_freq loads and sincosf are off its critical path. */
#define ROPE_LANE_PAIRS 4
typedef struct {
    float c[ROPE_LANE_PAIRS], s[ROPE_LANE_PAIRS];
} RopeLaneCS;

static __device__ __forceinline__ RopeLaneCS rope_lane_cs(float pos, const RopeFreqs &f) {
    RopeLaneCS r;
#pragma unroll
    for (int j = 0; j < ROPE_LANE_PAIRS; j++) {
        const int i = threadIdx.x % 32 + 32 * j;
        float s = 0.f, c = 0.f;
        if (i < f.half) sincosf(pos * f.inv_freq[i], &s, &c);
        r.c[j] = c * f.mscale, r.s[j] = s * f.mscale;
    }
    return r;
}

/* warp_norm_rope with the lane's cos and sin from rope_lane_cs: the same
 * operations, so the same bits. */
static __device__ __forceinline__ void warp_norm_rope_cs(float *buf, int hd, const float *w, float eps, float offset,
                                                         const RopeLaneCS &cs, const RopeFreqs &f) {
    warp_head_norm(buf, hd, w, eps, offset);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < ROPE_LANE_PAIRS; j++) {
        const int i = threadIdx.x % 32 + 32 * j;
        if (i < f.half) rope_pair(buf, i, cs.c[j], cs.s[j], f);
    }
    __syncwarp();
}

#endif
