/* batch.h — `cllm generate`: answers every prompt of a file. */
#ifndef CLLM_BATCH_H
#define CLLM_BATCH_H

#include <stdbool.h>

#include "app/runtime.h"

typedef struct {
    const char *input;       /* path, .gz, or "-" */
    const char *output;      /* path, .gz, or "-" (default) */
    bool resume;             /* skip ids already in the output */
    bool ordered;            /* write in input order */
    bool chat;               /* every prompt (JSON Lines "prompt" too) goes through the chat template */
    bool raw;                /* text-file lines stay raw completions even when the model has a template */
    bool overwrite;          /* replace an output that already holds results */
    bool retry_errors;       /* with resume: run failed ids again */
    unsigned sampling_given; /* SAMPLING_GIVEN_* options the user gave: they win over the model's own settings */
    int max_seqs;            /* sequences per step (0: from the KV cache, engine_auto_max_seqs) */
    int max_batched_tokens;  /* tokens per step (0: engine_auto_max_batched_tokens) */
    const char *steps_csv;   /* NULL, or a file that gets one CSV line per step (the roofline's input) */
    int argc;                /* the generate command's arguments, for the resume hint */
    char **argv;             /*   printed on SIGINT; may be 0 / NULL */
} BatchOptions;

void batch_options_default(BatchOptions *b);
/* The exit status of `cllm generate`:
 *   0  every request of the input has its line in the output (some may be
 *      error lines: a bad request fails alone);
 *   1  the input held no prompt (the output is then empty, or with --resume
 *      keeps its earlier lines), or reading it broke partway (a .gz that does
 *      not inflate, a read error): every request read before the break has
 *      its line;
 *   2  nothing ran, the output untouched: bad options, -o naming the input,
 *      an input that cannot be opened, a model that does not load; or the
 *      run stopped because the output could not be written; an output that
 *      already holds results without --resume or --overwrite;
 *   130 stopped by SIGINT (Ctrl-C): every finished request has its line; the
 *      message says how to resume (the same command with --resume).
 * The output is opened (truncated, or resumed) once the input and the model
 * are open, so from then on it reflects this run. */
int batch_main(const RunOptions *o, const BatchOptions *b);

#endif
