/* bench_attention.c — times cllm's CUDA attention kernels alone (prefill and
 * decode) on the shapes of bench/attention.sh; prints one "RESULT" line per
 * shape (attention.sh joins them with PyTorch's numbers).
 *
 *   prefill: causal, 32 heads (MHA), head size 128, B sequences of L tokens
 *            each, whole prompts; FLOPs counted 4 * L^2 * H * D / 2 per sequence
 *   decode:  8 sequences, 32 query / 8 KV heads, head size 128, context C;
 *            bytes = the K and V of every cached token read once
 * Each also over an fp8 cache (--kv-dtype fp8: e4m3 codes + a scale per
 * token and KV head; "prefill-fp8", "decode-fp8" lines, bytes = codes +
 * scales). Inputs random, paged cache (block size 32, shuffled blocks);
 * CUDA events, 5 warm-ups, median of 30 timed launches. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "kernels/attn_meta.h"
#include "kernels/cuda/attention.cuh"

#define BS 32
#define D 128

static uint64_t rng = 88172645463325252ull;

static void *dev_random_bf16(size_t n) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        /* bf16 of a value in [-1, 1): sign, exponent 119..126, random mantissa */
        h[i] = (uint16_t)(((rng >> 20) & 0x8000) | ((119 + (rng >> 40) % 8) << 7) | ((rng >> 50) & 0x7f));
    }
    void *d = NULL;
    if (cudaMalloc(&d, n * 2) != cudaSuccess || cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "bench_attention: device allocation of %zu MB failed\n", n * 2 >> 20);
        exit(1);
    }
    free(h);
    return d;
}

/* Random e4m3 codes of magnitudes 2^-4 .. 2^3 (no nans), and scales near 1/64. */
static void *dev_random_fp8(size_t n) {
    uint8_t *h = malloc(n);
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        h[i] = (uint8_t)(((rng >> 20) & 0x80) | ((3 + (rng >> 40) % 8) << 3) | ((rng >> 50) & 7));
    }
    void *d = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess || cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "bench_attention: device allocation of %zu MB failed\n", n >> 20);
        exit(1);
    }
    free(h);
    return d;
}

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
    if (!fp8) return (KVLayerDev){KV_DTYPE_BF16, dev_random_bf16(n_vec * D), dev_random_bf16(n_vec * D), NULL, NULL};
    return (KVLayerDev){KV_DTYPE_FP8, dev_random_fp8(n_vec * D), dev_random_fp8(n_vec * D), dev_scales(n_vec),
                        dev_scales(n_vec)};
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
} Job;

static float time_ms(const Job *j) {
    Err err = {{0}};
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    float t[30];
    for (int i = 0; i < 35; i++) {
        cudaEventRecord(a, 0);
        int rc = j->decode ? cuda_attention_decode(j->out, j->q, &j->kv, &j->dm, &j->par, NULL, &j->w, 0, &err)
                           : cuda_attention_prefill(j->out, j->q, &j->kv, &j->dm, &j->par, NULL, 0, &err);
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

/* Builds n_seqs sequences whose rows are positions [ctx - q_len, ctx) over a
 * shuffled block assignment; uploads the metadata. */
static void build_meta(Job *j, int n_seqs, int ctx, int q_len, int **tables_out) {
    int per = (ctx + BS - 1) / BS, n_blocks = n_seqs * per;
    int *perm = malloc(n_blocks * sizeof *perm);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
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
    AttnBatch b = {T, pos, seq, NULL, n_seqs, tabs, BS};
    AttnMeta m;
    Err err = {{0}};
    if (attn_meta_build(&m, &b, &(AttnMetaOpts){n_blocks, 0}, &err)) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    int32_t *d_buf;
    cudaMalloc((void **)&d_buf, (size_t)m.buf_len * 4);
    cudaMemcpy(d_buf, m.buf, (size_t)m.buf_len * 4, cudaMemcpyHostToDevice);
    attn_dev_meta(&j->dm, &m, d_buf);
    attn_meta_free(&m);
    free(pos), free(seq), free(tabs);
    *tables_out = perm;
}

static void bench_prefill(int n_seqs, int len, bool fp8) {
    Job j = {0};
    int H = 32, T = n_seqs * len, *perm;
    build_meta(&j, n_seqs, len, len, &perm);
    size_t n_vec = (size_t)n_seqs * ((len + BS - 1) / BS) * BS * H;
    j.q = dev_random_bf16((size_t)T * H * D);
    j.kv = dev_cache(n_vec, fp8);
    cudaMalloc(&j.out, (size_t)T * H * D * 2);
    j.par = (AttnParams){H, H, D, D, 0.08838834764f, 0, 0, NULL};
    float ms = time_ms(&j);
    double flops = 4.0 * len * (double)len * H * D / 2 * n_seqs;
    printf("RESULT prefill%s %dx%d %.4f %.1f\n", fp8 ? "-fp8" : "", n_seqs, len, ms, flops / ms / 1e9);
    cudaFree(j.q), free_cache(&j.kv), cudaFree(j.out), cudaFree((void *)j.dm.buf);
    free(perm);
}

/* splits: the grid's KV splits, or 0 for the engine's choice (attn_decode_splits) */
static void bench_decode(int n_seqs, int ctx, int n_sms, bool fp8, int splits) {
    Job j = {0};
    int H = 32, KVH = 8, *perm;
    build_meta(&j, n_seqs, ctx, 1, &perm);
    size_t n_vec = (size_t)n_seqs * ((ctx + BS - 1) / BS) * BS * KVH;
    j.q = dev_random_bf16((size_t)n_seqs * H * D);
    j.kv = dev_cache(n_vec, fp8);
    cudaMalloc(&j.out, (size_t)n_seqs * H * D * 2);
    j.par = (AttnParams){H, KVH, D, D, 0.08838834764f, 0, 0, NULL};
    j.decode = 1;
    j.w.max_decode = n_seqs;
    j.w.n_splits = splits > 0 ? splits : attn_decode_splits(ctx, n_seqs, KVH, 1, n_sms);
    size_t work = attn_decode_work_bytes(n_seqs, H, D, j.w.n_splits);
    cudaMalloc((void **)&j.w.part, work);
    cudaMemset(j.w.part, 0, work); /* the split counters */
    float ms = time_ms(&j);
    double bytes = (double)n_seqs * ctx * KVH * (fp8 ? 2 * D + 8 : 2 * D * 2);
    printf("RESULT decode%s %dx%d %.4f %.3f splits=%d\n", fp8 ? "-fp8" : "", n_seqs, ctx, ms, bytes / ms / 1e9,
           j.w.n_splits);
    cudaFree(j.q), free_cache(&j.kv), cudaFree(j.out), cudaFree((void *)j.dm.buf), cudaFree(j.w.part);
    free(perm);
}

/* bench_attention                 every shape (attention.sh)
 * bench_attention decode [S...]   decode shapes only, at the engine's splits,
 *                                 then at each S splits (the split rule's study) */
int main(int argc, char **argv) {
    const int dec[5][2] = {{8, 4096}, {8, 32768}, {1, 131072}, {1, 4096}, {1, 32768}};
    const bool decode_only = argc > 1 && !strcmp(argv[1], "decode");
    int n_sms = 0;
    cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0);
    printf("# prefill kernel: bf16 %s, fp8 %s\n", cuda_attention_prefill_kernel(D, D, false),
           cuda_attention_prefill_kernel(D, D, true));
    for (int f = 0; f < 2; f++) {
        if (!decode_only) {
            bench_prefill(16, 1024, f);
            bench_prefill(4, 4096, f);
            bench_prefill(1, 16384, f);
        }
        for (int i = 0; i < (decode_only ? 5 : 3); i++)
            for (int r = 0; r < (decode_only ? argc - 1 : 1); r++)
                bench_decode(dec[i][0], dec[i][1], n_sms, f, r ? atoi(argv[1 + r]) : 0);
    }
    return 0;
}
