/* test_kv_cache.c — the host KV cache allocation (fp32 and fp8), the block
 * pool and block tables (kernels/cpu/kv_cache_host.c, engine/kv_blocks.c): counts, exhaustion without
 * side effects, slot computation, the fp8 store / read-back, and that every
 * block finds its way back to the pool. */
#include <limits.h>
#include <stdint.h>

#include "engine/kv_blocks.h"
#include "kernels/cpu/kv_cache_host.h"
#include "tests/test.h"

/* Every id of the pool is either free (once) or in exactly one table. */
static void check_accounting(const BlockPool *p, BlockTable *tables, int n_tables, const char *when) {
    char *owner = calloc(p->n_blocks > 0 ? p->n_blocks : 1, 1);
    if (!owner) return;
    int bad = 0;
    for (int i = 0; i < p->n_free; i++) {
        int id = p->free_ids[i];
        bad += id < 0 || id >= p->n_blocks || owner[id]++;
    }
    int held = 0;
    for (int t = 0; t < n_tables; t++)
        for (int b = 0; b < tables[t].n_blocks; b++, held++) {
            int id = tables[t].blocks[b];
            bad += id < 0 || id >= p->n_blocks || owner[id]++;
        }
    CHECK(bad == 0, "%s: %d block ids duplicated or out of range", when, bad);
    CHECK(held + p->n_free == p->n_blocks, "%s: %d held + %d free != %d blocks", when, held, p->n_free, p->n_blocks);
    free(owner);
}

static void test_pool_counts(void) {
    BlockPool p;
    Err err;
    CHECK(block_pool_init(&p, 5, &err) == 0, "%s", err.msg);
    CHECK(p.n_free == 5 && p.n_blocks == 5, "fresh pool: %d free of %d", p.n_free, p.n_blocks);
    int got[5];
    for (int i = 0; i < 5; i++) {
        got[i] = block_pool_alloc(&p);
        CHECK(got[i] == i, "fresh pool hands out 0, 1, 2...: got %d at %d", got[i], i);
        CHECK(p.n_free == 4 - i, "after %d allocs %d free", i + 1, p.n_free);
    }
    CHECK(block_pool_alloc(&p) == -1, "an exhausted pool returns -1");
    CHECK(p.n_free == 0, "exhaustion changes nothing");
    block_pool_release(&p, 3);
    block_pool_release(&p, 1);
    CHECK(p.n_free == 2, "two releases: %d free", p.n_free);
    CHECK(block_pool_alloc(&p) == 1 && block_pool_alloc(&p) == 3, "released ids come back (last in, first out)");
    block_pool_release(&p, -1);
    block_pool_release(&p, 5);
    CHECK(p.n_free == 0, "ids outside the pool are not taken back: %d free", p.n_free);
    for (int i = 0; i < 5; i++) block_pool_release(&p, got[i]);
    block_pool_release(&p, 2); /* a sixth release: the stack is full */
    CHECK(p.n_free == 5, "releases beyond the pool size are ignored: %d free", p.n_free);
    block_pool_free(&p);
    CHECK(p.free_ids == NULL && p.n_free == 0, "freed pool is empty");

    CHECK(block_pool_init(&p, 0, &err) == 0, "an empty pool is valid: %s", err.msg);
    CHECK(block_pool_alloc(&p) == -1, "an empty pool has nothing to give");
    block_pool_free(&p);
    CHECK(block_pool_init(&p, -3, &err) == -1 && strstr(err.msg, "-3"), "negative count: %s", err.msg);
    block_pool_free(&p);
}

static void test_table_reserve(void) {
    BlockPool p;
    Err err;
    CHECK(block_pool_init(&p, 4, &err) == 0, "%s", err.msg);
    BlockTable t[2] = {{0}, {0}};
    CHECK(block_table_reserve(&t[0], &p, 0, 4) == 0 && t[0].n_blocks == 0, "0 tokens need no block");
    CHECK(block_table_reserve(&t[0], &p, 5, 4) == 0, "5 tokens");
    CHECK(t[0].n_blocks == 2 && t[0].n_tokens == 5 && p.n_free == 2, "5 tokens of 4 per block: %d blocks, %d tokens",
          t[0].n_blocks, t[0].n_tokens);
    CHECK(block_table_reserve(&t[0], &p, 8, 4) == 0 && t[0].n_blocks == 2 && t[0].n_tokens == 8,
          "8 tokens still fit in 2 blocks: %d blocks, %d tokens", t[0].n_blocks, t[0].n_tokens);
    CHECK(block_table_reserve(&t[0], &p, 9, 4) == 0 && t[0].n_blocks == 3 && p.n_free == 1, "9 tokens: 3 blocks");
    check_accounting(&p, t, 2, "after reserves");

    /* Exhaustion: 3 blocks wanted, 1 free. Nothing may change. */
    int32_t *before = t[1].blocks;
    CHECK(block_table_reserve(&t[1], &p, 12, 4) == -1, "12 tokens with one free block must fail");
    CHECK(t[1].n_blocks == 0 && t[1].n_tokens == 0 && t[1].blocks == before && p.n_free == 1,
          "a failed reserve leaves table and pool as they were: %d blocks, %d tokens, %d free", t[1].n_blocks,
          t[1].n_tokens, p.n_free);
    CHECK(block_table_reserve(&t[0], &p, 17, 4) == -1 && t[0].n_blocks == 3 && t[0].n_tokens == 9 && p.n_free == 1,
          "growing past the pool fails without taking the last block");
    CHECK(block_table_reserve(&t[1], &p, 4, 4) == 0 && t[1].n_blocks == 1 && p.n_free == 0, "the last block");
    CHECK(block_table_reserve(&t[1], &p, 4, 0) == -1 && block_table_reserve(&t[1], &p, -1, 4) == -1,
          "block size 0 and negative counts are refused");
    check_accounting(&p, t, 2, "after exhaustion");

    block_table_release(&t[0], &p);
    CHECK(t[0].n_blocks == 0 && t[0].n_tokens == 0 && p.n_free == 3, "release returns 3 blocks: %d free", p.n_free);
    block_table_release(&t[0], &p); /* twice: nothing more to give */
    CHECK(p.n_free == 3, "a second release gives nothing back");
    block_table_release(&t[1], &p);
    CHECK(p.n_free == 4, "all blocks back: %d free", p.n_free);
    check_accounting(&p, t, 2, "after release");
    block_table_free(&t[0]);
    block_table_free(&t[1]);
    CHECK(t[0].blocks == NULL && t[0].cap == 0, "freed table is empty");
    block_pool_free(&p);
}

static void test_slots(void) {
    int32_t ids[3] = {7, 2, 5};
    BlockTable t = {ids, 3, 3, 40};
    int block_size = 16;
    int64_t want[][2] = {{0, 112}, {15, 127}, {16, 32}, {31, 47}, {32, 80}, {39, 87}};
    for (int i = 0; i < 6; i++) {
        int64_t s = block_table_slot(&t, (int)want[i][0], block_size);
        CHECK(s == want[i][1], "position %lld: slot %lld, expected %lld", (long long)want[i][0], (long long)s,
              (long long)want[i][1]);
    }
    /* The slot feeds kv_k_at: K of slot s, head h starts at (s * heads + h) * head_dim. */
    KVCacheHost c;
    Err err;
    CHECK(kv_cache_host_alloc(&c, 2, 3, 8, 4, block_size, 8, KV_DTYPE_BF16, &err) == 0, "%s", err.msg);
    if (!c.k) return;
    CHECK(kv_k_at(&c, 1, 87, 2) == c.k[1] + (87 * 3 + 2) * 8, "K address");
    CHECK(kv_v_at(&c, 1, 87, 2) == c.v[1] + (87 * 3 + 2) * 4, "V address");
    /* The last slot's last value is inside the allocation (ASan checks the write). */
    kv_k_at(&c, 1, 8 * block_size - 1, 2)[7] = 1.0f;
    kv_v_at(&c, 0, 8 * block_size - 1, 2)[3] = 1.0f;
    CHECK(c.k[0][0] == 0.0f && c.v[1][0] == 0.0f, "a new cache is zero-filled");
    kv_cache_host_free(&c);
    CHECK(c.k == NULL && c.n_layers == 0, "freed cache is empty");
    kv_cache_host_free(&c); /* twice is harmless */
}

/* Many sequences come and go at random; at every step each block is in one
 * place, and at the end all of them are back in the pool. */
static void test_no_leak(void) {
    enum { N_TABLES = 6, N_BLOCKS = 40, BS = 4 };
    BlockPool p;
    Err err;
    CHECK(block_pool_init(&p, N_BLOCKS, &err) == 0, "%s", err.msg);
    BlockTable t[N_TABLES];
    memset(t, 0, sizeof t);
    uint32_t s = 12345;
    int steps = getenv("CLLM_QUICK") ? 300 : 3000, failures = 0, successes = 0;
    for (int i = 0; i < steps; i++) {
        s = s * 1664525u + 1013904223u;
        BlockTable *bt = &t[(s >> 8) % N_TABLES];
        if ((s >> 20) % 4 == 0) {
            block_table_release(bt, &p);
        } else {
            int n = bt->n_tokens + (int)((s >> 12) % 23);
            int free_before = p.n_free, blocks_before = bt->n_blocks;
            if (block_table_reserve(bt, &p, n, BS) == 0) {
                successes++;
                CHECK(bt->n_blocks == (n + BS - 1) / BS && bt->n_tokens == n, "step %d: %d blocks, %d tokens for %d",
                      i, bt->n_blocks, bt->n_tokens, n);
            } else {
                failures++;
                CHECK(p.n_free == free_before && bt->n_blocks == blocks_before, "step %d: failed reserve changed state",
                      i);
            }
        }
        if (i % 50 == 0) check_accounting(&p, t, N_TABLES, "random workload");
    }
    CHECK(failures > 0 && successes > 0, "the workload exercised exhaustion (%d) and success (%d)", failures, successes);
    for (int i = 0; i < N_TABLES; i++) {
        block_table_release(&t[i], &p);
        block_table_free(&t[i]);
    }
    CHECK(p.n_free == N_BLOCKS, "every block back in the pool: %d of %d", p.n_free, N_BLOCKS);
    check_accounting(&p, t, 0, "end");
    block_pool_free(&p);
}

static void test_cache_alloc_errors(void) {
    KVCacheHost c;
    Err err;
    err.msg[0] = 0;
    CHECK(kv_cache_host_alloc(&c, 2, 0, 64, 64, 16, 10, KV_DTYPE_BF16, &err) == -1 && strstr(err.msg, "0 kv heads"),
          "zero kv heads: %s", err.msg);
    CHECK(c.k == NULL && c.v == NULL, "a failed alloc leaves nothing allocated");
    CHECK(kv_cache_host_alloc(&c, 2, 8, 64, 64, 16, -1, KV_DTYPE_BF16, &err) == -1 && strstr(err.msg, "-1 blocks"),
          "negative blocks: %s", err.msg);
    CHECK(kv_cache_host_alloc(&c, 1, INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX, KV_DTYPE_BF16, &err) == -1 &&
              strstr(err.msg, "overflow"),
          "sizes overflowing size_t: %s", err.msg);
#ifndef __SANITIZE_ADDRESS__ /* ASan aborts on absurd requests instead of returning NULL */
    /* 2^20 blocks x 1024 tokens x 8 heads x 1024 x 4 bytes = 32 TiB per layer: refused by the OS. */
    CHECK(kv_cache_host_alloc(&c, 2, 8, 1024, 1024, 1024, 1 << 20, KV_DTYPE_BF16, &err) == -1 && strstr(err.msg, "35184372088832"),
          "an allocation that fails names its size: %s", err.msg);
    CHECK(c.k == NULL, "nothing left allocated");
#endif
    kv_cache_host_free(&c);
}

/* An fp8 cache: codes and scales only, zero-filled; a stored token lands at
 * its slot as fp8_quantize_row of each head vector, and kv_key / kv_value
 * give back code x scale; an fp32 cache returns pointers into itself. */
static void test_fp8_cache(void) {
    KVCacheHost c;
    Err err;
    CHECK(kv_cache_host_alloc(&c, 2, 3, 8, 4, 4, 5, KV_DTYPE_FP8, &err) == 0, "%s", err.msg); /* 20 slots */
    if (!c.k8) return;
    CHECK(c.k == NULL && c.v == NULL && c.ks && c.vs && c.v8 && c.dtype == KV_DTYPE_FP8, "fp8 arrays only");
    CHECK(c.k8[1][20 * 3 * 8 - 1] == 0 && c.vs[1][20 * 3 - 1] == 0.0f, "zero-filled to the last slot");
    float k[3][8], v[3][4], buf[8];
    for (int h = 0; h < 3; h++) {
        for (int d = 0; d < 8; d++) k[h][d] = (float)(h + 1) * (d - 3.3f);
        for (int d = 0; d < 4; d++) v[h][d] = -0.01f * (float)(h * 4 + d + 1);
    }
    kv_cache_store(&c, 1, 13, &k[0][0], &v[0][0]);
    int bad = 0;
    for (int h = 0; h < 3; h++) {
        uint8_t q[8];
        float s;
        fp8_quantize_row(k[h], 8, q, &s);
        bad += memcmp(q, c.k8[1] + (13 * 3 + h) * 8, 8) != 0 || c.ks[1][13 * 3 + h] != s;
        const float *kk = kv_key(&c, 1, 13, h, buf);
        for (int d = 0; d < 8; d++) bad += kk != buf || kk[d] != e4m3_to_fp32(q[d]) * s;
        fp8_quantize_row(v[h], 4, q, &s);
        bad += memcmp(q, c.v8[1] + (13 * 3 + h) * 4, 4) != 0 || c.vs[1][13 * 3 + h] != s;
        const float *vv = kv_value(&c, 1, 13, h, buf);
        for (int d = 0; d < 4; d++) bad += vv[d] != e4m3_to_fp32(q[d]) * s || fabsf(vv[d] - v[h][d]) > fabsf(v[h][d]) / 16;
    }
    CHECK(bad == 0, "%d stored values differ from fp8_quantize_row's", bad);
    CHECK(c.k8[0][13 * 3 * 8] == 0 && c.ks[1][12 * 3] == 0.0f && c.k8[1][14 * 3 * 8] == 0, "nothing else written");
    kv_cache_host_free(&c);
    CHECK(c.k8 == NULL && c.ks == NULL, "freed");
    CHECK(kv_cache_host_alloc(&c, 2, 3, 8, 4, 4, 5, KV_DTYPE_BF16, &err) == 0, "%s", err.msg);
    kv_cache_store(&c, 0, 7, &k[0][0], &v[0][0]);
    CHECK(kv_key(&c, 0, 7, 2, buf) == kv_k_at(&c, 0, 7, 2) && kv_k_at(&c, 0, 7, 2)[5] == k[2][5] &&
              kv_value(&c, 0, 7, 1, buf)[3] == v[1][3],
          "an fp32 cache stores exactly and reads in place");
    kv_cache_host_free(&c);
#ifndef __SANITIZE_ADDRESS__
    CHECK(kv_cache_host_alloc(&c, 2, 8, 1024, 1024, 1024, 1 << 20, KV_DTYPE_FP8, &err) == -1 &&
              strstr(err.msg, "8796093022208") && strstr(err.msg, "fp8"),
          "an fp8 allocation that fails names its size (a quarter of fp32's): %s", err.msg);
#endif
}

int main(void) {
    RUN(test_fp8_cache);
    RUN(test_pool_counts);
    RUN(test_table_reserve);
    RUN(test_slots);
    RUN(test_no_leak);
    RUN(test_cache_alloc_errors);
    TEST_EXIT();
}
