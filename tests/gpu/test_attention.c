/* test_attention.c — the CUDA attention kernels (kernels/cuda/attention.cuh)
 * against cpu_attention on the same inputs (run on a GPU machine by
 * tests/gpu/run.sh; never in CI).
 *
 * Each case builds a paged cache with a shuffled, non-contiguous block
 * assignment, fills the whole cache and the queries with random values
 * rounded to bf16 (so both sides see the same numbers), poisons the GPU
 * output with NaN, runs one cuda_attention call for the whole (often mixed
 * prefill + decode) batch and compares with the fp32 CPU op:
 * ||gpu - cpu|| / ||cpu|| <= 1e-2, and no row left unwritten; the cache's
 * slots past every sequence's end are NaN (a key loaded past its run's end
 * shows). Every case
 * runs twice: over a bf16 cache, and over an fp8 one (--kv-dtype fp8: the
 * host's cache of e4m3 codes and per-(token, head) scales uploaded as it is,
 * head vectors of magnitudes 2^-8 .. 2^8 so the scales matter, and the CPU
 * op reading the same bytes). Also: the device's fp8 quantizer (the KV
 * write's) gives the host's bytes for every bf16 value, ties, saturation
 * and nans, with dynamic scales and with fixed ones (--kv-scales).
 * Cases: every head-size pair, GQA 1/4/8, MQA (group 8 and 32), block sizes
 * 8 to 256, chunked prefill, the sm_90a prefill's TMA loads of whole cache
 * blocks (every tile, and beside cp.async for partial blocks; "TMA box" in
 * the output: keys a box, 0 where it does not run), windows of 1, the
 * prompt length and more, sinks, soft-cap, long decode rows over many
 * splits, a decode step replayed from a CUDA graph after its metadata
 * changed (at the engine's splits, at one split, and on the many-rows
 * kernel), and an unsupported head size. The cases whose prefill runs the
 * sm_90a kernel over a bf16 cache run again without TMA maps
 * (test_cases_no_maps: its cp.async producer, the fp8 caches' path).
 * The decode kernel's rope mode (cuda_attention_decode_rope: qk-norm, rope
 * and the new rows' cache write in the kernel) against the host's rope,
 * cache write and attention, every head-size pair, both caches: the output,
 * the new keys in the cache, and no other slot touched. The many-rows
 * decode kernel's own cases: test_attention_rows.c.
 * Decode launches of one split run attention_decode_short.cu's kernel:
 * every case's decode rows also run as one split (the short kernel, many
 * tiles a row included) against the CPU op, and against the general
 * kernel on the same launch (AttnDecodeWork.no_short) bit for bit, output
 * and (rope mode) the cache; short rows at the tile edges and at the ring's
 * depth (the new key's tile among the up-front loads or not), both modes.
 *   test_attention [--quick]   (--quick: a few cases, for compute-sanitizer)
 *   test_attention --case N    (k_cases[N] alone, bf16 with and without TMA maps, then fp8: racecheck's
 *                               runs, ~100x slower)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "base/dtype.h"
#include "engine/kv_blocks.h"
#include "kernels/attn_meta.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/attention.cuh"
#include "tests/gpu/attn_problem.h"
#include "tests/gpu/attn_tanh.h"
#include "tests/gpu/fp8_rows.h"
#include "tests/test.h"

#define TOL 1e-2

/* Every slot no sequence's positions reach (the tails of last blocks, the
 * spare blocks) becomes NaN in both the device copies' sources (bf16 0x7fc0;
 * fp8 code 0x7f and a NaN scale): a kernel that lets one into P V (a
 * whole-block load past a sequence's end) shows NaN. The reference read
 * none of them. */
static void poison_unused_slots(Problem *P) {
    const Case *c = &P->c;
    int64_t slots = (int64_t)P->n_blocks * c->block_size;
    bool *used = calloc(slots, 1);
    for (int s = 0; s < c->n_seqs; s++)
        for (int p = 0; p < c->start[s] + c->len[s]; p++)
            used[(int64_t)P->tables[s][p / c->block_size] * c->block_size + p % c->block_size] = true;
    bool fp8 = P->cache.dtype == KV_DTYPE_FP8;
    int kw = c->n_kv * c->hdk, vw = c->n_kv * c->hdv;
    for (int64_t t = 0; t < slots; t++) {
        if (used[t]) continue;
        for (int i = 0; i < kw; i++) {
            if (fp8) P->cache.k8[0][t * kw + i] = 0x7f;
            else P->k16[t * kw + i] = 0x7fc0;
        }
        for (int i = 0; i < vw; i++) {
            if (fp8) P->cache.v8[0][t * vw + i] = 0x7f;
            else P->v16[t * vw + i] = 0x7fc0;
        }
        if (fp8)
            for (int h = 0; h < c->n_kv; h++) P->cache.ks[0][t * c->n_kv + h] = P->cache.vs[0][t * c->n_kv + h] = NAN;
    }
    free(used);
}
static int g_quick, g_case = -1; /* --quick, --case N */
/* The device output's bits (n bf16 values), or NULL. */
static uint16_t *out_bits(const DevBufs *D, size_t n) {
    uint16_t *h = malloc(n * 2);
    if (h && cudaMemcpy(h, D->out, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess) free(h), h = NULL;
    return h;
}

/* The decode rows as one split: the short kernel against the CPU op, then
 * the general kernel on the same launch, bit for bit (the batch-invariant
 * mode runs a row in grids of one split and of several). */
static void one_split_paths(DevBufs *D, const Problem *P, const AttnDevMeta *dm) {
    const Case *c = &P->c;
    size_t n = (size_t)P->T * c->n_heads * c->hdv;
    Err err = {{0}};
    int saved = D->work.n_splits;
    uint16_t *bits[2] = {NULL, NULL};
    D->work.n_splits = 1;
    for (int path = 0; path < 2; path++) { /* 0: the short kernel, 1: the general one */
        D->work.no_short = path == 1;
        cudaMemset(D->out, 0xff, n * 2);
        int rc = cuda_attention(D->out, D->q, &D->kv, dm, &P->par, D->sinks, &D->work, 0, &err);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(rc == 0 && e == cudaSuccess, "%s one split: %s %s", c->name, err.msg, cudaGetErrorString(e));
        int n_nan;
        double rel = compare(D, P, &n_nan);
        CHECK(n_nan == 0 && rel <= TOL, "%s one split (%s kernel): rel err %.3e, %d NaN outputs", c->name,
              path ? "general" : "short", rel, n_nan);
        bits[path] = out_bits(D, n);
    }
    size_t diff = 0;
    for (size_t i = 0; bits[0] && bits[1] && i < n; i++) diff += bits[0][i] != bits[1][i];
    printf("# %-34s %-4s one split: short vs general kernel, %zu of %zu values differ\n", c->name,
           kv_dtype_name(g_dtype), diff, n);
    CHECK(bits[0] && bits[1] && diff == 0, "%s: short and general decode kernels differ in %zu values", c->name, diff);
    free(bits[0]), free(bits[1]);
    D->work.n_splits = saved, D->work.no_short = false;
}

static void run_case(const Case *c) {
    Problem P;
    Err err = {{0}};
    if (problem_init(&P, c)) { CHECK(0, "%s: host setup failed", c->name); return; }
    AttnMeta m;
    CHECK(attn_meta_build(&m, &P.batch, &(AttnMetaOpts){P.n_blocks, 0}, &err) == 0, "%s: %s", c->name, err.msg);
    int splits = attn_decode_splits(m.max_kv_len, m.n_decode, c->n_kv, (c->n_heads / c->n_kv + 15) / 16, 2 * 132);
    DevBufs D;
    poison_unused_slots(&P);
    if (dev_upload(&D, &P, &m, splits) == 0) {
        AttnDevMeta dm;
        attn_dev_meta(&dm, &m, D.meta);
        int rc = cuda_attention(D.out, D.q, &D.kv, &dm, &P.par, D.sinks, &D.work, 0, &err);
        CHECK(rc == 0, "%s: %s", c->name, err.msg);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "%s: %s", c->name, cudaGetErrorString(e));
        int n_nan;
        double rel = compare(&D, &P, &n_nan);
        printf("# %-34s %-4s T=%-5d prefill tiles %-3d decode %-2d splits %-3d TMA box %-3d rel err %.2e\n", c->name,
               kv_dtype_name(g_dtype), P.T, m.n_tiles, m.n_decode, splits, D.maps.rows, rel);
        CHECK(n_nan == 0 && rel <= TOL, "%s: rel err %.3e, %d NaN outputs", c->name, rel, n_nan);
        /* where the sm_90a kernel runs a bf16 cache, it has TMA maps (none in the g_no_maps pass) */
        bool want_tma = g_dtype == KV_DTYPE_BF16 && !g_no_maps &&
                        !strcmp(cuda_attention_prefill_kernel(c->hdk, c->hdv, false), "sm90a");
        CHECK(!want_tma || D.maps.rows >= 8, "%s: no TMA maps for the sm_90a prefill", c->name);
        CHECK(!g_no_maps || D.maps.rows == 0, "%s: TMA maps built in the no-maps pass", c->name);
        /* the decode kernels never read the maps: their paths once, in the pass with them */
        if (m.n_decode > 0 && !g_no_maps) one_split_paths(&D, &P, &dm);
    }
    dev_free(&D);
    attn_meta_free(&m);
    problem_free(&P);
}

#define MIX(...) .n_seqs = 4, .start = {0, 50, 300, 0}, .len = {77, 37, 1, 1}, __VA_ARGS__

static const Case k_cases[] = {
    {"hd128 gqa4 prefill 100", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 1, .start = {0}, .len = {100}},
    {"hd128 gqa4 mixed bs32", 128, 128, 8, 2, 32, 0, 0, 0, MIX()},
    {"hd64 mixed", 64, 64, 4, 4, 16, 0, 0, 0, MIX()},
    {"hd80 mixed", 80, 80, 4, 2, 32, 0, 0, 0, MIX()},
    {"hd96 mixed", 96, 96, 8, 1, 64, 0, 0, 0, MIX()},
    {"hd256 mixed", 256, 256, 4, 1, 32, 0, 0, 0, MIX()},
    {"hd128/64 mixed", 128, 64, 8, 2, 16, 0, 0, 0, MIX()},
    {"gqa1 bs64", 128, 128, 4, 4, 64, 0, 0, 0, MIX()},
    {"gqa8", 128, 128, 16, 2, 32, 0, 0, 0, MIX()},
    {"mqa 8 heads", 128, 128, 8, 1, 32, 0, 0, 0, MIX()},
    {"mqa 32 heads (2 head groups)", 64, 64, 32, 1, 16, 0, 0, 0, MIX()},
    {"window 1", 128, 128, 4, 2, 16, 1, 0, 0, MIX()},
    {"window = prompt 77", 128, 128, 4, 2, 16, 77, 0, 0, MIX()},
    {"window 40", 128, 128, 4, 2, 32, 40, 0, 0, MIX()},
    {"window 5000 (> context)", 96, 96, 4, 2, 32, 5000, 0, 0, MIX()},
    {"sinks", 64, 64, 8, 2, 32, 0, 0, 1, MIX()},
    {"softcap 30", 128, 128, 4, 2, 32, 0, 30.f, 0, MIX()},
    {"softcap+window+sinks hd256", 256, 256, 8, 4, 16, 33, 50.f, 1, MIX()},
    {"sinks+window hd64 gqa8", 64, 64, 8, 1, 16, 128, 0, 1, MIX()},
    {"chunked prefill 3 chunks", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 3, .start = {130, 1, 64}, .len = {129, 64, 2}},
    {"long decode 8 x 5000", 128, 128, 8, 2, 32, 0, 0, 0, .n_seqs = 8,
     .start = {4999, 3000, 4095, 17, 1, 2047, 4500, 63}, .len = {1, 1, 1, 1, 1, 1, 1, 1}},
    {"long decode window 256", 128, 64, 8, 2, 64, 256, 0, 1, .n_seqs = 3, .start = {4999, 255, 3000}, .len = {1, 1, 1}},
    {"long prefill 700 + window 200", 80, 80, 4, 2, 32, 200, 0, 0, .n_seqs = 2, .start = {0, 100}, .len = {700, 300}},
    /* the sm_90a kernel's cases (128-key tiles, 64 at head size 256): runs over many tiles, chunks starting
     * mid-tile, windows ending mid-tile, every K/V head size pair it has */
    {"hd192/128 mixed", 192, 128, 8, 2, 16, 0, 0, 0, MIX()},
    {"long prefill 1000 + chunk 333 at 517", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 2, .start = {0, 517},
     .len = {1000, 333}},
    {"prefill 600 window 129 softcap sinks", 128, 128, 8, 1, 16, 129, 20.f, 1, .n_seqs = 2, .start = {0, 300},
     .len = {600, 257}},
    {"prefill hd256 500 window 100 bs8", 256, 256, 4, 2, 8, 100, 0, 0, .n_seqs = 2, .start = {0, 77}, .len = {500, 129}},
    {"prefill hd64 mqa 16 heads 700", 64, 64, 16, 1, 32, 0, 0, 1, .n_seqs = 2, .start = {0, 1}, .len = {700, 255}},
    {"prefill hd192/128 400 + window 64", 192, 128, 4, 4, 16, 64, 0, 0, .n_seqs = 2, .start = {0, 200},
     .len = {400, 129}},
    /* the sm_90a kernel's TMA loads (bf16 cache): every tile of whole blocks at the engine's block size; pieces
     * of blocks larger than a key tile (256 at 128 keys, 128 at 64); boxes of 8 keys; differing K/V head sizes
     * with a window and a chunk starting mid-block (the partial blocks by cp.async beside the TMA ones) */
    {"prefill bs16 640 + 512 softcap sinks (all TMA)", 128, 128, 8, 2, 16, 0, 30.f, 1, .n_seqs = 2,
     .start = {0, 0}, .len = {640, 512}},
    {"prefill bs256 1000 + chunk 300 at 700", 128, 128, 8, 2, 256, 0, 0, 0, .n_seqs = 2, .start = {0, 700},
     .len = {1000, 300}},
    {"prefill hd256 bs128 600 + 200 at 333 window 300", 256, 256, 4, 2, 128, 300, 0, 0, .n_seqs = 2,
     .start = {0, 333}, .len = {600, 200}},
    {"prefill hd64 bs8 gqa8 520 + 130 at 3", 64, 64, 16, 2, 8, 0, 0, 0, .n_seqs = 2, .start = {0, 3},
     .len = {520, 130}},
    {"prefill hd128/64 bs32 900 + 200 at 1000 window 500", 128, 64, 8, 2, 32, 500, 0, 0, .n_seqs = 2,
     .start = {0, 1000}, .len = {900, 200}},
    /* short decode rows (one split: the short kernel) at the 64-key tile edges and past the ring's 3 stages */
    {"decode short rows tile edges", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 8,
     .start = {0, 63, 64, 127, 128, 191, 192, 255}, .len = {1, 1, 1, 1, 1, 1, 1, 1}},
    {"decode short hd256 window 70 sinks cap", 256, 256, 8, 2, 32, 70, 30.f, 1, .n_seqs = 5,
     .start = {0, 64, 130, 200, 300}, .len = {1, 1, 1, 1, 1}},
};

/* A decode step captured in a CUDA graph, replayed after the metadata
 * buffer is rewritten in place: step B has longer contexts and its rows read
 * other sequences' blocks than step A. */
static void graph_step(Problem *P, const int32_t *pos, const int32_t *seq, float *ref, AttnMeta *m) {
    Err err = {{0}};
    memcpy(P->pos, pos, 3 * 4), memcpy(P->seq, seq, 3 * 4);
    cpu_attention(g_tp, ref, P->q, &P->cache, 0, &P->batch, &P->par);
    CHECK(attn_meta_build(m, &P->batch, &(AttnMetaOpts){P->n_blocks, 64}, &err) == 0, "%s", err.msg);
}

/* mode 0: the engine's splits (the split kernel); 1: one split (the short kernel); 2: one split on the
 * many-rows kernel (a persistent grid of one block): its item counter must be back at zero after each replay */
static void graph_replay(int mode) {
    const bool rows = mode == 2;
    Case c = {"graph", 128, 128, 8, 2, 32, 0, 0, 0, .n_seqs = 3, .start = {1500, 900, 1999}, .len = {1, 1, 1}};
    Problem P;
    Err err = {{0}};
    if (problem_init(&P, &c)) { CHECK(0, "setup"); return; }
    size_t n_out = (size_t)3 * c.n_heads * c.hdv;
    float *ref_a = malloc(n_out * 4), *ref_b = malloc(n_out * 4);
    AttnMeta ma, mb;
    graph_step(&P, (const int32_t[]){40, 1, 7}, (const int32_t[]){0, 1, 2}, ref_a, &ma);
    graph_step(&P, (const int32_t[]){800, 1400, 1999}, (const int32_t[]){1, 0, 2}, ref_b, &mb);
    CHECK(ma.buf_len == mb.buf_len && ma.off_tables == mb.off_tables, "fixed layout %d vs %d", ma.buf_len, mb.buf_len);
    int splits = mode ? 1 : attn_decode_splits(2048, 3, c.n_kv, 1, 2 * 132);
    DevBufs D;
    if (dev_upload(&D, &P, &ma, splits) == 0) {
        AttnDevMeta dm;
        attn_dev_meta(&dm, &ma, D.meta);
        D.work.rows_warps = rows ? 4 : 0;
        CHECK(cuda_attention_decode_rows_takes(&D.work, &P.par, 3) == rows, "kernel choice");
        cudaStream_t s;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamCreate(&s);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        int rc = cuda_attention_decode(D.out, D.q, &D.kv, &dm, &P.par, NULL, &D.work, s, &err);
        cudaError_t e = cudaStreamEndCapture(s, &g);
        CHECK(rc == 0 && e == cudaSuccess, "capture: %s %s", err.msg, cudaGetErrorString(e));
        if (rc == 0 && e == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
            for (int step = 0; step < 3; step++) { /* A, B, then A again */
                const AttnMeta *m = step == 1 ? &mb : &ma;
                cudaMemcpy(D.meta, m->buf, (size_t)m->buf_len * 4, cudaMemcpyHostToDevice);
                cudaMemset(D.out, 0xff, n_out * 2);
                cudaGraphLaunch(ge, s);
                e = cudaStreamSynchronize(s);
                memcpy(P.ref, step == 1 ? ref_b : ref_a, n_out * 4);
                int n_nan;
                double rel = compare(&D, &P, &n_nan);
                printf("# graph replay%s step %c %-4s splits %-3d rel err %.2e\n", rows ? " (rows)" : "",
                       step == 1 ? 'B' : 'A', kv_dtype_name(g_dtype), splits, rel);
                CHECK(e == cudaSuccess && n_nan == 0 && rel <= TOL, "step %d: rel %.3e, %d NaN", step, rel, n_nan);
            }
            cudaGraphExecDestroy(ge);
        } else {
            CHECK(0, "graph instantiate failed");
        }
        cudaGraphDestroy(g), cudaStreamDestroy(s);
    }
    dev_free(&D);
    attn_meta_free(&ma), attn_meta_free(&mb);
    free(ref_a), free(ref_b);
    problem_free(&P);
}

static void test_graph_replay(void) { graph_replay(0), graph_replay(1); }
static void test_graph_replay_rows(void) { graph_replay(2); }
static void test_graph_replay_rows_fp8(void) {
    g_dtype = KV_DTYPE_FP8;
    graph_replay(2);
    g_dtype = KV_DTYPE_BF16;
}

static void test_unsupported(void) {
    AttnParams p = {8, 2, 72, 72, 0.1f, 0, 0, NULL};
    Err err = {{0}};
    CHECK(cuda_attention_check(&p, 32, &err) == -1 && strstr(err.msg, "k=72 v=72"), "'%s'", err.msg);
    p.head_dim_k = p.head_dim_v = 128;
    CHECK(cuda_attention_check(&p, 24, &err) == -1 && strstr(err.msg, "block_size 24"), "'%s'", err.msg);
    p.n_kv_heads = 3;
    CHECK(cuda_attention_check(&p, 32, &err) == -1 && strstr(err.msg, "n_kv_heads 3"), "'%s'", err.msg);
    /* the rope mode's arguments, refused before any launch (no device memory is touched) */
    p.n_kv_heads = 2;
    int32_t one = 1;
    float s = 1.f;
    KVLayerDev kv = {KV_DTYPE_BF16, &one, &one, NULL, NULL, NULL, NULL, NULL};
    AttnDevMeta m = {NULL, 0, 1, 0, 0, 0, 0, 1, 16};
    AttnDecodeWork w = {&s, 1, 1, 0, 0, 0, false};
    AttnRope r = {&one, &one, NULL, NULL, 1e-6f, 0.f, &s, 1.f, 127, true, (const int64_t *)&one, 16};
    CHECK(cuda_attention_decode_rope(&one, &one, &kv, &m, &p, NULL, &w, &r, 0, &err) == -1 &&
          strstr(err.msg, "rotated channels 127 of 128"), "'%s'", err.msg);
    r.rot_dim = 256;
    CHECK(cuda_attention_decode_rope(&one, &one, &kv, &m, &p, NULL, &w, &r, 0, &err) == -1 &&
          strstr(err.msg, "rotated channels 256"), "'%s'", err.msg);
    r.rot_dim = 128, r.slot = NULL;
    CHECK(cuda_attention_decode_rope(&one, &one, &kv, &m, &p, NULL, &w, &r, 0, &err) == -1 &&
          strstr(err.msg, "bad rope arguments"), "'%s'", err.msg);
    r.slot = (const int64_t *)&one, m.n_tiles = 1;
    CHECK(cuda_attention_decode_rope(&one, &one, &kv, &m, &p, NULL, &w, &r, 0, &err) == -1 &&
          strstr(err.msg, "decode rows alone"), "'%s'", err.msg);
}

/* Whether the sm_90a prefill runs this case over a bf16 cache (a run of more than one row, head sizes it
 * has, the GPU and build it needs): where TMA maps matter. */
static bool sm90_prefill_case(const Case *c) {
    if (strcmp(cuda_attention_prefill_kernel(c->hdk, c->hdv, false), "sm90a")) return false;
    for (int s = 0; s < c->n_seqs; s++)
        if (c->len[s] > 1) return true;
    return false;
}

static void run_cases(void) {
    int n = (int)(sizeof k_cases / sizeof *k_cases), ran = 0;
    for (int i = 0; i < n; i++) {
        if (g_no_maps && !sm90_prefill_case(&k_cases[i])) continue;
        if (g_case >= 0 ? i == g_case : !g_quick || i == 1 || i == 6 || i == 17 || i == 19 || i == 20 || i == 23 || i == 25)
            run_case(&k_cases[i]), ran++;
    }
    if (g_no_maps) printf("# no TMA maps: %d cases on the sm_90a prefill's cp.async producer\n", ran);
}
static void test_cases(void) { g_dtype = KV_DTYPE_BF16; run_cases(); }
/* the bf16 cases again without TMA maps: the sm_90a prefill gathers every key by cp.async, as over fp8 caches */
static void test_cases_no_maps(void) { g_dtype = KV_DTYPE_BF16, g_no_maps = true; run_cases(); g_no_maps = false; }
static void test_cases_fp8(void) { g_dtype = KV_DTYPE_FP8; run_cases(); g_dtype = KV_DTYPE_BF16; }
static void test_graph_replay_fp8(void) { g_dtype = KV_DTYPE_FP8; test_graph_replay(); g_dtype = KV_DTYPE_BF16; }

/* ---- the decode kernel's rope mode (cuda_attention_decode_rope) ---- */

typedef struct {
    Case c;                      /* decode rows only: len 1 each */
    int rot_dim;
    bool neox, qk_norm;
} RopeCase;

static const RopeCase k_rope_cases[] = {
    {{"rope hd128 gqa4 8 rows", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 8,
      .start = {4999, 3000, 4095, 17, 0, 2047, 63, 64}, .len = {1, 1, 1, 1, 1, 1, 1, 1}}, 128, true, false},
    {{"rope hd64 partial 32 gptj sinks", 64, 64, 8, 2, 32, 0, 0, 1, .n_seqs = 3, .start = {700, 1, 129},
      .len = {1, 1, 1}}, 32, false, false},
    {{"rope hd80 qk-norm", 80, 80, 4, 2, 32, 0, 0, 0, .n_seqs = 2, .start = {300, 45}, .len = {1, 1}}, 80, true, true},
    {{"rope hd96 window 40", 96, 96, 8, 1, 64, 40, 0, 0, .n_seqs = 2, .start = {1000, 10}, .len = {1, 1}}, 96, true,
     false},
    {{"rope hd256 qk-norm softcap window", 256, 256, 4, 1, 16, 33, 50.f, 0, .n_seqs = 2, .start = {600, 3},
      .len = {1, 1}}, 256, true, true},
    {{"rope hd128/64 sinks", 128, 64, 8, 2, 16, 0, 0, 1, .n_seqs = 2, .start = {2500, 5}, .len = {1, 1}}, 64, true,
     false},
    {{"rope mqa 32 heads (2 head groups)", 64, 64, 32, 1, 16, 0, 0, 0, .n_seqs = 2, .start = {900, 0},
      .len = {1, 1}}, 64, true, false},
    /* one split (the short kernel): the new key at the tile edges, its tile among the ring's up-front loads
     * (written there by the rope pass) or past them (written at its turn) */
    {{"rope short hd128 gqa4 tile edges", 128, 128, 8, 2, 16, 0, 0, 0, .n_seqs = 8,
      .start = {0, 63, 64, 127, 128, 191, 192, 320}, .len = {1, 1, 1, 1, 1, 1, 1, 1}}, 128, true, false},
    {{"rope short hd256 qk-norm window 100 sinks", 256, 256, 8, 2, 32, 100, 0, 1, .n_seqs = 6,
      .start = {0, 64, 127, 128, 200, 300}, .len = {1, 1, 1, 1, 1, 1}}, 256, true, true},
    {{"rope short hd64 gqa8 gptj partial", 64, 64, 16, 2, 16, 0, 0, 0, .n_seqs = 3, .start = {5, 129, 250},
      .len = {1, 1, 1}}, 32, false, false},
};

/* ||a - b|| / ||b|| over n values */
static double rel_norm(const float *a, const float *b, int n) {
    double d2 = 0, r2 = 0;
    for (int i = 0; i < n; i++) d2 += (a[i] - b[i]) * (double)(a[i] - b[i]), r2 += b[i] * (double)b[i];
    return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

/* The device cache after the step against the host's: the new rows' head
 * vectors within rounding (the device rounds the norm and rope to bf16, and
 * fp8 codes may then land one step apart), every other slot bit for bit
 * as uploaded. Returns the worst new-row error; *stray counts other slots
 * that changed. */
static double check_cache(const DevBufs *D, const Problem *P, const uint8_t *k8_before, int *stray) {
    const Case *c = &P->c;
    int64_t slots = (int64_t)P->n_blocks * c->block_size, nk = slots * c->n_kv * c->hdk;
    bool fp8 = P->cache.dtype == KV_DTYPE_FP8;
    uint8_t *dk = malloc(nk * (fp8 ? 1 : 2));
    float *ds = fp8 ? malloc(slots * c->n_kv * 4) : NULL, *got = malloc(c->hdk * 4), *want = malloc(c->hdk * 4);
    cudaMemcpy(dk, D->k, nk * (fp8 ? 1 : 2), cudaMemcpyDeviceToHost);
    if (fp8) cudaMemcpy(ds, D->ks, slots * c->n_kv * 4, cudaMemcpyDeviceToHost);
    double worst = 0;
    *stray = 0;
    for (int64_t s = 0; s < slots; s++) {
        bool is_new = false;
        for (int t = 0; t < P->T; t++) is_new |= P->slot[t] == s;
        for (int h = 0; h < c->n_kv; h++) {
            int64_t at = s * c->n_kv + h;
            if (!is_new) {
                *stray += fp8 ? memcmp(dk + at * c->hdk, k8_before + at * c->hdk, c->hdk) != 0
                              : memcmp(dk + at * c->hdk * 2, P->k16 + at * c->hdk, c->hdk * 2) != 0;
                continue;
            }
            if (fp8) fp8_dequantize_row(dk + at * c->hdk, c->hdk, ds[at], got);
            else for (int i = 0; i < c->hdk; i++) got[i] = bf16_to_fp32(((uint16_t *)dk)[at * c->hdk + i]);
            const float *w = kv_key(&P->cache, 0, s, h, want);
            worst = fmax(worst, rel_norm(got, w, c->hdk));
        }
    }
    free(dk), free(ds), free(got), free(want);
    return worst;
}

static void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
}

/* Host reference of a rope step: qk-norm, rope, the new rows stored, then
 * cpu_attention; q is roped in place. The norm's and the rope's outputs are
 * rounded to bf16 as the device stores them (else an fp8 cache gets another
 * code for a new key now and then, a 12% step that a peaky row shows). */
static void rope_reference(Problem *P, const RopeCase *rc, float *q, float *k, const float *v, const float *qn,
                           const float *kn, const float *inv_freq) {
    const Case *c = &P->c;
    int64_t nq = (int64_t)P->T * c->n_heads * c->hdk, nk = (int64_t)P->T * c->n_kv * c->hdk;
    if (rc->qk_norm) {
        cpu_rmsnorm(q, q, qn, P->T * c->n_heads, c->hdk, 1e-6f, 1.f);
        cpu_rmsnorm(k, k, kn, P->T * c->n_kv, c->hdk, 1e-6f, 1.f);
        round_bf16(q, nq), round_bf16(k, nk);
    }
    cpu_rope(q, P->pos, P->T, c->n_heads, c->hdk, rc->rot_dim, inv_freq, 1.f, rc->neox);
    cpu_rope(k, P->pos, P->T, c->n_kv, c->hdk, rc->rot_dim, inv_freq, 1.f, rc->neox);
    round_bf16(q, nq), round_bf16(k, nk);
    for (int t = 0; t < P->T; t++)
        kv_cache_store(&P->cache, 0, P->slot[t], k + (int64_t)t * c->n_kv * c->hdk, v + (int64_t)t * c->n_kv * c->hdv);
    cpu_attention(g_tp, P->ref, q, &P->cache, 0, &P->batch, &P->par);
}

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}

/* The device cache's bytes (K, V, and with fp8 their scales), or NULL. */
static uint8_t *cache_bytes(const DevBufs *D, const Problem *P, size_t *len) {
    const Case *c = &P->c;
    size_t slots = (size_t)P->n_blocks * c->block_size * c->n_kv, e = P->cache.dtype == KV_DTYPE_FP8 ? 1 : 2;
    size_t nk = slots * c->hdk * e, nv = slots * c->hdv * e, ns = e == 1 ? slots * 4 : 0;
    uint8_t *h = malloc(nk + nv + 2 * ns);
    *len = nk + nv + 2 * ns;
    cudaError_t r = h ? cudaMemcpy(h, D->k, nk, cudaMemcpyDeviceToHost) : cudaErrorMemoryAllocation;
    if (r == cudaSuccess) r = cudaMemcpy(h + nk, D->v, nv, cudaMemcpyDeviceToHost);
    if (r == cudaSuccess && ns) r = cudaMemcpy(h + nk + nv, D->ks, ns, cudaMemcpyDeviceToHost);
    if (r == cudaSuccess && ns) r = cudaMemcpy(h + nk + nv + ns, D->vs, ns, cudaMemcpyDeviceToHost);
    if (r != cudaSuccess) free(h), h = NULL;
    return h;
}

/* Rope mode, the rows as one split: the short kernel against the host's
 * step (output, new keys, no other slot touched), then the general kernel
 * on the same launch: the output and the whole cache bit for bit. */
static void rope_one_split_paths(DevBufs *D, Problem *P, const AttnDevMeta *dm, const AttnRope *r,
                                 const uint8_t *k8_before) {
    const Case *c = &P->c;
    size_t n = (size_t)P->T * c->n_heads * c->hdv, len = 0;
    Err err = {{0}};
    int saved = D->work.n_splits;
    uint16_t *bits[2] = {NULL, NULL};
    uint8_t *cache[2] = {NULL, NULL};
    D->work.n_splits = 1;
    for (int path = 0; path < 2; path++) { /* 0: the short kernel, 1: the general one */
        D->work.no_short = path == 1;
        cudaMemset(D->out, 0xff, n * 2);
        int rc = cuda_attention_decode_rope(D->out, D->q, &D->kv, dm, &P->par, D->sinks, &D->work, r, 0, &err);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(rc == 0 && e == cudaSuccess, "%s one split: %s %s", c->name, err.msg, cudaGetErrorString(e));
        int n_nan, stray = -1;
        double rel = compare(D, P, &n_nan), kerr = check_cache(D, P, k8_before, &stray);
        CHECK(n_nan == 0 && rel <= TOL, "%s one split (%s kernel): rel err %.3e, %d NaN outputs", c->name,
              path ? "general" : "short", rel, n_nan);
        CHECK(kerr <= (g_dtype == KV_DTYPE_FP8 ? 8e-2 : 1e-2) && stray == 0,
              "%s one split (%s kernel): new keys off by %.3g, %d other slots changed", c->name,
              path ? "general" : "short", kerr, stray);
        bits[path] = out_bits(D, n);
        cache[path] = cache_bytes(D, P, &len);
    }
    size_t diff = 0, cdiff = 0;
    for (size_t i = 0; bits[0] && bits[1] && i < n; i++) diff += bits[0][i] != bits[1][i];
    for (size_t i = 0; cache[0] && cache[1] && i < len; i++) cdiff += cache[0][i] != cache[1][i];
    printf("# %-34s %-4s one split: short vs general kernel, %zu of %zu values and %zu cache bytes differ\n",
           c->name, kv_dtype_name(g_dtype), diff, n, cdiff);
    CHECK(bits[0] && bits[1] && cache[0] && cache[1] && diff == 0 && cdiff == 0,
          "%s: short and general decode kernels differ in %zu values, %zu cache bytes", c->name, diff, cdiff);
    free(bits[0]), free(bits[1]), free(cache[0]), free(cache[1]);
    D->work.n_splits = saved, D->work.no_short = false;
}

/* q, k, v as a qkv product would leave them (random bf16 values), the new
 * rows through the decode kernel in rope mode on the device, against the
 * host's rope, cache write and attention; split_tiles 0 (every row the
 * grid's splits) and 4 and 2 (per-row splits, the backend's mode at several rows and at one). */
static void run_rope_case(const RopeCase *rc, int split_tiles) {
    const Case *c = &rc->c;
    Problem P;
    Err err = {{0}};
    if (problem_init(&P, c)) { CHECK(0, "%s: host setup failed", c->name); return; }
    int64_t nkn = (int64_t)P.T * c->n_kv * c->hdk, nvn = (int64_t)P.T * c->n_kv * c->hdv;
    int64_t n_slots = (int64_t)P.n_blocks * c->block_size;
    float *kf = malloc(nkn * 4), *vf = malloc(nvn * 4), *qn = malloc(c->hdk * 4), *kn = malloc(c->hdk * 4);
    float *inv_freq = malloc(c->hdk * 4);
    uint16_t *k16 = malloc(nkn * 2), *v16 = malloc(nvn * 2);
    fill_bf16(kf, k16, nkn, 2.f);
    fill_bf16(vf, v16, nvn, 1.f);
    for (int i = 0; i < c->hdk; i++) qn[i] = 0.2f * frand(), kn[i] = 0.2f * frand(); /* weights 1 + w */
    for (int i = 0; i < rc->rot_dim / 2; i++) inv_freq[i] = powf(10000.f, -2.f * i / rc->rot_dim);
    uint8_t *k8_before = NULL;
    if (P.cache.dtype == KV_DTYPE_FP8) {
        k8_before = malloc(n_slots * c->n_kv * c->hdk);
        memcpy(k8_before, P.cache.k8[0], n_slots * c->n_kv * c->hdk);
    }
    AttnMeta m;
    CHECK(attn_meta_build(&m, &P.batch, &(AttnMetaOpts){P.n_blocks, 0}, &err) == 0, "%s: %s", c->name, err.msg);
    int splits = attn_decode_splits(m.max_kv_len, m.n_decode, c->n_kv, (c->n_heads / c->n_kv + 15) / 16, 2 * 132);
    DevBufs D;
    if (m.n_tiles == 0 && dev_upload(&D, &P, &m, splits) == 0) { /* the cache as it was before the step */
        void *dk = dev_copy(k16, nkn * 2), *dv = dev_copy(v16, nvn * 2), *dslot = dev_copy(P.slot, P.T * 8);
        float *dqn = dev_copy(qn, c->hdk * 4), *dkn = dev_copy(kn, c->hdk * 4), *dfreq = dev_copy(inv_freq, c->hdk * 4);
        rope_reference(&P, rc, P.q, kf, vf, qn, kn, inv_freq);
        AttnDevMeta dm;
        attn_dev_meta(&dm, &m, D.meta);
        D.work.split_tiles = split_tiles;
        AttnRope r = {dk, dv, rc->qk_norm ? dqn : NULL, rc->qk_norm ? dkn : NULL, 1e-6f, 1.f, dfreq, 1.f, rc->rot_dim,
                      rc->neox, (const int64_t *)dslot, n_slots};
        double rel = INFINITY, kerr = INFINITY;
        int n_nan = -1, stray = -1;
        for (int rep = 0; rep < 2; rep++) { /* twice: the split counters are back at zero after a launch */
            cudaMemset(D.out, 0xff, (size_t)P.T * c->n_heads * c->hdv * 2);
            int rc2 = cuda_attention_decode_rope(D.out, D.q, &D.kv, &dm, &P.par, D.sinks, &D.work, &r, 0, &err);
            cudaError_t e = cudaDeviceSynchronize();
            CHECK(rc2 == 0 && e == cudaSuccess, "%s: %s %s", c->name, err.msg, cudaGetErrorString(e));
            rel = compare(&D, &P, &n_nan);
        }
        kerr = check_cache(&D, &P, k8_before, &stray);
        bool fp8 = g_dtype == KV_DTYPE_FP8;
        printf("# %-34s %-4s rows %d splits %-3d split_tiles %d rel err %.2e, new keys %.2e, other slots changed %d\n",
               c->name, kv_dtype_name(g_dtype), P.T, splits, split_tiles, rel, kerr, stray);
        CHECK(n_nan == 0 && rel <= TOL, "%s: rel err %.3e, %d NaN outputs", c->name, rel, n_nan);
        CHECK(kerr <= (fp8 ? 8e-2 : 1e-2) && stray == 0, "%s: new keys off by %.3g, %d other slots changed", c->name,
              kerr, stray);
        if (split_tiles == 0) rope_one_split_paths(&D, &P, &dm, &r, k8_before);
        cudaFree(dk), cudaFree(dv), cudaFree(dslot), cudaFree(dqn), cudaFree(dkn), cudaFree(dfreq);
    } else {
        CHECK(0, "%s: setup (prefill tiles %d)", c->name, m.n_tiles);
    }
    dev_free(&D);
    attn_meta_free(&m);
    free(kf), free(vf), free(qn), free(kn), free(inv_freq), free(k16), free(v16), free(k8_before);
    problem_free(&P);
}

static void run_rope_cases(void) {
    int n = (int)(sizeof k_rope_cases / sizeof *k_rope_cases);
    for (int i = 0; i < n; i++) {
        if (g_quick && i != 0 && i != 4 && i != 7) continue;
        run_rope_case(&k_rope_cases[i], 0);
        run_rope_case(&k_rope_cases[i], ATTN_SPLIT_TILES);
        run_rope_case(&k_rope_cases[i], ATTN_SPLIT_TILES_ONE_ROW);
    }
}
static void test_decode_rope(void) { g_dtype = KV_DTYPE_BF16; run_rope_cases(); }
static void test_decode_rope_fp8(void) { g_dtype = KV_DTYPE_FP8; run_rope_cases(); g_dtype = KV_DTYPE_BF16; }

static void check_fp8_rows(const float *x, int rows, int N, bool fixed);

/* The soft-cap's tanh (attn_tanh: ex2 and rcp, not libdevice's tanhf) against tanh in double: within 1e-6
 * absolutely (what the logit's exp sees) over a fine sweep of [-12, 12], around 0 down to denormals, far out
 * (saturated to exactly +-1), at +-inf and NaN; odd symmetry within the same bound. */
static void test_attn_tanh(void) {
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    int n = 0;
    for (int i = 0; i < 48001; i++) x[n++] = -12.f + 24.f * (float)i / 48000; /* steps of 5e-4 */
    for (int e = -149; e <= 0; e++) x[n++] = ldexpf(1.f, e), x[n++] = -ldexpf(1.f, e) * 1.37f;
    for (int i = 0; i < 2000; i++) x[n++] = (frand() - 0.5f) * 2e-3f;
    float far[] = {12.5f, 20.f, 44.4f, 88.f, 100.f, 1e6f, 3e38f, -12.5f, -20.f, -44.4f, -88.f, -1e6f, -3e38f, 0.f, -0.f};
    for (int i = 0; i < 15; i++) x[n++] = far[i];
    const int n_far = n;
    x[n++] = INFINITY, x[n++] = -INFINITY, x[n++] = NAN;
    float *dx, *dy;
    cudaMalloc((void **)&dx, (size_t)n * 4), cudaMalloc((void **)&dy, (size_t)n * 4);
    cudaMemcpy(dx, x, (size_t)n * 4, cudaMemcpyHostToDevice);
    cudaMemset(dy, 0xff, (size_t)n * 4); /* poisoned: NaN */
    cuda_attn_tanh(dy, dx, n, 0);
    cudaMemcpy(y, dy, (size_t)n * 4, cudaMemcpyDeviceToHost);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "attn_tanh kernel: %s", cudaGetErrorString(cudaGetLastError()));
    double worst = 0;
    int at = 0;
    for (int i = 0; i < n_far; i++) {
        double d = fabs((double)y[i] - tanh((double)x[i]));
        if (!(d <= worst)) worst = d, at = i; /* a NaN result is the worst */
    }
    CHECK(worst <= 1e-6, "attn_tanh(%.9g) = %.9g, tanh = %.9g: off by %.3g (want <= 1e-6)", x[at], y[at],
          tanh((double)x[at]), worst);
    printf("# attn_tanh: largest error %.3g (at %.6g) over %d inputs\n", worst, x[at], n_far);
    for (int i = 0; i < n_far; i++)
        if (fabsf(x[i]) >= 12.5f) CHECK(y[i] == (x[i] > 0 ? 1.f : -1.f), "attn_tanh(%g) = %.9g, want +-1", x[i], y[i]);
    CHECK(y[n_far] == 1.f && y[n_far + 1] == -1.f && isnan(y[n_far + 2]), "attn_tanh(inf, -inf, nan) = %g %g %g",
          y[n_far], y[n_far + 1], y[n_far + 2]);
    cudaFree(dx), cudaFree(dy), free(x), free(y);
}

/* cuda_fp8_quantize_rows (the device code of the fp8 KV write) against the
 * host's fp8_quantize_row, byte for byte: rows whose first value is 448
 * (scale exactly 1, so the rest are converted as they are) holding every
 * bf16 pattern, every midpoint between codes and one ulp either side, and
 * values beyond 448 and infinities; then rows of random magnitudes (scales
 * that are not powers of two), a zero row and rows with nans. */
static void test_fp8_quantizer(void) {
    enum { N = 256 };
    int rows = 0;
    float *x = calloc((size_t)600 * N, sizeof *x); /* ~310 rows are used */
    int at = N; /* next free value; value 0 of each row is 448 */
#define PUT(v)                                              \
    do {                                                    \
        if (at % N == 0) x[at++] = 448.0f;                  \
        x[at++] = (v);                                      \
    } while (0)
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_fp32((uint16_t)h);
        if (!isinf(f)) PUT(f); /* an inf would make the row's amax inf */
    }
    for (int c = 0; c < 0x7e; c++) {
        float mid = (e4m3_to_fp32((uint8_t)c) + e4m3_to_fp32((uint8_t)(c + 1))) / 2;
        PUT(mid);
        PUT(-mid);
        PUT(nextafterf(mid, 0));
        PUT(nextafterf(mid, 1e9f));
        PUT(-nextafterf(mid, 1e9f));
    }
    float edge[] = {447.99f, -464.0f, 1e30f, 0x1p-10f, -0x1p-11f, -0.0f};
    for (int i = 0; i < 6; i++) PUT(edge[i]);
    at = (at + N - 1) / N * N;
    x[0] = 448.0f; /* row 0 was skipped by the macro's first check */
    for (int r = 0; r < 40; r++, at += N) /* random magnitudes */
        for (int i = 0; i < N; i++) x[at + i] = frand() * ldexpf(1.f, r % 20 - 10) * (i % 5 ? 1.f : 1e-3f);
    at += N;                                                            /* a zero row */
    x[at] = 1.0f, x[at + 1] = NAN, x[at + 2] = -NAN, x[at + 3] = -3.0f; /* nans */
    at += N;
    x[at] = INFINITY, x[at + 1] = 2.0f, x[at + 2] = -INFINITY;          /* an infinite amax */
    at += N;
    rows = at / N;
#undef PUT
    check_fp8_rows(x, rows, N, false);
    check_fp8_rows(x, rows, N, true);
    free(x);
}

/* The device's codes and scales of the rows of x against the host's:
 * dynamic (fp8_quantize_row), or fixed (fp8_quantize_row_fixed, static KV
 * scales: row r's scale a quarter, twice or exactly its amax / 448, so
 * every row saturates, fits or touches 448; 1 where that is no positive
 * finite number). */
static void check_fp8_rows(const float *x, int rows, int N, bool fixed) {
    uint8_t *want = malloc((size_t)rows * N), *got = malloc((size_t)rows * N);
    float *ws = malloc(rows * sizeof *ws), *gs = malloc(rows * sizeof *gs), *fs = malloc(rows * sizeof *fs);
    for (int r = 0; r < rows; r++) {
        fp8_quantize_row(x + (size_t)r * N, N, want + (size_t)r * N, &ws[r]);
        if (!fixed) continue;
        float f = ws[r] * (r % 3 == 0 ? 0.25f : r % 3 == 1 ? 2.0f : 1.0f);
        fs[r] = f > 0 && isfinite(f) ? f : 1.0f;
        fp8_quantize_row_fixed(x + (size_t)r * N, N, fs[r], want + (size_t)r * N);
        ws[r] = fs[r];
    }
    float *dx = NULL, *ds = NULL, *df = NULL;
    uint8_t *dq = NULL;
    cudaError_t e = cudaMalloc((void **)&dx, (size_t)rows * N * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&dq, (size_t)rows * N);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ds, rows * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&df, rows * 4);
    if (e == cudaSuccess) e = cudaMemcpy(dx, x, (size_t)rows * N * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(df, fs, rows * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) cuda_fp8_quantize_rows(dq, ds, dx, fixed ? df : NULL, rows, N, 0), e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(got, dq, (size_t)rows * N, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(gs, ds, rows * 4, cudaMemcpyDeviceToHost);
    CHECK(e == cudaSuccess, "%s", cudaGetErrorString(e));
    int bad = 0, bad_scales = 0;
    for (int64_t i = 0; e == cudaSuccess && i < (int64_t)rows * N; i++)
        if (got[i] != want[i]) {
            if (bad++ < 8) printf("#   value %.9g (row %lld): device 0x%02x, host 0x%02x\n", x[i], (long long)(i / N), got[i], want[i]);
        }
    for (int r = 0; e == cudaSuccess && r < rows; r++) bad_scales += memcmp(&gs[r], &ws[r], 4) != 0;
    printf("# fp8 quantizer%s: %d rows of %d values, %d codes and %d scales differ from the host's\n",
           fixed ? " (fixed scales)" : "", rows, N, bad, bad_scales);
    CHECK(bad == 0 && bad_scales == 0, "%s: %d codes, %d scales differ", fixed ? "fixed" : "dynamic", bad, bad_scales);
    cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree(df);
    free(want), free(got), free(ws), free(gs), free(fs);
}

int main(int argc, char **argv) {
    Err err = {{0}};
    g_quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc > 2 && !strcmp(argv[1], "--case")) g_case = atoi(argv[2]);
    if (g_case >= (int)(sizeof k_cases / sizeof *k_cases)) { printf("not ok - --case %d: no such case\n", g_case); return 1; }
    g_tp = thread_pool_create(0, &err);
    if (!g_tp) { printf("not ok - thread pool: %s\n", err.msg); return 1; }
    if (g_case >= 0) {
        RUN(test_cases);
        RUN(test_cases_no_maps);
        RUN(test_cases_fp8);
        thread_pool_destroy(g_tp);
        TEST_EXIT();
    }
    RUN(test_attn_tanh);
    RUN(test_fp8_quantizer);
    RUN(test_cases);
    if (!g_quick) RUN(test_cases_no_maps); /* the sanitizers' --quick runs: the TMA path as the backend */
    RUN(test_cases_fp8);
    RUN(test_graph_replay);
    RUN(test_graph_replay_fp8);
    RUN(test_graph_replay_rows);
    RUN(test_graph_replay_rows_fp8);
    RUN(test_decode_rope);
    RUN(test_decode_rope_fp8);
    RUN(test_unsupported);
    thread_pool_destroy(g_tp);
    TEST_EXIT();
}
