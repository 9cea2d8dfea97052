/* results.h — the output side of `cllm generate`: writes one JSON line per
 * request so that a killed run never leaves a broken file, resumes from an
 * earlier output, and (for --ordered) holds results back until every earlier
 * input has been written.
 *
 * Durability: each line is built whole in memory and handed to write(2) (a
 * loop over short writes) on a descriptor opened O_APPEND, with no stdio
 * buffering in between; a .gz output gets one complete gzip member per line,
 * so a process killed at any point leaves a file whose every complete member
 * decompresses (gzip, zcat and gzread read concatenated members). A kill in
 * the middle of a write can leave at most one partial line or member at the
 * end, which resume removes.
 *
 * Output lines. For text and JSON Lines input:
 *   {"id": ..., "text": "...", "prompt_tokens": N, "completion_tokens": N,
 *    "finish_reason": "stop"|"length"|..., "seconds": S, "error": "..."}
 *   ("error" only when the request failed; "logprobs" and "prompt_logprobs"
 *   after "seconds" only when asked, see app/logprobs_json.h). For OpenAI batch input, the
 *   OpenAI batch output shape:
 *   {"id": "batch_req_…", "custom_id": ..., "response": {"status_code": 200,
 *    "request_id": "…", "body": {"id": "chatcmpl-…" | "cmpl-…", "object":
 *    "chat.completion" | "text_completion", "created": T, "model": "…",
 *    "choices": [{"index": 0, "message": {"role": "assistant", "content": …}
 *    | "text": …, "logprobs": null | {…}, ["prompt_logprobs": […],] "finish_reason": …}], "usage":
 *    {"prompt_tokens", "completion_tokens", "total_tokens"}}}, "error": null}
 *   and for a failed request "response": null, "error": {"message": "…"}.
 * Ids are written back as given: strings as strings, numeric ids as the same
 * number text (id_is_number). Text that is not valid UTF-8 is written with
 * each invalid sequence replaced by U+FFFD.
 */
#ifndef CLLM_RESULTS_H
#define CLLM_RESULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app/prompts.h"
#include "base/err.h"
#include "base/json.h"

typedef struct {
    const char *id;
    bool id_is_number;          /* id is JSON number text (PromptRequest.id_is_number) */
    const char *text;           /* may be NULL (= "") */
    size_t text_len;            /* 0: strlen(text); give it when text may hold NUL */
    int prompt_tokens, completion_tokens;
    const char *finish_reason;  /* "stop" | "length" | "error" | ...; NULL: "error" when
                                   error is set, else "stop" */
    const char *error;          /* NULL unless the request failed */
    double seconds;             /* wall time of the request */
    bool is_chat;               /* OpenAI output: chat.completion (else text_completion) */
    const char *model;          /* OpenAI output: body "model"; NULL = "" */
    const char *logprobs;       /* JSON value (app/logprobs_json.h) when asked: JSONL "logprobs"
                                   member; OpenAI choices[0].logprobs (NULL: null there, absent in JSONL) */
    const char *prompt_logprobs; /* JSON value when asked (vLLM's list); NULL: absent */
} ResultLine;

/* What resume found in the existing output. */
typedef struct {
    int64_t lines;          /* complete lines read */
    int64_t failed;         /* of them, lines of failed requests */
    int64_t unreadable;     /* complete lines that are not JSON objects (kept, not done) */
    int64_t bytes_dropped;  /* a partial last line / gzip member cut off */
    bool rewritten;         /* retry_errors: failed lines were removed from the file */
} ResultResume;

typedef struct ResultWriter ResultWriter;

/* Refuses an output that is the input itself: the same file by any name (a
 * symbolic or hard link: same st_dev and st_ino), a name that does not exist
 * yet but resolves to the input's path, or stdin / stdout ("-") redirected
 * to the other. Writing it would truncate or grow the prompts while they
 * are read. Opens nothing; call it before results_open. */
int results_check_not_input(const char *out, const char *in, Err *err);

/* Refuses to replace an output that holds results: a non-empty regular file
 * at out (stdout, a missing or empty file, and a device such as /dev/null
 * pass). generate calls it unless --resume or --overwrite was given, before
 * the model loads; the message names the file and both ways out. */
int results_check_overwrite(const char *out, Err *err);

/* Opens path for writing ("-" = stdout; a name ending in .gz = gzip). fmt is
 * the INPUT format (PROMPTS_OPENAI selects the OpenAI output shape).
 * Without resume an existing file is replaced. With resume (regular files
 * only) the existing output is read first: a partial last line (or gzip
 * member) is cut off, and the ids of complete lines become the done set
 * (results_is_done, results_done_count). Lines of failed requests count as done unless
 * retry_errors; with retry_errors they are removed from the file (rewritten
 * through a temporary file and renamed) so each id ends up with one line. */
ResultWriter *results_open(const char *path, PromptFormat fmt, bool resume, bool retry_errors, Err *err);
/* Writes one whole line (see the top of this file). */
int results_write(ResultWriter *w, const ResultLine *line, Err *err);
/* Whether resume found id done. False without resume. */
bool results_is_done(const ResultWriter *w, const char *id);
/* How many lines resume found with id (those of failed requests not
 * counted under retry_errors); 0 without resume. The k-th request with an id
 * in the input is done when this is >= k: the first request with an id
 * always writes the id's first line, because generate writes a duplicate's
 * error line only after the first request's own line (app/batch.c). */
int64_t results_done_count(const ResultWriter *w, const char *id);
const IdSet *results_done(const ResultWriter *w); /* NULL without resume */
ResultResume results_resume_info(const ResultWriter *w);
/* fsyncs (regular files) and closes; -1 when the data may not have reached
 * the file. Frees w either way. */
int results_finish(ResultWriter *w, Err *err);
/* results_finish for callers with nothing to do about a failure. */
void results_close(ResultWriter *w);

/* The resume scan on its own: adds to done the ids of the complete lines of
 * the output at path (plain or .gz by name; a missing file adds none); fmt
 * is the input format, as for results_open. Lines of failed requests are
 * added unless retry_errors. Reads only; cuts nothing. */
int results_done_ids(const char *path, PromptFormat fmt, bool retry_errors, IdSet *done, Err *err);

/* A JSON string of s[0..n) with every invalid UTF-8 sequence as U+FFFD. */
int results_put_text(JsonBuf *b, const char *s, size_t n);

/* The two halves of results_write: format the line (with its '\n') into
 * out, and write bytes that form whole lines. */
int results_format(ResultWriter *w, const ResultLine *line, JsonBuf *out);
int results_write_raw(ResultWriter *w, const char *bytes, size_t len, Err *err);

/* --ordered: a reorder buffer in front of a writer. Each request has an
 * index (PromptRequest.index: 0, 1, 2, ... in input order). A result is
 * written as soon as every lower index has been written or skipped; until
 * then it is held, formatted, in memory. */
typedef struct ResultOrder ResultOrder;
ResultOrder *results_ordered_new(ResultWriter *w, int64_t first_index);
int results_ordered_put(ResultOrder *o, int64_t index, const ResultLine *line, Err *err);
/* An index that writes nothing (a request skipped by resume). */
int results_ordered_skip(ResultOrder *o, int64_t index, Err *err);
size_t results_ordered_pending(const ResultOrder *o); /* results held */
int64_t results_ordered_next(const ResultOrder *o);   /* lowest index not yet written */
/* Writes whatever is still held, in index order, past missing indexes
 * (counted in *gaps when gaps is not NULL). */
int results_ordered_finish(ResultOrder *o, int64_t *gaps, Err *err);
void results_ordered_free(ResultOrder *o);

#endif
