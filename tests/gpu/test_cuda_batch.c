/* test_cuda_batch.c — the CUDA backend on multi-sequence steps, the way the
 * scheduler drives it (run by tests/gpu/run.sh; never in CI).
 *
 *   test_cuda_batch MODEL_DIR...   (bench/make_model.py --tiny models)
 *
 * The same script of steps runs on three backends: CUDA with the attention
 * kernels of attention.cuh (graphs on), CUDA with the simple attention
 * kernel of cuda_ops.cu (no graphs), and the CPU backend (fp32, the
 * reference). The steps mix what a serving batch mixes: a 300-token prefill
 * across the sliding window and several 128-row tiles, prefill chunks that
 * start mid-sequence beside decode rows, one-token prompts, and then decode
 * steps of 3, 4 and 5 sequences (graph buckets 4 and 8, with padding rows),
 * each through a scattered block table. Decode inputs are the CPU's greedy
 * tokens, so all three see the same ids. Logits are poisoned with NaN
 * before every step. Checks: the kernels' path is no further from the CPU
 * than the simple kernel's (1.5x its worst row, floor 1e-2 of max |logit|),
 * the two CUDA paths agree within 3e-2, and greedy tokens agree with the
 * CPU on at least 95% of rows. Each model runs twice: bf16 KV (fp32 on the
 * CPU) and fp8 KV on all three (the two CUDA paths read the same cache
 * bytes, written by the same kernel; the CPU quantizes its fp32 K/V, so
 * there greedy agreement is only asked at 90%). A fourth runner is the
 * kernels' path with rope and the KV write apart from the decode attention
 * (CudaChecks.rope_apart: two launches, as in prefill steps): its logits
 * must equal the first runner's bit for bit (attention.cuh
 * cuda_attention_decode_rope promises the same results), at every step.
 *   test_cuda_batch --rope-only MODEL...   only that check (a real model:
 *   the tolerances above are for the random tiny models).
 * Wide decode steps (check_wide): 200 sequences, steps of 200, 65, 100 rows,
 * twice each (graph buckets 256, 128, 128 with 56, 63, 28 padding rows;
 * the first of a bucket captured, the rest replayed): graphs on equal graphs
 * off bit for bit, in the default and the batch-invariant mode, and the
 * CPU within the tolerance above. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/forward.h"
#include "model/model.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/test.h"

#define N_SEQS 5
#define BLOCK 16
#define TABLE 40                 /* blocks per sequence: 640 tokens */
#define N_BLOCKS (N_SEQS * TABLE + 8)
#define MAX_T 512
#define DECODE_STEPS 24

typedef struct {
    Backend *be;
    Forward fw;
    float *logits;               /* [N_SEQS][vocab] */
} Runner;

typedef struct {
    int n;                       /* rows */
    int32_t ids[MAX_T], pos[MAX_T], seq[MAX_T], rows[N_SEQS];
    int64_t slot[MAX_T];
    int n_logits;
} Step;

static int32_t tables[N_SEQS][TABLE];
static const int32_t *table_ptrs[N_SEQS];

/* Every sequence's blocks: a fixed shuffle of the pool, so neighbours in a
 * table are far apart in memory. */
static void make_tables(void) {
    int32_t perm[N_BLOCKS];
    test_shuffle(perm, N_BLOCKS, 12345);
    for (int s = 0; s < N_SEQS; s++) {
        for (int j = 0; j < TABLE; j++) tables[s][j] = perm[s * TABLE + j];
        table_ptrs[s] = tables[s];
    }
}

/* Appends rows of sequence s at positions p0.. with the given ids; the last
 * row wants logits when want is set. */
static void add_rows(Step *st, int s, int p0, const int32_t *ids, int n, bool want) {
    for (int i = 0; i < n; i++) {
        int r = st->n++, p = p0 + i;
        st->ids[r] = ids[i], st->pos[r] = p, st->seq[r] = s;
        st->slot[r] = (int64_t)tables[s][p / BLOCK] * BLOCK + p % BLOCK;
    }
    if (want) st->rows[st->n_logits++] = st->n - 1;
}

static int run_step(Runner *ru, const Step *st, int vocab, Err *err) {
    AttnBatch b = {st->n, st->pos, st->seq, st->slot, N_SEQS, table_ptrs, BLOCK};
    for (int64_t i = 0; i < (int64_t)st->n_logits * vocab; i++) ru->logits[i] = NAN;
    return forward_run(&ru->fw, st->ids, &b, st->rows, st->n_logits, ru->logits, err);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    double fast, generic, between;   /* worst rows: fast vs CPU, generic vs CPU, fast vs generic */
    int rows, fast_top1, generic_top1;
    int apart_differs;               /* rows whose logits differ in any bit with rope apart */
} Tally;

static void compare_step(Runner *ru, int n_logits, int V, Tally *t) {
    for (int i = 0; i < n_logits; i++) {
        const float *f = ru[0].logits + (size_t)i * V, *g = ru[1].logits + (size_t)i * V, *c = ru[2].logits + (size_t)i * V;
        t->fast = fmax(t->fast, test_row_err(f, c, V));
        t->generic = fmax(t->generic, test_row_err(g, c, V));
        t->between = fmax(t->between, test_row_err(f, g, V));
        int want = argmax(c, V);
        t->fast_top1 += argmax(f, V) == want;
        t->generic_top1 += argmax(g, V) == want;
        t->apart_differs += memcmp(f, ru[3].logits + (size_t)i * V, (size_t)V * sizeof *f) != 0;
        t->rows++;
    }
}

#define N_RUNNERS 4 /* kernels, simple kernel, CPU, kernels with rope apart */

static bool open_runners(Runner *ru, const Model *m, KVDtype kv, Err *err) {
    GpuRig fast = {.block_size = BLOCK, .n_blocks = N_BLOCKS, .max_tokens = MAX_T, .kv_dtype = kv};
    GpuRig generic = fast, apart = fast;
    generic.no_graphs = generic.generic_attention = true;
    apart.rope_apart = true;
    ru[0].be = gpu_backend(&m->shape, &m->w, &fast, err);
    ru[1].be = ru[0].be ? gpu_backend(&m->shape, &m->w, &generic, err) : NULL;
    ru[2].be = ru[1].be ? backend_cpu_create(&m->shape, &m->w, 0, BLOCK, N_BLOCKS, kv, KV_SCALES_DYNAMIC, err) : NULL;
    ru[3].be = ru[2].be ? gpu_backend(&m->shape, &m->w, &apart, err) : NULL;
    for (int i = 0; i < N_RUNNERS; i++) {
        if (!ru[i].be || forward_init(&ru[i].fw, &m->cfg, ru[i].be, MAX_T, err)) return false;
        ru[i].logits = malloc((size_t)N_SEQS * m->cfg.vocab * sizeof(float));
        if (!ru[i].logits) return false;
    }
    return true;
}

static void close_runners(Runner *ru) {
    for (int i = 0; i < N_RUNNERS; i++) {
        if (ru[i].fw.cfg) forward_free(&ru[i].fw);
        if (ru[i].be) ru[i].be->destroy(ru[i].be);
        free(ru[i].logits);
    }
}

/* The prefill part of the script: returns each sequence's length after it. */
static void prefill_steps(Step *steps, int *n_steps, int *len, int V) {
    static int32_t ids[N_SEQS][400];
    uint32_t r = 777;
    for (int s = 0; s < N_SEQS; s++)
        for (int i = 0; i < 400; i++) { r = r * 1103515245u + 12345u; ids[s][i] = (int32_t)((r >> 8) % (uint32_t)V); }
    Step *a = &steps[(*n_steps)++], *b = &steps[(*n_steps)++], *c = &steps[(*n_steps)++];
    memset(a, 0, 3 * sizeof *a);
    add_rows(a, 0, 0, ids[0], 300, true);                     /* across the window, 3 tiles */
    add_rows(b, 1, 0, ids[1], 200, true);                     /* a new prompt ... */
    add_rows(b, 0, 300, ids[0] + 300, 1, true);               /* ... beside a decode row */
    add_rows(b, 2, 0, ids[2], 9, true);
    add_rows(c, 3, 0, ids[3], 1, true);                       /* one-token prompt: a decode row at 0 */
    add_rows(c, 1, 200, ids[1] + 200, 131, true);             /* chunk starting mid-sequence */
    add_rows(c, 0, 301, ids[0] + 301, 1, true);
    add_rows(c, 2, 9, ids[2] + 9, 1, true);
    add_rows(c, 4, 0, ids[4], 2, true);
    len[0] = 302, len[1] = 331, len[2] = 10, len[3] = 1, len[4] = 2;
}

static bool rope_only; /* --rope-only */

static void check_model(const char *dir, KVDtype kv) {
    Err err = {{0}};
    Model m;
    if (model_load(&m, dir, MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
    int V = m.cfg.vocab;
    Runner ru[N_RUNNERS];
    memset(ru, 0, sizeof ru);
    bool ok = open_runners(ru, &m, kv, &err);
    CHECK(ok, "%s", err.msg);
    Step *steps = calloc(3, sizeof *steps), *d = calloc(1, sizeof *d);
    int n_steps = 0, len[N_SEQS];
    prefill_steps(steps, &n_steps, len, V);
    Tally t = {0};
    for (int i = 0; ok && i < n_steps; i++) {
        for (int k = 0; ok && k < N_RUNNERS; k++) ok = run_step(&ru[k], &steps[i], V, &err) == 0;
        CHECK(ok, "prefill step %d: %s", i, err.msg);
        if (ok) compare_step(ru, steps[i].n_logits, V, &t);
    }
    /* Decode: the next token of each live sequence is the CPU's argmax. */
    int32_t next[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) next[s] = 0;
    for (int i = 0; ok && i < steps[2].n_logits; i++)
        next[steps[2].seq[steps[2].rows[i]]] = argmax(ru[2].logits + (size_t)i * V, V);
    for (int k = 0; ok && k < DECODE_STEPS; k++) {
        int live = k < 8 ? 4 : k < 16 ? 3 : 5;                 /* buckets 4, 4 (one padding row), 8 */
        memset(d, 0, sizeof *d);
        for (int s = 0; s < live; s++) { add_rows(d, s, len[s], &next[s], 1, true); len[s]++; }
        for (int b = 0; ok && b < N_RUNNERS; b++) ok = run_step(&ru[b], d, V, &err) == 0;
        CHECK(ok, "decode step %d: %s", k, err.msg);
        if (!ok) break;
        compare_step(ru, d->n_logits, V, &t);
        for (int s = 0; s < live; s++) next[s] = argmax(ru[2].logits + (size_t)s * V, V);
    }
    /* the first runner did rope in the decode kernel: it left q as the qkv product made it */
    int64_t nq = (int64_t)d->n * m.cfg.n_heads * m.cfg.head_dim_k;
    float *q0 = malloc(nq * sizeof *q0), *q3 = malloc(nq * sizeof *q3);
    ok = ok && ru[0].be->read(ru[0].be, q0, ru[0].fw.q, nq, &err) == 0 && ru[3].be->read(ru[3].be, q3, ru[3].fw.q, nq, &err) == 0;
    CHECK(ok && memcmp(q0, q3, nq * sizeof *q0) != 0, "q after decode: the same on both kernel paths (rope in the "
          "decode kernel not used?) %s", err.msg);
    free(q0), free(q3);
    printf("# %s %s KV: %d rows; worst max-rel err vs CPU: kernels %.2e, simple kernel %.2e; kernels vs simple %.2e; "
           "greedy = CPU: kernels %d, simple %d; rows not bitwise equal with rope apart: %d\n", dir,
           kv_dtype_name(kv), t.rows, t.fast, t.generic, t.between, t.fast_top1, t.generic_top1, t.apart_differs);
    CHECK(t.rows == 1 + 3 + 5 + 8 * 4 + 8 * 3 + 8 * 5, "rows compared: %d", t.rows);
    CHECK(t.apart_differs == 0, "%d rows differ with rope apart from the decode attention", t.apart_differs);
    if (!rope_only) {
        CHECK(t.fast <= fmax(1.5 * t.generic, 1e-2), "kernels %.3g vs simple %.3g", t.fast, t.generic);
        CHECK(t.between <= 3e-2, "kernels vs simple kernel %.3g", t.between);
        CHECK(t.fast_top1 >= (kv == KV_DTYPE_FP8 ? 0.9 : 0.95) * t.rows, "greedy agreement %d of %d", t.fast_top1,
              t.rows);
    }
    free(steps);
    free(d);
    close_runners(ru);
    model_free(&m);
}

/* ---- wide decode steps: the graph buckets above 64 rows ---- */

#define WIDE_SEQS 200
#define WIDE_T 256
#define N_WIDE 5 /* graphs on, graphs off, CPU, batch-invariant graphs on, off */

static const int wide_live[] = {200, 65, 100, 200, 65, 100}; /* rows of each decode step */

static void check_wide(const char *dir) {
    Err err = {{0}};
    Model m;
    if (model_load(&m, dir, MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
    int V = m.cfg.vocab;
    /* sequence s owns block s + 1; block 0 stays zero for the padding rows */
    static int32_t wtab[WIDE_SEQS];
    static const int32_t *wptr[WIDE_SEQS];
    for (int s = 0; s < WIDE_SEQS; s++) wtab[s] = s + 1, wptr[s] = &wtab[s];
    GpuRig on = {.block_size = BLOCK, .n_blocks = WIDE_SEQS + 1, .max_tokens = WIDE_T, .kv_dtype = KV_DTYPE_BF16};
    GpuRig off = on, bi_on = on, bi_off = on;
    off.no_graphs = bi_off.no_graphs = true;
    bi_on.batch_invariant = bi_off.batch_invariant = true;
    Runner ru[N_WIDE];
    memset(ru, 0, sizeof ru);
    const GpuRig *rigs[N_WIDE] = {&on, &off, NULL, &bi_on, &bi_off};
    bool ok = true;
    for (int k = 0; ok && k < N_WIDE; k++) {
        ru[k].be = rigs[k] ? gpu_backend(&m.shape, &m.w, rigs[k], &err)
                           : backend_cpu_create(&m.shape, &m.w, 0, BLOCK, WIDE_SEQS + 1, KV_DTYPE_BF16,
                                                KV_SCALES_DYNAMIC, &err);
        ok = ru[k].be && forward_init(&ru[k].fw, &m.cfg, ru[k].be, WIDE_T, &err) == 0 &&
             (ru[k].logits = malloc((size_t)WIDE_T * V * sizeof(float))) != NULL;
    }
    CHECK(ok, "%s", err.msg);
    static int32_t ids[WIDE_T], pos[WIDE_T], seq[WIDE_T], rows[WIDE_T];
    static int64_t slot[WIDE_T];
    int32_t next[WIDE_SEQS], len[WIDE_SEQS];
    for (int s = 0; s < WIDE_SEQS; s++) next[s] = (int32_t)((s * 7919u + 13u) % (uint32_t)V), len[s] = 0;
    int rows_cmp = 0, differ = 0, bi_differ = 0, top1 = 0;
    double worst = 0;
    for (int k = 0; ok && k < (int)(sizeof wide_live / sizeof *wide_live); k++) {
        int n = wide_live[k];
        for (int s = 0; s < n; s++) {
            ids[s] = next[s], pos[s] = len[s], seq[s] = s, rows[s] = s;
            slot[s] = (int64_t)wtab[s] * BLOCK + len[s];
        }
        AttnBatch b = {n, pos, seq, slot, WIDE_SEQS, wptr, BLOCK};
        for (int r = 0; ok && r < N_WIDE; r++) {
            for (int64_t i = 0; i < (int64_t)n * V; i++) ru[r].logits[i] = NAN;
            ok = forward_run(&ru[r].fw, ids, &b, rows, n, ru[r].logits, &err) == 0;
        }
        CHECK(ok, "wide step %d (%d rows): %s", k, n, err.msg);
        for (int s = 0; ok && s < n; s++) {
            size_t o = (size_t)s * V, bytes = (size_t)V * sizeof(float);
            differ += memcmp(ru[0].logits + o, ru[1].logits + o, bytes) != 0;
            bi_differ += memcmp(ru[3].logits + o, ru[4].logits + o, bytes) != 0;
            worst = fmax(worst, test_row_err(ru[0].logits + o, ru[2].logits + o, V));
            next[s] = argmax(ru[2].logits + o, V);
            top1 += argmax(ru[0].logits + o, V) == next[s];
            len[s]++;
            rows_cmp++;
        }
    }
    printf("# %s wide decode: %d rows; graphs on vs off differ in %d rows (batch-invariant: %d); worst max-rel err "
           "vs CPU %.2e; greedy = CPU %d\n", dir, rows_cmp, differ, bi_differ, worst, top1);
    CHECK(!ok || rows_cmp == 730, "rows compared: %d", rows_cmp);
    CHECK(differ == 0, "%d rows differ between graphs on and off", differ);
    CHECK(bi_differ == 0, "%d rows differ between graphs on and off (batch-invariant)", bi_differ);
    CHECK(worst <= 3e-2, "graphs vs CPU %.3g", worst);
    CHECK(top1 >= 0.95 * rows_cmp, "greedy agreement %d of %d", top1, rows_cmp);
    for (int k = 0; k < N_WIDE; k++) {
        if (ru[k].fw.cfg) forward_free(&ru[k].fw);
        if (ru[k].be) ru[k].be->destroy(ru[k].be);
        free(ru[k].logits);
    }
    model_free(&m);
}

static const char *model_dir;

static void test_model(void) { check_model(model_dir, KV_DTYPE_BF16); }
static void test_model_fp8(void) { check_model(model_dir, KV_DTYPE_FP8); }
static void test_wide_decode(void) { check_wide(model_dir); }

int main(int argc, char **argv) {
    make_tables();
    rope_only = argc > 1 && !strcmp(argv[1], "--rope-only");
    if (argc < 2 + rope_only) {
        printf("usage: test_cuda_batch [--rope-only] MODEL_DIR...\nnot ok - arguments\n");
        return 1;
    }
    for (int i = 1 + rope_only; i < argc; i++) {
        model_dir = argv[i];
        RUN(test_model);
        RUN(test_model_fp8);
        if (!rope_only) RUN(test_wide_decode);
    }
    TEST_EXIT();
}
