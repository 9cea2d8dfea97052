/* tok_encode.c — text to ids: the pipeline of tok_internal.h, in the order
 * and with the semantics of Hugging Face `tokenizers` (Tokenizer::encode):
 *
 *   1. invalid UTF-8 -> U+FFFD per maximal subpart (HF takes a str; we use
 *      what Python's bytes.decode(errors="replace") gives);
 *   2. added tokens found leftmost-longest in the raw text (those marked
 *      normalized=false); a special one found while parse_special is off is
 *      left in the text, and the search goes on after it;
 *   3. each stretch between them normalized, then split on the added tokens
 *      marked normalized=true;
 *   4. pre-tokenizer steps, each refining the pieces of the one before;
 *   5. each piece through the BPE model.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    int32_t id; /* an added token, or -1 for text[start..end) */
    size_t start, end;
} Item;

typedef struct {
    Item *v;
    size_t n, cap;
} ItemList;

typedef struct {
    TextBuf clean, norm, norm_tmp, pre[2], word;
    SpanList sp[2];
    ItemList items[2];
    PretokScratch ps;
    BpeScratch bs;
    int32_t *sym;
    size_t sym_cap;
} EncodeWs;

static void ws_free(EncodeWs *ws) {
    textbuf_free(&ws->clean);
    textbuf_free(&ws->norm);
    textbuf_free(&ws->norm_tmp);
    textbuf_free(&ws->pre[0]);
    textbuf_free(&ws->pre[1]);
    textbuf_free(&ws->word);
    spans_free(&ws->sp[0]);
    spans_free(&ws->sp[1]);
    free(ws->items[0].v);
    free(ws->items[1].v);
    pretok_scratch_free(&ws->ps);
    bpe_scratch_free(&ws->bs);
    free(ws->sym);
}

int token_ids_push(TokenIds *ids, int32_t id) {
    if (ids->n == ids->cap) {
        int32_t *v = array_grow(ids->ids, &ids->cap, ids->n + 1, sizeof *v);
        if (!v) return -1;
        ids->ids = v;
    }
    ids->ids[ids->n++] = id;
    return 0;
}

void token_ids_free(TokenIds *ids) {
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

static int items_push(ItemList *l, int32_t id, size_t start, size_t end) {
    if (l->n == l->cap) {
        Item *v = array_grow(l->v, &l->cap, l->n + 1, sizeof *v);
        if (!v) return -1;
        l->v = v;
    }
    l->v[l->n++] = (Item){id, start, end};
    return 0;
}

/* ---- 2/3. added tokens ------------------------------------------------------------ */

/* Longest added token starting at s[i] (before end): its index, or -1. */
static int32_t trie_longest(const AddedTrie *tr, const char *s, size_t i, size_t end, size_t *match_end) {
    int32_t node = tr->root[(uint8_t)s[i]], best = -1;
    for (size_t j = i; node >= 0;) {
        const TrieNode *nd = &tr->node[node];
        if (nd->tok >= 0) {
            best = nd->tok;
            *match_end = j + 1;
        }
        if (++j >= end) break;
        for (node = nd->child; node >= 0 && tr->node[node].byte != (uint8_t)s[j];) node = tr->node[node].sibling;
    }
    return best;
}

static bool is_word_cp(uint32_t cp) { return uni_class(cp) & UNI_W; }

/* Where the character ending just before s[i] starts (i > start). */
static size_t prev_start(const char *s, size_t start, size_t i) {
    size_t j = i - 1;
    while (j > start && ((uint8_t)s[j] & 0xC0) == 0x80) j--;
    return j;
}

static uint32_t cp_before(const char *s, size_t start, size_t i) {
    size_t j = prev_start(s, start, i);
    uint32_t cp;
    utf8_next((const uint8_t *)s + j, i - j, &cp);
    return cp;
}

static bool single_word_ok(const char *s, size_t start, size_t end, size_t ms, size_t me) {
    uint32_t cp;
    if (ms > start && is_word_cp(cp_before(s, start, ms))) return false;
    if (me < end && utf8_next((const uint8_t *)s + me, end - me, &cp) > 0 && is_word_cp(cp)) return false;
    return true;
}

static size_t space_len_before(const char *s, size_t start, size_t i) {
    size_t j = i;
    while (j > start && (uni_class(cp_before(s, start, j)) & UNI_S)) j = prev_start(s, start, j);
    return i - j;
}

static size_t space_len_after(const char *s, size_t i, size_t end) {
    size_t j = i;
    while (j < end) {
        uint32_t cp;
        int k = utf8_next((const uint8_t *)s + j, end - j, &cp);
        if (k <= 0 || !(uni_class(cp) & UNI_S)) break;
        j += (size_t)k;
    }
    return j - i;
}

/* Splits s[start..end) into text stretches and added tokens of trie tr
 * (AddedVocabulary::find_matches). */
static int split_added(const Tokenizer *t, const AddedTrie *tr, const char *s, size_t start, size_t end,
                       bool parse_special, ItemList *out) {
    size_t gap = start, i = start;
    out->n = 0;
    while (i < end) {
        size_t me = 0;
        int32_t k = trie_longest(tr, s, i, end, &me);
        if (k < 0) {
            i++;
            continue;
        }
        const AddedTok *a = &t->added[k];
        size_t ms = i;
        i = me; /* the search resumes after the match whatever becomes of it */
        if ((a->special && !parse_special) || (a->single_word && !single_word_ok(s, start, end, ms, me))) continue;
        if (a->lstrip) {
            size_t ns = ms - space_len_before(s, start, ms);
            ms = ns > gap ? ns : gap;
        }
        if (a->rstrip) me += space_len_after(s, me, end);
        if (gap < ms && items_push(out, -1, gap, ms)) return -1;
        if (items_push(out, a->id, ms, me)) return -1;
        gap = me;
    }
    if (gap < end && items_push(out, -1, gap, end)) return -1;
    return 0;
}

/* ---- 4. pre-tokenizer ----------------------------------------------------------------- */

static bool starts_with(const char *s, size_t n, const char *p, size_t pn) { return n >= pn && !memcmp(s, p, pn); }

/* Rewrites each piece of in (text) into dst: ByteLevel's prefix space, or
 * Metaspace's replacement of ' ' and its prefix. */
static int rewrite_pieces(const PreStep *st, const char *text, const SpanList *in, TextBuf *dst, SpanList *out) {
    dst->len = 0;
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        Span sp = in->v[k];
        const char *s = text + sp.start;
        size_t n = sp.end - sp.start, start = dst->len;
        if (st->kind == PRE_BYTELEVEL) {
            if (!starts_with(s, n, " ", 1) && textbuf_append(dst, " ", 1)) return -1;
            if (textbuf_append(dst, s, n)) return -1;
        } else {
            bool lead = starts_with(s, n, " ", 1) || starts_with(s, n, st->str, st->str_len);
            bool want = st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && sp.first);
            if (want && !lead && textbuf_append(dst, st->str, st->str_len)) return -1;
            NormStep rep = {NORM_REPLACE, (char *)" ", st->str, 1, st->str_len};
            if (tok_replace_all(s, n, &rep, dst)) return -1;
        }
        if (spans_push(out, start, dst->len, sp.first)) return -1;
    }
    return 0;
}

static int split_pieces(const PreStep *st, const char *text, const SpanList *in, SpanList *out, PretokScratch *ps) {
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        Span sp = in->v[k];
        int rc;
        switch (st->kind) {
        case PRE_DIGITS: rc = pretok_split_digits(st->individual_digits, text, sp, out, ps); break;
        case PRE_SPLIT_STRING:
            rc = pretok_split_string(st->str, st->str_len, st->behavior, text, sp, out, ps);
            break;
        case PRE_METASPACE:
            rc = pretok_split_string(st->str, st->str_len, SPLIT_MERGED_NEXT, text, sp, out, ps);
            break;
        default: rc = pretok_split_regex(st->rx, st->behavior, text, sp, out, ps); break;
        }
        if (rc) return -1;
    }
    return 0;
}

/* Runs the pre-tokenizer steps over text[0..n); the pieces end up in
 * ws->sp[*which] over the text *out_text. */
static int pretokenize(const Tokenizer *t, const char *text, size_t n, bool first, EncodeWs *ws,
                       const char **out_text, int *which) {
    int cur = 0, buf = 0;
    ws->sp[0].n = 0;
    if (spans_push(&ws->sp[0], 0, n, first)) return -1;
    for (size_t k = 0; k < t->n_pre; k++) {
        const PreStep *st = &t->pre[k];
        bool rewrite = (st->kind == PRE_BYTELEVEL && st->add_prefix_space) || st->kind == PRE_METASPACE;
        if (rewrite) {
            if (rewrite_pieces(st, text, &ws->sp[cur], &ws->pre[buf], &ws->sp[!cur])) return -1;
            text = ws->pre[buf].data;
            buf = !buf;
            cur = !cur;
        }
        bool split = (st->kind == PRE_BYTELEVEL && st->use_regex) || (st->kind == PRE_METASPACE && st->split) ||
                     st->kind == PRE_DIGITS || st->kind == PRE_SPLIT_REGEX || st->kind == PRE_SPLIT_STRING;
        if (split) {
            if (split_pieces(st, text, &ws->sp[cur], &ws->sp[!cur], &ws->ps)) return -1;
            cur = !cur;
        }
    }
    *out_text = text;
    *which = cur;
    return 0;
}

/* ---- 5. model ------------------------------------------------------------------------------ */

/* ignore_merges: a piece that is a token as a whole is that token. */
static int32_t whole_piece_id(const Tokenizer *t, const char *s, size_t n, EncodeWs *ws) {
    if (!t->byte_level) return tok_vocab_get(t, s, n);
    ws->word.len = 0;
    if (textbuf_reserve(&ws->word, 2 * n)) return -1;
    for (size_t i = 0; i < n; i++)
        ws->word.len += (size_t)utf8_put(tok_byte_to_cp((uint8_t)s[i]), ws->word.data + ws->word.len);
    return tok_vocab_get(t, ws->word.data, ws->word.len);
}

/* The initial symbols of a piece (BPE::merge_word before merging): one per
 * byte (byte-level) or per character, unknown characters as <0xXX> byte
 * tokens (byte_fallback) or as unk (fused when fuse_unk), else dropped. */
static size_t initial_symbols(const Tokenizer *t, const char *s, size_t n, int32_t *sym) {
    size_t m = 0;
    bool unk_pending = false;
    for (size_t i = 0; i < n;) {
        int32_t id;
        size_t len = 1;
        if (t->byte_level) id = t->byte_sym[(uint8_t)s[i]];
        else if ((uint8_t)s[i] < 0x80) id = t->ascii_sym[(uint8_t)s[i]];
        else {
            uint32_t cp;
            int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
            len = (size_t)(k > 0 ? k : -k);
            id = tok_vocab_get(t, s + i, len);
        }
        if (id >= 0) {
            if (unk_pending) sym[m++] = t->unk;
            unk_pending = false;
            sym[m++] = id;
        } else if (t->byte_fallback && !t->byte_level) {
            bool all = true;
            for (size_t j = 0; j < len; j++) all = all && t->byte_fb[(uint8_t)s[i + j]] >= 0;
            if (all) {
                for (size_t j = 0; j < len; j++) sym[m++] = t->byte_fb[(uint8_t)s[i + j]];
            } else if (t->unk >= 0) {
                if (unk_pending && !t->fuse_unk) sym[m++] = t->unk;
                unk_pending = true;
            }
        } else if (t->unk >= 0) {
            if (unk_pending && !t->fuse_unk) sym[m++] = t->unk;
            unk_pending = true;
        }
        i += len;
    }
    if (unk_pending) sym[m++] = t->unk;
    return m;
}

static int model_piece(const Tokenizer *t, const char *s, size_t n, EncodeWs *ws, TokenIds *out) {
    if (t->ignore_merges) {
        int32_t id = whole_piece_id(t, s, n, ws);
        if (id >= 0) return token_ids_push(out, id);
    }
    if (n + 1 > ws->sym_cap) { /* at most one symbol per byte, plus a fused unk */
        int32_t *v = realloc(ws->sym, (n + 1) * sizeof *v);
        if (!v) return -1;
        ws->sym = v;
        ws->sym_cap = n + 1;
    }
    size_t m = initial_symbols(t, s, n, ws->sym);
    if (bpe_merge(&t->merges, ws->sym, &m, &ws->bs)) return -1;
    for (size_t i = 0; i < m; i++)
        if (token_ids_push(out, ws->sym[i])) return -1;
    return 0;
}

/* ---- the whole pipeline ----------------------------------------------------------------------- */

/* A stretch of text between raw-text added tokens: steps 3-5. */
static int encode_stretch(const Tokenizer *t, const char *s, size_t n, bool first, bool parse_special,
                          EncodeWs *ws, TokenIds *out) {
    if (t->n_norm) {
        if (tok_normalize_into(t, s, n, &ws->norm, &ws->norm_tmp)) return -1;
        s = ws->norm.data;
        n = ws->norm.len;
    }
    ItemList *items = &ws->items[1];
    items->n = 0;
    if (t->trie_norm.n) {
        if (split_added(t, &t->trie_norm, s, 0, n, parse_special, items)) return -1;
    } else if (n && items_push(items, -1, 0, n)) return -1;
    for (size_t k = 0; k < items->n; k++) {
        Item it = items->v[k];
        if (it.id >= 0) {
            if (token_ids_push(out, it.id)) return -1;
            continue;
        }
        const char *text;
        int which;
        if (pretokenize(t, s + it.start, it.end - it.start, first && it.start == 0, ws, &text, &which)) return -1;
        const SpanList *sp = &ws->sp[which];
        for (size_t j = 0; j < sp->n; j++)
            if (model_piece(t, text + sp->v[j].start, sp->v[j].end - sp->v[j].start, ws, out)) return -1;
    }
    return 0;
}

static int push_suffix(const Tokenizer *t, TokenIds *out) {
    for (size_t i = 0; i < t->n_suffix_seq; i++)
        if (token_ids_push(out, t->suffix_seq[i])) return -1;
    return 0;
}

static int encode_all(const Tokenizer *t, const char *text, size_t len, bool parse_special, bool add_bos,
                      EncodeWs *ws, TokenIds *out) {
    if (add_bos)
        for (size_t i = 0; i < t->n_bos_seq; i++)
            if (token_ids_push(out, t->bos_seq[i])) return -1;
    if (len == 0) return add_bos ? push_suffix(t, out) : 0;
    if (utf8_sanitize(text, len, &ws->clean)) return -1;
    const char *s = ws->clean.data;
    ItemList *items = &ws->items[0];
    if (split_added(t, &t->trie_raw, s, 0, ws->clean.len, parse_special, items)) return -1;
    for (size_t k = 0; k < items->n; k++) {
        Item it = items->v[k];
        int rc = it.id >= 0 ? token_ids_push(out, it.id)
                            : encode_stretch(t, s + it.start, it.end - it.start, it.start == 0, parse_special, ws,
                                             out);
        if (rc) return -1;
    }
    return add_bos ? push_suffix(t, out) : 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool parse_special, bool add_bos,
                     TokenIds *out, Err *err) {
    EncodeWs ws = {0};
    int rc = encode_all(t, text, len, parse_special, add_bos, &ws, out);
    ws_free(&ws);
    if (rc) return err_set(err, "%s: out of memory while tokenizing %zu bytes of text", t->source, len);
    return 0;
}
