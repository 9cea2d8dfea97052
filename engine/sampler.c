/* sampler.c — a request's sampler: its parameters, its seeded generator and
 * its penalty window; each draw goes through kernels/sample_row.c, which
 * holds the semantics (penalties, temperature, top-k / top-p / min-p, the
 * draw). The generator is xoshiro256** seeded through splitmix64; a draw
 * takes a uniform from it only when more than one candidate survives.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

SamplerParams sampler_params_default(void) {
    return (SamplerParams){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                           .repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                           .penalty_last_n = 64, .seed = 0};
}

/* ---- random numbers: splitmix64 seeds xoshiro256** (Blackman & Vigna) ---- */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

static void rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s[i] = splitmix64_next(&x);
}

/* ---- set-up ---- */

static int params_check(const SamplerParams *p, Err *err) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return err_set(err, "sampling: temperature must be a number >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return err_set(err, "sampling: top_k must be >= 0 (got %d; 0 turns it off)", p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return err_set(err, "sampling: top_p must be in [0, 1] (got %g; 1 turns it off)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, "sampling: min_p must be in [0, 1] (got %g; 0 turns it off)", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return err_set(err, "sampling: repetition_penalty must be > 0 (got %g; 1 turns it off)",
                       p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return err_set(err, "sampling: presence_penalty must be a finite number (got %g)", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return err_set(err, "sampling: frequency_penalty must be a finite number (got %g)", p->frequency_penalty);
    if (p->penalty_last_n < 0)
        return err_set(err, "sampling: penalty_last_n must be >= 0 (got %d; 0 counts every token)",
                       p->penalty_last_n);
    return 0;
}

int sampler_init(Sampler *s, const SamplerParams *p, int n_vocab, Err *err) {
    memset(s, 0, sizeof *s);
    if (params_check(p, err)) return -1;
    if (n_vocab <= 0) return err_set(err, "sampling: the vocabulary size must be > 0 (got %d)", n_vocab);
    s->p = *p;
    s->n_vocab = n_vocab;
    s->penalize = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    size_t v = (size_t)n_vocab;
    s->cand = malloc(v * sizeof *s->cand);
    s->prob = malloc(v * sizeof *s->prob);
    bool ok = s->cand && s->prob;
    if (ok && s->penalize) {
        s->distinct = malloc(v * sizeof *s->distinct);
        s->distinct_count = malloc(v * sizeof *s->distinct_count);
        s->distinct_pos = malloc(v * sizeof *s->distinct_pos);
        if (p->penalty_last_n > 0) s->ring = malloc((size_t)p->penalty_last_n * sizeof *s->ring);
        ok = s->distinct && s->distinct_count && s->distinct_pos && (p->penalty_last_n == 0 || s->ring);
    }
    if (!ok) {
        sampler_free(s);
        return err_set(err, "sampling: out of memory for a vocabulary of %d tokens", n_vocab);
    }
    sampler_reset(s);
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->distinct);
    free(s->distinct_count);
    free(s->distinct_pos);
    free(s->ring);
    free(s->cand);
    free(s->prob);
    memset(s, 0, sizeof *s);
}

void sampler_reset(Sampler *s) {
    rng_seed(s->rng, s->p.seed);
    s->ring_len = s->ring_head = s->n_distinct = 0;
    if (!s->penalize) return;
    for (int i = 0; i < s->n_vocab; i++) s->distinct_pos[i] = -1;
}

/* ---- the penalty window ---- */

static void window_add(Sampler *s, int32_t t) {
    int at = s->distinct_pos[t];
    if (at >= 0) { s->distinct_count[at]++; return; }
    s->distinct_pos[t] = s->n_distinct;
    s->distinct_count[s->n_distinct] = 1;
    s->distinct[s->n_distinct++] = t;
}

static void window_remove(Sampler *s, int32_t t) {
    int at = s->distinct_pos[t];
    if (--s->distinct_count[at] > 0) return;
    int last = --s->n_distinct; /* swap-remove keeps the list dense */
    s->distinct[at] = s->distinct[last];
    s->distinct_count[at] = s->distinct_count[last];
    s->distinct_pos[s->distinct[at]] = at;
    s->distinct_pos[t] = -1;
}

void sampler_accept(Sampler *s, int32_t t) {
    if (!s->penalize || t < 0 || t >= s->n_vocab) return;
    int cap = s->p.penalty_last_n;
    if (cap > 0) {
        if (s->ring_len == cap) { /* the oldest token leaves the window */
            window_remove(s, s->ring[s->ring_head]);
            s->ring[s->ring_head] = t;
            s->ring_head = (s->ring_head + 1) % cap;
        } else {
            s->ring[(s->ring_head + s->ring_len++) % cap] = t;
        }
    }
    window_add(s, t);
}

void sampler_params_override(SamplerParams *p, const SamplerOverrides *o) {
    if (!isnan(o->temperature)) p->temperature = o->temperature;
    if (!isnan(o->top_p)) p->top_p = o->top_p;
    if (!isnan(o->min_p)) p->min_p = o->min_p;
    if (o->top_k >= 0) p->top_k = o->top_k;
    if (!isnan(o->repetition_penalty)) p->repetition_penalty = o->repetition_penalty;
    if (!isnan(o->presence_penalty)) p->presence_penalty = o->presence_penalty;
    if (!isnan(o->frequency_penalty)) p->frequency_penalty = o->frequency_penalty;
}

/* The next draw as sample_row takes it: the window read in place. */
static SampleRow sampler_next_row(const Sampler *s) {
    const SamplerParams *p = &s->p;
    return (SampleRow){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
                       .repetition_penalty = p->repetition_penalty, .presence_penalty = p->presence_penalty,
                       .frequency_penalty = p->frequency_penalty, .pen_ids = s->distinct,
                       .pen_counts = s->distinct_count, .n_pen = s->penalize ? s->n_distinct : 0,
                       .uniform = sampler_uniform_peek(s)};
}

int32_t sampler_sample(Sampler *s, float *logits, int n) {
    if (n > s->n_vocab) n = s->n_vocab; /* the buffers hold n_vocab; ids beyond it are not drawn */
    if (n <= 0) return 0;
    SampleRow row = sampler_next_row(s);
    bool drew;
    int32_t id = sample_row_draw(&row, logits, n, s->cand, s->prob, &drew);
    if (drew) sampler_uniform_skip(s);
    return id;
}

int sampler_probs(Sampler *s, float *logits, int n, int32_t *ids, float *probs) {
    if (n > s->n_vocab) n = s->n_vocab;
    if (n <= 0) return 0;
    SampleRow row = sampler_next_row(s);
    bool sorted;
    int nc = sample_row_candidates(&row, logits, n, s->cand, s->prob, &sorted);
    if (!sorted) sample_cands_rank(s->cand, s->prob, nc);
    for (int i = 0; i < nc; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = s->prob[i];
    }
    return nc;
}

double sampler_uniform_peek(const Sampler *s) {
    uint64_t copy[4] = {s->rng[0], s->rng[1], s->rng[2], s->rng[3]};
    return rng_uniform(copy);
}

void sampler_uniform_skip(Sampler *s) { (void)rng_uniform(s->rng); }

int sampler_row(const Sampler *s, SampleRow *row, int32_t *ids, int32_t *counts, int cap) {
    const SamplerParams *p = &s->p;
    int n = sampler_penalty_window(s, ids, counts, cap);
    *row = (SampleRow){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
                       .repetition_penalty = p->repetition_penalty, .presence_penalty = p->presence_penalty,
                       .frequency_penalty = p->frequency_penalty, .pen_ids = ids, .pen_counts = counts,
                       .n_pen = n <= cap ? n : 0, .uniform = sampler_uniform_peek(s)};
    return n;
}

int sampler_penalty_window(const Sampler *s, int32_t *ids, int32_t *counts, int cap) {
    if (!s->penalize) return 0;
    for (int i = 0; i < s->n_distinct && i < cap; i++) {
        ids[i] = s->distinct[i];
        counts[i] = s->distinct_count[i];
    }
    return s->n_distinct;
}
