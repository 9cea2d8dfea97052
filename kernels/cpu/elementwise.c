/* elementwise.c — the CPU reference of the small ops: RMSNorm (and the fused
 * residual add + norm), residual add, scale, rotary embedding, the gated
 * activations, soft-cap and softmax. Plain loops, fp32 (norm sums in double
 * so the reference is not the weak link). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_rmsnorm(float *out, const float *x, const float *w, int T, int C, float eps, float w_offset) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (int64_t)t * C;
        float *o = out + (int64_t)t * C;
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / C + eps));
        for (int i = 0; i < C; i++) o[i] = xr[i] * inv * (w[i] + w_offset);
    }
}

void cpu_add_rmsnorm(float *x, const float *delta, float *out, const float *w, int T, int C, float eps,
                     float w_offset) {
    cpu_add(x, delta, (int64_t)T * C);
    cpu_rmsnorm(out, x, w, T, C, eps, w_offset);
}

void cpu_add(float *x, const float *delta, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += delta[i];
}

void cpu_scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void cpu_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim, const float *inv_freq,
              float mscale, bool neox) {
    int half = rot_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i];
            float c = cosf(angle) * mscale, s = sinf(angle) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((int64_t)t * n_heads + h) * head_dim;
                int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

void cpu_glu(float *out, const float *gate, const float *up, int64_t n, Activation act, float limit) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], a;
        switch (act) {
        case ACT_GELU_TANH: a = gelu_tanh(g) * u; break;
        case ACT_SWIGLU_OAI:
            if (limit > 0) {
                g = fminf(g, limit);
                u = fminf(fmaxf(u, -limit), limit);
            }
            a = (u + 1.0f) * g / (1.0f + expf(-1.702f * g));
            break;
        default: a = g / (1.0f + expf(-g)) * u; break;
        }
        out[i] = a;
    }
}

void cpu_softcap(float *x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void cpu_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = fmaxf(m, x[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sum);
}
