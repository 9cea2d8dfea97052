/* engine.c — one sequence at a time through the forward pass (see engine.h). */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* cfg: the model's, or its last stage's; n_blocks: the KV pool. */
static int engine_init_with(Engine *e, const Model *m, const ModelConfig *cfg, Backend *be, int n_blocks,
                            int ctx_limit, int max_chunk, Err *err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->be = be;
    e->block_size = be->kv_block_size;
    e->max_chunk = max_chunk;
    e->ctx_limit = ctx_limit;
    if (block_pool_init(&e->pool, n_blocks, err)) return -1;
    e->logits = malloc((size_t)m->cfg.vocab * sizeof *e->logits);
    e->pos_buf = malloc(max_chunk * sizeof *e->pos_buf);
    e->seq_buf = calloc(max_chunk, sizeof *e->seq_buf);
    e->row_buf = malloc(max_chunk * sizeof *e->row_buf);
    e->slot_buf = malloc(max_chunk * sizeof *e->slot_buf);
    if (!e->logits || !e->pos_buf || !e->seq_buf || !e->row_buf || !e->slot_buf) {
        engine_free(e);
        return err_set(err, "out of memory");
    }
    if (forward_init(&e->fw, cfg, be, max_chunk, err)) { engine_free(e); return -1; }
    return 0;
}

int engine_init(Engine *e, const Model *m, Backend *be, int ctx_limit, int max_chunk, Err *err) {
    return engine_init_with(e, m, &m->cfg, be, be->kv_n_blocks, ctx_limit, max_chunk, err);
}

int engine_init_pipeline(Engine *e, const Model *m, Pipeline *pp, int ctx_limit, int max_chunk, Err *err) {
    int last = pp->plan.n_stages - 1;
    for (int s = 0; s < last && !pp->remote; s++) /* remote stages said theirs in their hello */
        if (pp->be[s]->kv_block_size != pp->be[last]->kv_block_size)
            return err_set(err, "pipeline: stage %d has KV blocks of %d tokens, stage %d of %d", s,
                           pp->be[s]->kv_block_size, last, pp->be[last]->kv_block_size);
    if (engine_init_with(e, m, &pp->sm[last].cfg, pp->be[last], pipeline_kv_blocks(pp), ctx_limit, max_chunk, err))
        return -1;
    e->fw.from_prev = true;
    e->pp = pp;
    return 0;
}

int engine_forward(Engine *e, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                   float *logits_out, Err *err) {
    if (e->pp) return pipeline_run(e->pp, &e->fw, ids, b, logit_rows, n_logits, logits_out, err);
    return forward_run(&e->fw, ids, b, logit_rows, n_logits, logits_out, err);
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

int engine_prompt_chunk(int need, int budget, int full_budget) {
    int chunk = need < budget ? need : budget;
    if (need < 2 || full_budget < 4 || chunk <= 0) return chunk;
    if (need - chunk == 1) chunk--;
    return chunk >= 2 ? chunk : 0;
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
    if (engine_forward(e, s->tokens.ids + start, &b, &last, 1, e->logits, err)) return -1;
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
        int chunk = engine_prompt_chunk((int)(s->tokens.n - s->n_cached), e->max_chunk, e->max_chunk);
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
