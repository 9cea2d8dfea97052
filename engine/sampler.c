/* sampler.c — penalties, temperature, top-k / top-p / min-p and the draw.
 *
 * Semantics, in the order applied to one row of logits l[0..V):
 *
 *  1. Repetition penalty (Hugging Face): for each DISTINCT token t in the
 *     window, once: l[t] = l[t] > 0 ? l[t] / r : l[t] * r.
 *  2. Presence and frequency penalties (OpenAI), c = count of t in the window:
 *     l[t] -= presence * (c > 0) + frequency * c.
 *     The window is the last penalty_last_n accepted tokens (0 = all of them);
 *     prompt tokens count when they were accepted, as in HF.
 *  3. NaN logits become -inf (never drawn); +inf becomes FLT_MAX, so a row
 *     with +inf entries draws uniformly among them.
 *  4. temperature 0 (or so small that 1/temperature overflows), or top_k 1:
 *     the argmax of the penalized logits, lowest id on ties; no logit above
 *     -inf at all: token 0.
 *  5. Otherwise x = l / temperature and p = softmax(x) over the candidates:
 *     top-k keeps the k largest x (ties: lower id first), and p is renormalized
 *     over them; top-p keeps the smallest prefix of the sorted candidates whose
 *     cumulative p reaches top_p (at least one token); min-p drops tokens with
 *     p < min_p * max p (the ratio does not change when renormalizing, so
 *     this is exp(x - x_max) < min_p); the survivors are renormalized and one
 *     is drawn with u uniform in [0, 1) from xoshiro256** (seeded through
 *     splitmix64): the first candidate whose cumulative p exceeds u.
 *
 * Cost on a 262k vocabulary: the penalties touch only the window; top-k is a
 * heap selection (O(V log k), no sort of the vocabulary); top-p without top-k
 * buckets the probability mass by logit in one pass and sorts only the bucket
 * where the cumulative mass crosses top_p, so even a flat row's nucleus of
 * 100k tokens is never sorted. Survivors of top-p without top-k are drawn in
 * that (partly unsorted) order, which does not change the distribution.
 */
#include "engine/sampler.h"

#include <float.h>
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
        s->counts = calloc(v, sizeof *s->counts);
        s->distinct = malloc(v * sizeof *s->distinct);
        s->distinct_pos = malloc(v * sizeof *s->distinct_pos);
        if (p->penalty_last_n > 0) s->ring = malloc((size_t)p->penalty_last_n * sizeof *s->ring);
        ok = s->counts && s->distinct && s->distinct_pos && (p->penalty_last_n == 0 || s->ring);
    }
    if (!ok) {
        sampler_free(s);
        return err_set(err, "sampling: out of memory for a vocabulary of %d tokens", n_vocab);
    }
    sampler_reset(s);
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->counts);
    free(s->distinct);
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
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof *s->counts);
    for (int i = 0; i < s->n_vocab; i++) s->distinct_pos[i] = -1;
}

/* ---- the penalty window ---- */

static void window_add(Sampler *s, int32_t t) {
    if (s->counts[t]++ == 0) {
        s->distinct_pos[t] = s->n_distinct;
        s->distinct[s->n_distinct++] = t;
    }
}

static void window_remove(Sampler *s, int32_t t) {
    if (--s->counts[t] > 0) return;
    int at = s->distinct_pos[t];
    int32_t last = s->distinct[--s->n_distinct]; /* swap-remove keeps the list dense */
    s->distinct[at] = last;
    s->distinct_pos[last] = at;
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

static void penalties_apply(const Sampler *s, float *logits, int n) {
    const SamplerParams *p = &s->p;
    for (int i = 0; i < s->n_distinct; i++) {
        int32_t t = s->distinct[i];
        if (t >= n) continue;
        float l = logits[t];
        if (p->repetition_penalty != 1.0f) l = l > 0.0f ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
        logits[t] = l;
    }
}

/* ---- candidate selection ---- */

/* a ranks before b: larger x, then lower id. */
static bool cand_before(SamplerCand a, SamplerCand b) { return a.x > b.x || (a.x == b.x && a.id < b.id); }

static int cand_cmp(const void *pa, const void *pb) {
    SamplerCand a = *(const SamplerCand *)pa, b = *(const SamplerCand *)pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Min-heap on rank (the worst kept candidate at the root). */
static void heap_sift_down(SamplerCand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(h[w], h[l])) w = l;
        if (r < n && cand_before(h[w], h[r])) w = r;
        if (w == i) return;
        SamplerCand tmp = h[i];
        h[i] = h[w];
        h[w] = tmp;
        i = w;
    }
}

/* Moves the best k of c[0..n) to c[0..k), sorted best first. */
static void cand_select_sorted(SamplerCand *c, int n, int k) {
    if (k < n) {
        for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
        for (int i = k; i < n; i++) {
            if (!cand_before(c[i], c[0])) continue;
            SamplerCand tmp = c[0];
            c[0] = c[i];
            c[i] = tmp;
            heap_sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

/* Logit -> scaled candidate value: NaN never drawn, +inf the largest float. */
static float scaled_logit(float l, float inv_temp) {
    if (isnan(l)) return -INFINITY;
    if (l == INFINITY) l = FLT_MAX;
    float x = l * inv_temp;
    return x > FLT_MAX ? FLT_MAX : x;
}

/* The argmax of the penalized logits: lowest id on ties, NaN skipped, 0 when
 * no logit is above -inf. */
static int32_t logits_argmax(const float *logits, int n) {
    int32_t best = 0;
    float bx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > bx) { bx = logits[i]; best = i; }
    return best;
}

/* Sum of the weights of c[0..n). */
static double cand_mass(const SamplerCand *c, int n) {
    double z = 0;
    for (int i = 0; i < n; i++) z += c[i].w;
    return z;
}

/* How many of the rank-sorted c[0..n) reach top_p of the mass z (at least
 * one; all n when rounding keeps the sum just under top_p). */
static int top_p_prefix(const SamplerCand *c, int n, double z, double top_p) {
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum >= top_p * z) return i + 1;
    }
    return n;
}

/* top-p over n unsorted candidates without sorting them: bucket the weights
 * by how far x is below xmax (TOP_P_BUCKETS slices of TOP_P_SPAN nats, lower
 * x in one last bucket), walk the buckets from the top until they hold top_p
 * of the mass, and rank-sort only the bucket where that happens. Candidates
 * above it are kept unsorted, the ones below dropped. Returns how many are
 * kept, moved to the front of c. */
#define TOP_P_BUCKETS 1024
#define TOP_P_SPAN 32.0f
static int top_p_bucket(const SamplerCand *c, float xmax) {
    float d = (xmax - c->x) * (TOP_P_BUCKETS / TOP_P_SPAN);
    return d < TOP_P_BUCKETS ? (int)d : TOP_P_BUCKETS;
}

static int top_p_unsorted(SamplerCand *c, int n, float xmax, double top_p) {
    double mass[TOP_P_BUCKETS + 1] = {0};
    for (int i = 0; i < n; i++) mass[top_p_bucket(&c[i], xmax)] += c[i].w;
    double z = 0, above = 0; /* above: the mass of the buckets before edge */
    for (int b = 0; b <= TOP_P_BUCKETS; b++) z += mass[b];
    int edge = 0;
    while (edge < TOP_P_BUCKETS && above + mass[edge] < top_p * z) above += mass[edge++];
    int kept = 0, n_edge = 0;
    for (int i = 0; i < n; i++) { /* c becomes [above the edge | the edge bucket | ...] */
        int b = top_p_bucket(&c[i], xmax);
        if (b > edge) continue;
        SamplerCand t = c[i];
        if (b < edge) {
            c[kept + n_edge] = c[kept]; /* the edge group moves up by one */
            c[kept++] = t;
        } else {
            c[kept + n_edge++] = t;
        }
    }
    qsort(c + kept, (size_t)n_edge, sizeof *c, cand_cmp);
    double cum = above;
    for (int i = 0; i < n_edge; i++) {
        cum += c[kept + i].w;
        if (cum >= top_p * z) return kept + i + 1;
    }
    return kept + n_edge;
}

/* The finite candidates of the row: x = logit / temperature. Returns their
 * count and sets *xmax. */
static int cand_collect(SamplerCand *c, const float *logits, int n, float inv_temp, float *xmax) {
    int nc = 0;
    *xmax = -INFINITY;
    for (int i = 0; i < n; i++) {
        float x = scaled_logit(logits[i], inv_temp);
        if (x == -INFINITY) continue; /* probability 0: never a candidate */
        c[nc++] = (SamplerCand){i, x, 0.0f};
        if (x > *xmax) *xmax = x;
    }
    return nc;
}

/* Fills s->cand[0..return) with the surviving candidates and s->prob with
 * their normalized probabilities. *sorted tells whether cand is in rank
 * order. Needs n <= s->n_vocab. */
static int sampler_build(Sampler *s, float *logits, int n, bool *sorted) {
    const SamplerParams *p = &s->p;
    SamplerCand *c = s->cand;
    *sorted = true;
    if (s->penalize) penalties_apply(s, logits, n);
    float inv_temp = 1.0f / p->temperature; /* inf for 0 and for temperatures too small to divide by */
    float xmax;
    int nc = isinf(inv_temp) || p->top_k == 1 ? 0 : cand_collect(c, logits, n, inv_temp, &xmax);
    if (nc == 0) { /* greedy, or no finite logit (then argmax gives the fallback 0) */
        c[0] = (SamplerCand){logits_argmax(logits, n), 0.0f, 1.0f};
        s->prob[0] = 1.0f;
        return 1;
    }
    *sorted = p->top_k > 0 && p->top_k < nc;
    if (*sorted) {
        cand_select_sorted(c, nc, p->top_k);
        nc = p->top_k;
    }
    for (int i = 0; i < nc; i++) c[i].w = expf(c[i].x - xmax); /* the weight: p relative to the top */
    if (p->top_p < 1.0f)
        nc = *sorted ? top_p_prefix(c, nc, cand_mass(c, nc), p->top_p) : top_p_unsorted(c, nc, xmax, p->top_p);
    if (p->min_p > 0.0f) { /* w is p / p_max; the top token has w = 1 >= min_p, so one survives */
        int kept = 0;
        for (int i = 0; i < nc; i++)
            if (c[i].w >= p->min_p) c[kept++] = c[i];
        nc = kept;
    }
    double z = cand_mass(c, nc);
    int kept = 0; /* a candidate whose probability rounds to 0 can never be drawn: drop it */
    for (int i = 0; i < nc; i++) {
        float pr = (float)(c[i].w / z);
        if (pr > 0.0f) c[kept] = c[i], s->prob[kept++] = pr;
    }
    return kept;
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

int32_t sampler_sample(Sampler *s, float *logits, int n) {
    if (n > s->n_vocab) n = s->n_vocab; /* the buffers hold n_vocab; ids beyond it are not drawn */
    if (n <= 0) return 0;
    bool sorted;
    int nc = sampler_build(s, logits, n, &sorted);
    if (nc == 1) return s->cand[0].id;
    double total = 0;
    for (int i = 0; i < nc; i++) total += s->prob[i];
    double u = rng_uniform(s->rng) * total, cum = 0;
    for (int i = 0; i < nc; i++) {
        cum += s->prob[i];
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[nc - 1].id; /* u landed in the rounding gap at the very end */
}

int sampler_probs(Sampler *s, float *logits, int n, int32_t *ids, float *probs) {
    if (n > s->n_vocab) n = s->n_vocab;
    if (n <= 0) return 0;
    bool sorted;
    int nc = sampler_build(s, logits, n, &sorted);
    if (!sorted) {
        /* Pair each probability with its candidate before sorting: the sort
         * moves cand only, so carry the probability in x (same order as x). */
        for (int i = 0; i < nc; i++) s->cand[i].x = s->prob[i];
        qsort(s->cand, (size_t)nc, sizeof *s->cand, cand_cmp);
        for (int i = 0; i < nc; i++) s->prob[i] = s->cand[i].x;
    }
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
        counts[i] = s->counts[s->distinct[i]];
    }
    return s->n_distinct;
}
