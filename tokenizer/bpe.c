/* bpe.c — string and pair hash maps, and the BPE merge loop (see bpe.h). */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

/* ---- hashing ---------------------------------------------------------------- */

uint64_t bpe_hash_bytes(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t table_size(size_t n_expected) {
    size_t cap = 64;
    while (cap < 2 * n_expected + 1 && cap < ((size_t)1 << 40)) cap *= 2;
    return cap;
}

/* ---- StrMap ------------------------------------------------------------------- */

int strmap_init(StrMap *m, size_t n_expected) {
    size_t cap = table_size(n_expected);
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return -1;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return 0;
}

void strmap_put(StrMap *m, const char *const *strs, const uint32_t *lens, int32_t id) {
    size_t i = bpe_hash_bytes(strs[id], lens[id]) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0 || (lens[o] == lens[id] && memcmp(strs[o], strs[id], lens[id]) == 0)) {
            m->slot[i] = id;
            return;
        }
    }
}

int32_t strmap_get(const StrMap *m, const char *const *strs, const uint32_t *lens, const char *s, size_t len) {
    size_t i = bpe_hash_bytes(s, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0) return -1;
        if (lens[o] == len && memcmp(strs[o], s, len) == 0) return o;
    }
}

void strmap_free(StrMap *m) {
    free(m->slot);
    m->slot = NULL;
}

/* ---- MergeMap -------------------------------------------------------------------- */

int mergemap_init(MergeMap *m, size_t n_expected) {
    size_t cap = table_size(n_expected);
    m->key = calloc(cap, sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->merged = malloc(cap * sizeof *m->merged);
    m->mask = cap - 1;
    m->n = 0;
    if (!m->key || !m->rank || !m->merged) {
        mergemap_free(m);
        return -1;
    }
    return 0;
}

static uint64_t pair_key(int32_t l, int32_t r) { return (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1; }

void mergemap_put(MergeMap *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    uint64_t k = pair_key(left, right);
    size_t i = mix64(k) & m->mask;
    while (m->key[i] && m->key[i] != k) i = (i + 1) & m->mask;
    if (!m->key[i]) m->n++;
    m->key[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

bool mergemap_get(const MergeMap *m, int32_t left, int32_t right, int32_t *rank, int32_t *merged) {
    uint64_t k = pair_key(left, right);
    for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return true;
        }
        if (!m->key[i]) return false;
    }
}

void mergemap_free(MergeMap *m) {
    free(m->key);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

/* ---- merge loop ---------------------------------------------------------------------- */

typedef struct BpeCand {
    int32_t rank, pos, merged;
} BpeCand;

static bool cand_before(const BpeCand *a, const BpeCand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(BpeCand *h, size_t *n, BpeCand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static BpeCand heap_pop(BpeCand *h, size_t *n) {
    BpeCand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int scratch_reserve(BpeScratch *ws, size_t n) {
    if (n > ws->cap) {
        int32_t *p = realloc(ws->prev, n * sizeof *p);
        if (p) ws->prev = p;
        int32_t *q = realloc(ws->next, n * sizeof *q);
        if (q) ws->next = q;
        if (!p || !q) return -1;
        ws->cap = n;
    }
    /* Each merge pushes at most two candidates: 3n bounds the heap. */
    if (3 * n > ws->heap_cap) {
        BpeCand *h = realloc(ws->heap, 3 * n * sizeof *h);
        if (!h) return -1;
        ws->heap = h;
        ws->heap_cap = 3 * n;
    }
    return 0;
}

static void push_pair(const MergeMap *m, const int32_t *ids, int32_t pos, int32_t right, BpeCand *h, size_t *nh) {
    int32_t rank, merged;
    if (mergemap_get(m, ids[pos], ids[right], &rank, &merged)) heap_push(h, nh, (BpeCand){rank, pos, merged});
}

int bpe_merge(const MergeMap *m, int32_t *ids, size_t *n_io, BpeScratch *ws) {
    size_t n = *n_io;
    if (n < 2) return 0;
    if (n > INT32_MAX / 4 || scratch_reserve(ws, n)) return -1;
    int32_t *prev = ws->prev, *next = ws->next; /* ids[i] < 0: merged away */
    BpeCand *h = ws->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(m, ids, (int32_t)i, (int32_t)i + 1, h, &nh);
    while (nh) {
        BpeCand c = heap_pop(h, &nh);
        int32_t r = next[c.pos];
        if (ids[c.pos] < 0 || r < 0) continue;
        int32_t rank, merged;
        if (!mergemap_get(m, ids[c.pos], ids[r], &rank, &merged) || merged != c.merged) continue; /* stale */
        ids[c.pos] = c.merged;
        ids[r] = -1;
        next[c.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.pos;
        if (prev[c.pos] >= 0) push_pair(m, ids, prev[c.pos], c.pos, h, &nh);
        if (next[c.pos] >= 0) push_pair(m, ids, c.pos, next[c.pos], h, &nh);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0) ids[w++] = ids[i];
    *n_io = w;
    return 0;
}

void bpe_scratch_free(BpeScratch *ws) {
    free(ws->prev);
    free(ws->next);
    free(ws->heap);
    memset(ws, 0, sizeof *ws);
}
