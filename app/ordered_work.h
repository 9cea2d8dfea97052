/* ordered_work.h — work done on worker threads, taken back in the order it
 * was given.
 *
 * The caller pushes items; N worker threads run fn(ctx, item) on them, any
 * number at a time; the caller pops them back strictly in push order, each
 * once its fn has returned. With one worker the fns also run in push order,
 * one after another: a writer thread. `cllm generate` uses it twice, so that
 * neither tokenizing the prompts nor writing the results holds up the step
 * loop: prompts are tokenized by several workers and submitted in input
 * order as they are ready, and result lines are written by one.
 *
 * Everything but fn runs on the caller's thread; fn must not touch what the
 * caller touches meanwhile without its own lock. */
#ifndef CLLM_ORDERED_WORK_H
#define CLLM_ORDERED_WORK_H

#include <stdbool.h>

#include "base/err.h"

typedef struct OrderedWork OrderedWork;
typedef void (*OrderedWorkFn)(void *ctx, void *item);

/* n_threads >= 1 workers running fn(ctx, item). NULL + err when they cannot start. */
OrderedWork *ordered_work_new(int n_threads, OrderedWorkFn fn, void *ctx, Err *err);
/* Queues item; -1 when out of memory (the item is not queued). */
int ordered_work_push(OrderedWork *w, void *item);
/* The oldest item not yet popped, once its fn has run; NULL when there is
 * none, or (wait false) when its fn has not finished yet. */
void *ordered_work_pop(OrderedWork *w, bool wait);
/* Items pushed and not yet popped. */
int ordered_work_size(const OrderedWork *w);
/* Stops the workers (each finishes the fn it is running), then hands every
 * item not yet popped, whether its fn ran or not, to discard (may be NULL). */
void ordered_work_free(OrderedWork *w, void (*discard)(void *ctx, void *item, bool ran), void *ctx);

#endif
