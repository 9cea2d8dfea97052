/* step_msg.c — encoding and checked decoding of pipeline steps (step_msg.h). */
#include "parallel/step_msg.h"

#include <stdlib.h>
#include <string.h>

#define MSG_MAGIC 0x50455453 /* "STEP" little-endian */

/* Header: magic, kind, T, n_seqs, block_size, total table entries. */
enum { H_MAGIC, H_KIND, H_T, H_SEQS, H_BS, H_TABLES, H_N };

/* Blocks of each sequence the step's rows can reach. */
static int64_t table_lengths(const AttnBatch *b, int32_t *len) {
    for (int s = 0; s < b->n_seqs; s++) len[s] = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t need = b->pos[t] / b->block_size + 1;
        if (need > len[b->seq[t]]) len[b->seq[t]] = need;
    }
    int64_t total = 0;
    for (int s = 0; s < b->n_seqs; s++) total += len[s];
    return total;
}

size_t step_msg_encode(const int32_t *ids, const AttnBatch *b, void **buf, size_t *cap, Err *err) {
    int T = b->n_tokens, S = b->n_seqs;
    int32_t *len = malloc((size_t)S * sizeof *len);
    if (!len) return err_set(err, "out of memory"), 0;
    int64_t total = table_lengths(b, len);
    size_t bytes = H_N * 4 + (size_t)T * (3 * 4 + 8) + (size_t)S * 4 + (size_t)total * 4;
    if (bytes > *cap) {
        void *nb = realloc(*buf, bytes);
        if (!nb) { free(len); return err_set(err, "out of memory for a %zu-byte step message", bytes), 0; }
        *buf = nb;
        *cap = bytes;
    }
    char *p = *buf;
    int32_t h[H_N] = {MSG_MAGIC, STEP_MSG_STEP, T, S, b->block_size, (int32_t)total};
    memcpy(p, h, sizeof h), p += sizeof h;
    memcpy(p, b->slot, (size_t)T * 8), p += (size_t)T * 8; /* first: 8-aligned after the 24-byte header */
    memcpy(p, ids, (size_t)T * 4), p += (size_t)T * 4;
    memcpy(p, b->pos, (size_t)T * 4), p += (size_t)T * 4;
    memcpy(p, b->seq, (size_t)T * 4), p += (size_t)T * 4;
    memcpy(p, len, (size_t)S * 4), p += (size_t)S * 4;
    for (int s = 0; s < S; s++) memcpy(p, b->block_tables[s], (size_t)len[s] * 4), p += (size_t)len[s] * 4;
    free(len);
    return bytes;
}

size_t step_msg_encode_small(int kind, int32_t a, int32_t b2, unsigned char out[16]) {
    int32_t h[4] = {MSG_MAGIC, kind, a, b2};
    memcpy(out, h, sizeof h);
    return sizeof h;
}

static int grow(StepMsg *m, size_t need, Err *err) {
    if (need <= m->cap) return 0;
    void *p = realloc(m->mem, need);
    if (!p) return err_set(err, "out of memory for a %zu-byte step", need);
    m->mem = p;
    m->cap = need;
    return 0;
}

/* Checks the rows' indices once their arrays are in place. */
static int check_rows(const StepMsg *m, int n_blocks, Err *err) {
    const AttnBatch *b = &m->b;
    int64_t slots = (int64_t)n_blocks * b->block_size;
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs || b->pos[t] < 0)
            return err_set(err, "step message: row %d has sequence %d / position %d", t, b->seq[t], b->pos[t]);
        if (b->pos[t] / b->block_size >= m->table_len[b->seq[t]])
            return err_set(err, "step message: row %d at position %d is past its block table", t, b->pos[t]);
        if (b->slot[t] >= slots) return err_set(err, "step message: row %d slot %lld of %lld", t, (long long)b->slot[t], (long long)slots);
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = 0; i < m->table_len[s]; i++)
            if (m->tables[s][i] < 0 || m->tables[s][i] >= n_blocks)
                return err_set(err, "step message: sequence %d block %d is %d (the cache has %d)", s, i, m->tables[s][i], n_blocks);
    return 0;
}

int step_msg_decode(StepMsg *m, const void *buf, size_t len, int max_tokens, int n_blocks, int block_size, Err *err) {
    int32_t h[H_N] = {0};
    if (len < 16) return err_set(err, "step message: %zu bytes", len);
    memcpy(h, buf, len < sizeof h ? 16 : sizeof h);
    if (h[H_MAGIC] != MSG_MAGIC) return err_set(err, "step message: bad magic (not a cllm peer?)");
    m->kind = h[H_KIND];
    if (m->kind == STEP_MSG_STOP) return 0;
    if (m->kind == STEP_MSG_HELLO) { m->hello[0] = h[2], m->hello[1] = h[3]; return 0; }
    if (m->kind != STEP_MSG_STEP || len < sizeof h) return err_set(err, "step message: kind %d, %zu bytes", m->kind, len);
    int T = h[H_T], S = h[H_SEQS];
    int64_t total = h[H_TABLES];
    if (T < 1 || T > max_tokens || S < 1 || S > T || h[H_BS] != block_size || total < S || total > (int64_t)S * n_blocks)
        return err_set(err, "step message: %d rows, %d sequences, block size %d, %lld table entries (limits %d rows, "
                       "block size %d, %d blocks)", T, S, h[H_BS], (long long)total, max_tokens, block_size, n_blocks);
    size_t want = sizeof h + (size_t)T * 20 + (size_t)S * 4 + (size_t)total * 4;
    if (len != want) return err_set(err, "step message: %zu bytes, its counts say %zu", len, want);
    size_t body = len - sizeof h, ptrs = (size_t)S * sizeof(int32_t *);
    if (grow(m, ptrs + body, err)) return -1;
    m->tables = (const int32_t **)m->mem;        /* pointers first, then the (8-aligned) body */
    char *p = (char *)m->mem + ptrs;
    memcpy(p, (const char *)buf + sizeof h, body);
    int64_t *slot = (int64_t *)(void *)p;
    m->ids = (int32_t *)(void *)(slot + T);
    int32_t *pos = m->ids + T, *seq = pos + T;
    m->table_len = seq + T;
    int32_t *tab = m->table_len + S;
    int64_t seen = 0;
    for (int s = 0; s < S; s++) {
        if (m->table_len[s] < 1 || seen + m->table_len[s] > total)
            return err_set(err, "step message: sequence %d has %d table entries", s, m->table_len[s]);
        m->tables[s] = tab + seen;
        seen += m->table_len[s];
    }
    if (seen != total) return err_set(err, "step message: table entries %lld, header %lld", (long long)seen, (long long)total);
    m->b = (AttnBatch){T, pos, seq, slot, S, m->tables, block_size};
    return check_rows(m, n_blocks, err);
}

void step_msg_free(StepMsg *m) {
    free(m->mem);
    memset(m, 0, sizeof *m);
}
