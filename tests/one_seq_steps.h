/* one_seq_steps.h — the steps of one sequence, for tests that run a model
 * two ways and compare the logits (a pipeline's stages, tensor-parallel
 * ranks, against the whole model): a 13-token prompt in chunks of 5
 * (chunked prefill), then 6 decode steps; random token ids from a seed;
 * KV blocks of 16 tokens scattered over a table of 8, the same table for
 * every backend. */
#ifndef CLLM_TESTS_ONE_SEQ_STEPS_H
#define CLLM_TESTS_ONE_SEQ_STEPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/attn_batch.h"

#define ONE_SEQ_BLOCK 16
#define ONE_SEQ_N_BLOCKS 8
#define ONE_SEQ_MAX_T 16
#define ONE_SEQ_STEPS 9

typedef struct {
    int32_t table[ONE_SEQ_N_BLOCKS];
    const int32_t *tables[1];
    int32_t ids[ONE_SEQ_MAX_T], pos[ONE_SEQ_MAX_T], seq[ONE_SEQ_MAX_T];
    int64_t slot[ONE_SEQ_MAX_T];
    int32_t row;              /* the step's last row: the one that gets logits */
    AttnBatch b;
    int n_pos, vocab;
    uint32_t rng;
} OneSeqSteps;

static inline void one_seq_init(OneSeqSteps *s, int vocab, uint32_t seed) {
    static const int32_t table[ONE_SEQ_N_BLOCKS] = {5, 2, 7, 0, 3, 1, 6, 4};
    *s = (OneSeqSteps){.vocab = vocab, .rng = seed};
    for (int i = 0; i < ONE_SEQ_N_BLOCKS; i++) s->table[i] = table[i];
    s->tables[0] = s->table;
}

/* The next step in s->b (ids in s->ids, logits row s->row); false after the last. */
static inline bool one_seq_next(OneSeqSteps *s) {
    if (s->n_pos >= 19) return false;
    int T = s->n_pos < 13 ? (13 - s->n_pos < 5 ? 13 - s->n_pos : 5) : 1;
    for (int i = 0; i < T; i++) {
        s->rng = s->rng * 1664525u + 1013904223u;
        s->ids[i] = (int32_t)((s->rng >> 8) % (uint32_t)s->vocab);
        s->pos[i] = s->n_pos + i, s->seq[i] = 0;
        s->slot[i] = (int64_t)s->table[s->pos[i] / ONE_SEQ_BLOCK] * ONE_SEQ_BLOCK + s->pos[i] % ONE_SEQ_BLOCK;
    }
    s->row = T - 1;
    s->b = (AttnBatch){T, s->pos, s->seq, s->slot, 1, s->tables, ONE_SEQ_BLOCK};
    s->n_pos += T;
    return true;
}

#endif
