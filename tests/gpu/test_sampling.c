/* test_sampling.c — the GPU sampler against the CPU sampler (engine/sampler.c),
 * run on a GPU machine by tests/gpu/run.sh; never in CI.
 *
 *   - greedy (temperature 0, top_k 1): the same token as the CPU on every row
 *     (random, ties, NaN/inf, peaked, flat, all -inf/NaN), exactly;
 *   - sampled: the same CPU Sampler state feeds both (the GPU takes its
 *     peeked uniform); every parameter combination, logits kinds and
 *     vocabularies 7 .. 262144 incl. odd sizes, several steps with penalty
 *     windows: tokens agree on >= 99.9% of trials, every disagreement is a
 *     boundary case (the GPU at u -/+ 1e-6 gives the CPU's token), and the
 *     generators stay in step (the GPU row drew exactly when the CPU did);
 *   - refused settings (top_k above the GPU limit, wrong vocabulary);
 *   - timing per step at vocabulary 128256, batch 1 and 64 (CUDA events,
 *     median), against the bytes-read floor, and the CPU path (copy the
 *     logits to the host, sample there) for comparison. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/sampler.h"
#include "kernels/cuda/sampling.cuh"
#include "tests/test.h"

#define COPY_BW 4.26e12 /* ANCHORS.md: H200 device copy, bytes/s */

/* ---- random inputs ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static double rnd01(void) { return (double)(rnd64() >> 11) * 0x1.0p-53; }
static float rnd_normal(void) { return (float)(sqrt(-2.0 * log(rnd01() + 1e-300)) * cos(6.283185307179586 * rnd01())); }

enum { K_NORMAL, K_TIES, K_NANINF, K_PEAKED, K_FLAT, K_NEARFLAT, K_DEAD, N_KINDS };
static const char *kind_name[N_KINDS] = {"normal", "ties", "naninf", "peaked", "flat", "nearflat", "dead"};

static void fill_logits(float *l, int n, int kind) {
    for (int i = 0; i < n; i++) {
        float v = 3.0f * rnd_normal();
        switch (kind) {
        case K_TIES: v = roundf(v * 2.0f) / 2.0f; break;
        case K_NANINF: {
            uint64_t r = rnd64() % 1000;
            v = r < 10 ? NAN : r < 20 ? -INFINITY : r < 21 ? -0.0f : v;
            break;
        }
        case K_PEAKED: v = rnd64() % 5000 == 0 ? 12.0f + rnd_normal() : rnd_normal(); break;
        case K_FLAT: v = 0.5f; break;
        case K_NEARFLAT: v = 0.01f * rnd_normal(); break;
        case K_DEAD: v = rnd64() % 2 ? NAN : -INFINITY; break;
        }
        l[i] = v;
    }
    if (kind == K_NANINF && rnd64() % 3 == 0) l[rnd64() % n] = INFINITY, l[rnd64() % n] = INFINITY;
    if (kind == K_DEAD && rnd64() % 2 && n > 3) l[n / 3] = -FLT_MAX; /* one finite logit */
}

/* ---- parameter sets ---- */

typedef struct {
    const char *name;
    float temp, top_p, min_p, rep, pres, freq;
    int top_k, last_n;
} Params;

static const Params PARAMS[] = {
    {"greedy", 0.0f, 0.95f, 0.05f, 1, 0, 0, 40, 64},
    {"topk1", 0.9f, 1.0f, 0.0f, 1, 0, 0, 1, 64},
    {"greedy+pen", 0.0f, 1.0f, 0.0f, 1.3f, 0.5f, 0.2f, 0, 64},
    {"temp-only", 1.0f, 1.0f, 0.0f, 1, 0, 0, 0, 64},
    {"default", 0.8f, 0.95f, 0.05f, 1, 0, 0, 40, 64},
    {"topk1024", 1.2f, 1.0f, 0.0f, 1, 0, 0, 1024, 64},
    {"topk7+topp", 1.0f, 0.6f, 0.0f, 1, 0, 0, 7, 64},
    {"topp0.9", 1.0f, 0.9f, 0.0f, 1, 0, 0, 0, 64},
    {"topp0.5+minp", 0.7f, 0.5f, 0.1f, 1, 0, 0, 0, 64},
    {"minp-only", 1.5f, 1.0f, 0.02f, 1, 0, 0, 0, 64},
    {"topp0", 1.0f, 0.0f, 0.0f, 1, 0, 0, 0, 64},
    {"topk>=vocab+topp", 1.0f, 0.8f, 0.0f, 1, 0, 0, 300000, 64},
    {"pen+topk50+topp", 0.9f, 0.9f, 0.0f, 1.3f, 0.5f, 0.2f, 50, 64},
    {"pen-all+topp+minp", 1.1f, 0.95f, 0.05f, 0.8f, -0.3f, 0.4f, 0, 0},
    {"hot", 40.0f, 0.99f, 0.0f, 1, 0, 0, 0, 64},
};
#define N_PARAMS ((int)(sizeof PARAMS / sizeof PARAMS[0]))

static SamplerParams to_sampler(const Params *p, uint64_t seed) {
    return (SamplerParams){.temperature = p->temp, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
                           .repetition_penalty = p->rep, .presence_penalty = p->pres, .frequency_penalty = p->freq,
                           .penalty_last_n = p->last_n, .seed = seed};
}

/* ---- one batch of rows through both samplers ---- */

typedef struct {
    long trials, sampled, mismatches, boundary, drew_mismatch, bad_tokens;
} Tally;

static Tally tally_all;

/* Stages row r from sampler s as the scheduler does (sampler_row). */
static int set_row(GpuSampler *g, int r, const Sampler *s, Err *err) {
    static int32_t ids[4096], counts[4096];
    SampleRow row;
    if (sampler_row(s, &row, ids, counts, 4096) > 4096) return err_set(err, "penalty window over 4096");
    return gpu_sampler_set_row(g, r, &row, err);
}

/* After a step: advances the generator of each row whose draw used its
 * uniform, as the scheduler does. */
static void finish_rows(const GpuSampler *g, Sampler *const *s, int rows) {
    for (int r = 0; r < rows; r++)
        if (g->h_out[g->max_rows + r]) sampler_uniform_skip(s[r]);
}

/* Runs the GPU on host logits h (restored to the device first) with each
 * row's uniform replaced by u[r] when u is given. */
static int gpu_step(GpuSampler *g, Sampler *const *s, int rows, int V, const float *h, float *d, const double *u,
                    cudaStream_t st, Err *err) {
    if (cudaMemcpyAsync(d, h, (size_t)rows * V * sizeof *h, cudaMemcpyHostToDevice, st) != cudaSuccess)
        return err_set(err, "upload");
    for (int r = 0; r < rows; r++) {
        if (set_row(g, r, s[r], err)) return -1;
        if (u) g->h_rows[r].uniform = u[r];
    }
    cudaMemsetAsync(g->d_out, 0x7f, 2 * (size_t)g->max_rows * sizeof(int32_t), st); /* poison */
    if (gpu_sampler_run(g, d, rows, st, err)) return -1;
    if (cudaStreamSynchronize(st) != cudaSuccess) return err_set(err, "sync: %s", cudaGetErrorString(cudaGetLastError()));
    return 0;
}

static void run_batch(int V, int rows, int kind, const Params *pp, int steps) {
    Err err = {{0}};
    Sampler *cpu = calloc(rows, sizeof *cpu), *gpu = calloc(rows, sizeof *gpu);
    Sampler **gp = calloc(rows, sizeof *gp);
    float *h = malloc((size_t)rows * V * sizeof *h), *work = malloc((size_t)V * sizeof *work), *d = NULL;
    int32_t *gtok = malloc(rows * sizeof *gtok), *gdrew = malloc(rows * sizeof *gdrew), *ct = malloc(rows * sizeof *ct);
    double *u = malloc(rows * sizeof *u), *ul = malloc(rows * sizeof *ul);
    bool *miss = malloc(rows * sizeof *miss);
    GpuSampler g = {0};
    cudaStream_t st;
    cudaStreamCreate(&st);
    int ok = cudaMalloc((void **)&d, (size_t)rows * V * sizeof *d) == cudaSuccess;
    CHECK(ok, "cudaMalloc of %d x %d logits", rows, V);
    ok = ok && gpu_sampler_build(&g, rows, V, rows * (pp->last_n ? pp->last_n : 256), &err) == 0;
    for (int r = 0; r < rows && ok; r++) {
        SamplerParams sp = to_sampler(pp, 1000 + (uint64_t)r * 7919 + (uint64_t)V);
        ok = sampler_init(&cpu[r], &sp, V, &err) == 0 && sampler_init(&gpu[r], &sp, V, &err) == 0;
        gp[r] = &gpu[r];
        for (int t = 0; ok && t < 40; t++) { /* a prompt in the window */
            int32_t tok = (int32_t)(rnd64() % (uint64_t)V);
            if (t % 3) tok = (int32_t)(rnd64() % (uint64_t)(V < 64 ? V : 64)); /* repeats */
            sampler_accept(&cpu[r], tok);
            sampler_accept(&gpu[r], tok);
        }
    }
    CHECK(ok, "set-up V=%d %s: %s", V, pp->name, err.msg);
    bool greedy = pp->temp == 0.0f || pp->top_k == 1;
    for (int step = 0; ok && step < steps; step++) {
        for (int r = 0; r < rows; r++) fill_logits(h + (size_t)r * V, V, kind);
        for (int r = 0; r < rows; r++) u[r] = sampler_uniform_peek(&gpu[r]);
        if (gpu_step(&g, gp, rows, V, h, d, NULL, st, &err)) { CHECK(0, "%s", err.msg); break; }
        memcpy(gtok, g.h_out, rows * sizeof *gtok);
        memcpy(gdrew, g.h_out + g.max_rows, rows * sizeof *gdrew);
        finish_rows(&g, gp, rows);
        int n_miss = 0;
        for (int r = 0; r < rows; r++) {
            memcpy(work, h + (size_t)r * V, V * sizeof *work);
            ct[r] = sampler_sample(&cpu[r], work, V);
            bool same_rng = memcmp(gpu[r].rng, cpu[r].rng, sizeof cpu[r].rng) == 0;
            tally_all.trials++;
            if (!greedy) tally_all.sampled++;
            if (gtok[r] < 0 || gtok[r] >= V) tally_all.bad_tokens++;
            if (!same_rng) tally_all.drew_mismatch++;
            CHECK(same_rng, "V=%d %s %s row %d: the GPU drew=%d but the CPU generator %s", V, kind_name[kind],
                  pp->name, r, gdrew[r], gdrew[r] ? "did not advance" : "advanced");
            if (greedy)
                CHECK(gtok[r] == ct[r], "greedy V=%d %s %s row %d: gpu %d cpu %d", V, kind_name[kind], pp->name, r,
                      gtok[r], ct[r]);
            miss[r] = gtok[r] != ct[r];
            n_miss += miss[r];
            memcpy(gpu[r].rng, cpu[r].rng, sizeof cpu[r].rng); /* keep the generators in step after a miss */
        }
        if (n_miss && !greedy) { /* a boundary case: the GPU at u -/+ d gives the CPU's token, d <= 1e-6 */
            bool *bnd = calloc(rows, sizeof *bnd);
            for (double dl = 1e-10; dl <= 1.01e-6; dl *= 10)
                for (int sgn = -1; sgn <= 1; sgn += 2) {
                    for (int r = 0; r < rows; r++) ul[r] = fmin(1.0 - 0x1p-53, fmax(0.0, u[r] + sgn * dl));
                    if (gpu_step(&g, gp, rows, V, h, d, ul, st, &err)) { CHECK(0, "%s", err.msg); break; }
                    for (int r = 0; r < rows; r++) bnd[r] |= g.h_out[r] == ct[r];
                }
            for (int r = 0; r < rows; r++) {
                if (!miss[r]) continue;
                tally_all.mismatches++;
                tally_all.boundary += bnd[r];
                printf("# mismatch V=%d %s %s row %d u=%.17g: gpu %d cpu %d%s\n", V, kind_name[kind], pp->name, r,
                       u[r], gtok[r], ct[r], bnd[r] ? " (boundary: the GPU gives it within 1e-6 of u)" : " NOT A BOUNDARY CASE");
                CHECK(bnd[r], "a mismatch that is not a boundary case");
            }
            free(bnd);
        }
        for (int r = 0; r < rows; r++) { /* the CPU token joins both windows */
            sampler_accept(&cpu[r], ct[r]);
            sampler_accept(&gpu[r], ct[r]);
        }
    }
    gpu_sampler_free(&g);
    cudaFree(d);
    cudaStreamDestroy(st);
    for (int r = 0; r < rows; r++) sampler_free(&cpu[r]), sampler_free(&gpu[r]);
    free(cpu), free(gpu), free(gp), free(h), free(work), free(gtok), free(gdrew), free(ct);
    free(u), free(ul), free(miss);
}

static const int VOCABS[] = {7, 1000, 32000, 50257, 128256, 262144};
#define N_VOCABS ((int)(sizeof VOCABS / sizeof VOCABS[0]))

/* SAMPLING_SMALL=1 (for compute-sanitizer): small vocabularies, one step, no timing. */
static bool small_run(void) { return getenv("SAMPLING_SMALL") != NULL; }

/* SAMPLING_STEPS=N: steps per batch (default 3 sampled, 2 greedy). */
static int steps(bool greedy) {
    const char *e = getenv("SAMPLING_STEPS");
    return small_run() ? 1 : e && atoi(e) > 0 ? atoi(e) : greedy ? 2 : 3;
}

static int rows_for(int V) { return V >= 262144 ? 6 : V >= 128256 ? 12 : V >= 32000 ? 24 : 48; }

static void run_params(bool want_greedy) {
    for (int pi = 0; pi < N_PARAMS; pi++) {
        const Params *pp = &PARAMS[pi];
        bool greedy = pp->temp == 0.0f || pp->top_k == 1;
        if (greedy != want_greedy) continue;
        for (int vi = 0; vi < N_VOCABS; vi++) {
            if (small_run() && VOCABS[vi] > 50257) continue;
            for (int k = 0; k < N_KINDS; k++)
                run_batch(VOCABS[vi], small_run() ? 4 : rows_for(VOCABS[vi]), k, pp, steps(greedy));
        }
    }
}

static void test_greedy_exact(void) {
    Tally before = tally_all;
    run_params(true);
    CHECK(tally_all.bad_tokens == before.bad_tokens, "tokens outside the vocabulary");
    printf("# greedy: %ld rows, all equal to the CPU\n", tally_all.trials - before.trials);
}

static void test_sampled_match(void) {
    Tally before = tally_all;
    run_params(false);
    long n = tally_all.sampled - before.sampled, miss = tally_all.mismatches - before.mismatches;
    long boundary = tally_all.boundary - before.boundary;
    CHECK(tally_all.bad_tokens == before.bad_tokens, "tokens outside the vocabulary");
    CHECK(n > (small_run() ? 100 : 10000), "only %ld sampled trials", n);
    CHECK(miss * 1000 <= n, "%ld mismatches in %ld trials: below 99.9%% agreement", miss, n);
    printf("# sampled: %ld trials, %ld mismatches (%.4f%%), %ld of them boundary cases; generator out of step %ld\n", n,
           miss, 100.0 * miss / (n ? n : 1), boundary, tally_all.drew_mismatch - before.drew_mismatch);
}

static void test_refused(void) {
    Err err = {{0}};
    GpuSampler g;
    Sampler s;
    CHECK(gpu_sampler_build(&g, 2, 1000, 16, &err) == 0, "%s", err.msg);
    SamplerParams p = sampler_params_default();
    p.top_k = 2000;
    CHECK(sampler_init(&s, &p, 1000, &err) == 0, "%s", err.msg);
    CHECK(set_row(&g, 0, &s, &err) == 0, "top_k 2000 >= vocabulary 1000 is allowed: %s", err.msg);
    sampler_free(&s);
    p.top_k = 1025;
    CHECK(sampler_init(&s, &p, 1000, &err) == 0, "%s", err.msg);
    CHECK(set_row(&g, 0, &s, &err) == 0, "top_k 1025 >= vocabulary 1000 is allowed: %s", err.msg);
    sampler_free(&s);
    gpu_sampler_free(&g);
    CHECK(gpu_sampler_build(&g, 2, 5000, 16, &err) == 0, "%s", err.msg);
    CHECK(sampler_init(&s, &p, 5000, &err) == 0, "%s", err.msg);
    CHECK(set_row(&g, 0, &s, &err) == -1 && strstr(err.msg, "top_k"), "top_k 1025 < 5000: %s", err.msg);
    CHECK(set_row(&g, 2, &s, &err) == -1, "row 2 of 2");
    sampler_free(&s);
    gpu_sampler_free(&g);
}

/* ---- timing ---- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define REPS 200
#define SETS 4

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void time_case(int V, int rows, const Params *pp) {
    Err err = {{0}};
    size_t row_bytes = (size_t)V * sizeof(float);
    float *h = malloc(rows * row_bytes), *d[SETS] = {0}, *pinned = NULL;
    for (int r = 0; r < rows; r++) fill_logits(h + (size_t)r * V, V, K_NORMAL);
    for (int k = 0; k < SETS; k++) { /* rotate input sets so L2 does not hold them all */
        CHECK(cudaMalloc((void **)&d[k], rows * row_bytes) == cudaSuccess, "cudaMalloc");
        cudaMemcpy(d[k], h, rows * row_bytes, cudaMemcpyHostToDevice);
    }
    cudaMallocHost((void **)&pinned, row_bytes);
    Sampler *s = calloc(rows, sizeof *s);
    Sampler **sp = calloc(rows, sizeof *sp);
    GpuSampler g;
    CHECK(gpu_sampler_build(&g, rows, V, rows * 64, &err) == 0, "%s", err.msg);
    for (int r = 0; r < rows; r++) {
        SamplerParams p = to_sampler(pp, (uint64_t)r);
        sampler_init(&s[r], &p, V, &err);
        sp[r] = &s[r];
    }
    cudaStream_t st;
    cudaEvent_t e0, e1;
    cudaStreamCreate(&st);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms[REPS];
    double host_ms[REPS];
    for (int it = -10; it < REPS; it++) {
        double t0 = now_s();
        for (int r = 0; r < rows; r++) set_row(&g, r, &s[r], &err);
        cudaEventRecord(e0, st); /* upload of the rows, kernel, tokens back */
        gpu_sampler_run(&g, d[(it + 10) % SETS], rows, st, &err);
        cudaEventRecord(e1, st);
        cudaStreamSynchronize(st);
        finish_rows(&g, sp, rows);
        if (it >= 0) cudaEventElapsedTime(&ms[it], e0, e1), host_ms[it] = (now_s() - t0) * 1e3;
    }
    qsort(ms, REPS, sizeof *ms, cmp_float);
    float hm[REPS];
    for (int i = 0; i < REPS; i++) hm[i] = (float)host_ms[i];
    qsort(hm, REPS, sizeof *hm, cmp_float);
    double floor_us = rows * row_bytes / COPY_BW * 1e6;
    /* the CPU path for one row: copy the logits to the host, sample there */
    double cpu_ms = 0;
    if (rows == 1) {
        float tt[21];
        for (int it = 0; it < 21; it++) {
            double t0 = now_s();
            cudaMemcpy(pinned, d[0], row_bytes, cudaMemcpyDeviceToHost);
            memcpy(h, pinned, row_bytes);
            sampler_sample(&s[0], h, V);
            tt[it] = (float)((now_s() - t0) * 1e3);
        }
        qsort(tt, 21, sizeof *tt, cmp_float);
        cpu_ms = tt[10];
    }
    printf("# TIME V=%d batch %2d %-18s gpu step %8.1f us (events, median; host round trip %7.1f us), "
           "bytes floor %6.2f us (%.1f%%)", V, rows, pp->name, ms[REPS / 2] * 1e3, hm[REPS / 2] * 1e3, floor_us,
           100.0 * floor_us / (ms[REPS / 2] * 1e3));
    if (rows == 1) printf(", cpu path (copy + sample) %8.1f us", cpu_ms * 1e3);
    printf("\n");
    CHECK(err.msg[0] == 0, "%s", err.msg);
    for (int r = 0; r < rows; r++) sampler_free(&s[r]);
    gpu_sampler_free(&g);
    for (int k = 0; k < SETS; k++) cudaFree(d[k]);
    cudaFreeHost(pinned);
    cudaStreamDestroy(st);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(s), free(sp), free(h);
}

static void test_timing(void) {
    static const int pick[] = {0, 4, 7, 9, 3};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 5; i++) time_case(128256, b ? 64 : 1, &PARAMS[pick[i]]);
}

int main(void) {
    RUN(test_refused);
    RUN(test_greedy_exact);
    RUN(test_sampled_match);
    if (!small_run()) RUN(test_timing);
    TEST_EXIT();
}
