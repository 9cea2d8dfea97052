/* block_manager.c — reference counts, the prefix cache (a hash table of
 * chained buckets keyed by the chain key) and the LRU list of unreferenced
 * cached blocks (see block_manager.h). Every operation is O(1) apart from a
 * bucket walk and the token comparison of a lookup. */
#include "engine/block_manager.h"

#include <stdlib.h>
#include <string.h>

int block_manager_init(BlockManager *m, BlockPool *pool, int block_size, Err *err) {
    memset(m, 0, sizeof *m);
    if (block_size <= 0) return err_set(err, "block manager: invalid block size %d", block_size);
    int n = pool->n_blocks, nb = 16;
    while (nb < 2 * n) nb *= 2;
    size_t cnt = (size_t)(n > 0 ? n : 1);
    m->pool = pool;
    m->n_blocks = n;
    m->block_size = block_size;
    m->n_buckets = nb;
    m->ref = calloc(cnt, sizeof *m->ref);
    m->cached = calloc(cnt, sizeof *m->cached);
    m->key = calloc(cnt, sizeof *m->key);
    m->parent = calloc(cnt, sizeof *m->parent);
    m->parent_gen = calloc(cnt, sizeof *m->parent_gen);
    m->gen = calloc(cnt, sizeof *m->gen);
    m->tokens = calloc(cnt * block_size, sizeof *m->tokens);
    m->next = calloc(cnt, sizeof *m->next);
    m->lru_prev = calloc(cnt, sizeof *m->lru_prev);
    m->lru_next = calloc(cnt, sizeof *m->lru_next);
    m->bucket = malloc((size_t)nb * sizeof *m->bucket);
    if (!m->ref || !m->cached || !m->key || !m->parent || !m->parent_gen || !m->gen || !m->tokens || !m->next ||
        !m->lru_prev || !m->lru_next || !m->bucket) {
        block_manager_free(m);
        return err_set(err, "block manager: out of memory for %d blocks of %d tokens", n, block_size);
    }
    for (int i = 0; i < nb; i++) m->bucket[i] = -1;
    m->lru_head = m->lru_tail = -1;
    return 0;
}

void block_manager_free(BlockManager *m) {
    /* The pool outlives the manager: cached blocks nobody holds go back. */
    for (int id = m->lru_head; id >= 0 && m->pool; id = m->lru_next[id]) block_pool_release(m->pool, id);
    free(m->ref);
    free(m->cached);
    free(m->key);
    free(m->parent);
    free(m->parent_gen);
    free(m->gen);
    free(m->tokens);
    free(m->next);
    free(m->lru_prev);
    free(m->lru_next);
    free(m->bucket);
    memset(m, 0, sizeof *m);
}

/* ---- LRU list of cached blocks nobody references ---- */

static void lru_remove(BlockManager *m, int id) {
    int p = m->lru_prev[id], n = m->lru_next[id];
    if (p >= 0) m->lru_next[p] = n; else m->lru_head = n;
    if (n >= 0) m->lru_prev[n] = p; else m->lru_tail = p;
    m->n_lru--;
}

static void lru_push(BlockManager *m, int id) {
    m->lru_prev[id] = m->lru_tail;
    m->lru_next[id] = -1;
    if (m->lru_tail >= 0) m->lru_next[m->lru_tail] = id; else m->lru_head = id;
    m->lru_tail = id;
    m->n_lru++;
}

/* ---- the hash index ---- */

static uint64_t chain_key(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = parent;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ull;
    }
    h ^= h >> 31;
    return h ? h : 1;
}

/* Takes id out of the cache; its generation changes so no child can reach it. */
static void cache_remove(BlockManager *m, int id) {
    int32_t *at = &m->bucket[m->key[id] & (uint64_t)(m->n_buckets - 1)];
    while (*at != id) at = &m->next[*at];
    *at = m->next[id];
    m->cached[id] = false;
    m->gen[id]++;
    m->n_cached--;
}

/* ---- references ---- */

int block_manager_alloc(BlockManager *m) {
    int id = block_pool_alloc(m->pool);
    if (id < 0 && m->lru_head >= 0) {
        id = m->lru_head;
        lru_remove(m, id);
        cache_remove(m, id);
        m->evictions++;
    }
    if (id >= 0) m->ref[id] = 1;
    return id;
}

void block_manager_acquire(BlockManager *m, int id) {
    if (m->ref[id]++ == 0) lru_remove(m, id); /* a block with ref 0 held here is cached */
}

void block_manager_release(BlockManager *m, int id) {
    if (id < 0 || id >= m->n_blocks || m->ref[id] <= 0) return;
    if (--m->ref[id] > 0) return;
    if (m->cached[id]) lru_push(m, id);
    else block_pool_release(m->pool, id);
}

/* ---- prefix cache ---- */

/* The cached block with this key, parent and tokens, or -1. */
static int cache_find(const BlockManager *m, uint64_t key, const BlockChain *c, const int32_t *tokens) {
    for (int id = m->bucket[key & (uint64_t)(m->n_buckets - 1)]; id >= 0; id = m->next[id])
        if (m->key[id] == key && m->parent[id] == c->block && m->parent_gen[id] == c->gen &&
            !memcmp(m->tokens + (size_t)id * m->block_size, tokens, (size_t)m->block_size * sizeof *tokens))
            return id;
    return -1;
}

/* Whether chain c still ends at a cached block it can extend. */
static bool chain_live(const BlockManager *m, const BlockChain *c) {
    if (c->block == -1) return true;
    return c->block >= 0 && m->cached[c->block] && m->gen[c->block] == c->gen;
}

int block_manager_lookup(BlockManager *m, BlockChain *c, const int32_t *tokens) {
    if (!chain_live(m, c)) return -1;
    uint64_t key = chain_key(c->key, tokens, m->block_size);
    int id = cache_find(m, key, c, tokens);
    if (id >= 0) *c = (BlockChain){key, id, m->gen[id]};
    return id;
}

void block_manager_register(BlockManager *m, int id, BlockChain *c, const int32_t *tokens) {
    if (!chain_live(m, c)) { c->block = -2; return; }
    uint64_t key = chain_key(c->key, tokens, m->block_size);
    int have = cache_find(m, key, c, tokens);
    if (have >= 0) { *c = (BlockChain){key, have, m->gen[have]}; return; }
    if (m->cached[id]) { c->block = -2; return; } /* already indexed elsewhere in another chain */
    m->cached[id] = true;
    m->key[id] = key;
    m->parent[id] = c->block;
    m->parent_gen[id] = c->gen;
    memcpy(m->tokens + (size_t)id * m->block_size, tokens, (size_t)m->block_size * sizeof *tokens);
    int32_t *b = &m->bucket[key & (uint64_t)(m->n_buckets - 1)];
    m->next[id] = *b;
    *b = id;
    m->n_cached++;
    *c = (BlockChain){key, id, m->gen[id]};
}

/* ---- block tables ---- */

static int table_grow(BlockTable *bt, int need) {
    if (need <= bt->cap) return 0;
    int cap = bt->cap > 0 ? bt->cap : 8;
    while (cap < need) cap *= 2;
    int32_t *b = realloc(bt->blocks, (size_t)cap * sizeof *b);
    if (!b) return -1;
    bt->blocks = b;
    bt->cap = cap;
    return 0;
}

int block_manager_reserve(BlockManager *m, BlockTable *bt, int n_tokens) {
    int need = (int)(((int64_t)n_tokens + m->block_size - 1) / m->block_size);
    if (need <= bt->n_blocks) return 0;
    if (need - bt->n_blocks > block_manager_available(m) || table_grow(bt, need)) return -1;
    while (bt->n_blocks < need) bt->blocks[bt->n_blocks++] = block_manager_alloc(m);
    if (n_tokens > bt->n_tokens) bt->n_tokens = n_tokens;
    return 0;
}

void block_manager_release_table(BlockManager *m, BlockTable *bt) {
    while (bt->n_blocks > 0) block_manager_release(m, bt->blocks[--bt->n_blocks]);
    bt->n_tokens = 0;
}
