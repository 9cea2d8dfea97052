/* buf.h — a growable text buffer and a growable array. */
#ifndef CLLM_BUF_H
#define CLLM_BUF_H

#include <stddef.h>

/* Bytes, always NUL-terminated once written (data NULL while empty). */
typedef struct {
    char *data;
    size_t len, cap;
} TextBuf;

int textbuf_reserve(TextBuf *b, size_t extra);              /* 0, or -1 out of memory */
int textbuf_append(TextBuf *b, const void *s, size_t n);     /* 0, or -1 out of memory */
void textbuf_free(TextBuf *b);

/* Grows an array of elem-byte items to hold at least need (doubling, from
 * 16): returns the new pointer and sets *cap, or NULL (p untouched) on
 * failure or overflow. */
void *array_grow(void *p, size_t *cap, size_t need, size_t elem);

#endif
