/* logprobs.c — log-softmax of one logits row and its top k (see logprobs.h).
 *
 * One pass finds the maximum, one sums exp(x - max) in double (a vocabulary
 * of 256k terms in float would lose digits), one keeps the k largest by
 * insertion into a sorted array (k <= 20: cheaper than a heap or a sort). */
#include "engine/logprobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whether (xa, a) ranks before (xb, b): larger logit, then lower id. */
static int ranks_before(float xa, int32_t a, float xb, int32_t b) { return xa > xb || (xa == xb && a < b); }

/* Keeps top[0..*n) sorted, at most k entries; inserts token i when it ranks. */
static void top_insert(const float *x, int32_t i, int k, int32_t *top, int *n) {
    if (*n == k && !ranks_before(x[i], i, x[top[k - 1]], top[k - 1])) return;
    int j = *n < k ? (*n)++ : k - 1;
    while (j > 0 && ranks_before(x[i], i, x[top[j - 1]], top[j - 1])) { top[j] = top[j - 1]; j--; }
    top[j] = i;
}

void logprobs_row(const float *logits, int vocab, int32_t id, int k, TokenLogprob *out) {
    if (k < 0) k = 0;
    if (k > LOGPROBS_MAX_TOP) k = LOGPROBS_MAX_TOP;
    if (k > vocab) k = vocab;
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > m) m = logits[i];
    double sum = 0;
    if (m > -INFINITY)
        for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - m);
    /* all -inf: every token is equally impossible; -inf for all of them */
    double lse = m > -INFINITY ? m + log(sum) : INFINITY;
    memset(out, 0, sizeof *out);
    out->id = id;
    float x = id >= 0 && id < vocab ? logits[id] : -INFINITY;
    out->logprob = (float)((double)x - lse);
    out->rank = 1;
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] > x) out->rank++;
        if (k > 0) top_insert(logits, i, k, out->top_id, &n);
    }
    out->n_top = n;
    for (int j = 0; j < n; j++) out->top_logprob[j] = (float)((double)logits[out->top_id[j]] - lse);
}

TokenLogprob *token_logprobs_push(TokenLogprobs *l) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        TokenLogprob *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    TokenLogprob *e = &l->v[l->n++];
    memset(e, 0, sizeof *e);
    return e;
}

void token_logprobs_free(TokenLogprobs *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}
