/* test_cuda_ops.c — each op of the CUDA backend against the same op of the
 * CPU backend (the fp32 reference), through the Backend interface (run on a
 * GPU machine by tests/gpu/run.sh; never in CI).
 *
 * A synthetic two-layer model with random weights is given to both backends.
 * Weights and inputs are drawn at random and rounded to bf16 values first, so
 * both backends see the same numbers and the only differences are the GPU's
 * bf16 outputs and summation order. Each op gets fresh inputs, its GPU outputs
 * are poisoned with NaN before the run, and the check is
 * ||gpu - cpu|| / ||cpu|| <= 1e-2 (a NaN fails). Two shapes: odd sizes
 * (C = 4095, F = 1001: the scalar matrix-vector path, vocab 777) and aligned
 * ones (C = 512: the 16-byte path); rows 1..9 (matrix-vector kernels up to 8,
 * cuBLASLt from 9) and 33; two sequences in one step, scattered blocks.
 * The ops that fold (norm_qkv, norm_gate_up, matmul_add) against the CPU's
 * unfolded ones (check_fold_ops).
 * The fp8 cache's scale forms (--kv-scales dynamic, checkpoint, calibrate):
 * prefill then decode, the attention of both backends (check_kv_scales).
 * Last, timings (printed, never asserted): the matrix-vector kernel's
 * weight-read rate on Llama-8B-sized GEMMs, and decode tokens/s of a
 * synthetic 1.2B model with and without CUDA graphs (same logits required). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/backend_cpu.h"
#include "model/forward.h"
#include "model/shape.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/test.h"

#define TOL 1e-2
#define MAX_T 40
#define BLOCK 4
#define N_BLOCKS 64

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float *rand_vec(int64_t n, float scale, float offset) {
    float *v = malloc(n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = bf16_round(offset + scale * frand());
    return v;
}

typedef struct {
    ModelConfig c;
    ModelShape shape;            /* of c (rig_shape) */
    ModelWeights w;
    LayerWeights layers[2];
    float *mem[64];
    int n_mem;
    Backend *cpu, *gpu;
} Rig;

/* The backends' view of the rig's config, once its weights are set. */
static int rig_shape(Rig *r, Err *err) { return model_shape_build(&r->shape, &r->c, &r->w.rope_freqs, err); }

static WeightRef weight(Rig *r, int64_t rows, int64_t cols, float scale, float offset) {
    float *d = rand_vec(rows * cols, scale, offset);
    r->mem[r->n_mem++] = d;
    return (WeightRef){d, DT_F32, rows, cols, 1, (uint64_t)cols * sizeof(float), "synthetic", NULL, 0.0f, 0};
}

static WeightRef vec(Rig *r, int64_t n, float scale, float offset) { return weight(r, 1, n, scale, offset); }

/* A two-layer model: layer 1 windowed (W = 5) with soft-cap and sinks; its
 * KV cache kv with scales ks (KV_SCALES_CHECKPOINT: random static scales of
 * [0.004, 0.012), so qk-normed keys of layer 0 saturate and the rest fit). */
static int rig_open_kv(Rig *r, int C, int H, int KV, int D, int F, int V, int rot, bool neox, bool biases,
                       Activation act, KVDtype kv, KVScales ks) {
    memset(r, 0, sizeof *r);
    ModelConfig *c = &r->c;
    c->n_layers = 2; c->dim = C; c->ffn_dim = F; c->n_heads = H; c->n_kv_heads = KV;
    c->head_dim_k = c->head_dim_v = D; c->vocab = V; c->ctx_len = 4096; c->norm_eps = 1e-5f;
    c->embed_scale = 1.0f; c->attn_scale = 1.0f / sqrtf((float)D); c->rope_neox = neox; c->rope_dim = rot;
    c->rope_theta = c->rope_theta_local = 10000.0f; c->act = act == ACT_GELU_TANH ? ACT_KIND_GELU_TANH : ACT_KIND_SILU;
    c->layer_window[1] = 5;
    c->attn_softcap = 0; /* per-layer soft-cap is a param: set in the attention check */
    float ws = 1.0f / sqrtf((float)C);
    r->w.tok_embd = weight(r, V, C, 1.0f, 0);
    r->w.output_norm = vec(r, C, 0.2f, 1.0f);
    r->w.output = weight(r, V, C, ws, 0);
    r->w.layers = r->layers;
    for (int l = 0; l < 2; l++) {
        LayerWeights *L = &r->layers[l];
        L->attn_norm = vec(r, C, 0.2f, 1.0f);
        L->ffn_norm = vec(r, C, 0.2f, 1.0f);
        L->wq = weight(r, H * D, C, ws, 0);
        L->wk = weight(r, KV * D, C, ws, 0);
        L->wv = weight(r, KV * D, C, ws, 0);
        if (l == 0) { L->q_norm = vec(r, D, 0.2f, 1.0f); L->k_norm = vec(r, D, 0.2f, 1.0f); } /* qk-norm in layer 0 */
        L->wo = weight(r, C, H * D, 1.0f / sqrtf((float)(H * D)), 0);
        L->w_gate = weight(r, F, C, ws, 0);
        L->w_up = weight(r, F, C, ws, 0);
        L->w_down = weight(r, C, F, 1.0f / sqrtf((float)F), 0);
        if (biases) {
            L->bq = vec(r, H * D, 0.5f, 0); L->bk = vec(r, KV * D, 0.5f, 0); L->bv = vec(r, KV * D, 0.5f, 0);
            L->bo = vec(r, C, 0.5f, 0);
            L->b_gate = vec(r, F, 0.5f, 0); L->b_up = vec(r, F, 0.5f, 0); L->b_down = vec(r, C, 0.5f, 0);
        }
        if (l == 1) L->sinks = vec(r, H, 1.0f, 0);
        if (ks == KV_SCALES_CHECKPOINT) L->kv_scales = vec(r, 2 * KV, 0.004f, 0.008f);
    }
    Err err = {{0}};
    r->cpu = rig_shape(r, &err) ? NULL : backend_cpu_create(&r->shape, &r->w, 2, BLOCK, N_BLOCKS, kv, ks, &err);
    GpuRig o = {.block_size = BLOCK, .n_blocks = N_BLOCKS, .max_tokens = MAX_T, .no_graphs = true, .kv_dtype = kv,
                .kv_scales = ks};
    r->gpu = r->cpu ? gpu_backend(&r->shape, &r->w, &o, &err) : NULL;
    CHECK(r->cpu && r->gpu, "%s", err.msg);
    return r->cpu && r->gpu ? 0 : -1;
}

static int rig_open(Rig *r, int C, int H, int KV, int D, int F, int V, int rot, bool neox, bool biases, Activation act) {
    return rig_open_kv(r, C, H, KV, D, F, V, rot, neox, biases, act, KV_DTYPE_BF16, KV_SCALES_DYNAMIC);
}

static void rig_close(Rig *r) {
    model_shape_free(&r->shape);
    if (r->cpu) r->cpu->destroy(r->cpu);
    if (r->gpu) r->gpu->destroy(r->gpu);
    for (int i = 0; i < r->n_mem; i++) free(r->mem[i]);
}

/* A buffer on each backend. */
typedef struct { void *c, *g; int64_t n; } Pair;

static Pair pair(Rig *r, int64_t n, BufKind k) {
    Pair p = {r->cpu->alloc(r->cpu, n, k), r->gpu->alloc(r->gpu, n, k), n};
    CHECK(p.c && p.g, "alloc of %lld", (long long)n);
    return p;
}

static void pair_free(Rig *r, Pair *p) { r->cpu->release(r->cpu, p->c); r->gpu->release(r->gpu, p->g); }

/* The same random bf16-valued input on both; scale sets its size. */
static void fill(Rig *r, Pair *p, int64_t n, float scale) {
    float *h = rand_vec(n, scale, 0);
    Err err = {{0}};
    CHECK(r->cpu->write(r->cpu, p->c, h, n, &err) == 0 && r->gpu->write(r->gpu, p->g, h, n, &err) == 0, "%s", err.msg);
    free(h);
}

static void poison(Rig *r, Pair *p, int64_t n) {
    float *h = malloc(n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    Err err = {{0}};
    CHECK(r->gpu->write(r->gpu, p->g, h, n, &err) == 0, "%s", err.msg);
    free(h);
}

/* ||gpu - cpu|| / ||cpu|| over n values of p (NaN: infinite), at most tol. */
static double compare_tol(Rig *r, Pair *p, int64_t n, const char *what, int T, double tol) {
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    Err err = {{0}};
    double e = INFINITY;
    if (r->cpu->read(r->cpu, a, p->c, n, &err) == 0 && r->gpu->read(r->gpu, b, p->g, n, &err) == 0) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) { num += ((double)b[i] - a[i]) * ((double)b[i] - a[i]); den += (double)a[i] * a[i]; }
        e = isnan(num) ? INFINITY : sqrt(num / (den > 0 ? den : 1));
    } else {
        printf("  %s\n", err.msg);
    }
    CHECK(e <= tol, "%s T=%d: rel err %.3g", what, T, e);
    free(a); free(b);
    return e;
}

static double compare(Rig *r, Pair *p, int64_t n, const char *what, int T) { return compare_tol(r, p, n, what, T, TOL); }

/* The step: rows split between two sequences (positions 0.. of each), their
 * blocks taken from a shuffled pool. */
typedef struct {
    int32_t ids[MAX_T], pos[MAX_T], seq[MAX_T], rows[MAX_T], blocks[2][N_BLOCKS / 2];
    int64_t slot[MAX_T];
    const int32_t *tables[2];
    AttnBatch b;
} Step;

static void step_make(Step *s, int T, int V) {
    int perm[N_BLOCKS];
    for (int i = 0; i < N_BLOCKS; i++) perm[i] = i;
    for (int i = N_BLOCKS - 1; i > 0; i--) {
        int j = (int)((frand() + 1) * 0.5f * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j]; perm[j] = t;
    }
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < N_BLOCKS / 2; i++) s->blocks[q][i] = perm[q * N_BLOCKS / 2 + i];
    int n0 = (T + 1) / 2, next[2] = {0, 0};
    for (int t = 0; t < T; t++) {
        int q = t < n0 ? 0 : 1, p = next[q]++;
        s->ids[t] = (int32_t)((frand() + 1) * 0.5f * (V - 1));
        s->seq[t] = q; s->pos[t] = p; s->rows[t] = T - 1 - t;
        s->slot[t] = (int64_t)s->blocks[q][p / BLOCK] * BLOCK + p % BLOCK;
    }
    s->tables[0] = s->blocks[0]; s->tables[1] = s->blocks[1];
    s->b = (AttnBatch){T, s->pos, s->seq, s->slot, T > 1 ? 2 : 1, s->tables, BLOCK};
}

/* The ops that fold (backend.h): norm_qkv and norm_gate_up (the GPU folds
 * the norm into the decode GEMV where it takes it: the FP8 and bf16 ones
 * at their rows) against the CPU's add_rmsnorm then qkv / gate_up, and
 * matmul_add (the GPU's GEMV adds bf16(product) to x itself at decode
 * rows; else matmul, then add_rmsnorm adds it) against the CPU's. Outputs
 * poisoned first; the folded ops leave xn unwritten, so it is not read. */
static double check_fold_ops(Rig *r, int T, Pair *x, Pair *xn, Pair *d, Pair *q, Pair *k, Pair *v, Pair *att,
                             Pair *act) {
    const ModelConfig *c = &r->c;
    const int C = c->dim, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim_k, F = c->ffn_dim;
    const LayerWeights *lc = r->layers, *lg = r->gpu->weights->layers;
    Activation a = c->act == ACT_KIND_GELU_TANH ? ACT_GELU_TANH : ACT_SILU;
    double e = 0;
    fill(r, x, T * C, 2.0f);
    poison(r, q, T * H * D); poison(r, k, T * KV * D); poison(r, v, T * KV * D);
    AddNorm nc = {x->c, NULL, xn->c, &lc[0].attn_norm, C, 1e-5f, 0.0f}, ng = {x->g, NULL, xn->g, &lg[0].attn_norm, C, 1e-5f, 0.0f};
    r->cpu->add_rmsnorm(r->cpu, nc.x, NULL, nc.out, nc.w, T, C, nc.eps, nc.offset);
    r->cpu->qkv(r->cpu, q->c, k->c, v->c, xn->c, &lc[0], T);
    r->gpu->norm_qkv(r->gpu, &ng, q->g, k->g, v->g, &lg[0], T);
    e = fmax(compare(r, q, T * H * D, "norm_qkv q", T),
             fmax(compare(r, k, T * KV * D, "norm_qkv k", T), compare(r, v, T * KV * D, "norm_qkv v", T)));
    poison(r, act, T * F);
    nc.w = &lc[1].ffn_norm, ng.w = &lg[1].ffn_norm, nc.offset = ng.offset = 1.0f;
    r->cpu->add_rmsnorm(r->cpu, nc.x, NULL, nc.out, nc.w, T, C, nc.eps, nc.offset);
    r->cpu->gate_up(r->cpu, act->c, xn->c, &lc[1], 0, T, a, 0);
    r->gpu->norm_gate_up(r->gpu, &ng, act->g, &lg[1], T, a, 0);
    e = fmax(e, compare(r, act, T * F, "norm_gate_up + GLU", T));
    fill(r, att, T * H * D, 1.0f);
    CHECK(r->cpu->matmul_add(r->cpu, x->c, att->c, &lc[0].wo, 0, &lc[0].bo, T), "the CPU's matmul_add");
    if (!r->gpu->matmul_add(r->gpu, x->g, att->g, &lg[0].wo, 0, &lg[0].bo, T)) { /* the GPU's route has none */
        poison(r, d, T * C);
        r->gpu->matmul(r->gpu, d->g, att->g, &lg[0].wo, 0, &lg[0].bo, T);
        r->gpu->add_rmsnorm(r->gpu, x->g, d->g, xn->g, &lg[0].attn_norm, T, C, 1e-5f, 0.0f);
    }
    return fmax(e, compare(r, x, T * C, "matmul_add x", T));
}

static void check_ops_at(Rig *r, int T, const char *shape) {
    const ModelConfig *c = &r->c;
    int C = c->dim, H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim_k, F = c->ffn_dim, V = c->vocab;
    Step s;
    step_make(&s, T, V);
    Err err = {{0}};
    StepRows rc, rg;
    int n_logits = T > 3 ? 3 : T;
    CHECK(r->cpu->begin_step(r->cpu, s.ids, &s.b, s.rows, n_logits, &rc, &err) == 0 &&
          r->gpu->begin_step(r->gpu, s.ids, &s.b, s.rows, n_logits, &rg, &err) == 0, "%s", err.msg);
    CHECK(rg.T == T && rg.n_logits == n_logits, "rows %d/%d", rg.T, rg.n_logits);
    Pair x = pair(r, T * C, BUF_F32), xn = pair(r, T * C, BUF_ACT), d = pair(r, T * C, BUF_ACT);
    Pair q = pair(r, T * H * D, BUF_ACT), k = pair(r, T * KV * D, BUF_ACT), v = pair(r, T * KV * D, BUF_ACT);
    Pair att = pair(r, T * H * D, BUF_ACT), act = pair(r, T * F, BUF_ACT), lg = pair(r, T * V, BUF_F32);
    double e[12] = {0};

    poison(r, &x, T * C);
    r->cpu->embed(r->cpu, x.c, &r->w.tok_embd, T, 1.5f);
    r->gpu->embed(r->gpu, x.g, &r->gpu->weights->tok_embd, T, 1.5f);
    e[0] = compare(r, &x, T * C, "embed", T);

    fill(r, &x, T * C, 2.0f);
    poison(r, &xn, T * C);
    r->cpu->add_rmsnorm(r->cpu, x.c, NULL, xn.c, &r->layers[0].attn_norm, T, C, 1e-5f, 0);
    r->gpu->add_rmsnorm(r->gpu, x.g, NULL, xn.g, &r->gpu->weights->layers[0].attn_norm, T, C, 1e-5f, 0);
    e[1] = compare(r, &xn, T * C, "rmsnorm of the residual", T);

    fill(r, &x, T * C, 2.0f);
    fill(r, &d, T * C, 1.0f);
    poison(r, &xn, T * C);
    r->cpu->add_rmsnorm(r->cpu, x.c, d.c, xn.c, &r->layers[0].ffn_norm, T, C, 1e-5f, 1.0f);
    r->gpu->add_rmsnorm(r->gpu, x.g, d.g, xn.g, &r->gpu->weights->layers[0].ffn_norm, T, C, 1e-5f, 1.0f);
    e[2] = fmax(compare(r, &x, T * C, "add_rmsnorm x", T), compare(r, &xn, T * C, "add_rmsnorm out", T));

    fill(r, &xn, T * C, 1.0f);
    poison(r, &q, T * H * D); poison(r, &k, T * KV * D); poison(r, &v, T * KV * D);
    r->cpu->qkv(r->cpu, q.c, k.c, v.c, xn.c, &r->layers[0], T);
    r->gpu->qkv(r->gpu, q.g, k.g, v.g, xn.g, &r->gpu->weights->layers[0], T);
    e[3] = fmax(compare(r, &q, T * H * D, "qkv q", T),
                fmax(compare(r, &k, T * KV * D, "qkv k", T), compare(r, &v, T * KV * D, "qkv v", T)));

    fill(r, &q, T * H * D, 2.0f);
    r->cpu->rmsnorm(r->cpu, q.c, q.c, &r->layers[0].q_norm, T * H, D, 1e-5f, 0);
    r->gpu->rmsnorm(r->gpu, q.g, q.g, &r->gpu->weights->layers[0].q_norm, T * H, D, 1e-5f, 0);
    e[4] = compare(r, &q, T * H * D, "qk-norm (in place)", T);

    for (int l = 0; l < 2; l++) { /* layer 0: qk-norm, global; layer 1: window 5, soft-cap 30, sinks */
        fill(r, &q, T * H * D, 1.0f); fill(r, &k, T * KV * D, 1.0f); fill(r, &v, T * KV * D, 1.0f);
        r->cpu->rope_kv_write(r->cpu, l, q.c, k.c, v.c, T);
        r->gpu->rope_kv_write(r->gpu, l, q.g, k.g, v.g, T);
        e[5] = fmax(e[5], fmax(compare(r, &q, T * H * D, l ? "rope q" : "qk-norm + rope q", T),
                               compare(r, &k, T * KV * D, l ? "rope k" : "qk-norm + rope k", T)));
        poison(r, &att, T * H * D);
        AttnParams pc = {H, KV, D, D, c->attn_scale, l ? 30.0f : 0, c->layer_window[l], r->layers[l].sinks.data};
        AttnParams pg = pc;
        pg.sinks = r->gpu->weights->layers[l].sinks.data;
        r->cpu->attention(r->cpu, att.c, q.c, l, &pc, T);
        r->gpu->attention(r->gpu, att.g, q.g, l, &pg, T);
        e[6] = fmax(e[6], compare(r, &att, T * H * D, l ? "attention (window, cap, sinks)" : "attention", T));
    }

    fill(r, &att, T * H * D, 1.0f);
    poison(r, &d, T * C);
    r->cpu->matmul(r->cpu, d.c, att.c, &r->layers[0].wo, 0, &r->layers[0].bo, T);
    r->gpu->matmul(r->gpu, d.g, att.g, &r->gpu->weights->layers[0].wo, 0, &r->gpu->weights->layers[0].bo, T);
    e[7] = compare(r, &d, T * C, "matmul wo", T);

    fill(r, &xn, T * C, 1.0f);
    poison(r, &act, T * F);
    Activation a = c->act == ACT_KIND_GELU_TANH ? ACT_GELU_TANH : ACT_SILU;
    r->cpu->gate_up(r->cpu, act.c, xn.c, &r->layers[1], 0, T, a, 0);
    r->gpu->gate_up(r->gpu, act.g, xn.g, &r->gpu->weights->layers[1], 0, T, a, 0);
    e[8] = compare(r, &act, T * F, "gate_up + GLU", T);

    fill(r, &act, T * F, 1.0f);
    poison(r, &d, T * C);
    r->cpu->matmul(r->cpu, d.c, act.c, &r->layers[1].w_down, 0, &r->layers[1].b_down, T);
    r->gpu->matmul(r->gpu, d.g, act.g, &r->gpu->weights->layers[1].w_down, 0, &r->gpu->weights->layers[1].b_down, T);
    e[9] = compare(r, &d, T * C, "matmul down", T);

    fill(r, &xn, T * C, 1.0f);
    poison(r, &d, T * C);
    poison(r, &lg, T * V);
    r->cpu->gather_rows(r->cpu, d.c, xn.c, n_logits, C);
    r->gpu->gather_rows(r->gpu, d.g, xn.g, n_logits, C);
    r->cpu->logits(r->cpu, lg.c, d.c, &r->w.output, n_logits, 2.0f);
    r->gpu->logits(r->gpu, lg.g, d.g, &r->gpu->weights->output, n_logits, 2.0f);
    e[10] = compare(r, &lg, (int64_t)n_logits * V, "gather + logits (cap)", T);
    e[11] = check_fold_ops(r, T, &x, &xn, &d, &q, &k, &v, &att, &act);
    printf("# %-7s T=%2d embed %.1e norm %.1e addnorm %.1e qkv %.1e qknorm %.1e rope %.1e attn %.1e wo %.1e "
           "gateup %.1e down %.1e logits %.1e folded %.1e\n", shape, T, e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
           e[8], e[9], e[10], e[11]);
    Pair all[] = {x, xn, d, q, k, v, att, act, lg};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(r, &all[i]);
}

static void check_shape(const char *name, int C, int H, int KV, int D, int F, int V, int rot, bool neox, bool biases,
                        Activation act) {
    Rig r;
    if (rig_open(&r, C, H, KV, D, F, V, rot, neox, biases, act) == 0) {
        int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) check_ops_at(&r, Ts[i], name);
    }
    rig_close(&r);
}

static void test_ops_odd_sizes(void) { check_shape("odd", 4095, 3, 1, 64, 1001, 777, 64, true, true, ACT_GELU_TANH); }
static void test_ops_aligned(void) { check_shape("aligned", 512, 8, 2, 128, 1536, 1000, 64, false, false, ACT_SILU); }

/* A CLLM_PROFILE_STEPS that is not FIRST,COUNT is refused with its value
 * named, not silently ignored; unset again, the same model opens. */
static void test_bad_profile_env(void) {
    Rig r;
    if (rig_open(&r, 512, 8, 2, 64, 1024, 1000, 64, false, false, ACT_SILU) == 0) {
        Err err = {{0}};
        GpuRig o = {.block_size = BLOCK, .n_blocks = N_BLOCKS, .max_tokens = MAX_T, .no_graphs = true};
        const char *bad[] = {"7", "3,0", "-1,2", "x"};
        for (int i = 0; i < 4; i++) {
            setenv("CLLM_PROFILE_STEPS", bad[i], 1);
            Backend *be = gpu_backend(&r.shape, &r.w, &o, &err);
            unsetenv("CLLM_PROFILE_STEPS");
            CHECK(!be && strstr(err.msg, "CLLM_PROFILE_STEPS"), "CLLM_PROFILE_STEPS=%s: '%s'", bad[i],
                  be ? "accepted" : err.msg);
            if (be) be->destroy(be);
        }
        Backend *be = gpu_backend(&r.shape, &r.w, &o, &err);
        CHECK(be, "unset again: %s", err.msg);
        if (be) be->destroy(be);
    }
    rig_close(&r);
}

/* Stacked experts: n_mats = E matrices [rows][cols] (rows = 1: E vectors). */
static WeightRef stacked(Rig *r, int E, int64_t rows, int64_t cols, float scale) {
    WeightRef w = weight(r, rows * E, cols, scale, 0);
    w.rows = rows;
    w.n_mats = E;
    return w;
}

/* The MoE op (router, top-k, experts, combine) on both backends: up to 8
 * rows on the device path of the GPU, from 9 the host-routed one. Odd and
 * aligned C. */
static void test_moe(void) {
    int Cs[2] = {999, 1024};
    for (int ci = 0; ci < 2; ci++) {
        Rig r;
        memset(&r, 0, sizeof r);
        ModelConfig *c = &r.c;
        int C = Cs[ci], F = 160, E = 4, V = 50;
        c->n_layers = 1; c->dim = C; c->ffn_dim = F; c->n_heads = 1; c->n_kv_heads = 1; c->head_dim_k = 16;
        c->head_dim_v = 16; c->vocab = V; c->rope_dim = 16; c->rope_theta = c->rope_theta_local = 10000;
        c->embed_scale = 1; c->norm_eps = 1e-5f; c->n_experts = E; c->n_experts_used = 2;
        c->act = ACT_KIND_SWIGLU_OAI; c->act_limit = 7.0f;
        r.w.tok_embd = weight(&r, V, C, 1, 0);
        r.w.output = r.w.tok_embd;
        r.w.output_norm = vec(&r, C, 0.1f, 1);
        r.w.layers = r.layers;
        LayerWeights *L = &r.layers[0];
        float ws = 1.0f / sqrtf((float)C);
        L->router = weight(&r, E, C, 4 * ws, 0);
        L->router_bias = vec(&r, E, 0.5f, 0);
        L->w_gate = stacked(&r, E, F, C, 2 * ws);
        L->w_up = stacked(&r, E, F, C, 2 * ws);
        L->w_down = stacked(&r, E, C, F, 1.0f / sqrtf((float)F));
        L->b_gate = stacked(&r, E, 1, F, 0.5f);
        L->b_up = stacked(&r, E, 1, F, 0.5f);
        L->b_down = stacked(&r, E, 1, C, 0.5f);
        Err err = {{0}};
        r.cpu = rig_shape(&r, &err) ? NULL
                                    : backend_cpu_create(&r.shape, &r.w, 2, BLOCK, N_BLOCKS, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
        GpuRig o = {.block_size = BLOCK, .n_blocks = N_BLOCKS, .max_tokens = MAX_T, .no_graphs = true};
        r.gpu = r.cpu ? gpu_backend(&r.shape, &r.w, &o, &err) : NULL;
        CHECK(r.cpu && r.gpu, "%s", err.msg);
        int Ts[] = {1, 2, 3, 5, 8, 9, 33};
        printf("# moe C=%d", C);
        for (size_t ti = 0; r.gpu && ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            Step st;
            step_make(&st, T, V);
            StepRows rows;
            CHECK(r.cpu->begin_step(r.cpu, st.ids, &st.b, st.rows, 0, &rows, &err) == 0 &&
                  r.gpu->begin_step(r.gpu, st.ids, &st.b, st.rows, 0, &rows, &err) == 0, "%s", err.msg);
            Pair x = pair(&r, (int64_t)T * C, BUF_ACT), y = pair(&r, (int64_t)T * C, BUF_ACT);
            fill(&r, &x, (int64_t)T * C, 1.0f);
            poison(&r, &y, (int64_t)T * C);
            r.cpu->moe(r.cpu, y.c, x.c, &r.layers[0], T);
            r.gpu->moe(r.gpu, y.g, x.g, &r.gpu->weights->layers[0], T);
            printf("  T=%d %.1e", T, compare(&r, &y, (int64_t)T * C, "moe", T));
            pair_free(&r, &x);
            pair_free(&r, &y);
        }
        printf("\n");
        rig_close(&r);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The matrix-vector kernel's weight-read rate on the GEMMs of a Llama-3-8B
 * layer (bytes of W over time; H200 copy ceiling 4.26 TB/s). Reported, not
 * asserted; the result is checked against the CPU on a few rows. */
static void test_gemv_rate(void) {
    int shapes[4][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}; /* qkv, o, gate|up, down */
    const char *names[4] = {"qkv 6144x4096", "o 4096x4096", "gate|up 28672x4096", "down 4096x14336"};
    for (int s = 0; s < 4; s++) {
        int M = shapes[s][0], K = shapes[s][1];
        Rig r;
        memset(&r, 0, sizeof r);
        ModelConfig *c = &r.c;
        c->n_layers = 1; c->dim = K; c->ffn_dim = 16; c->n_heads = 1; c->n_kv_heads = 1; c->head_dim_k = 16;
        c->head_dim_v = 16; c->vocab = 16; c->rope_dim = 16; c->rope_theta = c->rope_theta_local = 10000;
        c->embed_scale = 1; c->norm_eps = 1e-5f;
        r.w.tok_embd = weight(&r, 16, K, 1, 0);
        r.w.output = r.w.tok_embd;
        r.w.output_norm = vec(&r, K, 0.1f, 1);
        r.w.layers = r.layers;
        r.layers[0].wo = weight(&r, M, K, 1.0f / sqrtf((float)K), 0);
        Err err = {{0}};
        r.cpu = rig_shape(&r, &err) ? NULL : backend_cpu_create(&r.shape, &r.w, 0, 16, 4, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
        GpuRig o = {.block_size = 16, .n_blocks = 4, .max_tokens = 8, .no_graphs = true};
        r.gpu = r.cpu ? gpu_backend(&r.shape, &r.w, &o, &err) : NULL;
        CHECK(r.cpu && r.gpu, "%s", err.msg);
        if (!r.gpu) { rig_close(&r); return; }
        Step st;
        step_make(&st, 8, 16);
        StepRows rows;
        int Ts[] = {1, 2, 4, 8};
        printf("# gemv %-20s", names[s]);
        for (int ti = 0; ti < 4; ti++) {
            int T = Ts[ti];
            st.b.n_tokens = T;
            st.b.n_seqs = 1;
            for (int i = 0; i < T; i++) st.seq[i] = 0;
            CHECK(r.gpu->begin_step(r.gpu, st.ids, &st.b, st.rows, 0, &rows, &err) == 0, "%s", err.msg);
            CHECK(r.cpu->begin_step(r.cpu, st.ids, &st.b, st.rows, 0, &rows, &err) == 0, "%s", err.msg);
            Pair x = pair(&r, (int64_t)T * K, BUF_ACT), y = pair(&r, (int64_t)T * M, BUF_ACT);
            fill(&r, &x, (int64_t)T * K, 1.0f);
            poison(&r, &y, (int64_t)T * M);
            int reps = 50;
            float tmp;
            r.gpu->matmul(r.gpu, y.g, x.g, &r.gpu->weights->layers[0].wo, 0, NULL, T);
            r.gpu->read(r.gpu, &tmp, y.g, 1, &err);
            double t0 = now();
            for (int i = 0; i < reps; i++) r.gpu->matmul(r.gpu, y.g, x.g, &r.gpu->weights->layers[0].wo, 0, NULL, T);
            r.gpu->read(r.gpu, &tmp, y.g, 1, &err);
            double dt = (now() - t0) / reps;
            if (T == 1) { /* correctness of this shape at T = 1 */
                r.cpu->matmul(r.cpu, y.c, x.c, &r.layers[0].wo, 0, NULL, T);
                compare(&r, &y, (int64_t)T * M, names[s], T);
            }
            printf("  T=%d %6.1f us %5.2f TB/s", T, dt * 1e6, (double)M * K * 2 / dt / 1e12);
            pair_free(&r, &x);
            pair_free(&r, &y);
        }
        printf("\n");
        rig_close(&r);
    }
}

/* One pass of test_decode_speed's decode: T = 1 steps at positions 0..n (the last logits into out, a
 * checksum of each step's logits into sums[n]); returns the seconds of the steps from `warm` on. */
static double decode_pass(Forward *fw, int V, int n, int warm, float *out, double *sums) {
    int32_t table[64];
    for (int i = 0; i < 64; i++) table[i] = 63 - i;
    const int32_t *tables[1] = {table};
    Err err = {{0}};
    double t0 = 0;
    for (int i = 0; i < n; i++) {
        if (i == warm) t0 = now();
        int32_t id = (i * 7919) % V, pos = i, seq = 0, row = 0;
        int64_t slot = (int64_t)table[i / 16] * 16 + i % 16;
        AttnBatch b = {1, &pos, &seq, &slot, 1, tables, 16};
        if (forward_run(fw, &id, &b, &row, 1, out, &err)) { CHECK(0, "%s", err.msg); return 1; }
        double cs = 0;
        for (int v = 0; v < V; v++) cs += out[v] * (double)(1 + v % 7);
        sums[i] = cs;
    }
    return now() - t0;
}

/* The first step whose checksums differ, or -1. */
static int first_differing_step(const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return -1;
}

/* Decode of a synthetic Llama-shaped model (C 2048, 16 layers, F 8192,
 * V 32000; every layer shares one set of host weights, each gets its own
 * device copy): T = 1 steps at positions 0..N, graphs off, on, off, on, each backend twice. */
static void test_decode_speed(void) {
    Rig r;
    memset(&r, 0, sizeof r);
    ModelConfig *c = &r.c;
    c->n_layers = 16; c->dim = 2048; c->ffn_dim = 8192; c->n_heads = 32; c->n_kv_heads = 8; c->head_dim_k = 64;
    c->head_dim_v = 64; c->vocab = 32000; c->rope_dim = 64; c->rope_neox = true; c->norm_eps = 1e-5f;
    c->rope_theta = c->rope_theta_local = 500000; c->embed_scale = 1; c->attn_scale = 0.125f; c->ctx_len = 4096;
    int C = c->dim, F = c->ffn_dim, V = c->vocab;
    float ws = 1.0f / sqrtf((float)C);
    LayerWeights *layers = calloc(c->n_layers, sizeof *layers);
    LayerWeights L = {0};
    L.attn_norm = vec(&r, C, 0.1f, 1); L.ffn_norm = vec(&r, C, 0.1f, 1);
    L.wq = weight(&r, 2048, C, ws, 0); L.wk = weight(&r, 512, C, ws, 0); L.wv = weight(&r, 512, C, ws, 0);
    L.wo = weight(&r, C, 2048, ws, 0);
    L.w_gate = weight(&r, F, C, ws, 0); L.w_up = weight(&r, F, C, ws, 0);
    L.w_down = weight(&r, C, F, 1.0f / sqrtf((float)F), 0);
    for (int l = 0; l < c->n_layers; l++) layers[l] = L;
    r.w.layers = layers;
    r.w.tok_embd = weight(&r, V, C, 1, 0);
    r.w.output = weight(&r, V, C, ws, 0);
    r.w.output_norm = vec(&r, C, 0.1f, 1);
    double bytes = 2.0 * ((double)c->n_layers * (5120.0 * C + 3.0 * F * C) + (double)V * C);
    int N = 256, warm = 16;
    float *logits[4] = {malloc(V * sizeof(float)), malloc(V * sizeof(float)), malloc(V * sizeof(float)),
                        malloc(V * sizeof(float))};
    float *again = malloc(V * sizeof(float));
    double tps[4] = {0, 0, 0, 0}, gbps = 0;
    Err serr = {{0}};
    CHECK(rig_shape(&r, &serr) == 0, "%s", serr.msg);
    /* each step's logits checksum, [backend][pass][step]: where two passes first part */
    const int n = warm + N;
    double *sums = calloc((size_t)8 * n, sizeof(double));
    for (int g = 0; g < 4; g++) { /* graphs off, on, off, on; two passes each (the second repeats the first) */
        Err err = {{0}};
        GpuRig o = {.block_size = 16, .n_blocks = 64, .max_tokens = 8, .no_graphs = g % 2 == 0};
        Backend *be = gpu_backend(&r.shape, &r.w, &o, &err);
        if (be) gbps = be->load_gbps;
        Forward fw;
        CHECK(be && forward_init(&fw, c, be, 8, &err) == 0, "%s", err.msg);
        if (!be) break;
        tps[g] = N / decode_pass(&fw, V, n, warm, logits[g], sums + (size_t)2 * g * n);
        decode_pass(&fw, V, n, warm, again, sums + (size_t)(2 * g + 1) * n);
        double dp = 0;
        for (int i = 0; i < V; i++) dp = fmax(dp, fabs(logits[g][i] - again[i]));
        int first = first_differing_step(sums + (size_t)2 * g * n, sums + (size_t)(2 * g + 1) * n, n);
        printf("# decode run %d (graphs %s): two passes in one backend differ by %.3g, first at step %d\n", g,
               g % 2 ? "on" : "off", dp, first);
        /* same kernels, same inputs: bit for bit (a split's key tile read before its copy landed differed
         * from step ~200, where one split first holds more tiles than the ring has stages) */
        CHECK(dp == 0 && first < 0, "decode run %d: two passes differ by %.3g from step %d", g, dp, first);
        forward_free(&fw);
        be->destroy(be);
    }
    for (int g = 2; g < 4; g++) {
        int first = first_differing_step(sums + (size_t)2 * (g - 2) * n, sums + (size_t)2 * g * n, n);
        printf("# decode runs %d and %d (graphs %s, two backends): first step that differs %d\n", g - 2, g,
               g % 2 ? "on" : "off", first);
        CHECK(first < 0, "decode runs %d and %d differ from step %d", g - 2, g, first);
    }
    free(sums);
    free(again);
    double md = 0, mx = 0, d_off = 0, d_on = 0;
    for (int i = 0; i < V; i++) {
        md = fmax(md, fabs(logits[0][i] - logits[1][i]));
        mx = fmax(mx, fabs(logits[0][i]));
        d_off = fmax(d_off, fabs(logits[0][i] - logits[2][i]));
        d_on = fmax(d_on, fabs(logits[1][i] - logits[3][i]));
    }
    /* graphs against issued launches: the same kernels, but a captured step is one launch of them */
    printf("# decode logits run to run: graphs off %.3g, on %.3g; off vs on %.3g (max |logit| %.3g)\n", d_off, d_on, md,
           mx);
    CHECK(md <= 1e-3 * mx, "graph vs no graph logits differ by %.3g (max %.3g)", md, mx);
    printf("# decode synthetic %.2f GB bf16 (upload %.2f GB/s from fp32): graphs off %.0f tok/s (%.2f TB/s), "
           "on %.0f tok/s (%.2f TB/s); logits max diff %.2g\n", bytes / 1e9, gbps, tps[0], bytes * tps[0] / 1e12,
           tps[1], bytes * tps[1] / 1e12, md);
    for (int i = 0; i < 4; i++) free(logits[i]);
    rig_close(&r);
    free(layers);
}

/* The fp8 cache with static scales (--kv-scales checkpoint / calibrate) and
 * dynamic ones: a prefill step of T rows over two sequences (rope_kv_write,
 * then attention), then a decode step of one row each (the GPU's decode
 * kernel with the rope and cache write in it where it takes them), both
 * layers; the attention outputs of the two backends compared. The GPU
 * computes k in bf16 and the CPU in fp32, so a value near an e4m3 midpoint
 * (or, calibrating, an amax a bf16 rounding apart) can take the next code:
 * FP8_TOL, against the ~6% relative step of one code. */
#define FP8_TOL 3e-2
static void check_kv_scales(KVScales ks, int T) {
    Rig r;
    if (rig_open_kv(&r, 512, 8, 2, 64, 256, 300, 64, true, false, ACT_SILU, KV_DTYPE_FP8, ks)) { rig_close(&r); return; }
    const ModelConfig *c = &r.c;
    int H = c->n_heads, KV = c->n_kv_heads, D = c->head_dim_k;
    Step s;
    step_make(&s, T, c->vocab);
    Pair q = pair(&r, MAX_T * H * D, BUF_ACT), k = pair(&r, MAX_T * KV * D, BUF_ACT), v = pair(&r, MAX_T * KV * D, BUF_ACT);
    Pair att = pair(&r, MAX_T * H * D, BUF_ACT);
    double worst[2] = {0, 0};
    for (int step = 0; step < 2; step++) {
        if (step == 1) { /* one decode row per sequence, at the position after its prefill rows */
            int n0 = (T + 1) / 2, p[2] = {n0, T - n0};
            for (int q2 = 0; q2 < 2; q2++) {
                s.seq[q2] = q2, s.pos[q2] = p[q2], s.rows[q2] = q2;
                s.slot[q2] = (int64_t)s.blocks[q2][p[q2] / BLOCK] * BLOCK + p[q2] % BLOCK;
            }
            s.b = (AttnBatch){2, s.pos, s.seq, s.slot, 2, s.tables, BLOCK};
        }
        int n = s.b.n_tokens;
        Err err = {{0}};
        StepRows rows;
        CHECK(r.cpu->begin_step(r.cpu, s.ids, &s.b, s.rows, 0, &rows, &err) == 0 &&
              r.gpu->begin_step(r.gpu, s.ids, &s.b, s.rows, 0, &rows, &err) == 0, "%s", err.msg);
        for (int l = 0; l < 2; l++) {
            fill(&r, &q, n * H * D, 1.0f); fill(&r, &k, n * KV * D, 1.0f); fill(&r, &v, n * KV * D, 1.0f);
            poison(&r, &att, n * H * D);
            AttnParams pc = {H, KV, D, D, c->attn_scale, l ? 30.0f : 0, c->layer_window[l], r.layers[l].sinks.data};
            AttnParams pg = pc;
            pg.sinks = r.gpu->weights->layers[l].sinks.data;
            r.cpu->rope_kv_write(r.cpu, l, q.c, k.c, v.c, n);
            r.cpu->attention(r.cpu, att.c, q.c, l, &pc, n);
            if (!r.gpu->rope_attention || !r.gpu->rope_attention(r.gpu, l, att.g, q.g, k.g, v.g, &pg, n)) {
                r.gpu->rope_kv_write(r.gpu, l, q.g, k.g, v.g, n);
                r.gpu->attention(r.gpu, att.g, q.g, l, &pg, n);
            }
            char what[96];
            snprintf(what, sizeof what, "fp8 %s, %s, layer %d", kv_scales_name(ks), step ? "decode" : "prefill", l);
            double e = compare_tol(&r, &att, n * H * D, what, n, FP8_TOL);
            worst[step] = fmax(worst[step], e);
        }
    }
    printf("# fp8 cache, %-10s scales: T=%2d prefill attention rel err %.2e, decode %.2e (limit %.0e)\n",
           kv_scales_name(ks), T, worst[0], worst[1], FP8_TOL);
    Pair all[] = {q, k, v, att};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pair_free(&r, &all[i]);
    rig_close(&r);
}

static void test_kv_scales(void) {
    KVScales forms[] = {KV_SCALES_DYNAMIC, KV_SCALES_CHECKPOINT, KV_SCALES_CALIBRATE};
    int Ts[] = {5, 33};
    for (size_t f = 0; f < 3; f++)
        for (size_t t = 0; t < 2; t++) check_kv_scales(forms[f], Ts[t]);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick"); /* no timings (for compute-sanitizer) */
    RUN(test_ops_odd_sizes);
    RUN(test_ops_aligned);
    RUN(test_moe);
    RUN(test_kv_scales);
    RUN(test_bad_profile_env);
    if (!quick) RUN(test_gemv_rate);
    if (!quick) RUN(test_decode_speed);
    TEST_EXIT();
}
