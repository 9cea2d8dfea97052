/* test_perplexity.c — the pieces of `cllm perplexity` that need no model:
 * the strided windows (which tokens each window reads and scores, worked out
 * here by hand from Hugging Face's rule), the --save-logits file written and
 * read back, and the KL / dp statistics on distributions whose answers are
 * known. The whole command is checked against transformers by
 * tests/cli/perplexity.sh. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "app/kl_stats.h"
#include "app/logits_file.h"
#include "app/perplexity.h"
#include "tests/test.h"

/* The windows of (n, ctx, stride) must be exactly want[k] = {begin, end, first}. */
static void check_windows(int64_t n, int ctx, int stride, const int64_t (*want)[3], int n_want) {
    PplWindows it;
    PplWindow w;
    int k = 0;
    int64_t scored = 0;
    ppl_windows_init(&it, n, ctx, stride);
    for (; ppl_windows_next(&it, &w); k++) {
        scored += w.end - w.first;
        if (k >= n_want) continue;
        CHECK(w.begin == want[k][0] && w.end == want[k][1] && w.first == want[k][2],
              "n %lld ctx %d stride %d window %d: [%lld, %lld) first %lld, want [%lld, %lld) first %lld", (long long)n,
              ctx, stride, k, (long long)w.begin, (long long)w.end, (long long)w.first, (long long)want[k][0],
              (long long)want[k][1], (long long)want[k][2]);
    }
    CHECK(k == n_want, "n %lld ctx %d stride %d: %d windows, want %d", (long long)n, ctx, stride, k, n_want);
    CHECK(ppl_n_scored(n, ctx, stride) == scored, "ppl_n_scored %lld, windows score %lld",
          (long long)ppl_n_scored(n, ctx, stride), (long long)scored);
}

static void test_windows(void) {
    /* disjoint, a partial last window: 10 tokens, ctx 4 -> [0,4) scores 1..3, [4,8) 5..7, [8,10) 9 */
    static const int64_t a[][3] = {{0, 4, 1}, {4, 8, 5}, {8, 10, 9}};
    check_windows(10, 4, 4, a, 3);
    CHECK(ppl_n_scored(10, 4, 4) == 7, "10/4/4 scores %lld", (long long)ppl_n_scored(10, 4, 4));
    /* overlapping: 10 tokens, ctx 4, stride 2 -> every token after the first once */
    static const int64_t b[][3] = {{0, 4, 1}, {2, 6, 4}, {4, 8, 6}, {6, 10, 8}};
    check_windows(10, 4, 2, b, 4);
    CHECK(ppl_n_scored(10, 4, 2) == 9, "10/4/2 scores %lld", (long long)ppl_n_scored(10, 4, 2));
    /* the text exactly ctx: one window, n - 1 scored */
    static const int64_t c[][3] = {{0, 8, 1}};
    check_windows(8, 8, 8, c, 1);
    check_windows(8, 8, 3, c, 1); /* HF stops at the window that reaches the end */
    /* 2 tokens: one target */
    static const int64_t d[][3] = {{0, 2, 1}};
    check_windows(2, 512, 512, d, 1);
    /* a last window of one token scores nothing: skipped (HF's has no valid label) */
    static const int64_t e[][3] = {{0, 4, 1}, {4, 8, 5}};
    check_windows(9, 4, 4, e, 2);
    /* stride 1: each later window scores its last token only */
    static const int64_t f[][3] = {{0, 3, 1}, {1, 4, 3}, {2, 5, 4}};
    check_windows(5, 3, 1, f, 3);
    /* stride > ctx is refused (tokens would go unscored); so are ctx < 2 and texts < 2 tokens */
    Err err = {{0}};
    CHECK(ppl_check(10, 4, 5, &err) == -1 && strstr(err.msg, "--stride 5"), "stride > ctx: %s", err.msg);
    CHECK(ppl_check(10, 1, 1, &err) == -1 && strstr(err.msg, "--ctx 1"), "ctx 1: %s", err.msg);
    CHECK(ppl_check(1, 4, 4, &err) == -1 && strstr(err.msg, "at least 2"), "1 token: %s", err.msg);
    CHECK(ppl_check(2, 2, 2, NULL) == 0 && ppl_check(10, 4, 4, NULL) == 0, "valid settings refused");
}

/* A log-softmax of x[n] in double. */
static void logsm(const double *x, int n, double *out) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < n; v++) m = x[v] > m ? x[v] : m;
    for (int v = 0; v < n; v++) s += exp(x[v] - m);
    for (int v = 0; v < n; v++) out[v] = x[v] - m - log(s);
}

static void test_logits_file_roundtrip(void) {
    enum { V = 50, N = 12, CTX = 6, STRIDE = 3 };
    char path[] = "/tmp/cllm-test-logits-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 7) % V;
    LogitsHeader h = {V, CTX, STRIDE, N, ppl_n_scored(N, CTX, STRIDE), ids}, g;
    double x[V], logp[V], back[V];
    uint16_t scratch[V], q[V];
    FILE *f = fopen(path, "wb");
    Err err = {{0}};
    CHECK(f && logits_file_write_header(f, path, &h, &err) == 0, "write header: %s", err.msg);
    for (int r = 0; r < h.n_scored; r++) {
        for (int v = 0; v < V; v++) x[v] = 20 * sin(0.37 * v + r); /* log p down to about -40 */
        logsm(x, V, logp);
        CHECK(logits_file_write_row(f, path, logp, V, ids[r % N], scratch, &err) == 0, "write row: %s", err.msg);
    }
    fclose(f);
    f = fopen(path, "rb");
    int64_t bytes = LOGITS_FILE_HEADER_BYTES + 4 * N + h.n_scored * logits_row_bytes(V);
    CHECK(logits_file_read_header(f, path, bytes, ppl_n_scored, &g, &err) == 0, "read header: %s", err.msg);
    CHECK(g.vocab == V && g.ctx == CTX && g.stride == STRIDE && g.n_tokens == N && g.n_scored == h.n_scored &&
              g.ids && !memcmp(g.ids, ids, sizeof ids), "header read back differs");
    LogitsRow row = {.q = q};
    double worst = 0;
    for (int r = 0; r < g.n_scored; r++) {
        for (int v = 0; v < V; v++) x[v] = 20 * sin(0.37 * v + r);
        logsm(x, V, logp);
        CHECK(logits_file_read_row(f, path, r, V, &row, &err) == 0, "read row %d: %s", r, err.msg);
        logits_row_logp(&row, V, back);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(back[v] - logp[v]));
        CHECK(fabs(row.target_logp - logp[ids[r % N]]) < 1e-5, "row %d: target logp %g, want %g", r, row.target_logp,
              logp[ids[r % N]]);
    }
    /* the rounding step is -lo / 65535 <= 45 / 65535: within half a step plus the renormalization */
    CHECK(worst < 45.0 / 65535, "log p read back off by %g", worst);
    fclose(f);
    logits_header_free(&g);
    /* the size must be what the header announces */
    f = fopen(path, "rb");
    CHECK(logits_file_read_header(f, path, bytes - 1, NULL, &g, &err) == -1 && strstr(err.msg, "truncated") &&
              strstr(err.msg, path), "a short file: %s", err.msg);
    fclose(f);
    unlink(path);
}

static void test_kl_stats(void) {
    enum { V = 4 };
    double p[V] = {log(0.5), log(0.25), log(0.125), log(0.125)}, q[V] = {log(0.25), log(0.25), log(0.25), log(0.25)};
    KlStats s;
    Err err = {{0}};
    CHECK(kl_stats_init(&s, 3, &err) == 0, "init: %s", err.msg);
    kl_stats_add(&s, p, p, V, 0, p[0], 0);       /* identical: KL 0, dp 0, same top-1 */
    kl_stats_add(&s, p, q, V, 0, p[0], 0);       /* KL = sum p log(p / q) = 0.5 ln2 - 0.25 ln2 = 0.25 ln 2 */
    kl_stats_add(&s, q, p, V, 1, q[1], 1);       /* KL(q || p) = 0.25 (ln(1/2) + 0 + ln 2 + ln 2) = 0.25 ln 2 */
    CHECK(s.n == 3 && fabs(s.kld[0]) < 1e-15, "identical rows: KL %g", s.kld[0]);
    CHECK_NEAR(s.kld[1], 0.25 * log(2), 1e-12);
    CHECK_NEAR(s.kld[2], 0.25 * log(2), 1e-12);
    CHECK_NEAR(s.dp[1], 0.25 - 0.5, 1e-12);      /* p_new(0) - p_ref(0) */
    CHECK(s.same_top1 == 2, "top-1 agreement %lld of 3 (the third: 0 here, 1 in the reference)",
          (long long)s.same_top1);
    kl_stats_free(&s);
    double sorted[5] = {1, 2, 3, 4, 5};
    CHECK_NEAR(kl_quantile(sorted, 5, 0.5), 3, 1e-12);
    CHECK_NEAR(kl_quantile(sorted, 5, 0.9), 4.6, 1e-12); /* numpy.percentile([1..5], 90) */
    CHECK_NEAR(kl_quantile(sorted, 5, 1.0), 5, 1e-12);
    CHECK_NEAR(kl_quantile(sorted, 1, 0.99), 1, 1e-12);
}

int main(void) {
    RUN(test_windows);
    RUN(test_logits_file_roundtrip);
    RUN(test_kl_stats);
    TEST_EXIT();
}
