/* test.h — the unit-test harness of cllm: no framework, one header.
 *
 * A test program defines test functions and runs them with RUN(fn). Each
 * CHECK that fails prints file:line and the message, and marks the current
 * test failed; the test goes on so one run shows every failure. RUN prints
 * one line per test, "ok - name" or "not ok - name", which tests/run.sh
 * counts. A test program exits 1 when any of its tests failed.
 */
#ifndef CLLM_TEST_H
#define CLLM_TEST_H

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failed_checks;   /* checks failed in the current test */
static int test_failed_tests;    /* tests failed in this program */

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            printf("  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
            test_failed_checks++;                                             \
        }                                                                     \
    } while (0)

/* |a - b| <= tol * max(1, |b|): relative for large values, absolute near 0. */
#define CHECK_NEAR(a, b, tol)                                                 \
    do {                                                                      \
        double a_ = (a), b_ = (b);                                            \
        double s_ = fabs(b_) > 1.0 ? fabs(b_) : 1.0;                          \
        CHECK(fabs(a_ - b_) <= (tol) * s_, "%s = %.9g, %s = %.9g", #a, a_, #b, b_); \
    } while (0)

#define RUN(fn)                                                               \
    do {                                                                      \
        test_failed_checks = 0;                                               \
        fn();                                                                 \
        if (test_failed_checks) {                                             \
            printf("not ok - %s\n", #fn);                                     \
            test_failed_tests++;                                              \
        } else {                                                              \
            printf("ok - %s\n", #fn);                                         \
        }                                                                     \
        fflush(stdout);                                                       \
    } while (0)

#define TEST_EXIT() return test_failed_tests ? 1 : 0

/* max |got - want| / max |want| over a row of logits (a NaN: infinite). */
static inline double test_row_err(const float *got, const float *want, int n) {
    double md = 0, mw = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        md = isnan(d) ? INFINITY : fmax(md, d);
        mw = fmax(mw, fabs(want[i]));
    }
    return md / (mw > 0 ? mw : 1);
}

/* Removes dir and everything under it (a test's temporary folder); "" and
 * NULL: nothing. Links are removed, not followed. */
static inline int test_remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline void test_remove_tree(const char *dir) {
    if (dir && *dir) nftw(dir, test_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Directory holding committed fixtures; run.sh sets CLLM_FIXTURES. */
static inline const char *test_fixture_dir(void) {
    const char *d = getenv("CLLM_FIXTURES");
    return d ? d : "tests/fixtures";
}


/* perm[0..n) = a fixed shuffle of 0..n-1 (seed): block tables whose
 * neighbours lie far apart in the pool. */
static inline void test_shuffle(int32_t *perm, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        seed = seed * 1664525u + 1013904223u;
        int j = (int)(seed % (uint32_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
}

#endif
