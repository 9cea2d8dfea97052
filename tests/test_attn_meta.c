/* test_attn_meta.c — runs, tiles, decode rows, the flattened block table and
 * the validation of attention/attn_meta.c, on hand-built batches. */
#include "kernels/attn_meta.h"
#include "tests/test.h"

/* seq 0: prefill rows at positions 0..N0-1 (two tiles); seq 1: one decode row
 * at 100; seq 2: a chunk at 10..12 (chunked prefill); seq 3: decode at 0. */
enum { N0 = ATTN_TILE_M + 6, NEED0 = (N0 - 1) / 16 + 1, T_MIX = N0 + 1 + 3 + 1 };
static int32_t pos_mix[T_MIX], seq_mix[T_MIX];
static int64_t slot_mix[T_MIX];
static const int32_t tab0[] = {7, 3, 9, 1, 15, 14, 16, 17, 18}, tab1[] = {2, 4, 5, 6, 8, 10, 11}, tab2[] = {12}, tab3[] = {13};
static const int32_t *const tabs[] = {tab0, tab1, tab2, tab3};

static AttnBatch mix_batch(void) {
    int t = 0;
    for (int p = 0; p < N0; p++) pos_mix[t] = p, seq_mix[t++] = 0;
    pos_mix[t] = 100, seq_mix[t++] = 1;
    for (int p = 10; p < 13; p++) pos_mix[t] = p, seq_mix[t++] = 2;
    pos_mix[t] = 0, seq_mix[t++] = 3;
    return (AttnBatch){T_MIX, pos_mix, seq_mix, slot_mix, 4, tabs, 16};
}

static void test_mixed_batch(void) {
    AttnBatch b = mix_batch();
    AttnMeta m;
    Err err = {{0}};
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){19, 0}, &err) == 0, "%s", err.msg);
    CHECK(m.n_runs == 4 && m.n_prefill == 2 && m.n_decode == 2, "runs %d prefill %d decode %d", m.n_runs, m.n_prefill,
          m.n_decode);
    CHECK(m.n_tiles == 2 + 1, "tiles %d", m.n_tiles);
    int width = NEED0 > 7 ? NEED0 : 7; /* seq 1 needs 100/16+1 = 7 */
    CHECK(m.table_width == width, "width %d", m.table_width);
    CHECK(m.max_kv_len == (N0 > 101 ? N0 : 101), "max kv %d", m.max_kv_len);
    const int32_t *pre = m.buf + m.off_prefill, *til = m.buf + m.off_tiles, *dec = m.buf + m.off_decode;
    CHECK(pre[0] == 0 && pre[1] == N0 && pre[2] == 0 && pre[3] == 0, "run 0: %d %d %d %d", pre[0], pre[1], pre[2], pre[3]);
    CHECK(pre[4] == N0 + 1 && pre[5] == 3 && pre[6] == 10 && pre[7] == 2, "run 1: %d %d %d %d", pre[4], pre[5], pre[6], pre[7]);
    CHECK(til[0] == 0 && til[1] == 0 && til[2] == 0 && til[3] == ATTN_TILE_M && til[4] == 1 && til[5] == 0,
          "tiles %d,%d %d,%d %d,%d", til[0], til[1], til[2], til[3], til[4], til[5]);
    CHECK(dec[0] == N0 && dec[1] == 1 && dec[2] == 100, "decode 0: %d %d %d", dec[0], dec[1], dec[2]);
    CHECK(dec[3] == N0 + 4 && dec[4] == 3 && dec[5] == 0, "decode 1: %d %d %d", dec[3], dec[4], dec[5]);
    const int32_t *tab = m.buf + m.off_tables;
    CHECK(tab[0] == 7 && tab[NEED0 - 1] == tab0[NEED0 - 1], "seq 0: %d %d", tab[0], tab[NEED0 - 1]);
    CHECK(NEED0 == width || tab[NEED0] == 0, "padding after seq 0's blocks: %d", tab[NEED0]);
    CHECK(tab[width + 6] == 11 && tab[2 * width] == 12 && tab[3 * width] == 13, "tables %d %d %d", tab[width + 6],
          tab[2 * width], tab[3 * width]);
    CHECK(m.buf_len == m.off_tables + 4 * width, "buf_len %d", m.buf_len);
    attn_meta_free(&m);
}

/* Positions that jump, or a sequence change, start a new run. */
static void test_run_breaks(void) {
    int32_t pos[] = {5, 6, 8, 9, 0, 1};
    int32_t seq[] = {0, 0, 0, 0, 1, 1};
    int32_t t0[] = {0}, t1[] = {1};
    const int32_t *const tb[] = {t0, t1};
    AttnBatch b = {6, pos, seq, NULL, 2, tb, 16};
    AttnMeta m;
    Err err = {{0}};
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){2, 4}, &err) == 0, "%s", err.msg);
    CHECK(m.n_runs == 3 && m.n_prefill == 3 && m.n_decode == 0, "runs %d prefill %d", m.n_runs, m.n_prefill);
    CHECK(m.runs[1].q_start == 2 && m.runs[1].pos0 == 8 && m.runs[1].q_len == 2, "run 1 %d %d %d", m.runs[1].q_start,
          m.runs[1].pos0, m.runs[1].q_len);
    CHECK(m.table_width == 4, "fixed width %d", m.table_width);
    CHECK(m.buf[m.off_tables + 4] == 1 && m.buf[m.off_tables + 5] == 0, "seq 1 row: %d, padding 0",
          m.buf[m.off_tables + 4]);
    attn_meta_free(&m);
}

/* A decode-only step: offsets depend on n_decode and the width alone (graph replay). */
static void test_decode_only_offsets(void) {
    int32_t pos[] = {40, 3}, seq[] = {1, 0};
    int32_t t0[] = {0}, t1[] = {1, 2, 3};
    const int32_t *const tb[] = {t0, t1};
    AttnBatch b = {2, pos, seq, NULL, 2, tb, 16};
    AttnMeta m;
    Err err = {{0}};
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){4, 8}, &err) == 0, "%s", err.msg);
    CHECK(m.n_tiles == 0 && m.n_decode == 2 && m.off_decode == 0 && m.off_tables == 6, "off %d %d", m.off_decode,
          m.off_tables);
    attn_meta_free(&m);
}

static void expect_error(AttnBatch b, int n_blocks, int width, const char *what) {
    AttnMeta m;
    Err err = {{0}};
    int rc = attn_meta_build(&m, &b, &(AttnMetaOpts){n_blocks, width}, &err);
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(rc == -1 && strstr(err.msg, what), "wanted '%s' in '%s'", what, err.msg);
}

static void test_errors(void) {
    int32_t t0[] = {0, 1}, bad[] = {0, 99};
    const int32_t *const tb[] = {t0}, *const tbad[] = {bad}, *const tnull[] = {NULL};
    int32_t pos[] = {3, 4, 3}, seq[] = {0, 0, 0};
    expect_error((AttnBatch){3, pos, seq, NULL, 1, tb, 16}, 4, 0, "two rows at position 3");
    int32_t neg[] = {-1}, s1[] = {1}, s0[] = {0}, far[] = {20};
    expect_error((AttnBatch){1, neg, s0, NULL, 1, tb, 16}, 4, 0, "negative");
    expect_error((AttnBatch){1, far, s1, NULL, 1, tb, 16}, 4, 0, "seq 1 outside");
    expect_error((AttnBatch){1, far, s0, NULL, 1, tbad, 16}, 4, 0, "id 99 outside the cache");
    expect_error((AttnBatch){1, far, s0, NULL, 1, tb, 16}, 4, 1, "more than table_width 1");
    expect_error((AttnBatch){1, far, s0, NULL, 1, tnull, 16}, 4, 0, "no block table");
    expect_error((AttnBatch){1, far, s0, NULL, 1, tb, 0}, 4, 0, "block_size 0");
    expect_error((AttnBatch){1, far, s0, NULL, 1, tb, 16}, 0, 0, "n_cache_blocks 0");
}

static void test_empty_step(void) {
    AttnBatch b = {0, NULL, NULL, NULL, 0, NULL, 16};
    AttnMeta m;
    Err err = {{0}};
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){1, 0}, &err) == 0, "%s", err.msg);
    CHECK(m.n_runs == 0 && m.n_tiles == 0 && m.n_decode == 0, "empty");
    attn_meta_free(&m);
}

static void test_decode_splits(void) {
    /* 8 rows x 8 KV heads = 64 blocks: one wave of 264 resident blocks (2 an SM x 132) is floor(264 / 64) = 4 splits */
    CHECK(attn_decode_splits(32768, 8, 8, 1, 264) == 4, "%d", attn_decode_splits(32768, 8, 8, 1, 264));
    /* one row: 8 blocks a split, 33 splits fill the wave */
    CHECK(attn_decode_splits(32768, 1, 8, 1, 264) == 33, "%d", attn_decode_splits(32768, 1, 8, 1, 264));
    /* more units than slots: one split */
    CHECK(attn_decode_splits(32768, 64, 8, 1, 264) == 1, "%d", attn_decode_splits(32768, 64, 8, 1, 264));
    /* a short context caps the splits at four tiles each: 1024 keys = 16 tiles -> 4 */
    CHECK(attn_decode_splits(1024, 1, 1, 1, 264) == 4, "%d", attn_decode_splits(1024, 1, 1, 1, 264));
    CHECK(attn_decode_splits(10, 1, 1, 1, 264) == 1, "tiny");
    CHECK(attn_decode_splits(1 << 20, 1, 1, 1, 264) == 256, "capped");
    CHECK(attn_decode_splits(4096, 0, 8, 1, 264) == 1, "no rows");
    /* the fp8 kernel's 3 blocks an SM (396 resident): 8 x 8 -> 6 splits, one row -> 49 */
    CHECK(attn_decode_splits(32768, 8, 8, 1, 396) == 6, "%d", attn_decode_splits(32768, 8, 8, 1, 396));
    CHECK(attn_decode_splits(131072, 1, 8, 1, 396) == 49, "%d", attn_decode_splits(131072, 1, 8, 1, 396));
}

/* The many-rows grid: a warp an item where they fit, else even rounds. */
static void test_rows_grid(void) {
    CHECK(attn_rows_grid_warps(1024, 1584) == 1024 && attn_rows_grid_warps(1584, 1584) == 1584, "fits");
    /* 256 rows x 8 KV heads on fp8's 1584 warps: two rounds of 1024, not 1584 then 464 */
    CHECK(attn_rows_grid_warps(2048, 1584) == 1024, "%lld", (long long)attn_rows_grid_warps(2048, 1584));
    CHECK(attn_rows_grid_warps(2048, 1056) == 1024, "%lld", (long long)attn_rows_grid_warps(2048, 1056));
    CHECK(attn_rows_grid_warps(2049, 1024) == 683, "%lld", (long long)attn_rows_grid_warps(2049, 1024)); /* 3 rounds */
    CHECK(attn_rows_grid_warps(1585, 1584) == 793, "%lld", (long long)attn_rows_grid_warps(1585, 1584));
    for (int64_t items = 1; items < 5000; items += 37) { /* never more warps than the GPU holds, nor rounds than needed */
        int64_t w = attn_rows_grid_warps(items, 528), rounds = (items + 527) / 528;
        CHECK(w >= 1 && w <= 528 && (items + w - 1) / w == rounds, "%lld items: %lld warps", (long long)items,
              (long long)w);
    }
}

/* Batch-invariant splits: from a row's own tiles (4 per split, at most 64
 * splits), never from the other rows of the step. */
static void test_row_splits(void) {
    CHECK(attn_row_splits(1, ATTN_SPLIT_TILES) == 1, "one tile");
    CHECK(attn_row_splits(4, ATTN_SPLIT_TILES) == 1, "four tiles: one split");
    CHECK(attn_row_splits(5, ATTN_SPLIT_TILES) == 2, "five tiles: two");
    CHECK(attn_row_splits(64, ATTN_SPLIT_TILES) == 16, "4096 keys: %d", attn_row_splits(64, ATTN_SPLIT_TILES));
    CHECK(attn_row_splits(1 << 20, ATTN_SPLIT_TILES) == ATTN_MAX_SPLITS, "capped");
    CHECK(attn_row_splits(0, ATTN_SPLIT_TILES) == 1 && attn_row_splits(9, 0) == 1, "degenerate");
    /* smaller splits: still one split up to ATTN_SPLIT_TILES tiles (no merge for a short row) */
    CHECK(attn_row_splits(ATTN_SPLIT_TILES, 2) == 1, "short row, small splits: %d", attn_row_splits(ATTN_SPLIT_TILES, 2));
    CHECK(attn_row_splits(ATTN_SPLIT_TILES + 1, 2) == 3, "five tiles, splits of two: %d",
          attn_row_splits(ATTN_SPLIT_TILES + 1, 2));
    CHECK(attn_row_splits(9, 2) == 5 && attn_row_splits(1 << 20, 2) == ATTN_MAX_SPLITS, "splits of two");
    /* a step's most: decode rows at positions 255 (256 keys: 4 tiles, 1 split)
     * and 256 (5 tiles, 2 splits) beside a prefill run that is not counted */
    int32_t pos[4] = {255, 0, 1, 256}, seq[4] = {0, 1, 1, 2};
    int32_t t0[17], t1[1] = {0}, t2[17];
    for (int i = 0; i < 17; i++) t0[i] = i, t2[i] = 17 + i;
    const int32_t *tb[3] = {t0, t1, t2};
    AttnBatch b = {4, pos, seq, NULL, 3, tb, 16};
    AttnMeta m;
    Err err = {{0}};
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){64, 0}, &err) == 0, "%s", err.msg);
    CHECK(m.n_decode == 2 && attn_decode_row_splits_max(&m) == 2, "%d decode rows, most %d", m.n_decode,
          attn_decode_row_splits_max(&m));
    attn_meta_free(&m);
    b.n_tokens = 3; /* without the row at 256 */
    CHECK(attn_meta_build(&m, &b, &(AttnMetaOpts){64, 0}, &err) == 0, "%s", err.msg);
    CHECK(attn_decode_row_splits_max(&m) == 1, "most %d", attn_decode_row_splits_max(&m));
    attn_meta_free(&m);
    AttnBatch none = {0, NULL, NULL, NULL, 0, NULL, 16};
    CHECK(attn_meta_build(&m, &none, &(AttnMetaOpts){1, 0}, &err) == 0 && attn_decode_row_splits_max(&m) == 1,
          "no decode rows");
    attn_meta_free(&m);
}

int main(void) {
    RUN(test_mixed_batch);
    RUN(test_run_breaks);
    RUN(test_decode_only_offsets);
    RUN(test_errors);
    RUN(test_empty_step);
    RUN(test_decode_splits);
    RUN(test_rows_grid);
    RUN(test_row_splits);
    TEST_EXIT();
}
