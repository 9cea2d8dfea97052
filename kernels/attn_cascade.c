/* attn_cascade.c — groups of rows sharing a prefix of KV blocks, and the rule
 * for when attending to it once per group pays (attn_cascade.h).
 *
 * Grouping: each sequence with rows is a string of block ids, truncated at
 * its cap, the most full blocks all its rows attend to entirely (min pos /
 * block_size; 0 on a windowed layer where a row's window misses key 0).
 * Sorted lexicographically, the sequences sharing a first block form a run,
 * and the common prefix of any contiguous range of a run is the smallest
 * common prefix of its adjacent pairs. In each run the group is the range
 * that saves the most block reads, (sequences - 1) * shared blocks; what is
 * left of the run on either side is grouped the same way. */
#include "kernels/attn_cascade.h"

#include <stdlib.h>
#include <string.h>

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool attn_cascade_pays(const AttnCascadeCost *c) {
    if (c->shared_tokens < ATTN_CASCADE_MIN_SHARED || c->n_seqs < 2) return false;
    int64_t workers = c->n_workers > 0 ? c->n_workers : 1, unit = c->rows_per_unit > 0 ? c->rows_per_unit : 1;
    int64_t kv = c->n_kv_heads > 0 ? c->n_kv_heads : 1, q_per_kv = c->n_heads > kv ? c->n_heads / kv : 1;
    int64_t tiles = ceil_div(c->shared_tokens, c->keys_per_tile > 0 ? c->keys_per_tile : 1);
    int64_t flat = ceil_div((int64_t)c->n_seqs * kv * tiles, workers);
    int64_t units = kv * ceil_div((int64_t)c->n_rows * q_per_kv, unit);
    int64_t cascade = ceil_div(units, workers) * tiles + 1; /* + the merge */
    return cascade < flat;
}

/* One sequence with rows: its table truncated at cap blocks. */
typedef struct {
    const int32_t *table;
    int32_t seq, cap, n_rows;
} SeqTable;

static int cmp_table(const void *a, const void *b) {
    const SeqTable *x = a, *y = b;
    int n = x->cap < y->cap ? x->cap : y->cap;
    for (int i = 0; i < n; i++)
        if (x->table[i] != y->table[i]) return x->table[i] < y->table[i] ? -1 : 1;
    if (x->cap != y->cap) return x->cap < y->cap ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int common_blocks(const SeqTable *x, const SeqTable *y) {
    int n = x->cap < y->cap ? x->cap : y->cap, i = 0;
    while (i < n && x->table[i] == y->table[i]) i++;
    return i;
}

/* Per-sequence row counts and caps (cap[] holds the smallest position until
 * the last loop turns it into the cap); checks the rows. */
static int seq_caps(const AttnBatch *b, const AttnParams *p, int32_t *cap, int32_t *max_pos, int32_t *n_rows,
                    Err *err) {
    int32_t *min_pos = cap;
    if (b->block_size <= 0) return err_set(err, "attn_cascade: block_size %d must be positive", b->block_size);
    for (int s = 0; s < b->n_seqs; s++) min_pos[s] = INT32_MAX, max_pos[s] = -1, n_rows[s] = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int s = b->seq[t], pos = b->pos[t];
        if (s < 0 || s >= b->n_seqs) return err_set(err, "attn_cascade: row %d: seq %d outside [0, %d)", t, s, b->n_seqs);
        if (pos < 0) return err_set(err, "attn_cascade: row %d: position %d is negative", t, pos);
        if (!b->block_tables[s]) return err_set(err, "attn_cascade: row %d: sequence %d has no block table", t, s);
        if (pos < min_pos[s]) min_pos[s] = pos;
        if (pos > max_pos[s]) max_pos[s] = pos;
        n_rows[s]++;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        bool window_misses_key0 = p->window > 0 && max_pos[s] >= p->window;
        cap[s] = n_rows[s] == 0 || window_misses_key0 ? 0 : min_pos[s] / b->block_size;
    }
    return 0;
}

/* Groups the range [a, e) of sorted sequences (one run of a first block) into
 * seq_group[], appending to pl->groups; the adjacent common prefixes are
 * lcp[i] = common blocks of st[i] and st[i + 1]. */
static void group_run(AttnCascadePlan *pl, const SeqTable *st, const int32_t *lcp, int a, int e,
                      int32_t *seq_group, const AttnBatch *b, const AttnParams *p, const AttnCascadeOpts *o) {
    while (e - a >= 2) {
        int64_t best = 0;
        int bl = -1, br = -1, bp = 0; /* members st[bl..br], sharing bp blocks */
        for (int l = a; l < e - 1; l++) {
            int shared = lcp[l];
            for (int r = l + 1; r < e && shared > 0; r++) {
                if (lcp[r - 1] < shared) shared = lcp[r - 1];
                if ((int64_t)(r - l) * shared > best) best = (int64_t)(r - l) * shared, bl = l, br = r, bp = shared;
            }
        }
        if (bl < 0) return;
        AttnCascadeGroup g = {bp, st[bl].table, 0, 0, br - bl + 1};
        for (int i = bl; i <= br; i++) g.n_rows += st[i].n_rows;
        AttnCascadeCost c = {bp * b->block_size, g.n_seqs, g.n_rows, p->n_heads, p->n_kv_heads,
                             o->n_workers, o->rows_per_unit, o->keys_per_tile};
        if (o->always || attn_cascade_pays(&c)) {
            for (int i = bl; i <= br; i++) seq_group[st[i].seq] = pl->n_groups;
            pl->groups[pl->n_groups++] = g;
        }
        /* what is left: the larger side first, the other on the next pass */
        if (bl - a >= 2) group_run(pl, st, lcp, a, bl, seq_group, b, p, o);
        a = br + 1;
    }
}

/* The member rows of each group, in step order, and every row's suffix start. */
static void fill_rows(AttnCascadePlan *pl, const AttnBatch *b, const int32_t *seq_group) {
    int next = 0;
    for (int g = 0; g < pl->n_groups; g++) {
        AttnCascadeGroup *gr = &pl->groups[g];
        gr->row0 = next;
        for (int t = 0; t < b->n_tokens; t++)
            if (seq_group[b->seq[t]] == g) pl->rows[next++] = t;
        gr->n_rows = next - gr->row0;
    }
    for (int t = 0; t < b->n_tokens; t++) {
        int g = seq_group[b->seq[t]];
        pl->group_of[t] = g;
        pl->suffix_start[t] = g < 0 ? 0 : pl->groups[g].n_blocks * b->block_size;
    }
}

int attn_cascade_plan(AttnCascadePlan *pl, const AttnBatch *b, const AttnParams *p, const AttnCascadeOpts *o,
                      Err *err) {
    memset(pl, 0, sizeof *pl);
    if (b->n_tokens < 0 || b->n_seqs < 0) return err_set(err, "attn_cascade: n_tokens %d / n_seqs %d negative", b->n_tokens, b->n_seqs);
    size_t S = (size_t)(b->n_seqs ? b->n_seqs : 1), T = (size_t)(b->n_tokens ? b->n_tokens : 1);
    int32_t *cap = malloc(S * sizeof *cap), *max_pos = malloc(S * sizeof *max_pos), *n_rows = malloc(S * sizeof *n_rows);
    int32_t *seq_group = malloc(S * sizeof *seq_group), *lcp = malloc(S * sizeof *lcp);
    SeqTable *st = malloc(S * sizeof *st);
    pl->groups = malloc(S * sizeof *pl->groups);
    pl->rows = malloc(T * sizeof *pl->rows);
    pl->group_of = malloc(T * sizeof *pl->group_of);
    pl->suffix_start = malloc(T * sizeof *pl->suffix_start);
    int rc = 0;
    if (!cap || !max_pos || !n_rows || !seq_group || !lcp || !st || !pl->groups || !pl->rows || !pl->group_of ||
        !pl->suffix_start)
        rc = err_set(err, "attn_cascade: out of memory (%d rows, %d sequences)", b->n_tokens, b->n_seqs);
    if (!rc) rc = seq_caps(b, p, cap, max_pos, n_rows, err);
    if (!rc) {
        pl->n_tokens = b->n_tokens;
        int n = 0;
        for (int s = 0; s < b->n_seqs; s++) {
            seq_group[s] = -1;
            if (cap[s] > 0) st[n++] = (SeqTable){b->block_tables[s], s, cap[s], n_rows[s]};
        }
        qsort(st, (size_t)n, sizeof *st, cmp_table);
        for (int i = 0; i + 1 < n; i++) lcp[i] = common_blocks(&st[i], &st[i + 1]);
        for (int a = 0, e; a < n; a = e) { /* runs of one first block */
            for (e = a + 1; e < n && lcp[e - 1] > 0; e++) {}
            group_run(pl, st, lcp, a, e, seq_group, b, p, o);
        }
        fill_rows(pl, b, seq_group);
    }
    free(cap);
    free(max_pos);
    free(n_rows);
    free(seq_group);
    free(lcp);
    free(st);
    if (rc) attn_cascade_free(pl);
    return rc;
}

void attn_cascade_free(AttnCascadePlan *pl) {
    free(pl->groups);
    free(pl->rows);
    free(pl->group_of);
    free(pl->suffix_start);
    memset(pl, 0, sizeof *pl);
}

int attn_cascade_mode(const char *v, AttnCascadeMode *mode, Err *err) {
    if (!v || !*v || !strcmp(v, "on")) *mode = ATTN_CASCADE_ON;
    else if (!strcmp(v, "off")) *mode = ATTN_CASCADE_OFF;
    else if (!strcmp(v, "always")) *mode = ATTN_CASCADE_ALWAYS;
    else return err_set(err, "CLLM_CASCADE: '%.64s' is not off, on or always", v);
    return 0;
}

/* units: at most one a group more than the pairs need, groups: at most n / 2 */
int64_t attn_cascade_pack_len(int n_rows, const AttnCascadePackOpts *o) {
    int64_t n = n_rows > 0 ? n_rows : 0, unit = o->unit_pairs > 0 ? o->unit_pairs : 1;
    return 2 * (ceil_div(n * (o->q_per_kv > 0 ? o->q_per_kv : 1), unit) + n / 2) + 5 * (n / 2) + n + 3 * n;
}

int attn_cascade_pack(int32_t *buf, int64_t cap, AttnCascadeMeta *m, const AttnCascadePlan *pl, const AttnBatch *pb,
                      const int32_t *row_of, int n_rows, const AttnCascadePackOpts *o, Err *err) {
    memset(m, 0, sizeof *m);
    if (o->q_per_kv < 1 || o->n_kv_heads < 1 || o->unit_pairs < 1 || o->key_tile < 1 || o->max_splits < 1)
        return err_set(err, "attn_cascade_pack: bad options (q_per_kv %d, kv heads %d, unit %d, tile %d, splits %d)",
                       o->q_per_kv, o->n_kv_heads, o->unit_pairs, o->key_tile, o->max_splits);
    int64_t units = 0;
    for (int g = 0; g < pl->n_groups; g++) units += ceil_div((int64_t)pl->groups[g].n_rows * o->q_per_kv, o->unit_pairs);
    int64_t members = pl->n_groups ? pl->groups[pl->n_groups - 1].row0 + pl->groups[pl->n_groups - 1].n_rows : 0;
    int64_t len = 2 * units + 5 * pl->n_groups + members + 3 * (int64_t)n_rows;
    if (len > cap) return err_set(err, "attn_cascade_pack: %lld values exceed the buffer's %lld", (long long)len, (long long)cap);
    m->n_units = (int)units, m->n_members = (int)members;
    m->off_units = 0, m->off_groups = (int)(2 * units), m->off_members = m->off_groups + 5 * pl->n_groups;
    m->off_rows = m->off_members + (int)members, m->len = (int)len;
    /* splits: blocks up to target_blocks (the shared pass's resident blocks: one wave), rounded down since a
     * partial second wave costs a whole split's time (H200, 256 members: 5 splits, 320 blocks on 264 slots, vs 4),
     * at least one, at most max_splits, none empty */
    int64_t blocks = units * o->n_kv_heads, want = blocks > 0 ? o->target_blocks / blocks : 1;
    int splits = (int)(want < 1 ? 1 : want > o->max_splits ? o->max_splits : want);
    int32_t *u = buf + m->off_units, *gr = buf + m->off_groups, *rows = buf + m->off_rows;
    for (int t = 0; t < n_rows; t++) rows[3 * t] = 0, rows[3 * t + 1] = -1, rows[3 * t + 2] = 0;
    for (int g = 0; g < pl->n_groups; g++) {
        const AttnCascadeGroup *G = &pl->groups[g];
        int keys = G->n_blocks * pb->block_size, pairs = G->n_rows * o->q_per_kv;
        int64_t tiles = ceil_div(keys, o->key_tile), per = ceil_div(tiles, splits);
        int ns = (int)ceil_div(tiles, per);
        if (ns > m->n_splits) m->n_splits = ns;
        int32_t *e = gr + 5 * g;
        e[0] = pb->seq[pl->rows[G->row0]], e[1] = keys, e[2] = G->row0, e[3] = pairs, e[4] = (int)(per * o->key_tile);
        for (int p0 = 0; p0 < pairs; p0 += o->unit_pairs, u += 2) u[0] = g, u[1] = p0;
        for (int i = G->row0; i < G->row0 + G->n_rows; i++) {
            int t = row_of[pl->rows[i]];
            buf[m->off_members + i] = t;
            rows[3 * t] = pl->suffix_start[pl->rows[i]], rows[3 * t + 1] = i, rows[3 * t + 2] = ns;
        }
    }
    return 0;
}
