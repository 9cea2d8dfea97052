/* test_attn_cascade.c — kernels/attn_cascade.c (the plan of cascade
 * attention and its rule) and the CPU backend's cascade path.
 *
 *   - the rule (attn_cascade_pays) at its edges: the 256-key threshold, one
 *     sequence, few sequences on many workers, many sequences;
 *   - the plan on hand-made batches: one sequence only, a partial last
 *     block, windowed layers, rows at the prefix boundary, prefill chunks
 *     mixed with decode rows, two prefixes, errors;
 *   - cascade attention against a dense double-precision reference written
 *     here (and against the plain path) on random caches with shuffled block
 *     tables: GQA, sinks, soft-cap, several groups and ungrouped rows, fp32
 *     within 1e-5 relative; an fp8 cache against the plain path.
 *   - the plan's device form (attn_cascade_pack, what the CUDA kernels
 *     read): units, groups, splits, members and per-row entries, errors;
 *   - CLLM_CASCADE's values. */
#include <stdint.h>

#include "kernels/attn_cascade.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/test.h"

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static float rng_float(uint64_t *s) { return (float)((double)rng_next(s) / (double)(1ull << 31)) * 2.0f - 1.0f; }

/* ------------------------------------------------------------ the rule */

static void test_rule_edges(void) {
    /* an H200-like GPU: 132 multiprocessors, 128-row query tiles, 64-key tiles; 32 heads over 8 KV heads */
    AttnCascadeCost c = {2048, 256, 256, 32, 8, 132, 128, 64};
    CHECK(attn_cascade_pays(&c), "256 decode rows sharing 2048 keys should cascade");
    c.shared_tokens = ATTN_CASCADE_MIN_SHARED - 1;
    CHECK(!attn_cascade_pays(&c), "255 shared keys: below the threshold");
    c.shared_tokens = ATTN_CASCADE_MIN_SHARED;
    CHECK(attn_cascade_pays(&c), "256 shared keys, 256 sequences: pays");
    c.n_seqs = 1, c.n_rows = 64;
    CHECK(!attn_cascade_pays(&c), "one sequence (a prefill chunk): nothing to share");
    c = (AttnCascadeCost){2048, 2, 2, 32, 8, 132, 128, 64};
    CHECK(!attn_cascade_pays(&c), "2 sequences on 132 workers: the flat split over keys keeps more busy");
    c.n_workers = 2; /* the CPU backend on 2 threads */
    CHECK(attn_cascade_pays(&c), "2 sequences on 2 workers: the shared reads win");
    c = (AttnCascadeCost){300, 8, 8, 4, 2, 1, 16, 1};
    CHECK(attn_cascade_pays(&c), "one worker, 16 (row, head) pairs per unit: 8x fewer reads");
    c.rows_per_unit = 1;
    CHECK(!attn_cascade_pays(&c), "one (row, head) pair per unit reads the prefix once per pair: no sharing");
    c = (AttnCascadeCost){0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!attn_cascade_pays(&c), "all zero: no");
}

/* ------------------------------------------------------------ the plan */

#define MAXT 32

typedef struct {
    int32_t pos[MAXT], seq[MAXT];
    int64_t slot[MAXT];
    int32_t tables[8][16];
    const int32_t *tptr[8];
    AttnBatch b;
    AttnParams p;
    AttnCascadeOpts o;
} PlanCase;

/* n_seqs sequences whose tables are ids base[s] + 0, 1, ... past their
 * first `shared[s]` blocks (100 + j for shared block j). */
static void plan_case(PlanCase *c, int n_seqs, const int *shared, int bs) {
    memset(c, 0, sizeof *c);
    for (int s = 0; s < n_seqs; s++) {
        for (int j = 0; j < 16; j++) c->tables[s][j] = j < shared[s] ? 100 + j : 1000 * (s + 1) + j;
        c->tptr[s] = c->tables[s];
    }
    c->b = (AttnBatch){0, c->pos, c->seq, c->slot, n_seqs, c->tptr, bs};
    c->p = (AttnParams){4, 2, 16, 16, 0.25f, 0, 0, NULL};
    c->o = (AttnCascadeOpts){.always = true};
}

static void add_rows(PlanCase *c, int s, int pos0, int n) {
    for (int i = 0; i < n; i++, c->b.n_tokens++) c->seq[c->b.n_tokens] = s, c->pos[c->b.n_tokens] = pos0 + i;
}

static int plan(PlanCase *c, AttnCascadePlan *pl) {
    Err err = {{0}};
    int rc = attn_cascade_plan(pl, &c->b, &c->p, &c->o, &err);
    if (rc) printf("  %s\n", err.msg);
    return rc;
}

static void test_plan_one_sequence(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {8};
    plan_case(&c, 1, shared, 4);
    add_rows(&c, 0, 40, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0 && pl.group_of[0] == -1 && pl.suffix_start[0] == 0,
          "one sequence: %d groups", pl.n_groups);
    attn_cascade_free(&pl);
    /* two rows of one sequence (a prefill chunk) are still one sequence */
    add_rows(&c, 0, 41, 3);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0, "one sequence's chunk: %d groups", pl.n_groups);
    attn_cascade_free(&pl);
    /* an empty step */
    plan_case(&c, 0, shared, 4);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0, "empty step");
    attn_cascade_free(&pl);
}

static void test_plan_two_sequences(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {3, 3, 0};
    plan_case(&c, 3, shared, 4);
    add_rows(&c, 0, 20, 1);
    add_rows(&c, 2, 30, 1); /* its own blocks: ungrouped */
    add_rows(&c, 1, 13, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1, "%d groups", pl.n_groups);
    if (pl.n_groups == 1) {
        AttnCascadeGroup *g = &pl.groups[0];
        CHECK(g->n_blocks == 3 && g->n_seqs == 2 && g->n_rows == 2 && g->blocks[0] == 100 && g->blocks[2] == 102,
              "group: %d blocks, %d seqs, %d rows", g->n_blocks, g->n_seqs, g->n_rows);
        CHECK(pl.rows[g->row0] == 0 && pl.rows[g->row0 + 1] == 2, "rows in step order: %d %d", pl.rows[g->row0],
              pl.rows[g->row0 + 1]);
        CHECK(pl.group_of[0] == 0 && pl.group_of[1] == -1 && pl.group_of[2] == 0, "group_of");
        CHECK(pl.suffix_start[0] == 12 && pl.suffix_start[1] == 0 && pl.suffix_start[2] == 12, "suffix starts %d %d %d",
              pl.suffix_start[0], pl.suffix_start[1], pl.suffix_start[2]);
    }
    attn_cascade_free(&pl);
    /* the rule decides when not `always`: 12 shared keys never pay */
    c.o.always = false;
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0 && pl.group_of[0] == -1, "below the threshold: %d groups",
          pl.n_groups);
    attn_cascade_free(&pl);
}

/* Tables equal over 3 blocks, rows inside the third: only 2 blocks are full
 * before every row, so 2 are shared (a row must attend to all shared keys
 * and own at least one). */
static void test_plan_partial_block(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {3, 3};
    plan_case(&c, 2, shared, 4);
    add_rows(&c, 0, 9, 1);
    add_rows(&c, 1, 11, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 2 && pl.suffix_start[0] == 8,
          "partial third block: %d groups, %d blocks", pl.n_groups, pl.n_groups ? pl.groups[0].n_blocks : -1);
    attn_cascade_free(&pl);
    /* rows at the boundary: position 8 is the first of block 2 (2 shared),
     * position 7 the last of block 1 (1 shared: its suffix needs a key) */
    plan_case(&c, 2, shared, 4);
    add_rows(&c, 0, 8, 1);
    add_rows(&c, 1, 8, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 2, "at position 8: 2 blocks");
    attn_cascade_free(&pl);
    c.pos[1] = 7;
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 1 && pl.suffix_start[0] == 4 &&
              pl.suffix_start[1] == 4, "position 7 caps the group at 1 block");
    attn_cascade_free(&pl);
    c.pos[1] = 3; /* inside block 0: nothing full before it */
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0, "position 3: no group");
    attn_cascade_free(&pl);
}

/* Three sequences share 4 blocks, one of them sits at the boundary of the
 * 4th: 3 x 3 blocks beat 2 x 4 (a saving of 2 x 3 = 6 block reads vs 4). */
static void test_plan_boundary_choice(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {4, 4, 4};
    plan_case(&c, 3, shared, 4);
    add_rows(&c, 0, 16, 1);
    add_rows(&c, 1, 21, 1);
    add_rows(&c, 2, 15, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 3 && pl.groups[0].n_seqs == 3,
          "3 sequences x 3 blocks: %d groups", pl.n_groups);
    attn_cascade_free(&pl);
    /* with 8 shared blocks and one row at position 15: 2 x 8 > 3 x 3 */
    int shared8[] = {8, 8, 8};
    plan_case(&c, 3, shared8, 4);
    add_rows(&c, 0, 40, 1);
    add_rows(&c, 1, 33, 1);
    add_rows(&c, 2, 15, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 8 && pl.groups[0].n_seqs == 2 &&
              pl.group_of[2] == -1, "2 sequences x 8 blocks, the short one out");
    attn_cascade_free(&pl);
}

static void test_plan_window(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {4, 4};
    plan_case(&c, 2, shared, 4);
    add_rows(&c, 0, 20, 1);
    add_rows(&c, 1, 17, 1);
    c.p.window = 21; /* every row's window starts at key 0 */
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1 && pl.groups[0].n_blocks == 4, "window 21 covers the prefix");
    attn_cascade_free(&pl);
    c.p.window = 20; /* row 0 (position 20) no longer sees key 0 */
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 0, "window 20: no group (%d)", pl.n_groups);
    attn_cascade_free(&pl);
    c.p.window = 0;
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 1, "global layer");
    attn_cascade_free(&pl);
}

/* A prefill chunk of one sequence, decode rows of two others, one more
 * prefix shared by two more sequences, a sequence of its own. */
static void test_plan_mixed(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {8, 8, 8, 0, 0, 0};
    plan_case(&c, 6, shared, 4);
    for (int j = 0; j < 6; j++) c.tables[3][j] = c.tables[4][j] = 200 + j; /* a second prefix of 6 blocks */
    add_rows(&c, 5, 50, 1);
    add_rows(&c, 0, 40, 8);
    add_rows(&c, 1, 60, 1);
    add_rows(&c, 3, 30, 1);
    add_rows(&c, 2, 33, 1);
    add_rows(&c, 4, 24, 3);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 2, "%d groups", pl.n_groups);
    int rows8 = 0, rows6 = 0;
    for (int g = 0; g < pl.n_groups; g++) {
        AttnCascadeGroup *gr = &pl.groups[g];
        if (gr->n_blocks == 8) rows8 += gr->n_rows * (gr->n_seqs == 3 && gr->blocks[0] == 100);
        if (gr->n_blocks == 6) rows6 += gr->n_rows * (gr->n_seqs == 2 && gr->blocks[0] == 200);
        for (int i = 1; i < gr->n_rows; i++) CHECK(pl.rows[gr->row0 + i - 1] < pl.rows[gr->row0 + i], "step order");
    }
    CHECK(rows8 == 10 && rows6 == 4, "group rows: %d (want 10) and %d (want 4)", rows8, rows6);
    CHECK(pl.group_of[0] == -1 && pl.suffix_start[0] == 0, "the lone sequence");
    for (int t = 1; t < c.b.n_tokens; t++) {
        int g = pl.group_of[t];
        CHECK(g >= 0 && pl.suffix_start[t] == pl.groups[g].n_blocks * 4 && c.pos[t] >= pl.suffix_start[t],
              "row %d: group %d, suffix %d, pos %d", t, g, pl.suffix_start[t], c.pos[t]);
    }
    attn_cascade_free(&pl);
}

static void test_plan_errors(void) {
    PlanCase c;
    AttnCascadePlan pl;
    Err err = {{0}};
    int shared[] = {2, 2};
    plan_case(&c, 2, shared, 4);
    add_rows(&c, 0, 9, 1);
    add_rows(&c, 1, 9, 1);
    c.seq[1] = 2;
    CHECK(attn_cascade_plan(&pl, &c.b, &c.p, &c.o, &err) && strstr(err.msg, "row 1") && strstr(err.msg, "seq 2"),
          "seq out of range: %s", err.msg);
    c.seq[1] = 1, c.pos[0] = -1;
    CHECK(attn_cascade_plan(&pl, &c.b, &c.p, &c.o, &err) && strstr(err.msg, "position -1"), "negative: %s", err.msg);
    c.pos[0] = 9, c.tptr[1] = NULL;
    CHECK(attn_cascade_plan(&pl, &c.b, &c.p, &c.o, &err) && strstr(err.msg, "no block table"), "table: %s", err.msg);
    c.tptr[1] = c.tables[1], c.b.block_size = 0;
    CHECK(attn_cascade_plan(&pl, &c.b, &c.p, &c.o, &err) && strstr(err.msg, "block_size 0"), "bs: %s", err.msg);
    CHECK(pl.groups == NULL && pl.rows == NULL, "a failed plan holds nothing");
}

/* ------------------------------------------------------------ attention */

typedef struct {
    int H, Hkv, Dk, Dv, bs, window;
    float scale, cap;
    bool sinks;
    KVDtype dtype;
} AttnShape;

/* Dense reference in double, reading the cache's own values. */
static void reference(const KVCacheHost *kv, const AttnBatch *b, const AttnParams *p, const float *q, int row, int h,
                      double *o) {
    int pos = b->pos[row], kvh = h / (p->n_heads / p->n_kv_heads);
    int first = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;
    const int32_t *tab = b->block_tables[b->seq[row]];
    const float *qh = q + ((int64_t)row * p->n_heads + h) * p->head_dim_k;
    double m = p->sinks ? p->sinks[h] : -INFINITY, sum = 0;
    float kb[64], vb[64];
    for (int j = first; j <= pos; j++) {
        int64_t slot = (int64_t)tab[j / b->block_size] * b->block_size + j % b->block_size;
        const float *k = kv_key(kv, 0, slot, kvh, kb);
        double s = 0;
        for (int e = 0; e < p->head_dim_k; e++) s += (double)qh[e] * k[e];
        s *= p->scale;
        if (p->softcap > 0) s = p->softcap * tanh(s / p->softcap);
        m = fmax(m, s);
    }
    for (int d = 0; d < p->head_dim_v; d++) o[d] = 0;
    if (p->sinks) sum = exp(p->sinks[h] - m);
    for (int j = first; j <= pos; j++) {
        int64_t slot = (int64_t)tab[j / b->block_size] * b->block_size + j % b->block_size;
        const float *k = kv_key(kv, 0, slot, kvh, kb), *v = kv_value(kv, 0, slot, kvh, vb);
        double s = 0;
        for (int e = 0; e < p->head_dim_k; e++) s += (double)qh[e] * k[e];
        s *= p->scale;
        if (p->softcap > 0) s = p->softcap * tanh(s / p->softcap);
        double w = exp(s - m);
        sum += w;
        for (int d = 0; d < p->head_dim_v; d++) o[d] += w * v[d];
    }
    for (int d = 0; d < p->head_dim_v; d++) o[d] /= sum;
}

/* Sequences in groups sharing prefixes of random length (whole blocks, the
 * same block ids in every member's table), suffixes of their own, a
 * shuffled pool; rows: a decode row or a prefill chunk per sequence.
 * Cascade ("always" plan) vs the reference and vs the plain path. Returns
 * the groups the plan had. */
static int attn_run(const char *name, const AttnShape *sh, uint64_t seed, ThreadPool *tp) {
    enum { SEQS = 12, MAXB = 24 };
    int n_blocks = SEQS * MAXB + 8, bs = sh->bs, groups_seen = -1;
    KVCacheHost kv;
    Err err = {{0}};
    if (kv_cache_host_alloc(&kv, 1, sh->Hkv, sh->Dk, sh->Dv, bs, n_blocks, sh->dtype, &err)) {
        CHECK(0, "%s", err.msg);
        return -1;
    }
    int32_t perm[SEQS * MAXB + 8], tables[SEQS][MAXB], pos[512], seq[512];
    int64_t slot[512];
    const int32_t *tptr[SEQS];
    test_shuffle(perm, n_blocks, (uint32_t)seed);
    int next = 0, T = 0, prefix_of[4], len[SEQS];
    for (int g = 0; g < 4; g++) prefix_of[g] = 1 + (int)(rng_next(&seed) % 12); /* shared blocks of prefix g */
    int group_first[4][12];
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < prefix_of[g]; j++) group_first[g][j] = perm[next++];
    float kbuf[64], vbuf[64];
    for (int s = 0; s < SEQS; s++) {
        int g = (int)(rng_next(&seed) % 5); /* 4: no shared prefix */
        int pre = g < 4 ? prefix_of[g] : 0;
        len[s] = pre * bs + 1 + (int)(rng_next(&seed) % (bs * 6));
        for (int j = 0; j * bs < len[s] && j < MAXB; j++) tables[s][j] = j < pre ? group_first[g][j] : perm[next++];
        tptr[s] = tables[s];
        for (int j = pre * bs; j < len[s]; j++) { /* own keys; shared ones are written below, once */
            for (int e = 0; e < sh->Hkv * sh->Dk; e++) kbuf[e] = rng_float(&seed);
            for (int e = 0; e < sh->Hkv * sh->Dv; e++) vbuf[e] = rng_float(&seed);
            kv_cache_store(&kv, 0, (int64_t)tables[s][j / bs] * bs + j % bs, kbuf, vbuf);
        }
        int rows = rng_next(&seed) % 3 == 0 ? 1 + (int)(rng_next(&seed) % 5) : 1; /* a chunk ending at len - 1 */
        if (rows > len[s] - pre * bs) rows = len[s] - pre * bs;
        for (int i = 0; i < rows; i++, T++) seq[T] = s, pos[T] = len[s] - rows + i;
    }
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < prefix_of[g] * bs; j++) {
            for (int e = 0; e < sh->Hkv * sh->Dk; e++) kbuf[e] = rng_float(&seed);
            for (int e = 0; e < sh->Hkv * sh->Dv; e++) vbuf[e] = rng_float(&seed);
            kv_cache_store(&kv, 0, (int64_t)group_first[g][j / bs] * bs + j % bs, kbuf, vbuf);
        }
    for (int t = 0; t < T; t++) slot[t] = (int64_t)tptr[seq[t]][pos[t] / bs] * bs + pos[t] % bs;
    /* rows in a shuffled order: groups are not contiguous in the step */
    for (int t = T - 1; t > 0; t--) {
        int u = (int)(rng_next(&seed) % (uint64_t)(t + 1));
        int32_t a = pos[t], c = seq[t];
        int64_t sl = slot[t];
        pos[t] = pos[u], seq[t] = seq[u], slot[t] = slot[u];
        pos[u] = a, seq[u] = c, slot[u] = sl;
    }
    float sinks[16];
    for (int h = 0; h < sh->H; h++) sinks[h] = 2.0f * rng_float(&seed);
    AttnBatch b = {T, pos, seq, slot, SEQS, tptr, bs};
    AttnParams p = {sh->H, sh->Hkv, sh->Dk, sh->Dv, sh->scale, sh->cap, sh->window, sh->sinks ? sinks : NULL};
    int64_t nq = (int64_t)T * sh->H * sh->Dk, no = (int64_t)T * sh->H * sh->Dv;
    float *q = malloc(nq * sizeof *q), *out = malloc(no * sizeof *out), *flat = malloc(no * sizeof *flat);
    float *inl = malloc(no * sizeof *inl);
    for (int64_t i = 0; i < nq; i++) q[i] = 2.0f * rng_float(&seed);
    AttnCascadePlan pl;
    AttnCascadeOpts o = {.always = true, .n_workers = 2};
    if (q && out && flat && inl && attn_cascade_plan(&pl, &b, &p, &o, &err) == 0) {
        groups_seen = pl.n_groups;
        cpu_attention_cascade(tp, out, q, &kv, 0, &b, &p, &pl);
        cpu_attention(tp, flat, q, &kv, 0, &b, &p);
        cpu_attention_cascade(NULL, inl, q, &kv, 0, &b, &p, &pl);
        CHECK(!memcmp(out, inl, no * sizeof *out), "%s: pool and inline cascade results differ", name);
        double want[64];
        for (int t = 0; t < T; t++)
            for (int h = 0; h < sh->H; h++) {
                const float *got = out + ((int64_t)t * sh->H + h) * sh->Dv, *f = flat + ((int64_t)t * sh->H + h) * sh->Dv;
                double err_ref = 0, err_flat = 0, mag = 0;
                reference(&kv, &b, &p, q, t, h, want);
                for (int d = 0; d < sh->Dv; d++) {
                    err_ref = fmax(err_ref, fabs(got[d] - want[d]));
                    err_flat = fmax(err_flat, fabs(got[d] - f[d]));
                    mag = fmax(mag, fabs(want[d]));
                }
                double tol = sh->dtype == KV_DTYPE_FP8 ? 2e-5 : 1e-5;
                CHECK(err_ref <= tol * mag && err_flat <= tol * mag,
                      "%s row %d (seq %d pos %d group %d) head %d: |cascade - ref| %.3g, |cascade - plain| %.3g, "
                      "max |ref| %.3g", name, t, seq[t], pos[t], pl.group_of[t], h, err_ref, err_flat, mag);
            }
        attn_cascade_free(&pl);
    } else {
        CHECK(0, "%s: setup: %s", name, err.msg);
    }
    free(q);
    free(out);
    free(flat);
    free(inl);
    kv_cache_host_free(&kv);
    return groups_seen;
}

static void test_cascade_matches_reference(void) {
    ThreadPool *tp = thread_pool_create(3, NULL);
    const AttnShape shapes[] = {
        {4, 4, 16, 16, 4, 0, 0.25f, 0, false, KV_DTYPE_BF16},     /* multi-head */
        {8, 2, 16, 8, 4, 0, 0.25f, 0, false, KV_DTYPE_BF16},      /* GQA 4, Dv != Dk */
        {8, 1, 32, 32, 16, 0, 0.18f, 0, true, KV_DTYPE_BF16},     /* MQA, sinks */
        {4, 2, 16, 16, 8, 0, 0.5f, 3.0f, false, KV_DTYPE_BF16},   /* soft-cap */
        {4, 2, 16, 16, 4, 0, 0.5f, 2.0f, true, KV_DTYPE_BF16},    /* soft-cap and sinks */
        {4, 2, 16, 16, 4, 40, 0.25f, 0, true, KV_DTYPE_BF16},     /* a window: some rows group, some not */
        {8, 2, 16, 16, 4, 0, 0.25f, 0, true, KV_DTYPE_FP8},       /* an fp8 cache */
    };
    int cases = getenv("CLLM_QUICK") ? 4 : 12, grouped = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int c = 0; c < cases; c++) {
            char name[64];
            snprintf(name, sizeof name, "shape %zu case %d", k, c);
            grouped += attn_run(name, &shapes[k], 77 + 1000 * k + c, tp) > 0;
        }
    CHECK(grouped >= (int)(sizeof shapes / sizeof *shapes) * cases / 2, "only %d cases had a cascade group", grouped);
    thread_pool_destroy(tp);
}

/* ------------------------------------------------------------ the packed plan */

static void test_plan_pack(void) {
    PlanCase c;
    AttnCascadePlan pl;
    int shared[] = {8, 8, 8, 6, 6};
    plan_case(&c, 5, shared, 4);
    for (int j = 0; j < 6; j++) c.tables[3][j] = c.tables[4][j] = 200 + j;
    add_rows(&c, 0, 40, 1);
    add_rows(&c, 3, 30, 1);
    add_rows(&c, 1, 33, 1);
    add_rows(&c, 4, 24, 1);
    add_rows(&c, 2, 35, 1);
    CHECK(plan(&c, &pl) == 0 && pl.n_groups == 2, "%d groups", pl.n_groups);
    /* the plan's rows are every other row of a step of 12 (the others: prefill rows, say) */
    int32_t row_of[5] = {1, 3, 5, 7, 9}, buf[400];
    const int n_rows = 12;
    AttnCascadePackOpts o = {2, 2, 4, 8, 20, 3};
    AttnCascadeMeta m;
    Err err = {{0}};
    for (int i = 0; i < 400; i++) buf[i] = -7;
    CHECK(attn_cascade_pack(buf, 400, &m, &pl, &c.b, row_of, n_rows, &o, &err) == 0, "%s", err.msg);
    CHECK(m.len <= attn_cascade_pack_len(n_rows, &o), "len %d within the bound %lld", m.len,
          (long long)attn_cascade_pack_len(n_rows, &o));
    CHECK(m.n_members == 5 && m.n_units == 2 + 1, "%d members, %d units (3 x 2 pairs: 2 units of 4; 2 x 2: 1)",
          m.n_members, m.n_units);
    int covered[2] = {0, 0};
    for (int u = 0; u < m.n_units; u++) {
        int g = buf[m.off_units + 2 * u], p0 = buf[m.off_units + 2 * u + 1];
        CHECK(g >= 0 && g < 2 && p0 % 4 == 0 && p0 < pl.groups[g].n_rows * 2, "unit %d: group %d pair %d", u, g, p0);
        if (g >= 0 && g < 2) covered[g] += 4;
    }
    for (int g = 0; g < 2; g++) {
        const AttnCascadeGroup *G = &pl.groups[g];
        const int32_t *e = buf + m.off_groups + 5 * g;
        CHECK(covered[g] >= G->n_rows * 2 && covered[g] < G->n_rows * 2 + 4, "group %d: units cover its pairs", g);
        CHECK(e[0] == c.b.seq[pl.rows[G->row0]] && e[1] == G->n_blocks * 4 && e[2] == G->row0 && e[3] == G->n_rows * 2,
              "group %d: table %d keys %d member0 %d pairs %d", g, e[0], e[1], e[2], e[3]);
        int ns = (e[1] + e[4] - 1) / e[4];
        /* 3 units x 2 KV heads = 6 blocks, up to 20 wanted: 3 splits (at most 3); 32 or 24 keys in 8-key tiles */
        CHECK(e[4] % 8 == 0 && e[4] > 0 && ns <= 3 && ns <= m.n_splits && (ns - 1) * e[4] < e[1],
              "group %d: %d keys a split, %d splits of %d", g, e[4], ns, m.n_splits);
        for (int i = G->row0; i < G->row0 + G->n_rows; i++) {
            int t = row_of[pl.rows[i]];
            const int32_t *r = buf + m.off_rows + 3 * t;
            CHECK(buf[m.off_members + i] == t, "member %d: step row %d", i, buf[m.off_members + i]);
            CHECK(r[0] == pl.suffix_start[pl.rows[i]] && r[1] == i && r[2] == ns, "step row %d: %d %d %d", t, r[0],
                  r[1], r[2]);
        }
    }
    CHECK(m.n_splits == 3, "the grid's splits: %d", m.n_splits);
    /* room for 8 splits: still 3, the 20 blocks' one wave rounded down (20 / 6), never a partial second one */
    AttnCascadePackOpts wide = o;
    wide.max_splits = 8;
    AttnCascadeMeta mw;
    CHECK(attn_cascade_pack(buf, 400, &mw, &pl, &c.b, row_of, n_rows, &wide, &err) == 0 && mw.n_splits == 3,
          "splits with room for 8: %d (%s)", mw.n_splits, err.msg);
    CHECK(attn_cascade_pack(buf, 400, &m, &pl, &c.b, row_of, n_rows, &o, &err) == 0, "%s", err.msg);
    for (int t = 0; t < n_rows; t += 2) {
        const int32_t *r = buf + m.off_rows + 3 * t;
        CHECK(r[0] == 0 && r[1] == -1 && r[2] == 0, "step row %d outside the plan: %d %d %d", t, r[0], r[1], r[2]);
    }
    CHECK(attn_cascade_pack(buf, m.len - 1, &m, &pl, &c.b, row_of, n_rows, &o, &err) && strstr(err.msg, "exceed"),
          "a buffer one short: %s", err.msg);
    o.max_splits = 0;
    CHECK(attn_cascade_pack(buf, 400, &m, &pl, &c.b, row_of, n_rows, &o, &err) && strstr(err.msg, "bad options"),
          "no splits allowed: %s", err.msg);
    attn_cascade_free(&pl);
}

static void test_cascade_knob(void) {
    AttnCascadeMode m;
    Err err = {{0}};
    CHECK(attn_cascade_mode(NULL, &m, &err) == 0 && m == ATTN_CASCADE_ON, "unset: on");
    CHECK(attn_cascade_mode("", &m, &err) == 0 && m == ATTN_CASCADE_ON, "empty: on");
    CHECK(attn_cascade_mode("off", &m, &err) == 0 && m == ATTN_CASCADE_OFF, "off");
    CHECK(attn_cascade_mode("on", &m, &err) == 0 && m == ATTN_CASCADE_ON, "on");
    CHECK(attn_cascade_mode("always", &m, &err) == 0 && m == ATTN_CASCADE_ALWAYS, "always");
    CHECK(attn_cascade_mode("0", &m, &err) && strstr(err.msg, "CLLM_CASCADE") && strstr(err.msg, "'0'"), "bad: %s",
          err.msg);
}

int main(void) {
    RUN(test_rule_edges);
    RUN(test_plan_one_sequence);
    RUN(test_plan_two_sequences);
    RUN(test_plan_partial_block);
    RUN(test_plan_boundary_choice);
    RUN(test_plan_window);
    RUN(test_plan_mixed);
    RUN(test_plan_errors);
    RUN(test_cascade_matches_reference);
    RUN(test_plan_pack);
    RUN(test_cascade_knob);
    TEST_EXIT();
}
