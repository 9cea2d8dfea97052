/* attn_problem.h — the attention tests' problems (test_attention.c,
 * test_attention_rows.c, test_attn_cascade_gpu.c): a paged cache with a
 * shuffled, non-contiguous block assignment (sequences may share their
 * leading blocks, as the prefix cache makes them), random bf16-exact queries
 * and cache (or an fp8 cache of the host's bytes, head vectors of magnitudes
 * 2^-8 .. 2^8), the CPU op's output as the reference, the device copies with
 * the output poisoned (NaN), and the comparison. Static functions: one test
 * binary includes it once. */
#ifndef CLLM_TESTS_GPU_ATTN_PROBLEM_H
#define CLLM_TESTS_GPU_ATTN_PROBLEM_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "base/dtype.h"
#include "engine/kv_blocks.h"
#include "kernels/attn_meta.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/attention.cuh"
#include "tests/test.h"

#define MAX_SEQS 1100 /* test_attention_rows: past the many-rows kernel's 1024 sorted rows (cascade: 66) */

static KVDtype g_dtype; /* of the cache the cases run over */
static bool g_no_maps;  /* true: no TMA maps for a bf16 cache, so the sm_90a prefill gathers every key by cp.async
                           (as over fp8 caches; test_attention runs its bf16 cases both ways) */

typedef struct {
    const char *name;
    int hdk, hdv, n_heads, n_kv, block_size, window;
    float softcap;
    int sinks;
    int n_seqs;
    int start[MAX_SEQS], len[MAX_SEQS]; /* rows of seq i at positions start .. start + len - 1 */
    int shared, shared_seqs, n_prefixes; /* sequences s < shared_seqs x n_prefixes begin with the `shared` blocks
                                            of sequence (s / shared_seqs) x shared_seqs (0: no sharing) */
} Case;

static ThreadPool *g_tp;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

/* Fills x with bf16-exact random values times amp; bits gets the bf16 copy. */
static void fill_bf16(float *x, uint16_t *bits, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) {
        bits[i] = fp32_to_bf16(frand() * amp);
        x[i] = bf16_to_fp32(bits[i]);
    }
}

/* Every slot of an fp8 cache: random head vectors, each of its own
 * magnitude (2^-8 .. 2^8, so the scales are exercised), quantized by the
 * host's kv_cache_store. */
static void fill_fp8(KVCacheHost *kc) {
    int64_t n_slots = (int64_t)kc->n_blocks * kc->block_size;
    int kw = kc->n_kv_heads * kc->head_dim_k, vw = kc->n_kv_heads * kc->head_dim_v;
    float *k = malloc(kw * sizeof *k), *v = malloc(vw * sizeof *v);
    for (int64_t s = 0; s < n_slots; s++) {
        for (int h = 0; h < kc->n_kv_heads; h++) {
            float mk = ldexpf(1.f, (int)(frand() * 8.f)), mv = ldexpf(1.f, (int)(frand() * 8.f));
            for (int d = 0; d < kc->head_dim_k; d++) k[h * kc->head_dim_k + d] = frand() * mk;
            for (int d = 0; d < kc->head_dim_v; d++) v[h * kc->head_dim_v + d] = frand() * mv;
        }
        kv_cache_store(kc, 0, s, k, v);
    }
    free(k), free(v);
}

typedef struct {
    Case c;
    int T, n_blocks;
    int32_t *pos, *seq;
    int64_t *slot;
    int32_t *tables[MAX_SEQS];
    KVCacheHost cache;
    float *q, *ref, *sinks;
    uint16_t *q16, *k16, *v16;
    AttnBatch batch;
    AttnParams par;
} Problem;

static int min_int(int a, int b) { return a < b ? a : b; }

static int seq_blocks(const Case *c, int s) { return (c->start[s] + c->len[s] + c->block_size - 1) / c->block_size; }

/* Rows in reverse sequence order, so row order and sequence order differ. */
static void build_rows(Problem *P) {
    const Case *c = &P->c;
    for (int s = c->n_seqs - 1, t = 0; s >= 0; s--)
        for (int i = 0; i < c->len[s]; i++, t++) {
            int p = c->start[s] + i;
            P->pos[t] = p, P->seq[t] = s;
            P->slot[t] = (int64_t)P->tables[s][p / c->block_size] * c->block_size + p % c->block_size;
        }
}

static int problem_init(Problem *P, const Case *c) {
    memset(P, 0, sizeof *P);
    P->c = *c;
    int need = 0;
    for (int s = 0; s < c->n_seqs; s++) { /* a sequence after its prefix's first takes the shared blocks from it */
        bool sharer = s < c->shared_seqs * c->n_prefixes && s % c->shared_seqs;
        P->T += c->len[s], need += seq_blocks(c, s) - (sharer ? min_int(c->shared, seq_blocks(c, s)) : 0);
    }
    P->n_blocks = need + 5;
    int *perm = malloc(P->n_blocks * sizeof *perm);
    for (int i = 0; i < P->n_blocks; i++) perm[i] = i;
    for (int i = P->n_blocks - 1; i > 0; i--) {
        int j = (int)((frand() * 0.5f + 0.5f) * (i + 1)) % (i + 1), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int s = 0, at = 0; s < c->n_seqs; s++) {
        P->tables[s] = malloc(seq_blocks(c, s) * sizeof(int32_t));
        int first = s < c->shared_seqs * c->n_prefixes ? s / c->shared_seqs * c->shared_seqs : s; /* of its prefix */
        for (int b = 0; b < seq_blocks(c, s); b++)
            P->tables[s][b] = first < s && b < c->shared && b < seq_blocks(c, first) ? P->tables[first][b] : perm[at++];
    }
    free(perm);
    Err err = {{0}};
    if (kv_cache_host_alloc(&P->cache, 1, c->n_kv, c->hdk, c->hdv, c->block_size, P->n_blocks, g_dtype, &err)) return -1;
    int64_t nk = (int64_t)P->n_blocks * c->block_size * c->n_kv * c->hdk;
    int64_t nv = (int64_t)P->n_blocks * c->block_size * c->n_kv * c->hdv;
    int64_t nq = (int64_t)P->T * c->n_heads * c->hdk;
    P->k16 = malloc(nk * 2), P->v16 = malloc(nv * 2), P->q16 = malloc(nq * 2);
    P->q = malloc(nq * 4), P->ref = malloc((int64_t)P->T * c->n_heads * c->hdv * 4);
    if (g_dtype == KV_DTYPE_FP8) fill_fp8(&P->cache);
    else {
        fill_bf16(P->cache.k[0], P->k16, nk, 1.f);
        fill_bf16(P->cache.v[0], P->v16, nv, 1.f);
    }
    fill_bf16(P->q, P->q16, nq, 3.f); /* peaky enough that a wrong key shows */
    P->pos = malloc(P->T * 4), P->seq = malloc(P->T * 4), P->slot = malloc(P->T * 8);
    build_rows(P);
    if (c->sinks) {
        P->sinks = malloc(c->n_heads * 4);
        for (int h = 0; h < c->n_heads; h++) P->sinks[h] = frand() * 4.f;
    }
    P->batch = (AttnBatch){P->T, P->pos, P->seq, P->slot, c->n_seqs, (const int32_t *const *)P->tables, c->block_size};
    P->par = (AttnParams){c->n_heads, c->n_kv, c->hdk, c->hdv, 1.f / sqrtf((float)c->hdk), c->softcap, c->window, P->sinks};
    cpu_attention(g_tp, P->ref, P->q, &P->cache, 0, &P->batch, &P->par);
    return 0;
}

static void problem_free(Problem *P) {
    kv_cache_host_free(&P->cache);
    for (int s = 0; s < P->c.n_seqs; s++) free(P->tables[s]);
    free(P->k16), free(P->v16), free(P->q16), free(P->q), free(P->ref), free(P->sinks);
    free(P->pos), free(P->seq), free(P->slot);
}

typedef struct {
    void *q, *k, *v, *out;
    float *ks, *vs;              /* fp8: the scales */
    float *sinks;
    int32_t *meta;
    AttnDecodeWork work;
    KVLayerDev kv;
    AttnKVMaps maps;             /* the sm_90a prefill's TMA maps of kv (kv.maps), as the backend builds them */
} DevBufs;

#define CK(call)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            CHECK(0, "%s: %s", #call, cudaGetErrorString(e_));                         \
            return -1;                                                                 \
        }                                                                              \
    } while (0)

/* The cache as the device holds it: bf16, or the host's e4m3 codes and scales. */
static int dev_upload_cache(DevBufs *D, const Problem *P) {
    const Case *c = &P->c;
    size_t slots = (size_t)P->n_blocks * c->block_size, nk = slots * c->n_kv * c->hdk, nv = slots * c->n_kv * c->hdv;
    bool fp8 = P->cache.dtype == KV_DTYPE_FP8;
    size_t e = fp8 ? 1 : 2;
    CK(cudaMalloc(&D->k, nk * e));
    CK(cudaMalloc(&D->v, nv * e));
    CK(cudaMemcpy(D->k, fp8 ? (void *)P->cache.k8[0] : (void *)P->k16, nk * e, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D->v, fp8 ? (void *)P->cache.v8[0] : (void *)P->v16, nv * e, cudaMemcpyHostToDevice));
    if (fp8) {
        CK(cudaMalloc((void **)&D->ks, slots * c->n_kv * 4));
        CK(cudaMalloc((void **)&D->vs, slots * c->n_kv * 4));
        CK(cudaMemcpy(D->ks, P->cache.ks[0], slots * c->n_kv * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(D->vs, P->cache.vs[0], slots * c->n_kv * 4, cudaMemcpyHostToDevice));
    }
    D->kv = (KVLayerDev){P->cache.dtype, D->k, D->v, D->ks, D->vs, NULL, NULL, NULL};
    /* as the backend: TMA maps, unless g_no_maps (then every key by cp.async) */
    Err err = {{0}};
    if (!g_no_maps) {
        if (cuda_attention_kv_maps(&D->maps, &D->kv, (int64_t)slots, c->block_size, &P->par, &err)) {
            CHECK(0, "%s: %s", c->name, err.msg);
            return -1;
        }
        D->kv.maps = D->maps.rows > 0 ? &D->maps : NULL;
    }
    return 0;
}

static int dev_upload(DevBufs *D, const Problem *P, const AttnMeta *m, int n_splits) {
    const Case *c = &P->c;
    size_t nq = (size_t)P->T * c->n_heads * c->hdk, no = (size_t)P->T * c->n_heads * c->hdv;
    memset(D, 0, sizeof *D);
    CK(cudaMalloc(&D->q, nq * 2));
    CK(cudaMalloc(&D->out, no * 2));
    CK(cudaMemcpy(D->q, P->q16, nq * 2, cudaMemcpyHostToDevice));
    if (dev_upload_cache(D, P)) return -1;
    CK(cudaMemset(D->out, 0xff, no * 2)); /* bf16 0xffff is NaN: unwritten rows show */
    if (P->sinks) {
        CK(cudaMalloc((void **)&D->sinks, c->n_heads * 4));
        CK(cudaMemcpy(D->sinks, P->sinks, c->n_heads * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&D->meta, (size_t)(m->buf_len ? m->buf_len : 1) * 4));
    CK(cudaMemcpy(D->meta, m->buf, (size_t)m->buf_len * 4, cudaMemcpyHostToDevice));
    D->work.max_decode = m->n_decode > 0 ? m->n_decode : 1;
    D->work.n_splits = n_splits;
    size_t work = attn_decode_work_bytes(D->work.max_decode, c->n_heads, c->hdv, n_splits);
    CK(cudaMalloc((void **)&D->work.part, work));
    CK(cudaMemset(D->work.part, 0, work)); /* the split counters */
    return 0;
}

static void dev_free(DevBufs *D) {
    cudaFree(D->q), cudaFree(D->k), cudaFree(D->v), cudaFree(D->out), cudaFree(D->sinks), cudaFree(D->meta);
    cudaFree(D->ks), cudaFree(D->vs);
    cudaFree(D->work.part);
}

/* ||got - ref|| / ||ref|| over the whole output; NaN anywhere fails. */
static double compare(const DevBufs *D, const Problem *P, int *n_nan) {
    size_t n = (size_t)P->T * P->c.n_heads * P->c.hdv;
    uint16_t *h = malloc(n * 2);
    cudaMemcpy(h, D->out, n * 2, cudaMemcpyDeviceToHost);
    double d2 = 0, r2 = 0;
    *n_nan = 0;
    for (size_t i = 0; i < n; i++) {
        float g = bf16_to_fp32(h[i]);
        if (isnan(g)) { (*n_nan)++; continue; }
        d2 += (g - P->ref[i]) * (double)(g - P->ref[i]), r2 += P->ref[i] * (double)P->ref[i];
    }
    free(h);
    return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

#endif
