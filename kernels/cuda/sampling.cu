/* sampling.cu — the batched GPU sampler: one block of 1024 threads per row.
 *
 * The semantics are kernels/sample_row.c's, step for step (read its header):
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
 * launch simple; a few blocks per row would speed batch 1 (kernels/README.md). */
#include "kernels/cuda/sampling.cuh"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"

#define THREADS 1024
#define WARPS (THREADS / 32)
#define TOP_P_BUCKETS 1024      /* as kernels/sample_row.c */
#define TOP_P_SPAN 32.0f
#define FIX_ONE 17592186044416.0 /* 2^44: fixed-point scale of masses */
#define FINE 32.0f              /* rank_search bins per nat of x below xmax */
#define FINE_BINS THREADS       /* one bin per thread in the scan; the last takes all below */
#define GATHER_CAP 2048         /* a bin up to this size is sorted in shared memory */
#define UNROLL 4
#define FULL 0xffffffffu

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

/* Sort order of the gathered candidates: key desc, then id asc. */
__device__ uint64_t rank_code(uint32_t key, int i) { return (uint64_t)key << 32 | (0xffffffffu - (uint32_t)i); }
__device__ int id_of_code(uint64_t c) { return (int)(0xffffffffu - (uint32_t)c); }

__device__ int bucket_of(float x, float xmax) {
    float d = __fmul_rn(__fsub_rn(xmax, x), TOP_P_BUCKETS / TOP_P_SPAN);
    return d < TOP_P_BUCKETS ? (int)d : TOP_P_BUCKETS;
}

/* The search's own finer bins (1/FINE nat each), monotone in x like bucket_of. */
__device__ int fine_bin(float x, float xmax) {
    float d = __fmul_rn(__fsub_rn(xmax, x), FINE);
    return d < FINE_BINS - 1 ? (int)d : FINE_BINS - 1;
}

__device__ float weight_of(float x, float xmax) { return expf(__fsub_rn(x, xmax)); }

__device__ uint64_t fixed(float v) { return __double2ull_rn((double)v * FIX_ONE); }

__device__ bool in_cut(const Row *r, uint32_t key, int i) {
    return !r->cut || key > r->cut_key || (key == r->cut_key && i <= r->cut_id);
}

/* Survivor of top-p and min-p (unsorted path): its probability, else 0. */
__device__ float surv_prob(const Row *r, float x, uint32_t key, int i, float *w_out) {
    *w_out = 0.0f;
    if (x == -INFINITY || !in_cut(r, key, i)) return 0.0f;
    float w = weight_of(x, r->xmax);
    *w_out = w;
    if (r->min_p > 0.0f && !(w >= r->min_p)) return 0.0f;
    return (float)((double)w / r->z2);
}

/* The weight of a member of a search set with scaled logit x. */
__device__ uint64_t set_weight(const Row *r, int set, float x) {
    if (set == SET_COUNT) return 1;
    float w = weight_of(x, r->xmax);
    return fixed(set == SET_MASS ? w : (float)((double)w / r->z2));
}

/* Membership of element i (logit v) in a search set; its key and weight. */
__device__ bool set_member(const Row *r, int set, float v, int i, float *x_out, uint32_t *key, uint64_t *wt) {
    float x = scaled_logit(v, r->inv_temp);
    *x_out = x;
    if (x == -INFINITY) return false;
    *key = key_of(x);
    if (set == SET_EDGE_PROB) {
        if (bucket_of(x, r->xmax) != r->edge) return false;
        float w, p = surv_prob(r, x, *key, i, &w);
        *wt = fixed(p);
        return p > 0.0f;
    }
    *wt = set_weight(r, set, x);
    return true;
}

/* ---------------- block helpers (blockDim.x == THREADS) ---------------- */

/* UNROLL loads in flight per thread: element i = b0 + u * THREADS + lane
 * (NaN past the end: never a candidate); b0 is the same across a warp. */
__device__ void load_tile(const float *l, int n, int b0, float v[UNROLL]) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int i = b0 + u * THREADS + lane;
        v[u] = i < n ? __ldcg(l + i) : NAN;
    }
}
#define TILE_START (threadIdx.x & ~31u)
#define TILE_STEP (UNROLL * THREADS)
#define TILE_INDEX(b0, u) ((b0) + (u) * THREADS + (int)(threadIdx.x % 32))

/* Inclusive prefix sums over the block in thread order; *total gets the sum.
 * One body for the two types the sampler scans: double (probability masses)
 * and uint64_t (fixed-point masses and counts). */
template <typename T> __device__ T block_scan(T v, T *sh, T *total) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 1; o < 32; o <<= 1) {
        T t = __shfl_up_sync(FULL, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T s = sh[lane];
        for (int o = 1; o < 32; o <<= 1) {
            T t = __shfl_up_sync(FULL, s, o);
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

/* Adds (wt, 1) to bin (-1: nothing) from every lane of a warp. When the
 * whole warp hits one bin (flat rows, the top radix byte) one lane adds the
 * warp's sum: 32 lanes on one shared address would serialize. */
__device__ void hist_add(uint64_t *hist, uint32_t *cnt, int bin, uint64_t wt) {
    unsigned act = __ballot_sync(FULL, bin >= 0);
    if (!act) return;
    int lane = threadIdx.x % 32, lead = __ffs(act) - 1;
    int b0 = __shfl_sync(FULL, bin, lead);
    if (__all_sync(FULL, bin < 0 || bin == b0)) {
        uint64_t s = bin >= 0 ? wt : 0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
        if (lane == lead) {
            if (s) atomicAdd((unsigned long long *)&hist[b0], (unsigned long long)s);
            atomicAdd(&cnt[b0], (unsigned)__popc(act));
        }
    } else if (bin >= 0) {
        if (wt) atomicAdd((unsigned long long *)&hist[bin], (unsigned long long)wt);
        atomicAdd(&cnt[bin], 1u);
    }
}

/* Bitonic sort of buf[0..p) (p a power of two), descending. */
__device__ void sort_desc(uint64_t *buf, int p) {
    for (int k2 = 2; k2 <= p; k2 <<= 1)
        for (int j = k2 >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += THREADS) {
                int o = i ^ j;
                if (o <= i) continue;
                uint64_t a = buf[i], b = buf[o];
                bool desc = (i & k2) == 0;
                if (desc ? a < b : a > b) buf[i] = b, buf[o] = a;
            }
            __syncthreads();
        }
}

__device__ int pow2_at_least(int n) {
    int p = 32;
    while (p < n) p <<= 1;
    return p;
}

/* ---------------- ordered find: the first element, in id order, where a
 * cumulative value exceeds a target ---------------- */

enum { FIND_TIE, FIND_DRAW_A };

typedef struct {
    int mode, set, only_bin; /* FIND_TIE: members of set in fine bin only_bin (-1: any) with key == key */
    uint32_t key;
} Find;

typedef struct {
    double d[WARPS + 1];
    double target;
    int lo, hi, result;
} FindShared;

__device__ double find_value(const Row *r, const Find *f, float v, int i) {
    float x;
    if (f->mode == FIND_TIE) {
        uint32_t key;
        uint64_t wt;
        if (!set_member(r, f->set, v, i, &x, &key, &wt) || key != f->key) return 0;
        return f->only_bin < 0 || fine_bin(x, r->xmax) == f->only_bin ? 1 : 0;
    }
    x = scaled_logit(v, r->inv_temp);
    if (x == -INFINITY || bucket_of(x, r->xmax) >= r->edge) return 0;
    float w;
    return surv_prob(r, x, key_of(x), i, &w);
}

/* Narrows [lo, hi) 32-fold per round (a warp per slice, warp sums, thread 0
 * picks the slice), then scans the last <= 32 elements; rounding that keeps
 * every cumulative sum <= target gives the last element with a value. */
__device__ int ordered_find(const Row *r, const Find *f, double target, FindShared *sh) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) sh->lo = 0, sh->hi = r->n, sh->target = target, sh->result = -1;
    __syncthreads();
    while (sh->hi - sh->lo > 32) {
        int lo = sh->lo, hi = sh->hi, seg = ((hi - lo + WARPS - 1) / WARPS + 31) / 32 * 32;
        int a = min(hi, lo + warp * seg), b = min(hi, a + seg);
        double s = 0;
        for (int i0 = a; i0 < b; i0 += 32 * UNROLL) {
            float v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) v[u] = i0 + u * 32 + lane < b ? __ldcg(r->l + i0 + u * 32 + lane) : NAN;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) s += find_value(r, f, v[u], i0 + u * 32 + lane);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
        if (lane == 0) sh->d[warp] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            double before = 0, t = sh->target;
            int w = 0, last = -1;
            for (; w < WARPS; w++) {
                if (sh->d[w] > 0) last = w;
                if (before + sh->d[w] > t) break;
                before += sh->d[w];
            }
            if (w == WARPS) w = last, t = INFINITY; /* rounding: take the last one with a value */
            else t -= before;
            if (w < 0) sh->hi = sh->lo; /* nothing has a value */
            else sh->lo = min(hi, lo + w * seg), sh->hi = min(hi, lo + (w + 1) * seg), sh->target = t;
        }
        __syncthreads();
    }
    if (warp == 0 && sh->hi > sh->lo) {
        int i = sh->lo + lane;
        double val = i < sh->hi ? find_value(r, f, __ldcg(r->l + i), i) : 0, cum = val;
        for (int o = 1; o < 32; o <<= 1) {
            double t = __shfl_up_sync(FULL, cum, o);
            if (lane >= o) cum += t;
        }
        unsigned hit = __ballot_sync(FULL, val > 0 && sh->target < cum);
        unsigned any = __ballot_sync(FULL, val > 0);
        if (lane == 0 && any) sh->result = sh->lo + (hit ? __ffs(hit) - 1 : 31 - __clz(any));
    }
    __syncthreads();
    int res = sh->result;
    __syncthreads();
    return res;
}

/* ---------------- rank search ---------------- */

typedef struct {
    uint64_t hist[FINE_BINS];
    uint32_t cnt[FINE_BINS];
    uint64_t buf[GATHER_CAP];
    uint64_t u[WARPS + 1];
    FindShared f;
    uint64_t above, target;
    uint32_t prefix;
    int bin, n_buf, id;
} SearchShared;

__device__ void hist_clear(SearchShared *sh, int bins) {
    for (int b = threadIdx.x; b < bins; b += THREADS) sh->hist[b] = 0, sh->cnt[b] = 0;
    __syncthreads();
}

/* Warp 0 finds, from the top radix bin down, the first where above + mass >
 * target; sets sh->bin (-1: none) and adds the bins above it to sh->above. */
__device__ void radix_pick_bin(SearchShared *sh) {
    int lane = threadIdx.x;
    uint64_t s = 0; /* lane j holds bins 255-8j .. 248-8j */
    for (int t = 0; t < 8; t++) s += sh->hist[255 - 8 * lane - t];
    uint64_t incl = s;
    for (int o = 1; o < 32; o <<= 1) {
        uint64_t v = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += v;
    }
    uint64_t before = sh->above + incl - s;
    unsigned hit = __ballot_sync(FULL, before + s > sh->target);
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

/* The slow path for a fine bin too full to gather (near-flat rows): a radix
 * descent over the key bytes of the bin's members, then the tie in id order. */
__device__ bool radix_search(const Row *r, int set, int fbin, uint32_t *key_out, int *id_out, SearchShared *sh) {
    if (threadIdx.x == 0) sh->prefix = 0;
    for (int level = 0; level < 4; level++) {
        int shift = 24 - 8 * level;
        hist_clear(sh, 256);
        uint32_t prefix = sh->prefix;
        for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
            float v[UNROLL];
            load_tile(r->l, r->n, b0, v);
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                float x;
                uint32_t key;
                uint64_t wt = 0;
                int bin = -1;
                if (set_member(r, set, v[u], TILE_INDEX(b0, u), &x, &key, &wt) && fine_bin(x, r->xmax) == fbin &&
                    (level == 0 || (key >> (shift + 8)) == prefix))
                    bin = (key >> shift) & 255;
                hist_add(sh->hist, sh->cnt, bin, wt);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) radix_pick_bin(sh);
        __syncthreads();
        if (sh->bin < 0) return false;
        if (threadIdx.x == 0) sh->prefix = prefix << 8 | (uint32_t)sh->bin;
        __syncthreads();
    }
    uint32_t k = sh->prefix;
    int b = k & 255;
    uint64_t wt = sh->hist[b] / sh->cnt[b]; /* ties share one x, so one weight */
    double m = (double)((sh->target - sh->above) / wt);
    __syncthreads();
    Find f = {FIND_TIE, set, fbin, k};
    *key_out = k;
    *id_out = ordered_find(r, &f, m, &sh->f);
    return *id_out >= 0;
}

/* The first element of set, in rank order (x desc, id asc), at which the
 * cumulative weight exceeds target; false when the set's whole weight is
 * <= target. One pass bins the set by x in 1/FINE-nat slices; the slice
 * where the sum crosses is gathered into shared memory, sorted and scanned. */
__device__ bool rank_search(const Row *r, int set, uint64_t target, uint32_t *key_out, int *id_out,
                            SearchShared *sh) {
    hist_clear(sh, FINE_BINS);
    for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(r->l, r->n, b0, v);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float x;
            uint32_t key;
            uint64_t wt = 0;
            bool in = set_member(r, set, v[u], TILE_INDEX(b0, u), &x, &key, &wt);
            hist_add(sh->hist, sh->cnt, in ? fine_bin(x, r->xmax) : -1, wt);
        }
    }
    __syncthreads();
    uint64_t h = sh->hist[threadIdx.x], total, incl = block_scan<uint64_t>(h, sh->u, &total); /* FINE_BINS == THREADS */
    if (total <= target) return false;
    if (incl - h <= target && incl > target) sh->bin = threadIdx.x, sh->above = incl - h;
    if (threadIdx.x == 0) sh->n_buf = 0, sh->target = target;
    __syncthreads();
    int fbin = sh->bin, count = (int)sh->cnt[fbin];
    __syncthreads(); /* radix_search reuses cnt */
    if (count > GATHER_CAP) return radix_search(r, set, fbin, key_out, id_out, sh);
    for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(r->l, r->n, b0, v);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float x;
            uint32_t key;
            uint64_t wt;
            int i = TILE_INDEX(b0, u);
            if (set_member(r, set, v[u], i, &x, &key, &wt) && fine_bin(x, r->xmax) == fbin)
                sh->buf[atomicAdd(&sh->n_buf, 1)] = rank_code(key, i);
        }
    }
    int p = pow2_at_least(count);
    for (int i = count + threadIdx.x; i < p; i += THREADS) sh->buf[i] = 0; /* below every candidate */
    __syncthreads();
    sort_desc(sh->buf, p);
    /* thread t scans buf[2t], buf[2t+1]: the first whose cumulative weight exceeds target */
    uint64_t w0 = 0, w1 = 0;
    int i0 = 2 * threadIdx.x;
    if (i0 < count) w0 = set_weight(r, set, x_of_key((uint32_t)(sh->buf[i0] >> 32)));
    if (i0 + 1 < count) w1 = set_weight(r, set, x_of_key((uint32_t)(sh->buf[i0 + 1] >> 32)));
    uint64_t all, before = sh->above + block_scan<uint64_t>(w0 + w1, sh->u, &all) - (w0 + w1);
    if (w0 && before <= target && before + w0 > target) sh->id = i0;
    if (w1 && before + w0 <= target && before + w0 + w1 > target) sh->id = i0 + 1;
    __syncthreads();
    uint64_t c = sh->buf[sh->id];
    *key_out = (uint32_t)(c >> 32);
    *id_out = id_of_code(c);
    __syncthreads();
    return true;
}

/* ---------------- the three ends of a row ---------------- */

typedef struct {
    SearchShared s;
    double d[WARPS + 1];
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
    uint64_t *sel = sh->s.buf;
    int p2 = pow2_at_least(r->top_k);
    if (threadIdx.x == 0) sh->first = 0;
    for (int i = threadIdx.x; i < p2; i += THREADS) sel[i] = 0; /* below every candidate's key */
    __syncthreads();
    for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(r->l, r->n, b0, v);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            float x = scaled_logit(v[k], r->inv_temp);
            int i = TILE_INDEX(b0, k);
            if (x == -INFINITY) continue;
            uint32_t key = key_of(x);
            if (key > tk || (key == tk && i <= tid_cut)) sel[atomicAdd(&sh->first, 1)] = rank_code(key, i);
        }
    }
    __syncthreads();
    sort_desc(sel, p2);
    int i = threadIdx.x;
    bool in = i < r->top_k;
    float w = in ? weight_of(x_of_key((uint32_t)(sel[i] >> 32)), r->xmax) : 0.0f;
    if (r->top_p < 1.0f) {
        double z, cum = block_scan<double>(w, sh->d, &z);
        if (threadIdx.x == 0) sh->first = r->top_k;
        __syncthreads();
        if (in && cum >= (double)r->top_p * z) atomicMin(&sh->first, i + 1);
        __syncthreads();
        in = i < sh->first;
        __syncthreads();
    }
    if (r->min_p > 0.0f && !(w >= r->min_p)) in = false;
    double z2 = block_sum_1024<double>(in ? w : 0.0f, sh->d);
    float p = in ? (float)((double)w / z2) : 0.0f;
    double total, cum = block_scan<double>(p, sh->d, &total);
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
        sh->token = id_of_code(sel[at]);
        sh->drew = sh->ni[0] > 1;
    }
    __syncthreads();
}

/* No top-k cut: top-p by a rank search on mass, min-p, then the draw in the
 * CPU's order (id order, the edge bucket last in rank order). */
__device__ void sample_unsorted(Row *r, double u, Shared *sh) {
    r->edge = TOP_P_BUCKETS + 1;
    if (r->top_p < 1.0f) {
        uint64_t zf = 0;
        for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
            float v[UNROLL];
            load_tile(r->l, r->n, b0, v);
#pragma unroll
            for (int k = 0; k < UNROLL; k++) {
                float x = scaled_logit(v[k], r->inv_temp);
                if (x != -INFINITY) zf += fixed(weight_of(x, r->xmax));
            }
        }
        zf = block_sum_1024<uint64_t>(zf, sh->s.u);
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
    r->z2 = 1.0; /* surv_prob's p is w in this pass */
    double z2 = 0;
    for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(r->l, r->n, b0, v);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            float x = scaled_logit(v[k], r->inv_temp), w;
            if (x != -INFINITY && surv_prob(r, x, key_of(x), TILE_INDEX(b0, k), &w) > 0.0f) z2 += w;
        }
    }
    r->z2 = block_sum_1024<double>(z2, sh->d);
    double total = 0, mass_a = 0;
    uint64_t mass_b = 0;
    int n_pos = 0, last = -1;
    for (int b0 = TILE_START; b0 < r->n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(r->l, r->n, b0, v);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int i = TILE_INDEX(b0, k);
            float x = scaled_logit(v[k], r->inv_temp), w;
            if (x == -INFINITY) continue;
            float p = surv_prob(r, x, key_of(x), i, &w);
            if (!(p > 0.0f)) continue;
            total += p, n_pos++, last = max(last, i);
            if (bucket_of(x, r->xmax) < r->edge) mass_a += p;
            else mass_b += fixed(p);
        }
    }
    total = block_sum_1024<double>(total, sh->d);
    mass_a = block_sum_1024<double>(mass_a, sh->d);
    mass_b = block_sum_1024<uint64_t>(mass_b, sh->s.u);
    n_pos = (int)block_sum_1024<uint64_t>((uint64_t)n_pos, sh->s.u);
    if (threadIdx.x == 0) sh->last = -1;
    __syncthreads();
    atomicMax(&sh->last, last);
    __syncthreads();
    int token = sh->last, drew = n_pos > 1;
    if (drew) {
        double target = u * total;
        if (target < mass_a || mass_b == 0) {
            Find f = {FIND_DRAW_A, 0, -1, 0};
            token = ordered_find(r, &f, mass_b == 0 && target >= mass_a ? INFINITY : target, &sh->s.f);
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
    for (int b0 = TILE_START; b0 < n; b0 += TILE_STEP) {
        float v[UNROLL];
        load_tile(l, n, b0, v);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            float x = scaled_logit(v[k], p->inv_temp);
            if (v[k] > bv) bv = v[k], bi = TILE_INDEX(b0, k); /* increasing i per thread: lowest id kept */
            if (x != -INFINITY) nc++, xmax = fmaxf(xmax, x);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL, bv, o);
        int oi = __shfl_xor_sync(FULL, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        xmax = fmaxf(xmax, __shfl_xor_sync(FULL, xmax, o));
        nc += __shfl_xor_sync(FULL, nc, o);
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

extern "C" int gpu_sampler_set_row(GpuSampler *g, int r, const SampleRow *p, Err *err) {
    if (r < 0 || r >= g->max_rows) return err_set(err, "gpu sampler: row %d outside 0..%d", r, g->max_rows - 1);
    if (p->top_k > GPU_SAMPLE_MAX_TOP_K && p->top_k < g->n_vocab)
        return err_set(err, "gpu sampler: top_k %d is above the GPU limit %d; sample this row on the CPU", p->top_k,
                       GPU_SAMPLE_MAX_TOP_K);
    if (r == 0) g->n_pen = 0;
    int n = p->n_pen;
    if (n > g->max_pen - g->n_pen)
        return err_set(err, "gpu sampler: the penalty windows need more than the %d entries it was built for",
                       g->max_pen);
    memcpy(g->h_pen + g->n_pen, p->pen_ids, (size_t)n * sizeof *g->h_pen);
    memcpy(g->h_pen + g->max_pen + g->n_pen, p->pen_counts, (size_t)n * sizeof *g->h_pen);
    g->h_rows[r] = (GpuSampleRow){.inv_temp = 1.0f / p->temperature, .top_p = p->top_p, .min_p = p->min_p,
                                  .top_k = p->top_k, .repetition_penalty = p->repetition_penalty,
                                  .presence_penalty = p->presence_penalty, .frequency_penalty = p->frequency_penalty,
                                  .pen_start = g->n_pen, .pen_len = n, .uniform = p->uniform};
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

