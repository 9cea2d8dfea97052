/* test_attn_cascade_gpu.c — cascade attention on the GPU
 * (attention.cuh cuda_attention_cascade: the shared pass in the prefill
 * kernel, the decode kernel from each member's suffix start, the merge)
 * against cpu_attention, the plain fp32 op, on the same inputs (run on a
 * GPU machine by tests/gpu/run.sh).
 *
 * Each case: 2 to 64 sequences whose block tables begin with the same
 * shuffled blocks (one or two prefixes; prefix lengths that are not a
 * multiple of the kernels' 64-key tiles), each with one decode row at its
 * own position past the prefix (suffixes of 1 to 255 keys, the row at the
 * prefix's end included), some cases with a prefill run and a sequence of
 * its own beside them (the flat path in the same call). The plan is built
 * as the backend builds it (the decode rows only, every group formed:
 * CLLM_CASCADE=always) and run three ways: the shared pass with the splits
 * the backend picks or with one, and the decode kernel with every row in
 * the step's splits (the last split's combine merges the shared partials)
 * or in splits of its own range as the backend runs it (a member's short
 * suffix is one split: the block's own finish folds them in); and once more
 * at one split on the many-rows kernel (attention_decode_rows.cu), which
 * folds them in its store.
 * The output is poisoned with NaN first; every element is checked.
 *
 * Tolerance, per element: |gpu - cpu| <= 2 x 2^-8 x (vmax + |cpu|), vmax the
 * largest |v| among the keys the row's KV head attends. The kernels round P
 * to bf16 before P.V (relative error <= 2^-8 each, so the numerator's error
 * is <= 2^-8 x sum p |v| <= 2^-8 x l x vmax) and the output to bf16 (2^-8 x
 * |o|); fp8 caches round P x scale / vref to f16 (2^-11) and read exact
 * codes, within the same bound. The factor 2 covers the fp32 sums and
 * exp2f. The cascade merge itself is exact up to fp32 rounding (DESIGN.md
 * "Cascade attention"). A missing prefix, a wrong row or head, or a sink
 * counted twice moves outputs by a share of |o| ~ vmax / 4, well outside.
 * Plus the output's relative norm error <= 1e-2, as test_attention.c.
 *   test_attn_cascade_gpu [--quick]   (--quick: a few cases, for compute-sanitizer)
 */
#include "tests/gpu/attn_problem.h"

#define NORM_TOL 1e-2
#define SMS 132 /* the splits' target as on an H200; any GPU runs them */

typedef struct {
    const char *name;
    int hdk, hdv, n_heads, n_kv, block_size, window;
    float softcap;
    int sinks;
    int n_seqs, shared, n_prefixes;
    int extra;        /* 1: a prefill run of 77 rows (sharing the prefix) and a decode row of a sequence of its own */
    int want_groups;  /* groups the plan must form */
} CascadeCase;

static const CascadeCase k_cases[] = {
    {"2 seqs hd128 gqa4 prefix 208", 128, 128, 8, 2, 16, 0, 0, 0, 2, 13, 1, 0, 1},
    {"64 seqs hd128 gqa4 prefix 2000", 128, 128, 32, 8, 16, 0, 0, 0, 64, 125, 1, 0, 1},
    {"32 seqs hd64 gqa1 bs32 prefix 288", 64, 64, 4, 4, 32, 0, 0, 0, 32, 9, 1, 1, 1},
    {"16 seqs hd256 gqa8 softcap sinks", 256, 256, 16, 2, 16, 0, 50.f, 1, 16, 21, 1, 1, 1},
    {"8 seqs hd128/64 gqa4 sinks", 128, 64, 8, 2, 16, 0, 0, 1, 8, 33, 1, 0, 1},
    {"64 seqs hd64 gqa8 softcap sinks", 64, 64, 16, 2, 16, 0, 30.f, 1, 64, 40, 1, 1, 1},
    {"2 prefixes x 12 seqs hd128 gqa4", 128, 128, 8, 2, 16, 0, 0, 0, 24, 17, 2, 1, 2},
    {"mqa 32 heads hd64 (2 head groups)", 64, 64, 32, 1, 16, 0, 0, 1, 6, 20, 1, 0, 1},
    {"hd96 gqa2 bs64", 96, 96, 8, 4, 64, 0, 0, 0, 10, 5, 1, 1, 1},
    {"hd80 gqa4", 80, 80, 8, 2, 32, 0, 0, 0, 5, 11, 1, 0, 1},
    {"window 8192 (covers the prefix)", 128, 128, 8, 2, 16, 8192, 0, 1, 12, 30, 1, 1, 1},
    {"window 100 (no group: flat)", 128, 128, 8, 2, 16, 100, 0, 0, 12, 30, 1, 1, 0},
};

/* The case as a test_attention Case: one decode row a sequence at prefix end
 * + 0 .. 254, with the extras after the sharers. */
static Case make_case(const CascadeCase *cc) {
    Case c = {cc->name, cc->hdk, cc->hdv, cc->n_heads, cc->n_kv, cc->block_size, cc->window, cc->softcap, cc->sinks,
              .n_seqs = cc->n_seqs};
    const int prefix = cc->shared * cc->block_size;
    for (int s = 0; s < cc->n_seqs; s++) {
        /* the first sequence of each prefix at the prefix's end; the others spread over 255 */
        c.start[s] = prefix + (s % (cc->n_seqs / cc->n_prefixes) ? (int)((frand() * 0.5f + 0.5f) * 255.f) : 0);
        c.len[s] = 1;
    }
    if (cc->extra) {
        c.start[c.n_seqs] = prefix + 3, c.len[c.n_seqs] = 77, c.n_seqs++; /* shares, but prefill: flat */
        c.start[c.n_seqs] = prefix + 40, c.len[c.n_seqs] = 1, c.n_seqs++; /* of its own */
    }
    c.shared = cc->shared, c.n_prefixes = cc->n_prefixes, c.shared_seqs = cc->n_seqs / cc->n_prefixes;
    if (cc->extra) c.shared_seqs = cc->n_prefixes == 1 ? cc->n_seqs + 1 : c.shared_seqs;
    return c;
}

/* The plan of P's decode rows (runs of one row), as backend_cuda_cascade.cu builds it. */
static int plan_decode_rows(const Problem *P, AttnCascadePlan *pl, AttnBatch *db, int32_t *pos, int32_t *seq,
                            int32_t *row_of) {
    const AttnBatch *b = &P->batch;
    int n = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        bool after = t > 0 && b->seq[t - 1] == b->seq[t] && b->pos[t - 1] + 1 == b->pos[t];
        bool before = t + 1 < b->n_tokens && b->seq[t + 1] == b->seq[t] && b->pos[t] + 1 == b->pos[t + 1];
        if (!after && !before) pos[n] = b->pos[t], seq[n] = b->seq[t], row_of[n] = t, n++;
    }
    *db = (AttnBatch){n, pos, seq, NULL, b->n_seqs, b->block_tables, b->block_size};
    AttnCascadeOpts o = {true, SMS, ATTN_TILE_M, ATTN_DECODE_TILE_N};
    Err err = {{0}};
    int rc = attn_cascade_plan(pl, db, &P->par, &o, &err);
    CHECK(rc == 0, "%s: plan: %s", P->c.name, err.msg);
    return rc;
}

/* vmax of each (row, KV head): the largest |v| among the keys it attends. */
static float *row_vmax(const Problem *P) {
    const Case *c = &P->c;
    float *vm = calloc((size_t)P->T * c->n_kv, sizeof *vm), v[256];
    for (int t = 0; t < P->T; t++) {
        const int32_t *tab = P->tables[P->seq[t]];
        int lo = c->window > 0 && P->pos[t] - c->window + 1 > 0 ? P->pos[t] - c->window + 1 : 0;
        for (int j = lo; j <= P->pos[t]; j++) {
            int64_t slot = (int64_t)tab[j / c->block_size] * c->block_size + j % c->block_size;
            for (int h = 0; h < c->n_kv; h++) {
                const float *x = kv_value(&P->cache, 0, slot, h, v);
                for (int d = 0; d < c->hdv; d++) vm[t * c->n_kv + h] = fmaxf(vm[t * c->n_kv + h], fabsf(x[d]));
            }
        }
    }
    return vm;
}

/* Every element within the bound at the top; returns the failures. */
static int check_elements(const DevBufs *D, const Problem *P, const float *vmax, double *worst) {
    const Case *c = &P->c;
    size_t n = (size_t)P->T * c->n_heads * c->hdv;
    uint16_t *h = malloc(n * 2);
    cudaMemcpy(h, D->out, n * 2, cudaMemcpyDeviceToHost);
    int bad = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        int t = (int)(i / ((size_t)c->n_heads * c->hdv)), hq = (int)(i / c->hdv % c->n_heads);
        float g = bf16_to_fp32(h[i]), r = P->ref[i], vm = vmax[t * c->n_kv + hq / (c->n_heads / c->n_kv)];
        double tol = 2.0 * ldexp(1.0, -8) * (vm + fabsf(r)), err = fabs((double)g - r);
        if (!(err <= tol)) { /* NaN fails too */
            if (bad++ < 4) printf("#   row %d head %d dim %d: gpu %g cpu %g (tol %g)\n", t, hq, (int)(i % c->hdv), g, r, tol);
        } else if (err / tol > *worst) {
            *worst = err / tol;
        }
    }
    free(h);
    return bad;
}

/* One packing of the plan (target_blocks, max_splits) through cuda_attention_cascade, the decode rows split
 * as split_tiles says (AttnDecodeWork). */
static void run_packed(const Problem *P, const AttnMeta *m, int splits, const AttnCascadePlan *pl, const AttnBatch *db,
                       const int32_t *row_of, int target_blocks, int max_splits, int split_tiles, int rows_warps,
                       const float *vmax) {
    const Case *c = &P->c;
    Err err = {{0}};
    AttnCascadePackOpts po = {c->n_heads / c->n_kv, c->n_kv, ATTN_TILE_M, ATTN_DECODE_TILE_N, target_blocks, max_splits};
    int64_t cap = attn_cascade_pack_len(P->T, &po);
    int32_t *buf = malloc(cap * sizeof *buf);
    AttnCascadeDev cd = {0};
    int rc = attn_cascade_pack(buf, cap, &cd.m, pl, db, row_of, P->T, &po, &err);
    CHECK(rc == 0, "%s: pack: %s", c->name, err.msg);
    DevBufs D;
    if (rc == 0 && dev_upload(&D, P, m, splits) == 0) {
        cd.cap_slots = (int64_t)(cd.m.n_members ? cd.m.n_members : 1) * c->n_heads * (cd.m.n_splits ? cd.m.n_splits : 1);
        int32_t *dbuf = NULL;
        cudaMalloc((void **)&dbuf, (cd.m.len ? cd.m.len : 1) * sizeof *dbuf);
        cudaMemcpy(dbuf, buf, cd.m.len * sizeof *dbuf, cudaMemcpyHostToDevice);
        cudaMalloc((void **)&cd.part, attn_cascade_work_bytes(cd.cap_slots, c->hdv));
        cudaMemset(cd.part, 0xff, attn_cascade_work_bytes(cd.cap_slots, c->hdv)); /* unwritten partials: NaN */
        cd.buf = dbuf;
        AttnDevMeta dm;
        attn_dev_meta(&dm, m, D.meta);
        D.work.split_tiles = split_tiles;
        D.work.rows_warps = rows_warps; /* > 0 at one split: the many-rows kernel (heads <= 128) */
        rc = cuda_attention_cascade(D.out, D.q, &D.kv, &dm, &P->par, D.sinks, &D.work, &cd, 0, &err);
        CHECK(rc == 0, "%s: %s", c->name, err.msg);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "%s: %s", c->name, cudaGetErrorString(e));
        int n_nan;
        double rel = compare(&D, P, &n_nan), worst;
        int bad = check_elements(&D, P, vmax, &worst);
        const bool rows = cuda_attention_decode_rows_takes(&D.work, &P->par, m->n_decode);
        printf("# %-36s %-4s T=%-3d groups %d units %-3d shared splits %-2d (max %2d) own %s rel err %.2e "
               "worst/tol %.2f\n", c->name, kv_dtype_name(g_dtype), P->T, pl->n_groups, cd.m.n_units, cd.m.n_splits,
               max_splits, rows ? "many-rows" : split_tiles ? "splits by range" : "all splits", rel, worst);
        CHECK(n_nan == 0 && bad == 0 && rel <= NORM_TOL, "%s (%d splits): rel err %.3e, %d NaN, %d elements off",
              c->name, cd.m.n_splits, rel, n_nan, bad);
        cudaFree(dbuf), cudaFree(cd.part);
    }
    dev_free(&D);
    free(buf);
}

static void run_case(const CascadeCase *cc) {
    Case c = make_case(cc);
    Problem P;
    Err err = {{0}};
    if (problem_init(&P, &c)) { CHECK(0, "%s: host setup failed", c.name); return; }
    AttnMeta m;
    CHECK(attn_meta_build(&m, &P.batch, &(AttnMetaOpts){P.n_blocks, 0}, &err) == 0, "%s: %s", c.name, err.msg);
    int splits = attn_decode_splits(m.max_kv_len, m.n_decode, c.n_kv, (c.n_heads / c.n_kv + 15) / 16, 2 * SMS);
    int32_t *pos = malloc(P.T * 4), *seq = malloc(P.T * 4), *row_of = malloc(P.T * 4);
    AttnCascadePlan pl;
    AttnBatch db;
    if (plan_decode_rows(&P, &pl, &db, pos, seq, row_of) == 0) {
        CHECK(pl.n_groups == cc->want_groups, "%s: %d groups, want %d", c.name, pl.n_groups, cc->want_groups);
        float *vmax = row_vmax(&P);
        run_packed(&P, &m, splits, &pl, &db, row_of, 2 * SMS, ATTN_CASCADE_MAX_SPLITS, 0, 0, vmax);
        run_packed(&P, &m, splits, &pl, &db, row_of, 2 * SMS, ATTN_CASCADE_MAX_SPLITS, ATTN_SPLIT_TILES, 0, vmax);
        run_packed(&P, &m, splits, &pl, &db, row_of, 1, 1, ATTN_SPLIT_TILES, 0, vmax);
        /* one split, the many-rows kernel (the batch job's steps of hundreds of rows) */
        run_packed(&P, &m, 1, &pl, &db, row_of, 2 * SMS, ATTN_CASCADE_MAX_SPLITS, ATTN_SPLIT_TILES, 1, vmax);
        free(vmax);
        attn_cascade_free(&pl);
    }
    free(pos), free(seq), free(row_of);
    attn_meta_free(&m);
    problem_free(&P);
}

static int g_quick;
static void run_cases(void) {
    int n = (int)(sizeof k_cases / sizeof k_cases[0]);
    for (int i = 0; i < n; i++)
        if (!g_quick || i == 0 || i == 3 || i == 6) run_case(&k_cases[i]);
}
static void test_cascade(void) { g_dtype = KV_DTYPE_BF16; run_cases(); }
static void test_cascade_fp8(void) { g_dtype = KV_DTYPE_FP8; run_cases(); g_dtype = KV_DTYPE_BF16; }

int main(int argc, char **argv) {
    Err err = {{0}};
    g_quick = argc > 1 && !strcmp(argv[1], "--quick");
    g_tp = thread_pool_create(0, &err);
    if (!g_tp) { printf("not ok - thread pool: %s\n", err.msg); return 1; }
    RUN(test_cascade);
    RUN(test_cascade_fp8);
    thread_pool_destroy(g_tp);
    TEST_EXIT();
}
