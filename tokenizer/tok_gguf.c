/* tok_gguf.c — builds a Tokenizer from GGUF metadata (tokenizer.ggml.*), the
 * way transformers does for AutoTokenizer.from_pretrained(gguf_file=...)
 * (integrations/gguf/gguf_tokenizer_mapping.py), except where that loses what
 * the model's own tokenizer.json says; those cases follow the model's
 * tokenizer.json (and llama.cpp):
 *   - pre "smollm": the model splits digits one by one before the GPT-2
 *     regex (HF hub tokenizer.json: Digits(individual) + ByteLevel);
 *     transformers' GGUF path forgets the Digits step.
 *   - pre "qwen2": NFC first, as Qwen2's tokenizer.json; transformers' GGUF
 *     path has no normalizer.
 *   - pre "llama-bpe": ignore_merges, as Llama 3's tokenizer.json.
 *
 * byte-level ("gpt2"): tokens not spelled in the byte alphabet are respelled
 * into it; merges come from tokenizer.ggml.merges.
 * SentencePiece ("llama"): no merges in the file, so they are rebuilt from
 * the vocabulary as transformers' generate_merges does: every split of a
 * token into two tokens is a merge, best first by score (Gemma: by position
 * in the file, its scores do not follow merge order), then longer left part,
 * longer right part, earlier token. Gemma's space-run tokens ("  ") are
 * respelled with U+2581, as the text they match is after normalization.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define MAX_VOCAB (1 << 24)
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct {
    const GGUFFile *f;
    Tokenizer *t;
    Err *err;
    const GGUFValue *tokens, *types, *scores, *merges;
    bool byte_level, gemma;
} GLoad;

/* ---- vocabulary --------------------------------------------------------------- */

static bool all_in_byte_alphabet(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0 || tok_cp_to_byte(cp) < 0) return false;
        i += (size_t)k;
    }
    return true;
}

/* Python's str.isspace(): White_Space plus the separators U+001C..U+001F. */
static bool py_isspace(uint32_t cp) { return (uni_class(cp) & UNI_S) || (cp >= 0x1C && cp <= 0x1F); }

/* Gemma: a token of spaces only (" " in t and not t.strip()) is spelled "▁"
 * once per character. Returns the code point count, or 0 if not such a token. */
static size_t gemma_space_token(const char *s, size_t n) {
    bool space = false;
    size_t count = 0;
    for (size_t i = 0; i < n; count++) {
        uint32_t cp;
        int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0 || !py_isspace(cp)) return 0;
        space = space || cp == ' ';
        i += (size_t)k;
    }
    return space ? count : 0;
}

static int set_piece(GLoad *g, int32_t id, const char *s, size_t n) {
    Tokenizer *t = g->t;
    TextBuf b = {0};
    size_t spaces;
    int rc = 0;
    if (g->byte_level && !all_in_byte_alphabet(s, n)) {
        for (size_t i = 0; i < n && !rc; i++) {
            char u[4];
            rc = textbuf_append(&b, u, (size_t)utf8_put(tok_byte_to_cp((uint8_t)s[i]), u));
        }
    } else if (g->gemma && (spaces = gemma_space_token(s, n)) > 0) {
        for (size_t i = 0; i < spaces && !rc; i++) rc = textbuf_append(&b, "\xE2\x96\x81", 3);
    } else rc = textbuf_append(&b, s, n);
    if (!rc) t->piece[id] = tok_strdup(t, b.data ? b.data : "", b.len);
    t->piece_len[id] = (uint32_t)b.len;
    t->in_model[id] = true;
    textbuf_free(&b);
    if (rc || !t->piece[id]) return err_set(g->err, "%s: out of memory reading tokenizer.ggml.tokens", t->source);
    return 0;
}

static int load_vocab(GLoad *g) {
    const char *src = g->f->path;
    g->tokens = gguf_get_arr(g->f, "tokenizer.ggml.tokens", GGUF_STRING);
    if (!g->tokens) {
        if (gguf_get(g->f, "tokenizer.ggml.tokens"))
            return err_set(g->err, "%s: tokenizer.ggml.tokens: must be an array of strings", src);
        return err_set(g->err, "%s: tokenizer.ggml.tokens: missing (the file has no tokenizer)", src);
    }
    uint64_t n = g->tokens->v.arr.n;
    if (n == 0 || n > MAX_VOCAB)
        return err_set(g->err, "%s: tokenizer.ggml.tokens: %llu tokens (want 1..%d)", src, (unsigned long long)n,
                       MAX_VOCAB);
    g->types = gguf_get_arr(g->f, "tokenizer.ggml.token_type", GGUF_INT32);
    if (gguf_get(g->f, "tokenizer.ggml.token_type") && (!g->types || g->types->v.arr.n != n))
        return err_set(g->err, "%s: tokenizer.ggml.token_type: must be an int32 array of %llu entries", src,
                       (unsigned long long)n);
    g->scores = gguf_get_arr(g->f, "tokenizer.ggml.scores", GGUF_FLOAT32);
    if (gguf_get(g->f, "tokenizer.ggml.scores") && (!g->scores || g->scores->v.arr.n != n))
        return err_set(g->err, "%s: tokenizer.ggml.scores: must be a float32 array of %llu entries", src,
                       (unsigned long long)n);
    if (tok_alloc_vocab(g->t, (int32_t)n, g->err)) return -1;
    for (uint64_t i = 0; i < n; i++) {
        GGUFStr s = g->tokens->v.arr.items[i].v.str;
        if (set_piece(g, (int32_t)i, s.ptr, s.len)) return -1;
    }
    return tok_build_vocab_map(g->t, g->err);
}

static int token_type(const GLoad *g, int32_t id) {
    return g->types ? (int)g->types->v.arr.items[id].v.i : TT_NORMAL;
}

/* ---- merges ---------------------------------------------------------------------- */

static int load_file_merges(GLoad *g) {
    uint64_t n = g->merges->v.arr.n;
    if (n > (uint64_t)INT32_MAX) return err_set(g->err, "%s: tokenizer.ggml.merges: too many merges", g->f->path);
    if (mergemap_init(&g->t->merges, n)) return err_set(g->err, "%s: out of memory for merges", g->f->path);
    for (uint64_t i = 0; i < n; i++) {
        GGUFStr s = g->merges->v.arr.items[i].v.str;
        const char *sp = memchr(s.ptr, ' ', s.len);
        if (!sp || sp == s.ptr || sp + 1 == s.ptr + s.len || memchr(sp + 1, ' ', s.len - (size_t)(sp + 1 - s.ptr)))
            return err_set(g->err, "%s: tokenizer.ggml.merges[%llu]: '%.*s' is not two tokens separated by one space",
                           g->f->path, (unsigned long long)i, s.len > 40 ? 40 : (int)s.len, s.ptr);
        size_t al = (size_t)(sp - s.ptr);
        if (tok_add_merge(g->t, s.ptr, al, sp + 1, s.len - al - 1, (int32_t)i, "tokenizer.ggml.merges", i, g->err))
            return -1;
    }
    return 0;
}

typedef struct {
    double score;
    int32_t len_l, len_r, token, l, r;
} MergeCand;

static int cand_cmp(const void *pa, const void *pb) {
    const MergeCand *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->len_l != b->len_l) return a->len_l > b->len_l ? -1 : 1;
    if (a->len_r != b->len_r) return a->len_r > b->len_r ? -1 : 1;
    return a->token < b->token ? -1 : a->token > b->token;
}

static int push_cand(MergeCand **v, size_t *n, size_t *cap, MergeCand c) {
    if (*n == *cap) {
        MergeCand *p = array_grow(*v, cap, *n + 1, sizeof *p);
        if (!p) return -1;
        *v = p;
    }
    (*v)[(*n)++] = c;
    return 0;
}

/* Every split of token id at a character boundary into two tokens. */
static int token_splits(const GLoad *g, int32_t id, MergeCand **v, size_t *n, size_t *cap) {
    const Tokenizer *t = g->t;
    const char *s = t->piece[id];
    size_t len = t->piece_len[id];
    int32_t total = 0;
    for (size_t i = 0; i < len; i++) total += ((uint8_t)s[i] & 0xC0) != 0x80;
    double score = g->gemma ? -(double)id : g->scores->v.arr.items[id].v.f;
    int32_t left = 0;
    for (size_t i = 1; i < len; i++) {
        if (((uint8_t)s[i] & 0xC0) == 0x80) continue;
        left++;
        int32_t l = tok_vocab_get(t, s, i), r = l >= 0 ? tok_vocab_get(t, s + i, len - i) : -1;
        if (r >= 0 && push_cand(v, n, cap, (MergeCand){score, left, total - left, id, l, r})) return -1;
    }
    return 0;
}

static int build_spm_merges(GLoad *g) {
    Tokenizer *t = g->t;
    if (!g->gemma && !g->scores)
        return err_set(g->err, "%s: tokenizer.ggml.scores: missing (a SentencePiece vocabulary without merges needs "
                               "scores)", g->f->path);
    MergeCand *v = NULL;
    size_t n = 0, cap = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        /* Of equal pieces only the one the vocabulary maps to counts. */
        if (tok_vocab_get(t, t->piece[id], t->piece_len[id]) != id) continue;
        if (token_splits(g, id, &v, &n, &cap)) {
            free(v);
            return err_set(g->err, "%s: out of memory building merges", g->f->path);
        }
    }
    if (n) qsort(v, n, sizeof *v, cand_cmp); /* v is NULL when no token splits in two */
    int rc = mergemap_init(&t->merges, n);
    for (size_t i = 0; i < n && !rc; i++) mergemap_put(&t->merges, v[i].l, v[i].r, (int32_t)i, v[i].token);
    free(v);
    return rc ? err_set(g->err, "%s: out of memory building merges", g->f->path) : 0;
}

/* ---- special ids, added tokens, pipeline ---------------------------------------------------- */

/* Reads an optional token id key; out of range is an error except for the
 * padding id, which cllm never uses. */
static int read_id(GLoad *g, const char *key, int32_t *out) {
    *out = -1;
    const GGUFValue *v = gguf_get(g->f, key);
    if (!v) return 0;
    uint64_t u;
    if (gguf_get_u64(g->f, key, &u)) return err_set(g->err, "%s: %s: must be a token id", g->f->path, key);
    if (u >= (uint64_t)g->t->n_vocab) {
        if (strstr(key, "padding")) return 0;
        return err_set(g->err, "%s: %s: %llu is out of range (%d tokens)", g->f->path, key, (unsigned long long)u,
                       g->t->n_vocab);
    }
    *out = (int32_t)u;
    return 0;
}

static int add_special(GLoad *g, int32_t id) {
    Tokenizer *t = g->t;
    GGUFStr s = g->tokens->v.arr.items[id].v.str;
    return tok_add_added(t, id, s.ptr, s.len, true, false, false, false, false, g->err);
}

/* Control tokens are special; user-defined ones plain added tokens; the
 * bos/eos/unk/pad tokens are special whatever their type (transformers makes
 * them its special tokens). */
static int load_added(GLoad *g, const int32_t *named, size_t n_named) {
    Tokenizer *t = g->t;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        GGUFStr s = g->tokens->v.arr.items[id].v.str;
        if (token_type(g, id) == TT_CONTROL && (!g->byte_level || all_in_byte_alphabet(s.ptr, s.len)) &&
            add_special(g, id))
            return -1;
    }
    for (size_t i = 0; i < n_named; i++)
        if (named[i] >= 0 && add_special(g, named[i])) return -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        GGUFStr s = g->tokens->v.arr.items[id].v.str;
        if (token_type(g, id) != TT_USER_DEFINED || s.len == 0) continue;
        /* Added only when its text, as written, is a token. */
        int32_t as_piece = tok_vocab_get(t, s.ptr, s.len);
        if (as_piece < 0) {
            bool is_added = false;
            for (size_t k = 0; k < t->n_added && !is_added; k++)
                is_added = t->added[k].len == s.len && !memcmp(t->added[k].text, s.ptr, s.len);
            if (!is_added) continue;
        }
        if (tok_add_added(t, as_piece >= 0 ? as_piece : id, s.ptr, s.len, false, false, false, false, false, g->err))
            return -1;
    }
    return 0;
}

static int pre_byte_level(GLoad *g, GGUFStr pre) {
    Tokenizer *t = g->t;
    PreStep bl = {.kind = PRE_BYTELEVEL, .use_regex = true, .rx = RX_GPT2};
    PreStep split = {.kind = PRE_SPLIT_REGEX, .behavior = SPLIT_ISOLATED};
#define PRE_IS(name) (pre.len == strlen(name) && !memcmp(pre.ptr, name, pre.len))
    if (PRE_IS("gpt2") || PRE_IS("gpt-2")) return tok_push_pre(t, bl, g->err); /* llama.cpp writes "gpt-2" */
    if (PRE_IS("smollm")) {
        PreStep digits = {.kind = PRE_DIGITS, .individual_digits = true};
        return tok_push_pre(t, digits, g->err) || tok_push_pre(t, bl, g->err) ? -1 : 0;
    }
    bl.use_regex = false;
    if (PRE_IS("llama-bpe") || PRE_IS("llama3") || PRE_IS("llama-v3")) {
        split.rx = RX_LLAMA3;
        t->ignore_merges = true;
        return tok_push_pre(t, split, g->err) || tok_push_pre(t, bl, g->err) ? -1 : 0;
    }
    if (PRE_IS("qwen2") || PRE_IS("deepseek-r1-qwen")) {
        split.rx = RX_QWEN2;
        NormStep nfc = {.kind = NORM_NFC};
        return tok_push_norm(t, nfc, g->err) || tok_push_pre(t, split, g->err) || tok_push_pre(t, bl, g->err) ? -1
                                                                                                            : 0;
    }
#undef PRE_IS
    return err_set(g->err, "%s: tokenizer.ggml.pre: '%.*s' is not supported (supported: gpt-2, smollm, llama-bpe, "
                           "llama3, qwen2)", g->f->path, pre.len > 40 ? 40 : (int)pre.len, pre.ptr);
}

static int pipeline_byte_level(GLoad *g) {
    GGUFStr pre = {"gpt2", 4};
    if (gguf_get(g->f, "tokenizer.ggml.pre") && gguf_get_str(g->f, "tokenizer.ggml.pre", &pre))
        return err_set(g->err, "%s: tokenizer.ggml.pre: must be a string", g->f->path);
    g->t->byte_level = g->t->dec_byte_level = true;
    return pre_byte_level(g, pre);
}

static int pipeline_spm(GLoad *g, bool add_space_prefix) {
    Tokenizer *t = g->t;
    t->byte_fallback = t->fuse_unk = t->dec_byte_fallback = true;
    t->dec_replace = (char *)"\xE2\x96\x81";
    if (g->gemma) { /* GemmaTokenizer: Replace(" ", "▁"), no prefix */
        NormStep rep = {NORM_REPLACE, (char *)" ", (char *)"\xE2\x96\x81", 1, 3};
        PreStep split = {.kind = PRE_SPLIT_STRING, .str = (char *)" ", .str_len = 1,
                         .behavior = SPLIT_MERGED_PREV};
        return tok_push_norm(t, rep, g->err) || tok_push_pre(t, split, g->err) ? -1 : 0;
    }
    /* LlamaTokenizer: Metaspace, a prefix on the first piece, stripped again by decode. */
    PreStep ms = {.kind = PRE_METASPACE, .str = (char *)"\xE2\x96\x81", .str_len = 3,
                  .prepend = add_space_prefix ? PREPEND_FIRST : PREPEND_NEVER};
    t->dec_strip_first = add_space_prefix ? 1 : 0;
    return tok_push_pre(t, ms, g->err);
}

static bool arch_is_gemma(const GGUFFile *f) {
    GGUFStr a;
    if (gguf_get_str(f, "general.architecture", &a)) return false;
    return a.len >= 5 && !memcmp(a.ptr, "gemma", 5);
}

static int read_flag(GLoad *g, const char *key, bool *out) {
    if (gguf_get(g->f, key) && gguf_get_bool(g->f, key, out))
        return err_set(g->err, "%s: %s: must be a bool", g->f->path, key);
    return 0;
}

static int load_ids_and_flags(GLoad *g) {
    Tokenizer *t = g->t;
    int32_t unk, pad, eot, eom;
    if (read_id(g, "tokenizer.ggml.bos_token_id", &t->bos) || read_id(g, "tokenizer.ggml.eos_token_id", &t->eos) ||
        read_id(g, "tokenizer.ggml.unknown_token_id", &unk) ||
        read_id(g, "tokenizer.ggml.padding_token_id", &pad) || read_id(g, "tokenizer.ggml.eot_token_id", &eot) ||
        read_id(g, "tokenizer.ggml.eom_token_id", &eom))
        return -1;
    t->add_bos = !g->byte_level; /* SentencePiece files without the flag get BOS (llama.cpp, transformers) */
    if (read_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) return -1;
    if (tok_add_eog(t, t->eos) || tok_add_eog(t, eot) || tok_add_eog(t, eom))
        return err_set(g->err, "%s: out of memory", g->f->path);
    /* Only GemmaTokenizer gives its BPE model an unk token; GPT2Tokenizer and
     * LlamaTokenizer drop a character that has no token (byte-level vocabs
     * can lack bytes that never occur in UTF-8 text, e.g. 0xF5..0xFF). */
    t->unk = g->gemma ? unk : -1;
    int32_t named[4] = {t->bos, t->eos, unk, pad};
    return load_added(g, named, 4);
}

static int load_chat_template(GLoad *g) {
    GGUFStr s;
    if (!gguf_get(g->f, "tokenizer.chat_template")) return 0;
    if (gguf_get_str(g->f, "tokenizer.chat_template", &s))
        return err_set(g->err, "%s: tokenizer.chat_template: must be a string", g->f->path);
    g->t->chat_template = tok_strdup(g->t, s.ptr, s.len);
    return g->t->chat_template ? 0 : err_set(g->err, "%s: out of memory", g->f->path);
}

static int load_all(GLoad *g) {
    GGUFStr model;
    if (gguf_get_str(g->f, "tokenizer.ggml.model", &model))
        return err_set(g->err, "%s: tokenizer.ggml.model: %s", g->f->path,
                       gguf_get(g->f, "tokenizer.ggml.model") ? "must be a string" : "missing (the file has no tokenizer)");
    if (model.len == 4 && !memcmp(model.ptr, "gpt2", 4)) g->byte_level = true;
    else if (model.len == 5 && !memcmp(model.ptr, "llama", 5)) g->gemma = arch_is_gemma(g->f);
    else
        return err_set(g->err, "%s: tokenizer.ggml.model: '%.*s' is not supported (supported: gpt2, llama)",
                       g->f->path, model.len > 40 ? 40 : (int)model.len, model.ptr);
    if (load_vocab(g)) return -1;
    g->merges = gguf_get_arr(g->f, "tokenizer.ggml.merges", GGUF_STRING);
    if (gguf_get(g->f, "tokenizer.ggml.merges") && !g->merges)
        return err_set(g->err, "%s: tokenizer.ggml.merges: must be an array of strings", g->f->path);
    if (g->byte_level && !g->merges)
        return err_set(g->err, "%s: tokenizer.ggml.merges: missing (a gpt2 tokenizer needs its merges)", g->f->path);
    if (g->merges ? load_file_merges(g) : build_spm_merges(g)) return -1;
    bool add_space_prefix = true;
    if (read_flag(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix)) return -1;
    if (g->byte_level ? pipeline_byte_level(g) : pipeline_spm(g, add_space_prefix)) return -1;
    if (load_ids_and_flags(g) || load_chat_template(g)) return -1;
    return tok_finish(g->t, g->err);
}

int tokenizer_load_gguf(Tokenizer **out, const GGUFFile *f, Err *err) {
    *out = NULL;
    Tokenizer *t = tok_new(f->path ? f->path : "(gguf)");
    if (!t) return err_set(err, "%s: out of memory", f->path ? f->path : "(gguf)");
    GLoad g = {.f = f, .t = t, .err = err};
    if (load_all(&g)) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
