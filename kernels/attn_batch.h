/* attn_batch.h — the attention metadata of one forward step.
 *
 * A step processes T query rows that may belong to several sequences, each row
 * at its own position (prefill chunks and decode rows mixed). Row i belongs
 * to sequence seq[i] at position pos[i]; its K/V are written to slot[i]
 * before attention runs, and it attends to that sequence's keys at positions
 * j <= pos[i] (and pos[i] - j < window on windowed layers) read through
 * block_tables[seq[i]].
 */
#ifndef CLLM_ATTN_BATCH_H
#define CLLM_ATTN_BATCH_H

#include <stdint.h>

typedef struct {
    int n_tokens;                   /* T */
    const int32_t *pos;             /* [T] */
    const int32_t *seq;             /* [T] index into block_tables */
    const int64_t *slot;            /* [T] cache slot of each row's K/V */
    int n_seqs;
    const int32_t *const *block_tables; /* [n_seqs] block ids in position order */
    int block_size;
} AttnBatch;

/* Per-layer attention variant (DESIGN.md "Attention"). */
typedef struct {
    int n_heads, n_kv_heads;        /* query heads, KV heads (GQA: n_heads % n_kv_heads == 0) */
    int head_dim_k, head_dim_v;     /* q/k head size, v/output head size */
    float scale;                    /* multiplies q.k */
    float softcap;                  /* > 0: s = cap * tanh(s / cap) */
    int window;                     /* > 0: key j visible only when pos - j < window */
    const float *sinks;             /* [n_heads] learned logits in the denominator, or NULL */
} AttnParams;

#endif
