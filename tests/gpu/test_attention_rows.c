/* test_attention_rows.c — the many-rows decode kernel (kernels/cuda/
 * attention_decode_rows.cu: a warp per (row, KV head, head group) item, a
 * persistent grid) against cpu_attention on the same inputs (run on a GPU
 * machine by tests/gpu/run.sh; never in CI). The problems, the device copies
 * and the comparison are test_attention's (attn_problem.h): a paged cache
 * with shuffled blocks, random bf16-exact queries and cache (or an fp8 cache
 * of the host's bytes), the output poisoned with NaN, ||gpu - cpu|| / ||cpu||
 * <= 1e-2 and no row left unwritten.
 * Cases: steps of 30 to 1025 decode rows of mixed lengths (1, tile edges,
 * odd), windows, sinks, soft-cap, GQA 1/4/8/12/32 (items of <= 8 heads), both caches (fp8 with
 * dynamic and static scales), a grid of the GPU's resident warps and one of
 * a few warps, each launch twice (its item counter resets); and which
 * launches it takes (cuda_attention_decode_rows_takes) and how many warps the
 * GPU holds. Its graph replay over changed metadata is test_attention's
 * (test_graph_replay_rows), beside the other decode kernels'.
 *   test_attention_rows [--quick]   (--quick: a few cases, for compute-sanitizer)
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
#include "tests/test.h"

#define TOL 1e-2

static int g_quick; /* --quick */

typedef struct {
    const char *name;
    int hdk, hdv, n_heads, n_kv, block_size, window;
    float softcap;
    int sinks;
    int n_rows, max_pos;         /* decode rows at positions 0 .. max_pos (tile edges, 0, odd ones) */
    int warps;                   /* AttnDecodeWork.rows_warps: 0 the GPU's resident warps (at most twice the
                                    items, so the case qualifies); else that few: many items a warp */
    bool fixed;                  /* fp8: static scales per KV head (saturating codes) */
} RowsCase;

static const RowsCase k_rows_cases[] = {
    {"rows hd128 gqa4 72 rows", 128, 128, 32, 8, 16, 0, 0, 0, 72, 1100, 0, false},
    {"rows hd128 gqa4 8 warps", 128, 128, 32, 8, 16, 0, 0, 0, 40, 700, 8, false},
    {"rows hd128 gqa4 fixed scales", 128, 128, 32, 8, 32, 0, 0, 0, 30, 600, 0, true},
    {"rows hd64 gqa1 bs8 window 37 sinks", 64, 64, 4, 4, 8, 37, 0, 1, 60, 900, 0, false},
    {"rows hd80 gqa8 softcap", 80, 80, 16, 2, 32, 0, 30.f, 0, 64, 800, 0, false},
    {"rows hd96 gqa32 window 300 cap sinks", 96, 96, 32, 1, 64, 300, 50.f, 1, 48, 1000, 12, false},
    {"rows hd128 gqa12 sinks (8 + 4 heads)", 128, 128, 24, 2, 16, 0, 0, 1, 70, 700, 0, false},
    {"rows hd128/64 gqa4 window 1", 128, 64, 8, 2, 16, 1, 0, 0, 50, 500, 0, false},
    {"rows hd64 gqa4 window 16 sinks", 64, 64, 16, 4, 16, 16, 0, 1, 50, 400, 4, false},
    /* the kernel sorts up to 1024 rows longest first; more run in step order */
    {"rows hd64 gqa4 1024 rows (sorted)", 64, 64, 8, 2, 16, 0, 0, 0, 1024, 90, 0, false},
    {"rows hd64 gqa4 1025 rows (step order)", 64, 64, 8, 2, 16, 0, 0, 0, 1025, 90, 0, false},
};

/* Row i's position: the tile edges and 0 first, then spread over 0 .. max_pos (odd and even). */
static int rows_pos(int i, int max_pos) {
    static const int edges[] = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128};
    int n = (int)(sizeof edges / sizeof *edges);
    return i < n ? edges[i] % (max_pos + 1) : (int)((i * 7919L + 13) % (max_pos + 1));
}

static void run_rows_case(const RowsCase *rc) {
    Case c = {rc->name, rc->hdk, rc->hdv, rc->n_heads, rc->n_kv, rc->block_size, rc->window, rc->softcap, rc->sinks,
              .n_seqs = rc->n_rows};
    for (int i = 0; i < rc->n_rows; i++) c.start[i] = rows_pos(i, rc->max_pos), c.len[i] = 1;
    Problem P;
    Err err = {{0}};
    if (problem_init(&P, &c)) { CHECK(0, "%s: host setup failed", c.name); return; }
    bool fixed = rc->fixed && P.cache.dtype == KV_DTYPE_FP8;
    if (fixed) { /* static scales: the cache quantized again with them, the reference again */
        CHECK(kv_cache_host_fix_scales(&P.cache, &err) == 0, "%s", err.msg);
        for (int h = 0; h < c.n_kv; h++) P.cache.k_fixed[h] = 0.05f * (h + 1), P.cache.v_fixed[h] = 0.03f * (h + 1);
        fill_fp8(&P.cache);
        cpu_attention(g_tp, P.ref, P.q, &P.cache, 0, &P.batch, &P.par);
    }
    AttnMeta m;
    CHECK(attn_meta_build(&m, &P.batch, &(AttnMetaOpts){P.n_blocks, 0}, &err) == 0, "%s: %s", c.name, err.msg);
    int64_t items = (int64_t)m.n_decode * c.n_kv * ATTN_ROWS_GROUPS(c.n_heads / c.n_kv);
    int resident = cuda_attention_decode_rows_resident(c.hdk, c.hdv, P.cache.dtype == KV_DTYPE_FP8, &err);
    DevBufs D;
    if (m.n_tiles == 0 && resident > 0 && dev_upload(&D, &P, &m, 1) == 0) {
        AttnDevMeta dm;
        attn_dev_meta(&dm, &m, D.meta);
        D.work.split_tiles = ATTN_SPLIT_TILES; /* as the backend sets it: no effect at one split */
        D.work.rows_warps = rc->warps > 0 ? rc->warps : (int)(resident < 2 * items ? resident : 2 * items);
        CHECK(cuda_attention_decode_rows_takes(&D.work, &P.par, m.n_decode), "%s: not the many-rows kernel", c.name);
        size_t n_out = (size_t)P.T * c.n_heads * c.hdv;
        for (int rep = 0; rep < 2; rep++) { /* twice: the item counter is back at zero after a launch */
            cudaMemset(D.out, 0xff, n_out * 2);
            int rc2 = cuda_attention(D.out, D.q, &D.kv, &dm, &P.par, D.sinks, &D.work, 0, &err);
            cudaError_t e = cudaDeviceSynchronize();
            CHECK(rc2 == 0 && e == cudaSuccess, "%s: %s %s", c.name, err.msg, cudaGetErrorString(e));
            int n_nan;
            double rel = compare(&D, &P, &n_nan);
            printf("# %-38s %-4s%s rows %-2d warps %-4d (resident %d) run %d rel err %.2e\n", c.name,
                   kv_dtype_name(g_dtype), fixed ? " fixed" : "", m.n_decode, D.work.rows_warps, resident, rep, rel);
            CHECK(n_nan == 0 && rel <= TOL, "%s: run %d rel err %.3e, %d NaN outputs", c.name, rep, rel, n_nan);
        }
    } else {
        CHECK(0, "%s: setup (prefill tiles %d, resident warps %d)", c.name, m.n_tiles, resident);
    }
    dev_free(&D);
    attn_meta_free(&m);
    problem_free(&P);
}

static void run_rows_cases(void) {
    int n = (int)(sizeof k_rows_cases / sizeof *k_rows_cases);
    for (int i = 0; i < n; i++)
        if (!g_quick || i == 1 || i == 5 || i == 6) run_rows_case(&k_rows_cases[i]);
}
static void test_decode_rows(void) { g_dtype = KV_DTYPE_BF16; run_rows_cases(); }
static void test_decode_rows_fp8(void) { g_dtype = KV_DTYPE_FP8; run_rows_cases(); g_dtype = KV_DTYPE_BF16; }

/* Which launches the many-rows kernel takes: one split, rows_warps > 0, head sizes <= 128, and at least
 * half its resident warps in items (rows x KV heads x head groups). */
static void test_decode_rows_choice(void) {
    Err err = {{0}};
    AttnParams p = {32, 8, 128, 128, 0.1f, 0, 0, NULL};
    AttnDecodeWork w = {0};
    w.n_splits = 1, w.rows_warps = 1056;
    CHECK(cuda_attention_decode_rows_takes(&w, &p, 66), "66 rows x 8 = 528 items: half of 1056");
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 65), "65 rows x 8 = 520 items");
    CHECK(cuda_attention_decode_rows_takes(&w, &p, 256), "256 rows");
    w.n_splits = 2;
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 256), "two splits");
    w.n_splits = 1, w.rows_warps = 0;
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 256), "rows_warps 0 (the batch-invariant mode)");
    CHECK(!cuda_attention_decode_rows_takes(NULL, &p, 256), "no work area");
    w.rows_warps = 1056;
    p.head_dim_k = p.head_dim_v = 256;
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 256), "head 256");
    p.head_dim_k = 192, p.head_dim_v = 128;
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 256), "head 192/128");
    p.head_dim_k = 64, p.head_dim_v = 64, p.n_heads = 34, p.n_kv_heads = 2; /* group 17: three groups of <= 8 */
    CHECK(cuda_attention_decode_rows_takes(&w, &p, 88), "88 rows x 2 x 3 = 528 items");
    CHECK(!cuda_attention_decode_rows_takes(&w, &p, 87), "87 rows x 2 x 3");
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int f = 0; f < 2; f++) {
        int r128 = cuda_attention_decode_rows_resident(128, 128, f, &err);
        int r64 = cuda_attention_decode_rows_resident(128, 64, f, &err);
        printf("# many-rows kernel %s: %d resident warps at head 128 (%d SMs), %d at 128/64\n", f ? "fp8" : "bf16",
               r128, sms, r64);
        CHECK(r128 >= 4 * sms && r128 % 4 == 0 && r64 >= r128, "%s: resident warps %d / %d", f ? "fp8" : "bf16", r128,
              r64);
        CHECK(cuda_attention_decode_rows_resident(256, 256, f, &err) == 0, "head 256: not served");
        CHECK(cuda_attention_decode_rows_resident(192, 128, f, &err) == 0, "head 192/128: not served");
    }
}

int main(int argc, char **argv) {
    Err err = {{0}};
    g_quick = argc > 1 && !strcmp(argv[1], "--quick");
    g_tp = thread_pool_create(0, &err);
    if (!g_tp) { printf("not ok - thread pool: %s\n", err.msg); return 1; }
    RUN(test_decode_rows_choice);
    RUN(test_decode_rows);
    RUN(test_decode_rows_fp8);
    thread_pool_destroy(g_tp);
    TEST_EXIT();
}
