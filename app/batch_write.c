/* batch_write.c — the result lines of `cllm generate`, written by a thread
 * of their own so that formatting (log-probabilities can be large) and the
 * writes themselves never hold up the step loop.
 *
 * The loop hands each finished request (or a request's error line, or
 * --ordered's note that resume skipped an index) to the writer as a
 * WriteJob; the one writer thread takes them in the order given, so the
 * output is what the loop would have written itself: a line as soon as its
 * request finishes (--ordered: as soon as every earlier input has its own),
 * a duplicate id's error line after its first request's line. The loop
 * takes the jobs back once written (batch_collect): that is where the
 * counts move and the items are freed, on the loop's thread. While the
 * writer runs, the ResultWriter and ResultOrder are its alone. */
#include <stdlib.h>
#include <string.h>

#include "app/batch_internal.h"
#include "app/logprobs_json.h"
#include "base/clock.h"

typedef enum { WRITE_RESULT, WRITE_ERROR, WRITE_SKIP } WriteKind;

typedef struct {
    WriteKind kind;
    BatchItem *it;                /* RESULT, ERROR */
    SchedRequest *sr;             /* RESULT */
    int64_t index;                /* SKIP */
    const char *error;            /* ERROR: the line's error (the item's own, or error_buf) */
    char error_buf[1024];
    int prompt_tokens;            /* ERROR */
    double seconds;               /* RESULT: the request's time, taken when it finished */
    /* set by the writer */
    int rc;                       /* -1: the output could not be written (msg says why) */
    bool failed;                  /* an error line */
    int completion_tokens;
    char msg[1024];
} WriteJob;

/* The log-probability values of a finished request's line, as asked. */
static int write_logprobs_json(const Batch *bt, const PromptRequest *r, const SchedRequest *sr, JsonBuf *lp,
                               JsonBuf *plp) {
    const Tokenizer *tok = bt->rt.model.tok;
    int rc = 0;
    if (r->logprobs >= 0 && r->is_chat) rc |= logprobs_json_chat(lp, tok, sr->lp.v, sr->lp.n, r->logprobs);
    else if (r->logprobs >= 0)
        rc |= logprobs_json_completion(lp, tok, r->echo ? sr->prompt_lp : NULL, r->echo ? sr->n_prompt : 0, sr->lp.v,
                                       sr->lp.n, r->logprobs);
    if (r->prompt_logprobs >= 0) rc |= logprobs_json_prompt(plp, tok, sr->prompt_lp, sr->n_prompt, r->prompt_logprobs);
    rc |= textbuf_append(lp, "", 1) | textbuf_append(plp, "", 1); /* NUL-terminated */
    return rc;
}

/* Writes a line now, or through the reorder buffer (--ordered); on the writer thread. */
static void write_line(Batch *bt, WriteJob *j, int64_t index, const ResultLine *line) {
    j->failed = line->error != NULL;
    j->completion_tokens = line->completion_tokens;
    if (bt->write_broken) { /* the run is stopping: said once already */
        j->rc = -1;
        return;
    }
    Err err = {{0}};
    j->rc = bt->order ? results_ordered_put(bt->order, index, line, &err) : results_write(bt->out, line, &err);
    if (j->rc) {
        bt->write_broken = true;
        snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    }
}

/* The line of a finished request. */
static void write_result(Batch *bt, WriteJob *j) {
    const SchedRequest *sr = j->sr;
    const PromptRequest *r = &j->it->req;
    bool failed = !strcmp(sr->finish_reason, "error");
    ResultLine line = {.id = r->id, .id_is_number = r->id_is_number, .is_chat = r->is_chat, .model = r->model};
    line.text = !failed && sr->text.data ? sr->text.data : "";
    line.text_len = failed ? 0 : sr->text.len;
    line.finish_reason = failed ? "error" : !strcmp(sr->finish_reason, "stop") ? "stop" : "length";
    line.error = failed ? sr->error : NULL;
    line.prompt_tokens = j->it->prompt_tokens;
    line.completion_tokens = sr->n_generated;
    line.seconds = j->seconds;
    JsonBuf lp = {0}, plp = {0}, echo = {0};
    if (!failed && write_logprobs_json(bt, r, sr, &lp, &plp)) {
        line = (ResultLine){.id = r->id, .id_is_number = r->id_is_number, .is_chat = r->is_chat, .model = r->model,
                            .text = "", .error = "out of memory writing logprobs", .prompt_tokens = j->it->prompt_tokens};
        failed = true;
    }
    if (!failed && r->logprobs >= 0) line.logprobs = lp.data;
    if (!failed && r->prompt_logprobs >= 0) line.prompt_logprobs = plp.data;
    if (!failed && r->echo && r->prompt) { /* OpenAI's echo: the prompt, then the reply */
        if (textbuf_append(&echo, r->prompt, strlen(r->prompt)) || textbuf_append(&echo, line.text, line.text_len)) {
            line.error = "out of memory echoing the prompt";
            line.text_len = 0;
        } else {
            line.text = echo.data;
            line.text_len = echo.len;
        }
    }
    write_line(bt, j, r->index, &line);
    jsonbuf_free(&lp);
    jsonbuf_free(&plp);
    jsonbuf_free(&echo);
}

void batch_write_job(void *ctx, void *job) {
    Batch *bt = ctx;
    WriteJob *j = job;
    if (j->kind == WRITE_RESULT) {
        write_result(bt, j);
    } else if (j->kind == WRITE_ERROR) {
        const PromptRequest *r = &j->it->req;
        ResultLine line = {.id = r->id, .id_is_number = r->id_is_number, .text = "", .finish_reason = "error",
                           .is_chat = r->is_chat, .model = r->model, .error = j->error,
                           .prompt_tokens = j->prompt_tokens};
        write_line(bt, j, r->index, &line);
    } else if (!bt->write_broken) {
        Err err = {{0}};
        if ((j->rc = results_ordered_skip(bt->order, j->index, &err))) {
            bt->write_broken = true;
            snprintf(j->msg, sizeof j->msg, "%s", err.msg);
        }
    }
}

static void job_free(WriteJob *j) {
    if (j->it) {
        prompt_request_free(&j->it->req);
        token_ids_free(&j->it->ids);
        free(j->it);
    }
    sched_request_free(j->sr);
    free(j);
}

void batch_write_discard(void *ctx, void *job, bool ran) {
    (void)ctx;
    (void)ran;
    job_free(job);
}

/* Queues a job for the writer; on failure frees it. */
static int write_push(Batch *bt, WriteJob *j) {
    if (!ordered_work_push(bt->writer, j)) return 0;
    fprintf(stderr, "cllm generate: out of memory queueing a result line\n");
    job_free(j);
    return -1;
}

static WriteJob *job_new(Batch *bt, WriteKind kind, BatchItem *it) {
    WriteJob *j = calloc(1, sizeof *j);
    if (!j) {
        fprintf(stderr, "cllm generate: out of memory\n");
        if (it) {
            prompt_request_free(&it->req);
            token_ids_free(&it->ids);
            free(it);
        }
        return NULL;
    }
    j->kind = kind;
    j->it = it;
    return j;
}

int batch_write_result(Batch *bt, SchedRequest *sr) {
    BatchItem *it = sr->user;
    WriteJob *j = job_new(bt, WRITE_RESULT, it);
    if (!j) {
        sched_request_free(sr);
        return -1;
    }
    j->sr = sr;
    j->seconds = now_seconds() - it->t_start;
    bt->tokens_writing += sr->n_generated;
    /* it->req.id stays valid until the job is collected, on this thread */
    if (write_push(bt, j)) return -1;
    return batch_release_held(bt, it->req.id);
}

int batch_write_error(Batch *bt, BatchItem *it, const char *error, int prompt_tokens) {
    WriteJob *j = job_new(bt, WRITE_ERROR, it);
    if (!j) return -1;
    if (error == it->req.error) {
        j->error = error;
    } else {
        snprintf(j->error_buf, sizeof j->error_buf, "%s", error);
        j->error = j->error_buf;
    }
    j->prompt_tokens = prompt_tokens;
    return write_push(bt, j);
}

int batch_write_skip(Batch *bt, int64_t index) {
    WriteJob *j = job_new(bt, WRITE_SKIP, NULL);
    if (!j) return -1;
    j->index = index;
    return write_push(bt, j);
}

int batch_collect(Batch *bt, bool wait) {
    int rc = 0;
    WriteJob *j;
    while ((j = ordered_work_pop(bt->writer, wait))) {
        if (j->rc) {
            if (j->msg[0]) fprintf(stderr, "cllm generate: %s\n", j->msg);
            rc = -1;
        }
        if (j->kind != WRITE_SKIP) {
            bt->n_done++;
            bt->n_failed += j->failed;
            bt->tokens_out += j->completion_tokens;
        }
        if (j->sr) bt->tokens_writing -= j->sr->n_generated;
        job_free(j);
    }
    return rc;
}

int batch_release_held(Batch *bt, const char *id) {
    int rc = 0, kept = 0;
    for (int i = 0; i < bt->n_held; i++) {
        BatchItem *it = bt->held[i];
        if (id && strcmp(it->req.id, id)) { bt->held[kept++] = it; continue; }
        if (rc) { /* the run is stopping: free the rest */
            prompt_request_free(&it->req);
            free(it);
            continue;
        }
        rc = batch_write_error(bt, it, it->req.error, 0);
    }
    bt->n_held = kept;
    return rc;
}
