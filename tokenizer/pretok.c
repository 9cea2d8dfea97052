/* pretok.c — the pre-tokenizer regexes as hand-written matchers, and the
 * splitting behaviors of Hugging Face `tokenizers`.
 *
 * Each regex is an alternation tried left to right at the current position
 * (the first alternative that matches wins, as in a backtracking engine);
 * match_* returns how many code points the winning alternative takes, always
 * >= 1 because every character is a letter, a number, a space or "other".
 * The backtracking cases worked out by hand:
 *   \s+(?!\S)     a whitespace run of k chars followed by a non-space gives
 *                 k-1 (the last space goes with the next word), or k at the
 *                 end of the text; k = 1 before a non-space fails and \s+
 *                 takes the one char.
 *   \s*[\r\n]+    within a whitespace run: everything up to and including the
 *                 last \r or \n of the run; fails when the run has none.
 */
#include "tokenizer/pretok.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"

int spans_push(SpanList *l, size_t start, size_t end, bool first) {
    if (l->n == l->cap) {
        Span *v = array_grow(l->v, &l->cap, l->n + 1, sizeof *v);
        if (!v) return -1;
        l->v = v;
    }
    l->v[l->n++] = (Span){start, end, first};
    return 0;
}

void spans_free(SpanList *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

void pretok_scratch_free(PretokScratch *ws) {
    free(ws->cp);
    free(ws->cls);
    free(ws->off);
    free(ws->seg);
    free(ws->is_match);
    memset(ws, 0, sizeof *ws);
}

static const char RX_SRC_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RX_SRC_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RX_SRC_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int pretok_regex_from_pattern(const char *p, size_t len) {
    static const struct { const char *src; RegexKind k; } known[] = {
        {RX_SRC_GPT2, RX_GPT2}, {RX_SRC_LLAMA3, RX_LLAMA3}, {RX_SRC_QWEN2, RX_QWEN2}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strlen(known[i].src) == len && memcmp(known[i].src, p, len) == 0) return (int)known[i].k;
    return -1;
}

/* ---- code point view of a span -------------------------------------------- */

static int scratch_decode(PretokScratch *ws, const char *text, Span sp, size_t *n_out) {
    size_t n = sp.end - sp.start;
    if (n + 1 > ws->cap) {
        size_t cap = n + 1 > 256 ? n + 1 : 256;
        uint32_t *cp = realloc(ws->cp, cap * sizeof *cp);
        if (cp) ws->cp = cp;
        uint8_t *cls = realloc(ws->cls, cap);
        if (cls) ws->cls = cls;
        size_t *off = realloc(ws->off, cap * sizeof *off);
        if (off) ws->off = off;
        if (!cp || !cls || !off) return -1;
        ws->cap = cap;
    }
    const uint8_t *s = (const uint8_t *)text;
    size_t m = 0;
    for (size_t i = sp.start; i < sp.end;) {
        uint32_t c;
        int k = s[i] < 0x80 ? (c = s[i], 1) : utf8_next(s + i, sp.end - i, &c);
        if (k < 0) k = -k; /* text is sanitized already; stay safe anyway */
        ws->cp[m] = c;
        ws->cls[m] = (uint8_t)uni_class(c);
        ws->off[m] = i;
        m++;
        i += (size_t)k;
    }
    ws->off[m] = sp.end;
    *n_out = m;
    return 0;
}

/* ---- matchers ---------------------------------------------------------------- */

#define IS_L(i) (cls[i] & UNI_L)
#define IS_N(i) (cls[i] & UNI_N)
#define IS_S(i) (cls[i] & UNI_S)
#define IS_NL(i) (cls[i] & UNI_NL)
#define IS_OTHER(i) (!(cls[i] & (UNI_L | UNI_N | UNI_S)))

static size_t run_of(const uint8_t *cls, size_t n, size_t i, unsigned bits) {
    size_t j = i;
    while (j < n && (cls[j] & bits)) j++;
    return j - i;
}

static size_t run_other(const uint8_t *cls, size_t n, size_t i) {
    size_t j = i;
    while (j < n && IS_OTHER(j)) j++;
    return j - i;
}

/* Lower-cases what the contraction letters can fold from: ASCII, and U+017F
 * LONG S, which case-folds to 's' (Oniguruma's (?i) matches it). */
static uint32_t fold(uint32_t c, bool ci) {
    if (!ci) return c;
    if (c >= 'A' && c <= 'Z') return c | 0x20;
    return c == 0x17F ? 's' : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitive when ci. */
static size_t match_contraction(const uint32_t *cp, size_t n, size_t i, bool ci) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = fold(cp[i + 1], ci);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t b = fold(cp[i + 2], ci);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at a whitespace char. */
static size_t match_space_run(const uint8_t *cls, size_t n, size_t i) {
    size_t k = run_of(cls, n, i, UNI_S);
    if (i + k == n) return k;
    return k >= 2 ? k - 1 : 1;
}

static size_t match_gpt2(const uint32_t *cp, const uint8_t *cls, size_t n, size_t i) {
    size_t m = match_contraction(cp, n, i, false);
    if (m) return m;
    /* " ?X+" for X = letters, numbers, other: the space only if X follows. */
    size_t j = (cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
    if (IS_L(i)) return run_of(cls, n, i, UNI_L);
    if (j > i && IS_L(j)) return 1 + run_of(cls, n, j, UNI_L);
    if (IS_N(i)) return run_of(cls, n, i, UNI_N);
    if (j > i && IS_N(j)) return 1 + run_of(cls, n, j, UNI_N);
    if (IS_OTHER(i)) return run_other(cls, n, i);
    if (j > i && IS_OTHER(j)) return 1 + run_other(cls, n, j);
    return match_space_run(cls, n, i);
}

static size_t match_llama3(const uint32_t *cp, const uint8_t *cls, size_t n, size_t i, size_t max_digits) {
    size_t m = match_contraction(cp, n, i, true);
    if (m) return m;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (IS_L(i)) return run_of(cls, n, i, UNI_L);
    if (!IS_NL(i) && !IS_N(i) && i + 1 < n && IS_L(i + 1)) return 1 + run_of(cls, n, i + 1, UNI_L);
    /* \p{N}{1,max_digits} */
    if (IS_N(i)) {
        m = run_of(cls, n, i, UNI_N);
        return m < max_digits ? m : max_digits;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = (cp[i] == ' ' && i + 1 < n && IS_OTHER(i + 1)) ? i + 1 : i;
    if (IS_OTHER(j)) {
        size_t e = j + run_other(cls, n, j);
        return e + run_of(cls, n, e, UNI_NL) - i;
    }
    /* \s*[\r\n]+ : up to the last newline of the whitespace run. */
    size_t k = run_of(cls, n, i, UNI_S);
    for (size_t q = i + k; q > i; q--)
        if (IS_NL(q - 1)) return q - i;
    return match_space_run(cls, n, i);
}

static size_t regex_match(RegexKind k, const uint32_t *cp, const uint8_t *cls, size_t n, size_t i) {
    switch (k) {
    case RX_GPT2: return match_gpt2(cp, cls, n, i);
    case RX_LLAMA3: return match_llama3(cp, cls, n, i, 3);
    case RX_QWEN2: return match_llama3(cp, cls, n, i, 1);
    }
    return 1;
}

/* ---- behaviors ----------------------------------------------------------------- */

static int seg_push(PretokScratch *ws, size_t *n, size_t start, size_t end, bool is_match) {
    if (start == end) return 0;
    if (*n == ws->seg_cap) {
        Span *s = array_grow(ws->seg, &ws->seg_cap, *n + 1, sizeof *s);
        if (!s) return -1;
        ws->seg = s;
    }
    if (*n == ws->match_cap) {
        bool *m = array_grow(ws->is_match, &ws->match_cap, *n + 1, sizeof *m);
        if (!m) return -1;
        ws->is_match = m;
    }
    ws->seg[*n] = (Span){start, end, false};
    ws->is_match[*n] = is_match;
    (*n)++;
    return 0;
}

/* Turns the alternating gaps/matches ws->seg[0..n) of span sp into pieces. */
static int apply_behavior(PretokScratch *ws, size_t n, SplitBehavior b, Span sp, SpanList *out) {
    Span *s = ws->seg;
    const bool *m = ws->is_match;
    size_t w = 0; /* merged segments are compacted in place into s[0..w) */
    bool prev = false;
    switch (b) {
    case SPLIT_ISOLATED: w = n; break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!m[i]) s[w++] = s[i];
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (m[i] && !prev && w > 0) s[w - 1].end = s[i].end;
            else s[w++] = s[i];
            prev = m[i];
        }
        break;
    case SPLIT_MERGED_NEXT:
        /* Right to left: a match joins the piece after it. */
        for (size_t i = n; i-- > 0;) {
            if (m[i] && !prev && w > 0) s[n - w].start = s[i].start;
            else {
                w++;
                s[n - w] = s[i];
            }
            prev = m[i];
        }
        memmove(s, s + (n - w), w * sizeof *s);
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (w > 0 && m[i] == prev) s[w - 1].end = s[i].end;
            else s[w++] = s[i];
            prev = m[i];
        }
        break;
    }
    for (size_t i = 0; i < w; i++)
        if (spans_push(out, s[i].start, s[i].end, sp.first && s[i].start == sp.start)) return -1;
    return 0;
}

int pretok_split_regex(RegexKind k, SplitBehavior b, const char *text, Span sp, SpanList *out, PretokScratch *ws) {
    size_t n, ns = 0;
    if (scratch_decode(ws, text, sp, &n)) return -1;
    if (b == SPLIT_ISOLATED) {
        /* Every character is inside some match: the pieces are the matches. */
        for (size_t i = 0; i < n;) {
            size_t m = regex_match(k, ws->cp, ws->cls, n, i);
            if (spans_push(out, ws->off[i], ws->off[i + m], sp.first && i == 0)) return -1;
            i += m;
        }
        return 0;
    }
    for (size_t i = 0; i < n;) {
        size_t m = regex_match(k, ws->cp, ws->cls, n, i);
        if (seg_push(ws, &ns, ws->off[i], ws->off[i + m], true)) return -1;
        i += m;
    }
    return apply_behavior(ws, ns, b, sp, out);
}

int pretok_split_digits(bool individual, const char *text, Span sp, SpanList *out, PretokScratch *ws) {
    size_t n, ns = 0, gap = 0;
    if (scratch_decode(ws, text, sp, &n)) return -1;
    for (size_t i = 0; i < n; i++) {
        if (!(ws->cls[i] & UNI_N)) continue;
        if (seg_push(ws, &ns, ws->off[gap], ws->off[i], false)) return -1;
        if (seg_push(ws, &ns, ws->off[i], ws->off[i + 1], true)) return -1;
        gap = i + 1;
    }
    if (seg_push(ws, &ns, ws->off[gap], ws->off[n], false)) return -1;
    return apply_behavior(ws, ns, individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, sp, out);
}

int pretok_split_string(const char *pat, size_t plen, SplitBehavior b, const char *text, Span sp, SpanList *out,
                        PretokScratch *ws) {
    size_t ns = 0, gap = sp.start;
    if (plen == 0) return spans_push(out, sp.start, sp.end, sp.first);
    for (size_t i = sp.start; i + plen <= sp.end;) {
        if (memcmp(text + i, pat, plen) != 0) {
            i++;
            continue;
        }
        if (seg_push(ws, &ns, gap, i, false) || seg_push(ws, &ns, i, i + plen, true)) return -1;
        i += plen;
        gap = i;
    }
    if (seg_push(ws, &ns, gap, sp.end, false)) return -1;
    return apply_behavior(ws, ns, b, sp, out);
}
