/* generate.c — one reply on one sequence (see generate.h). */
#include "engine/generate.h"

#include <string.h>
#include <time.h>

#include "engine/stop.h"

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
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
        int32_t id = sampler_sample(&sampler, e->logits, vocab);
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
