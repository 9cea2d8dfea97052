/* tokenizer.c — the Tokenizer object: building it (shared by the GGUF and
 * tokenizer.json loaders), the queries of tokenizer.h, token bytes and the
 * streaming detokenizer. Encoding is in tok_encode.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"

/* ---- arena: every string the tokenizer keeps --------------------------------- */

typedef struct ArenaBlock {
    struct ArenaBlock *next;
    size_t used, cap;
    char data[];
} ArenaBlock;

static void *arena_alloc(Tokenizer *t, size_t n) {
    n = (n + 7) & ~(size_t)7;
    ArenaBlock *b = t->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = t->arena;
        b->used = 0;
        b->cap = cap;
        t->arena = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

char *tok_strdup(Tokenizer *t, const char *s, size_t len) {
    char *p = arena_alloc(t, len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, s, len);
    p[len] = 0;
    return p;
}

/* ---- GPT-2 byte <-> code point map ------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the others (control chars,
 * space, 0x7F-0xA0, 0xAD) take 256, 257, ... in byte order. */
static bool byte_is_printable(uint8_t b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t k = 0;
    for (unsigned c = 0; c < b; c++) k += !byte_is_printable((uint8_t)c);
    return 256 + k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable((uint8_t)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1; /* 68 bytes are remapped */
    uint32_t k = cp - 256;
    for (unsigned c = 0; c < 256; c++)
        if (!byte_is_printable((uint8_t)c) && k-- == 0) return (int)c;
    return -1;
}

/* ---- construction -------------------------------------------------------------- */

Tokenizer *tok_new(const char *source) {
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->unk = t->bos = t->eos = -1;
    memset(t->trie_raw.root, 0xff, sizeof t->trie_raw.root);
    memset(t->trie_norm.root, 0xff, sizeof t->trie_norm.root);
    t->source = tok_strdup(t, source, strlen(source));
    if (!t->source) {
        free(t);
        return NULL;
    }
    return t;
}

int tok_alloc_vocab(Tokenizer *t, int32_t n, Err *err) {
    t->n_vocab = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->in_model = calloc((size_t)n, sizeof *t->in_model);
    if (!t->piece || !t->piece_len || !t->in_model)
        return err_set(err, "%s: out of memory for a vocabulary of %d tokens", t->source, n);
    return 0;
}

int tok_add_added(Tokenizer *t, int32_t id, const char *text, size_t len, bool special, bool normalized, bool lstrip,
                  bool rstrip, bool single_word, Err *err) {
    if (len == 0) return err_set(err, "%s: added token %d has empty content", t->source, id);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && !memcmp(t->added[i].text, text, len)) return 0;
    if ((t->n_added & (t->n_added - 1)) == 0) { /* grow at powers of two */
        AddedTok *a = realloc(t->added, (t->n_added ? 2 * t->n_added : 16) * sizeof *a);
        if (!a) return err_set(err, "%s: out of memory for added tokens", t->source);
        t->added = a;
    }
    char *s = tok_strdup(t, text, len);
    if (!s) return err_set(err, "%s: out of memory for added tokens", t->source);
    t->added[t->n_added++] = (AddedTok){id, s, len, s, len, special, normalized, lstrip, rstrip, single_word};
    return 0;
}

int tok_push_norm(Tokenizer *t, NormStep s, Err *err) {
    NormStep *v = realloc(t->norm, (t->n_norm + 1) * sizeof *v);
    if (!v) return err_set(err, "%s: out of memory", t->source);
    t->norm = v;
    t->norm[t->n_norm++] = s;
    return 0;
}

int tok_push_pre(Tokenizer *t, PreStep s, Err *err) {
    PreStep *v = realloc(t->pre, (t->n_pre + 1) * sizeof *v);
    if (!v) return err_set(err, "%s: out of memory", t->source);
    t->pre = v;
    t->pre[t->n_pre++] = s;
    return 0;
}

/* ---- added-token trie ---------------------------------------------------------- */

/* Children of a node form a linked list (first child, next sibling): the
 * '<' node of Gemma's 6000 "<unusedN>" tokens has a handful of children, so
 * the lists stay short. parent -1 is the root, whose children are indexed by
 * byte directly. */
static int32_t trie_child(const AddedTrie *tr, int32_t parent, uint8_t c) {
    int32_t node = parent < 0 ? tr->root[c] : tr->node[parent].child;
    while (node >= 0 && tr->node[node].byte != c) node = tr->node[node].sibling;
    return node;
}

static int trie_insert(AddedTrie *tr, const char *s, size_t len, int32_t tok) {
    int32_t node = -1;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t next = trie_child(tr, node, c);
        if (next < 0) {
            if (tr->n == tr->cap) {
                TrieNode *v = array_grow(tr->node, &tr->cap, tr->n + 1, sizeof *v);
                if (!v) return -1;
                tr->node = v;
            }
            next = (int32_t)tr->n++;
            int32_t *head = node < 0 ? &tr->root[c] : &tr->node[node].child;
            tr->node[next] = (TrieNode){-1, *head, -1, c};
            *head = next;
        }
        node = next;
    }
    if (tr->node[node].tok < 0) tr->node[node].tok = tok; /* the first of equal strings wins */
    return 0;
}

static int build_tries(Tokenizer *t, Err *err) {
    for (size_t i = 0; i < t->n_added; i++) {
        AddedTok *a = &t->added[i];
        if (a->normalized && t->n_norm) {
            /* Matched in normalized text, so searched for in normalized form. */
            TextBuf nb = {0};
            if (tok_normalize(t, a->text, a->len, &nb)) {
                textbuf_free(&nb);
                return err_set(err, "%s: out of memory", t->source);
            }
            a->match = nb.len ? tok_strdup(t, nb.data, nb.len) : a->text;
            a->match_len = nb.len ? nb.len : a->len;
            textbuf_free(&nb);
            if (!a->match) return err_set(err, "%s: out of memory", t->source);
        }
        AddedTrie *tr = a->normalized ? &t->trie_norm : &t->trie_raw;
        if (trie_insert(tr, a->match, a->match_len, (int32_t)i))
            return err_set(err, "%s: out of memory for added tokens", t->source);
    }
    return 0;
}

/* ---- decode table ----------------------------------------------------------------- */

/* The bytes HF's decoder gives for a token on its own (before the first-token
 * strip): ByteLevel maps each char back to its byte when all of them are in
 * the map; ByteFallback turns <0xXX> into that byte; Replace / Metaspace turn
 * their replacement (U+2581) into a space. */
static int decode_token(const Tokenizer *t, const char *s, size_t n, TextBuf *out) {
    if (t->dec_byte_level) {
        size_t start = out->len;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
            int b = k > 0 ? tok_cp_to_byte(cp) : -1;
            if (b < 0) {
                out->len = start;
                return textbuf_append(out, s, n);
            }
            char c = (char)b;
            if (textbuf_append(out, &c, 1)) return -1;
            i += (size_t)k;
        }
        return 0;
    }
    if (t->dec_byte_fallback && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
        char *end;
        char hex[3] = {s[3], s[4], 0};
        long v = strtol(hex, &end, 16);
        if (end == hex + 2) {
            char c = (char)v;
            return textbuf_append(out, &c, 1);
        }
    }
    const char *rep = t->dec_replace;
    size_t rl = rep ? strlen(rep) : 0;
    for (size_t i = 0; i < n; i++) {
        if (rl && i + rl <= n && !memcmp(s + i, rep, rl)) {
            if (textbuf_append(out, " ", 1)) return -1;
            i += rl - 1;
        } else if (textbuf_append(out, s + i, 1)) return -1;
    }
    return 0;
}

static int build_decode_table(Tokenizer *t, Err *err) {
    t->dec = calloc((size_t)t->n_vocab, sizeof *t->dec);
    t->dec_len = calloc((size_t)t->n_vocab, sizeof *t->dec_len);
    if (!t->dec || !t->dec_len) return err_set(err, "%s: out of memory", t->source);
    TextBuf b = {0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        b.len = 0;
        if (decode_token(t, t->piece[id], t->piece_len[id], &b) ||
            !(t->dec[id] = tok_strdup(t, b.data ? b.data : "", b.len))) {
            textbuf_free(&b);
            return err_set(err, "%s: out of memory", t->source);
        }
        t->dec_len[id] = (uint32_t)b.len;
        if (b.len > t->max_dec_len) t->max_dec_len = (uint32_t)b.len;
    }
    textbuf_free(&b);
    return 0;
}

/* ---- symbol tables ------------------------------------------------------------------- */

int32_t tok_vocab_get(const Tokenizer *t, const char *s, size_t n) {
    return strmap_get(&t->vocab, (const char *const *)t->piece, t->piece_len, s, n);
}

int tok_build_vocab_map(Tokenizer *t, Err *err) {
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!t->piece[id]) t->piece[id] = (char *)"";
    if (strmap_init(&t->vocab, (size_t)t->n_vocab)) return err_set(err, "%s: out of memory", t->source);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->in_model[id]) strmap_put(&t->vocab, (const char *const *)t->piece, t->piece_len, id);
    return 0;
}

static void build_symbol_tables(Tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n = utf8_put(tok_byte_to_cp((uint8_t)b), s);
        t->byte_sym[b] = tok_vocab_get(t, s, (size_t)n);
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_fb[b] = tok_vocab_get(t, s, 6);
    }
    for (int c = 0; c < 128; c++) {
        char s = (char)c;
        t->ascii_sym[c] = tok_vocab_get(t, &s, 1);
    }
}

/* ---- merges ---------------------------------------------------------------------------- */

/* Shows at most 40 bytes of a token in an error message. */
static int clip(size_t len) { return len > 40 ? 40 : (int)len; }

int tok_add_merge(Tokenizer *t, const char *a, size_t al, const char *b, size_t bl, int32_t rank, const char *field,
                  size_t index, Err *err) {
    int32_t l = tok_vocab_get(t, a, al), r = tok_vocab_get(t, b, bl);
    if (l < 0 || r < 0) {
        const char *bad = l < 0 ? a : b;
        size_t bad_len = l < 0 ? al : bl;
        return err_set(err, "%s: %s[%zu]: token '%.*s' is not in the vocabulary", t->source, field, index,
                       clip(bad_len), bad);
    }
    char stack[256];
    char *ab = al + bl <= sizeof stack ? stack : malloc(al + bl);
    if (!ab) return err_set(err, "%s: out of memory", t->source);
    memcpy(ab, a, al);
    memcpy(ab + al, b, bl);
    int32_t m = tok_vocab_get(t, ab, al + bl);
    if (ab != stack) free(ab);
    if (m < 0)
        return err_set(err, "%s: %s[%zu]: merged token '%.*s%.*s' is not in the vocabulary", t->source, field, index,
                       clip(al), a, clip(bl), b);
    mergemap_put(&t->merges, l, r, rank, m);
    return 0;
}

/* ---- end of generation -------------------------------------------------------------- */

static int eog_add(Tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return 0;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 0;
    int32_t *v = realloc(t->eog, (t->n_eog + 1) * sizeof *v);
    if (!v) return -1;
    t->eog = v;
    t->eog[t->n_eog++] = id;
    return 0;
}

/* Loaders add EOS and the file's own end-of-turn ids first; these names end a
 * turn in the chat formats of the supported families. */
static int add_known_eog(Tokenizer *t) {
    static const char *const names[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
                                        "<|return|>", "<|end|>", "<|endoftext|>"};
    if (eog_add(t, t->eos)) return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (eog_add(t, tokenizer_find_token(t, names[i]))) return -1;
    return 0;
}

int tok_add_eog(Tokenizer *t, int32_t id) { return eog_add(t, id); }

/* ---- growth bound ---------------------------------------------------------------------------- */

/* How many times longer a step can make a piece of m >= 1 bytes: a step that
 * gives at most a*m + b bytes counts as a + b. NFC lengthens UTF-8 at most
 * 3-fold (Unicode's stream-safe bound); a Replace by to/from; Prepend and the
 * pre-tokenizer's prefixes add their length to each piece. */
static double norm_growth(const NormStep *st) {
    switch (st->kind) {
    case NORM_NFC: return 3;
    case NORM_REPLACE: return st->from_len && st->to_len > st->from_len ? (double)st->to_len / (double)st->from_len : 1;
    case NORM_PREPEND: return 1 + (double)st->to_len;
    }
    return 1;
}

static double pre_growth(const PreStep *st) {
    if (st->kind == PRE_BYTELEVEL) return st->add_prefix_space ? 2 : 1;
    if (st->kind != PRE_METASPACE) return 1; /* splits only */
    double len = (double)st->str_len; /* ' ' -> the replacement, and a prefix */
    return (len > 1 ? len : 1) + (st->prepend != PREPEND_NEVER ? len : 0);
}

/* A file's normalizer and pre-tokenizer could chain steps that each lengthen
 * the text (ten Replaces of "a" by "aa" make 8 bytes 8 KiB; by eight "a"s, 8
 * GB): refused at load, so encoding costs memory in proportion to the input. */
static int check_growth(const Tokenizer *t, Err *err) {
    double g = 1; /* held under 1e15 so that it stays finite */
    for (size_t k = 0; k < t->n_norm; k++) g = fmin(g * norm_growth(&t->norm[k]), 1e15);
    if (g > TOK_MAX_GROWTH)
        return err_set(err, "%s: normalizer: its steps can make text up to %.3g times longer (limit %d)", t->source, g,
                       TOK_MAX_GROWTH);
    for (size_t k = 0; k < t->n_pre; k++) g = fmin(g * pre_growth(&t->pre[k]), 1e15);
    if (g > TOK_MAX_GROWTH)
        return err_set(err, "%s: pre_tokenizer: with the normalizer its steps can make text up to %.3g times longer "
                            "(limit %d)", t->source, g, TOK_MAX_GROWTH);
    return 0;
}

int tok_finish(Tokenizer *t, Err *err) {
    if (check_growth(t, err)) return -1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!t->piece[id]) t->piece[id] = (char *)"";
    if (!t->vocab.slot && tok_build_vocab_map(t, err)) return -1;
    build_symbol_tables(t);
    t->kind = t->byte_level ? TOK_BPE_BYTES : TOK_SPM;
    if (build_tries(t, err) || build_decode_table(t, err)) return -1;
    if (!t->n_bos_seq && t->bos >= 0) {
        t->bos_seq = malloc(sizeof *t->bos_seq);
        if (!t->bos_seq) return err_set(err, "%s: out of memory", t->source);
        t->bos_seq[0] = t->bos;
        t->n_bos_seq = 1;
    }
    if (add_known_eog(t)) return err_set(err, "%s: out of memory", t->source);
    return 0;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    free(t->piece);
    free(t->piece_len);
    free(t->in_model);
    strmap_free(&t->vocab);
    mergemap_free(&t->merges);
    free(t->norm);
    free(t->pre);
    free(t->added);
    free(t->trie_raw.node);
    free(t->trie_norm.node);
    free(t->bos_seq);
    free(t->suffix_seq);
    free(t->eog);
    free(t->dec);
    free(t->dec_len);
    for (ArenaBlock *b = t->arena; b;) {
        ArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    free(t);
}

/* ---- queries --------------------------------------------------------------------------- */

TokenizerKind tokenizer_kind(const Tokenizer *t) { return t->kind; }
int32_t tokenizer_n_vocab(const Tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const Tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const Tokenizer *t) { return t->eos; }
bool tokenizer_add_bos(const Tokenizer *t) { return t->add_bos; }
const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }

bool tokenizer_is_eog(const Tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

int32_t tokenizer_find_token(const Tokenizer *t, const char *text) {
    size_t n = strlen(text);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].text, text, n)) return t->added[i].id;
    return n ? tok_vocab_get(t, text, n) : -1;
}

const char *tokenizer_piece(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->piece[id] : "";
}

int tokenizer_token_bytes(const Tokenizer *t, int32_t id, char *out, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return -1;
    size_t n = t->dec_len[id] < cap ? t->dec_len[id] : cap;
    memcpy(out, t->dec[id], n);
    return (int)n;
}

int tokenizer_max_token_bytes(const Tokenizer *t) { return (int)t->max_dec_len; }

/* ---- streaming detokenizer ----------------------------------------------------------------- */

void detok_init(Detok *d) { memset(d, 0, sizeof *d); }

/* Appends s[0..n) to out if it fits whole (a character is never cut). */
static void emit(char *out, size_t cap, size_t *w, const char *s, size_t n) {
    if (*w + n > cap) return;
    memcpy(out + *w, s, n);
    *w += n;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

/* Completes the held-back bytes with the first bytes of src; returns how many
 * bytes of src were used. */
static size_t detok_resume(Detok *d, const uint8_t *src, size_t n, char *out, size_t cap, size_t *w) {
    size_t i = 0;
    while (d->n_pending > 0 && i < n) {
        d->pending[d->n_pending++] = (char)src[i++];
        uint32_t cp;
        int k = utf8_next((const uint8_t *)d->pending, (size_t)d->n_pending, &cp);
        if (k > 0) {
            emit(out, cap, w, d->pending, (size_t)k);
            d->n_pending = 0;
        } else if (-k < d->n_pending) {
            /* The new byte broke the sequence: the held bytes are one bad
             * subpart, and the new byte starts afresh. */
            emit(out, cap, w, REPLACEMENT, 3);
            d->n_pending = 0;
            i--;
        }
    }
    return i;
}

int detok_push(const Tokenizer *t, Detok *d, int32_t id, char *out, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return 0;
    const uint8_t *src = (const uint8_t *)t->dec[id];
    size_t n = t->dec_len[id], w = 0;
    if (d->n_tokens++ == 0)
        for (int k = 0; k < t->dec_strip_first && n > 0 && src[0] == ' '; k++) src++, n--;
    size_t i = detok_resume(d, src, n, out, cap, &w);
    while (i < n) {
        uint32_t cp;
        int k = src[i] < 0x80 ? 1 : utf8_next(src + i, n - i, &cp);
        if (k > 0) {
            emit(out, cap, &w, (const char *)src + i, (size_t)k);
            i += (size_t)k;
        } else if (utf8_incomplete_len(src + i, n - i) == (int)(n - i)) { /* cut by the token's end: hold back */
            memcpy(d->pending, src + i, n - i);
            d->n_pending = (int)(n - i);
            break;
        } else {
            emit(out, cap, &w, REPLACEMENT, 3);
            i += (size_t)-k;
        }
    }
    return (int)w;
}

int detok_flush(Detok *d, char *out, size_t cap) {
    size_t w = 0;
    if (d->n_pending > 0) emit(out, cap, &w, REPLACEMENT, 3);
    d->n_pending = 0;
    return (int)w;
}
