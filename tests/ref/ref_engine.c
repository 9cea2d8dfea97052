/* ref_engine.c — the test-only reference of the scheduler: one sequence at a
 * time through the engine's forward pass, one reply by a plain loop (see
 * ref_engine.h). The scheduler must give the same tokens. */
#include "tests/ref/ref_engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/stop.h"

/* Runs tokens[n_cached .. n_cached + n) as one forward step; the last
 * row's logits land in s->logits. */
static int engine_step(Engine *e, Sequence *s, int n, Err *err) {
    int start = s->n_cached;
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = calloc((size_t)n, sizeof *seq);
    int64_t *slot = malloc((size_t)n * sizeof *slot);
    if (!s->logits && (s->logits = malloc((size_t)e->model->cfg.vocab * sizeof *s->logits)))
        for (int v = 0; v < e->model->cfg.vocab; v++) s->logits[v] = NAN; /* poisoned: a step must write them */
    int rc = pos && seq && slot && s->logits ? 0 : err_set(err, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        pos[i] = start + i;
        slot[i] = block_table_slot(&s->bt, start + i, e->block_size);
    }
    const int32_t *tables[1] = {s->bt.blocks};
    AttnBatch b = {n, pos, seq, slot, 1, tables, e->block_size};
    int32_t last = n - 1;
    if (rc == 0) rc = engine_forward(e, s->tokens.ids + start, &b, &last, 1, s->logits, err);
    if (rc == 0) s->n_cached += n;
    free(pos);
    free(seq);
    free(slot);
    return rc;
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
    free(s->logits);
    memset(s, 0, sizeof *s);
}

/* Detokenizes one token and passes the text through the stop matcher;
 * returns 1 when a stop string completed, -1 when emit asked to stop. */
static int reply_emit_token(const Tokenizer *tok, Detok *dt, StopMatcher *sm, int32_t id, GenEmit emit, void *ctx) {
    char piece[512];
    int n = detok_push(tok, dt, id, piece, sizeof piece);
    StopResult r = stop_matcher_push(sm, piece, (size_t)n);
    if (r.emit_len > 0 && emit && emit(ctx, r.emit, r.emit_len)) return -1;
    return r.stopped ? 1 : 0;
}

static void reply_flush(const Tokenizer *tok, Detok *dt, StopMatcher *sm, GenEmit emit, void *ctx) {
    char tail[64];
    int n = detok_flush(dt, tail, sizeof tail);
    StopResult r = stop_matcher_push(sm, tail, (size_t)n);
    if (r.emit_len > 0 && emit) emit(ctx, r.emit, r.emit_len);
    if (r.stopped) return;
    r = stop_matcher_flush(sm);
    if (r.emit_len > 0 && emit) emit(ctx, r.emit, r.emit_len);
}

int generate_reply(Engine *e, Sequence *s, const int32_t *prompt, int n_prompt, const GenParams *p, GenEmit emit,
                   void *emit_ctx, volatile sig_atomic_t *interrupt, GenStats *st, Err *err) {
    const Tokenizer *tok = e->model->tok;
    int vocab = e->model->cfg.vocab;
    double t0 = now_seconds();
    memset(st, 0, sizeof *st);
    st->finish_reason = "length";
    if (n_prompt > 0 && engine_feed(e, s, prompt, n_prompt, err)) return -1;
    if (s->n_cached == 0) return err_set(err, "nothing to generate from: the prompt is empty");
    st->prompt_tokens = n_prompt;
    st->prefill_s = now_seconds() - t0;

    Sampler sampler;
    if (sampler_init(&sampler, &p->sampling, vocab, err)) return -1;
    for (size_t i = 0; i < s->tokens.n; i++) sampler_accept(&sampler, s->tokens.ids[i]);
    StopMatcher sm;
    stop_matcher_init(&sm, p->stop, p->n_stop);
    Detok dt;
    detok_init(&dt);
    int rc = 0;
    for (;;) {
        if (interrupt && *interrupt) { st->finish_reason = "interrupted"; break; }
        int32_t id = sampler_sample(&sampler, s->logits, vocab);
        sampler_accept(&sampler, id);
        if (st->completion_tokens == 0) st->ttft_s = now_seconds() - t0;
        st->completion_tokens++;
        if (!p->ignore_eos && tok && tokenizer_is_eog(tok, id)) {
            token_ids_push(&s->tokens, id); /* part of the conversation; computed with the next turn */
            st->finish_reason = "stop";
            break;
        }
        int r = tok ? reply_emit_token(tok, &dt, &sm, id, emit, emit_ctx) : 0;
        if (r < 0) { st->finish_reason = "interrupted"; token_ids_push(&s->tokens, id); break; }
        if (r > 0) { st->finish_reason = "stop"; token_ids_push(&s->tokens, id); break; }
        if (p->max_tokens > 0 && st->completion_tokens >= p->max_tokens) { token_ids_push(&s->tokens, id); break; }
        if ((int)s->tokens.n + 1 >= e->ctx_limit) { st->finish_reason = "context"; token_ids_push(&s->tokens, id); break; }
        if (engine_feed(e, s, &id, 1, err)) { rc = -1; break; }
    }
    if (tok && rc == 0) reply_flush(tok, &dt, &sm, emit, emit_ctx);
    stop_matcher_free(&sm);
    sampler_free(&sampler);
    st->total_s = now_seconds() - t0;
    return rc;
}

int engine_prompt_logits(Engine *e, const int32_t *ids, int T, float *logits, Err *err) {
    Sequence s = {0};
    int32_t *rows = malloc(T * sizeof *rows), *pos = malloc(T * sizeof *pos), *seq = calloc(T, sizeof *seq);
    int64_t *slot = malloc(T * sizeof *slot);
    int rc = -1;
    if (!rows || !pos || !seq || !slot) {
        err_set(err, "engine_prompt_logits: out of memory");
    } else if (block_table_reserve(&s.bt, &e->pool, T, e->block_size) == 0) {
        for (int i = 0; i < T; i++) {
            rows[i] = pos[i] = i;
            slot[i] = block_table_slot(&s.bt, i, e->block_size);
        }
        const int32_t *tables[1] = {s.bt.blocks};
        AttnBatch b = {T, pos, seq, slot, 1, tables, e->block_size};
        rc = forward_run(&e->fw, ids, &b, rows, T, logits, err);
    } else {
        err_set(err, "engine_prompt_logits: no room in the cache for %d tokens", T);
    }
    block_table_release(&s.bt, &e->pool);
    block_table_free(&s.bt);
    free(rows);
    free(pos);
    free(seq);
    free(slot);
    return rc;
}
