/* kl_stats.h — how far one run's next-token distributions are from a
 * reference's (cllm perplexity --kl-divergence), per scored position:
 *   KL(ref || new) = sum_v p_ref(v) (log p_ref(v) - log p_new(v))
 *   dp = p_new(target) - p_ref(target)      (the correct token's probability)
 *   top-1 agreement: argmax p_new == argmax p_ref
 * summarized as llama.cpp's perplexity tool does: mean KL with its standard
 * error and percentiles, top-1 agreement %, dp mean / RMS / percentiles, and
 * both perplexities with their ratio. Percentiles interpolate linearly
 * between ranks (numpy's default). */
#ifndef CLLM_KL_STATS_H
#define CLLM_KL_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

typedef struct {
    int64_t n, cap;
    double *kld, *dp;        /* [cap] per position */
    int64_t same_top1;
    double ref_nll_sum;      /* -sum log p_ref(target) */
} KlStats;

int kl_stats_init(KlStats *s, int64_t cap, Err *err);
void kl_stats_free(KlStats *s);
/* One position (no-op past cap): log-probabilities ref_logp, logp [vocab]. */
void kl_stats_add(KlStats *s, const double *ref_logp, const double *logp, int vocab, int32_t target,
                  double ref_target_logp, int32_t ref_top1);
/* The q-th quantile (q in [0, 1]) of sorted[n]. */
double kl_quantile(const double *sorted, int64_t n, double q);
/* The summary; mean_nll is this run's. Sorts the per-position arrays. */
void kl_stats_print(KlStats *s, FILE *out, double mean_nll);

#endif
