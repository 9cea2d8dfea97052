/* kv_blocks.h — which KV cache blocks a sequence holds.
 *
 * A sequence's token at position p lives in block block_table[p / block_size]
 * at offset p % block_size; its "slot" is block * block_size + offset. Block
 * ids are shared by all layers and mean the same on every backend and
 * pipeline stage; the backends own the memory (kernels/), this the ids.
 */
#ifndef CLLM_KV_BLOCKS_H
#define CLLM_KV_BLOCKS_H

#include <stdint.h>

#include "base/err.h"

/* Block allocator: a free list of block ids (reference counts and prefix
 * sharing come with the scheduler). */
typedef struct {
    int n_blocks;
    int *free_ids;           /* stack of free block ids */
    int n_free;
} BlockPool;

int block_pool_init(BlockPool *p, int n_blocks, Err *err);
void block_pool_free(BlockPool *p);
int block_pool_alloc(BlockPool *p);          /* a block id, or -1 when none is free */
void block_pool_release(BlockPool *p, int id);

/* The blocks of one sequence, in position order. */
typedef struct {
    int32_t *blocks;
    int n_blocks, cap;
    int n_tokens;            /* tokens whose K/V are (or are about to be) in the cache */
} BlockTable;

/* Makes room for n_tokens total, taking blocks from the pool; -1 (and no
 * change) when the pool runs out. */
int block_table_reserve(BlockTable *bt, BlockPool *p, int n_tokens, int block_size);
/* Returns every block to the pool and empties the table. */
void block_table_release(BlockTable *bt, BlockPool *p);
void block_table_free(BlockTable *bt); /* frees the array only */
static inline int64_t block_table_slot(const BlockTable *bt, int pos, int block_size) {
    return (int64_t)bt->blocks[pos / block_size] * block_size + pos % block_size;
}

#endif
