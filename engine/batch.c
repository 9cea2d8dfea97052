/* batch.c — `cllm generate`: reads requests one at a time, renders and
 * tokenizes each, generates, and writes its result line as soon as it is
 * done. A bad request gets an error line and the run goes on; --resume skips
 * ids the output already holds. On the CPU backend requests run one after
 * another; the continuous-batching scheduler plugs in behind batch_run_one. */
#include "engine/batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/generate.h"
#include "engine/prompts.h"
#include "engine/results.h"
#include "tokenizer/chat_template.h"

void batch_options_default(BatchOptions *b) {
    memset(b, 0, sizeof *b);
    b->output = "-";
}

typedef struct {
    Runtime rt;
    const RunOptions *o;
    const BatchOptions *b;
    ChatTemplate tmpl;
    ResultWriter *out;
    int n_done, n_failed, n_skipped;
    long long tokens_out;
    double t0, last_progress;
} Batch;

/* Collects the generated text of one request. */
static int batch_collect(void *ctx, const char *text, size_t len) {
    return chat_buf_append(ctx, text, len);
}

/* The request's sampling and stop settings over the command line's. */
static void batch_params(const Batch *bt, const PromptRequest *r, GenParams *p) {
    *p = (GenParams){bt->o->sampling, bt->o->max_tokens > 0 ? bt->o->max_tokens : 512, NULL, 0, bt->o->ignore_eos};
    if (r->max_tokens > 0) p->max_tokens = r->max_tokens;
    if (!isnan(r->temperature)) p->sampling.temperature = r->temperature;
    if (!isnan(r->top_p)) p->sampling.top_p = r->top_p;
    if (!isnan(r->min_p)) p->sampling.min_p = r->min_p;
    if (r->top_k >= 0) p->sampling.top_k = r->top_k;
    if (!isnan(r->repetition_penalty)) p->sampling.repetition_penalty = r->repetition_penalty;
    if (!isnan(r->presence_penalty)) p->sampling.presence_penalty = r->presence_penalty;
    if (!isnan(r->frequency_penalty)) p->sampling.frequency_penalty = r->frequency_penalty;
    if (r->has_seed) p->sampling.seed = (uint64_t)r->seed;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
}

/* Prompt text → ids: messages (or --chat prompts) through the template. */
static int batch_prompt_ids(Batch *bt, const PromptRequest *r, TokenIds *ids, Err *err) {
    const Tokenizer *tok = bt->rt.model.tok;
    if (r->n_messages == 0 && !bt->b->chat)
        return tokenizer_encode(tok, r->prompt, strlen(r->prompt), true, tokenizer_add_bos(tok), ids, err);
    ChatMessage one = {"user", r->prompt};
    ChatMessage *msgs = &one;
    int n = 1;
    if (r->n_messages > 0) {
        msgs = malloc(r->n_messages * sizeof *msgs);
        if (!msgs) return err_set(err, "out of memory");
        for (int i = 0; i < r->n_messages; i++) msgs[i] = (ChatMessage){r->messages[i].role, r->messages[i].content};
        n = r->n_messages;
    }
    ChatBuf text = {0};
    int rc = chat_render(&bt->tmpl, msgs, n, true, &text, err);
    if (msgs != &one) free(msgs);
    if (rc == 0) rc = tokenizer_encode(tok, text.data, text.len, true, false, ids, err);
    chat_buf_free(&text);
    return rc;
}

static int batch_write(Batch *bt, const ResultLine *line) {
    Err err = {{0}};
    if (results_write(bt->out, line, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Runs one request to its result line. Returns -1 only when the output
 * cannot be written (the run must stop). */
static int batch_run_one(Batch *bt, const PromptRequest *r) {
    ResultLine line = {.id = r->id, .id_is_number = r->id_is_number, .text = "", .finish_reason = "error",
                       .is_chat = r->is_chat, .model = r->model};
    Err err = {{0}};
    TokenIds ids = {0};
    Sequence seq = {0};
    ChatBuf text = {0};
    GenStats st = {0};
    double t = now_seconds();
    if (r->error) {
        line.error = r->error;
    } else if (batch_prompt_ids(bt, r, &ids, &err)) {
        line.error = err.msg;
    } else if (ids.n == 0) {
        line.error = "the prompt is empty after tokenization";
    } else if ((int)ids.n >= bt->rt.engine.ctx_limit) {
        snprintf(err.msg, sizeof err.msg, "the prompt has %zu tokens; the context holds %d (raise -c)", ids.n,
                 bt->rt.engine.ctx_limit);
        line.error = err.msg;
    } else {
        GenParams p;
        batch_params(bt, r, &p);
        if (generate_reply(&bt->rt.engine, &seq, ids.ids, (int)ids.n, &p, batch_collect, &text, NULL, &st, &err)) {
            line.error = err.msg;
        } else {
            line.text = text.data ? text.data : "";
            line.finish_reason = !strcmp(st.finish_reason, "stop") ? "stop" : "length";
        }
    }
    line.prompt_tokens = (int)ids.n;
    line.completion_tokens = st.completion_tokens;
    line.seconds = now_seconds() - t;
    bt->n_done++;
    bt->n_failed += line.error != NULL;
    bt->tokens_out += st.completion_tokens;
    int rc = batch_write(bt, &line);
    chat_buf_free(&text);
    sequence_release(&bt->rt.engine, &seq);
    token_ids_free(&ids);
    return rc;
}

static void batch_progress(Batch *bt, bool final) {
    double now = now_seconds(), el = now - bt->t0;
    bool tty = isatty(STDERR_FILENO);
    if (!final && now - bt->last_progress < (tty ? 0.2 : 10.0)) return;
    bt->last_progress = now;
    fprintf(stderr, "%s%d done (%d failed, %d skipped), %lld tokens, %.1f tokens/s, %.0f s%s",
            tty && !final ? "\r" : "", bt->n_done, bt->n_failed, bt->n_skipped, bt->tokens_out,
            el > 0 ? bt->tokens_out / el : 0.0, el, tty && !final ? "   " : "\n");
}

int batch_main(const RunOptions *o, const BatchOptions *b) {
    Batch bt = {0};
    bt.o = o;
    bt.b = b;
    Err err = {{0}};
    PromptReader *in = prompts_open(b->input, PROMPTS_AUTO, &err);
    if (!in) { fprintf(stderr, "cllm generate: %s\n", err.msg); return 2; }
    if (runtime_open(&bt.rt, o, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        prompts_close(in);
        return 2;
    }
    if (runtime_chat_template(&bt.rt, o->chat_template, &bt.tmpl, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        prompts_close(in);
        runtime_close(&bt.rt);
        return 2;
    }
    int rc = 0;
    PromptRequest req;
    bt.t0 = now_seconds();
    for (;;) {
        int got = prompts_next(in, &req, &err);
        if (got == 0) break;
        if (got < 0) { fprintf(stderr, "cllm generate: %s\n", err.msg); rc = 2; break; }
        if (!bt.out) {
            bt.out = results_open(b->output, prompts_format(in), b->resume, &err);
            if (!bt.out) { fprintf(stderr, "cllm generate: %s\n", err.msg); prompt_request_free(&req); rc = 2; break; }
        }
        if (b->resume && req.id && results_is_done(bt.out, req.id)) {
            bt.n_skipped++;
        } else if (batch_run_one(&bt, &req)) {
            prompt_request_free(&req);
            rc = 2;
            break;
        }
        prompt_request_free(&req);
        batch_progress(&bt, false);
    }
    batch_progress(&bt, true);
    if (bt.out) results_close(bt.out);
    prompts_close(in);
    runtime_close(&bt.rt);
    return rc;
}
