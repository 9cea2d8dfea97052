/* ordered_work.c — see ordered_work.h. One mutex guards the queue: an array
 * of slots addressed by absolute position (slot p lives at slots[p - base]),
 * with three cursors: head (next to pop) <= taken (next for a worker) <=
 * tail (next to push). A worker takes the slot at `taken`, runs fn without
 * the lock, marks it done; pop waits on `done` for the head's mark. Popped
 * slots are dropped from the front when they are half the array. */
#include "app/ordered_work.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void *item;
    bool done;
} Slot;

struct OrderedWork {
    OrderedWorkFn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t work, done;    /* work: a slot to take, or quit; done: a fn returned */
    Slot *slots;
    int64_t base, head, taken, tail;
    int64_t cap;
    bool quit;
    int n_threads;
    pthread_t *threads;
};

static void *worker_main(void *arg) {
    OrderedWork *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && w->taken == w->tail) pthread_cond_wait(&w->work, &w->mu);
        if (w->quit) break;
        int64_t p = w->taken++;
        void *item = w->slots[p - w->base].item;
        pthread_mutex_unlock(&w->mu);
        w->fn(w->ctx, item);
        pthread_mutex_lock(&w->mu);
        w->slots[p - w->base].done = true; /* base may have moved: index again under the lock */
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

OrderedWork *ordered_work_new(int n_threads, OrderedWorkFn fn, void *ctx, Err *err) {
    if (n_threads < 1) n_threads = 1;
    OrderedWork *w = calloc(1, sizeof *w);
    if (!w || !(w->threads = calloc((size_t)n_threads, sizeof *w->threads))) {
        free(w);
        err_set(err, "out of memory starting %d worker threads", n_threads);
        return NULL;
    }
    w->fn = fn;
    w->ctx = ctx;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&w->threads[i], NULL, worker_main, w)) {
            ordered_work_free(w, NULL, NULL); /* joins the i already running */
            err_set(err, "cannot start worker thread %d of %d", i + 1, n_threads);
            return NULL;
        }
        w->n_threads = i + 1;
    }
    return w;
}

int ordered_work_push(OrderedWork *w, void *item) {
    pthread_mutex_lock(&w->mu);
    int64_t used = w->tail - w->base;
    if (used == w->cap && w->head - w->base >= w->cap / 2 && w->head > w->base) {
        /* drop the popped front instead of growing */
        int64_t drop = w->head - w->base;
        memmove(w->slots, w->slots + drop, (size_t)(used - drop) * sizeof *w->slots);
        w->base += drop;
        used -= drop;
    }
    if (used == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 64;
        Slot *s = realloc(w->slots, (size_t)cap * sizeof *s);
        if (!s) { pthread_mutex_unlock(&w->mu); return -1; }
        w->slots = s;
        w->cap = cap;
    }
    w->slots[w->tail++ - w->base] = (Slot){item, false};
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

void *ordered_work_pop(OrderedWork *w, bool wait) {
    void *item = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->head < w->tail) {
        while (wait && !w->slots[w->head - w->base].done) pthread_cond_wait(&w->done, &w->mu);
        if (w->slots[w->head - w->base].done) item = w->slots[w->head++ - w->base].item;
    }
    pthread_mutex_unlock(&w->mu);
    return item;
}

int ordered_work_size(const OrderedWork *w) {
    pthread_mutex_lock((pthread_mutex_t *)&w->mu);
    int n = (int)(w->tail - w->head);
    pthread_mutex_unlock((pthread_mutex_t *)&w->mu);
    return n;
}

void ordered_work_free(OrderedWork *w, void (*discard)(void *ctx, void *item, bool ran), void *ctx) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->n_threads; i++) pthread_join(w->threads[i], NULL);
    for (int64_t p = w->head; discard && p < w->tail; p++)
        discard(ctx, w->slots[p - w->base].item, w->slots[p - w->base].done);
    pthread_cond_destroy(&w->done);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->mu);
    free(w->slots);
    free(w->threads);
    free(w);
}
