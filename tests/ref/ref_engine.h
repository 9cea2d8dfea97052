/* ref_engine.h — the test-only reference of the scheduler (engine/
 * scheduler.h): one sequence through the engine, one reply by a plain loop.
 *
 * A Sequence owns a block table and the tokens whose K/V are cached. Feeding
 * tokens appends them and runs the forward pass over those not yet cached, in
 * chunks of at most max_chunk tokens (chunked prefill); afterwards
 * logits holds the next-token logits of the last one. Truncating a
 * sequence forgets the tail, keeping the cached prefix. generate_reply
 * prefills a prompt, then samples token by token until a stop condition,
 * streaming the text as the scheduler's requests do.
 */
#ifndef CLLM_REF_ENGINE_H
#define CLLM_REF_ENGINE_H

#include <signal.h>

#include "engine/engine.h"
#include "engine/request.h"

typedef struct {
    BlockTable bt;
    TokenIds tokens;         /* every token of the sequence, in order */
    int n_cached;            /* tokens[0..n_cached) have K/V in the cache */
    float *logits;           /* [vocab]: next-token logits after engine_feed (owned) */
} Sequence;

/* Appends ids to s and computes them; -1 with err when the context is full
 * (nothing is appended then) or the cache has no free block. */
int engine_feed(Engine *e, Sequence *s, const int32_t *ids, int n, Err *err);
/* Keeps the first n tokens (and their cache), forgets the rest. */
void sequence_truncate(Engine *e, Sequence *s, int n);
/* Returns the sequence's blocks and frees its arrays. */
void sequence_release(Engine *e, Sequence *s);

/* The logits [T][vocab] of every row of ids, a new sequence's T tokens from
 * position 0 in one forward step (its blocks returned after); 0, or -1
 * with err. */
int engine_prompt_logits(Engine *e, const int32_t *ids, int T, float *logits, Err *err);

int generate_reply(Engine *e, Sequence *s, const int32_t *prompt, int n_prompt, const GenParams *p, GenEmit emit,
                   void *emit_ctx, volatile sig_atomic_t *interrupt, GenStats *st, Err *err);

#endif
