/* test_batch_invariant.c — the CUDA backend's batch-invariant mode
 * (BackendOptions.batch_invariant): every row's logits are the SAME BITS alone
 * and inside any batch (run by tests/gpu/run.sh; never in CI).
 *
 *   test_batch_invariant [--no-timing] [--gemm-only | --models-only] MODEL...   (folders or .gguf files)
 *
 * 1. The GEMM (gemm_bi.cuh) on its own: odd and aligned sizes, K with a
 *    zero-padded tail, T from 1 to 300 through every tile configuration:
 *    each row of y equals, bit for bit, that row computed alone (T = 1), and
 *    is within bf16 rounding of an fp64 reference. Then its speed on
 *    Llama-3-8B-sized matrices (printed, never asserted).
 * 2. Each model: six sequences (prompts of 300, 131, 37, 17, 2 and 1 tokens,
 *    then 12 fixed "generated" tokens each, so every run sees the same ids)
 *    run one at a time (a whole prompt in one step, then one row per step),
 *    and in four batched schedules: continuous batching under budgets of 64
 *    and 200 rows (prompts chunked as the scheduler chunks them, decode rows
 *    beside prefill chunks), prompts alone then decode steps of all
 *    sequences together (graph buckets 8, 4, 2 with padding rows), and
 *    random chunk sizes. Logits of EVERY row are compared with the one-at-a-
 *    time run's. Modes: batch-invariant with graphs, without graphs (must
 *    both show 0 differing rows, and equal each other), and the default
 *    mode, which must show differences (so the check can fail). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime.h>

#include "engine/engine.h"
#include "kernels/backend.h"
#include "kernels/cuda/gemm_bi.cuh"
#include "model/forward.h"
#include "model/model.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/test.h"

/* ---------- part 1: the GEMM ---------- */

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

#define CK(call)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) { CHECK(0, "%s: %s", #call, cudaGetErrorString(e_)); goto out; } \
    } while (0)

/* One (M, K): every T, every configuration, bf16 and fp32 outputs. */
static void gemm_case(int M, int K, bool bias) {
    static const int Ts[] = {1, 2, 3, 5, 8, 9, 16, 17, 31, 33, 64, 65, 100, 130, 257, 300};
    const int n_T = (int)(sizeof Ts / sizeof Ts[0]), TMAX = 300;
    uint16_t *hw = malloc((size_t)M * K * 2), *hx = malloc((size_t)TMAX * K * 2);
    uint16_t *alone = malloc((size_t)TMAX * M * 2), *got = malloc((size_t)TMAX * M * 2);
    float *hb = malloc((size_t)M * 4), *alone32 = malloc((size_t)TMAX * M * 4), *got32 = malloc((size_t)TMAX * M * 4);
    void *dw = NULL, *dx = NULL, *dy = NULL, *db = NULL;
    Err err = {{0}};
    int bad_bits = 0, checked = 0;
    double worst = 0;
    for (int64_t i = 0; i < (int64_t)M * K; i++) hw[i] = to_bf16(frand() * 0.05f);
    for (int64_t i = 0; i < (int64_t)TMAX * K; i++) hx[i] = to_bf16(frand());
    for (int i = 0; i < M; i++) hb[i] = frand();
    CK(cudaMalloc(&dw, (size_t)M * K * 2));
    CK(cudaMalloc(&dx, (size_t)TMAX * K * 2));
    CK(cudaMalloc(&dy, (size_t)TMAX * M * 4));
    CK(cudaMalloc(&db, (size_t)M * 4));
    CK(cudaMemcpy(dw, hw, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx, (size_t)TMAX * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, (size_t)M * 4, cudaMemcpyHostToDevice));
    const float *bp = bias ? (const float *)db : NULL;
    /* each row alone, both output types */
    for (int t = 0; t < TMAX; t++) {
        const void *xt = (const uint16_t *)dx + (size_t)t * K;
        CHECK(cuda_gemm_bi(dy, false, M, dw, xt, bp, M, 1, K, 0, &err) == 0, "%s", err.msg);
        CK(cudaMemcpy(alone + (size_t)t * M, dy, (size_t)M * 2, cudaMemcpyDeviceToHost));
        CHECK(cuda_gemm_bi(dy, true, M, dw, xt, bp, M, 1, K, 0, &err) == 0, "%s", err.msg);
        CK(cudaMemcpy(alone32 + (size_t)t * M, dy, (size_t)M * 4, cudaMemcpyDeviceToHost));
    }
    /* accuracy of the alone rows (a few) against fp64 */
    for (int t = 0; t < TMAX; t += 37)
        for (int m = 0; m < M; m++) {
            double ref = bias ? hb[m] : 0, mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double p = (double)from_bf16(hw[(size_t)m * K + k]) * from_bf16(hx[(size_t)t * K + k]);
                ref += p;
                mag += fabs(p);
            }
            worst = fmax(worst, fabs(alone32[(size_t)t * M + m] - ref) / (mag > 0 ? mag : 1));
        }
    for (int c = 0; c < GEMM_BI_CONFIGS; c++)
        for (int i = 0; i < n_T; i++) {
            int T = Ts[i];
            for (int f32 = 0; f32 < 2; f32++) {
                CK(cudaMemset(dy, 0xff, (size_t)TMAX * M * 4));
                CHECK(cuda_gemm_bi_config(dy, f32, M, dw, dx, bp, M, T, K, c, 0, &err) == 0, "%s", err.msg);
                if (f32) {
                    CK(cudaMemcpy(got32, dy, (size_t)T * M * 4, cudaMemcpyDeviceToHost));
                    bad_bits += memcmp(got32, alone32, (size_t)T * M * 4) != 0;
                } else {
                    CK(cudaMemcpy(got, dy, (size_t)T * M * 2, cudaMemcpyDeviceToHost));
                    bad_bits += memcmp(got, alone, (size_t)T * M * 2) != 0;
                }
                checked++;
            }
        }
    printf("# gemm_bi M %d K %d%s: %d (config, T, type) runs, %d not bitwise equal to the rows alone; worst error "
           "%.2e of sum |products|\n", M, K, bias ? " +bias" : "", checked, bad_bits, worst);
    CHECK(bad_bits == 0, "M %d K %d: %d runs differ from the rows computed alone", M, K, bad_bits);
    CHECK(worst < 1e-4, "M %d K %d: error %.3g vs fp64", M, K, worst);
out:
    cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(db);
    free(hw), free(hx), free(alone), free(got), free(hb), free(alone32), free(got32);
}

static void test_gemm_invariant(void) {
    gemm_case(37, 999, true);     /* element loads, odd everything */
    gemm_case(300, 264, false);   /* 16-byte loads, K % 16 == 8: the zero-padded last k step */
    gemm_case(1000, 512, true);
    gemm_case(2048, 4096, false);
}

/* Milliseconds of one GEMM: 20 back-to-back launches between two events
 * (so the host's launch gaps overlap the kernels), after a warm-up. */
static float time_gemm(void *y, const void *w, const void *x, int M, int T, int K, int config) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    Err err = {{0}};
    float ms = 0;
    for (int rep = 0; rep < 2; rep++) {
        cudaEventRecord(a, 0);
        for (int i = 0; i < 20; i++) cuda_gemm_bi_config(y, false, M, w, x, NULL, M, T, K, config, 0, &err);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / 20;
}

/* Every configuration on Llama-3-8B-sized matrices (printed, never
 * asserted): the weight-read rate at decode sizes, TFLOP/s at 512 rows. */
static void test_gemm_speed(void) {
    static const int shapes[][2] = {{6144, 4096}, {28672, 4096}, {4096, 14336}, {4096, 4096}, {576, 576}};
    static const int Ts[] = {1, 8, 32, 64, 512};
    void *w = NULL, *x = NULL, *y = NULL;
    if (cudaMalloc(&w, (size_t)28672 * 4096 * 2) || cudaMalloc(&x, (size_t)512 * 14336 * 2) ||
        cudaMalloc(&y, (size_t)512 * 28672 * 4)) { CHECK(0, "no memory"); goto out; }
    cudaMemset(w, 0x3c, (size_t)28672 * 4096 * 2), cudaMemset(x, 0x3c, (size_t)512 * 14336 * 2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            int M = shapes[s][0], K = shapes[s][1], T = Ts[i], best = -1;
            float t_best = 1e9, t_pick = time_gemm(y, w, x, M, T, K, -1);
            printf("# gemm_bi %5d x %5d T=%3d: picked %.4f ms (%.2f TB/s of W, %.0f TFLOP/s); configs", M, K, T,
                   t_pick, (double)M * K * 2 / t_pick / 1e9, 2.0 * M * K * T / t_pick / 1e9);
            for (int c = 0; c < GEMM_BI_CONFIGS; c++) {
                float t = time_gemm(y, w, x, M, T, K, c);
                printf(" %d:%.4f", c, t);
                if (t < t_best) t_best = t, best = c;
            }
            printf(" -> best %d\n", best);
        }
out:
    cudaFree(w), cudaFree(x), cudaFree(y);
}

/* ---------- part 2: whole models ---------- */

#define N_SEQS 6
#define N_GEN 12
#define BLOCK 16
#define TABLE 24                 /* blocks per sequence: 384 tokens */
#define N_BLOCKS (N_SEQS * TABLE + 8)
#define MAX_T 512

static const int PROMPT[N_SEQS] = {300, 131, 37, 17, 2, 1};

typedef struct {
    int n;
    int32_t ids[MAX_T], pos[MAX_T], seq[MAX_T], rows[MAX_T];
    int64_t slot[MAX_T];
} Step;

typedef struct {
    Backend *be;
    Forward fw;
    float *logits;               /* [MAX_T][vocab] of the last step */
    float *stored;               /* [N_SEQS][len][vocab]: each row's logits (the one-at-a-time run) */
    int vocab, diff_rows, rows;  /* rows compared and rows that differed, this schedule */
    double worst;                /* largest max-rel difference of a differing row */
    bool storing;
} Runner;

static int32_t tables[N_SEQS][TABLE];
static const int32_t *table_ptrs[N_SEQS];
static int32_t tokens[N_SEQS][400];

static int seq_len(int s) { return PROMPT[s] + N_GEN; }

static void make_tables_and_tokens(int vocab) {
    int32_t perm[N_BLOCKS];
    test_shuffle(perm, N_BLOCKS, 4242);
    uint32_t r = 4242;
    for (int i = N_BLOCKS - 1; i > 0; i--) r = r * 1664525u + 1013904223u; /* the token stream as before */
    for (int s = 0; s < N_SEQS; s++) {
        for (int j = 0; j < TABLE; j++) tables[s][j] = perm[s * TABLE + j];
        table_ptrs[s] = tables[s];
        for (int p = 0; p < 400; p++) { r = r * 1103515245u + 12345u; tokens[s][p] = (int32_t)((r >> 8) % (uint32_t)vocab); }
    }
}

static void add_rows(Step *st, int s, int p0, int n) {
    for (int i = 0; i < n; i++) {
        int r = st->n++, p = p0 + i;
        st->ids[r] = tokens[s][p], st->pos[r] = p, st->seq[r] = s, st->rows[r] = r;
        st->slot[r] = (int64_t)tables[s][p / BLOCK] * BLOCK + p % BLOCK;
    }
}

/* Runs a step with logits for every row; stores them (one-at-a-time run) or
 * compares them with the stored ones. */
static int run_step(Runner *ru, const Step *st, Err *err) {
    AttnBatch b = {st->n, st->pos, st->seq, st->slot, N_SEQS, table_ptrs, BLOCK};
    size_t V = (size_t)ru->vocab;
    for (size_t i = 0; i < (size_t)st->n * V; i++) ru->logits[i] = NAN;
    if (forward_run(&ru->fw, st->ids, &b, st->rows, st->n, ru->logits, err)) return -1;
    for (int r = 0; r < st->n; r++) {
        float *keep = ru->stored + ((size_t)st->seq[r] * 400 + st->pos[r]) * V, *got = ru->logits + (size_t)r * V;
        if (ru->storing) { memcpy(keep, got, V * sizeof(float)); continue; }
        ru->rows++;
        if (memcmp(keep, got, V * sizeof(float))) {
            ru->diff_rows++;
            ru->worst = fmax(ru->worst, test_row_err(got, keep, (int)V));
        }
    }
    return 0;
}

/* Continuous batching as the scheduler does it: each step, one row for every
 * sequence past its prompt, then prompt chunks (engine_prompt_chunk) in
 * `order` while the budget lasts. */
static int sched_like(Runner *ru, int budget, bool reverse, Err *err) {
    int done[N_SEQS] = {0};
    Step *st = malloc(sizeof *st);
    int rc = 0;
    for (;;) {
        st->n = 0;
        int left = budget, busy = 0;
        for (int s = 0; s < N_SEQS; s++)
            if (done[s] >= PROMPT[s] && done[s] < seq_len(s) && left > 0) { add_rows(st, s, done[s], 1); done[s]++; left--; }
        for (int k = 0; k < N_SEQS; k++) {
            int s = reverse ? N_SEQS - 1 - k : k;
            if (done[s] >= PROMPT[s] || left == 0) continue;
            int c = engine_prompt_chunk(PROMPT[s] - done[s], left, budget);
            if (c == 0) continue;
            add_rows(st, s, done[s], c);
            done[s] += c, left -= c;
        }
        for (int s = 0; s < N_SEQS; s++) busy += done[s] < seq_len(s);
        if (st->n == 0) break;
        if ((rc = run_step(ru, st, err))) break;
        if (!busy) break;
    }
    free(st);
    return rc;
}

/* Each prompt in its own step, then decode steps of every live sequence at
 * once (6 rows: bucket 8; sequences leave early so buckets 4 and 2 follow). */
static int prompts_then_decode(Runner *ru, Err *err) {
    Step *st = malloc(sizeof *st);
    int rc = 0, done[N_SEQS];
    for (int s = 0; s < N_SEQS && !rc; s++) {
        st->n = 0;
        add_rows(st, s, 0, PROMPT[s]);
        done[s] = PROMPT[s];
        rc = run_step(ru, st, err);
    }
    for (int k = 0; k < N_GEN && !rc; k++) {
        int live = k < 4 ? N_SEQS : k < 8 ? 4 : 2; /* sequences 2.. and 4.. drop out, finish later */
        st->n = 0;
        for (int s = 0; s < live; s++) add_rows(st, s, done[s]++, 1);
        rc = run_step(ru, st, err);
    }
    /* the ones that left early finish alone */
    for (int s = 0; s < N_SEQS && !rc; s++)
        while (done[s] < seq_len(s) && !rc) {
            st->n = 0;
            add_rows(st, s, done[s]++, 1);
            rc = run_step(ru, st, err);
        }
    free(st);
    return rc;
}

/* Random chunk sizes (>= 2 rows, never leaving one) and random mixes. */
static int random_mix(Runner *ru, uint32_t seed, Err *err) {
    int done[N_SEQS] = {0};
    Step *st = malloc(sizeof *st);
    int rc = 0;
    for (int guard = 0; guard < 10000 && !rc; guard++) {
        st->n = 0;
        int busy = 0;
        for (int s = 0; s < N_SEQS; s++) {
            seed = seed * 1664525u + 1013904223u;
            if ((seed >> 24) % 3 == 0 || done[s] >= seq_len(s)) continue; /* sits this step out */
            if (done[s] >= PROMPT[s]) { add_rows(st, s, done[s]++, 1); continue; }
            int want = 2 + (int)((seed >> 8) % 90);
            int c = engine_prompt_chunk(PROMPT[s] - done[s], want, 512);
            if (c > 0 && st->n + c <= MAX_T) { add_rows(st, s, done[s], c); done[s] += c; }
        }
        for (int s = 0; s < N_SEQS; s++) busy += done[s] < seq_len(s);
        if (st->n > 0) rc = run_step(ru, st, err);
        if (!busy) break;
    }
    free(st);
    return rc;
}

static int one_at_a_time(Runner *ru, Err *err) {
    Step *st = malloc(sizeof *st);
    int rc = 0;
    for (int s = 0; s < N_SEQS && !rc; s++) {
        st->n = 0;
        add_rows(st, s, 0, PROMPT[s]);
        rc = run_step(ru, st, err);
        for (int p = PROMPT[s]; p < seq_len(s) && !rc; p++) {
            st->n = 0;
            add_rows(st, s, p, 1);
            rc = run_step(ru, st, err);
        }
    }
    free(st);
    return rc;
}

typedef struct {
    const char *name;
    bool bi, graphs;
} Mode;

/* Runs the five schedules in one mode; returns the rows that differed from
 * the one-at-a-time run (-1: a failure). alone_out keeps that run's logits. */
static int run_mode(const Model *m, const Mode *md, float **alone_out, Err *err) {
    Runner ru = {0};
    GpuRig o = {.block_size = BLOCK, .n_blocks = N_BLOCKS, .max_tokens = MAX_T, .no_graphs = !md->graphs,
                .batch_invariant = md->bi};
    ru.vocab = m->cfg.vocab;
    ru.be = gpu_backend(&m->shape, &m->w, &o, err);
    int rc = ru.be ? forward_init(&ru.fw, &m->cfg, ru.be, MAX_T, err) : -1;
    ru.logits = malloc((size_t)MAX_T * ru.vocab * sizeof(float));
    ru.stored = malloc((size_t)N_SEQS * 400 * ru.vocab * sizeof(float));
    if (!rc && (!ru.logits || !ru.stored)) rc = err_set(err, "out of memory");
    ru.storing = true;
    if (!rc) rc = one_at_a_time(&ru, err);
    ru.storing = false;
    int total = 0;
    const char *names[] = {"budget 64", "budget 200, reversed", "prompts then decode", "random mix"};
    for (int k = 0; k < 4 && !rc; k++) {
        ru.rows = ru.diff_rows = 0;
        ru.worst = 0;
        rc = k == 0 ? sched_like(&ru, 64, false, err) : k == 1 ? sched_like(&ru, 200, true, err)
                    : k == 2 ? prompts_then_decode(&ru, err) : random_mix(&ru, 99, err);
        if (rc) break;
        printf("#   %-26s %-22s %4d rows, %4d differ from one at a time (worst %.2e)\n", md->name, names[k], ru.rows,
               ru.diff_rows, ru.worst);
        total += ru.diff_rows;
    }
    if (ru.fw.cfg) forward_free(&ru.fw);
    if (ru.be) ru.be->destroy(ru.be);
    free(ru.logits);
    if (!rc && alone_out) *alone_out = ru.stored;
    else free(ru.stored);
    return rc ? -1 : total;
}

static const char *model_path;

static void test_model(void) {
    Err err = {{0}};
    Model m;
    if (model_load(&m, model_path, MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
    make_tables_and_tokens(m.cfg.vocab);
    printf("# %s\n", model_path);
    static const Mode modes[] = {{"batch-invariant, graphs", true, true},
                                 {"batch-invariant, no graphs", true, false},
                                 {"default", false, true}};
    float *alone[2] = {NULL, NULL};
    int diff[3];
    for (int i = 0; i < 3; i++) {
        diff[i] = run_mode(&m, &modes[i], i < 2 ? &alone[i] : NULL, &err);
        CHECK(diff[i] >= 0, "%s: %s", modes[i].name, err.msg);
    }
    CHECK(diff[0] == 0 && diff[1] == 0, "batch-invariant mode: %d / %d rows differ from one at a time", diff[0],
          diff[1]);
    /* a replayed graph computes what the issued kernels compute */
    if (alone[0] && alone[1]) {
        int same = 1;
        for (int s = 0; s < N_SEQS; s++)
            same &= !memcmp(alone[0] + (size_t)s * 400 * m.cfg.vocab, alone[1] + (size_t)s * 400 * m.cfg.vocab,
                            (size_t)seq_len(s) * m.cfg.vocab * sizeof(float));
        CHECK(same, "batch-invariant: graphs on and off differ");
    }
    /* the check has teeth: the default mode's GEMMs and splits change with T */
    CHECK(diff[2] > 0, "the default mode showed no batch effect: the schedules do not exercise them");
    free(alone[0]), free(alone[1]);
    model_free(&m);
}

int main(int argc, char **argv) {
    bool timing = true, models = true, gemm = true;
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--no-timing")) timing = false;
        else if (!strcmp(argv[first], "--gemm-only")) models = false;
        else if (!strcmp(argv[first], "--models-only")) gemm = timing = false;
    }
    if (gemm) RUN(test_gemm_invariant);
    if (timing) RUN(test_gemm_speed);
    if (!models) TEST_EXIT();
    for (int i = first; i < argc; i++) {
        model_path = argv[i];
        RUN(test_model);
    }
    TEST_EXIT();
}
