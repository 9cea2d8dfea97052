/* attention.c — the CPU reference attention over the paged KV cache, exactly
 * as DESIGN.md defines it:
 *
 *   s_j = scale * q.k_j;  s_j = cap * tanh(s_j / cap)      (soft-cap)
 *   keys j <= pos, and pos - j < window on windowed layers
 *   o = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m))
 *
 * One pass per (row, head) with an online softmax in double precision (the
 * reference must not be the weak link). Query head h reads KV head
 * h / (n_heads / n_kv_heads). Parallel over rows x heads. Head sizes up to
 * 1024 (the config rejects larger). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

typedef struct {
    float *out;
    const float *q;
    const KVCacheHost *c;
    int layer;
    const AttnBatch *b;
    const AttnParams *p;
} AttnJob;

/* Attention of one query row and head, one pass with an online softmax:
 * the running maximum m starts at the sink logit (so the sink counts in the
 * denominator) and the accumulator is rescaled whenever m grows. */
static void attend_one(const AttnJob *j, int row, int h) {
    const AttnParams *p = j->p;
    const AttnBatch *b = j->b;
    int pos = b->pos[row], kvh = h / (p->n_heads / p->n_kv_heads);
    int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    const float *q = j->q + ((int64_t)row * p->n_heads + h) * p->head_dim_k;
    const int32_t *table = b->block_tables[b->seq[row]];
    float *o = j->out + ((int64_t)row * p->n_heads + h) * p->head_dim_v;
    double acc[1024] = {0};
    double m = p->sinks ? p->sinks[h] : -INFINITY, denom = p->sinks ? 1.0 : 0.0;
    for (int k = first; k <= pos; k++) {
        int64_t slot = (int64_t)table[k / b->block_size] * b->block_size + k % b->block_size;
        const float *kv = kv_k_at(j->c, j->layer, slot, kvh), *v = kv_v_at(j->c, j->layer, slot, kvh);
        float s = 0;
        for (int d = 0; d < p->head_dim_k; d++) s += q[d] * kv[d];
        s *= p->scale;
        if (p->softcap > 0) s = p->softcap * tanhf(s / p->softcap);
        if (s > m) { /* rescale what was summed under the old maximum */
            double r = exp(m - s);
            denom *= r;
            for (int d = 0; d < p->head_dim_v; d++) acc[d] *= r;
            m = s;
        }
        double w = exp(s - m);
        denom += w;
        for (int d = 0; d < p->head_dim_v; d++) acc[d] += w * v[d];
    }
    for (int d = 0; d < p->head_dim_v; d++) o[d] = (float)(acc[d] / denom);
}

static void attend_range(void *ctx, int64_t i0, int64_t i1) {
    const AttnJob *j = ctx;
    for (int64_t i = i0; i < i1; i++) attend_one(j, (int)(i / j->p->n_heads), (int)(i % j->p->n_heads));
}

void cpu_attention(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                   const AttnBatch *batch, const AttnParams *p) {
    AttnJob j = {out, q, c, layer, batch, p};
    cpu_parallel_for(tp, (int64_t)batch->n_tokens * p->n_heads, attend_range, &j);
}

void cpu_kv_write(KVCacheHost *c, int layer, const AttnBatch *b, const float *k, const float *v) {
    int64_t kw = (int64_t)c->n_kv_heads * c->head_dim_k, vw = (int64_t)c->n_kv_heads * c->head_dim_v;
    for (int t = 0; t < b->n_tokens; t++) {
        memcpy(kv_k_at(c, layer, b->slot[t], 0), k + t * kw, kw * sizeof *k);
        memcpy(kv_v_at(c, layer, b->slot[t], 0), v + t * vw, vw * sizeof *v);
    }
}
