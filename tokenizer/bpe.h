/* bpe.h — the hash tables of a tokenizer (token string -> id, merge pair ->
 * rank) and the BPE merge loop.
 *
 * The merge loop is that of Hugging Face `tokenizers` (BPE::merge_all): a
 * priority queue of candidate pairs ordered by (rank, position), stale
 * entries recognized by the merged id no longer matching, so words of any
 * length cost O(n log n).
 */
#ifndef CLLM_BPE_H
#define CLLM_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Open-addressing map from a byte string to an id; the strings live in the
 * caller's tables (strs[id], lens[id]) and are not copied. */
typedef struct {
    int32_t *slot; /* id or -1 */
    size_t mask;
} StrMap;

int strmap_init(StrMap *m, size_t n_expected);       /* -1 on allocation failure */
/* Maps strs[id] -> id; a string already present is re-pointed to this id (the
 * later token wins, as a Python dict built in order). */
void strmap_put(StrMap *m, const char *const *strs, const uint32_t *lens, int32_t id);
int32_t strmap_get(const StrMap *m, const char *const *strs, const uint32_t *lens, const char *s, size_t len);
void strmap_free(StrMap *m);
uint64_t bpe_hash_bytes(const char *s, size_t len);

/* Map from an id pair to (rank, merged id). */
typedef struct {
    uint64_t *key;   /* (left << 32 | right) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t mask, n;
} MergeMap;

int mergemap_init(MergeMap *m, size_t n_expected);
/* Adds or overwrites (the later merge wins, as in `tokenizers`). */
void mergemap_put(MergeMap *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
bool mergemap_get(const MergeMap *m, int32_t left, int32_t right, int32_t *rank, int32_t *merged);
void mergemap_free(MergeMap *m);

typedef struct {
    int32_t *prev, *next;
    struct BpeCand *heap;
    size_t cap, heap_cap;
} BpeScratch;

/* Merges the symbols ids[0..*n) in place; *n becomes the token count.
 * Returns -1 on allocation failure. */
int bpe_merge(const MergeMap *m, int32_t *ids, size_t *n, BpeScratch *ws);
void bpe_scratch_free(BpeScratch *ws);

#endif
