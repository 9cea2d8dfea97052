/* sample_row.c — penalties, temperature, top-k / top-p / min-p and the draw
 * of one row as a SampleRow describes it (see sample_row.h).
 *
 * Semantics, in the order applied to one row of logits l[0..V):
 *
 *  1. Repetition penalty (Hugging Face): for each DISTINCT token t in the
 *     window, once: l[t] = l[t] > 0 ? l[t] / r : l[t] * r.
 *  2. Presence and frequency penalties (OpenAI), c = count of t in the window:
 *     l[t] -= presence * (c > 0) + frequency * c.
 *     The window (the row's pen_ids / pen_counts) is the last penalty_last_n
 *     accepted tokens (0 = all of them); prompt tokens count when they were
 *     accepted, as in HF (engine/sampler.c keeps it).
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
 *     is drawn with the row's uniform u in [0, 1) (its request's generator,
 *     engine/sampler.c): the first candidate whose cumulative p exceeds u;
 *     a lone survivor is taken without using u.
 *
 * Cost on a 262k vocabulary: the penalties touch only the window; top-k is a
 * heap selection (O(V log k), no sort of the vocabulary); top-p without top-k
 * buckets the probability mass by logit in one pass and sorts only the bucket
 * where the cumulative mass crosses top_p, so even a flat row's nucleus of
 * 100k tokens is never sorted. Survivors of top-p without top-k are drawn in
 * that (partly unsorted) order, which does not change the distribution.
 */
#include "kernels/sample_row.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static void penalties_apply(const SampleRow *r, float *logits, int n) {
    for (int i = 0; i < r->n_pen; i++) {
        int32_t t = r->pen_ids[i];
        if (t < 0 || t >= n) continue;
        float l = logits[t];
        if (r->repetition_penalty != 1.0f) l = l > 0.0f ? l / r->repetition_penalty : l * r->repetition_penalty;
        l -= r->presence_penalty + r->frequency_penalty * (float)r->pen_counts[i];
        logits[t] = l;
    }
}

/* ---- candidate selection ---- */

/* a ranks before b: larger x, then lower id. */
static bool cand_before(SampleCand a, SampleCand b) { return a.x > b.x || (a.x == b.x && a.id < b.id); }

static int cand_cmp(const void *pa, const void *pb) {
    SampleCand a = *(const SampleCand *)pa, b = *(const SampleCand *)pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Min-heap on rank (the worst kept candidate at the root). */
static void heap_sift_down(SampleCand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(h[w], h[l])) w = l;
        if (r < n && cand_before(h[w], h[r])) w = r;
        if (w == i) return;
        SampleCand tmp = h[i];
        h[i] = h[w];
        h[w] = tmp;
        i = w;
    }
}

/* Moves the best k of c[0..n) to c[0..k), sorted best first. */
static void cand_select_sorted(SampleCand *c, int n, int k) {
    if (k < n) {
        for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
        for (int i = k; i < n; i++) {
            if (!cand_before(c[i], c[0])) continue;
            SampleCand tmp = c[0];
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
static double cand_mass(const SampleCand *c, int n) {
    double z = 0;
    for (int i = 0; i < n; i++) z += c[i].w;
    return z;
}

/* How many of the rank-sorted c[0..n) reach top_p of the mass z (at least
 * one; all n when rounding keeps the sum just under top_p). */
static int top_p_prefix(const SampleCand *c, int n, double z, double top_p) {
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
static int top_p_bucket(const SampleCand *c, float xmax) {
    float d = (xmax - c->x) * (TOP_P_BUCKETS / TOP_P_SPAN);
    return d < TOP_P_BUCKETS ? (int)d : TOP_P_BUCKETS;
}

static int top_p_unsorted(SampleCand *c, int n, float xmax, double top_p) {
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
        SampleCand t = c[i];
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
static int cand_collect(SampleCand *c, const float *logits, int n, float inv_temp, float *xmax) {
    int nc = 0;
    *xmax = -INFINITY;
    for (int i = 0; i < n; i++) {
        float x = scaled_logit(logits[i], inv_temp);
        if (x == -INFINITY) continue; /* probability 0: never a candidate */
        c[nc++] = (SampleCand){i, x, 0.0f};
        if (x > *xmax) *xmax = x;
    }
    return nc;
}

int sample_row_candidates(const SampleRow *p, float *logits, int n, SampleCand *c, float *prob, bool *sorted) {
    *sorted = true;
    penalties_apply(p, logits, n);
    float inv_temp = 1.0f / p->temperature; /* inf for 0 and for temperatures too small to divide by */
    float xmax;
    int nc = isinf(inv_temp) || p->top_k == 1 ? 0 : cand_collect(c, logits, n, inv_temp, &xmax);
    if (nc == 0) { /* greedy, or no finite logit (then argmax gives the fallback 0) */
        c[0] = (SampleCand){logits_argmax(logits, n), 0.0f, 1.0f};
        prob[0] = 1.0f;
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
        if (pr > 0.0f) c[kept] = c[i], prob[kept++] = pr;
    }
    return kept;
}

int32_t sample_row_draw(const SampleRow *row, float *logits, int n, SampleCand *cand, float *prob, bool *drew) {
    *drew = false;
    if (n <= 0) return 0;
    bool sorted;
    int nc = sample_row_candidates(row, logits, n, cand, prob, &sorted);
    if (nc <= 1) return cand[0].id;
    *drew = true;
    double total = 0;
    for (int i = 0; i < nc; i++) total += prob[i];
    double u = row->uniform * total, cum = 0;
    for (int i = 0; i < nc; i++) {
        cum += prob[i];
        if (u < cum) return cand[i].id;
    }
    return cand[nc - 1].id; /* u landed in the rounding gap at the very end */
}

void sample_cands_rank(SampleCand *cand, float *prob, int n) {
    /* the sort moves cand only, so carry each probability in x (same order as x) */
    for (int i = 0; i < n; i++) cand[i].x = prob[i];
    qsort(cand, (size_t)n, sizeof *cand, cand_cmp);
    for (int i = 0; i < n; i++) prob[i] = cand[i].x;
}
