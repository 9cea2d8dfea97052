/* normalize.c — the normalizer steps of tok_internal.h (step 3 of
 * tok_encode.c's pipeline); apart from the encoder because building the
 * tokenizer also normalizes (the added tokens that are matched in
 * normalized text). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

int tok_replace_all(const char *s, size_t n, const NormStep *st, TextBuf *out) {
    size_t run = 0;
    for (size_t i = 0; st->from_len && i + st->from_len <= n;) {
        if (memcmp(s + i, st->from, st->from_len)) {
            i++;
            continue;
        }
        if (textbuf_append(out, s + run, i - run) || textbuf_append(out, st->to, st->to_len)) return -1;
        i += st->from_len;
        run = i;
    }
    return textbuf_append(out, s + run, n - run);
}

static int norm_step(const NormStep *st, const char *s, size_t n, TextBuf *out) {
    switch (st->kind) {
    case NORM_NFC: return uni_nfc(s, n, out);
    case NORM_REPLACE: return tok_replace_all(s, n, st, out);
    case NORM_PREPEND:
        if (n && textbuf_append(out, st->to, st->to_len)) return -1;
        return textbuf_append(out, s, n);
    }
    return -1;
}

int tok_normalize_into(const Tokenizer *t, const char *s, size_t n, TextBuf *out, TextBuf *tmp) {
    out->len = 0;
    if (textbuf_append(out, s, n)) return -1;
    for (size_t k = 0; k < t->n_norm; k++) {
        tmp->len = 0;
        if (norm_step(&t->norm[k], out->data, out->len, tmp)) return -1;
        TextBuf x = *out;
        *out = *tmp;
        *tmp = x;
    }
    return 0;
}

int tok_normalize(const Tokenizer *t, const char *s, size_t n, TextBuf *out) {
    TextBuf tmp = {0};
    int rc = tok_normalize_into(t, s, n, out, &tmp);
    textbuf_free(&tmp);
    return rc;
}

