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
 *
 * Cascade (kernels/attn_cascade.h): with a plan, the shared prefix of each
 * group is attended first, unit by unit (a unit: some member rows and the
 * query heads of one KV head, the prefix's keys in the outer loop), keeping
 * per (row, head) the running max, sum and numerator; then each row attends
 * to its own keys as above and merges the prefix's partial result.
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
    const AttnCascadePlan *plan; /* NULL: every row attends to all its keys itself */
    const int32_t *member;       /* [T] a grouped row's index among the plan's rows, -1: none */
    float *part;                 /* [members][n_heads][2 + head_dim_v]: max, sum, numerator over the shared prefix */
    const int32_t *units;        /* [n_units][3]: group, KV head, first member of the shared pass's units */
} AttnJob;

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float score(const AttnParams *p, const float *q, const float *key) {
    float s = p->scale * dot(q, key, p->head_dim_k);
    return p->softcap > 0 ? p->softcap * tanhf(s / p->softcap) : s;
}

/* One logit s with value vector val into a running softmax: *m the maximum,
 * *denom the sum of exp(logit - m), o the numerator. A new maximum rescales
 * what was summed under the old one. */
static void softmax_add(float *m, float *denom, float *o, int dv, float s, const float *val) {
    if (s > *m) {
        float r = expf(*m - s); /* 0 when m was -inf */
        *denom *= r;
        for (int d = 0; d < dv; d++) o[d] *= r;
        *m = s;
    }
    float e = expf(s - *m);
    *denom += e;
    for (int d = 0; d < dv; d++) o[d] += e * val[d];
}

static int64_t slot_of(const AttnBatch *b, const int32_t *table, int k) {
    return (int64_t)table[k / b->block_size] * b->block_size + k % b->block_size;
}

/* Attention of one query row and one head; the output vector doubles as the
 * running numerator. A grouped row attends to its own keys (from its suffix
 * start) and merges the shared prefix's partial result, both scaled to their
 * common maximum: log-sum-exp. kbuf, vbuf: room for one dequantized fp8 key
 * / value. */
static void attend_one(const AttnJob *j, int row, int h, float *kbuf, float *vbuf) {
    const AttnParams *p = j->p;
    const AttnBatch *b = j->b;
    int pos = b->pos[row], dv = p->head_dim_v;
    int kv_head = h / (p->n_heads / p->n_kv_heads);
    int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    int member = j->member ? j->member[row] : -1;
    if (member >= 0) first = j->plan->suffix_start[row]; /* the plan grouped it: its window starts at key 0 */
    const float *q = j->q + ((int64_t)row * p->n_heads + h) * p->head_dim_k;
    const int32_t *table = b->block_tables[b->seq[row]];
    float *o = j->out + ((int64_t)row * p->n_heads + h) * dv;
    memset(o, 0, (size_t)dv * sizeof *o);

    float m = -INFINITY, denom = 0.0f;
    if (p->sinks) { /* the sink: a logit with a zero value vector, counted once (here, not in the shared pass) */
        m = p->sinks[h];
        denom = 1.0f; /* exp(sink - m) with m = sink */
    }
    for (int k = first; k <= pos; k++) {
        int64_t slot = slot_of(b, table, k);
        softmax_add(&m, &denom, o, dv, score(p, q, kv_key(j->c, j->layer, slot, kv_head, kbuf)),
                    kv_value(j->c, j->layer, slot, kv_head, vbuf));
    }
    if (member >= 0) {
        const float *pt = j->part + ((int64_t)member * p->n_heads + h) * (2 + dv);
        float mm = m > pt[0] ? m : pt[0];
        float a = expf(m - mm), c = expf(pt[0] - mm);
        denom = denom * a + pt[1] * c;
        for (int d = 0; d < dv; d++) o[d] = o[d] * a + pt[2 + d] * c;
    }
    if (denom > 0)
        for (int d = 0; d < dv; d++) o[d] /= denom;
}

/* Room for one dequantized key and value when the cache is fp8, else NULL. */
static float *kv_buf(const AttnJob *j) {
    if (j->c->dtype != KV_DTYPE_FP8) return NULL;
    float *buf = malloc(((size_t)j->p->head_dim_k + j->p->head_dim_v) * sizeof *buf);
    if (!buf) abort(); /* a few KB: the host is out of memory */
    return buf;
}

static void attend_range(void *ctx, int64_t i0, int64_t i1) {
    const AttnJob *j = ctx;
    float *buf = kv_buf(j);
    for (int64_t i = i0; i < i1; i++)
        attend_one(j, (int)(i / j->p->n_heads), (int)(i % j->p->n_heads), buf, buf ? buf + j->p->head_dim_k : NULL);
    free(buf);
}

/* One unit of the shared pass: up to CPU_CASCADE_UNIT_ROWS member rows of a
 * group and the query heads of one KV head, the prefix's keys in the outer
 * loop, so each key and value is read once for all of them. */
static void shared_unit(const AttnJob *j, const int32_t *unit, float *kbuf, float *vbuf) {
    const AttnParams *p = j->p;
    const AttnBatch *b = j->b;
    const AttnCascadeGroup *g = &j->plan->groups[unit[0]];
    int kv_head = unit[1], q_per_kv = p->n_heads / p->n_kv_heads, dv = p->head_dim_v;
    int i0 = g->row0 + unit[2], i1 = i0 + CPU_CASCADE_UNIT_ROWS < g->row0 + g->n_rows ? i0 + CPU_CASCADE_UNIT_ROWS : g->row0 + g->n_rows;
    int h0 = kv_head * q_per_kv, h1 = h0 + q_per_kv;
    for (int i = i0; i < i1; i++)
        for (int h = h0; h < h1; h++) {
            float *pt = j->part + ((int64_t)i * p->n_heads + h) * (2 + dv);
            pt[0] = -INFINITY, pt[1] = 0;
            memset(pt + 2, 0, (size_t)dv * sizeof *pt);
        }
    for (int k = 0; k < g->n_blocks * b->block_size; k++) {
        int64_t slot = slot_of(b, g->blocks, k);
        const float *key = kv_key(j->c, j->layer, slot, kv_head, kbuf);
        const float *val = kv_value(j->c, j->layer, slot, kv_head, vbuf);
        for (int i = i0; i < i1; i++) {
            int row = j->plan->rows[i];
            for (int h = h0; h < h1; h++) {
                float *pt = j->part + ((int64_t)i * p->n_heads + h) * (2 + dv);
                softmax_add(&pt[0], &pt[1], pt + 2, dv, score(p, j->q + ((int64_t)row * p->n_heads + h) * p->head_dim_k, key), val);
            }
        }
    }
}

static void shared_range(void *ctx, int64_t u0, int64_t u1) {
    const AttnJob *j = ctx;
    float *buf = kv_buf(j);
    for (int64_t u = u0; u < u1; u++) shared_unit(j, j->units + 3 * u, buf, buf ? buf + j->p->head_dim_k : NULL);
    free(buf);
}

/* The shared pass's units, and each grouped row's member index. 0, or -1
 * when out of memory (the caller then attends without the plan). */
static int cascade_prepare(AttnJob *j, int32_t **units, int64_t *n_units, int32_t **member, float **part) {
    const AttnCascadePlan *pl = j->plan;
    int n_members = 0;
    *n_units = 0;
    for (int g = 0; g < pl->n_groups; g++) {
        n_members += pl->groups[g].n_rows;
        *n_units += (int64_t)j->p->n_kv_heads * ((pl->groups[g].n_rows + CPU_CASCADE_UNIT_ROWS - 1) / CPU_CASCADE_UNIT_ROWS);
    }
    *units = malloc((size_t)(*n_units ? *n_units : 1) * 3 * sizeof **units);
    *member = malloc((size_t)(j->b->n_tokens ? j->b->n_tokens : 1) * sizeof **member);
    *part = malloc((size_t)(n_members ? n_members : 1) * j->p->n_heads * (2 + j->p->head_dim_v) * sizeof **part);
    if (!*units || !*member || !*part) return -1;
    int32_t *u = *units;
    for (int g = 0; g < pl->n_groups; g++)
        for (int kh = 0; kh < j->p->n_kv_heads; kh++)
            for (int r = 0; r < pl->groups[g].n_rows; r += CPU_CASCADE_UNIT_ROWS, u += 3) u[0] = g, u[1] = kh, u[2] = r;
    for (int t = 0; t < j->b->n_tokens; t++) (*member)[t] = -1;
    for (int i = 0; i < n_members; i++) (*member)[pl->rows[i]] = i;
    return 0;
}

void cpu_attention_cascade(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                           const AttnBatch *batch, const AttnParams *p, const AttnCascadePlan *plan) {
    AttnJob j = {out, q, c, layer, batch, p, NULL, NULL, NULL, NULL};
    int32_t *units = NULL, *member = NULL;
    float *part = NULL;
    int64_t n_units = 0;
    if (plan && plan->n_groups > 0 && plan->n_tokens == batch->n_tokens) {
        j.plan = plan;
        if (cascade_prepare(&j, &units, &n_units, &member, &part) == 0) {
            j.units = units, j.member = member, j.part = part;
            cpu_parallel_for(tp, n_units, shared_range, &j);
        } else {
            j.plan = NULL; /* out of memory for the partial sums: the plain path gives the same result */
        }
    }
    cpu_parallel_for(tp, (int64_t)batch->n_tokens * p->n_heads, attend_range, &j);
    free(units);
    free(member);
    free(part);
}

void cpu_attention(ThreadPool *tp, float *out, const float *q, const KVCacheHost *c, int layer,
                   const AttnBatch *batch, const AttnParams *p) {
    cpu_attention_cascade(tp, out, q, c, layer, batch, p, NULL);
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
