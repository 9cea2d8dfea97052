/* batch.c — `cllm generate`: reads requests as the scheduler has room for
 * them, tokenizes them on worker threads, runs them all through the
 * continuous-batching scheduler (engine/scheduler.h), and writes each result
 * line as soon as its request finishes (or, with --ordered, as soon as every
 * earlier input has been written). A bad request gets an error line and the
 * run goes on; --resume skips ids the output already holds. Input is read
 * lazily: at most about two batches of requests are in memory at once, so
 * inputs of any length work.
 *
 * Nothing but steps on the loop's path: the prompts are rendered and
 * tokenized by worker threads and submitted in input order as each is ready
 * (the first step starts once the first prompt is), and the result lines
 * are formatted and written by a thread of their own (batch_write.c). The
 * input is read here, on the loop's thread: a read that blocks (a pipe)
 * then never leaves a thread that Ctrl-C cannot stop.
 *
 * A duplicate id's error line waits until the first request with that id has
 * written its own line: resume counts an id's lines, and the k-th request
 * with an id is done only when the output holds k lines with it, so a run
 * killed while the first request ran never makes resume skip it. */
#include "app/batch.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "app/batch_internal.h"
#include "app/models.h"
#include "base/clock.h"
#include "engine/request.h"

void batch_options_default(BatchOptions *b) {
    memset(b, 0, sizeof *b);
    b->output = "-";
    b->max_seqs = 0;           /* from the KV cache (engine_auto_max_seqs) */
    b->max_batched_tokens = 0; /* engine_auto_max_batched_tokens */
}

/* Set by the SIGINT handler, read by the loop between steps: a handler can
 * reach nothing but a global. */
static volatile sig_atomic_t batch_interrupted;
static void batch_on_sigint(int sig) {
    (void)sig;
    batch_interrupted = 1;
}

/* The request's sampling and stop settings over the command line's. */
static void batch_params(const Batch *bt, const PromptRequest *r, GenParams *p) {
    *p = (GenParams){.sampling = bt->o->sampling, .max_tokens = bt->o->max_tokens > 0 ? bt->o->max_tokens : 512,
                     .ignore_eos = bt->o->ignore_eos};
    if (r->max_tokens > 0) p->max_tokens = r->max_tokens;
    sampler_params_override(&p->sampling, &(SamplerOverrides){r->temperature, r->top_p, r->min_p,
                                                                r->repetition_penalty, r->presence_penalty,
                                                                r->frequency_penalty, r->top_k});
    if (r->has_seed) p->sampling.seed = (uint64_t)r->seed;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
    if (r->logprobs >= 0) {
        p->logprobs = true;
        p->top_logprobs = r->logprobs;
    }
    /* the prompt's entries: for echo with logprobs, and for prompt_logprobs */
    int k = r->echo && r->logprobs >= 0 ? r->logprobs : -1;
    if (r->prompt_logprobs > k) k = r->prompt_logprobs;
    if (k >= 0) {
        p->prompt_logprobs = true;
        p->prompt_top = k;
    }
}

/* Prompt text → ids: messages (and prompts_chat prompts) through the template. */
static int batch_prompt_ids(const Batch *bt, const PromptRequest *r, TokenIds *ids, Err *err) {
    const Tokenizer *tok = bt->rt.model.tok;
    if (r->prompt_ids) { /* token ids: as given, in the vocabulary's range */
        int32_t v = tokenizer_n_vocab(tok);
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= v)
                return err_set(err, "prompt[%d]: token id %d is outside the vocabulary (0..%d)", i,
                               (int)r->prompt_ids[i], (int)v - 1);
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (token_ids_push(ids, r->prompt_ids[i])) return err_set(err, "out of memory");
        return 0;
    }
    if (r->n_messages == 0 && !bt->prompts_chat)
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
    TextBuf text = {0};
    int rc = chat_render(&bt->tmpl, msgs, n, true, &text, err);
    if (msgs != &one) free(msgs);
    if (rc == 0) rc = tokenizer_encode(tok, text.data, text.len, true, false, ids, err);
    textbuf_free(&text);
    return rc;
}

/* A tokenizer thread's work on one BatchItem (an OrderedWorkFn over a
 * Batch): the model's tokenizer and the chat template are only read. */
static void batch_tokenize(void *ctx, void *item) {
    const Batch *bt = ctx;
    BatchItem *it = item;
    if (it->req.error) return; /* a bad line (or a duplicate): its error line is all it gets */
    Err err = {{0}};
    if (batch_prompt_ids(bt, &it->req, &it->ids, &err)) {
        it->tokenize_failed = true;
        snprintf(it->tokenize_error, sizeof it->tokenize_error, "%s", err.msg);
    }
}

static void batch_item_free(BatchItem *it) {
    prompt_request_free(&it->req);
    token_ids_free(&it->ids);
    free(it);
}

static void batch_tokenize_discard(void *ctx, void *item, bool ran) {
    (void)ctx;
    (void)ran;
    batch_item_free(item);
}

/* Whether the first request with id is in the scheduler (its line not yet
 * handed to the writer). */
static bool batch_in_flight(const Batch *bt, const char *id) {
    for (int k = 0; k < bt->ve.n; k++) {
        const Scheduler *sc = &bt->ve.ve[k];
        SchedRequest *const *qs[3] = {sc->waiting, sc->running, sc->finished};
        int ns[3] = {sc->n_waiting, sc->n_running, sc->n_finished};
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < ns[q]; i++)
                if (!strcmp(((const BatchItem *)qs[q][i]->user)->req.id, id)) return true;
    }
    return false;
}

/* A duplicate id: its error line now, or once its first request has its line. */
static int batch_duplicate(Batch *bt, BatchItem *it) {
    if (!batch_in_flight(bt, it->req.id)) return batch_write_error(bt, it, it->req.error, 0);
    if (bt->n_held == bt->cap_held) {
        int cap = bt->cap_held ? 2 * bt->cap_held : 16;
        BatchItem **h = realloc(bt->held, (size_t)cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "cllm generate: out of memory\n");
            batch_item_free(it);
            return -1;
        }
        bt->held = h;
        bt->cap_held = cap;
    }
    bt->held[bt->n_held++] = it;
    return 0;
}

/* Queues one tokenized request, or writes its error line. The item is
 * owned by the scheduler's request from here on, or by the writer. */
static int batch_submit(Batch *bt, BatchItem *it) {
    const PromptRequest *r = &it->req;
    if (r->error) return batch_write_error(bt, it, r->error, 0);
    if (it->tokenize_failed) return batch_write_error(bt, it, it->tokenize_error, 0);
    if (it->ids.n == 0) return batch_write_error(bt, it, "the prompt is empty after tokenization", 0);
    Err err = {{0}};
    GenParams p;
    batch_params(bt, r, &p);
    it->prompt_tokens = (int)it->ids.n;
    if (vengines_submit(&bt->ve, it->ids.ids, (int)it->ids.n, &p, it, &err)) {
        token_ids_free(&it->ids);
        return 0;
    }
    return batch_write_error(bt, it, err.msg, it->prompt_tokens);
}

/* Reads requests until the scheduler and the tokenizers hold about two
 * batches' worth, and hands them to the tokenizers. Returns -1 when the run
 * must stop (an unreadable input or output). */
static int batch_fill(Batch *bt) {
    Err err = {{0}};
    while (!bt->in_done &&
           vengines_pending(&bt->ve) + ordered_work_size(bt->tokenizers) < 2 * bt->ve.n * bt->ve.ve[0].o.max_seqs) {
        BatchItem *it = calloc(1, sizeof *it);
        if (!it) { fprintf(stderr, "cllm generate: out of memory\n"); return -1; }
        int got = prompts_next(bt->in, &it->req, &err);
        if (got <= 0) {
            free(it);
            bt->in_done = true;
            /* What was read before the error still runs and gets its lines. */
            if (got < 0) { fprintf(stderr, "cllm generate: %s\n", err.msg); bt->in_failed = true; }
            break;
        }
        bt->n_read++;
        it->t_start = now_seconds();
        /* the done ids are the earlier runs' lines, read at open: the writer never changes them */
        if (bt->b->resume && results_done_count(bt->out, it->req.id) >= it->req.occurrence) {
            bt->n_skipped++;
            int64_t index = it->req.index;
            batch_item_free(it);
            if (bt->order && batch_write_skip(bt, index)) return -1;
            continue;
        }
        if (ordered_work_push(bt->tokenizers, it)) {
            fprintf(stderr, "cllm generate: out of memory\n");
            batch_item_free(it);
            return -1;
        }
    }
    return 0;
}

/* Submits the tokenized requests, in input order, as far as they are ready;
 * when the scheduler has nothing to run, waits for the next one. */
static int batch_feed(Batch *bt) {
    BatchItem *it;
    while ((it = ordered_work_pop(bt->tokenizers, vengines_pending(&bt->ve) == 0)))
        if (it->req.occurrence > 1 ? batch_duplicate(bt, it) : batch_submit(bt, it)) return -1;
    return 0;
}

/* Non-empty lines of a regular file: the request count for the progress
 * line's total and ETA; -1 when it cannot be known cheaply (stdin, a pipe,
 * a file over 1 GB). */
static int64_t batch_count_inputs(const char *path) {
    struct stat st;
    if (!strcmp(path, "-") || stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size > ((off_t)1 << 30)) return -1;
    gzFile f = gzopen(path, "rb");
    if (!f) return -1;
    char buf[65536];
    int64_t n = 0;
    bool blank = true;
    int got;
    while ((got = gzread(f, buf, sizeof buf)) > 0)
        for (int i = 0; i < got; i++) {
            if (buf[i] == '\n') { n += !blank; blank = true; }
            else if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\r') blank = false;
        }
    gzclose(f);
    return got < 0 ? -1 : n + !blank;
}

/* Tokens generated so far: the written requests', the ones queued for the
 * writer, and the ones still in the scheduler (running, finished this step, or preempted and waiting). */
static long long batch_tokens_now(const Batch *bt) {
    long long n = bt->tokens_out + bt->tokens_writing;
    for (int k = 0; k < bt->ve.n; k++) {
        const Scheduler *sc = &bt->ve.ve[k];
        SchedRequest *const *qs[3] = {sc->waiting, sc->running, sc->finished};
        int ns[3] = {sc->n_waiting, sc->n_running, sc->n_finished};
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < ns[q]; i++) n += qs[q][i]->n_generated;
    }
    return n;
}

/* Seconds left at the current token rate: each request not yet done is
 * expected to generate as many tokens as the finished ones did on average
 * (max_tokens before any finished); the tokens already generated by the
 * running ones count as done. Negative when unknown. */
static double batch_eta(const Batch *bt, long long tokens_now, double rate) {
    int64_t left = bt->n_total - bt->n_skipped - bt->n_done;
    if (bt->n_total < 0 || rate <= 0) return -1;
    int ok = bt->n_done - bt->n_failed;
    double per = ok > 0 ? (double)bt->tokens_out / ok : bt->o->max_tokens > 0 ? bt->o->max_tokens : 512;
    double todo = (double)left * per - (double)(tokens_now - bt->tokens_out);
    return todo > 0 ? todo / rate : 0;
}

/* The width of the terminal on stderr: TIOCGWINSZ, else COLUMNS, else 80. */
static int batch_term_width(void) {
    struct winsize ws;
    if (!ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    int n = c ? atoi(c) : 0;
    return n > 0 ? n : 80;
}

/* Appends field to line when it still fits in width columns; once one does
 * not fit, the later ones (less important) are dropped too. */
typedef struct {
    char s[512];
    int len, width;
    bool full;
} ProgressLine;

static void progress_add(ProgressLine *l, const char *field) {
    int n = (int)strlen(field);
    if (l->full) return;
    if (l->len + n > l->width) {
        l->full = true;
        if (l->len > 0) return;
        n = l->width; /* the first field always shows, cut to the width */
    }
    memcpy(l->s + l->len, field, (size_t)n);
    l->len += n;
    l->s[l->len] = 0;
}

/* The progress line: repainted in place on a terminal (no wider than it, so
 * a repaint never scrolls), a line every 10 s otherwise; the final summary
 * starts on a line of its own. */
static void batch_progress(Batch *bt, bool final) {
    double now = now_seconds(), el = now - bt->t0;
    bool tty = isatty(STDERR_FILENO);
    if (!final && now - bt->last_progress < (tty ? 0.2 : 10.0)) return;
    bt->last_progress = now;
    const SchedStats *s = &bt->ve.stats;
    long long tokens = batch_tokens_now(bt);
    double rate = el > 0 ? tokens / el : 0, eta = final ? -1 : batch_eta(bt, tokens, rate);
    ProgressLine l = {.width = tty ? batch_term_width() - 1 : (int)sizeof l.s - 1};
    if (l.width < 1) l.width = 1;
    if (l.width > (int)sizeof l.s - 1) l.width = (int)sizeof l.s - 1;
    char f[128];
    if (bt->n_total >= 0) snprintf(f, sizeof f, "%d/%lld done", bt->n_done, (long long)(bt->n_total - bt->n_skipped));
    else snprintf(f, sizeof f, "%d done", bt->n_done);
    progress_add(&l, f);
    snprintf(f, sizeof f, " (%d failed, %d skipped)", bt->n_failed, bt->n_skipped);
    progress_add(&l, f);
    if (eta >= 0) { snprintf(f, sizeof f, ", ETA %.0f s", eta); progress_add(&l, f); }
    snprintf(f, sizeof f, ", %.1f tokens/s, %lld tokens", rate, tokens);
    progress_add(&l, f);
    snprintf(f, sizeof f, ", %.0f s", el);
    progress_add(&l, f);
    snprintf(f, sizeof f, "; batch %d seqs", s->n_seqs);
    progress_add(&l, f);
    snprintf(f, sizeof f, ", KV %d/%d blocks (%d cached)", s->blocks_used, s->blocks_total, s->blocks_cached);
    progress_add(&l, f);
    snprintf(f, sizeof f, ", %lld preempted", (long long)s->preemptions);
    progress_add(&l, f);
    if (!tty) { fprintf(stderr, "%s\n", l.s); return; }
    /* \r and clear-to-end: the repaint replaces the last one whatever its length. */
    if (final) fprintf(stderr, "%s%s\n", bt->painted ? "\r\033[K" : "", l.s);
    else fprintf(stderr, "\r%s\033[K", l.s);
    bt->painted = !final;
}

/* SIGINT: how to finish the run (the same command with --resume). */
static void batch_resume_hint(const Batch *bt) {
    const BatchOptions *b = bt->b;
    if (!strcmp(b->output, "-")) {
        fprintf(stderr, "cllm generate: interrupted; the results went to stdout, which cannot be resumed (write them "
                "with -o FILE to be able to)\n");
        return;
    }
    fprintf(stderr, "cllm generate: interrupted; the %d finished requests have their lines in %s. To run the rest:\n"
            "  cllm generate", bt->n_done, b->output);
    for (int i = 0; i < b->argc; i++) {
        const char *a = b->argv[i];
        if (!strcmp(a, "--resume") || !strcmp(a, "--overwrite")) continue;
        bool plain = *a != 0;
        for (const char *c = a; *c; c++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *c)) plain = false;
        if (plain) { fprintf(stderr, " %s", a); continue; }
        fputs(" '", stderr);
        for (const char *c = a; *c; c++) fputs(*c == '\'' ? "'\\''" : (char[2]){*c, 0}, stderr);
        fputc('\'', stderr);
    }
    fprintf(stderr, " --resume\n");
}

/* --verbose: one line per step. */
static void batch_step_log(const Batch *bt) {
    const SchedStats *s = &bt->ve.stats;
    fprintf(stderr, "step: %d seqs, %d tokens (%d decode, %d prefill), %d running, %d waiting, KV %d/%d blocks "
            "(%d cached), %lld preempted, %lld prefix tokens reused, %.1f ms (forward %.1f, sampling %.1f, "
            "scheduler %.2f)\n",
            s->n_seqs, s->n_tokens, s->n_decode, s->n_prefill, s->n_running, s->n_waiting, s->blocks_used,
            s->blocks_total, s->blocks_cached, (long long)s->preemptions, (long long)s->prefix_hit_tokens,
            s->seconds * 1e3, s->forward_seconds * 1e3, s->sample_seconds * 1e3, s->own_seconds * 1e3);
}

/* --steps-csv, before a step: each request's computed and generated tokens,
 * so that afterwards its share of the step shows as the difference. */
static void batch_steps_mark(const Batch *bt) {
    for (int k = 0; k < bt->ve.n; k++) {
        const Scheduler *sc = &bt->ve.ve[k];
        SchedRequest *const *qs[2] = {sc->waiting, sc->running};
        int ns[2] = {sc->n_waiting, sc->n_running};
        for (int q = 0; q < 2; q++)
            for (int i = 0; i < ns[q]; i++) {
                BatchItem *it = qs[q][i]->user;
                it->ctx_before = qs[q][i]->n_cached;
            }
    }
}

/* --steps-csv, after a step: its line, what a roofline needs (bench/roofline.py).
 * Per sequence in the step: rows computed c (tokens whose K/V it wrote),
 * context L (keys its attention read: the cache's tokens up to its last
 * row), attention pairs c*L - c*(c-1)/2 (causal), and whether it drew a
 * token (overlapped steps: launched a draw). The step is the engine's that
 * completed (virtual engines: one of them; overlapped: the one launched). A request admitted with prefix-cache hits counts from its cached
 * tokens, so reused blocks are not counted as computed. */
static void batch_steps_write(Batch *bt) {
    const Scheduler *sc = &bt->ve.ve[bt->ve.last];
    const SchedStats *st = &bt->ve.stats;
    long long rows = 0, ctx = 0, pairs = 0;
    int seqs = 0, drawn = st->n_draws;
    SchedRequest *const *qs[2] = {sc->running, sc->finished};
    int ns[2] = {sc->n_running, sc->n_finished};
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < ns[q]; i++) {
            const SchedRequest *r = qs[q][i];
            const BatchItem *it = r->user;
            long long after = r->n_cached, before = it->ctx_before;
            if (r->state == REQ_FINISHED && after == 0) after = (long long)r->tokens.n - 1;
            if (before == 0 && r->cached_tokens > 0 && r->cached_tokens < after) before = r->cached_tokens;
            long long c = after - before;
            if (c <= 0) continue;
            seqs++;
            rows += c;
            ctx += after;
            pairs += c * after - c * (c - 1) / 2;
        }
    if (bt->n_steps++ == 0)
        fprintf(bt->steps_csv, "step,seconds,seqs,prefill_rows,decode_rows,rows_seen,drawn,context_tokens,attn_pairs\n");
    fprintf(bt->steps_csv, "%lld,%.6f,%d,%d,%d,%lld,%d,%lld,%lld\n", (long long)bt->n_steps, st->seconds, seqs,
            st->n_prefill, st->n_decode, rows, drawn, ctx, pairs);
}

/* Steps until the input is read and every request has its line. */
static int batch_loop(Batch *bt) {
    Err err = {{0}};
    for (;;) {
        if (batch_interrupted) return 130;
        double t0 = now_seconds();
        if (batch_collect(bt, false)) return 2;
        double t1 = now_seconds();
        if (batch_fill(bt)) return 2;
        double t2 = now_seconds();
        if (batch_feed(bt)) return 2;
        double t3 = now_seconds();
        bt->t_hand += t1 - t0;
        bt->t_read += t2 - t1;
        bt->t_feed += t3 - t2;
        if (vengines_pending(&bt->ve) == 0) {
            if (bt->in_done && ordered_work_size(bt->tokenizers) == 0) return batch_release_held(bt, NULL) ? 2 : 0;
            continue; /* what was fed so far only got error lines: read on */
        }
        if (bt->steps_csv) batch_steps_mark(bt);
        if (vengines_step(&bt->ve, &err)) { fprintf(stderr, "cllm generate: %s\n", err.msg); return 2; }
        if (bt->o->verbose && bt->ve.stats.n_tokens > 0) batch_step_log(bt);
        if (bt->steps_csv && bt->ve.stats.n_tokens > 0) batch_steps_write(bt);
        SchedRequest *r;
        t0 = now_seconds();
        while ((r = vengines_pop_finished(&bt->ve)))
            if (batch_write_result(bt, r)) return 2;
        batch_progress(bt, false);
        bt->t_hand += now_seconds() - t0;
    }
}

/* Frees the requests still in the scheduler (after an error stopped the run). */
static void batch_drop_pending(Batch *bt) {
    for (int k = 0; k < bt->ve.n; k++) {
        Scheduler *sc = &bt->ve.ve[k];
        SchedRequest **qs[3] = {sc->waiting, sc->running, sc->finished};
        int ns[3] = {sc->n_waiting, sc->n_running, sc->n_finished};
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < ns[q]; i++) batch_item_free(qs[q][i]->user);
    }
    for (int i = 0; i < bt->n_held; i++) batch_item_free(bt->held[i]);
    bt->n_held = 0;
}

/* Opens the output (truncated, or resumed) once the input and the model
 * are open, so that from here on the output reflects this run. */
static int batch_open_output(Batch *bt, Err *err) {
    const BatchOptions *b = bt->b;
    if (!(bt->out = results_open(b->output, prompts_format(bt->in), b->resume, b->retry_errors, err))) return -1;
    if (b->ordered && !(bt->order = results_ordered_new(bt->out, 0))) return err_set(err, "out of memory");
    ResultResume ri = results_resume_info(bt->out);
    if (ri.bytes_dropped > 0)
        fprintf(stderr, "cllm generate: %s: dropped its last %lld bytes, a partial line left by a run that was cut "
                "off while writing it; that request runs again\n", b->output, (long long)ri.bytes_dropped);
    return 0;
}

/* The end of the run for the input's sake: an input that held no prompt, or
 * one whose reading failed, is exit 1 (after every request read has its line). */
static int batch_input_verdict(const Batch *bt) {
    const char *in = strcmp(bt->b->input, "-") ? bt->b->input : "<stdin>";
    if (bt->in_failed) {
        fprintf(stderr, "cllm generate: %s: reading stopped at the error above; the %lld requests read before it "
                "have their lines in %s\n", in, (long long)bt->n_read, bt->b->output);
        return 1;
    }
    if (bt->n_read > 0) return 0;
    fprintf(stderr, "cllm generate: %s: the input holds no prompts; %s %s\n", in, bt->b->output,
            bt->b->resume ? "keeps the lines of earlier runs" : "is empty");
    return 1;
}

/* The setup failed after the output was opened: everything opened so far
 * closed, the command's exit code for it. */
static int batch_setup_failed(Batch *bt) {
    if (bt->steps_csv) fclose(bt->steps_csv);
    results_ordered_free(bt->order);
    results_close(bt->out);
    vengines_free(&bt->ve);
    prompts_close(bt->in);
    runtime_close(&bt->rt);
    return 2;
}

int batch_main(const RunOptions *o, const BatchOptions *b) {
    Batch bt = {0};
    bt.b = b;
    bt.t_launch = now_seconds();
    Err err = {{0}};
    if (b->max_seqs < 0 || b->max_batched_tokens < 0) {
        fprintf(stderr, "cllm generate: --max-seqs (%d) and --max-batched-tokens (%d) must be positive (0: from the "
                "KV cache)\n", b->max_seqs, b->max_batched_tokens);
        return 2;
    }
    if (b->retry_errors && !b->resume) {
        fprintf(stderr, "cllm generate: --retry-errors goes with --resume\n");
        return 2;
    }
    /* Every step holds up to max_batched_tokens rows: the engine's chunk
     * (sized before the cache, so the default's largest; the scheduler
     * takes less where the cache holds less). */
    RunOptions ro = *o;
    ro.prefill_chunk = b->max_batched_tokens > 0 ? b->max_batched_tokens : ENGINE_AUTO_BATCHED_TOKENS;
    bt.o = &ro;
    if (run_options_serves_stage(&ro)) return runtime_serve_main(&ro, "generate"); /* no input, no output */
    if (b->chat && b->raw) {
        fprintf(stderr, "cllm generate: --chat and --raw contradict each other; give one\n");
        return 2;
    }
    if (results_check_not_input(b->output, b->input, &err) ||
        (!b->resume && !b->overwrite && results_check_overwrite(b->output, &err))) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        return 2;
    }
    bt.in = prompts_open(b->input, PROMPTS_AUTO, &err);
    if (!bt.in) { fprintf(stderr, "cllm generate: %s\n", err.msg); return 2; }
    SchedOptions so = {.max_seqs = b->max_seqs, .max_batched_tokens = b->max_batched_tokens, .sample_threads = o->threads,
                      .host_sampling = o->host_sampling};
    if (runtime_open(&bt.rt, &ro, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        prompts_close(bt.in);
        return 2;
    }
    if (app_model_sampling("generate", &bt.rt.model, b->sampling_given, &ro.sampling, &err) ||
        runtime_chat_template(&bt.rt, o->chat_template, &bt.tmpl, &err) ||
        vengines_init(&bt.ve, &bt.rt.engine, &so, 0, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        prompts_close(bt.in);
        runtime_close(&bt.rt);
        return 2;
    }
    if (o->verbose) runtime_print_limits("generate", &bt.rt, &so, &bt.ve.ve[0].o, bt.ve.n);
    if (batch_open_output(&bt, &err)) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        return batch_setup_failed(&bt);
    }
    /* A text file's lines are user turns when the model has a chat template
     * (an instruct model); JSON Lines keep the OpenAI meaning: "prompt" raw,
     * "messages" templated. */
    bt.prompts_chat = b->chat || (!b->raw && prompts_format(bt.in) == PROMPTS_TEXT &&
                                  (o->chat_template || tokenizer_chat_template(bt.rt.model.tok)));
    if (b->steps_csv && !(bt.steps_csv = fopen(b->steps_csv, "w"))) {
        fprintf(stderr, "cllm generate: --steps-csv %s: %s\n", b->steps_csv, strerror(errno));
        return batch_setup_failed(&bt);
    }
    /* Tokenizers: half the cores (the rest keep the CPU backend's and the
     * sampler's threads busy), at most 8; one writer. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_tokenizers = cores >= 4 ? (int)(cores / 2) : 1;
    if (n_tokenizers > 8) n_tokenizers = 8;
    if (!(bt.tokenizers = ordered_work_new(n_tokenizers, batch_tokenize, &bt, &err)) ||
        !(bt.writer = ordered_work_new(1, batch_write_job, &bt, &err))) {
        fprintf(stderr, "cllm generate: %s\n", err.msg);
        ordered_work_free(bt.tokenizers, NULL, NULL);
        return batch_setup_failed(&bt);
    }
    bt.n_total = batch_count_inputs(b->input);
    bt.t0 = now_seconds();
    /* Ctrl-C stops between steps; a second one (SA_RESETHAND) kills at once,
     * which the line-at-a-time output survives as well. */
    struct sigaction sa = {.sa_handler = batch_on_sigint, .sa_flags = SA_RESETHAND | SA_RESTART}, old_sa;
    sigemptyset(&sa.sa_mask);
    batch_interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);
    int rc = batch_loop(&bt);
    sigaction(SIGINT, &old_sa, NULL);
    /* Requests still being tokenized never ran: dropped. Every finished one
     * gets its line: the writer is drained. */
    ordered_work_free(bt.tokenizers, batch_tokenize_discard, NULL);
    double t_drain = now_seconds();
    if (batch_collect(&bt, true) && (!rc || rc == 130)) rc = 2;
    bt.t_drain = now_seconds() - t_drain;
    ordered_work_free(bt.writer, batch_write_discard, NULL);
    if (!rc) rc = batch_input_verdict(&bt);
    if (rc) batch_drop_pending(&bt);
    batch_progress(&bt, true);
    const SchedStats *st = &bt.ve.stats;
    if (o->verbose && st->busy_seconds > 0)
        fprintf(stderr, "steps took %.2f s; the scheduler's own work (outside forward and sampling) %.3f s = %.2f%%; "
                "%lld steps overlapped (launched before the previous step's tokens were taken)\n",
                st->busy_seconds, st->scheduler_seconds, 100.0 * st->scheduler_seconds / st->busy_seconds,
                (long long)st->overlapped);
    if (bt.order) {
        if (results_ordered_finish(bt.order, NULL, &err)) { fprintf(stderr, "cllm generate: %s\n", err.msg); rc = 2; }
        results_ordered_free(bt.order);
    }
    if (bt.out && results_finish(bt.out, &err)) { fprintf(stderr, "cllm generate: %s\n", err.msg); rc = 2; }
    if (bt.steps_csv && fclose(bt.steps_csv)) {
        fprintf(stderr, "cllm generate: --steps-csv %s: %s\n", b->steps_csv, strerror(errno));
        if (!rc) rc = 2;
    }
    /* The share of wall time in steps: what is outside them (loading, reading
     * and tokenizing, writing) is time the GPU idles. */
    double t_end = now_seconds();
    if (o->verbose && bt.ve.busy_seconds > 0)
        fprintf(stderr, "wall %.2f s: load %.2f s, then %.2f s of which steps %.2f s = %.2f%% (%.2f%% of the whole)\n",
                t_end - bt.t_launch, bt.t0 - bt.t_launch, t_end - bt.t0, bt.ve.busy_seconds,
                100.0 * bt.ve.busy_seconds / (t_end - bt.t0), 100.0 * bt.ve.busy_seconds / (t_end - bt.t_launch));
    if (o->verbose && bt.ve.busy_seconds > 0)
        fprintf(stderr, "outside the steps: reading the input %.3f s, waiting for and submitting tokenized prompts "
                "%.3f s, handing lines to the writer %.3f s, its last lines %.3f s, the rest %.3f s\n", bt.t_read,
                bt.t_feed, bt.t_hand, bt.t_drain,
                t_end - bt.t0 - bt.ve.busy_seconds - bt.t_read - bt.t_feed - bt.t_hand - bt.t_drain);
    if (o->verbose && bt.ve.busy_seconds > 0) {
        const Runtime *r = &bt.rt;
        double load = bt.t0 - bt.t_launch;
        fprintf(stderr, "the load's %.2f s: the model's tensors %.2f s, finding the GPUs %.2f s, backends, links and "
                "engine %.2f s, the rest (output, tokenizers, schedulers) %.2f s\n", load, r->model_s, r->gpus_s,
                r->open_s, load - r->model_s - r->gpus_s - r->open_s);
    }
    if (rc == 130) batch_resume_hint(&bt);
    free(bt.held);
    vengines_free(&bt.ve);
    prompts_close(bt.in);
    double t_close = now_seconds();
    runtime_close(&bt.rt);
    /* what follows this line is the process's exit (the CUDA contexts' teardown with GPUs) */
    if (o->verbose) fprintf(stderr, "closed in %.2f s (engine, backends, links, model)\n", now_seconds() - t_close);
    return rc;
}
