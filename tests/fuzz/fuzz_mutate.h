/* fuzz_mutate.h — the mutation engine of the in-tree fuzzers
 * (tests/test_fuzz.c, tests/test_fuzz_loaders.c): a seeded xoshiro256**
 * generator, growable byte buffers, seed lists, and the mutations (bit flips,
 * random bytes, "interesting" integers, insertions, deletions, truncations,
 * duplicated chunks, splices with another seed, JSON tokens, numbers swapped
 * for extreme ones, safetensors header edits with a consistent length
 * field). Deterministic: one seed, one sequence of inputs. */
#ifndef CLLM_FUZZ_MUTATE_H
#define CLLM_FUZZ_MUTATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { uint8_t *b; size_t n, cap; } Buf;
typedef struct { Buf *items; size_t n; } Seeds;
typedef struct { uint64_t s[4]; } Rng; /* xoshiro256** */

/* ---------- random numbers ---------- */

static inline uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static inline uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s, x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

static inline size_t rng_below(Rng *r, size_t n) { return n ? (size_t)(rng_next(r) % n) : 0; }

/* ---------- buffers ---------- */

static inline void buf_reserve(Buf *b, size_t n) {
    if (n <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n) cap *= 2;
    b->b = realloc(b->b, cap);
    b->cap = cap;
}

static inline void buf_set(Buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->b, p, n);
    b->n = n;
}

/* Replaces b[at, at + del) with ins[0, n) (ins may point into b). */
static inline void buf_splice(Buf *b, size_t at, size_t del, const uint8_t *ins, size_t n) {
    if (n > SIZE_MAX / 4) abort(); /* no input grows that large (and GCC then sees a bounded malloc) */
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, ins, n);
    if (at > b->n) at = b->n;
    if (del > b->n - at) del = b->n - at;
    buf_reserve(b, b->n - del + n);
    memmove(b->b + at + n, b->b + at + del, b->n - at - del);
    if (n) memcpy(b->b + at, copy, n);
    b->n = b->n - del + n;
    free(copy);
}

static inline bool read_file(const char *path, Buf *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint8_t chunk[65536];
    size_t n;
    out->n = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) buf_splice(out, out->n, 0, chunk, n);
    fclose(f);
    return true;
}

static inline void seeds_add(Seeds *s, const void *p, size_t n) {
    s->items = realloc(s->items, (s->n + 1) * sizeof *s->items);
    s->items[s->n] = (Buf){0};
    buf_set(&s->items[s->n++], p, n);
}

static inline void seeds_add_file(Seeds *s, const char *path, size_t max) {
    Buf b = {0};
    if (read_file(path, &b) && b.n <= max) seeds_add(s, b.b, b.n);
    free(b.b);
}

static inline void seeds_free(Seeds *s) {
    for (size_t i = 0; i < s->n; i++) free(s->items[i].b);
    free(s->items);
}

/* ---------- mutations ---------- */

static const uint64_t interesting[] = {
    0, 1, 2, 7, 8, 16, 31, 32, 64, 127, 128, 255, 256, 0x7fff, 0x8000, 0xffff, 0x10000,
    0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull, 0x7fffffffffffffffull, 0x8000000000000000ull,
    0xffffffffffffffffull, 0xfffffffffffffffeull, 100ull << 20, (100ull << 20) + 1, 1ull << 40,
};

static const char *json_tokens[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\u0000", "1e999",
    "-0", "0.5", "null", "true", "false", "\"\"", "[]", "{}", "\xff", "\xc3", "\xed\xa0\x80", "\xf0\x9f\x98\x80",
    "\x01", " ", "\n", "\"__metadata__\"", "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"F32\"", "\"F16\"",
    "\"BF16\"", "\"F8_E4M3\"", "\"I64\"", "\"weight_map\"", "[1,2,3,4,5]", "[0,0]", "18446744073709551616",
};

static const char *json_numbers[] = {
    "0", "1", "-1", "2", "4", "8", "1024", "2147483647", "4294967296", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "18446744073709551615", "1099511627776", "1e3", "0.0", "-0",
};

/* Overwrites a little-endian integer of 1, 2, 4 or 8 bytes at a random
 * offset (aligned to its size half the time: where GGUF counts live). */
static inline void mut_interesting(Rng *r, Buf *b) {
    int w = 1 << rng_below(r, 4);
    if (b->n < (size_t)w) return;
    size_t at = rng_below(r, b->n - w + 1);
    if (rng_below(r, 2)) at &= ~(size_t)(w - 1);
    uint64_t v = interesting[rng_below(r, sizeof interesting / sizeof *interesting)];
    if (rng_below(r, 4) == 0) v = ~v + 1; /* negated */
    if (rng_below(r, 4) == 0) v += rng_below(r, 5) - 2;
    for (int i = 0; i < w; i++) b->b[at + i] = (uint8_t)(v >> (8 * i));
}

/* Swaps one run of digits for an extreme number. */
static inline void mut_number(Rng *r, Buf *b) {
    if (!b->n) return;
    size_t at = rng_below(r, b->n), tries = 0;
    while (tries++ < b->n && !(b->b[at] >= '0' && b->b[at] <= '9')) at = (at + 1) % b->n;
    if (!(b->b[at] >= '0' && b->b[at] <= '9')) return;
    size_t start = at, end = at;
    while (start > 0 && b->b[start - 1] >= '0' && b->b[start - 1] <= '9') start--;
    while (end < b->n && b->b[end] >= '0' && b->b[end] <= '9') end++;
    const char *num = json_numbers[rng_below(r, sizeof json_numbers / sizeof *json_numbers)];
    buf_splice(b, start, end - start, (const uint8_t *)num, strlen(num));
}

static inline void mutate(Rng *r, Buf *b, const Seeds *others, bool text) {
    int kinds = text ? 11 : 9;
    switch (rng_below(r, kinds)) {
    case 0: if (b->n) b->b[rng_below(r, b->n)] ^= (uint8_t)(1u << rng_below(r, 8)); break;
    case 1: if (b->n) b->b[rng_below(r, b->n)] = (uint8_t)rng_next(r); break;
    case 2: mut_interesting(r, b); break;
    case 3: { /* insert random bytes */
        uint8_t ins[16];
        size_t n = 1 + rng_below(r, sizeof ins);
        for (size_t i = 0; i < n; i++) ins[i] = (uint8_t)rng_next(r);
        buf_splice(b, rng_below(r, b->n + 1), 0, ins, n);
        break;
    }
    case 4: { /* delete a range */
        size_t at = rng_below(r, b->n + 1);
        buf_splice(b, at, 1 + rng_below(r, rng_below(r, 2) ? 8 : 256), NULL, 0);
        break;
    }
    case 5: b->n = rng_below(r, b->n + 1); break; /* truncate */
    case 6: { /* duplicate a chunk somewhere else */
        if (!b->n) break;
        size_t at = rng_below(r, b->n), n = 1 + rng_below(r, b->n - at < 64 ? b->n - at : 64);
        buf_splice(b, rng_below(r, b->n + 1), rng_below(r, 2) ? 0 : n, b->b + at, n);
        break;
    }
    case 7: { /* splice: our head, another seed's tail */
        const Buf *o = &others->items[rng_below(r, others->n)];
        size_t at = rng_below(r, b->n + 1), from = rng_below(r, o->n + 1);
        buf_splice(b, at, b->n - at, o->b + from, o->n - from);
        break;
    }
    case 8: { /* overwrite with bytes from another seed at the same offset */
        const Buf *o = &others->items[rng_below(r, others->n)];
        size_t at = rng_below(r, b->n + 1), n = rng_below(r, 32);
        if (at < o->n && n > o->n - at) n = o->n - at;
        if (at < o->n) buf_splice(b, at, n, o->b + at, n);
        break;
    }
    case 9: { /* insert or replace with a JSON token */
        const char *t = json_tokens[rng_below(r, sizeof json_tokens / sizeof *json_tokens)];
        buf_splice(b, rng_below(r, b->n + 1), rng_below(r, 3), (const uint8_t *)t, strlen(t));
        break;
    }
    default: mut_number(r, b); break;
    }
}

static inline void mutate_n(Rng *r, Buf *b, const Seeds *others, bool text) {
    int n = 1 + (int)rng_below(r, 4);
    for (int i = 0; i < n; i++) mutate(r, b, others, text);
}

/* A safetensors file whose header JSON is mutated as text and then framed
 * with a correct length, so the mutations reach the tensor checks instead
 * of failing at the length field. */
static inline void mutate_st_header(Rng *r, Buf *b, const Seeds *others) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0 && b->n >= 8; i--) hlen = hlen << 8 | b->b[i];
    if (b->n < 8 || hlen > b->n - 8) { mutate_n(r, b, others, true); return; }
    Buf h = {0}, out = {0};
    buf_set(&h, b->b + 8, (size_t)hlen);
    int n = 1 + (int)rng_below(r, 3);
    for (int i = 0; i < n; i++) {
        size_t k = rng_below(r, 4);
        if (k == 0) mutate(r, &h, others, true);
        else if (k == 1) mut_number(r, &h);
        else { /* a JSON token at a random place */
            const char *t = json_tokens[rng_below(r, sizeof json_tokens / sizeof *json_tokens)];
            buf_splice(&h, rng_below(r, h.n + 1), rng_below(r, 4), (const uint8_t *)t, strlen(t));
        }
    }
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    buf_set(&out, len, 8);
    buf_splice(&out, 8, 0, h.b, h.n);
    size_t data = b->n - 8 - (size_t)hlen;
    if (rng_below(r, 4) == 0) data = rng_below(r, data + 1);
    buf_splice(&out, out.n, 0, b->b + 8 + hlen, data);
    buf_set(b, out.b, out.n);
    free(h.b);
    free(out.b);
}


static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs one target of a test program (tests/test.h's counters; fz has an
 * `accepted` count the target adds to) and prints its count and time. */
#define FUZZ_RUN(fn, fz, n)                                                                         \
    do {                                                                                            \
        double t0_ = now_s();                                                                       \
        test_failed_checks = 0;                                                                     \
        (fz)->accepted = 0;                                                                         \
        fn(fz, n);                                                                                  \
        printf("# fuzz: %s: %ld iterations (%ld inputs accepted) in %.1f s\n", #fn, (long)(n),      \
               (long)(fz)->accepted, now_s() - t0_);                                                \
        printf("%s - %s (%ld iterations)\n", test_failed_checks ? "not ok" : "ok", #fn, (long)(n)); \
        if (test_failed_checks) test_failed_tests++;                                                \
        fflush(stdout);                                                                             \
    } while (0)

#endif
