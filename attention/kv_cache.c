/* kv_cache.c — the host paged KV cache, the block pool and block tables (see
 * kv_cache.h). */
#include "attention/kv_cache.h"

#include <stdlib.h>
#include <string.h>

int kv_cache_host_alloc(KVCacheHost *c, int n_layers, int n_kv_heads, int head_dim_k, int head_dim_v,
                        int block_size, int n_blocks, Err *err) {
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim_k <= 0 || head_dim_v <= 0 || block_size <= 0 || n_blocks <= 0)
        return err_set(err, "KV cache: invalid shape (%d layers, %d heads, head sizes %d/%d, %d blocks of %d)",
                       n_layers, n_kv_heads, head_dim_k, head_dim_v, n_blocks, block_size);
    uint64_t slots = (uint64_t)n_blocks * block_size;
    uint64_t kn = slots * n_kv_heads * head_dim_k, vn = slots * n_kv_heads * head_dim_v;
    if (kn > ((uint64_t)1 << 40) / sizeof(float) || vn > ((uint64_t)1 << 40) / sizeof(float))
        return err_set(err, "KV cache: %llu slots are too many", (unsigned long long)slots);
    *c = (KVCacheHost){n_layers, n_kv_heads, head_dim_k, head_dim_v, block_size, n_blocks, NULL, NULL};
    c->k = calloc(n_layers, sizeof *c->k);
    c->v = calloc(n_layers, sizeof *c->v);
    if (!c->k || !c->v) { kv_cache_host_free(c); return err_set(err, "KV cache: out of memory"); }
    for (int l = 0; l < n_layers; l++) {
        c->k[l] = malloc(kn * sizeof(float));
        c->v[l] = malloc(vn * sizeof(float));
        if (!c->k[l] || !c->v[l]) {
            kv_cache_host_free(c);
            return err_set(err, "KV cache: cannot allocate %.1f MiB for layer %d", (kn + vn) * 4 / 1048576.0, l);
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
    p->free_ids = malloc((n_blocks > 0 ? n_blocks : 1) * sizeof *p->free_ids);
    if (!p->free_ids) return err_set(err, "block pool: out of memory for %d blocks", n_blocks);
    p->n_blocks = n_blocks;
    /* Highest id at the bottom so the first allocations come out 0, 1, 2... */
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void block_pool_free(BlockPool *p) {
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

int block_pool_alloc(BlockPool *p) { return p->n_free > 0 ? p->free_ids[--p->n_free] : -1; }

void block_pool_release(BlockPool *p, int id) {
    if (id >= 0 && id < p->n_blocks && p->n_free < p->n_blocks) p->free_ids[p->n_free++] = id;
}

int block_table_reserve(BlockTable *bt, BlockPool *p, int n_tokens, int block_size) {
    int need = (n_tokens + block_size - 1) / block_size;
    if (need <= bt->n_blocks) {
        if (n_tokens > bt->n_tokens) bt->n_tokens = n_tokens;
        return 0;
    }
    if (need - bt->n_blocks > p->n_free) return -1;
    if (need > bt->cap) {
        int cap = bt->cap ? bt->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *b = realloc(bt->blocks, cap * sizeof *b);
        if (!b) return -1;
        bt->blocks = b;
        bt->cap = cap;
    }
    while (bt->n_blocks < need) bt->blocks[bt->n_blocks++] = block_pool_alloc(p);
    bt->n_tokens = n_tokens;
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
