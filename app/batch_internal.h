/* batch_internal.h — what the files of `cllm generate` share (batch.c: the
 * input, the tokenizers and the step loop; batch_write.c: the result lines,
 * written by a thread of their own). Not for other commands. */
#ifndef CLLM_BATCH_INTERNAL_H
#define CLLM_BATCH_INTERNAL_H

#include <stdio.h>

#include "app/batch.h"
#include "app/ordered_work.h"
#include "app/prompts.h"
#include "app/results.h"
#include "engine/virtual_engines.h"
#include "tokenizer/chat_template.h"

/* One request: the parsed input line (its stop strings are borrowed by the
 * scheduler), its tokens (made on a tokenizer thread) and what the result
 * line needs. */
typedef struct BatchItem {
    PromptRequest req;
    TokenIds ids;                 /* the prompt's tokens, once tokenized */
    bool tokenize_failed;         /* tokenize_error says why */
    char tokenize_error[1024];
    int prompt_tokens;
    double t_start;
    int ctx_before;               /* --steps-csv: computed tokens before the step */
} BatchItem;

typedef struct {
    Runtime rt;
    const RunOptions *o;
    const BatchOptions *b;
    ChatTemplate tmpl;
    bool prompts_chat;            /* prompts without messages go through the template */
    PromptReader *in;
    bool in_done, in_failed;      /* in_failed: reading stopped at an error (exit 1) */
    int64_t n_read;               /* requests read (resume's skipped ones too) */
    ResultWriter *out;            /* out and order: the writer thread's alone while it runs */
    ResultOrder *order;           /* --ordered */
    bool write_broken;            /* the writer thread's: a write failed, later lines are not tried */
    OrderedWork *tokenizers;      /* BatchItems, tokenized on worker threads, back in input order */
    OrderedWork *writer;          /* WriteJobs, written in order by one thread */
    VirtualEngines ve;            /* one scheduler per pipeline stage (virtual engines) */
    int64_t n_total;              /* requests in the input, when it could be counted; else -1 */
    BatchItem **held;             /* duplicates whose first request is still running */
    int n_held, cap_held;
    int n_done, n_failed, n_skipped; /* n_done, n_failed: lines written */
    long long tokens_out;         /* tokens of the lines written */
    long long tokens_writing;     /* tokens of the finished requests queued for the writer */
    double t0, last_progress;
    double t_launch;              /* batch_main's start: the run's wall time includes the load */
    double t_read, t_feed, t_hand, t_drain; /* -v: the loop's time outside steps: reading the input, waiting
                                               for and submitting tokenized prompts, handing lines to the
                                               writer (and the progress line), the writer's last lines */
    FILE *steps_csv;              /* --steps-csv: one line per step */
    int64_t n_steps;
    bool painted;                 /* a progress line is on the terminal, not yet ended */
} Batch;

/* batch_write.c. Each hands its item (and request) to the writer thread,
 * which writes the line; batch_collect frees them. -1: the run must stop
 * (out of memory, or a write failed: said on stderr). */
int batch_write_result(Batch *bt, SchedRequest *sr);                          /* a finished request */
int batch_write_error(Batch *bt, BatchItem *it, const char *error, int prompt_tokens); /* one that never ran */
int batch_write_skip(Batch *bt, int64_t index);                                /* --ordered: resume skipped it */
/* Takes back the lines written (all of them, waiting, when wait): counts
 * them and frees their items. -1 when a write failed. */
int batch_collect(Batch *bt, bool wait);
/* The writer thread's work on one job (an OrderedWorkFn over a Batch). */
void batch_write_job(void *ctx, void *job);
/* Frees a job the writer never took back (ordered_work_free's discard). */
void batch_write_discard(void *ctx, void *job, bool ran);

/* Writes the error lines of the held duplicates of id (all of them when id
 * is NULL). */
int batch_release_held(Batch *bt, const char *id);

#endif
