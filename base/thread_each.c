/* thread_each.c — a thread per item, joined (thread_each.h). */
#include "base/thread_each.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct {
    void (*fn)(void *ctx, int i);
    void *ctx;
    int i;
    pthread_t thread;
    bool started;
} EachItem;

static void *each_main(void *arg) {
    EachItem *it = arg;
    it->fn(it->ctx, it->i);
    return NULL;
}

void thread_each(int n, void (*fn)(void *ctx, int i), void *ctx) {
    EachItem *it = n > 1 ? calloc((size_t)n, sizeof *it) : NULL;
    if (!it) { /* one item, or no memory for the table: all here, in turn */
        for (int i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    for (int i = 0; i < n; i++) {
        it[i] = (EachItem){.fn = fn, .ctx = ctx, .i = i};
        it[i].started = pthread_create(&it[i].thread, NULL, each_main, &it[i]) == 0;
        if (!it[i].started) fn(ctx, i); /* no thread to spare: here, in turn */
    }
    for (int i = 0; i < n; i++)
        if (it[i].started) pthread_join(it[i].thread, NULL);
    free(it);
}
