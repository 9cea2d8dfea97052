/* kv_cache.h — the paged KV cache: fixed-size blocks addressed through block
 * tables, the same structures on the CPU and the GPU backends.
 *
 * A sequence's token at position p lives in block block_table[p / block_size]
 * at offset p % block_size; its "slot" is block * block_size + offset. The
 * forward pass writes K/V by slot (slot mapping) and attention reads them back
 * through the block table, so a sequence's blocks need not be contiguous.
 *
 * Host layout (fp32), per layer:  K [n_blocks][block_size][n_kv_heads][head_dim_k]
 *                                 V [n_blocks][block_size][n_kv_heads][head_dim_v]
 * Block ids are shared by all layers (block b of every layer belongs to the
 * same sequence).
 */
#ifndef CLLM_KV_CACHE_H
#define CLLM_KV_CACHE_H

#include <stdint.h>

#include "model/err.h"

typedef struct {
    int n_layers, n_kv_heads, head_dim_k, head_dim_v;
    int block_size;          /* tokens per block */
    int n_blocks;
    float **k, **v;          /* [n_layers] pointers to the per-layer arrays above */
} KVCacheHost;

int kv_cache_host_alloc(KVCacheHost *c, int n_layers, int n_kv_heads, int head_dim_k, int head_dim_v,
                        int block_size, int n_blocks, Err *err);
void kv_cache_host_free(KVCacheHost *c);

/* Pointers to the K / V vectors of one kv head at a slot. */
static inline float *kv_k_at(const KVCacheHost *c, int layer, int64_t slot, int kv_head) {
    return c->k[layer] + (slot * c->n_kv_heads + kv_head) * c->head_dim_k;
}
static inline float *kv_v_at(const KVCacheHost *c, int layer, int64_t slot, int kv_head) {
    return c->v[layer] + (slot * c->n_kv_heads + kv_head) * c->head_dim_v;
}

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
