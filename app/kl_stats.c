/* kl_stats.c — KL divergence and dp statistics against a reference (kl_stats.h). */
#include "app/kl_stats.h"

#include <math.h>
#include <stdlib.h>

int kl_stats_init(KlStats *s, int64_t cap, Err *err) {
    *s = (KlStats){0};
    s->cap = cap;
    s->kld = malloc((size_t)cap * sizeof *s->kld);
    s->dp = malloc((size_t)cap * sizeof *s->dp);
    if (s->kld && s->dp) return 0;
    kl_stats_free(s);
    return err_set(err, "out of memory for %lld positions", (long long)cap);
}

void kl_stats_free(KlStats *s) {
    free(s->kld);
    free(s->dp);
    *s = (KlStats){0};
}

void kl_stats_add(KlStats *s, const double *ref_logp, const double *logp, int vocab, int32_t target,
                  double ref_target_logp, int32_t ref_top1) {
    if (s->n >= s->cap) return;
    double kl = 0;
    int32_t top1 = 0;
    for (int v = 0; v < vocab; v++) {
        kl += exp(ref_logp[v]) * (ref_logp[v] - logp[v]);
        if (logp[v] > logp[top1]) top1 = v;
    }
    /* the rounding of the saved row can take an identical distribution a hair below 0 */
    s->kld[s->n] = kl > 0 ? kl : 0;
    s->dp[s->n] = exp(logp[target]) - exp(ref_target_logp);
    s->same_top1 += top1 == ref_top1;
    s->ref_nll_sum -= ref_target_logp;
    s->n++;
}

double kl_quantile(const double *sorted, int64_t n, double q) {
    if (n <= 0) return NAN;
    double x = q * (double)(n - 1);
    int64_t i = (int64_t)floor(x);
    if (i >= n - 1) return sorted[n - 1];
    return sorted[i] + (x - (double)i) * (sorted[i + 1] - sorted[i]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* mean and its standard error, and the root mean square */
static void moments(const double *v, int64_t n, double *mean, double *se, double *rms) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) { s += v[i]; s2 += v[i] * v[i]; }
    *mean = s / (double)n;
    double var = n > 1 ? (s2 - s * *mean) / (double)(n - 1) : 0;
    *se = sqrt(var > 0 ? var / (double)n : 0);
    *rms = sqrt(s2 / (double)n);
}

void kl_stats_print(KlStats *s, FILE *out, double mean_nll) {
    int64_t n = s->n;
    if (n == 0) return;
    double ref_mean = s->ref_nll_sum / (double)n, mean, se, rms;
    fprintf(out, "reference perplexity: %.6f\n", exp(ref_mean));
    fprintf(out, "perplexity ratio (this / reference): %.6f (mean ln ratio %+.6f)\n", exp(mean_nll - ref_mean),
            mean_nll - ref_mean);
    moments(s->kld, n, &mean, &se, &rms);
    qsort(s->kld, (size_t)n, sizeof *s->kld, cmp_double);
    fprintf(out, "mean KL divergence: %.8f ± %.8f\n", mean, se);
    fprintf(out, "KL divergence percentiles: median %.8f, 90%% %.8f, 95%% %.8f, 99%% %.8f, 99.9%% %.8f, max %.8f\n",
            kl_quantile(s->kld, n, 0.5), kl_quantile(s->kld, n, 0.9), kl_quantile(s->kld, n, 0.95),
            kl_quantile(s->kld, n, 0.99), kl_quantile(s->kld, n, 0.999), s->kld[n - 1]);
    fprintf(out, "top-1 agreement: %.4f%% (%lld of %lld)\n", 100.0 * (double)s->same_top1 / (double)n,
            (long long)s->same_top1, (long long)n);
    moments(s->dp, n, &mean, &se, &rms);
    qsort(s->dp, (size_t)n, sizeof *s->dp, cmp_double);
    fprintf(out, "dp (p_this - p_ref of the correct token): mean %+.6f%% ± %.6f%%, RMS %.6f%%\n", 100 * mean, 100 * se,
            100 * rms);
    static const double qs[] = {0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99};
    fprintf(out, "dp percentiles: min %+.6f%%", 100 * s->dp[0]);
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++)
        fprintf(out, ", %g%% %+.6f%%", 100 * qs[i], 100 * kl_quantile(s->dp, n, qs[i]));
    fprintf(out, ", max %+.6f%%\n", 100 * s->dp[n - 1]);
}
