/* round_x8.cuh — x rounded to two int8 terms (kernels/quant_mma.h:
 * qm_i8_split) by a warp, 8 values a lane: the lanes 4g .. 4g + 3 hold one
 * group of 32 and agree on its max by two shuffles. Shared by the int8
 * GEMVs (quant_gemv_mma.cu version 4, quant_gemv_x8.cu version 5). */
#ifndef CLLM_ROUND_X8_CUH
#define CLLM_ROUND_X8_CUH

#include <stdint.h>

#include "kernels/quant_mma.h"

/* w: the lane's 8 bf16 values (4 words, in order); q1, q2: their terms;
 * *dx: the group's scale; returns the group's sum of 128 q1 + q2. Every lane
 * of the warp must call it (lanes out of range pass zeros). */
static __device__ __forceinline__ int x8_round_lane8(const uint32_t w[4], int q1[8], int q2[8], float *dx) {
    float v[8], amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float inv = qm_i8_inv(amax);
    *dx = qm_i8_scale(amax);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) qm_i8_split(v[i], inv, *dx, &q1[i], &q2[i]), s += 128 * q1[i] + q2[i];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return s;
}

#endif
