/* thread_pool.c — a fixed pool of worker threads behind cpu_parallel_for.
 *
 * The workers are started once and sleep on a condition variable. A call
 * publishes one job (function, context, n) under the mutex, bumps a generation
 * counter and wakes everyone; worker k runs chunk k + 1 of [0, n), the caller
 * runs chunk 0, then waits until the last worker reports done. No thread is
 * created per call: decode issues hundreds of calls per token.
 *
 * One job at a time: a second thread calling cpu_parallel_for on the same pool
 * waits on call_mu until the first call has finished. fn must not call
 * cpu_parallel_for on the same pool (it would wait on itself).
 */
#include "base/thread_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define THREAD_POOL_MAX 256

typedef void (*RangeFn)(void *ctx, int64_t begin, int64_t end);

struct ThreadPool {
    int n_workers;               /* threads besides the caller */
    pthread_t *threads;
    pthread_mutex_t call_mu;     /* serializes whole calls */
    pthread_mutex_t mu;          /* guards everything below */
    pthread_cond_t start, done;
    uint64_t generation;         /* bumped once per job */
    int pending;                 /* workers that have not finished the job */
    bool quit;
    RangeFn fn;
    void *ctx;
    int64_t n;
};

typedef struct {
    ThreadPool *tp;
    int index;                   /* 0-based worker index: runs chunk index + 1 */
} WorkerArg;

/* Chunk i of parts over [0, n): contiguous, sizes differing by at most one. */
static void chunk_range(int64_t n, int parts, int i, int64_t *begin, int64_t *end) {
    *begin = n * i / parts;
    *end = n * (i + 1) / parts;
}

static void *worker_main(void *arg_) {
    WorkerArg arg = *(WorkerArg *)arg_;
    free(arg_);
    ThreadPool *tp = arg.tp;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->quit && tp->generation == seen) pthread_cond_wait(&tp->start, &tp->mu);
        if (tp->quit) break;
        seen = tp->generation;
        RangeFn fn = tp->fn;
        void *ctx = tp->ctx;
        int64_t begin, end;
        chunk_range(tp->n, tp->n_workers + 1, arg.index + 1, &begin, &end);
        pthread_mutex_unlock(&tp->mu);
        if (begin < end) fn(ctx, begin, end);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

/* Initializes the synchronization objects; -1 (nothing left to destroy) on failure. */
static int pool_init_sync(ThreadPool *tp) {
    if (pthread_mutex_init(&tp->call_mu, NULL)) return -1;
    if (pthread_mutex_init(&tp->mu, NULL)) goto fail_mu;
    if (pthread_cond_init(&tp->start, NULL)) goto fail_start;
    if (pthread_cond_init(&tp->done, NULL)) goto fail_done;
    return 0;
fail_done:
    pthread_cond_destroy(&tp->start);
fail_start:
    pthread_mutex_destroy(&tp->mu);
fail_mu:
    pthread_mutex_destroy(&tp->call_mu);
    return -1;
}

ThreadPool *thread_pool_create(int n_threads, Err *err) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    if (n_threads > THREAD_POOL_MAX) n_threads = THREAD_POOL_MAX;
    ThreadPool *tp = calloc(1, sizeof *tp);
    pthread_t *threads = calloc((size_t)n_threads, sizeof *threads);
    if (!tp || !threads || pool_init_sync(tp)) {
        free(tp);
        free(threads);
        err_set(err, "cannot create a CPU thread pool of %d threads (out of memory)", n_threads);
        return NULL;
    }
    tp->threads = threads;
    for (int i = 0; i < n_threads - 1; i++) {
        WorkerArg *a = malloc(sizeof *a);
        if (a) *a = (WorkerArg){tp, i};
        if (!a || pthread_create(&tp->threads[i], NULL, worker_main, a)) {
            free(a);
            thread_pool_destroy(tp); /* joins the i workers already running */
            err_set(err, "cannot start CPU worker thread %d of %d", i + 1, n_threads - 1);
            return NULL;
        }
        tp->n_workers = i + 1;
    }
    return tp;
}

void thread_pool_destroy(ThreadPool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_workers; i++) pthread_join(tp->threads[i], NULL);
    pthread_cond_destroy(&tp->done);
    pthread_cond_destroy(&tp->start);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->call_mu);
    free(tp->threads);
    free(tp);
}

int thread_pool_size(const ThreadPool *tp) { return tp ? tp->n_workers + 1 : 1; }

void cpu_parallel_for(ThreadPool *tp, int64_t n, RangeFn fn, void *ctx) {
    if (n <= 0) return;
    /* Nothing to share: run inline, no wake-ups. */
    if (!tp || tp->n_workers == 0 || n == 1) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&tp->call_mu);
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    tp->pending = tp->n_workers;
    tp->generation++;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);

    int64_t begin, end;
    chunk_range(n, tp->n_workers + 1, 0, &begin, &end);
    if (begin < end) fn(ctx, begin, end);

    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->call_mu);
}
