/* scheduler.c — continuous batching over the paged KV cache (see
 * scheduler.h): queues, the per-step batch, preemption, finishing. A step's
 * draws: step_draw.c; overlapped steps: step_overlap.c.
 *
 * Invariant of a waiting or running request: tokens.n > n_cached, i.e. at
 * least one token (the prompt's tail or the last sampled token) still has to
 * go through the model; its row at tokens.n - 1 gives the next logits. With
 * overlapped steps that token may still be in flight (n_pending: a
 * placeholder the launched draw will replace). */
#include "engine/scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/thread_pool.h" /* samples many requests at once */
#include "engine/scheduler_internal.h"

static void request_release_blocks(Scheduler *s, SchedRequest *r);

/* ---- queues: arrays of requests sorted by submission order ---- */

static void queue_insert(SchedRequest **q, int *n, SchedRequest *r) {
    int i = *n;
    while (i > 0 && q[i - 1]->order > r->order) { q[i] = q[i - 1]; i--; }
    q[i] = r;
    (*n)++;
}

static void queue_remove(SchedRequest **q, int *n, SchedRequest *r) {
    int i = 0;
    while (i < *n && q[i] != r) i++;
    if (i == *n) return;
    memmove(q + i, q + i + 1, (size_t)(*n - i - 1) * sizeof *q);
    (*n)--;
}

static int queues_grow(Scheduler *s, int need) {
    if (need <= s->cap_queue) return 0;
    int cap = s->cap_queue ? 2 * s->cap_queue : 64;
    while (cap < need) cap *= 2;
    SchedRequest ***qs[3] = {&s->waiting, &s->running, &s->finished};
    for (int i = 0; i < 3; i++) {
        SchedRequest **q = realloc(*qs[i], (size_t)cap * sizeof *q);
        if (!q) return -1;
        *qs[i] = q;
    }
    s->cap_queue = cap;
    return 0;
}

/* ---- setup ---- */

/* The widest window when every layer is windowed, else 0. */
static int model_window(const ModelConfig *c) {
    int w = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_window[l] <= 0) return 0;
        if (c->layer_window[l] > w) w = c->layer_window[l];
    }
    return w;
}

int scheduler_init(Scheduler *s, Engine *e, const SchedOptions *o, Err *err) {
    memset(s, 0, sizeof *s);
    s->e = e;
    s->o = *o;
    if (s->o.max_seqs <= 0) s->o.max_seqs = engine_auto_max_seqs(e->pool.n_blocks, e->block_size, e->ctx_limit);
    if (s->o.max_batched_tokens <= 0)
        s->o.max_batched_tokens = engine_auto_max_batched_tokens(e->pool.n_blocks, e->block_size);
    if (s->o.max_batched_tokens > e->max_chunk) s->o.max_batched_tokens = e->max_chunk;
    if (s->o.max_seqs > s->o.max_batched_tokens) s->o.max_seqs = s->o.max_batched_tokens;
    if (s->o.max_seqs > e->fw.max_logits) s->o.max_seqs = e->fw.max_logits;
    s->window = model_window(&e->model->cfg);
    if (block_manager_init(&s->bm_own, &e->pool, e->block_size, err)) return -1;
    s->bm = &s->bm_own;
    s->order_counter = &s->next_order;
    s->peers_oldest = UINT64_MAX;
    int T = s->o.max_batched_tokens, S = s->o.max_seqs;
    s->ids = malloc((size_t)T * sizeof *s->ids);
    s->pos = malloc((size_t)T * sizeof *s->pos);
    s->seq = malloc((size_t)T * sizeof *s->seq);
    s->slot = malloc((size_t)T * sizeof *s->slot);
    s->logit_rows = malloc((size_t)S * sizeof *s->logit_rows);
    s->sel = malloc((size_t)S * sizeof *s->sel);
    s->sel_chunk = malloc((size_t)S * sizeof *s->sel_chunk);
    s->sel_logits = malloc((size_t)S * sizeof *s->sel_logits);
    s->logit_req = malloc((size_t)S * sizeof *s->logit_req);
    s->logit_pos = malloc((size_t)S * sizeof *s->logit_pos);
    s->tables = malloc((size_t)S * sizeof *s->tables);
    s->logits = malloc((size_t)S * e->model->cfg.vocab * sizeof *s->logits);
    s->draw_req = malloc((size_t)S * sizeof *s->draw_req);
    s->drawn = malloc((size_t)S * sizeof *s->drawn);
    if (!s->ids || !s->pos || !s->seq || !s->slot || !s->logit_rows || !s->sel || !s->sel_chunk || !s->sel_logits || !s->logit_req ||
        !s->logit_pos || !s->tables ||
        !s->logits || !s->draw_req || !s->drawn || queues_grow(s, 64)) {
        scheduler_free(s);
        return err_set(err, "scheduler: out of memory for %d sequences x %d vocabulary logits", S,
                       e->model->cfg.vocab);
    }
    s->stats.blocks_total = s->bm->n_blocks;
    /* overlapped steps: one backend that draws and feeds on its own, and not turned off */
    bool knob = true;
    if (step_overlap_knob(getenv("CLLM_ASYNC_STEPS"), &knob, err)) { scheduler_free(s); return -1; }
    const Backend *be = e->be;
    if (knob && !s->o.sync_steps && !s->o.host_sampling && e->stages.n_stages == 0 && be->sample_launch &&
        be->sample_result && be->feed_tokens) {
        if (step_overlap_init(&s->ov, S, err)) { scheduler_free(s); return -1; }
        s->async = true;
    }
    s->device_sampling = be->sample && !s->o.host_sampling;
    if (s->device_sampling || s->async) { /* the rows handed to the backend's draws */
        SamplerParams greedy = sampler_params_default();
        greedy.temperature = 0;
        s->draw_rows = calloc((size_t)S, sizeof *s->draw_rows);
        s->draw_used = calloc((size_t)S, sizeof *s->draw_used);
        s->draw_pen = calloc((size_t)2 * SCHED_DRAW_PEN * S, sizeof *s->draw_pen);
        if (!s->draw_rows || !s->draw_used || !s->draw_pen || sampler_init(&s->idle, &greedy, e->model->cfg.vocab, err)) {
            scheduler_free(s);
            return -1;
        }
    }
    if (s->o.sample_threads != 1 && s->o.max_seqs > 1) {
        s->pool = thread_pool_create(s->o.sample_threads, err);
        if (!s->pool) { scheduler_free(s); return -1; }
    }
    return 0;
}

void scheduler_sync_steps(Scheduler *s) {
    s->async = false;
    step_overlap_free(&s->ov);
}

void scheduler_share(Scheduler *s, BlockManager *bm, uint64_t *order_counter) {
    if (s->bm == &s->bm_own) block_manager_free(&s->bm_own);
    s->bm = bm;
    s->order_counter = order_counter;
    s->stats.blocks_total = bm->n_blocks;
}

void sched_request_free(SchedRequest *r) {
    if (!r) return;
    token_ids_free(&r->tokens);
    block_table_free(&r->bt);
    if (r->sampler_ready) sampler_free(&r->sampler);
    stop_matcher_free(&r->sm);
    textbuf_free(&r->text);
    token_logprobs_free(&r->lp);
    free(r->prompt_lp);
    free(r);
}

void scheduler_free(Scheduler *s) {
    sched_overlap_drop(s);
    for (int i = 0; i < s->n_running; i++) {
        request_release_blocks(s, s->running[i]);
        sched_request_free(s->running[i]);
    }
    for (int i = 0; i < s->n_waiting; i++) sched_request_free(s->waiting[i]);
    for (int i = 0; i < s->n_finished; i++) sched_request_free(s->finished[i]);
    if (s->bm == &s->bm_own) block_manager_free(&s->bm_own);
    free(s->waiting);
    free(s->running);
    free(s->finished);
    free(s->ids);
    free(s->pos);
    free(s->seq);
    free(s->slot);
    free(s->logit_rows);
    free(s->sel);
    free(s->sel_chunk);
    free(s->sel_logits);
    free(s->logit_req);
    free(s->logit_pos);
    free(s->tables);
    free(s->logits);
    free(s->draw_req);
    free(s->drawn);
    free(s->draw_rows);
    free(s->draw_used);
    free(s->draw_pen);
    sampler_free(&s->idle);
    if (s->pool) thread_pool_destroy(s->pool);
    step_overlap_free(&s->ov);
    memset(s, 0, sizeof *s);
}

/* ---- submission ---- */

static int clamp_top(int k) { return k < 0 ? 0 : k > LOGPROBS_MAX_TOP ? LOGPROBS_MAX_TOP : k; }

/* The prompt's entries when the request asks for them; the first token has
 * no logits before it (OpenAI writes null). */
static int request_init_logprobs(SchedRequest *r) {
    r->params.top_logprobs = clamp_top(r->params.top_logprobs);
    r->params.prompt_top = clamp_top(r->params.prompt_top);
    if (!r->params.prompt_logprobs) return 0;
    r->prompt_lp = calloc((size_t)r->n_prompt, sizeof *r->prompt_lp);
    if (!r->prompt_lp) return -1;
    for (int i = 0; i < r->n_prompt; i++) r->prompt_lp[i].id = r->tokens.ids[i];
    r->prompt_lp[0].logprob = NAN;
    r->n_prompt_lp = 1;
    return 0;
}

SchedRequest *scheduler_submit(Scheduler *s, const int32_t *prompt, int n, const GenParams *p, void *user,
                               Err *err) {
    int bs = s->e->block_size;
    if (n <= 0) { err_set(err, "the prompt is empty"); return NULL; }
    if (n >= s->e->ctx_limit) {
        err_set(err, "the prompt has %d tokens; the context holds %d (raise -c)", n, s->e->ctx_limit);
        return NULL;
    }
    if ((n + 1 + bs - 1) / bs > s->bm->n_blocks) {
        err_set(err, "the prompt has %d tokens; the KV cache holds %d", n, s->bm->n_blocks * bs);
        return NULL;
    }
    int pending = s->n_waiting + s->n_running + s->n_finished;
    SchedRequest *r = calloc(1, sizeof *r);
    if (!r || queues_grow(s, pending + 1)) { free(r); err_set(err, "out of memory"); return NULL; }
    for (int i = 0; i < n; i++)
        if (token_ids_push(&r->tokens, prompt[i])) { sched_request_free(r); err_set(err, "out of memory"); return NULL; }
    r->user = user;
    r->params = *p;
    r->n_prompt = n;
    if (request_init_logprobs(r)) { sched_request_free(r); err_set(err, "out of memory"); return NULL; }
    r->order = (*s->order_counter)++;
    r->chain = BLOCK_CHAIN_START;
    r->state = REQ_WAITING;
    r->t_submit = now_seconds();
    stop_matcher_init(&r->sm, p->stop, p->n_stop);
    detok_init(&r->dt);
    queue_insert(s->waiting, &s->n_waiting, r);
    return r;
}

SchedRequest *scheduler_pop_finished(Scheduler *s) {
    if (s->n_finished == 0) return NULL;
    SchedRequest *r = s->finished[0];
    memmove(s->finished, s->finished + 1, (size_t)(s->n_finished - 1) * sizeof *s->finished);
    s->n_finished--;
    return r;
}

/* ---- block bookkeeping of one request ---- */

/* Whether the request still needs logits of prompt rows: the row at
 * position p scores the prompt token at p + 1. */
static bool wants_prompt_rows(const SchedRequest *r) {
    return r->params.prompt_logprobs && r->n_prompt_lp < r->n_prompt;
}

/* Whether the row at position p gets a logits row: the last token's (it
 * draws), or a prompt row whose next token is not scored yet. */
static bool row_has_logits(const SchedRequest *r, int p) {
    if (p == (int)r->tokens.n - 1) return true;
    return r->params.prompt_logprobs && p + 1 < r->n_prompt && p + 1 >= r->n_prompt_lp;
}

/* Releases the blocks the request still holds (not those the window gave back). */
static void request_release_blocks(Scheduler *s, SchedRequest *r) {
    while (r->bt.n_blocks > r->n_dropped) block_manager_release(s->bm, r->bt.blocks[--r->bt.n_blocks]);
    r->bt.n_blocks = r->bt.n_tokens = 0;
}

/* Gives back every block and forgets the computed tokens. */
static void request_drop_blocks(Scheduler *s, SchedRequest *r) {
    request_release_blocks(s, r);
    r->n_cached = r->n_chained = r->n_dropped = 0;
    r->chain = BLOCK_CHAIN_START;
}

/* Takes the prompt's leading full blocks from the prefix cache. At least
 * one token is left to compute (its row gives the logits), and two when the
 * prompt has two: a lone row would meet the decode attention kernel, which a
 * prompt token must not (engine_prompt_chunk). */
static void request_match_prefix(Scheduler *s, SchedRequest *r) {
    int bs = s->e->block_size;
    r->cached_tokens = 0;
    if (s->o.no_prefix_cache || wants_prompt_rows(r)) return;
    int keep = r->tokens.n >= 2 ? 2 : 1;
    while ((r->n_chained + 1) * bs <= (int)r->tokens.n - keep) {
        if (r->bt.n_blocks == r->bt.cap) {
            int cap = r->bt.cap ? 2 * r->bt.cap : 8;
            int32_t *b = realloc(r->bt.blocks, (size_t)cap * sizeof *b);
            if (!b) return;
            r->bt.blocks = b;
            r->bt.cap = cap;
        }
        int id = block_manager_lookup(s->bm, &r->chain, r->tokens.ids + (size_t)r->n_chained * bs);
        if (id < 0) break;
        block_manager_acquire(s->bm, id);
        r->bt.blocks[r->bt.n_blocks++] = id;
        r->n_chained++;
    }
    r->n_cached = r->n_chained * bs;
    r->bt.n_tokens = r->n_cached;
    r->cached_tokens = r->n_cached;
}

/* After a step: indexes the newly full blocks in the prefix cache, and on a
 * windowed model gives back the blocks no later row can see (the next row is
 * at n_cached and sees positions > n_cached - window). A given-back block
 * keeps its id in the table: an attention kernel working in tiles larger than
 * a block may load it under a mask, so the entry must stay a valid block (its
 * contents, whoever owns it now, are finite and masked out). A block holding
 * a token still in flight is indexed once that token is taken (its hash
 * needs it). */
void sched_after_compute(Scheduler *s, SchedRequest *r) {
    int bs = s->e->block_size, known = (int)r->tokens.n - r->n_pending;
    while ((r->n_chained + 1) * bs <= r->n_cached && (r->n_chained + 1) * bs <= known) {
        if (!s->o.no_prefix_cache && r->chain.block != -2)
            block_manager_register(s->bm, r->bt.blocks[r->n_chained], &r->chain,
                                   r->tokens.ids + (size_t)r->n_chained * bs);
        r->n_chained++;
    }
    if (s->window <= 0) return;
    while ((r->n_dropped + 1) * bs <= r->n_cached - s->window + 1 && r->n_dropped < r->bt.n_blocks) {
        block_manager_release(s->bm, r->bt.blocks[r->n_dropped++]);
    }
}

/* ---- finishing ---- */

static void request_finish(Scheduler *s, SchedRequest *r, const char *reason) {
    if (r->n_pending) sched_overlap_forget(s, r);
    if (r->state == REQ_RUNNING) queue_remove(s->running, &s->n_running, r);
    else if (r->state == REQ_WAITING) queue_remove(s->waiting, &s->n_waiting, r);
    request_release_blocks(s, r);
    r->finish_reason = reason;
    r->state = REQ_FINISHED;
    r->t_done = now_seconds();
    s->finished[s->n_finished++] = r;
}

void sched_request_fail(Scheduler *s, SchedRequest *r, const char *msg) {
    snprintf(r->error, sizeof r->error, "%s", msg);
    request_finish(s, r, "error");
}

static int request_text(void *ctx, const char *text, size_t len) {
    SchedRequest *r = ctx;
    if (textbuf_append(&r->text, text, len)) return -1;
    return r->emit ? r->emit(r->emit_ctx, text, len) : 0;
}

/* The end of a reply's text: what the detokenizer and stop matcher held back. */
static void request_flush(const Tokenizer *tok, SchedRequest *r) {
    if (!tok) return;
    char tail[64];
    int n = detok_flush(&r->dt, tail, sizeof tail);
    StopResult sr = stop_matcher_push(&r->sm, tail, (size_t)n);
    if (sr.emit_len > 0) request_text(r, sr.emit, sr.emit_len);
    if (sr.stopped) return;
    sr = stop_matcher_flush(&r->sm);
    if (sr.emit_len > 0) request_text(r, sr.emit, sr.emit_len);
}

const char *sched_accept_token(Scheduler *s, SchedRequest *r, int32_t id) {
    const Tokenizer *tok = s->e->model->tok;
    if (r->n_generated == 0) r->t_first = now_seconds();
    r->n_generated++;
    s->stats.tokens_generated++;
    int at_limit = (int)r->tokens.n + 1 >= s->e->ctx_limit;
    if (token_ids_push(&r->tokens, id)) return "error";
    if (!r->params.ignore_eos && tok && tokenizer_is_eog(tok, id)) return "stop";
    if (tok) {
        char piece[512];
        int n = detok_push(tok, &r->dt, id, piece, sizeof piece);
        StopResult sr = stop_matcher_push(&r->sm, piece, (size_t)n);
        if (sr.emit_len > 0 && request_text(r, sr.emit, sr.emit_len)) return "interrupted";
        if (sr.stopped) return "stop";
    }
    if (r->params.max_tokens > 0 && r->n_generated >= r->params.max_tokens) return "length";
    if (at_limit) return "context";
    return NULL;
}

void sched_request_end(Scheduler *s, SchedRequest *r, const char *why) {
    if (!strcmp(why, "error")) { sched_request_fail(s, r, "out of memory"); return; }
    request_flush(s->e->model->tok, r);
    request_finish(s, r, why);
}

/* ---- building a step ---- */

static int sel_index(const Scheduler *s, const SchedRequest *r) {
    for (int i = 0; i < s->n_sel; i++)
        if (s->sel[i] == r) return i;
    return -1;
}

/* Sends the newest running request back to the queue (its blocks freed,
 * its rows taken out of this step). */
static void preempt_newest(Scheduler *s, int *budget) {
    SchedRequest *v = s->running[s->n_running - 1];
    int k = sel_index(s, v);
    if (k >= 0) {
        *budget += s->sel_chunk[k];
        s->n_sel_logits -= s->sel_logits[k];
        s->n_sel--;
        memmove(s->sel + k, s->sel + k + 1, (size_t)(s->n_sel - k) * sizeof *s->sel);
        memmove(s->sel_chunk + k, s->sel_chunk + k + 1, (size_t)(s->n_sel - k) * sizeof *s->sel_chunk);
        memmove(s->sel_logits + k, s->sel_logits + k + 1, (size_t)(s->n_sel - k) * sizeof *s->sel_logits);
    }
    request_drop_blocks(s, v);
    s->n_running--;
    v->state = REQ_WAITING;
    v->n_preempted++;
    s->stats.preemptions++;
    queue_insert(s->waiting, &s->n_waiting, v);
}

/* A request's logits rows take a row of the logits buffer each (at least
 * one: every selected request may reach its last token). */
static void select_rows(Scheduler *s, SchedRequest *r, int chunk, int *budget) {
    int nl = 0;
    if (r->params.prompt_logprobs)
        for (int p = r->n_cached; p < r->n_cached + chunk; p++) nl += row_has_logits(r, p);
    if (nl < 1) nl = 1;
    s->sel[s->n_sel] = r;
    s->sel_logits[s->n_sel] = nl;
    s->n_sel_logits += nl;
    s->sel_chunk[s->n_sel++] = chunk;
    *budget -= chunk;
}

/* The rows of the next chunk of a request that needs `need`: a request
 * scoring its prompt takes a logits row per row, so its chunk is held to the
 * logits rows left (chunked prefill goes on at the next steps). */
static int request_chunk(const Scheduler *s, const SchedRequest *r, int need, int budget) {
    if (!wants_prompt_rows(r)) return engine_prompt_chunk(need, budget, s->o.max_batched_tokens);
    int slots = s->o.max_seqs - s->n_sel_logits;
    int full = s->o.max_batched_tokens < s->o.max_seqs ? s->o.max_batched_tokens : s->o.max_seqs;
    return engine_prompt_chunk(need, budget < slots ? budget : slots, full);
}

/* Whether the token in flight of r is sure to end its reply (its
 * max_tokens or the context reached), so a row for it would be wasted. */
static bool ends_with_pending(const Scheduler *s, const SchedRequest *r) {
    if (r->n_pending == 0) return false;
    bool length = r->params.max_tokens > 0 && r->n_generated + r->n_pending >= r->params.max_tokens;
    return length || (int)r->tokens.n >= s->e->ctx_limit;
}

/* Schedules running requests: decodes (pass 0) or partial prefills (pass 1).
 * A request that cannot get its blocks preempts the newest running ones,
 * itself last; alone and still without room, the cache cannot hold it (once
 * its token in flight is taken: the reply holds it, as it would have
 * without overlap). */
static void schedule_running(Scheduler *s, int pass, int *budget) {
    for (int i = 0; i < s->n_running; i++) {
        SchedRequest *r = s->running[i];
        int need = (int)r->tokens.n - r->n_cached;
        if ((pass == 0) != (need == 1) || sel_index(s, r) >= 0 || ends_with_pending(s, r)) continue;
        if (s->n_sel_logits >= s->o.max_seqs || *budget == 0) return;
        int chunk = request_chunk(s, r, need, *budget);
        if (chunk == 0) continue; /* a prefill chunk of >= 2 rows does not fit this step */
        bool wait = false;
        while (block_manager_reserve(s->bm, &r->bt, r->n_cached + chunk)) {
            if (s->n_running == 1 && s->peers_oldest == UINT64_MAX) {
                if (r->n_pending) { wait = true; break; }
                request_flush(s->e->model->tok, r); /* the whole cache is too small for it */
                request_finish(s, r, "context");
                i--;
                break;
            }
            /* Other virtual engines hold blocks: the oldest request anywhere
             * keeps its blocks and waits (the newer ones make room by
             * preempting themselves), so every request still finishes. */
            if (s->n_running == 1 && r->order < s->peers_oldest) { wait = true; break; }
            bool self = s->running[s->n_running - 1] == r;
            preempt_newest(s, budget);
            if (self) break;
        }
        if (!wait && r->state == REQ_RUNNING && i < s->n_running && s->running[i] == r) select_rows(s, r, chunk, budget);
    }
}

/* Whether a running request is computing the block r would take next from
 * the prefix cache (the one after those r matched): its chain stands where
 * r's does, it has not computed that block yet, and the block's tokens are
 * r's. r then waits for the block to be cached instead of computing it a
 * second time (prompts sharing a system prompt, submitted together, compute
 * it once). Only this scheduler's requests are seen: each virtual engine
 * computes a shared prefix at most once. */
static bool prefix_in_flight(const Scheduler *s, const SchedRequest *r) {
    int bs = s->e->block_size, b = r->n_chained, keep = r->tokens.n >= 2 ? 2 : 1;
    if (s->o.no_prefix_cache || wants_prompt_rows(r) || (b + 1) * bs > (int)r->tokens.n - keep) return false;
    for (int i = 0; i < s->n_running; i++) {
        const SchedRequest *q = s->running[i];
        if (q->n_chained != b || q->n_cached >= (b + 1) * bs || (int)q->tokens.n < (b + 1) * bs) continue;
        if (q->chain.key != r->chain.key || q->chain.block != r->chain.block || q->chain.gen != r->chain.gen) continue;
        if (!memcmp(q->tokens.ids + (size_t)b * bs, r->tokens.ids + (size_t)b * bs, (size_t)bs * sizeof *r->tokens.ids))
            return true;
    }
    return false;
}

/* Admits waiting requests in order while sequence slots, budget and blocks
 * last; a request whose next prefix block is in flight (prefix_in_flight)
 * is passed over until it is cached. */
static void schedule_waiting(Scheduler *s, int *budget) {
    int i = 0;
    while (i < s->n_waiting && s->n_sel_logits < s->o.max_seqs && *budget > 0) {
        SchedRequest *r = s->waiting[i];
        if (r->n_pending) return; /* preempted with its token in flight: admitted once it is taken */
        request_match_prefix(s, r);
        if (prefix_in_flight(s, r)) {
            request_drop_blocks(s, r);
            i++;
            continue;
        }
        int need = (int)r->tokens.n - r->n_cached;
        int chunk = request_chunk(s, r, need, *budget);
        if (chunk == 0 || block_manager_reserve(s->bm, &r->bt, r->n_cached + chunk)) {
            request_drop_blocks(s, r);
            return;
        }
        queue_remove(s->waiting, &s->n_waiting, r);
        s->bm->hits += r->n_chained;
        s->stats.prefix_hit_tokens += r->cached_tokens;
        r->state = REQ_RUNNING;
        queue_insert(s->running, &s->n_running, r);
        select_rows(s, r, chunk, budget);
    }
}

/* The rows of the selected requests; a request whose rows reach its last
 * token gets a logits row, and one scoring its prompt one per prompt row.
 * A step that scores prompt rows brings its logits to the host, and so
 * does one where a request wants logprobs unless steps overlap (the
 * launched draw keeps those rows). A token still in flight is fed on the
 * backend from the launched draw (its id here is a placeholder). Returns
 * the row count. */
static int build_rows(Scheduler *s, int *n_logits) {
    int bs = s->e->block_size, t = 0, n = 0;
    s->step_host_logits = s->step_logprobs = false;
    s->ov.n_feed = 0;
    for (int k = 0; k < s->n_sel; k++) {
        SchedRequest *r = s->sel[k];
        for (int i = 0; i < s->sel_chunk[k]; i++, t++) {
            int p = r->n_cached + i;
            s->ids[t] = r->tokens.ids[p];
            if (p >= (int)r->tokens.n - r->n_pending) { /* in flight: at most one a request, its last token */
                s->ids[t] = 0;
                s->ov.feed_rows[s->ov.n_feed] = t;
                s->ov.feed_src[s->ov.n_feed++] = r->pending_row;
            }
            s->pos[t] = p;
            s->seq[t] = k;
            s->slot[t] = block_table_slot(&r->bt, p, bs);
            if (!row_has_logits(r, p)) continue;
            s->logit_req[n] = r;
            s->logit_pos[n] = p;
            s->logit_rows[n++] = t;
            if (p != (int)r->tokens.n - 1) s->step_host_logits = true;
            if (r->params.logprobs) s->step_logprobs = true;
        }
        s->tables[k] = r->bt.blocks;
        bool generated = r->n_generated + r->n_pending > 0;
        if (s->sel_chunk[k] == 1 && r->n_cached + 1 == (int)r->tokens.n && generated) s->stats.n_decode++;
        else s->stats.n_prefill += s->sel_chunk[k];
    }
    *n_logits = n;
    return t;
}

void sched_step_stats(Scheduler *s, int rows, double seconds, double forward) {
    s->stats.n_seqs = s->n_sel;
    s->stats.n_tokens = rows;
    s->stats.n_running = s->n_running;
    s->stats.n_waiting = s->n_waiting;
    s->stats.n_finished = s->n_finished;
    s->stats.blocks_used = block_manager_used(s->bm);
    s->stats.blocks_cached = s->bm->n_cached;
    s->stats.seconds = seconds;
    s->stats.forward_seconds = forward;
    s->stats.busy_seconds += seconds;
}

int scheduler_prepare(Scheduler *s, SchedBatch *out) {
    double t0 = now_seconds();
    int budget = s->o.max_batched_tokens;
    int64_t preempted = s->stats.preemptions;
    s->n_sel = s->n_sel_logits = 0;
    s->step_rows = s->step_logits = 0;
    s->stats.n_decode = s->stats.n_prefill = s->stats.n_draws = 0;
    s->stats.forward_seconds = s->stats.sample_seconds = s->stats.own_seconds = 0;
    schedule_running(s, 0, &budget);
    schedule_running(s, 1, &budget);
    /* After a preemption the cache is short: admitting more would only
     * preempt again. */
    if (s->stats.preemptions == preempted) schedule_waiting(s, &budget);
    if (s->n_sel == 0) {
        /* Nothing fits although nothing runs anywhere: blocks are held
         * outside the scheduler. Fail the head request rather than spin. */
        if (s->n_running == 0 && s->n_waiting > 0 && s->peers_oldest == UINT64_MAX && !s->waiting[0]->n_pending)
            sched_request_fail(s, s->waiting[0], "no free KV cache block");
        sched_step_stats(s, 0, 0, 0);
        return 0;
    }
    s->step_rows = build_rows(s, &s->step_logits);
    bool host = s->step_host_logits || (s->step_logprobs && !s->async); /* overlapped: the draw keeps them */
    s->step_logits_here = !((s->device_sampling || s->async) && !host);
    *out = (SchedBatch){s->ids, {s->step_rows, s->pos, s->seq, s->slot, s->n_sel, s->tables, s->e->block_size},
                        s->logit_rows, s->step_logits, s->step_logits_here ? s->logits : NULL};
    s->t_prepare = t0;
    s->stats.own_seconds = now_seconds() - t0;
    s->stats.scheduler_seconds += s->stats.own_seconds;
    return s->step_rows;
}

void sched_commit_rows(Scheduler *s) {
    for (int k = 0; k < s->n_sel; k++) {
        SchedRequest *r = s->sel[k];
        r->n_cached += s->sel_chunk[k];
        sched_after_compute(s, r);
    }
}

int scheduler_complete(Scheduler *s, Err *err) {
    double t0 = now_seconds();
    sched_commit_rows(s);
    sched_select_draws(s, s->step_logits);
    double t_sample = now_seconds();
    if (sched_draw_now(s, s->step_logits, s->step_logits_here, err)) return -1;
    double t_end = now_seconds();
    s->stats.sample_seconds = t_end - t_sample;
    s->stats.own_seconds += t_sample - t0;
    s->stats.scheduler_seconds += t_sample - t0;
    sched_step_stats(s, s->step_rows, t_end - s->t_prepare, s->stats.forward_seconds);
    s->step_rows = s->step_logits = 0;
    return 0;
}

int scheduler_step(Scheduler *s, Err *err) {
    if (s->async) return sched_overlap_step(s, err);
    SchedBatch b;
    if (scheduler_prepare(s, &b) == 0) return 0;
    double t_fw = now_seconds();
    if (engine_forward(s->e, b.ids, &b.b, b.logit_rows, b.n_logits, b.logits_out, err)) return -1;
    s->stats.forward_seconds = now_seconds() - t_fw;
    return scheduler_complete(s, err);
}
