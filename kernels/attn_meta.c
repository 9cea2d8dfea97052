/* attn_meta.c — runs, tiles, decode rows and the flattened block table of
 * one attention step (attention/attn_meta.h). */
#include "kernels/attn_meta.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t seq, pos;
} SeqPos;

static int cmp_seqpos(const void *a, const void *b) {
    const SeqPos *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Row-level checks, and the blocks each sequence needs (max pos / bs + 1). */
static int check_rows(const AttnBatch *b, int *need, int *max_kv, Err *err) {
    if (b->n_tokens < 0 || b->n_seqs < 0) return err_set(err, "attn_meta: n_tokens %d / n_seqs %d negative", b->n_tokens, b->n_seqs);
    if (b->block_size <= 0) return err_set(err, "attn_meta: block_size %d must be positive", b->block_size);
    *max_kv = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int s = b->seq[t], p = b->pos[t];
        if (s < 0 || s >= b->n_seqs) return err_set(err, "attn_meta: row %d: seq %d outside [0, %d)", t, s, b->n_seqs);
        if (p < 0) return err_set(err, "attn_meta: row %d: position %d is negative", t, p);
        if (p / b->block_size + 1 > need[s]) need[s] = p / b->block_size + 1;
        if (p + 1 > *max_kv) *max_kv = p + 1;
    }
    SeqPos *sp = malloc((size_t)(b->n_tokens ? b->n_tokens : 1) * sizeof *sp);
    if (!sp) return err_set(err, "attn_meta: out of memory (%d rows)", b->n_tokens);
    for (int t = 0; t < b->n_tokens; t++) sp[t] = (SeqPos){b->seq[t], b->pos[t]};
    qsort(sp, (size_t)b->n_tokens, sizeof *sp, cmp_seqpos);
    for (int t = 1; t < b->n_tokens; t++)
        if (sp[t].seq == sp[t - 1].seq && sp[t].pos == sp[t - 1].pos) {
            int s = sp[t].seq, p = sp[t].pos;
            free(sp);
            return err_set(err, "attn_meta: sequence %d has two rows at position %d in one step", s, p);
        }
    free(sp);
    return 0;
}

/* Splits rows into runs: a run continues while the sequence is the same and
 * the position goes up by one. */
static int build_runs(AttnMeta *m, const AttnBatch *b, Err *err) {
    m->runs = malloc((size_t)(b->n_tokens ? b->n_tokens : 1) * sizeof *m->runs);
    if (!m->runs) return err_set(err, "attn_meta: out of memory (%d rows)", b->n_tokens);
    for (int t = 0; t < b->n_tokens; t++) {
        AttnRun *r = m->n_runs ? &m->runs[m->n_runs - 1] : NULL;
        if (r && r->seq == b->seq[t] && r->pos0 + r->q_len == b->pos[t]) {
            r->q_len++;
            continue;
        }
        m->runs[m->n_runs++] = (AttnRun){t, 1, b->pos[t], b->seq[t]};
    }
    for (int i = 0; i < m->n_runs; i++) {
        if (m->runs[i].q_len > 1) {
            m->n_prefill++;
            m->n_tiles += (m->runs[i].q_len + ATTN_TILE_M - 1) / ATTN_TILE_M;
        } else {
            m->n_decode++;
        }
    }
    return 0;
}

static int fill_tables(AttnMeta *m, const AttnBatch *b, const int *need, const AttnMetaOpts *o, Err *err) {
    int32_t *tab = m->buf + m->off_tables;
    for (int s = 0; s < b->n_seqs; s++) {
        if (need[s] && !b->block_tables[s]) return err_set(err, "attn_meta: sequence %d has rows but no block table", s);
        for (int j = 0; j < need[s]; j++) {
            int32_t id = b->block_tables[s][j];
            if (id < 0 || id >= o->n_cache_blocks)
                return err_set(err, "attn_meta: sequence %d block %d: id %d outside the cache [0, %d)", s, j, id,
                               o->n_cache_blocks);
            tab[(int64_t)s * m->table_width + j] = id;
        }
    }
    return 0;
}

static void fill_work(AttnMeta *m) {
    int32_t *pre = m->buf + m->off_prefill, *tiles = m->buf + m->off_tiles, *dec = m->buf + m->off_decode;
    int ip = 0, it = 0, id = 0;
    for (int i = 0; i < m->n_runs; i++) {
        const AttnRun *r = &m->runs[i];
        if (r->q_len == 1) {
            int32_t *d = dec + 3 * id++;
            d[0] = r->q_start, d[1] = r->seq, d[2] = r->pos0;
            continue;
        }
        int32_t *p = pre + 4 * ip;
        p[0] = r->q_start, p[1] = r->q_len, p[2] = r->pos0, p[3] = r->seq;
        for (int m0 = 0; m0 < r->q_len; m0 += ATTN_TILE_M, it++) tiles[2 * it] = ip, tiles[2 * it + 1] = m0;
        ip++;
    }
}

int attn_meta_build(AttnMeta *m, const AttnBatch *b, const AttnMetaOpts *o, Err *err) {
    memset(m, 0, sizeof *m);
    if (o->n_cache_blocks <= 0) return err_set(err, "attn_meta: n_cache_blocks %d must be positive", o->n_cache_blocks);
    int *need = calloc((size_t)(b->n_seqs > 0 ? b->n_seqs : 1), sizeof *need);
    if (!need) return err_set(err, "attn_meta: out of memory (%d sequences)", b->n_seqs);
    int rc = check_rows(b, need, &m->max_kv_len, err);
    int width = 1;
    for (int s = 0; !rc && s < b->n_seqs; s++) width = need[s] > width ? need[s] : width;
    if (!rc && o->table_width > 0 && o->table_width < width)
        rc = err_set(err, "attn_meta: a sequence needs %d blocks, more than table_width %d", width, o->table_width);
    if (!rc) rc = build_runs(m, b, err);
    if (!rc) {
        m->n_tokens = b->n_tokens, m->n_seqs = b->n_seqs, m->block_size = b->block_size;
        m->table_width = o->table_width > 0 ? o->table_width : width;
        m->off_prefill = 0;
        m->off_tiles = m->off_prefill + 4 * m->n_prefill;
        m->off_decode = m->off_tiles + 2 * m->n_tiles;
        m->off_tables = m->off_decode + 3 * m->n_decode;
        int64_t len = m->off_tables + (int64_t)m->n_seqs * m->table_width;
        if (len > (1 << 30)) rc = err_set(err, "attn_meta: %d sequences x %d blocks is too large", m->n_seqs, m->table_width);
        m->buf_len = (int)len;
        if (!rc && !(m->buf = calloc((size_t)(len ? len : 1), sizeof *m->buf)))
            rc = err_set(err, "attn_meta: out of memory (%lld values)", (long long)len);
    }
    if (!rc) rc = fill_tables(m, b, need, o, err);
    if (!rc) fill_work(m);
    free(need);
    if (rc) attn_meta_free(m);
    return rc;
}

void attn_meta_free(AttnMeta *m) {
    free(m->runs);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

int attn_decode_splits(int max_ctx, int n_decode, int n_kv_heads, int n_head_groups, int resident) {
    int64_t base = (int64_t)n_decode * n_kv_heads * n_head_groups;
    if (base <= 0 || max_ctx <= 0) return 1;
    /* One wave of the kernel's resident blocks, rounded down: a block pays a
     * fixed start (its ring's first tiles, Q) and end (partials, the merge),
     * so fewer, longer splits win as long as every slot has a block, and a
     * second, partial wave costs a whole split's time. H200, 32q/8kv hd128,
     * bench_attention decode (bf16: 2 blocks an SM, 264 slots; fp8: 3, 396):
     * bf16 8x4096 4 splits 2.66 TB/s vs 6 1.96 and 16 1.85; 8x32768 4: 3.47
     * vs 6: 2.64; 1x131072 33: 3.03 vs 48: 2.25. fp8 8x4096 6: 0.0500 ms vs 4:
     * 0.0546; 8x32768 6: 0.260 vs 4: 0.319; 1x131072 48: 0.159 vs 32: 0.184. */
    int64_t want = resident / base;
    int64_t tiles = (max_ctx + ATTN_DECODE_TILE_N - 1) / ATTN_DECODE_TILE_N;
    int64_t most = tiles / 4 > 1 ? tiles / 4 : 1;            /* >= 4 tiles per split */
    int64_t s = want < most ? want : most;
    if (s > 256) s = 256;
    return s < 1 ? 1 : (int)s;
}

int64_t attn_rows_grid_warps(int64_t items, int resident_warps) {
    if (items <= resident_warps) return items;
    int64_t rounds = (items + resident_warps - 1) / resident_warps;
    return (items + rounds - 1) / rounds;
}

int attn_decode_row_splits_max(const AttnMeta *m) {
    int most = 1;
    for (int d = 0; d < m->n_decode; d++) {
        int64_t pos = m->buf[m->off_decode + 3 * d + 2];
        int tiles = (int)((pos + ATTN_DECODE_TILE_N) / ATTN_DECODE_TILE_N); /* keys 0..pos */
        int s = attn_row_splits(tiles, ATTN_SPLIT_TILES);
        most = s > most ? s : most;
    }
    return most;
}
