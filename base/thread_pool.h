/* thread_pool.h — a fixed pool of worker threads.
 *
 * cpu_parallel_for runs fn(ctx, begin, end) over [0, n) split in contiguous
 * chunks over the workers and the caller, and returns when all are done.
 */
#ifndef CLLM_THREAD_POOL_H
#define CLLM_THREAD_POOL_H

#include <stdint.h>

#include "base/err.h"

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend */
#endif

typedef struct ThreadPool ThreadPool;
ThreadPool *thread_pool_create(int n_threads, Err *err); /* n_threads <= 0: one per core */
void thread_pool_destroy(ThreadPool *tp);
int thread_pool_size(const ThreadPool *tp);
void cpu_parallel_for(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);

#ifdef __cplusplus
}
#endif

#endif
