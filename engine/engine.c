/* engine.c — one sequence at a time through the forward pass (see engine.h). */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

int engine_init(Engine *e, const Model *m, Backend *be, int ctx_limit, int max_chunk, Err *err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->be = be;
    e->block_size = be->kv_block_size;
    e->max_chunk = max_chunk;
    e->ctx_limit = ctx_limit;
    if (block_pool_init(&e->pool, be->kv_n_blocks, err)) return -1;
    e->logits = malloc((size_t)m->cfg.vocab * sizeof *e->logits);
    e->pos_buf = malloc(max_chunk * sizeof *e->pos_buf);
    e->seq_buf = calloc(max_chunk, sizeof *e->seq_buf);
    e->row_buf = malloc(max_chunk * sizeof *e->row_buf);
    e->slot_buf = malloc(max_chunk * sizeof *e->slot_buf);
    if (!e->logits || !e->pos_buf || !e->seq_buf || !e->row_buf || !e->slot_buf) {
        engine_free(e);
        return err_set(err, "out of memory");
    }
    if (forward_init(&e->fw, &m->cfg, be, max_chunk, err)) { engine_free(e); return -1; }
    return 0;
}

void engine_free(Engine *e) {
    if (e->fw.be) forward_free(&e->fw);
    block_pool_free(&e->pool);
    free(e->logits);
    free(e->pos_buf);
    free(e->seq_buf);
    free(e->row_buf);
    free(e->slot_buf);
    memset(e, 0, sizeof *e);
}

/* Runs tokens[n_cached .. n_cached + n) as one forward step. */
static int engine_step(Engine *e, Sequence *s, int n, Err *err) {
    int start = s->n_cached;
    for (int i = 0; i < n; i++) {
        e->pos_buf[i] = start + i;
        e->slot_buf[i] = block_table_slot(&s->bt, start + i, e->block_size);
    }
    const int32_t *tables[1] = {s->bt.blocks};
    AttnBatch b = {n, e->pos_buf, e->seq_buf, e->slot_buf, 1, tables, e->block_size};
    int32_t last = n - 1;
    if (forward_run(&e->fw, s->tokens.ids + start, &b, &last, 1, e->logits, err)) return -1;
    s->n_cached += n;
    return 0;
}

int engine_feed(Engine *e, Sequence *s, const int32_t *ids, int n, Err *err) {
    if (s->tokens.n + (size_t)n > (size_t)e->ctx_limit)
        return err_set(err, "context full: %zu tokens + %d new exceed the context size of %d", s->tokens.n, n,
                       e->ctx_limit);
    if (block_table_reserve(&s->bt, &e->pool, (int)s->tokens.n + n, e->block_size))
        return err_set(err, "KV cache full: no free block for %zu tokens", s->tokens.n + n);
    size_t old_n = s->tokens.n;
    for (int i = 0; i < n; i++)
        if (token_ids_push(&s->tokens, ids[i])) { s->tokens.n = old_n; return err_set(err, "out of memory"); }
    while ((size_t)s->n_cached < s->tokens.n) {
        int chunk = (int)(s->tokens.n - s->n_cached);
        if (chunk > e->max_chunk) chunk = e->max_chunk;
        if (engine_step(e, s, chunk, err)) {
            sequence_truncate(e, s, s->n_cached < (int)old_n ? s->n_cached : (int)old_n);
            return -1;
        }
    }
    return 0;
}

void sequence_truncate(Engine *e, Sequence *s, int n) {
    if (n < 0) n = 0;
    if ((size_t)n < s->tokens.n) s->tokens.n = n;
    if (s->n_cached > n) s->n_cached = n;
    int keep = (n + e->block_size - 1) / e->block_size;
    while (s->bt.n_blocks > keep) block_pool_release(&e->pool, s->bt.blocks[--s->bt.n_blocks]);
    s->bt.n_tokens = n;
}

void sequence_release(Engine *e, Sequence *s) {
    block_table_release(&s->bt, &e->pool);
    block_table_free(&s->bt);
    token_ids_free(&s->tokens);
    memset(s, 0, sizeof *s);
}
