/* bench_attention.c — times cllm's CUDA attention kernels alone (prefill and
 * decode) on the shapes of bench/attention.sh; prints one "RESULT" line per
 * shape (attention.sh joins them with PyTorch's numbers).
 *
 *   prefill: causal, 32 heads (MHA), head size 128, B sequences of L tokens
 *            each, whole prompts; FLOPs counted 4 * L^2 * H * D / 2 per sequence
 *   decode:  8 sequences, 32 query / 8 KV heads, head size 128, context C
 *            (decode mode and rows mode: also 256 x 640 .. 16 x 8192, the
 *            many-rows kernel's shapes); bytes = the K and V of every cached
 *            token read once
 *   variants: the model set's sliding window (4096), soft-cap (50) and
 *            sinks at 1 x 16384 prefill and 8 x 32768 decode (bf16 cache),
 *            "variant=NAME" ending the line; a window's FLOPs and bytes are
 *            those of the pairs and keys inside it
 *   shared:  cascade attention (DESIGN.md "Cascade attention"): N sequences
 *            sharing a P-token prefix (the same block ids) with suffixes of
 *            64..256 tokens, one decode row each, 32q/8kv, head 128: the flat
 *            decode kernel ("flat") against cuda_attention_cascade
 *            ("cascade"); rate = the distinct K/V bytes (prefix once, every
 *            suffix) over time, against the copy bandwidth
 * Each also over an fp8 cache (--kv-dtype fp8: e4m3 codes + a scale per
 * token and KV head; "prefill-fp8", "decode-fp8" lines, bytes = codes +
 * scales). Inputs random, paged cache (block size 32, shuffled blocks;
 * prefill lines say the block size and the sm_90a kernel's TMA box, 0: none);
 * CUDA events, 5 warm-ups, median of 30 timed launches. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "kernels/attn_meta.h"
#include "kernels/cuda/attention.cuh"

#define D 128

static int g_block = 32; /* the cache's block size: 32, or `prefill BLOCK`'s / `rows BLOCK`'s */
static int g_pool_blocks;  /* rows POOL_GIB: decode caches of this many blocks, a row's blocks drawn from all of
                            * them (an engine's pool of tens of GB); 0: just the blocks the rows use */

static uint64_t rng = 88172645463325252ull;

/* n bytes on the device: the first (up to 32 MiB) from h_fill(h, bytes) on
 * the host, the rest copies of them made on the device (doubling), so a
 * cache of gigabytes is ready in milliseconds; a repeat of random data is
 * as good as new data for timing. */
#define FILL_MAX ((size_t)32 << 20)
static void *dev_filled(size_t n, void (*h_fill)(uint8_t *, size_t)) {
    size_t first = n < FILL_MAX ? n : FILL_MAX;
    uint8_t *h = malloc(first), *d = NULL;
    h_fill(h, first);
    bool ok = cudaMalloc((void **)&d, n) == cudaSuccess &&
              cudaMemcpy(d, h, first, cudaMemcpyHostToDevice) == cudaSuccess;
    for (size_t done = first; ok && done < n; done *= 2)
        ok = cudaMemcpy(d + done, d, n - done < done ? n - done : done, cudaMemcpyDeviceToDevice) == cudaSuccess;
    if (!ok) {
        fprintf(stderr, "bench_attention: device allocation of %zu MB failed\n", n >> 20);
        exit(1);
    }
    free(h);
    return d;
}

/* bf16 values in [-1, 1): sign, exponent 119..126, random mantissa */
static void fill_bf16(uint8_t *h, size_t bytes) {
    uint16_t *v = (uint16_t *)h;
    for (size_t i = 0; i < bytes / 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        v[i] = (uint16_t)(((rng >> 20) & 0x8000) | ((119 + (rng >> 40) % 8) << 7) | ((rng >> 50) & 0x7f));
    }
}

/* e4m3 codes of magnitudes 2^-4 .. 2^3 (no nans) */
static void fill_e4m3(uint8_t *h, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        h[i] = (uint8_t)(((rng >> 20) & 0x80) | ((3 + (rng >> 40) % 8) << 3) | ((rng >> 50) & 7));
    }
}

static void *dev_random_bf16(size_t n) { return dev_filled(n * 2, fill_bf16); }
static void *dev_random_fp8(size_t n) { return dev_filled(n, fill_e4m3); }

static float *dev_scales(size_t n) {
    float *h = malloc(n * 4), *d = NULL;
    for (size_t i = 0; i < n; i++) h[i] = 0.015625f * (1.0f + (float)(i % 7) / 8);
    if (cudaMalloc((void **)&d, n * 4) != cudaSuccess || cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "bench_attention: device allocation failed\n");
        exit(1);
    }
    free(h);
    return d;
}

/* A random cache of n_vec head vectors of D values: bf16, or e4m3 + scales. */
static KVLayerDev dev_cache(size_t n_vec, bool fp8) {
    if (!fp8)
        return (KVLayerDev){KV_DTYPE_BF16, dev_random_bf16(n_vec * D), dev_random_bf16(n_vec * D), NULL, NULL, NULL,
                            NULL, NULL};
    return (KVLayerDev){KV_DTYPE_FP8, dev_random_fp8(n_vec * D), dev_random_fp8(n_vec * D), dev_scales(n_vec),
                        dev_scales(n_vec), NULL, NULL, NULL};
}

static void free_cache(KVLayerDev *kv) {
    cudaFree(kv->k), cudaFree(kv->v), cudaFree(kv->k_scale), cudaFree(kv->v_scale);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    void *out, *q;
    KVLayerDev kv;
    AttnDevMeta dm;
    AttnParams par;
    AttnDecodeWork w;
    int decode;
    const AttnCascadeDev *cd;   /* decode through cuda_attention_cascade */
    float *sinks;               /* device [heads] (a variant with sinks), or NULL */
} Job;

/* An attention variant of the model set (the plain causal kernel: name NULL):
 * a sliding window, a logit soft-cap, attention sinks. */
typedef struct {
    const char *name;
    int window;
    float softcap;
    bool sinks;
} Variant;

static const Variant PLAIN = {NULL, 0, 0, false};
static const Variant VARIANTS[3] = {{"window4096", 4096, 0, false}, {"softcap50", 0, 50.0f, false},
                                    {"sinks", 0, 0, true}};

/* j's parameters for variant v over H query heads (sinks: random logits near 1 on the device). */
static void set_variant(Job *j, const Variant *v, int H) {
    j->par.window = v->window, j->par.softcap = v->softcap;
    if (!v->sinks) return;
    float *h = malloc((size_t)H * sizeof *h);
    for (int i = 0; i < H; i++) h[i] = 0.5f + (float)(i % 5) / 4;
    cudaMalloc((void **)&j->sinks, (size_t)H * sizeof(float));
    cudaMemcpy(j->sinks, h, (size_t)H * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
}

/* " variant=NAME", or nothing for the plain kernel */
static void print_variant(const Variant *v) {
    if (v->name) printf(" variant=%s", v->name);
    printf("\n");
}

/* The median of 30 timings (CUDA events around each, after 5 warm-ups) of run(arg) on stream 0; exits with the
 * message run returns (nonzero) or the stream's error. */
static float median_ms(int (*run)(const void *arg, Err *err), const void *arg) {
    Err err = {{0}};
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    float t[30];
    for (int i = 0; i < 35; i++) {
        cudaEventRecord(a, 0);
        int rc = run(arg, &err);
        cudaEventRecord(b, 0);
        if (rc) { fprintf(stderr, "bench_attention: %s\n", err.msg); exit(1); }
        cudaEventSynchronize(b);
        if (i >= 5) cudaEventElapsedTime(&t[i - 5], a, b);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { fprintf(stderr, "bench_attention: %s\n", cudaGetErrorString(e)); exit(1); }
    cudaEventDestroy(a), cudaEventDestroy(b);
    qsort(t, 30, sizeof *t, cmp_f);
    return (t[14] + t[15]) / 2;
}

static int run_job(const void *arg, Err *err) {
    const Job *j = arg;
    return j->cd       ? cuda_attention_cascade(j->out, j->q, &j->kv, &j->dm, &j->par, j->sinks, &j->w, j->cd, 0, err)
           : j->decode ? cuda_attention_decode(j->out, j->q, &j->kv, &j->dm, &j->par, j->sinks, &j->w, 0, err)
                       : cuda_attention_prefill(j->out, j->q, &j->kv, &j->dm, &j->par, j->sinks, 0, err);
}

static float time_ms(const Job *j) { return median_ms(run_job, j); }

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} Copy;

static int run_copy(const void *arg, Err *err) {
    const Copy *c = arg;
    cudaError_t e = cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0);
    return e == cudaSuccess ? 0 : err_set(err, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
}

/* A device-to-device cudaMemcpy moving `bytes` (half read, half written), timed as a kernel is: what the copy
 * limit (bench/limits.py: 4 GiB, read + write bytes) comes to at a decode row's size, where a launch's ramp and
 * tail weigh. */
static float copy_ms(size_t bytes) {
    Copy c = {NULL, NULL, (bytes / 2 + 255) / 256 * 256};
    if (cudaMalloc(&c.dst, c.bytes) != cudaSuccess || cudaMalloc((void **)&c.src, c.bytes) != cudaSuccess) {
        fprintf(stderr, "bench_attention: device allocation of 2 x %zu bytes failed\n", c.bytes);
        exit(1);
    }
    cudaMemset((void *)c.src, 1, c.bytes);
    float ms = median_ms(run_copy, &c);
    cudaFree(c.dst), cudaFree((void *)c.src);
    return ms;
}

/* The metadata of b (a cache of n_blocks blocks) built and uploaded into j->dm. */
static void upload_meta(Job *j, const AttnBatch *b, int n_blocks) {
    AttnMeta m;
    Err err = {{0}};
    if (attn_meta_build(&m, b, &(AttnMetaOpts){n_blocks, 0}, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    int32_t *d_buf;
    cudaMalloc((void **)&d_buf, (size_t)m.buf_len * 4);
    cudaMemcpy(d_buf, m.buf, (size_t)m.buf_len * 4, cudaMemcpyHostToDevice);
    attn_dev_meta(&j->dm, &m, d_buf);
    attn_meta_free(&m);
}

/* Builds n_seqs sequences whose rows are positions [ctx - q_len, ctx) over a
 * shuffled block assignment; uploads the metadata. */
static void build_meta(Job *j, int n_seqs, int ctx, int q_len, int n_pool, int **tables_out) {
    int per = (ctx + g_block - 1) / g_block, n_blocks = n_seqs * per;
    if (n_pool < n_blocks) n_pool = n_blocks;
    int *perm = malloc((size_t)n_pool * sizeof *perm);
    for (int i = 0; i < n_pool; i++) perm[i] = i;
    for (int i = n_pool - 1; i > 0; i--) { /* the first n_blocks of a shuffled pool */
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int r = (int)(rng % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[r], perm[r] = x;
    }
    int T = n_seqs * q_len;
    int32_t *pos = malloc(T * 4), *seq = malloc(T * 4);
    const int32_t **tabs = malloc(n_seqs * sizeof *tabs);
    for (int s = 0; s < n_seqs; s++) {
        tabs[s] = perm + s * per;
        for (int i = 0; i < q_len; i++) pos[s * q_len + i] = ctx - q_len + i, seq[s * q_len + i] = s;
    }
    AttnBatch b = {T, pos, seq, NULL, n_seqs, tabs, g_block};
    upload_meta(j, &b, n_pool);
    free(pos), free(seq), free(tabs);
    *tables_out = perm;
}

/* Query-key pairs a causal prompt of len tokens computes under a window (0: none, counted as len^2 / 2, the
 * usual FLOP count) */
static double prefill_pairs(int len, int window) {
    if (window <= 0) return (double)len * len / 2;
    double pairs = 0;
    for (int i = 0; i < len; i++) pairs += i + 1 < window ? i + 1 : window;
    return pairs;
}

static void bench_prefill(int n_seqs, int len, bool fp8, const Variant *v) {
    Job j = {0};
    int H = 32, T = n_seqs * len, *perm;
    build_meta(&j, n_seqs, len, len, 0, &perm);
    size_t n_vec = (size_t)n_seqs * ((len + g_block - 1) / g_block) * g_block * H;
    j.q = dev_random_bf16((size_t)T * H * D);
    j.kv = dev_cache(n_vec, fp8);
    cudaMalloc(&j.out, (size_t)T * H * D * 2);
    j.par = (AttnParams){H, H, D, D, 0.08838834764f, 0, 0, NULL};
    set_variant(&j, v, H);
    /* the sm_90a kernel's TMA maps, as the backend builds them */
    AttnKVMaps maps = {0};
    Err err = {{0}};
    if (cuda_attention_kv_maps(&maps, &j.kv, (int64_t)(n_vec / H), g_block, &j.par, &err)) {
        fprintf(stderr, "bench_attention: %s\n", err.msg);
        exit(1);
    }
    j.kv.maps = maps.rows > 0 ? &maps : NULL;
    float ms = time_ms(&j);
    double flops = 4.0 * prefill_pairs(len, v->window) * H * D * n_seqs;
    printf("RESULT prefill%s %dx%d %.4f %.1f block=%d tma=%d", fp8 ? "-fp8" : "", n_seqs, len, ms, flops / ms / 1e9,
           g_block, maps.rows);
    print_variant(v);
    cudaFree(j.q), free_cache(&j.kv), cudaFree(j.out), cudaFree((void *)j.dm.buf), cudaFree(j.sinks);
    free(perm);
}

/* The decode kernel's resident blocks (the engine's split rule), or 264 if asking fails. */
static int decode_resident(bool fp8) {
    Err err = {{0}};
    int r = cuda_attention_decode_resident(D, D, fp8, &err);
    if (r < 0) fprintf(stderr, "bench_attention: %s\n", err.msg);
    return r > 0 ? r : 264;
}

/* The many-rows kernel's resident warps (the engine's AttnDecodeWork.rows_warps); exits on an error. */
static int rows_resident(bool fp8) {
    Err err = {{0}};
    int r = cuda_attention_decode_rows_resident(D, D, fp8, &err);
    if (r < 0) { fprintf(stderr, "bench_attention: %s\n", err.msg); exit(1); }
    return r;
}

/* Which decode kernel a bench_decode line asks for. */
typedef enum {
    DECODE_ENGINE, /* the engine's choice: the many-rows kernel where cuda_attention_decode_rows_takes says so */
    DECODE_SPLIT,  /* the split kernel (attention_decode.cu) */
    DECODE_ROWS,   /* the many-rows kernel (attention_decode_rows.cu) at one split, whatever the item count */
} DecodeKernel;

/* splits: the grid's KV splits, or 0 for the engine's choice (attn_decode_splits) */
static void bench_decode(int n_seqs, int ctx, bool fp8, int splits, DecodeKernel kernel, const Variant *v) {
    Job j = {0};
    int H = 32, KVH = 8, *perm;
    int n_blocks = n_seqs * ((ctx + g_block - 1) / g_block);
    if (g_pool_blocks > n_blocks) n_blocks = g_pool_blocks;
    build_meta(&j, n_seqs, ctx, 1, n_blocks, &perm);
    size_t n_vec = (size_t)n_blocks * g_block * KVH;
    j.q = dev_random_bf16((size_t)n_seqs * H * D);
    j.kv = dev_cache(n_vec, fp8);
    cudaMalloc(&j.out, (size_t)n_seqs * H * D * 2);
    j.par = (AttnParams){H, KVH, D, D, 0.08838834764f, 0, 0, NULL};
    set_variant(&j, v, H);
    j.decode = 1;
    j.w.max_decode = n_seqs;
    j.w.n_splits = splits > 0 ? splits : attn_decode_splits(ctx, n_seqs, KVH, 1, decode_resident(fp8));
    int resident = rows_resident(fp8), items = n_seqs * KVH;
    if (kernel == DECODE_ENGINE) j.w.rows_warps = resident;
    if (kernel == DECODE_ROWS) j.w.n_splits = 1, j.w.rows_warps = resident < 2 * items ? resident : 2 * items;
    size_t work = attn_decode_work_bytes(n_seqs, H, D, j.w.n_splits);
    cudaMalloc((void **)&j.w.part, work);
    cudaMemset(j.w.part, 0, work); /* the split counters */
    float ms = time_ms(&j);
    int keys = v->window > 0 && v->window < ctx ? v->window : ctx; /* a windowed row reads its window */
    double bytes = (double)n_seqs * keys * KVH * (fp8 ? 2 * D + 8 : 2 * D * 2);
    bool rows = cuda_attention_decode_rows_takes(&j.w, &j.par, n_seqs);
    printf("RESULT decode%s %dx%d %.4f %.3f splits=%d kernel=%s", fp8 ? "-fp8" : "", n_seqs, ctx, ms, bytes / ms / 1e9,
           j.w.n_splits, rows ? "rows" : "split");
    if (rows) printf(" warps=%lld", (long long)attn_rows_grid_warps(items, j.w.rows_warps));
    if (kernel == DECODE_ENGINE && !v->name) printf(" copy=%.4f", copy_ms((size_t)bytes));
    print_variant(v);
    cudaFree(j.q), free_cache(&j.kv), cudaFree(j.out), cudaFree((void *)j.dm.buf), cudaFree(j.w.part);
    cudaFree(j.sinks);
    free(perm);
}

/* n_seqs decode rows whose tables begin with the same prefix / g_block blocks,
 * suffixes of 64..256 tokens: flat, then cascade (the plan by the backend's
 * rule and packing, backend_cuda_cascade.cu). */
static void bench_shared(int n_seqs, int prefix, int n_sms, bool fp8) {
    Job j = {0};
    int H = 32, KVH = 8, pb = prefix / g_block, n_blocks = pb, max_ctx = 0;
    int32_t *pos = malloc(n_seqs * 4), *seq = malloc(n_seqs * 4), *row_of = malloc(n_seqs * 4);
    int32_t **tabs = malloc(n_seqs * sizeof *tabs);
    double distinct = (double)pb * g_block;
    for (int s = 0; s < n_seqs; s++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int suffix = 64 + (int)(rng % 193), ctx = pb * g_block + suffix, nb = (ctx + g_block - 1) / g_block;
        pos[s] = ctx - 1, seq[s] = s, row_of[s] = s, distinct += suffix;
        tabs[s] = malloc(nb * sizeof(int32_t));
        for (int b = 0; b < nb; b++) tabs[s][b] = b < pb ? b : n_blocks++;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
    }
    AttnBatch b = {n_seqs, pos, seq, NULL, n_seqs, (const int32_t *const *)tabs, g_block};
    Err err = {{0}};
    upload_meta(&j, &b, n_blocks);
    j.q = dev_random_bf16((size_t)n_seqs * H * D);
    j.kv = dev_cache((size_t)n_blocks * g_block * KVH, fp8);
    cudaMalloc(&j.out, (size_t)n_seqs * H * D * 2);
    j.par = (AttnParams){H, KVH, D, D, 0.08838834764f, 0, 0, NULL};
    j.decode = 1;
    j.w.max_decode = n_seqs;
    j.w.n_splits = attn_decode_splits(max_ctx, n_seqs, KVH, 1, decode_resident(fp8));
    j.w.split_tiles = ATTN_SPLIT_TILES;
    j.w.rows_warps = rows_resident(fp8); /* as the engine: the many-rows kernel */
    size_t work = attn_decode_work_bytes(n_seqs, H, D, j.w.n_splits);
    cudaMalloc((void **)&j.w.part, work);
    cudaMemset(j.w.part, 0, work);
    const double per_token = KVH * (fp8 ? 2 * D + 8 : 2 * D * 2);
    float flat = time_ms(&j);
    AttnCascadePlan pl;
    AttnCascadeOpts o = {false, n_sms, ATTN_TILE_M, ATTN_DECODE_TILE_N};
    if (attn_cascade_plan(&pl, &b, &j.par, &o, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    AttnCascadePackOpts po = {H / KVH, KVH, ATTN_TILE_M, ATTN_DECODE_TILE_N, 2 * n_sms, ATTN_CASCADE_MAX_SPLITS};
    int64_t cap = attn_cascade_pack_len(n_seqs, &po);
    int32_t *h_casc = malloc(cap * 4);
    AttnCascadeDev cd = {0};
    if (attn_cascade_pack(h_casc, cap, &cd.m, &pl, &b, row_of, n_seqs, &po, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    cd.cap_slots = (int64_t)n_seqs * H * (cd.m.n_splits ? cd.m.n_splits : 1);
    cudaMalloc((void **)&cd.buf, (size_t)(cd.m.len ? cd.m.len : 1) * 4);
    cudaMemcpy((void *)cd.buf, h_casc, (size_t)cd.m.len * 4, cudaMemcpyHostToDevice);
    cudaMalloc((void **)&cd.part, attn_cascade_work_bytes(cd.cap_slots, D));
    j.cd = &cd;
    float casc = time_ms(&j);
    printf("RESULT shared%s %dx%d+64..256 %.4f %.3f flat\n", fp8 ? "-fp8" : "", n_seqs, pb * g_block, flat,
           distinct * per_token / flat / 1e9);
    printf("RESULT shared%s %dx%d+64..256 %.4f %.3f cascade groups=%d units=%d splits=%d\n", fp8 ? "-fp8" : "", n_seqs,
           pb * g_block, casc, distinct * per_token / casc / 1e9, pl.n_groups, cd.m.n_units, cd.m.n_splits);
    cudaFree(j.q), free_cache(&j.kv), cudaFree(j.out), cudaFree((void *)j.dm.buf), cudaFree(j.w.part);
    cudaFree((void *)cd.buf), cudaFree(cd.part);
    for (int s = 0; s < n_seqs; s++) free(tabs[s]);
    free(tabs), free(pos), free(seq), free(row_of), free(h_casc);
    attn_cascade_free(&pl);
}

/* g_block a power of two >= 8, or false with a message */
static bool block_size_ok(void) {
    if (g_block >= 8 && !(g_block & (g_block - 1))) return true;
    fprintf(stderr, "bench_attention: block size %d (a power of two, at least 8)\n", g_block);
    return false;
}

/* The model set's variants (bf16 cache) at 1 x 16384 prefill and 8 x 32768 decode, beside the plain rows of
 * those shapes: what each costs over the plain causal kernel. */
static void bench_variants(void) {
    for (int i = 0; i < 3; i++) {
        bench_prefill(1, 16384, false, &VARIANTS[i]);
        bench_decode(8, 32768, false, 0, DECODE_ENGINE, &VARIANTS[i]);
    }
}

/* bench_attention                 every shape (attention.sh)
 * bench_attention decode [S...]   decode shapes only, at the engine's splits,
 *                                 then at each S splits (the split rule's study)
 * bench_attention shared          the shared-prefix (cascade) rows only
 * bench_attention variants        the window, soft-cap and sink rows only (bf16; also in the full run)
 * bench_attention rows [BLOCK [POOL_GIB]]
 *                                 the many-rows shapes (256 x 640 .. 16 x 8192, the batch job's and below):
 *                                 the engine's choice, the split kernel at one split, then the many-rows
 *                                 kernel, each forced (the rows rule's study); over blocks of BLOCK tokens
 *                                 (default 32; the engine's: 16) drawn from a pool of POOL_GIB GiB of K and V
 *                                 (default: the blocks used; the engine's pool is tens of GB: the kernel
 *                                 faster alone than in the model may be the pool's span)
 * bench_attention prefill [BLOCK] the prefill rows only, bf16 then fp8, over
 *                                 blocks of BLOCK (default 32; the engine's: 16) */
int main(int argc, char **argv) {
    const int dec[7][2] = {{8, 4096}, {8, 32768}, {1, 131072}, {1, 4096}, {1, 32768}, {256, 640}, {64, 2048}};
    const int many[9][2] = {{256, 640}, {256, 1280}, {128, 1024}, {128, 2048}, {64, 2048},
                            {64, 4096}, {32, 4096}, {32, 8192}, {16, 8192}};
    const bool decode_only = argc > 1 && !strcmp(argv[1], "decode"), shared_only = argc > 1 && !strcmp(argv[1], "shared");
    if (argc > 1 && !strcmp(argv[1], "variants")) {
        bench_variants();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "rows")) {
        if (argc > 2) g_block = atoi(argv[2]);
        if (!block_size_ok()) return 1;
        if (argc > 3) g_pool_blocks = (int)(atof(argv[3]) * (1 << 30) / (2.0 * g_block * 8 * D * 2)); /* bf16 K + V */
        printf("# rows: blocks of %d tokens, a pool of %d blocks (0: the blocks used)\n", g_block, g_pool_blocks);
        for (int f = 0; f < 2; f++)
            for (int i = 0; i < 9; i++) {
                bench_decode(many[i][0], many[i][1], f, 0, DECODE_ENGINE, &PLAIN);
                bench_decode(many[i][0], many[i][1], f, 1, DECODE_SPLIT, &PLAIN);
                bench_decode(many[i][0], many[i][1], f, 1, DECODE_ROWS, &PLAIN);
            }
        return 0;
    }
    const bool prefill_only = argc > 1 && !strcmp(argv[1], "prefill");
    if (prefill_only && argc > 2) g_block = atoi(argv[2]);
    if (!block_size_ok()) return 1;
    int n_sms = 0;
    cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0);
    printf("# prefill kernel: bf16 %s, fp8 %s\n", cuda_attention_prefill_kernel(D, D, false),
           cuda_attention_prefill_kernel(D, D, true));
    for (int f = 0; f < 2; f++) {
        if (!decode_only && !shared_only) {
            bench_prefill(16, 1024, f, &PLAIN);
            bench_prefill(4, 4096, f, &PLAIN);
            bench_prefill(1, 16384, f, &PLAIN);
        }
        if (prefill_only) continue;
        for (int i = 0; !shared_only && i < (decode_only ? 7 : 3); i++)
            for (int r = 0; r < (decode_only ? argc - 1 : 1); r++)
                bench_decode(dec[i][0], dec[i][1], f, r ? atoi(argv[1 + r]) : 0, DECODE_ENGINE, &PLAIN);
        if (!decode_only) {
            bench_shared(64, 2000, n_sms, f);
            bench_shared(256, 2000, n_sms, f);
        }
    }
    if (!decode_only && !shared_only && !prefill_only) bench_variants();
    return 0;
}
