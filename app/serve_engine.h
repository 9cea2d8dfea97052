/* serve_engine.h — what the connections of `cllm serve` share with its engine
 * thread: jobs (one HTTP generation request, n choices), the queue that
 * hands them over, and the counters /metrics shows.
 *
 * One mutex (Server.mu) guards everything here that both sides touch: the
 * queue, each choice's pending text and state, a job's cancel flag and
 * reference state, the counters. The engine thread runs the scheduler's
 * steps without it; the text callback takes it for the length of an append.
 * A job is freed by the last of its two holders: the connection (which
 * releases it when its answer is written, or when its client went away) and
 * the engine (once every choice has finished). */
#ifndef CLLM_SERVE_ENGINE_H
#define CLLM_SERVE_ENGINE_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "app/runtime.h"
#include "app/serve.h"
#include "app/serve_api.h"
#include "engine/virtual_engines.h"

typedef struct ServeJob ServeJob;

typedef struct {
    ServeJob *job;
    int index;
    TextBuf pending;              /* text made and not yet taken by the connection (under mu) */
    size_t emitted;               /* bytes of text made so far */
    bool done;                    /* finished (under mu) */
    const char *finish_reason;    /* "stop" or "length" once done */
    char error[1024];              /* non-empty: it failed */
    int completion_tokens;
    TokenLogprobs lp;             /* the generated tokens' logprobs so far, when asked (under mu) */
    int lp_taken;                 /* entries of lp a stream has sent (under mu) */
    const SchedRequest *sr;       /* its scheduler request while it runs (engine thread only) */
} ServeChoice;

struct ServeJob {
    ApiRequest req;
    TokenIds ids;                 /* the prompt */
    GenParams params[API_MAX_N];
    ServeChoice ch[API_MAX_N];
    pthread_mutex_t *mu;          /* the server's (the emit callback gets only the choice) */
    pthread_cond_t cv;            /* signalled on new text, a choice done, submission */
    volatile sig_atomic_t interrupt; /* the scheduler's per-request flag; written by the engine thread only */
    bool cancel;                  /* the connection gave up on it (under mu) */
    bool submitted;               /* the engine queued its choices, or failed to (under mu) */
    char submit_error[1024];       /* why the engine refused it (under mu) */
    int n_done;                   /* choices finished (under mu) */
    bool conn_released;           /* the connection let go (under mu) */
    ServeJob *next;               /* in the submission queue */
};

typedef struct {
    long long prompt_tokens, generation_tokens, requests;
    int queued;                   /* choices handed over, not yet submitted */
    int waiting, running;         /* sequences in the schedulers */
    int blocks_used, blocks_total;
    double tokens_per_s;          /* over the last window of about 10 s */
    double window_t0;
    long long window_tokens0;
} ServeMetrics;

typedef struct {
    const RunOptions *o;
    const ServeOptions *so;
    Runtime rt;
    ChatTemplate tmpl;
    VirtualEngines ve;
    GenParams dflt;               /* the command line's settings over the model's */
    char model_id[256];
    pthread_mutex_t mu;
    pthread_cond_t engine_cv;     /* wakes the engine: a job queued, stopping */
    pthread_cond_t conns_cv;      /* a connection ended */
    ServeJob *queue, *queue_tail;
    int n_conns;
    bool stopping;                /* SIGTERM/SIGINT: no new requests */
    double t_stop;
    bool engine_failed;           /* a forward pass failed: every request is answered with an error */
    uint64_t seed_counter;        /* fresh seeds for requests without one */
    uint64_t next_id;
    ServeMetrics m;
} Server;

/* A job for a parsed request and its prompt (both taken over). */
ServeJob *serve_job_new(ApiRequest *req, TokenIds *ids);
/* Queues it for the engine; -1 (nothing queued) when the server is stopping. */
int serve_job_enqueue(Server *s, ServeJob *j);
/* The connection is done with j: cancels what still runs; frees it when
 * the engine is done with it too. */
void serve_job_release(Server *s, ServeJob *j);
/* The engine thread: runs until the server stops and every request ended. */
void *serve_engine_main(void *arg);
/* The Prometheus text of /metrics. */
int serve_metrics_text(Server *s, TextBuf *out);

#endif
