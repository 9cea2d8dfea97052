/* rope.c — rotary position embedding, in place on [T][n_heads][head_dim].
 *
 * Channel pair i (i < rot_dim / 2) of every head turns by angle pos * inv_freq[i]:
 *   neox (HF rotate_half):  (x[i], x[i + rot_dim/2])
 *   interleaved (GPT-J):    (x[2i], x[2i + 1])
 *   (a, b) -> (a cos - b sin, a sin + b cos), with cos and sin times mscale (yarn).
 * Channels from rot_dim on are left alone (partial rotary). The angle is the
 * fp32 product, as transformers forms it, so long positions round the same
 * way; cos and sin are computed once per (token, pair) and shared by all heads.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

void cpu_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim, const float *inv_freq,
              float mscale, bool neox) {
    int half = rot_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i];
            float c = cosf(angle) * mscale, s = sinf(angle) * mscale;
            int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((int64_t)t * n_heads + h) * head_dim;
                float a = v[ia], b = v[ib];
                v[ia] = a * c - b * s;
                v[ib] = a * s + b * c;
            }
        }
    }
}
