/* test_block_manager.c — attention/block_manager.c: reference counts, prefix
 * sharing without copies, the hash chain (tokens and parent verified on a
 * hit), LRU eviction, generations, and a random operation stream whose every
 * step keeps the accounting exact (each block free, referenced, or cached on
 * the LRU list, exactly once). */
#include <stdint.h>

#include "engine/block_manager.h"
#include "tests/test.h"

#define BS 4

typedef struct {
    BlockPool pool;
    BlockManager m;
} Rig;

static int rig_open(Rig *r, int n_blocks) {
    Err err = {{0}};
    if (block_pool_init(&r->pool, n_blocks, &err) || block_manager_init(&r->m, &r->pool, BS, &err)) {
        printf("  %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void rig_close(Rig *r) {
    block_manager_free(&r->m);
    block_pool_free(&r->pool);
}

/* Every block is exactly one of: on the free list, referenced, on the LRU list
 * (cached, unreferenced). Returns the number of violations. */
static int accounting_errors(const BlockManager *m) {
    int n = m->n_blocks, bad = 0;
    int *seen = calloc(n > 0 ? n : 1, sizeof *seen);
    for (int i = 0; i < m->pool->n_free; i++) seen[m->pool->free_ids[i]] |= 1;
    int n_lru = 0;
    for (int id = m->lru_head, prev = -1; id >= 0; prev = id, id = m->lru_next[id]) {
        bad += m->lru_prev[id] != prev || m->ref[id] != 0 || !m->cached[id] || (seen[id] & 2);
        seen[id] |= 2;
        n_lru++;
    }
    bad += n_lru != m->n_lru;
    int n_cached = 0;
    for (int b = 0; b < n; b++) {
        int states = ((seen[b] & 1) != 0) + ((seen[b] & 2) != 0) + (m->ref[b] > 0);
        bad += states != 1 || m->ref[b] < 0 || ((seen[b] & 1) && m->cached[b]);
        n_cached += m->cached[b];
    }
    bad += n_cached != m->n_cached;
    free(seen);
    return bad;
}

static void test_refcounts(void) {
    Rig r;
    if (rig_open(&r, 4)) { CHECK(0, "setup"); return; }
    int a = block_manager_alloc(&r.m), b = block_manager_alloc(&r.m);
    CHECK(a >= 0 && b >= 0 && a != b && r.m.ref[a] == 1, "two blocks: %d %d", a, b);
    CHECK(block_manager_used(&r.m) == 2 && block_manager_available(&r.m) == 2, "used %d", block_manager_used(&r.m));
    block_manager_acquire(&r.m, a);
    CHECK(r.m.ref[a] == 2, "shared block ref %d", r.m.ref[a]);
    block_manager_release(&r.m, a);
    CHECK(r.m.ref[a] == 1 && r.pool.n_free == 2, "one release of a shared block keeps it");
    block_manager_release(&r.m, a);
    block_manager_release(&r.m, b);
    block_manager_release(&r.m, b); /* double release: ignored */
    CHECK(r.pool.n_free == 4 && accounting_errors(&r.m) == 0, "all back: %d free", r.pool.n_free);
    int got[5];
    for (int i = 0; i < 5; i++) got[i] = block_manager_alloc(&r.m);
    CHECK(got[3] >= 0 && got[4] == -1, "a full pool gives -1");
    for (int i = 0; i < 4; i++) block_manager_release(&r.m, got[i]);
    CHECK(accounting_errors(&r.m) == 0, "accounting");
    rig_close(&r);
}

/* Two sequences with the same 2-block prefix share the blocks (no copy). */
static void test_prefix_sharing(void) {
    Rig r;
    if (rig_open(&r, 8)) { CHECK(0, "setup"); return; }
    int32_t toks[3 * BS] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    BlockTable t1 = {0}, t2 = {0};
    CHECK(block_manager_reserve(&r.m, &t1, 3 * BS) == 0, "reserve");
    BlockChain c = BLOCK_CHAIN_START;
    for (int b = 0; b < 3; b++) block_manager_register(&r.m, t1.blocks[b], &c, toks + b * BS);
    CHECK(r.m.n_cached == 3, "3 cached, got %d", r.m.n_cached);
    /* second sequence: same first two blocks, different third */
    int32_t toks2[3 * BS] = {5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4};
    BlockChain c2 = BLOCK_CHAIN_START;
    int hits = 0;
    for (int b = 0; b < 3; b++) {
        int id = block_manager_lookup(&r.m, &c2, toks2 + b * BS);
        if (id < 0) break;
        CHECK(id == t1.blocks[b], "hit %d is block %d, want %d", b, id, t1.blocks[b]);
        block_manager_acquire(&r.m, id);
        hits++;
    }
    CHECK(hits == 2, "2 shared blocks, got %d", hits);
    CHECK(r.m.ref[t1.blocks[0]] == 2 && r.m.ref[t1.blocks[2]] == 1, "refs %d %d", r.m.ref[t1.blocks[0]],
          r.m.ref[t1.blocks[2]]);
    CHECK(block_manager_used(&r.m) == 3, "sharing allocates nothing: used %d", block_manager_used(&r.m));
    /* The same tokens under another parent do not hit. */
    BlockChain c3 = BLOCK_CHAIN_START;
    CHECK(block_manager_lookup(&r.m, &c3, toks + BS) == -1, "block 1's tokens as a first block must miss");
    /* Release the first sequence: its blocks stay cached (ref 0, on the LRU). */
    block_manager_release_table(&r.m, &t1);
    CHECK(r.m.n_lru == 1 && r.m.ref[0] + r.m.ref[1] + r.m.ref[2] == 2, "lru %d", r.m.n_lru);
    for (int b = 0; b < 2; b++) block_manager_release(&r.m, t1.blocks[b]); /* second sequence lets go */
    CHECK(r.m.n_lru == 3 && block_manager_available(&r.m) == 8 && accounting_errors(&r.m) == 0, "lru %d avail %d",
          r.m.n_lru, block_manager_available(&r.m));
    /* Registering the same content again keeps one cached copy. */
    CHECK(block_manager_reserve(&r.m, &t2, BS) == 0, "reserve");
    BlockChain c4 = BLOCK_CHAIN_START;
    block_manager_register(&r.m, t2.blocks[0], &c4, toks);
    CHECK(r.m.n_cached == 3 && !r.m.cached[t2.blocks[0]] && c4.block == t1.blocks[0], "duplicate not indexed");
    block_manager_release_table(&r.m, &t2);
    CHECK(accounting_errors(&r.m) == 0 && r.pool.n_free + r.m.n_lru == 8, "no block leaked");
    block_table_free(&t1);
    block_table_free(&t2);
    rig_close(&r);
}

/* Unreferenced cached blocks are evicted oldest first, only when the free
 * list is empty; an evicted block is never found again, and neither are its
 * children (generation check) even when its id comes back with the same
 * tokens. */
static void test_lru_eviction(void) {
    Rig r;
    if (rig_open(&r, 4)) { CHECK(0, "setup"); return; }
    int32_t toks[4 * BS];
    for (int i = 0; i < 4 * BS; i++) toks[i] = 100 + i;
    BlockTable t = {0};
    CHECK(block_manager_reserve(&r.m, &t, 4 * BS) == 0, "reserve");
    BlockChain c = BLOCK_CHAIN_START;
    for (int b = 0; b < 4; b++) block_manager_register(&r.m, t.blocks[b], &c, toks + b * BS);
    int ids[4];
    for (int b = 0; b < 4; b++) ids[b] = t.blocks[b];
    /* release in order 0,1,2,3: block 0 is the least recently used */
    for (int b = 0; b < 4; b++) block_manager_release(&r.m, ids[b]);
    t.n_blocks = 0;
    CHECK(r.pool.n_free == 0 && r.m.n_lru == 4, "all cached: free %d lru %d", r.pool.n_free, r.m.n_lru);
    int e = block_manager_alloc(&r.m);
    CHECK(e == ids[0] && r.m.evictions == 1 && !r.m.cached[e], "evicts the oldest: got %d want %d", e, ids[0]);
    BlockChain l = BLOCK_CHAIN_START;
    CHECK(block_manager_lookup(&r.m, &l, toks) == -1, "evicted block must miss");
    /* Same id, same tokens, indexed again: the first block hits, its old child not. */
    BlockChain c2 = BLOCK_CHAIN_START;
    block_manager_register(&r.m, e, &c2, toks);
    l = BLOCK_CHAIN_START;
    CHECK(block_manager_lookup(&r.m, &l, toks) == e, "re-indexed block hits");
    CHECK(block_manager_lookup(&r.m, &l, toks + BS) == -1, "child of an evicted parent must miss");
    /* Touching a cached block moves it to the back of the LRU list. */
    block_manager_acquire(&r.m, ids[1]);
    block_manager_release(&r.m, ids[1]);
    CHECK(block_manager_alloc(&r.m) == ids[2], "LRU order follows use");
    CHECK(accounting_errors(&r.m) == 0, "accounting");
    block_table_free(&t);
    rig_close(&r);
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random sequences come and go over a small pool, sharing prefixes drawn
 * from a few templates; accounting holds after every operation and every
 * block comes back at the end. */
static void test_random_stream(void) {
    Rig r;
    if (rig_open(&r, 24)) { CHECK(0, "setup"); return; }
    enum { NSEQ = 6, MAXB = 8 };
    BlockTable t[NSEQ] = {{0}};
    int32_t toks[NSEQ][MAXB * BS];
    uint64_t seed = 12345;
    int errors = 0, wrong_hits = 0;
    for (int it = 0; it < 4000; it++) {
        int k = (int)(rng_next(&seed) % NSEQ);
        if (t[k].n_blocks > 0 && rng_next(&seed) % 3 == 0) {
            block_manager_release_table(&r.m, &t[k]);
        } else if (t[k].n_blocks == 0) {
            int tmpl = (int)(rng_next(&seed) % 3), nb = 1 + (int)(rng_next(&seed) % MAXB);
            for (int i = 0; i < MAXB * BS; i++) toks[k][i] = i < 2 * BS ? tmpl * 1000 + i : (int32_t)(rng_next(&seed) % 7);
            BlockChain c = BLOCK_CHAIN_START;
            int b = 0;
            for (; b < nb; b++) {
                int id = block_manager_lookup(&r.m, &c, toks[k] + b * BS);
                if (id < 0) break;
                wrong_hits += memcmp(r.m.tokens + (size_t)id * BS, toks[k] + b * BS, BS * sizeof(int32_t)) != 0;
                block_manager_acquire(&r.m, id);
                if (t[k].cap < MAXB) { t[k].blocks = realloc(t[k].blocks, MAXB * sizeof(int32_t)); t[k].cap = MAXB; }
                t[k].blocks[t[k].n_blocks++] = id;
            }
            if (block_manager_reserve(&r.m, &t[k], nb * BS) == 0)
                for (; b < nb; b++) block_manager_register(&r.m, t[k].blocks[b], &c, toks[k] + b * BS);
            else
                block_manager_release_table(&r.m, &t[k]);
        }
        errors += accounting_errors(&r.m) != 0;
    }
    CHECK(errors == 0, "%d steps broke the accounting", errors);
    CHECK(wrong_hits == 0, "%d hits returned other tokens", wrong_hits);
    CHECK(r.m.hits >= 0 && r.m.evictions > 0, "the stream should evict (evictions %lld)", (long long)r.m.evictions);
    for (int k = 0; k < NSEQ; k++) { block_manager_release_table(&r.m, &t[k]); block_table_free(&t[k]); }
    CHECK(r.pool.n_free + r.m.n_lru == 24 && block_manager_used(&r.m) == 0, "leak: free %d lru %d", r.pool.n_free,
          r.m.n_lru);
    rig_close(&r);
}

int main(void) {
    RUN(test_refcounts);
    RUN(test_prefix_sharing);
    RUN(test_lru_eviction);
    RUN(test_random_stream);
    TEST_EXIT();
}
