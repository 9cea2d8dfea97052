/* kv_cache.c — the host paged KV cache, the block pool and block tables (the
 * layouts are in kv_cache.h).
 *
 * The cache is one K and one V allocation per layer, zero-filled (calloc: the
 * pages of a large, mostly unused cache are not touched until written). The
 * pool is a stack of free block ids; a block table grows by whole blocks taken
 * from it and gives them all back on release.
 */
#include "attention/kv_cache.h"

#include <stdlib.h>
#include <string.h>

/* Bytes of one layer's K (or V) array: n_blocks * block_size * n_kv_heads *
 * head_dim * 4, or 0 when the product overflows size_t. */
static size_t layer_bytes(int n_blocks, int block_size, int n_kv_heads, int head_dim) {
    size_t r = sizeof(float);
    int f[4] = {n_blocks, block_size, n_kv_heads, head_dim};
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(r, (size_t)f[i], &r)) return 0;
    return r;
}

int kv_cache_host_alloc(KVCacheHost *c, int n_layers, int n_kv_heads, int head_dim_k, int head_dim_v,
                        int block_size, int n_blocks, Err *err) {
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim_k <= 0 || head_dim_v <= 0 || block_size <= 0 || n_blocks <= 0)
        return err_set(err, "KV cache: invalid shape: %d layers, %d kv heads, head sizes %d (K) / %d (V), "
                       "%d blocks of %d tokens (all must be > 0)",
                       n_layers, n_kv_heads, head_dim_k, head_dim_v, n_blocks, block_size);
    size_t kb = layer_bytes(n_blocks, block_size, n_kv_heads, head_dim_k);
    size_t vb = layer_bytes(n_blocks, block_size, n_kv_heads, head_dim_v);
    if (!kb || !vb)
        return err_set(err, "KV cache: %d blocks x %d tokens x %d kv heads x head size %d/%d overflows a size",
                       n_blocks, block_size, n_kv_heads, head_dim_k, head_dim_v);
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    c->head_dim_k = head_dim_k;
    c->head_dim_v = head_dim_v;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->k = calloc((size_t)n_layers, sizeof *c->k);
    c->v = calloc((size_t)n_layers, sizeof *c->v);
    if (!c->k || !c->v) {
        kv_cache_host_free(c);
        return err_set(err, "KV cache: out of memory for %d layer pointers", n_layers);
    }
    for (int l = 0; l < n_layers; l++) {
        c->k[l] = calloc(1, kb);
        c->v[l] = calloc(1, vb);
        if (!c->k[l] || !c->v[l]) {
            kv_cache_host_free(c);
            return err_set(err,
                           "KV cache: cannot allocate layer %d of %d: K %zu + V %zu bytes (%d blocks x %d tokens x "
                           "%d kv heads x head size %d/%d x 4 bytes); use fewer blocks or a shorter context",
                           l, n_layers, kb, vb, n_blocks, block_size, n_kv_heads, head_dim_k, head_dim_v);
        }
    }
    return 0;
}

void kv_cache_host_free(KVCacheHost *c) {
    for (int l = 0; c->k && l < c->n_layers; l++) free(c->k[l]);
    for (int l = 0; c->v && l < c->n_layers; l++) free(c->v[l]);
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

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
