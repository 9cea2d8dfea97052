/* norm.c — RMSNorm (and the fused residual add + RMSNorm), residual add and
 * scale on fp32 rows. The sum of squares is accumulated in double, so the
 * reference is never the weak link when a kernel is compared with it. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

/* out = x / sqrt(mean(x^2) + eps) * (w + w_offset). Each out[i] is written
 * after x[i] is read, so out may equal x. w_offset is 1 for Gemma, whose
 * checkpoints store w - 1. */
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

