/* activation.c — the gated MLP activations, soft-cap and softmax, elementwise
 * in fp32. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); } /* exp overflow gives 0: the right limit */

/* GELU, tanh approximation: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3).
 * Evaluated as x * sigmoid(2z), the same function: 1 + tanh(z) cancels to
 * nothing for negative x in fp32, the sigmoid keeps its relative precision. */
static float gelu_tanh(float x) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    float z = sqrt_2_over_pi * (x + 0.044715f * x * x * x);
    return x * sigmoid(2.0f * z);
}

/* gpt-oss: the gate is clamped from above only, up on both sides, and up
 * carries a +1; limit <= 0 turns the clamps off. */
static float swiglu_oai(float g, float u, float limit) {
    const float alpha = 1.702f;
    if (limit > 0) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return (u + 1.0f) * g * sigmoid(alpha * g);
}

void cpu_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i];
        switch (act) {
        case ACT_GELU_TANH: out[i] = gelu_tanh(g) * u; break;
        case ACT_SWIGLU_OAI: out[i] = swiglu_oai(g, u, limit); break;
        case ACT_SILU:
        default: out[i] = g * sigmoid(g) * u; break;
        }
    }
}

void cpu_softcap(float *x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

/* Max-subtracted, so no exp overflows (and not all underflow) whatever the
 * logits' magnitude; the sum is kept in double. */
void cpu_softmax(float *x, int n) {
    if (n <= 0) return;
    float m = x[0];
    for (int i = 1; i < n; i++) m = fmaxf(m, x[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sum);
}
