/* kv_blocks.c — the block pool and block tables (kv_blocks.h).
 *
 * The pool is a stack of free block ids; a block table grows by whole blocks
 * taken from it and gives them all back on release.
 */
#include "engine/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

int block_pool_init(BlockPool *p, int n_blocks, Err *err) {
    memset(p, 0, sizeof *p);
    if (n_blocks < 0) return err_set(err, "block pool: invalid block count %d", n_blocks);
    p->free_ids = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *p->free_ids);
    if (!p->free_ids) return err_set(err, "block pool: out of memory for %d block ids", n_blocks);
    p->n_blocks = n_blocks;
    /* Highest id at the bottom of the stack, so a fresh pool hands out 0, 1, 2... */
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void block_pool_free(BlockPool *p) {
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

int block_pool_alloc(BlockPool *p) { return p->n_free > 0 ? p->free_ids[--p->n_free] : -1; }

/* An id outside the pool, or a release when every block is already free (a
 * double release), is ignored rather than corrupting the stack. */
void block_pool_release(BlockPool *p, int id) {
    if (id >= 0 && id < p->n_blocks && p->n_free < p->n_blocks) p->free_ids[p->n_free++] = id;
}

/* Grows bt->blocks to hold at least `need` ids; -1 (table unchanged) when out of memory. */
static int block_table_grow(BlockTable *bt, int need) {
    if (need <= bt->cap) return 0;
    int cap = bt->cap > 0 ? bt->cap : 8;
    while (cap < need) cap = cap > (1 << 29) ? need : cap * 2;
    int32_t *b = realloc(bt->blocks, (size_t)cap * sizeof *b);
    if (!b) return -1;
    bt->blocks = b;
    bt->cap = cap;
    return 0;
}

int block_table_reserve(BlockTable *bt, BlockPool *p, int n_tokens, int block_size) {
    if (block_size <= 0 || n_tokens < 0) return -1;
    int need = (int)(((int64_t)n_tokens + block_size - 1) / block_size);
    if (need > bt->n_blocks) {
        /* Check everything first: a failure must leave table and pool as they were. */
        if (need - bt->n_blocks > p->n_free || block_table_grow(bt, need)) return -1;
        while (bt->n_blocks < need) bt->blocks[bt->n_blocks++] = block_pool_alloc(p);
    }
    if (n_tokens > bt->n_tokens) bt->n_tokens = n_tokens;
    return 0;
}

void block_table_release(BlockTable *bt, BlockPool *p) {
    while (bt->n_blocks > 0) block_pool_release(p, bt->blocks[--bt->n_blocks]);
    bt->n_tokens = 0;
}

void block_table_free(BlockTable *bt) {
    free(bt->blocks);
    bt->blocks = NULL;
    bt->n_blocks = bt->cap = bt->n_tokens = 0;
}
