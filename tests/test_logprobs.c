/* test_logprobs.c — engine/logprobs.c against a straightforward reference:
 * log-softmax as x - log(sum exp(x)) in long double over the whole row, the
 * top k by sorting every (logit, id) pair (larger first, then lower id),
 * the rank by counting. Random rows, ties, -inf logits, k = 0, k = 20, a
 * vocabulary smaller than k, an out-of-range k. */
#include "engine/logprobs.h"
#include "tests/test.h"

static const float *cmp_x; /* qsort has no context argument */
static int cmp_rank(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (cmp_x[i] != cmp_x[j]) return cmp_x[i] > cmp_x[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* Checks logprobs_row(x, n, id, k) against the reference. */
static void check_row(const float *x, int n, int32_t id, int k) {
    long double m = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) sum += expl((long double)x[i] - m);
    long double lse = m + logl(sum);
    int32_t *order = malloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;
    cmp_x = x;
    qsort(order, (size_t)n, sizeof *order, cmp_rank);
    int want_k = k < 0 ? 0 : k > LOGPROBS_MAX_TOP ? LOGPROBS_MAX_TOP : k;
    if (want_k > n) want_k = n;
    int rank = 1;
    for (int i = 0; i < n; i++) rank += x[i] > x[id];
    TokenLogprob e;
    logprobs_row(x, n, id, k, &e);
    CHECK(e.id == id, "id %d, want %d", e.id, id);
    double want = (double)((long double)x[id] - lse);
    if (isinf(want)) CHECK(isinf(e.logprob) && e.logprob < 0, "logprob %g, want -inf", e.logprob);
    else CHECK_NEAR(e.logprob, want, 1e-5);
    CHECK(e.rank == rank, "rank %d, want %d", e.rank, rank);
    CHECK(e.n_top == want_k, "n_top %d, want %d (k %d, vocab %d)", e.n_top, want_k, k, n);
    for (int j = 0; j < e.n_top && j < want_k; j++) {
        CHECK(e.top_id[j] == order[j], "top %d: id %d, want %d", j, e.top_id[j], order[j]);
        double w = (double)((long double)x[order[j]] - lse);
        if (isinf(w)) CHECK(isinf(e.top_logprob[j]), "top %d: %g, want -inf", j, e.top_logprob[j]);
        else CHECK_NEAR(e.top_logprob[j], w, 1e-5);
    }
    free(order);
}

static uint32_t rng = 12345;
static float frand(void) { rng = rng * 1664525u + 1013904223u; return (float)(rng >> 8) / (1 << 24); }

static void test_random_rows(void) {
    int sizes[] = {1, 2, 7, 64, 1000, 32000};
    for (int s = 0; s < 6; s++) {
        int n = sizes[s];
        float *x = malloc((size_t)n * sizeof *x);
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < n; i++) x[i] = (frand() - 0.5f) * 20;
            int ks[] = {0, 1, 5, 20};
            for (int q = 0; q < 4; q++) check_row(x, n, (int32_t)(frand() * n) % n, ks[q]);
        }
        free(x);
    }
}

static void test_ties(void) {
    float x[40];
    for (int i = 0; i < 40; i++) x[i] = (float)(i % 4); /* ten of each value */
    for (int k = 0; k <= 20; k++) check_row(x, 40, 3, k);
    for (int i = 0; i < 40; i++) x[i] = 1.5f;          /* all equal: uniform, ids in order */
    check_row(x, 40, 39, 20);
    TokenLogprob e;
    logprobs_row(x, 40, 0, 20, &e);
    CHECK_NEAR(e.logprob, -log(40.0), 1e-6);
    CHECK(e.top_id[0] == 0 && e.top_id[19] == 19, "ties not by id: %d .. %d", e.top_id[0], e.top_id[19]);
}

static void test_neg_inf(void) {
    float x[30];
    for (int i = 0; i < 30; i++) x[i] = i % 3 == 0 ? (float)i * 0.1f : -INFINITY; /* 10 finite */
    check_row(x, 30, 3, 20);  /* the top 20 holds every -inf after the finite ones */
    check_row(x, 30, 4, 5);   /* a chosen token of logit -inf */
    TokenLogprob e;
    logprobs_row(x, 30, 4, 20, &e);
    CHECK(isinf(e.logprob) && e.logprob < 0, "an impossible token: %g", e.logprob);
    CHECK(e.n_top == 20 && isinf(e.top_logprob[19]), "n_top %d, last %g", e.n_top, e.top_logprob[19]);
    for (int i = 0; i < 30; i++) x[i] = -INFINITY;
    logprobs_row(x, 30, 0, 3, &e); /* a row of nothing: -inf, no NaN */
    CHECK(isinf(e.logprob) && e.logprob < 0 && e.n_top == 3, "all -inf: %g, n_top %d", e.logprob, e.n_top);
}

static void test_k_limits(void) {
    float x[5] = {0.5f, -1, 3, 2, 2};
    check_row(x, 5, 1, 0);
    check_row(x, 5, 1, 20);  /* vocabulary smaller than k: all five */
    check_row(x, 5, 4, 99);  /* k clamped to LOGPROBS_MAX_TOP, then to the vocabulary */
    check_row(x, 5, 2, -3);  /* k below 0 is 0 */
    float big[100];
    for (int i = 0; i < 100; i++) big[i] = (float)((i * 37) % 100) / 10;
    check_row(big, 100, 50, 20);
    check_row(big, 100, 50, 21);
}

static void test_push(void) {
    TokenLogprobs l = {0};
    for (int i = 0; i < 100; i++) {
        TokenLogprob *e = token_logprobs_push(&l);
        CHECK(e != NULL, "push %d", i);
        if (e) e->id = i;
    }
    CHECK(l.n == 100 && l.v[99].id == 99 && l.v[0].id == 0, "n %d", l.n);
    token_logprobs_free(&l);
    CHECK(l.n == 0 && l.v == NULL, "freed");
}

int main(void) {
    RUN(test_random_rows);
    RUN(test_ties);
    RUN(test_neg_inf);
    RUN(test_k_limits);
    RUN(test_push);
    TEST_EXIT();
}
