/* thread_each.h — fn(ctx, i) for every i < n, a thread each, all joined
 * before it returns: for a few long jobs that should overlap (backends that
 * upload to GPUs of their own), not for splitting work (thread_pool.h).
 * An i whose thread cannot be started runs on the caller's thread, in
 * turn, so every fn(ctx, i) runs exactly once whatever the system allows.
 * fn writes its result where ctx says (a slot per i); the caller reads
 * them after the call. */
#ifndef CLLM_THREAD_EACH_H
#define CLLM_THREAD_EACH_H

void thread_each(int n, void (*fn)(void *ctx, int i), void *ctx);

#endif
