/* unicode.c — UTF-8 decoding with U+FFFD replacement, character classes for
 * the pre-tokenizer matchers, and NFC (canonical decomposition, canonical
 * ordering, canonical composition — Unicode Standard Annex #15), all over the
 * generated tables in unicode_tables.c.
 */
#include "tokenizer/unicode.h"

#include <stdlib.h>
#include <string.h>

/* ---- classes -------------------------------------------------------------- */

static const UniRange *range_find(const UniRange *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid;
        else if (cp > r[mid].last) lo = mid + 1;
        else return &r[mid];
    }
    return NULL;
}

/* White_Space: the set Oniguruma's \s matches (and Rust's char::is_whitespace). */
static bool is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

unsigned uni_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UNI_L | UNI_W;
        if (cp >= '0' && cp <= '9') return UNI_N | UNI_W;
        if (cp == '_') return UNI_W;
        if (cp == '\r' || cp == '\n') return UNI_S | UNI_NL;
        return is_white_space(cp) ? UNI_S : 0;
    }
    if (is_white_space(cp)) return UNI_S;
    const UniRange *r = range_find(uni_cat_ranges, uni_cat_ranges_n, cp);
    return r ? r->value : 0;
}

unsigned uni_ccc(uint32_t cp) {
    if (cp < 0x300) return 0;
    const UniRange *r = range_find(uni_ccc_ranges, uni_ccc_ranges_n, cp);
    return r ? r->value : 0;
}

/* ---- NFC -------------------------------------------------------------------- */

enum { HS_BASE = 0xAC00, HL_BASE = 0x1100, HV_BASE = 0x1161, HT_BASE = 0x11A7,
       HL_COUNT = 19, HV_COUNT = 21, HT_COUNT = 28, HN_COUNT = HV_COUNT * HT_COUNT,
       HS_COUNT = HL_COUNT * HN_COUNT };

static const UniTriple *decomp_find(uint32_t cp) {
    size_t lo = 0, hi = uni_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < uni_decomp[mid].a) hi = mid;
        else if (cp > uni_decomp[mid].a) lo = mid + 1;
        else return &uni_decomp[mid];
    }
    return NULL;
}

/* Full canonical decomposition of cp appended to out[*n] (room checked by the
 * caller: no character decomposes to more than 4 code points). */
static void decompose(uint32_t cp, uint32_t *out, size_t *n) {
    if (cp >= HS_BASE && cp < HS_BASE + HS_COUNT) {
        uint32_t s = cp - HS_BASE;
        out[(*n)++] = HL_BASE + s / HN_COUNT;
        out[(*n)++] = HV_BASE + (s % HN_COUNT) / HT_COUNT;
        if (s % HT_COUNT) out[(*n)++] = HT_BASE + s % HT_COUNT;
        return;
    }
    const UniTriple *d = cp >= 0xC0 ? decomp_find(cp) : NULL;
    if (!d) {
        out[(*n)++] = cp;
        return;
    }
    decompose(d->b, out, n);
    if (d->c) decompose(d->c, out, n);
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= HL_BASE && a < HL_BASE + HL_COUNT && b >= HV_BASE && b < HV_BASE + HV_COUNT)
        return HS_BASE + ((a - HL_BASE) * HV_COUNT + (b - HV_BASE)) * HT_COUNT;
    if (a >= HS_BASE && a < HS_BASE + HS_COUNT && (a - HS_BASE) % HT_COUNT == 0 && b > HT_BASE &&
        b < HT_BASE + HT_COUNT)
        return a + (b - HT_BASE);
    size_t lo = 0, hi = uni_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const UniTriple *t = &uni_comp[mid];
        if (a < t->a || (a == t->a && b < t->b)) hi = mid;
        else if (a > t->a || b > t->b) lo = mid + 1;
        else return t->c;
    }
    return 0;
}

/* Stable sort of each run of non-starters by combining class (insertion sort:
 * runs are a few marks long). */
static void canonical_order(uint32_t *cp, unsigned *cc, size_t n) {
    for (size_t i = 1; i < n; i++) {
        if (cc[i] == 0) continue;
        for (size_t j = i; j > 0 && cc[j - 1] > cc[j]; j--) {
            uint32_t t = cp[j]; cp[j] = cp[j - 1]; cp[j - 1] = t;
            unsigned u = cc[j]; cc[j] = cc[j - 1]; cc[j - 1] = u;
        }
    }
}

/* Canonical composition in place; returns the new length. A mark composes
 * with the last starter unless something between them blocks it (a starter,
 * or a mark of the same or higher class). */
static size_t compose(uint32_t *cp, unsigned *cc, size_t n) {
    size_t out = 0, starter = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[i];
        unsigned k = cc[i];
        if (starter != SIZE_MAX) {
            bool adjacent = out == starter + 1;
            unsigned prev = cc[out - 1];
            if (adjacent || (prev != 0 && prev < k)) {
                uint32_t comp = compose_pair(cp[starter], c);
                if (comp) {
                    cp[starter] = comp;
                    continue;
                }
            }
        }
        if (k == 0) starter = out;
        cp[out] = c;
        cc[out] = k;
        out++;
    }
    return out;
}

int uni_nfc(const char *s, size_t n, TextBuf *out) {
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0x80) i++;
    if (i == n) return textbuf_append(out, s, n); /* ASCII is its own NFC */
    /* Work on the whole input: 4 code points per input byte is a safe bound
     * (a code point takes >= 1 byte and decomposes to <= 4). */
    if (n > SIZE_MAX / (4 * sizeof(uint32_t) + 4 * sizeof(unsigned))) return -1;
    uint32_t *cp = malloc(4 * n * sizeof *cp);
    unsigned *cc = malloc(4 * n * sizeof *cc);
    if (!cp || !cc) {
        free(cp);
        free(cc);
        return -1;
    }
    size_t m = 0;
    for (size_t j = 0; j < n;) {
        uint32_t c;
        int k = utf8_next((const uint8_t *)s + j, n - j, &c);
        j += (size_t)(k > 0 ? k : -k);
        decompose(c, cp, &m);
    }
    for (size_t j = 0; j < m; j++) cc[j] = uni_ccc(cp[j]);
    canonical_order(cp, cc, m);
    m = compose(cp, cc, m);
    int rc = textbuf_reserve(out, 4 * m);
    if (!rc) {
        for (size_t j = 0; j < m; j++) out->len += (size_t)utf8_put(cp[j], out->data + out->len);
    }
    free(cp);
    free(cc);
    return rc;
}
