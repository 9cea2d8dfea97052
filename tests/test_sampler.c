/* test_sampler.c — the sampler, step by step against distributions worked out
 * by hand from the definitions in kernels/sample_row.c (each expected number has its
 * formula beside it), then greedy, seeds, a chi-square check of 20k draws,
 * NaN/inf rows, bad parameters, the progressive top-p path against a full
 * sort, and a timing note on a 262k vocabulary. */
#include <time.h>

#include "engine/sampler.h"
#include "tests/test.h"

static SamplerParams params_plain(void) {
    SamplerParams p = sampler_params_default();
    p.temperature = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
    return p;
}

/* Runs sampler_probs on a 4-token row after accepting `hist`, and checks the
 * candidate ids and probabilities against the hand-computed ones. */
static void probs_expect(const char *what, SamplerParams p, const float row[4], const int32_t *hist, int n_hist,
                         const int32_t *ids, const double *probs, int n) {
    Sampler s;
    Err err = {{0}};
    CHECK(sampler_init(&s, &p, 4, &err) == 0, "%s: %s", what, err.msg);
    for (int i = 0; i < n_hist; i++) sampler_accept(&s, hist[i]);
    float logits[4];
    memcpy(logits, row, sizeof logits);
    int32_t got_ids[4];
    float got_p[4];
    int got = sampler_probs(&s, logits, 4, got_ids, got_p);
    CHECK(got == n, "%s: %d candidates, want %d", what, got, n);
    for (int i = 0; i < n && i < got; i++) {
        CHECK(got_ids[i] == ids[i], "%s: candidate %d is %d, want %d", what, i, got_ids[i], ids[i]);
        CHECK(fabs(got_p[i] - probs[i]) <= 1e-6, "%s: p[%d] = %.9f, want %.9f", what, i, got_p[i], probs[i]);
    }
    sampler_free(&s);
}

static const float L1234[4] = {1, 2, 3, 4};

/* Temperature, top-k, top-p, min-p on logits {1,2,3,4}; e = exp. */
static void test_filters_by_hand(void) {
    SamplerParams p = params_plain();
    /* softmax(1,2,3,4): e^4/S, e^3/S, e^2/S, e^1/S, S = e+e^2+e^3+e^4 */
    probs_expect("T=1", p, L1234, NULL, 0, (int32_t[]){3, 2, 1, 0},
                 (double[]){0.643914260, 0.236882818, 0.087144319, 0.032058603}, 4);
    /* T=2: x = (0.5, 1, 1.5, 2) */
    p.temperature = 2.0f;
    probs_expect("T=2", p, L1234, NULL, 0, (int32_t[]){3, 2, 1, 0},
                 (double[]){0.455054234, 0.276004345, 0.167405097, 0.101536324}, 4);
    /* T=2, top-k 2: e^2/(e^2+e^1.5) = 1/(1+e^-0.5) */
    p.top_k = 2;
    probs_expect("T=2 top-k 2", p, L1234, NULL, 0, (int32_t[]){3, 2}, (double[]){0.622459331, 0.377540669}, 2);
    /* T=1, top-p 0.8: 0.6439 < 0.8 <= 0.6439+0.2369 -> ids 3,2: e^4/(e^4+e^3) = 1/(1+e^-1) */
    p = params_plain();
    p.top_p = 0.8f;
    probs_expect("top-p 0.8", p, L1234, NULL, 0, (int32_t[]){3, 2}, (double[]){0.731058579, 0.268941421}, 2);
    /* top-p 0.9: 0.8808 < 0.9 -> three tokens, renormalized over e^4, e^3, e^2 */
    p.top_p = 0.9f;
    probs_expect("top-p 0.9", p, L1234, NULL, 0, (int32_t[]){3, 2, 1},
                 (double[]){0.665240956, 0.244728471, 0.090030573}, 3);
    /* top-p 0.6 <= 0.6439: the top token alone; top-p 0: still one token */
    p.top_p = 0.6f;
    probs_expect("top-p 0.6", p, L1234, NULL, 0, (int32_t[]){3}, (double[]){1.0}, 1);
    p.top_p = 0.0f;
    probs_expect("top-p 0", p, L1234, NULL, 0, (int32_t[]){3}, (double[]){1.0}, 1);
    /* min-p 0.3: keep p >= 0.3 p_max, i.e. e^(x-4) >= 0.3: e^0, e^-1 = 0.368 yes, e^-2 = 0.135 no */
    p = params_plain();
    p.min_p = 0.3f;
    probs_expect("min-p 0.3", p, L1234, NULL, 0, (int32_t[]){3, 2}, (double[]){0.731058579, 0.268941421}, 2);
    /* min-p 0.1: e^-2 = 0.135 stays, e^-3 = 0.050 goes */
    p.min_p = 0.1f;
    probs_expect("min-p 0.1", p, L1234, NULL, 0, (int32_t[]){3, 2, 1},
                 (double[]){0.665240956, 0.244728471, 0.090030573}, 3);
    /* All four in order: T=2, top-k 3 -> x (2, 1.5, 1), p = (0.5065, 0.3072, 0.1863);
     * top-p 0.8 -> 0.5065 < 0.8 <= 0.8137: ids 3,2; min-p 0.5: e^-0.5 = 0.607 stays */
    p = (SamplerParams){.temperature = 2.0f, .top_k = 3, .top_p = 0.8f, .min_p = 0.5f, .repetition_penalty = 1.0f};
    probs_expect("T2 k3 p0.8 min0.5", p, L1234, NULL, 0, (int32_t[]){3, 2}, (double[]){0.622459331, 0.377540669}, 2);
    /* ... and min-p 0.7 > e^-0.5 drops id 2 */
    p.min_p = 0.7f;
    probs_expect("T2 k3 p0.8 min0.7", p, L1234, NULL, 0, (int32_t[]){3}, (double[]){1.0}, 1);
}

static void test_penalties_by_hand(void) {
    /* Repetition 2 (HF), history {0,3,3}: id 0 (-1 < 0) -> -1*2 = -2, id 3 (4 > 0)
     * -> 4/2 = 2, once although seen twice: logits (-2, 2, 3, 2); ties 1,3 by id */
    SamplerParams p = params_plain();
    p.repetition_penalty = 2.0f;
    const float row[4] = {-1, 2, 3, 4};
    probs_expect("repetition 2", p, row, (int32_t[]){0, 3, 3}, 3, (int32_t[]){2, 1, 3, 0},
                 (double[]){0.573889136, 0.211122015, 0.211122015, 0.003866835}, 4);
    /* Presence 0.5, frequency 0.25 (OpenAI), history {0,3,3,3}: id 0: 1-0.5-0.25 = 0.25,
     * id 3: 4-0.5-0.75 = 2.75 -> (0.25, 2, 3, 2.75) */
    p = params_plain();
    p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f;
    probs_expect("presence+frequency", p, L1234, (int32_t[]){0, 3, 3, 3}, 4, (int32_t[]){2, 3, 1, 0},
                 (double[]){0.452364219, 0.352301608, 0.166415496, 0.028918677}, 4);
    /* Window of 2, history {3,0,1}: only 0 and 1 count; repetition 2 -> (0.5, 1, 3, 4) */
    p = params_plain();
    p.repetition_penalty = 2.0f, p.penalty_last_n = 2;
    probs_expect("window 2", p, L1234, (int32_t[]){3, 0, 1}, 3, (int32_t[]){3, 2, 1, 0},
                 (double[]){0.690672656, 0.254084271, 0.034386567, 0.020856507}, 4);
    /* All three, history {2,2}: id 2: 3/1.5 = 2, then -0.1 - 0.2*2 -> 1.5: (1, 2, 1.5, 4) */
    p = params_plain();
    p.repetition_penalty = 1.5f, p.presence_penalty = 0.1f, p.frequency_penalty = 0.2f, p.penalty_last_n = 0;
    probs_expect("all penalties", p, L1234, (int32_t[]){2, 2}, 2, (int32_t[]){3, 1, 2, 0},
                 (double[]){0.789136837, 0.106798057, 0.064776296, 0.039288810}, 4);
    /* Greedy sees penalties: repetition 2 on id 3 -> (1, 2, 3, 2): argmax 2 */
    p = params_plain();
    p.temperature = 0.0f, p.repetition_penalty = 2.0f;
    probs_expect("greedy after penalty", p, L1234, (int32_t[]){3, 99, -1}, 3, (int32_t[]){2}, (double[]){1.0}, 1);
    /* reset forgets the history: no penalty after it */
    Sampler s;
    Err err = {{0}};
    CHECK(sampler_init(&s, &p, 4, &err) == 0, "%s", err.msg);
    sampler_accept(&s, 3);
    sampler_reset(&s);
    float l[4] = {1, 2, 3, 4};
    CHECK(sampler_sample(&s, l, 4) == 3, "history survived reset");
    sampler_free(&s);
}

static void test_greedy_and_bad_rows(void) {
    SamplerParams p = params_plain();
    p.temperature = 0.0f;
    Sampler s;
    Err err = {{0}};
    CHECK(sampler_init(&s, &p, 4, &err) == 0, "%s", err.msg);
    struct { float l[4]; int32_t want; const char *what; } g[] = {
        {{1, 5, 5, 2}, 1, "ties -> lowest id"},
        {{NAN, 1, NAN, 0}, 1, "NaN skipped"},
        {{-INFINITY, -INFINITY, -INFINITY, -INFINITY}, 0, "all -inf -> 0"},
        {{NAN, NAN, NAN, NAN}, 0, "all NaN -> 0"},
        {{0, INFINITY, 1, INFINITY}, 1, "+inf"},
    };
    for (int i = 0; i < 5; i++) CHECK(sampler_sample(&s, g[i].l, 4) == g[i].want, "greedy: %s", g[i].what);
    sampler_free(&s);

    /* Sampling: NaN never drawn; +inf rows draw among the +inf tokens; no
     * finite logit at all -> token 0, never a crash. */
    probs_expect("NaN rows", params_plain(), (float[]){NAN, 0, 0, NAN}, NULL, 0, (int32_t[]){1, 2},
                 (double[]){0.5, 0.5}, 2);
    probs_expect("+inf rows", params_plain(), (float[]){0, INFINITY, 1, INFINITY}, NULL, 0, (int32_t[]){1, 3},
                 (double[]){0.5, 0.5}, 2);
    probs_expect("all -inf", params_plain(), (float[]){-INFINITY, -INFINITY, -INFINITY, -INFINITY}, NULL, 0,
                 (int32_t[]){0}, (double[]){1.0}, 1);
    p = params_plain();
    p.temperature = 1e-30f; /* 1/T overflows: greedy */
    probs_expect("tiny temperature", p, L1234, NULL, 0, (int32_t[]){3}, (double[]){1.0}, 1);
    CHECK(sampler_init(&s, &(SamplerParams){.temperature = 0.7f, .top_p = 1, .repetition_penalty = 1}, 4, &err) == 0,
          "%s", err.msg);
    for (int i = 0; i < 100; i++) {
        float l[4] = {NAN, -INFINITY, NAN, -INFINITY};
        CHECK(sampler_sample(&s, l, 4) == 0, "no finite logit");
        float big[8] = {0, 0, 0, 50, 0, 0, 0, 0}; /* more logits than the vocabulary: clamped, no overrun */
        int32_t t = sampler_sample(&s, big, 8);
        CHECK(t >= 0 && t < 4, "token %d outside the vocabulary", t);
    }
    sampler_free(&s);
}

static void test_bad_params(void) {
    struct { SamplerParams p; const char *field; } bad[] = {
        {{.temperature = -1, .top_p = 1, .repetition_penalty = 1}, "temperature"},
        {{.temperature = NAN, .top_p = 1, .repetition_penalty = 1}, "temperature"},
        {{.top_k = -1, .top_p = 1, .repetition_penalty = 1}, "top_k"},
        {{.top_p = 1.5f, .repetition_penalty = 1}, "top_p"},
        {{.top_p = NAN, .repetition_penalty = 1}, "top_p"},
        {{.top_p = 1, .min_p = -0.1f, .repetition_penalty = 1}, "min_p"},
        {{.top_p = 1, .repetition_penalty = 0}, "repetition_penalty"},
        {{.top_p = 1, .repetition_penalty = INFINITY}, "repetition_penalty"},
        {{.top_p = 1, .repetition_penalty = 1, .presence_penalty = NAN}, "presence_penalty"},
        {{.top_p = 1, .repetition_penalty = 1, .frequency_penalty = INFINITY}, "frequency_penalty"},
        {{.top_p = 1, .repetition_penalty = 1, .penalty_last_n = -5}, "penalty_last_n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Sampler s;
        Err err = {{0}};
        CHECK(sampler_init(&s, &bad[i].p, 10, &err) == -1 && strstr(err.msg, bad[i].field), "%s: '%s'",
              bad[i].field, err.msg);
    }
    Sampler s;
    Err err = {{0}};
    SamplerParams p = sampler_params_default();
    CHECK(sampler_init(&s, &p, 0, &err) == -1 && strstr(err.msg, "vocabulary"), "vocab 0: '%s'", err.msg);
}

/* Draws n tokens from logits {1,2,3,4} (fresh copy each step). */
static void draw_many(Sampler *s, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        float l[4] = {1, 2, 3, 4};
        out[i] = sampler_sample(s, l, 4);
    }
}

static void test_seeds(void) {
    SamplerParams p = params_plain();
    enum { N = 1000 };
    static int32_t a[N], b[N], c[N];
    Sampler s;
    Err err = {{0}};
    p.seed = 42;
    sampler_init(&s, &p, 4, &err);
    draw_many(&s, N, a);
    sampler_reset(&s);
    draw_many(&s, N / 2, b); /* probs between draws must not move the generator */
    float l[4] = {1, 2, 3, 4};
    int32_t ids[4];
    float pr[4];
    sampler_probs(&s, l, 4, ids, pr);
    draw_many(&s, N / 2, b + N / 2);
    sampler_free(&s);
    CHECK(!memcmp(a, b, sizeof a), "same seed, different draws");
    p.seed = 43;
    sampler_init(&s, &p, 4, &err);
    draw_many(&s, N, c);
    sampler_free(&s);
    int differ = 0;
    for (int i = 0; i < N; i++) differ += a[i] != c[i];
    CHECK(differ > N / 4, "seeds 42 and 43 differ in only %d of %d draws", differ, N);
}

/* Pearson's chi-square of draw counts against the hand-computed distribution.
 * The seed is fixed, so the statistic is a fixed number; the bound is the
 * 0.1% critical value, which a correct sampler exceeds for one seed in 1000,
 * while a wrong distribution (e.g. off by a temperature) is far above it. */
static double chi_square(SamplerParams p, int n, const double *prob, int32_t *out_of_set) {
    Sampler s;
    Err err = {{0}};
    sampler_init(&s, &p, 4, &err);
    long counts[4] = {0};
    *out_of_set = 0;
    for (int i = 0; i < n; i++) {
        float l[4] = {1, 2, 3, 4};
        int32_t t = sampler_sample(&s, l, 4);
        if (t < 0 || t > 3 || prob[t] == 0) (*out_of_set)++;
        else counts[t]++;
    }
    sampler_free(&s);
    double chi = 0;
    for (int i = 0; i < 4; i++)
        if (prob[i] > 0) chi += (counts[i] - n * prob[i]) * (counts[i] - n * prob[i]) / (n * prob[i]);
    return chi;
}

static void test_chi_square(void) {
    int n = getenv("CLLM_QUICK") ? 5000 : 20000;
    int32_t outside;
    SamplerParams p = params_plain();
    p.seed = 7;
    /* T=1, ids 0..3: e^1/S, e^2/S, e^3/S, e^4/S; 3 degrees of freedom: 16.27 */
    double full[4] = {0.032058603, 0.087144319, 0.236882818, 0.643914260};
    double chi = chi_square(p, n, full, &outside);
    printf("  T=1: chi-square %.2f over %d draws (3 dof, 0.1%% critical 16.27)\n", chi, n);
    CHECK(chi < 16.27 && outside == 0, "chi-square %.2f, %d outside", chi, outside);
    /* The same draws judged against T=2's distribution must fail: the check has teeth. */
    double t2[4] = {0.101536324, 0.167405097, 0.276004345, 0.455054234};
    double wrong = chi_square(p, n, t2, &outside);
    CHECK(wrong > 100, "a wrong distribution passes: chi-square %.2f", wrong);
    /* T=2, top-k 2: ids 3, 2 with 1/(1+e^-0.5), 1 dof: 10.83; ids 0 and 1 never drawn */
    p.temperature = 2.0f, p.top_k = 2;
    double k2[4] = {0, 0, 0.377540669, 0.622459331};
    chi = chi_square(p, n, k2, &outside);
    printf("  T=2 top-k 2: chi-square %.2f (1 dof, 0.1%% critical 10.83)\n", chi);
    CHECK(chi < 10.83 && outside == 0, "chi-square %.2f, %d outside the top-k set", chi, outside);
}

static uint64_t lcg(uint64_t *x) { return *x = *x * 6364136223846793005ull + 1442695040888963407ull; }

/* Logits like a model's: a smooth random spread plus a few strong tokens. */
static void fill_logits(float *l, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) l[i] = (float)((lcg(&seed) >> 40) % 1000) / 100.0f - 5.0f;
    for (int i = 0; i < 5; i++) l[(lcg(&seed) >> 33) % (uint64_t)n] += 8.0f;
}

static int rank_cmp(const void *pa, const void *pb) {
    const float *a = pa, *b = pb; /* pairs (x, id) */
    if (a[0] != b[0]) return a[0] > b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : 1;
}

/* top-p without top-k on a wide, flat row goes through the bucketed path
 * (the nucleus is hundreds of tokens); the result must equal a full sort of
 * the whole row: same ids in the same order, same probabilities. */
static void test_top_p_matches_full_sort(void) {
    enum { V = 3000 };
    static float l[V], pairs[V][2], work[V], probs[V];
    static int32_t ids[V];
    fill_logits(l, V, 11);
    for (int i = 0; i < V; i++) l[i] = l[i] * 0.1f; /* flatten: the nucleus is wide */
    double z = 0, xmax = -INFINITY;
    for (int i = 0; i < V; i++) xmax = l[i] > xmax ? l[i] : xmax;
    for (int i = 0; i < V; i++) { pairs[i][0] = l[i]; pairs[i][1] = (float)i; z += exp(l[i] - xmax); }
    qsort(pairs, V, sizeof pairs[0], rank_cmp);
    const float top_ps[] = {0.3f, 0.9f, 0.99f};
    for (int t = 0; t < 3; t++) {
        int keep = 0;
        for (double cum = 0; keep < V && cum < top_ps[t];) cum += exp(pairs[keep++][0] - xmax) / z;
        SamplerParams p = params_plain();
        p.top_p = top_ps[t];
        Sampler s;
        Err err = {{0}};
        sampler_init(&s, &p, V, &err);
        memcpy(work, l, sizeof work);
        int n = sampler_probs(&s, work, V, ids, probs);
        CHECK(n == keep && keep > 100, "top-p %g: nucleus of %d tokens, want %d (full sort)", top_ps[t], n, keep);
        double zk = 0;
        for (int i = 0; i < keep; i++) zk += exp(pairs[i][0] - xmax);
        for (int i = 0; i < n && i < keep; i++) {
            bool ok = ids[i] == (int32_t)pairs[i][1] && fabs(probs[i] - exp(pairs[i][0] - xmax) / zk) < 1e-6;
            CHECK(ok, "top-p %g rank %d: id %d p %.8f, want id %d", top_ps[t], i, ids[i], probs[i], (int)pairs[i][1]);
            if (!ok) break;
        }
        sampler_free(&s);
    }
}

/* Timing note for a 262,144-token vocabulary (printed, not asserted tightly). */
static void test_speed_262k(void) {
    enum { V = 262144 };
    static float base[V], l[V];
    fill_logits(base, V, 5);
    struct { const char *what; SamplerParams p; } runs[] = {
        {"greedy", {.temperature = 0, .top_p = 1, .repetition_penalty = 1}},
        {"default (T 0.8, top-k 40, top-p 0.95, min-p 0.05)", sampler_params_default()},
        {"top-k 0, top-p 0.95", {.temperature = 0.8f, .top_p = 0.95f, .repetition_penalty = 1}},
        {"repetition 1.1 over 64, top-k 40", {.temperature = 0.8f, .top_k = 40, .top_p = 1, .repetition_penalty = 1.1f,
                                              .penalty_last_n = 64}},
    };
    int steps = getenv("CLLM_QUICK") ? 3 : 20;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        Sampler s;
        Err err = {{0}};
        CHECK(sampler_init(&s, &runs[r].p, V, &err) == 0, "%s", err.msg);
        for (int i = 0; i < 100; i++) sampler_accept(&s, (int32_t)(i * 2621));
        double total = 0;
        for (int i = 0; i < steps; i++) {
            memcpy(l, base, sizeof l);
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int32_t t = sampler_sample(&s, l, V);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            total += (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
            CHECK(t >= 0 && t < V, "token %d", t);
        }
        printf("  262k vocab, %s: %.3f ms per token\n", runs[r].what, 1e3 * total / steps);
        sampler_free(&s);
    }
}

int main(void) {
    RUN(test_filters_by_hand);
    RUN(test_penalties_by_hand);
    RUN(test_greedy_and_bad_rows);
    RUN(test_bad_params);
    RUN(test_seeds);
    RUN(test_chi_square);
    RUN(test_top_p_matches_full_sort);
    RUN(test_speed_262k);
    TEST_EXIT();
}
