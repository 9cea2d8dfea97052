/* sampler.c — penalties, temperature, top-k / top-p / min-p and the draw
 * (semantics in sampler.h). With top-k a partial selection keeps only k
 * candidates, so a 262k vocabulary is not sorted on every step. */
#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

SamplerParams sampler_params_default(void) {
    return (SamplerParams){.temperature = 0.7f, .top_k = 0, .top_p = 0.95f, .min_p = 0.0f,
                           .repetition_penalty = 1.0f, .penalty_last_n = 64, .seed = 0};
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**: a uniform double in [0, 1). */
static double rng_uniform(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return (r >> 11) * 0x1.0p-53;
}

int sampler_init(Sampler *s, const SamplerParams *p, int n_vocab, Err *err) {
    memset(s, 0, sizeof *s);
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->cap_history = p->penalty_last_n > 0 ? p->penalty_last_n : 1024;
    s->history = malloc(s->cap_history * sizeof *s->history);
    s->counts = calloc(n_vocab, sizeof *s->counts);
    s->cand_ids = malloc(n_vocab * sizeof *s->cand_ids);
    s->cand_p = malloc(n_vocab * sizeof *s->cand_p);
    if (!s->history || !s->counts || !s->cand_ids || !s->cand_p) {
        sampler_free(s);
        return err_set(err, "sampler: out of memory for a vocabulary of %d", n_vocab);
    }
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->history);
    free(s->counts);
    free(s->cand_ids);
    free(s->cand_p);
    memset(s, 0, sizeof *s);
}

void sampler_accept(Sampler *s, int32_t tok) {
    if (tok < 0 || tok >= s->n_vocab) return;
    if (s->p.penalty_last_n > 0 && s->n_history == s->cap_history) {
        s->counts[s->history[s->head]]--; /* the oldest leaves the window */
        s->history[s->head] = tok;
        s->head = (s->head + 1) % s->cap_history;
    } else {
        if (s->n_history == s->cap_history) {
            int32_t *h = realloc(s->history, 2 * s->cap_history * sizeof *h);
            if (!h) return; /* keeps counting what fits */
            s->history = h;
            s->cap_history *= 2;
        }
        s->history[s->n_history++] = tok;
    }
    s->counts[tok]++;
}

static void apply_penalties(Sampler *s, float *logits) {
    const SamplerParams *p = &s->p;
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    /* cand_p marks tokens already penalized: each distinct token once. */
    for (int i = 0; i < s->n_history; i++) s->cand_p[s->history[i]] = 0;
    for (int i = 0; i < s->n_history; i++) {
        int32_t t = s->history[i];
        if (s->cand_p[t] != 0 || s->counts[t] <= 0) continue;
        s->cand_p[t] = 1;
        float l = logits[t];
        if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        logits[t] = l - (p->presence_penalty + p->frequency_penalty * s->counts[t]);
    }
}

static int cmp_desc(const void *a, const void *b, void *logits_) {
    const float *l = logits_;
    float x = l[*(const int32_t *)a], y = l[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Moves the k largest logits' ids to the front of ids, sorted descending. */
static void select_top(int32_t *ids, int n, int k, const float *logits) {
    if (k < n) {
        /* partial selection: keep a sorted front of k, scan the rest */
        qsort_r(ids, k, sizeof *ids, cmp_desc, (void *)logits);
        for (int i = k; i < n; i++) {
            int32_t id = ids[i];
            int32_t last = ids[k - 1];
            if (logits[id] < logits[last] || (logits[id] == logits[last] && id > last)) continue;
            int j = k - 1;
            while (j > 0 && (logits[ids[j - 1]] < logits[id] || (logits[ids[j - 1]] == logits[id] && ids[j - 1] > id))) {
                ids[j] = ids[j - 1];
                j--;
            }
            ids[j] = id;
        }
    } else {
        qsort_r(ids, n, sizeof *ids, cmp_desc, (void *)logits);
    }
}

int sampler_probs(Sampler *s, float *logits, int n_vocab, int32_t *ids, float *probs) {
    const SamplerParams *p = &s->p;
    for (int i = 0; i < n_vocab; i++)
        if (isnan(logits[i])) logits[i] = -INFINITY;
    apply_penalties(s, logits);
    if (p->temperature <= 0) {
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
        ids[0] = best;
        probs[0] = 1.0f;
        return 1;
    }
    for (int i = 0; i < n_vocab; i++) logits[i] /= p->temperature;
    int n = n_vocab;
    for (int i = 0; i < n; i++) ids[i] = i;
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    select_top(ids, n, k, logits);
    n = k;
    float m = logits[ids[0]];
    if (m == -INFINITY) { ids[0] = 0; probs[0] = 1.0f; return 1; }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += probs[i] = expf(logits[ids[i]] - m);
    for (int i = 0; i < n; i++) probs[i] = (float)(probs[i] / sum);
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += probs[i];
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float floor_p = p->min_p * probs[0];
        int keep = 1;
        while (keep < n && probs[keep] >= floor_p) keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += probs[i];
    for (int i = 0; i < n; i++) probs[i] = (float)(probs[i] / sum);
    return n;
}

int32_t sampler_sample(Sampler *s, float *logits, int n_vocab) {
    if (n_vocab > s->n_vocab) n_vocab = s->n_vocab;
    int n = sampler_probs(s, logits, n_vocab, s->cand_ids, s->cand_p);
    double u = rng_uniform(s->rng), cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->cand_p[i];
        if (u < cum) return s->cand_ids[i];
    }
    return s->cand_ids[n - 1];
}
