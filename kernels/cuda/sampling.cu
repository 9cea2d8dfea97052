/* sampling.cu — the batched GPU sampler: one block of 1024 threads per row.
 *
 * The semantics are engine/sampler.c's, step for step (read its header):
 * penalties in place, NaN -> -inf, +inf -> FLT_MAX, x = l * (1/temperature),
 * greedy argmax (lowest id on ties), top-k by (x desc, id asc), weights
 * w = expf(x - xmax), top-p, min-p (w >= min_p), p = (float)(w / z), zero
 * probabilities dropped, and the draw: the first candidate, in the CPU's
 * order, whose cumulative p exceeds u * total. The CPU's order matters for
 * which token a uniform maps to:
 *   - top-k active (0 < k < candidates): rank order (x desc, id asc);
 *   - otherwise: id order, except that with top-p the candidates of the
 *     "edge" bucket (the 1/32-nat slice of x where the cumulative mass
 *     crosses top_p) come last, in rank order.
 * Nothing sorts the vocabulary. Rank questions ("which candidate is the
 * k-th", "where does the cumulative mass in rank order cross R") are
 * answered by rank_search: a radix descent over a 32-bit order-preserving key
 * of x, one 256-bin weighted histogram per byte (4 passes over the row), then
 * the ties of the final key taken in id order. Weights are integers (counts,
 * or masses in fixed point with 44 fractional bits), so every histogram and
 * sum is exact and the result is the same on every run. Top-k (k <= 1024)
 * gathers its k survivors into shared memory and sorts them there (bitonic).
 *
 * The GPU agrees with the CPU token for token except where rounding differs:
 * expf here vs glibc's (1-2 ulp), sums in another order; so a uniform within
 * rounding of a CDF boundary, or a weight within an ulp of min_p or of the
 * top-p cut, can pick the neighbour. Greedy is exact.
 *
 * Each pass re-reads the row (from L2 after the first) rather than keeping
 * per-element state: one block per row keeps rows independent and the
 * launch simple; a few blocks per row would speed batch 1 (kernels/NOTES.md). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/err.h"
extern "C" {
#include "engine/sampler.h"
}
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.cuh"

#define THREADS 1024
#define WARPS (THREADS / 32)
#define TOP_P_BUCKETS 1024      /* as engine/sampler.c */
#define TOP_P_SPAN 32.0f
#define FIX_ONE 17592186044416.0 /* 2^44: fixed-point scale of masses */

/* ---------------- per-element view of a row ---------------- */

/* What a rank_search counts: plain candidates, or the candidates' masses, or
 * the drawable candidates of the top-p edge bucket by their probability. */
enum { SET_COUNT, SET_MASS, SET_EDGE_PROB };

typedef struct {
    const float *l;
    int n;
    float inv_temp, xmax, top_p, min_p;
    int top_k;
    bool cut;              /* survivors restricted to rank <= (cut_key, cut_id) */
    uint32_t cut_key;
    int cut_id;
    int edge;              /* top-p edge bucket; TOP_P_BUCKETS + 1: none */
    double z2;             /* mass of the survivors (before dropping zero p) */
} Row;

__device__ float scaled_logit(float l, float inv_temp) {
    if (isnan(l)) return -INFINITY;
    if (l == INFINITY) l = FLT_MAX;
    float x = __fmul_rn(l, inv_temp);
    return x > FLT_MAX ? FLT_MAX : x;
}

/* Larger x, larger key; -0 and +0 the same key (the CPU compares them equal). */
__device__ uint32_t key_of(float x) {
    uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ float x_of_key(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

__device__ int bucket_of(float x, float xmax) {
    float d = __fmul_rn(__fsub_rn(xmax, x), TOP_P_BUCKETS / TOP_P_SPAN);
    return d < TOP_P_BUCKETS ? (int)d : TOP_P_BUCKETS;
}

__device__ float weight_of(float x, float xmax) { return expf(__fsub_rn(x, xmax)); }

__device__ uint64_t fixed(float v) { return __double2ull_rn((double)v * FIX_ONE); }

__device__ bool in_cut(const Row *r, uint32_t key, int i) {
    return !r->cut || key > r->cut_key || (key == r->cut_key && i <= r->cut_id);
}

/* Survivor of top-p and min-p (unsorted path): its probability, else 0. */
__device__ float surv_prob(const Row *r, float x, uint32_t key, int i, float *w_out) {
    if (x == -INFINITY || !in_cut(r, key, i)) return 0.0f;
    float w = weight_of(x, r->xmax);
    *w_out = w;
    if (r->min_p > 0.0f && !(w >= r->min_p)) return 0.0f;
    return (float)((double)w / r->z2);
}

/* Membership and weight of element i in a search set. */
__device__ bool set_member(const Row *r, int set, int i, uint32_t *key, uint64_t *wt) {
    float x = scaled_logit(r->l[i], r->inv_temp);
    if (x == -INFINITY) return false;
    *key = key_of(x);
    if (set == SET_COUNT) { *wt = 1; return true; }
    if (set == SET_MASS) { *wt = fixed(weight_of(x, r->xmax)); return true; }
    if (bucket_of(x, r->xmax) != r->edge) return false;
    float w, p = surv_prob(r, x, *key, i, &w);
    *wt = fixed(p);
    return p > 0.0f;
}

/* ---------------- block helpers (blockDim.x == THREADS) ---------------- */

__device__ double block_sum_d(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) { /* fixed order: the same sum on every run */
        v = sh[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) sh[32] = v;
    }
    __syncthreads();
    v = sh[32];
    __syncthreads();
    return v;
}

__device__ uint64_t block_sum_u64(uint64_t v, uint64_t *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = sh[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) sh[32] = v;
    }
    __syncthreads();
    v = sh[32];
    __syncthreads();
    return v;
}

/* Inclusive prefix sum over the block in thread order; *total gets the sum. */
__device__ double block_scan_d(double v, double *sh, double *total) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = sh[lane];
        for (int o = 1; o < 32; o <<= 1) {
            double t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += t;
        }
        sh[lane] = s;
    }
    __syncthreads();
    if (warp > 0) v += sh[warp - 1];
    *total = sh[31];
    __syncthreads();
    return v;
}

/* The warp-contiguous segment of the row that warp w walks (a multiple of 32). */
__device__ int warp_segment(int n) { return (n + THREADS - 1) / THREADS * 32; }

/* ---------------- rank search ---------------- */

typedef struct {
    uint64_t hist[256];
    uint32_t cnt[256];
    uint64_t warp_u[WARPS + 1];
    uint32_t warp_c[WARPS];
    uint64_t above, target;
    uint32_t prefix;
    int found, bin, result;
} SearchShared;

/* Warp 0 finds, scanning the bins from the top key down, the first bin where
 * above + mass > target; sets sh->bin (-1: none) and adds the bins above it
 * to sh->above. */
__device__ void search_pick_bin(SearchShared *sh) {
    int lane = threadIdx.x;
    uint64_t s = 0; /* lane j holds bins 255-8j .. 248-8j */
    for (int t = 0; t < 8; t++) s += sh->hist[255 - 8 * lane - t];
    uint64_t incl = s;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    uint64_t before = sh->above + incl - s;
    unsigned hit = __ballot_sync(0xffffffffu, before + s > sh->target);
    if (hit == 0) {
        if (lane == 0) sh->bin = -1;
        return;
    }
    int j = __ffs(hit) - 1;
    if (lane == j) {
        uint64_t cum = before;
        int b = 255 - 8 * j;
        while (cum + sh->hist[b] <= sh->target) cum += sh->hist[b--];
        sh->bin = b;
        sh->above = cum;
    }
}

/* The id of the m-th (from 0) element of set with key == k, in id order. */
__device__ int find_nth_tie(const Row *r, int set, uint32_t k, uint32_t m, SearchShared *sh) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, seg = warp_segment(r->n);
    int lo = warp * seg, hi = min(r->n, lo + seg);
    uint32_t c = 0;
    for (int base = lo; base < hi; base += 32) {
        int i = base + lane;
        uint32_t key;
        uint64_t wt;
        bool hit = i < hi && set_member(r, set, i, &key, &wt) && key == k;
        c += __popc(__ballot_sync(0xffffffffu, hit));
    }
    if (lane == 0) sh->warp_c[warp] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t before = 0;
        int w = 0;
        while (w < WARPS - 1 && before + sh->warp_c[w] <= m) before += sh->warp_c[w++];
        sh->bin = w;
        sh->target = m - before;
        sh->result = -1;
    }
    __syncthreads();
    if (warp == sh->bin) {
        uint32_t left = (uint32_t)sh->target;
        for (int base = lo; base < hi; base += 32) {
            int i = base + lane;
            uint32_t key;
            uint64_t wt;
            bool hit = i < hi && set_member(r, set, i, &key, &wt) && key == k;
            unsigned b = __ballot_sync(0xffffffffu, hit);
            if ((uint32_t)__popc(b) > left) {
                for (uint32_t t = 0; t < left; t++) b &= b - 1; /* drop the lowest `left` bits */
                if (lane == 0) sh->result = base + __ffs(b) - 1;
                break;
            }
            left -= __popc(b);
        }
    }
    __syncthreads();
    return sh->result;
}

/* The first element of set, in rank order (x desc, id asc), at which the
 * cumulative weight exceeds target; returns false when the set's whole
 * weight is <= target. */
__device__ bool rank_search(const Row *r, int set, uint64_t target, uint32_t *key_out, int *id_out,
                            SearchShared *sh) {
    if (threadIdx.x == 0) { sh->above = 0; sh->target = target; sh->prefix = 0; }
    for (int level = 0; level < 4; level++) {
        int shift = 24 - 8 * level;
        for (int b = threadIdx.x; b < 256; b += THREADS) sh->hist[b] = 0, sh->cnt[b] = 0;
        __syncthreads();
        uint32_t prefix = sh->prefix;
        for (int i = threadIdx.x; i < r->n; i += THREADS) {
            uint32_t key;
            uint64_t wt;
            if (!set_member(r, set, i, &key, &wt)) continue;
            if (level > 0 && (key >> (shift + 8)) != prefix) continue;
            int b = (key >> shift) & 255;
            if (wt) atomicAdd((unsigned long long *)&sh->hist[b], (unsigned long long)wt);
            atomicAdd(&sh->cnt[b], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) search_pick_bin(sh);
        __syncthreads();
        if (sh->bin < 0) return false;
        if (threadIdx.x == 0) sh->prefix = prefix << 8 | (uint32_t)sh->bin;
        __syncthreads();
    }
    uint32_t k = sh->prefix;
    int b = k & 255;
    uint64_t wt = sh->hist[b] / sh->cnt[b]; /* ties share one x, so one weight */
    uint32_t m = (uint32_t)((sh->target - sh->above) / wt);
    __syncthreads();
    *key_out = k;
    *id_out = find_nth_tie(r, set, k, m, sh);
    return *id_out >= 0;
}

/* ---------------- the three ends of a row ---------------- */

typedef struct {
    SearchShared s;
    double d[WARPS + 1];
    uint64_t sel[THREADS];
    float bv[WARPS];
    int bi[WARPS], ni[WARPS];
    int token, drew, first, last;
} Shared;

/* Penalized logits in place, as penalties_apply. */
__device__ void apply_penalties(float *l, int n, const GpuSampleRow *p, const int32_t *ids, const int32_t *counts) {
    for (int j = threadIdx.x; j < p->pen_len; j += THREADS) {
        int t = ids[p->pen_start + j];
        if (t < 0 || t >= n) continue;
        float v = l[t];
        if (p->repetition_penalty != 1.0f)
            v = v > 0.0f ? __fdiv_rn(v, p->repetition_penalty) : __fmul_rn(v, p->repetition_penalty);
        v = __fsub_rn(v, __fadd_rn(p->presence_penalty,
                                   __fmul_rn(p->frequency_penalty, (float)counts[p->pen_start + j])));
        l[t] = v;
    }
}

/* top-k active: the k best gathered, sorted, then top-p, min-p and the draw
 * in rank order. */
__device__ void sample_sorted(const Row *r, double u, Shared *sh) {
    uint32_t tk;
    int tid_cut;
    rank_search(r, SET_COUNT, (uint64_t)r->top_k - 1, &tk, &tid_cut, &sh->s);
    if (threadIdx.x == 0) sh->first = 0;
    sh->sel[threadIdx.x] = 0; /* below every candidate's key */
    __syncthreads();
    for (int i = threadIdx.x; i < r->n; i += THREADS) {
        float x = scaled_logit(r->l[i], r->inv_temp);
        if (x == -INFINITY) continue;
        uint32_t key = key_of(x);
        if (key > tk || (key == tk && i <= tid_cut))
            sh->sel[atomicAdd(&sh->first, 1)] = (uint64_t)key << 32 | (0xffffffffu - (uint32_t)i);
    }
    __syncthreads();
    for (int k2 = 2; k2 <= THREADS; k2 <<= 1) /* bitonic sort, descending */
        for (int j = k2 >> 1; j > 0; j >>= 1) {
            int i = threadIdx.x, o = i ^ j;
            if (o > i) {
                uint64_t a = sh->sel[i], b = sh->sel[o];
                bool desc = (i & k2) == 0;
                if (desc ? a < b : a > b) sh->sel[i] = b, sh->sel[o] = a;
            }
            __syncthreads();
        }
    int i = threadIdx.x;
    bool in = i < r->top_k;
    float w = in ? weight_of(x_of_key((uint32_t)(sh->sel[i] >> 32)), r->xmax) : 0.0f;
    if (r->top_p < 1.0f) {
        double z, cum = block_scan_d(w, sh->d, &z);
        if (threadIdx.x == 0) sh->first = r->top_k;
        __syncthreads();
        if (in && cum >= (double)r->top_p * z) atomicMin(&sh->first, i + 1);
        __syncthreads();
        in = i < sh->first;
        __syncthreads();
    }
    if (r->min_p > 0.0f && !(w >= r->min_p)) in = false;
    double z2 = block_sum_d(in ? w : 0.0f, sh->d);
    float p = in ? (float)((double)w / z2) : 0.0f;
    double total, cum = block_scan_d(p, sh->d, &total);
    double target = u * total;
    if (threadIdx.x == 0) sh->first = THREADS, sh->last = -1, sh->ni[0] = 0;
    __syncthreads();
    if (p > 0.0f) {
        atomicAdd(&sh->ni[0], 1);
        atomicMax(&sh->last, i);
        if (target < cum) atomicMin(&sh->first, i);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = sh->first < THREADS ? sh->first : sh->last; /* u in the rounding gap: the last */
        sh->token = (int)(0xffffffffu - (uint32_t)sh->sel[at]);
        sh->drew = sh->ni[0] > 1;
    }
    __syncthreads();
}

/* Draw among the survivors outside the edge bucket, in id order: warps take
 * contiguous segments, warp 0 finds the segment, its warp walks it. */
__device__ int draw_in_id_order(const Row *r, double target, Shared *sh) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, seg = warp_segment(r->n);
    int lo = warp * seg, hi = min(r->n, lo + seg);
    double s = 0;
    for (int i = lo + lane; i < hi; i += 32) {
        float x = scaled_logit(r->l[i], r->inv_temp), w;
        float p = surv_prob(r, x, key_of(x), i, &w);
        if (p > 0.0f && bucket_of(x, r->xmax) < r->edge) s += p;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sh->d[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double before = 0;
        int w = 0, last = 0;
        for (; w < WARPS; w++) {
            if (sh->d[w] > 0) last = w;
            if (before + sh->d[w] > target) break;
            before += sh->d[w];
        }
        sh->first = w < WARPS ? w : last;
        sh->d[WARPS] = w < WARPS ? target - before : INFINITY; /* INFINITY: take its last */
        sh->token = -1;
    }
    __syncthreads();
    if (warp == sh->first) {
        double left = sh->d[WARPS], cum = 0;
        int last = -1;
        for (int base = lo; base < hi; base += 32) {
            int i = base + lane;
            float p = 0.0f, w;
            if (i < hi) {
                float x = scaled_logit(r->l[i], r->inv_temp);
                p = surv_prob(r, x, key_of(x), i, &w);
                if (bucket_of(x, r->xmax) >= r->edge) p = 0.0f;
            }
            double v = p;
            for (int o = 1; o < 32; o <<= 1) {
                double t = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += t;
            }
            unsigned hit = __ballot_sync(0xffffffffu, p > 0.0f && left < cum + v);
            unsigned any = __ballot_sync(0xffffffffu, p > 0.0f);
            if (any) last = base + 31 - __clz(any);
            if (hit) { last = base + __ffs(hit) - 1; break; }
            cum += __shfl_sync(0xffffffffu, v, 31);
        }
        if (lane == 0) sh->token = last;
    }
    __syncthreads();
    return sh->token;
}

/* No top-k cut: top-p by a rank search on mass, min-p, then the draw in the
 * CPU's order (id order, the edge bucket last in rank order). */
__device__ void sample_unsorted(Row *r, double u, Shared *sh) {
    r->edge = TOP_P_BUCKETS + 1;
    if (r->top_p < 1.0f) {
        uint64_t zf = 0;
        for (int i = threadIdx.x; i < r->n; i += THREADS) {
            float x = scaled_logit(r->l[i], r->inv_temp);
            if (x != -INFINITY) zf += fixed(weight_of(x, r->xmax));
        }
        zf = block_sum_u64(zf, sh->s.warp_u);
        uint64_t need = (uint64_t)ceil((double)r->top_p * (double)zf); /* cum >= top_p z */
        uint32_t key;
        int id;
        if (rank_search(r, SET_MASS, need > 0 ? need - 1 : 0, &key, &id, &sh->s)) {
            r->cut = true, r->cut_key = key, r->cut_id = id;
            r->edge = bucket_of(x_of_key(key), r->xmax);
        } else {
            r->edge = TOP_P_BUCKETS; /* rounding kept the sum under top_p: all kept */
        }
    }
    r->z2 = 1.0; /* surv_prob's p is unused in this pass */
    double z2 = 0;
    for (int i = threadIdx.x; i < r->n; i += THREADS) {
        float x = scaled_logit(r->l[i], r->inv_temp), w;
        if (surv_prob(r, x, key_of(x), i, &w) > 0.0f) z2 += w;
    }
    r->z2 = block_sum_d(z2, sh->d);
    double total = 0, mass_a = 0;
    uint64_t mass_b = 0;
    int n_pos = 0, last = -1;
    for (int i = threadIdx.x; i < r->n; i += THREADS) {
        float x = scaled_logit(r->l[i], r->inv_temp), w;
        float p = surv_prob(r, x, key_of(x), i, &w);
        if (!(p > 0.0f)) continue;
        total += p, n_pos++, last = i;
        if (bucket_of(x, r->xmax) < r->edge) mass_a += p;
        else mass_b += fixed(p);
    }
    total = block_sum_d(total, sh->d);
    mass_a = block_sum_d(mass_a, sh->d);
    mass_b = block_sum_u64(mass_b, sh->s.warp_u);
    n_pos = (int)block_sum_u64((uint64_t)n_pos, sh->s.warp_u);
    if (threadIdx.x == 0) sh->last = -1;
    __syncthreads();
    atomicMax(&sh->last, last);
    __syncthreads();
    int token = sh->last, drew = n_pos > 1;
    if (drew) {
        double target = u * total;
        if (target < mass_a || mass_b == 0) {
            token = draw_in_id_order(r, mass_b == 0 && target >= mass_a ? INFINITY : target, sh);
        } else {
            uint64_t rb = (uint64_t)floor((target - mass_a) * FIX_ONE);
            uint32_t key;
            if (rb >= mass_b) rb = mass_b - 1; /* the rounding gap at the end: the last */
            rank_search(r, SET_EDGE_PROB, rb, &key, &token, &sh->s);
        }
    }
    if (threadIdx.x == 0) sh->token = token, sh->drew = drew;
    __syncthreads();
}

/* ---------------- the kernel ---------------- */

__global__ void __launch_bounds__(THREADS)
kernel_sample(float *logits, int n, const GpuSampleRow *rows, const int32_t *pen_ids, const int32_t *pen_counts,
              int32_t *out_tok, int32_t *out_drew) {
    __shared__ Shared sh;
    __shared__ Row r;
    const GpuSampleRow *p = &rows[blockIdx.x];
    float *l = logits + (int64_t)blockIdx.x * n;
    apply_penalties(l, n, p, pen_ids, pen_counts);
    __syncthreads();
    /* one pass: xmax and the candidate count over x, argmax over the logits */
    float xmax = -INFINITY, bv = -INFINITY;
    int nc = 0, bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        float li = l[i], x = scaled_logit(li, p->inv_temp);
        if (li > bv) bv = li, bi = i;
        if (x != -INFINITY) nc++, xmax = fmaxf(xmax, x);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        xmax = fmaxf(xmax, __shfl_xor_sync(0xffffffffu, xmax, o));
        nc += __shfl_xor_sync(0xffffffffu, nc, o);
    }
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) sh.bv[warp] = bv, sh.bi[warp] = bi, sh.ni[warp] = nc, sh.d[warp] = xmax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = -INFINITY, m = -INFINITY;
        int at = INT_MAX, count = 0;
        for (int w = 0; w < WARPS; w++) {
            if (sh.bv[w] > b || (sh.bv[w] == b && sh.bi[w] < at)) b = sh.bv[w], at = sh.bi[w];
            m = fmaxf(m, (float)sh.d[w]);
            count += sh.ni[w];
        }
        r.l = l, r.n = n, r.inv_temp = p->inv_temp, r.xmax = m, r.top_p = p->top_p, r.min_p = p->min_p;
        r.top_k = p->top_k, r.cut = false, r.cut_key = 0, r.cut_id = 0, r.edge = TOP_P_BUCKETS + 1, r.z2 = 1.0;
        sh.token = b > -INFINITY ? at : 0; /* no logit above -inf: token 0 */
        sh.drew = 0;
        sh.first = isinf(p->inv_temp) || p->top_k == 1 || count == 0 ? -1 : count; /* -1: greedy */
    }
    __syncthreads();
    int count = sh.first;
    if (count >= 0) {
        Row rr = r;
        __syncthreads();
        if (rr.top_k > 0 && rr.top_k < count) sample_sorted(&rr, p->uniform, &sh);
        else sample_unsorted(&rr, p->uniform, &sh);
    }
    if (threadIdx.x == 0) {
        out_tok[blockIdx.x] = sh.token;
        out_drew[blockIdx.x] = sh.drew;
    }
}

/* ---------------- launchers ---------------- */

extern "C" int gpu_sampler_build(GpuSampler *g, int max_rows, int n_vocab, int max_pen, Err *err) {
    memset(g, 0, sizeof *g);
    if (max_rows <= 0 || n_vocab <= 0 || max_pen < 0)
        return err_set(err, "gpu sampler: bad sizes (rows %d, vocabulary %d, window entries %d)", max_rows, n_vocab,
                       max_pen);
    g->max_rows = max_rows, g->n_vocab = n_vocab, g->max_pen = max_pen;
    size_t pen = 2 * (size_t)(max_pen > 0 ? max_pen : 1);
    CUDA_CHECK(cudaMallocHost((void **)&g->h_rows, (size_t)max_rows * sizeof *g->h_rows), err);
    CUDA_CHECK(cudaMalloc((void **)&g->d_rows, (size_t)max_rows * sizeof *g->d_rows), err);
    CUDA_CHECK(cudaMallocHost((void **)&g->h_pen, pen * sizeof *g->h_pen), err);
    CUDA_CHECK(cudaMalloc((void **)&g->d_pen, pen * sizeof *g->d_pen), err);
    CUDA_CHECK(cudaMallocHost((void **)&g->h_out, 2 * (size_t)max_rows * sizeof *g->h_out), err);
    CUDA_CHECK(cudaMalloc((void **)&g->d_out, 2 * (size_t)max_rows * sizeof *g->d_out), err);
    return 0;
}

extern "C" void gpu_sampler_free(GpuSampler *g) {
    cudaFreeHost(g->h_rows);
    cudaFree(g->d_rows);
    cudaFreeHost(g->h_pen);
    cudaFree(g->d_pen);
    cudaFreeHost(g->h_out);
    cudaFree(g->d_out);
    memset(g, 0, sizeof *g);
}

extern "C" int gpu_sampler_set_row(GpuSampler *g, int r, const Sampler *s, Err *err) {
    if (r < 0 || r >= g->max_rows) return err_set(err, "gpu sampler: row %d outside 0..%d", r, g->max_rows - 1);
    if (s->n_vocab != g->n_vocab)
        return err_set(err, "gpu sampler: row %d has a vocabulary of %d, the sampler was built for %d", r, s->n_vocab,
                       g->n_vocab);
    const SamplerParams *p = &s->p;
    if (p->top_k > GPU_SAMPLE_MAX_TOP_K && p->top_k < g->n_vocab)
        return err_set(err, "gpu sampler: top_k %d is above the GPU limit %d; sample this row on the CPU", p->top_k,
                       GPU_SAMPLE_MAX_TOP_K);
    if (r == 0) g->n_pen = 0;
    int room = g->max_pen - g->n_pen;
    int n = sampler_penalty_window(s, g->h_pen + g->n_pen, g->h_pen + g->max_pen + g->n_pen, room);
    if (n > room)
        return err_set(err, "gpu sampler: the penalty windows need more than the %d entries it was built for",
                       g->max_pen);
    g->h_rows[r] = (GpuSampleRow){.inv_temp = 1.0f / p->temperature, .top_p = p->top_p, .min_p = p->min_p,
                                  .top_k = p->top_k, .repetition_penalty = p->repetition_penalty,
                                  .presence_penalty = p->presence_penalty, .frequency_penalty = p->frequency_penalty,
                                  .pen_start = g->n_pen, .pen_len = n, .uniform = sampler_uniform_peek(s)};
    g->n_pen += n;
    return 0;
}

extern "C" int gpu_sampler_run(GpuSampler *g, float *logits, int n_rows, cudaStream_t stream, Err *err) {
    if (n_rows <= 0 || n_rows > g->max_rows)
        return err_set(err, "gpu sampler: %d rows, built for 1..%d", n_rows, g->max_rows);
    CUDA_CHECK(cudaMemcpyAsync(g->d_rows, g->h_rows, (size_t)n_rows * sizeof *g->h_rows, cudaMemcpyHostToDevice,
                               stream), err);
    if (g->n_pen > 0) {
        CUDA_CHECK(cudaMemcpyAsync(g->d_pen, g->h_pen, (size_t)g->n_pen * sizeof *g->h_pen, cudaMemcpyHostToDevice,
                                   stream), err);
        CUDA_CHECK(cudaMemcpyAsync(g->d_pen + g->max_pen, g->h_pen + g->max_pen, (size_t)g->n_pen * sizeof *g->h_pen,
                                   cudaMemcpyHostToDevice, stream), err);
    }
    kernel_sample<<<n_rows, THREADS, 0, stream>>>(logits, g->n_vocab, g->d_rows, g->d_pen, g->d_pen + g->max_pen,
                                                   g->d_out, g->d_out + g->max_rows);
    CUDA_CHECK(cudaGetLastError(), err);
    CUDA_CHECK(cudaMemcpyAsync(g->h_out, g->d_out, (size_t)n_rows * sizeof *g->h_out, cudaMemcpyDeviceToHost, stream),
               err);
    CUDA_CHECK(cudaMemcpyAsync(g->h_out + g->max_rows, g->d_out + g->max_rows, (size_t)n_rows * sizeof *g->h_out,
                               cudaMemcpyDeviceToHost, stream), err);
    return 0;
}

extern "C" void gpu_sampler_finish(const GpuSampler *g, Sampler *const *samplers, int n_rows) {
    for (int r = 0; r < n_rows; r++)
        if (g->h_out[g->max_rows + r]) sampler_uniform_skip(samplers[r]);
}
