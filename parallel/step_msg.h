/* step_msg.h — a forward step as bytes, for pipeline stages in other
 * processes (the multi-process start-up of parallel/pipeline.h).
 *
 * The driver (the last stage: it schedules and samples) sends every other
 * stage each step's token ids and attention metadata; those stages know
 * nothing else of the requests. A message is a header of int32 counts, then
 * ids[T], pos[T], seq[T], slot[T] (int64), the block-table length of each
 * sequence and the tables back to back. Decoding checks every count and
 * index against the receiver's limits: a broken or foreign peer gives an
 * error, never an out-of-bounds read.
 */
#ifndef CLLM_STEP_MSG_H
#define CLLM_STEP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attn_batch.h"
#include "base/err.h"

enum { STEP_MSG_STEP = 1, STEP_MSG_STOP = 2, STEP_MSG_HELLO = 3 };

/* A decoded step: arrays owned by the message buffer's decoder. */
typedef struct {
    int kind;
    int32_t *ids;
    AttnBatch b;
    int32_t *table_len;            /* [n_seqs] */
    const int32_t **tables;        /* [n_seqs] pointers into the buffer */
    int32_t hello[2];              /* STEP_MSG_HELLO: KV blocks and block size of the sender's stage */
    void *mem;                     /* everything above points here */
    size_t cap;
} StepMsg;

/* Encodes a step (kind STEP) into *buf (grown as needed; *cap its size);
 * returns the byte count, or 0 with err. */
size_t step_msg_encode(const int32_t *ids, const AttnBatch *b, void **buf, size_t *cap, Err *err);
/* STOP, or HELLO with two values: a fixed 16-byte message into out. */
size_t step_msg_encode_small(int kind, int32_t a, int32_t b2, unsigned char out[16]);
/* Decodes len bytes into m (its memory reused between calls): at most
 * max_tokens rows, block ids below n_blocks, slots below n_blocks * block_size. */
int step_msg_decode(StepMsg *m, const void *buf, size_t len, int max_tokens, int n_blocks, int block_size, Err *err);
void step_msg_free(StepMsg *m);

#endif
