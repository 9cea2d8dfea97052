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
    bool chat;               /* plain prompts go through the chat template */
    bool retry_errors;       /* with resume: run failed ids again */
    int max_seqs;            /* sequences per step (default 256) */
    int max_batched_tokens;  /* tokens per step (default 8192) */
} BatchOptions;

void batch_options_default(BatchOptions *b);
/* Returns 0 when every request got an output line (some may carry errors), 2
 * on a user error that stopped the run (unreadable input, model fails to load). */
int batch_main(const RunOptions *o, const BatchOptions *b);

#endif
