/* line_bytes.h — the growable byte string the line editor's files share
 * (line_core.c, line_history.c, line_edit.c); not for use elsewhere. */
#ifndef CLLM_LINE_BYTES_H
#define CLLM_LINE_BYTES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES (16u << 20)        /* one turn; longer input is refused */

/* A growable byte string, always NUL-terminated once allocated. */
typedef struct {
    char *p;
    size_t len, cap;
} Bytes;

static inline int bytes_reserve(Bytes *b, size_t extra) {
    if (extra > SIZE_MAX / 4 - b->len) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int bytes_insert(Bytes *b, size_t at, const char *s, size_t n) {
    if (bytes_reserve(b, n)) return -1;
    memmove(b->p + at + n, b->p + at, b->len - at);
    memcpy(b->p + at, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static inline int bytes_add(Bytes *b, const char *s, size_t n) { return bytes_insert(b, b->len, s, n); }
static inline int bytes_adds(Bytes *b, const char *s) { return bytes_add(b, s, strlen(s)); }

static inline void bytes_erase(Bytes *b, size_t from, size_t to) {
    memmove(b->p + from, b->p + to, b->len - to);
    b->len -= to - from;
    b->p[b->len] = 0;
}

static inline int bytes_set(Bytes *b, const char *s, size_t n) {
    b->len = 0;
    if (bytes_reserve(b, n)) return -1;
    return bytes_add(b, s, n);
}

static inline void bytes_free(Bytes *b) {
    free(b->p);
    *b = (Bytes){0};
}


#endif
