/* serve.h — `cllm serve`: an OpenAI-compatible HTTP server over the
 * continuous-batching scheduler that `cllm generate` uses. */
#ifndef CLLM_SERVE_H
#define CLLM_SERVE_H

#include <stdbool.h>
#include <stddef.h>

#include "app/runtime.h"

typedef struct {
    const char *host;         /* address to bind (default 127.0.0.1) */
    int port;                 /* 0: any free port (the one bound is printed) */
    const char *api_key;      /* NULL: no key; else "Authorization: Bearer KEY" on /v1/ */
    size_t max_request_bytes; /* largest request body */
    int max_connections;      /* connections served at once; more get 503 */
    int max_seqs;             /* sequences per step */
    int max_batched_tokens;   /* tokens per step */
    int grace_seconds;        /* after SIGTERM/SIGINT: how long running requests may finish */
    unsigned sampling_given;  /* SAMPLING_GIVEN_* options the user gave */
    bool seed_given;          /* --seed: requests without a seed use it (else a fresh one each) */
    const char *model_name;   /* the id /v1/models and responses name (default: the file's name) */
} ServeOptions;

void serve_options_default(ServeOptions *s);
/* Serves until SIGTERM or SIGINT; 0 after a clean stop, 2 when the model
 * cannot be loaded or the address cannot be bound. */
int serve_main(const RunOptions *o, const ServeOptions *s);

#endif
