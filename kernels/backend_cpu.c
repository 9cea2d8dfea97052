/* backend_cpu.c — the CPU backend: the Backend ops of kernels/backend.h on
 * host fp32 buffers, implemented by the reference ops of kernels/cpu/. Weights
 * are read in the model file's own dtype (cpu_matmul dequantizes a row at a
 * time). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

typedef struct {
    ThreadPool *tp;
    KVCacheHost kv;
    float *moe_scratch;       /* routed rows, per-expert gate/up/out */
    int64_t moe_scratch_elems;
} CpuBackend;

static CpuBackend *cpu(Backend *be) { return be->ctx; }

static CpuMatrix cpu_matrix(const WeightRef *w, int mat) {
    return (CpuMatrix){(const char *)w->data + (uint64_t)mat * w->rows * w->row_bytes, w->type, w->rows, w->cols,
                       w->row_bytes};
}

static void *cpu_alloc(Backend *be, int64_t n) { return n > 0 ? calloc((size_t)n, sizeof(float)) : NULL; }
static void cpu_release(Backend *be, void *p) { free(p); }
static int cpu_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, Err *err) { return 0; }

static void cpu_be_embed(Backend *be, void *out, const WeightRef *table, const int32_t *ids, int T, float scale) {
    CpuMatrix m = cpu_matrix(table, 0);
    cpu_embed(out, &m, ids, T, scale);
}

static void cpu_be_matmul(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias,
                          int T) {
    CpuMatrix m = cpu_matrix(w, mat);
    const float *b = bias && bias->data ? (const float *)bias->data + (int64_t)mat * bias->cols : NULL;
    cpu_matmul(cpu(be)->tp, y, x, &m, b, T);
}

static void cpu_be_rmsnorm(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                           float offset) {
    cpu_rmsnorm(out, x, w->data, rows, C, eps, offset);
}

static void cpu_be_add(Backend *be, void *x, const void *d, int64_t n) { cpu_add(x, d, n); }

static void cpu_be_rope(Backend *be, void *x, const int32_t *pos, int T, int n_heads, int head_dim, int rot_dim,
                        const float *inv_freq, float mscale, bool neox) {
    cpu_rope(x, pos, T, n_heads, head_dim, rot_dim, inv_freq, mscale, neox);
}

static void cpu_be_kv_write(Backend *be, int layer, const AttnBatch *b, const void *k, const void *v) {
    cpu_kv_write(&cpu(be)->kv, layer, b, k, v);
}

static void cpu_be_attention(Backend *be, void *out, const void *q, int layer, const AttnBatch *b,
                             const AttnParams *p) {
    cpu_attention(cpu(be)->tp, out, q, &cpu(be)->kv, layer, b, p);
}

static void cpu_be_glu(Backend *be, void *out, const void *gate, const void *up, int64_t n, Activation act,
                       float limit) {
    cpu_glu(out, gate, up, n, act, limit);
}

static void cpu_be_softcap(Backend *be, void *x, int64_t n, float cap) { cpu_softcap(x, n, cap); }

static void cpu_be_gather_rows(Backend *be, void *dst, const void *src, const int32_t *rows, int n, int C) {
    for (int i = 0; i < n; i++)
        memmove((float *)dst + (int64_t)i * C, (const float *)src + (int64_t)rows[i] * C, C * sizeof(float));
}

static int cpu_be_read(Backend *be, float *host, const void *buf, int64_t n, Err *err) {
    memcpy(host, buf, n * sizeof(float));
    return 0;
}

/* Top-k of the router logits of one token, then a softmax over those k (as
 * gpt-oss routes). */
static void moe_route(const float *logits, int E, int k, int *ids, float *weights) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        ids[j] = best;
        weights[j] = logits[best];
    }
    cpu_softmax(weights, k);
}

/* Groups the tokens routed to each expert and runs that expert's MLP once
 * over its rows. Scratch: router [T][E], rows [T][C], gate/up [T][F], out [T][C]. */
static void cpu_be_moe(Backend *be, void *out_, const void *x_, const LayerWeights *lw, const ModelConfig *c, int T) {
    CpuBackend *cb = cpu(be);
    int E = c->n_experts, K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    int64_t need = (int64_t)T * (E + 2 * C + 2 * F + 2 * K) + T;
    if (need > cb->moe_scratch_elems) {
        free(cb->moe_scratch);
        cb->moe_scratch = malloc(need * sizeof(float));
        cb->moe_scratch_elems = cb->moe_scratch ? need : 0;
        if (!cb->moe_scratch) abort(); /* activations were sized at init; this is small */
    }
    float *router = cb->moe_scratch, *rows = router + (int64_t)T * E, *gate = rows + (int64_t)T * C;
    float *up = gate + (int64_t)T * F, *eout = up + (int64_t)T * F, *wts = eout + (int64_t)T * C;
    int *sel = (int *)(wts + (int64_t)T * K), *members = sel + (int64_t)T * K;
    const float *x = x_;
    float *out = out_;
    cpu_be_matmul(be, router, x, &lw->router, 0, &lw->router_bias, T);
    for (int t = 0; t < T; t++) moe_route(router + (int64_t)t * E, E, K, sel + (int64_t)t * K, wts + (int64_t)t * K);
    memset(out, 0, (size_t)T * C * sizeof(float));
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (sel[t * K + j] == e) {
                    members[n] = t * K + j;
                    memcpy(rows + (int64_t)n++ * C, x + (int64_t)t * C, C * sizeof(float));
                }
        if (n == 0) continue;
        cpu_be_matmul(be, gate, rows, &lw->w_gate, e, &lw->b_gate, n);
        cpu_be_matmul(be, up, rows, &lw->w_up, e, &lw->b_up, n);
        cpu_glu(gate, gate, up, (int64_t)n * F, c->act == ACT_KIND_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU,
                c->act_limit);
        cpu_be_matmul(be, eout, gate, &lw->w_down, e, &lw->b_down, n);
        for (int i = 0; i < n; i++) {
            int t = members[i] / K;
            float wgt = wts[members[i]];
            for (int ch = 0; ch < C; ch++) out[(int64_t)t * C + ch] += wgt * eout[(int64_t)i * C + ch];
        }
    }
}

static void cpu_destroy(Backend *be) {
    CpuBackend *cb = cpu(be);
    thread_pool_destroy(cb->tp);
    kv_cache_host_free(&cb->kv);
    free(cb->moe_scratch);
    free(cb);
    free(be);
}

Backend *backend_cpu_create(const ModelConfig *c, const ModelWeights *w, int n_threads, int block_size,
                            int n_blocks, Err *err) {
    Backend *be = calloc(1, sizeof *be);
    CpuBackend *cb = calloc(1, sizeof *cb);
    if (!be || !cb) { free(be); free(cb); err_set(err, "out of memory"); return NULL; }
    cb->tp = thread_pool_create(n_threads, err);
    if (!cb->tp || kv_cache_host_alloc(&cb->kv, c->n_layers, c->n_kv_heads, c->head_dim_k, c->head_dim_v,
                                       block_size, n_blocks, err)) {
        thread_pool_destroy(cb->tp);
        free(cb); free(be);
        return NULL;
    }
    *be = (Backend){
        .name = "cpu", .ctx = cb, .weights = w, .kv_block_size = block_size, .kv_n_blocks = n_blocks,
        .alloc = cpu_alloc, .release = cpu_release, .begin_step = cpu_begin_step, .embed = cpu_be_embed,
        .matmul = cpu_be_matmul, .rmsnorm = cpu_be_rmsnorm, .add = cpu_be_add, .rope = cpu_be_rope,
        .kv_write = cpu_be_kv_write, .attention = cpu_be_attention, .glu = cpu_be_glu, .moe = cpu_be_moe,
        .softcap = cpu_be_softcap, .gather_rows = cpu_be_gather_rows, .read = cpu_be_read, .destroy = cpu_destroy,
    };
    return be;
}
