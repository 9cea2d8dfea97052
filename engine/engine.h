/* engine.h — the model as the scheduler runs it: the forward pass of one
 * backend (or the last stage of a pipeline, the stages before it behind
 * ForwardStages), the KV cache's block pool, and the limits of a step.
 * The continuous-batching scheduler (engine/scheduler.h) builds every step
 * and calls engine_forward.
 */
#ifndef CLLM_ENGINE_H
#define CLLM_ENGINE_H

#include "engine/kv_blocks.h"
#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const Model *model;
    Backend *be;             /* the (last stage's) backend: it samples and holds the logits */
    Forward fw;              /* the (last stage's) forward pass */
    ForwardStages stages;    /* the pipeline stages before it (n_stages 0: one backend) */
    BlockPool pool;
    int block_size;
    int max_chunk;           /* tokens per forward step */
    int ctx_limit;           /* most tokens one sequence may hold */
} Engine;

/* ctx_limit: tokens per sequence (<= the KV cache); max_chunk: tokens per step. */
int engine_init(Engine *e, const Model *m, Backend *be, int ctx_limit, int max_chunk, Err *err);
/* The same over a started pipeline: the engine runs its last stage (the
 * stage's config and backend be), its KV pool has n_blocks (what every stage
 * can hold); stages stay the caller's. */
int engine_init_stages(Engine *e, const Model *m, const ModelConfig *last_cfg, Backend *be, int n_blocks,
                       const ForwardStages *stages, int ctx_limit, int max_chunk, Err *err);
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

/* The default step limits, from the KV cache (engine_auto_*; the README's
 * options table and docs/DESIGN.md "step limits" give the reasoning). A
 * sequence of up to ENGINE_AUTO_SEQ_TOKENS (or the context, if shorter)
 * should run without preemption: max_seqs is how many such sequences the
 * cache's blocks hold, at least ENGINE_AUTO_MIN_SEQS and at most
 * ENGINE_AUTO_MAX_SEQS, rounded down to a power of two (a full decode step
 * fills a CUDA graph bucket, and the cache keeps room for longer sequences:
 * a multiple of 64 just under the cache's count, 832 of 865, ran a 1000-prompt
 * file in two unequal waves and preempted 385 times on 1000/1000 tokens). */
#define ENGINE_AUTO_SEQ_TOKENS 1024
#define ENGINE_AUTO_MIN_SEQS 16
#define ENGINE_AUTO_MAX_SEQS 1024 /* the largest CUDA graph bucket */
#define ENGINE_AUTO_BATCHED_TOKENS 8192
/* Sequences per step for a cache of kv_blocks blocks of block_size tokens
 * and sequences of at most ctx_limit tokens. */
int engine_auto_max_seqs(int64_t kv_blocks, int block_size, int ctx_limit);
/* Tokens per step: ENGINE_AUTO_BATCHED_TOKENS, or the cache's tokens if it
 * holds fewer (a step never computes more than the cache holds). */
int engine_auto_max_batched_tokens(int64_t kv_blocks, int block_size);

#endif
