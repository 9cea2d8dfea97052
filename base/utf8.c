/* utf8.c — UTF-8 decoding with U+FFFD replacement as Python does it
 * (utf8.h). */
#include "base/utf8.h"

/* For a lead byte: the sequence length and the allowed range of the second
 * byte (the later ones are always 80..BF). Length 0: never a lead byte. */
static void utf8_lead(uint8_t c, int *len, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) *len = 1;
    else if (c < 0xC2) *len = 0;
    else if (c < 0xE0) *len = 2;
    else if (c < 0xF0) {
        *len = 3;
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
    } else if (c < 0xF5) {
        *len = 4;
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
    } else *len = 0;
}

int utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    int len;
    uint8_t lo, hi;
    utf8_lead(s[0], &len, &lo, &hi);
    if (len == 1) {
        *cp = s[0];
        return 1;
    }
    *cp = 0xFFFD;
    if (len == 0) return -1;
    uint32_t v = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        uint8_t a = i == 1 ? lo : 0x80, b = i == 1 ? hi : 0xBF;
        if ((size_t)i >= n || s[i] < a || s[i] > b) return -i;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

int utf8_incomplete_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    int len;
    uint8_t lo, hi;
    utf8_lead(s[0], &len, &lo, &hi);
    if (len <= 1 || (size_t)len <= n) return 0;
    for (size_t i = 1; i < n; i++) {
        uint8_t a = i == 1 ? lo : 0x80, b = i == 1 ? hi : 0xBF;
        if (s[i] < a || s[i] > b) return 0;
    }
    return (int)n;
}

int utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) { i++; continue; }
        int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

int utf8_sanitize(const char *s, size_t n, TextBuf *out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0; /* run: start of the valid stretch not yet copied */
    if (textbuf_reserve(out, n)) return -1;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = utf8_next(u + i, n - i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (textbuf_append(out, s + run, i - run) || textbuf_append(out, "\xEF\xBF\xBD", 3)) return -1;
        i += (size_t)(-k);
        run = i;
    }
    return textbuf_append(out, s + run, n - run);
}
