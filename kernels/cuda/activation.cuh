/* activation.cuh — the gated activations of kernels/activation.h on the
 * device, as the CPU's cpu_glu computes them on one fp32 (gate, up) pair. */
#ifndef CLLM_ACTIVATION_CUH
#define CLLM_ACTIVATION_CUH

#include <math.h>

#include "kernels/activation.h"

/* The gated activations of cpu_glu, on one fp32 pair. */
static __device__ __forceinline__ float act_glu(float g, float u, Activation act, float limit) {
    if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    if (act == ACT_SWIGLU_OAI) {
        if (limit > 0) { g = fminf(g, limit); u = fminf(fmaxf(u, -limit), limit); }
        return (u + 1.0f) * g / (1.0f + expf(-1.702f * g));
    }
    return g / (1.0f + expf(-g)) * u;
}

#endif
