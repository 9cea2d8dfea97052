/* engine.h — runs sequences through the forward pass over the paged KV cache.
 *
 * A Sequence owns a block table and the tokens whose K/V are cached. Feeding
 * tokens appends them and runs the forward pass over those not yet cached, in
 * chunks of at most max_chunk tokens (chunked prefill); afterwards
 * engine->logits holds the next-token logits of the last one. Truncating a
 * sequence forgets the tail (a chat's /regen), keeping the cached prefix.
 * The continuous-batching scheduler (engine/scheduler.c) builds on the same
 * pieces with many sequences per step.
 */
#ifndef CLLM_ENGINE_H
#define CLLM_ENGINE_H

#include "attention/kv_cache.h"
#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/pipeline.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const Model *model;
    Backend *be;             /* the (last stage's) backend: it samples and holds the logits */
    Forward fw;              /* the (last stage's) forward pass */
    Pipeline *pp;            /* the stages before it, or NULL (one backend) */
    BlockPool pool;
    int block_size;
    int max_chunk;           /* tokens per forward step */
    int ctx_limit;           /* most tokens one sequence may hold */
    float *logits;           /* [vocab]: next-token logits after engine_feed */
    int32_t *pos_buf, *seq_buf, *row_buf; /* [max_chunk] step metadata */
    int64_t *slot_buf;
} Engine;

typedef struct {
    BlockTable bt;
    TokenIds tokens;         /* every token of the sequence, in order */
    int n_cached;            /* tokens[0..n_cached) have K/V in the cache */
} Sequence;

/* ctx_limit: tokens per sequence (<= the KV cache); max_chunk: tokens per step. */
int engine_init(Engine *e, const Model *m, Backend *be, int ctx_limit, int max_chunk, Err *err);
/* The same over a started pipeline: the engine runs its last stage (pp->be
 * of it), its KV pool has the blocks every stage can hold; pp stays the
 * caller's. */
int engine_init_pipeline(Engine *e, const Model *m, Pipeline *pp, int ctx_limit, int max_chunk, Err *err);
/* One forward step (forward_run's arguments) through the pipeline or the one backend. */
int engine_forward(Engine *e, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                   float *logits_out, Err *err);
void engine_free(Engine *e);

/* Rows of the next chunk of a prompt that still needs `need` rows, when the
 * step has `budget` rows left and at most `full_budget` ever: at most budget,
 * and never one row out of a longer remainder nor a remainder of one row.
 * A step's lone row of a sequence meets the decode attention kernel, a run
 * of rows the prefill kernel; so every prompt token meets the prefill kernel
 * however the prompt is split (the batch-invariant mode's promise; costs
 * nothing otherwise). 0: no chunk fits now (wait for a roomier step). Below
 * a full budget of 4 the rule is off (it could leave no way forward). */
int engine_prompt_chunk(int need, int budget, int full_budget);

/* Appends ids to s and computes them; -1 with err when the context is full
 * (nothing is appended then) or the cache has no free block. */
int engine_feed(Engine *e, Sequence *s, const int32_t *ids, int n, Err *err);
/* Keeps the first n tokens (and their cache), forgets the rest. */
void sequence_truncate(Engine *e, Sequence *s, int n);
/* Returns the sequence's blocks and frees its arrays. */
void sequence_release(Engine *e, Sequence *s);

#endif
