/* block_manager.h — reference-counted KV blocks with a prefix cache, over the
 * block pool of kv_cache.h (the scheduler's allocator).
 *
 * Every block is in one of three states:
 *   free        on the pool's free list;
 *   referenced  ref > 0: held by that many sequences (shared prefix blocks
 *               have ref > 1; nobody writes a shared block: only FULL blocks
 *               are shared, and a sequence only writes past its full blocks);
 *   cached      ref == 0 but still indexed by the prefix cache, waiting on an
 *               LRU list to be reused by a later request with the same prefix,
 *               or evicted (oldest first) when the pool runs dry.
 * Referenced blocks may be indexed by the prefix cache too.
 *
 * Prefix cache. A full block is identified by a hash chain: its key is
 * hash(parent key, its block_size tokens), the parent being the block before
 * it in the sequence. A lookup walks a new prompt block by block from the
 * first; a hit must match the key, the stored tokens (no hash collision can
 * make two different prompts share a block), and the parent: the exact
 * (block id, generation) of the block matched one step earlier. A block's
 * generation changes whenever it leaves the cache, so a child whose parent
 * was evicted and reused can never be reached through the new parent.
 *
 * The pool stays usable directly (block_pool_alloc / block_table_reserve) by
 * code that shares it; such blocks are invisible to the manager.
 */
#ifndef CLLM_BLOCK_MANAGER_H
#define CLLM_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kv_blocks.h"
#include "base/err.h"

/* Where a sequence's hash chain stands: the key and the cache entry of its
 * last full block (block -1 before the first block; -2 when the chain broke
 * and no further block of the sequence is cached). */
typedef struct {
    uint64_t key;
    int32_t block;
    uint32_t gen;
} BlockChain;

#define BLOCK_CHAIN_START ((BlockChain){0x243f6a8885a308d3ull, -1, 0})

typedef struct {
    BlockPool *pool;          /* the free list (borrowed) */
    int n_blocks, block_size;
    int32_t *ref;             /* [n_blocks] sequences holding the block */
    /* prefix cache */
    bool *cached;             /* [n_blocks] indexed by the cache */
    uint64_t *key;            /* [n_blocks] chain key of a cached block */
    int32_t *parent;          /* [n_blocks] parent block id (-1: first block) */
    uint32_t *parent_gen;     /* [n_blocks] the parent's generation when cached */
    uint32_t *gen;            /* [n_blocks] bumped whenever the block leaves the cache */
    int32_t *tokens;          /* [n_blocks][block_size] the tokens of a cached block */
    int32_t *bucket;          /* [n_buckets] first cached block of a hash bucket, -1 none */
    int32_t *next;            /* [n_blocks] next cached block in the same bucket */
    int n_buckets;            /* power of two */
    int32_t *lru_prev, *lru_next; /* [n_blocks] the cached blocks with ref 0, oldest first */
    int lru_head, lru_tail, n_lru;
    int n_cached;             /* blocks indexed by the cache */
    int64_t hits, evictions;  /* blocks reused from / dropped by the cache, ever */
} BlockManager;

int block_manager_init(BlockManager *m, BlockPool *pool, int block_size, Err *err);
/* Returns the unreferenced cached blocks to the pool and frees the rest. */
void block_manager_free(BlockManager *m);

/* A block with ref 1: from the free list, else the least recently used
 * cached block (evicted). -1 when every block is referenced. */
int block_manager_alloc(BlockManager *m);
/* One more reference to a referenced or cached block. */
void block_manager_acquire(BlockManager *m, int id);
/* One reference less; at 0 a cached block goes on the LRU list, another one
 * back to the pool. */
void block_manager_release(BlockManager *m, int id);

/* Blocks an allocation can get now (free + evictable). */
static inline int block_manager_available(const BlockManager *m) { return m->pool->n_free + m->n_lru; }
/* Blocks held by sequences. */
static inline int block_manager_used(const BlockManager *m) {
    return m->n_blocks - m->pool->n_free - m->n_lru;
}

/* The cached block that continues chain *c with tokens[0..block_size), or -1.
 * On a hit *c moves to that block; nothing is acquired. */
int block_manager_lookup(BlockManager *m, BlockChain *c, const int32_t *tokens);
/* Indexes the full block id (holding tokens[0..block_size)) as the
 * continuation of *c and moves *c to it. When the cache already holds that
 * content, id stays unindexed and *c moves to the cached copy; when *c is
 * broken or its block has left the cache, nothing is indexed and *c breaks. */
void block_manager_register(BlockManager *m, int id, BlockChain *c, const int32_t *tokens);

/* Sequence block tables through the manager. Entries may be -1 (blocks a
 * windowed sequence dropped); they are skipped. */
/* Makes room for n_tokens, allocating blocks; -1 (table unchanged) when the
 * blocks run out. */
int block_manager_reserve(BlockManager *m, BlockTable *bt, int n_tokens);
/* Releases every block and empties the table (the array stays). */
void block_manager_release_table(BlockManager *m, BlockTable *bt);

#endif
