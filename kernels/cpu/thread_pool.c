/* thread_pool.c — a fixed pool of workers for cpu_parallel_for.
 *
 * Workers sleep on a condition variable; a parallel_for publishes one job
 * (function, context, range), bumps a generation counter, runs its own share,
 * and waits until every worker has finished its share. One job at a time: the
 * forward pass issues ops in order from one thread. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cpu/cpu_ops.h"

struct ThreadPool {
    int n_workers;               /* threads besides the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t generation;         /* bumped for each job */
    int pending;                 /* workers still on the current job */
    bool quit;
    void (*fn)(void *, int64_t, int64_t);
    void *ctx;
    int64_t n;
};

typedef struct { ThreadPool *tp; int index; } WorkerArg;

static void chunk_range(int64_t n, int parts, int i, int64_t *b, int64_t *e) {
    *b = n * i / parts;
    *e = n * (i + 1) / parts;
}

static void *worker_main(void *arg_) {
    WorkerArg *arg = arg_;
    ThreadPool *tp = arg->tp;
    int index = arg->index;
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->quit && tp->generation == seen) pthread_cond_wait(&tp->start, &tp->mu);
        if (tp->quit) break;
        seen = tp->generation;
        void (*fn)(void *, int64_t, int64_t) = tp->fn;
        void *ctx = tp->ctx;
        int64_t b, e;
        chunk_range(tp->n, tp->n_workers + 1, index + 1, &b, &e);
        pthread_mutex_unlock(&tp->mu);
        if (b < e) fn(ctx, b, e);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

ThreadPool *thread_pool_create(int n_threads, Err *err) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads <= 0) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    ThreadPool *tp = calloc(1, sizeof *tp);
    if (!tp) { err_set(err, "out of memory creating the thread pool"); return NULL; }
    tp->n_workers = n_threads - 1;
    tp->threads = calloc(tp->n_workers > 0 ? tp->n_workers : 1, sizeof *tp->threads);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->start, NULL);
    pthread_cond_init(&tp->done, NULL);
    for (int i = 0; i < tp->n_workers; i++) {
        WorkerArg *a = malloc(sizeof *a);
        if (a) *a = (WorkerArg){tp, i};
        if (!a || pthread_create(&tp->threads[i], NULL, worker_main, a)) {
            free(a);
            tp->n_workers = i;
            thread_pool_destroy(tp);
            err_set(err, "cannot start CPU worker thread %d", i);
            return NULL;
        }
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
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->start);
    pthread_cond_destroy(&tp->done);
    free(tp->threads);
    free(tp);
}

int thread_pool_size(const ThreadPool *tp) { return tp ? tp->n_workers + 1 : 1; }

void cpu_parallel_for(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
    if (n <= 0) return;
    if (!tp || tp->n_workers == 0 || n == 1) { fn(ctx, 0, n); return; }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    tp->pending = tp->n_workers;
    tp->generation++;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    int64_t b, e;
    chunk_range(n, tp->n_workers + 1, 0, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
