/* buf.c — growable buffers (buf.h). */
#include "base/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *array_grow(void *p, size_t *cap, size_t need, size_t elem) {
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2) return NULL;
        c *= 2;
    }
    if (elem && c > SIZE_MAX / elem) return NULL;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

int textbuf_reserve(TextBuf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

int textbuf_append(TextBuf *b, const void *s, size_t n) {
    if (textbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void textbuf_free(TextBuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}
