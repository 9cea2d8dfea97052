/* attention.c — the CPU reference attention over the paged KV cache, and the
 * cache write. Exactly DESIGN.md's definition, for query row i at position p:
 *
 *   s_j = scale * (q . k_j)                       for j in [first, p]
 *   s_j = cap * tanh(s_j / cap)                   (soft-cap, cap > 0)
 *   first = max(0, p - window + 1) on windowed layers, else 0
 *   o   = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
 *
 * Query head h reads KV head h / (n_heads / n_kv_heads) (GQA / MQA). Key j is
 * at slot block_table[j / block_size] * block_size + j % block_size of the
 * row's sequence. Each (row, head) is one pass with an online softmax in fp32:
 * m is the running maximum of every logit seen so far, the sink included, and
 * whatever was summed under an older, smaller m is rescaled by exp(m_old - m)
 * when m grows. The sink starts the pass as a logit with a zero value vector,
 * so it counts in the denominator only, under the same max subtraction, and a
 * sink larger than every score cannot overflow exp. Work is spread over
 * rows x heads. An fp8 cache is read through kv_key / kv_value: each key and
 * value dequantized to fp32 (code x scale) before it is used, so the math
 * is the fp32 path's on the values the cache holds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

typedef struct {
    float *out;                  /* [T][n_heads][head_dim_v] */
    const float *q;              /* [T][n_heads][head_dim_k] */
    const KVCacheHost *c;
    int layer;
    const AttnBatch *b;
    const AttnParams *p;
} AttnJob;

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Attention of one query row and one head; the output vector doubles as the
 * running numerator. kbuf, vbuf: room for one dequantized fp8 key / value. */
static void attend_one(const AttnJob *j, int row, int h, float *kbuf, float *vbuf) {
    const AttnParams *p = j->p;
    const AttnBatch *b = j->b;
    int pos = b->pos[row];
    int kv_head = h / (p->n_heads / p->n_kv_heads);
    int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    const float *q = j->q + ((int64_t)row * p->n_heads + h) * p->head_dim_k;
    const int32_t *table = b->block_tables[b->seq[row]];
    float *o = j->out + ((int64_t)row * p->n_heads + h) * p->head_dim_v;
    memset(o, 0, (size_t)p->head_dim_v * sizeof *o);

    float m = -INFINITY, denom = 0.0f; /* running max, sum of exp(logit - m) */
    if (p->sinks) {
        m = p->sinks[h];
        denom = 1.0f; /* exp(sink - m) with m = sink */
    }
    for (int k = first; k <= pos; k++) {
        int64_t slot = (int64_t)table[k / b->block_size] * b->block_size + k % b->block_size;
        const float *key = kv_key(j->c, j->layer, slot, kv_head, kbuf);
        const float *val = kv_value(j->c, j->layer, slot, kv_head, vbuf);
        float s = p->scale * dot(q, key, p->head_dim_k);
        if (p->softcap > 0) s = p->softcap * tanhf(s / p->softcap);
        if (s > m) { /* new maximum: rescale what was summed under the old one */
            float r = expf(m - s); /* 0 when m was -inf */
            denom *= r;
            for (int d = 0; d < p->head_dim_v; d++) o[d] *= r;
            m = s;
        }
        float e = expf(s - m);
        denom += e;
        for (int d = 0; d < p->head_dim_v; d++) o[d] += e * val[d];
    }
    if (denom > 0)
        for (int d = 0; d < p->head_dim_v; d++) o[d] /= denom;
}

static void attend_range(void *ctx, int64_t i0, int64_t i1) {
    const AttnJob *j = ctx;
    float *buf = NULL;
    if (j->c->dtype == KV_DTYPE_FP8) {
        buf = malloc(((size_t)j->p->head_dim_k + j->p->head_dim_v) * sizeof *buf);
        if (!buf) abort(); /* a few KB: the host is out of memory */
    }
    for (int64_t i = i0; i < i1; i++)
        attend_one(j, (int)(i / j->p->n_heads), (int)(i % j->p->n_heads), buf, buf ? buf + j->p->head_dim_k : NULL);
    free(buf);
}

void cpu_attention(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                   const AttnBatch *batch, const AttnParams *p) {
    AttnJob j = {out, q, c, layer, batch, p};
    cpu_parallel_for(tp, (int64_t)batch->n_tokens * p->n_heads, attend_range, &j);
}

/* A slot outside the cache (a negative slot can mark a padding row) is
 * skipped: never a write out of bounds. */
void cpu_kv_write(KVCacheHost *c, int layer, const AttnBatch *b, const float *k, const float *v) {
    int64_t k_row = (int64_t)c->n_kv_heads * c->head_dim_k, v_row = (int64_t)c->n_kv_heads * c->head_dim_v;
    int64_t n_slots = (int64_t)c->n_blocks * c->block_size;
    for (int t = 0; t < b->n_tokens; t++) {
        int64_t slot = b->slot[t];
        if (slot < 0 || slot >= n_slots) continue;
        kv_cache_store(c, layer, slot, k + t * k_row, v + t * v_row);
    }
}

/* Per head h: max |x| over the written rows' [h] vectors of width w. */
static void head_amax(const KVCacheHost *c, const AttnBatch *b, const float *x, int w, float *amax) {
    int64_t n_slots = (int64_t)c->n_blocks * c->block_size;
    for (int h = 0; h < c->n_kv_heads; h++) amax[h] = 0.0f;
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= n_slots) continue;
        for (int h = 0; h < c->n_kv_heads; h++) {
            const float *r = x + ((int64_t)t * c->n_kv_heads + h) * w;
            for (int i = 0; i < w; i++) amax[h] = fabsf(r[i]) > amax[h] ? fabsf(r[i]) : amax[h]; /* a nan: ignored */
        }
    }
}

bool cpu_kv_calibrate(KVCacheHost *c, int layer, const AttnBatch *b, const float *k, const float *v) {
    int64_t n_slots = (int64_t)c->n_blocks * c->block_size;
    bool any = false;
    for (int t = 0; t < b->n_tokens; t++) any |= b->slot[t] >= 0 && b->slot[t] < n_slots;
    if (!any || !c->k_fixed) return false;
    float *ks = c->k_fixed + (int64_t)layer * c->n_kv_heads, *vs = c->v_fixed + (int64_t)layer * c->n_kv_heads;
    head_amax(c, b, k, c->head_dim_k, ks);
    head_amax(c, b, v, c->head_dim_v, vs);
    for (int h = 0; h < c->n_kv_heads; h++) {
        ks[h] = fp8_scale_of_amax(ks[h]);
        vs[h] = fp8_scale_of_amax(vs[h]);
    }
    return true;
}
