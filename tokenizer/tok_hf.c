/* tok_hf.c — builds a Tokenizer from a Hugging Face tokenizer.json (+
 * tokenizer_config.json). Only the components that the supported families
 * use are accepted; anything else is an error naming the file and the field,
 * never a tokenizer that would give other ids than HF:
 *   model           BPE (vocab, merges as "a b" or ["a", "b"], unk_token,
 *                   byte_fallback, fuse_unk, ignore_merges)
 *   normalizer      NFC, Replace (string pattern), Prepend, Sequence
 *   pre_tokenizer   ByteLevel (last), Digits, Split (a string, or one of the
 *                   GPT-2 / Llama 3 / Qwen 2 regexes), Metaspace, Sequence
 *   post_processor  TemplateProcessing, ByteLevel, Sequence
 *   decoder         ByteLevel, ByteFallback, Fuse, Replace (-> " "), Strip
 *                   (leading), Metaspace, Sequence
 * The normalizer and pre-tokenizer steps together may make a text at most
 * TOK_MAX_GROWTH (64) times longer, counted in the worst case (tok_finish).
 * tokenizer_config.json gives bos_token, eos_token, add_bos_token and
 * chat_template (else chat_template.jinja beside it is read).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "tokenizer/tok_internal.h"

#define MAX_VOCAB (1 << 24)
#define MAX_TEMPLATE (4 << 20)

typedef struct {
    Tokenizer *t;
    const char *src; /* the file being read, for messages */
    Err *err;
    bool has_template;
} HLoad;

static int fail(HLoad *h, const char *field, const char *fmt, const char *arg) {
    char what[512];
    snprintf(what, sizeof what, fmt, arg);
    return err_set(h->err, "%s: %s: %s", h->src, field, what);
}

static const char *type_of(const JsonValue *v) {
    static const char *const names[] = {"null", "a bool", "a number", "a string", "an array", "an object"};
    return v ? names[v->type] : "missing";
}

/* A member that must be present with this type. */
static const JsonValue *need(HLoad *h, const JsonValue *obj, const char *key, JsonType type, const char *field) {
    static const char *const want[] = {"null", "a bool", "a number", "a string", "an array", "an object"};
    const JsonValue *v = json_get(obj, key);
    if (!v) {
        fail(h, field, "missing%s", "");
        return NULL;
    }
    if (v->type != type) {
        char msg[64];
        snprintf(msg, sizeof msg, "must be %s, not %%s", want[type]);
        fail(h, field, msg, type_of(v));
        return NULL;
    }
    return v;
}

/* An optional bool (absent or null: def). */
static int opt_bool(HLoad *h, const JsonValue *obj, const char *key, bool def, const char *field, bool *out) {
    const JsonValue *v = json_get(obj, key);
    *out = def;
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) return fail(h, field, "must be a bool, not %s", type_of(v));
    *out = v->u.boolean;
    return 0;
}

/* An optional string: NULL when absent or null. */
static int opt_str(HLoad *h, const JsonValue *obj, const char *key, const char *field, const JsonValue **out) {
    const JsonValue *v = json_get(obj, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_STRING) return fail(h, field, "must be a string, not %s", type_of(v));
    *out = v;
    return 0;
}

static bool str_is(const JsonValue *v, const char *s) {
    return v && v->type == JSON_STRING && v->u.string.len == strlen(s) && !memcmp(v->u.string.s, s, v->u.string.len);
}

static int read_id(HLoad *h, const JsonValue *v, const char *field, int32_t *out) {
    *out = -1;
    if (!v || v->type != JSON_NUMBER || !v->u.number.is_int || v->u.number.i < 0 || v->u.number.i >= MAX_VOCAB)
        return fail(h, field, "must be a token id (an integer from 0 to 16777215)%s", "");
    *out = (int32_t)v->u.number.i;
    return 0;
}

/* ---- model ------------------------------------------------------------------ */

static int count_ids(HLoad *h, const JsonValue *vocab, const JsonValue *added, int32_t *n) {
    char field[96];
    *n = 0;
    for (size_t i = 0; i < vocab->u.object.n; i++) {
        int32_t id;
        snprintf(field, sizeof field, "model.vocab[\"%.40s\"]", vocab->u.object.keys[i]);
        if (read_id(h, &vocab->u.object.values[i], field, &id)) return -1;
        if (id + 1 > *n) *n = id + 1;
    }
    for (size_t i = 0; added && i < added->u.array.n; i++) {
        int32_t id;
        snprintf(field, sizeof field, "added_tokens[%zu].id", i);
        if (read_id(h, json_get(&added->u.array.items[i], "id"), field, &id)) return -1;
        if (id + 1 > *n) *n = id + 1;
    }
    if (*n == 0) return fail(h, "model.vocab", "is empty%s", "");
    /* Ids are dense in real files; a few sparse ids must not cost gigabytes. */
    size_t entries = vocab->u.object.n + (added ? added->u.array.n : 0);
    if ((size_t)*n > entries + 65536)
        return err_set(h->err, "%s: model.vocab: ids go up to %d for only %zu tokens (too sparse)", h->src, *n - 1,
                       entries);
    return 0;
}

static int load_vocab(HLoad *h, const JsonValue *vocab) {
    Tokenizer *t = h->t;
    for (size_t i = 0; i < vocab->u.object.n; i++) {
        int32_t id = (int32_t)vocab->u.object.values[i].u.number.i;
        if (t->piece[id])
            return err_set(h->err, "%s: model.vocab[\"%.40s\"]: id %d is also the id of \"%.40s\"", h->src,
                           vocab->u.object.keys[i], id, t->piece[id]);
        t->piece[id] = tok_strdup(t, vocab->u.object.keys[i], vocab->u.object.key_lens[i]);
        if (!t->piece[id]) return fail(h, "model.vocab", "out of memory%s", "");
        t->piece_len[id] = (uint32_t)vocab->u.object.key_lens[i];
        t->in_model[id] = true;
    }
    return 0;
}

static int load_merges(HLoad *h, const JsonValue *merges) {
    Tokenizer *t = h->t;
    size_t n = merges ? merges->u.array.n : 0;
    if (mergemap_init(&t->merges, n)) return fail(h, "model.merges", "out of memory%s", "");
    for (size_t i = 0; i < n; i++) {
        const JsonValue *m = &merges->u.array.items[i];
        char field[64];
        snprintf(field, sizeof field, "model.merges[%zu]", i);
        const char *a, *b;
        size_t al, bl;
        if (m->type == JSON_STRING) {
            a = m->u.string.s;
            const char *sp = memchr(a, ' ', m->u.string.len);
            if (!sp || memchr(sp + 1, ' ', m->u.string.len - (size_t)(sp + 1 - a)))
                return fail(h, field, "'%.40s' is not two tokens separated by one space", a);
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = m->u.string.len - al - 1;
        } else if (m->type == JSON_ARRAY && m->u.array.n == 2 && m->u.array.items[0].type == JSON_STRING &&
                   m->u.array.items[1].type == JSON_STRING) {
            a = m->u.array.items[0].u.string.s;
            al = m->u.array.items[0].u.string.len;
            b = m->u.array.items[1].u.string.s;
            bl = m->u.array.items[1].u.string.len;
        } else return fail(h, field, "must be \"a b\" or [\"a\", \"b\"], not %s", type_of(m));
        if (tok_add_merge(t, a, al, b, bl, (int32_t)i, "model.merges", i, h->err)) return -1;
    }
    return 0;
}

/* Options of the BPE model that change ids and that cllm does not do. */
static int check_model_options(HLoad *h, const JsonValue *model) {
    const JsonValue *v = json_get(model, "dropout");
    if (v && v->type != JSON_NULL && !(v->type == JSON_NUMBER && v->u.number.num == 0.0))
        return fail(h, "model.dropout", "BPE dropout is not supported%s", "");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const JsonValue *s;
        char field[64];
        snprintf(field, sizeof field, "model.%s", affixes[i]);
        if (opt_str(h, model, affixes[i], field, &s)) return -1;
        if (s && s->u.string.len) return fail(h, field, "'%.40s' is not supported (only empty)", s->u.string.s);
    }
    return 0;
}

static int load_model(HLoad *h, const JsonValue *root) {
    Tokenizer *t = h->t;
    const JsonValue *model = need(h, root, "model", JSON_OBJECT, "model");
    if (!model) return -1;
    const JsonValue *type = json_get(model, "type");
    if (type && !str_is(type, "BPE"))
        return fail(h, "model.type", "'%s' is not supported (supported: BPE)",
                    type->type == JSON_STRING ? type->u.string.s : type_of(type));
    const JsonValue *vocab = need(h, model, "vocab", JSON_OBJECT, "model.vocab");
    if (!vocab) return -1;
    const JsonValue *merges = json_get(model, "merges"), *added = json_get(root, "added_tokens");
    if (merges && merges->type != JSON_ARRAY) return fail(h, "model.merges", "must be an array, not %s", type_of(merges));
    if (added && added->type == JSON_NULL) added = NULL;
    if (added && added->type != JSON_ARRAY)
        return fail(h, "added_tokens", "must be an array, not %s", type_of(added));
    int32_t n;
    if (check_model_options(h, model) || count_ids(h, vocab, added, &n) || tok_alloc_vocab(t, n, h->err) ||
        load_vocab(h, vocab) || tok_build_vocab_map(t, h->err) || load_merges(h, merges))
        return -1;
    const JsonValue *unk;
    if (opt_str(h, model, "unk_token", "model.unk_token", &unk)) return -1;
    if (unk && (t->unk = tok_vocab_get(t, unk->u.string.s, unk->u.string.len)) < 0)
        return fail(h, "model.unk_token", "'%.40s' is not in model.vocab", unk->u.string.s);
    if (opt_bool(h, model, "byte_fallback", false, "model.byte_fallback", &t->byte_fallback) ||
        opt_bool(h, model, "fuse_unk", false, "model.fuse_unk", &t->fuse_unk) ||
        opt_bool(h, model, "ignore_merges", false, "model.ignore_merges", &t->ignore_merges))
        return -1;
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------ */

static int load_added_one(HLoad *h, const JsonValue *a, size_t i) {
    Tokenizer *t = h->t;
    char field[64];
    snprintf(field, sizeof field, "added_tokens[%zu]", i);
    if (a->type != JSON_OBJECT) return fail(h, field, "must be an object, not %s", type_of(a));
    snprintf(field, sizeof field, "added_tokens[%zu].content", i);
    const JsonValue *c = need(h, a, "content", JSON_STRING, field);
    if (!c) return -1;
    if (c->u.string.len == 0) return fail(h, field, "is empty%s", "");
    int32_t id = (int32_t)json_get(a, "id")->u.number.i; /* checked by count_ids */
    if (t->in_model[id] &&
        (t->piece_len[id] != c->u.string.len || memcmp(t->piece[id], c->u.string.s, c->u.string.len)))
        return fail(h, field, "'%.40s' has the id of a different token in model.vocab", c->u.string.s);
    if (!t->in_model[id]) {
        if (!(t->piece[id] = tok_strdup(t, c->u.string.s, c->u.string.len))) return fail(h, field, "out of memory%s", "");
        t->piece_len[id] = (uint32_t)c->u.string.len;
    }
    bool special, normalized, lstrip, rstrip, single_word;
    snprintf(field, sizeof field, "added_tokens[%zu]", i);
    if (opt_bool(h, a, "special", false, field, &special) ||
        opt_bool(h, a, "normalized", !special, field, &normalized) ||
        opt_bool(h, a, "lstrip", false, field, &lstrip) || opt_bool(h, a, "rstrip", false, field, &rstrip) ||
        opt_bool(h, a, "single_word", false, field, &single_word))
        return -1;
    return tok_add_added(t, id, c->u.string.s, c->u.string.len, special, normalized, lstrip, rstrip, single_word,
                         h->err);
}

static int load_added(HLoad *h, const JsonValue *root) {
    const JsonValue *added = json_get(root, "added_tokens");
    for (size_t i = 0; added && added->type == JSON_ARRAY && i < added->u.array.n; i++)
        if (load_added_one(h, &added->u.array.items[i], i)) return -1;
    return 0;
}

/* ---- components: {"type": ..., ...} objects, possibly nested in Sequences ---- */

typedef int (*ParseFn)(HLoad *h, const JsonValue *v, const char *field);

/* The "type" of a component; 1 when the component is absent or null. */
static int component_type(HLoad *h, const JsonValue *v, const char *field, const JsonValue **type) {
    if (!v || v->type == JSON_NULL) return 1;
    if (v->type != JSON_OBJECT) return fail(h, field, "must be an object, not %s", type_of(v));
    char f[160];
    snprintf(f, sizeof f, "%s.type", field);
    *type = need(h, v, "type", JSON_STRING, f);
    return *type ? 0 : -1;
}

/* A Sequence: each item of v[key] through fn. */
static int parse_list(HLoad *h, const JsonValue *v, const char *field, const char *key, ParseFn fn) {
    char f[160];
    snprintf(f, sizeof f, "%s.%s", field, key);
    const JsonValue *list = need(h, v, key, JSON_ARRAY, f);
    if (!list) return -1;
    for (size_t i = 0; i < list->u.array.n; i++) {
        snprintf(f, sizeof f, "%.100s.%s[%zu]", field, key, i);
        if (fn(h, &list->u.array.items[i], f)) return -1;
    }
    return 0;
}

static int unsupported(HLoad *h, const char *field, const JsonValue *type, const char *supported) {
    char f[160];
    snprintf(f, sizeof f, "%s.type", field);
    return err_set(h->err, "%s: %s: '%.60s' is not supported (supported: %s)", h->src, f, type->u.string.s, supported);
}

/* ---- normalizer ---------------------------------------------------------------------- */

/* The literal of a {"String": s} pattern; a {"Regex": ...} is an error. */
static const JsonValue *string_pattern(HLoad *h, const JsonValue *obj, const char *field) {
    char f[160];
    snprintf(f, sizeof f, "%s.pattern", field);
    const JsonValue *p = need(h, obj, "pattern", JSON_OBJECT, f);
    if (!p) return NULL;
    const JsonValue *s = json_get(p, "String");
    if (s && s->type == JSON_STRING) return s;
    fail(h, f, "only a {\"String\": ...} pattern is supported here%s", "");
    return NULL;
}

static int parse_normalizer(HLoad *h, const JsonValue *v, const char *field) {
    Tokenizer *t = h->t;
    const JsonValue *type;
    int rc = component_type(h, v, field, &type);
    if (rc) return rc < 0 ? -1 : 0;
    char f[160];
    if (str_is(type, "NFC")) return tok_push_norm(t, (NormStep){.kind = NORM_NFC}, h->err);
    if (str_is(type, "Replace")) {
        const JsonValue *p = string_pattern(h, v, field), *c;
        snprintf(f, sizeof f, "%s.content", field);
        if (!p || !(c = need(h, v, "content", JSON_STRING, f))) return -1;
        /* HF inserts content between every character for ""; cllm does not. */
        if (p->u.string.len == 0) return fail(h, field, "a Replace of the empty string is not supported%s", "");
        NormStep st = {NORM_REPLACE, tok_strdup(t, p->u.string.s, p->u.string.len),
                       tok_strdup(t, c->u.string.s, c->u.string.len), p->u.string.len, c->u.string.len};
        if (!st.from || !st.to) return fail(h, field, "out of memory%s", "");
        return tok_push_norm(t, st, h->err);
    }
    if (str_is(type, "Prepend")) {
        snprintf(f, sizeof f, "%s.prepend", field);
        const JsonValue *c = need(h, v, "prepend", JSON_STRING, f);
        if (!c) return -1;
        NormStep st = {NORM_PREPEND, NULL, tok_strdup(t, c->u.string.s, c->u.string.len), 0, c->u.string.len};
        if (!st.to) return fail(h, field, "out of memory%s", "");
        return tok_push_norm(t, st, h->err);
    }
    if (str_is(type, "Sequence")) return parse_list(h, v, field, "normalizers", parse_normalizer);
    return unsupported(h, field, type, "NFC, Replace, Prepend, Sequence");
}

/* ---- pre-tokenizer --------------------------------------------------------------------- */

static int parse_behavior(HLoad *h, const JsonValue *v, const char *field, SplitBehavior *out) {
    static const struct { const char *name; SplitBehavior b; } names[] = {
        {"Isolated", SPLIT_ISOLATED}, {"Removed", SPLIT_REMOVED}, {"MergedWithPrevious", SPLIT_MERGED_PREV},
        {"MergedWithNext", SPLIT_MERGED_NEXT}, {"Contiguous", SPLIT_CONTIGUOUS}};
    char f[160];
    snprintf(f, sizeof f, "%s.behavior", field);
    const JsonValue *b = need(h, v, "behavior", JSON_STRING, f);
    if (!b) return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (str_is(b, names[i].name)) {
            *out = names[i].b;
            return 0;
        }
    return fail(h, f, "'%s' is not a split behavior", b->u.string.s);
}

static int parse_split(HLoad *h, const JsonValue *v, const char *field) {
    Tokenizer *t = h->t;
    PreStep st = {.kind = PRE_SPLIT_STRING};
    bool invert;
    char f[160];
    if (parse_behavior(h, v, field, &st.behavior) || opt_bool(h, v, "invert", false, field, &invert)) return -1;
    if (invert) return fail(h, field, "invert: true is not supported%s", "");
    snprintf(f, sizeof f, "%s.pattern", field);
    const JsonValue *p = need(h, v, "pattern", JSON_OBJECT, f);
    if (!p) return -1;
    const JsonValue *s = json_get(p, "String"), *r = json_get(p, "Regex");
    if (s && s->type == JSON_STRING) {
        st.str = tok_strdup(t, s->u.string.s, s->u.string.len);
        st.str_len = s->u.string.len;
        if (!st.str) return fail(h, field, "out of memory%s", "");
        return tok_push_pre(t, st, h->err);
    }
    if (!r || r->type != JSON_STRING) return fail(h, f, "must hold a String or a Regex%s", "");
    int k = pretok_regex_from_pattern(r->u.string.s, r->u.string.len);
    if (k < 0)
        return fail(h, f, "Regex '%.80s' is not one cllm implements (the GPT-2, Llama 3 and Qwen 2 ones)",
                    r->u.string.s);
    st.kind = PRE_SPLIT_REGEX;
    st.rx = (RegexKind)k;
    return tok_push_pre(t, st, h->err);
}

/* Metaspace's prepend_scheme, or the older add_prefix_space flag. */
static int parse_prepend(HLoad *h, const JsonValue *v, const char *field, int *out) {
    const JsonValue *s = json_get(v, "prepend_scheme");
    bool add;
    *out = PREPEND_ALWAYS;
    if (s && s->type != JSON_NULL) {
        if (str_is(s, "always")) *out = PREPEND_ALWAYS;
        else if (str_is(s, "first")) *out = PREPEND_FIRST;
        else if (str_is(s, "never")) *out = PREPEND_NEVER;
        else return fail(h, field, "prepend_scheme must be always, first or never%s", "");
        return 0;
    }
    if (opt_bool(h, v, "add_prefix_space", true, field, &add)) return -1;
    *out = add ? PREPEND_ALWAYS : PREPEND_NEVER;
    return 0;
}

static int parse_metaspace(HLoad *h, const JsonValue *v, const char *field, PreStep *st) {
    char f[160];
    snprintf(f, sizeof f, "%s.replacement", field);
    const JsonValue *r = need(h, v, "replacement", JSON_STRING, f);
    if (!r) return -1;
    if (r->u.string.len == 0) return fail(h, f, "is empty%s", "");
    *st = (PreStep){.kind = PRE_METASPACE, .str = tok_strdup(h->t, r->u.string.s, r->u.string.len),
                    .str_len = r->u.string.len};
    if (!st->str) return fail(h, field, "out of memory%s", "");
    if (parse_prepend(h, v, field, &st->prepend) || opt_bool(h, v, "split", true, field, &st->split)) return -1;
    return 0;
}

static int parse_pre(HLoad *h, const JsonValue *v, const char *field) {
    Tokenizer *t = h->t;
    const JsonValue *type;
    int rc = component_type(h, v, field, &type);
    if (rc) return rc < 0 ? -1 : 0;
    if (str_is(type, "ByteLevel")) {
        PreStep st = {.kind = PRE_BYTELEVEL, .rx = RX_GPT2, .behavior = SPLIT_ISOLATED};
        if (opt_bool(h, v, "add_prefix_space", true, field, &st.add_prefix_space) ||
            opt_bool(h, v, "use_regex", true, field, &st.use_regex))
            return -1;
        t->byte_level = true;
        return tok_push_pre(t, st, h->err);
    }
    if (str_is(type, "Digits")) {
        PreStep st = {.kind = PRE_DIGITS};
        if (opt_bool(h, v, "individual_digits", false, field, &st.individual_digits)) return -1;
        return tok_push_pre(t, st, h->err);
    }
    if (str_is(type, "Split")) return parse_split(h, v, field);
    if (str_is(type, "Metaspace")) {
        PreStep st;
        return parse_metaspace(h, v, field, &st) || tok_push_pre(t, st, h->err) ? -1 : 0;
    }
    if (str_is(type, "Sequence")) return parse_list(h, v, field, "pretokenizers", parse_pre);
    return unsupported(h, field, type, "ByteLevel, Digits, Split, Metaspace, Sequence");
}

/* ByteLevel maps bytes to characters; a step after it would see those. */
static int check_pre_order(HLoad *h) {
    for (size_t i = 0; i + 1 < h->t->n_pre; i++)
        if (h->t->pre[i].kind == PRE_BYTELEVEL)
            return fail(h, "pre_tokenizer", "a step after ByteLevel is not supported%s", "");
    return 0;
}

/* ---- post-processor ------------------------------------------------------------------------ */

/* Appends the ids of the special token named by item {"SpecialToken": {"id": name}}. */
static int template_ids(HLoad *h, const JsonValue *specials, const JsonValue *name, const char *field, int32_t **v,
                        size_t *n) {
    const JsonValue *sp = name ? json_get(specials, name->u.string.s) : NULL, *ids = json_get(sp, "ids");
    if (!ids || ids->type != JSON_ARRAY)
        return fail(h, field, "special token '%.40s' is not in special_tokens", name ? name->u.string.s : "?");
    for (size_t i = 0; i < ids->u.array.n; i++) {
        int32_t id;
        if (read_id(h, &ids->u.array.items[i], field, &id)) return -1;
        if (id >= h->t->n_vocab) return fail(h, field, "a special token id is out of range%s", "");
        int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
        if (!p) return fail(h, field, "out of memory%s", "");
        *v = p;
        (*v)[(*n)++] = id;
    }
    return 0;
}

static int parse_template(HLoad *h, const JsonValue *v, const char *field) {
    Tokenizer *t = h->t;
    char f[160];
    snprintf(f, sizeof f, "%s.single", field);
    const JsonValue *single = need(h, v, "single", JSON_ARRAY, f), *specials = json_get(v, "special_tokens");
    if (!single) return -1;
    bool after = false;
    for (size_t i = 0; i < single->u.array.n; i++) {
        const JsonValue *it = &single->u.array.items[i], *sp = json_get(it, "SpecialToken");
        snprintf(f, sizeof f, "%.100s.single[%zu]", field, i);
        if (json_get(it, "Sequence")) {
            after = true;
            continue;
        }
        if (!sp) return fail(h, f, "must be a SpecialToken or a Sequence%s", "");
        const JsonValue *name = json_get(sp, "id");
        if (!name || name->type != JSON_STRING) return fail(h, f, "SpecialToken.id must be a string%s", "");
        if (after ? template_ids(h, specials, name, f, &t->suffix_seq, &t->n_suffix_seq)
                  : template_ids(h, specials, name, f, &t->bos_seq, &t->n_bos_seq))
            return -1;
    }
    return 0;
}

static int parse_post(HLoad *h, const JsonValue *v, const char *field) {
    const JsonValue *type;
    int rc = component_type(h, v, field, &type);
    if (rc) return rc < 0 ? -1 : 0;
    if (str_is(type, "ByteLevel")) return 0; /* offsets only */
    if (str_is(type, "TemplateProcessing")) return parse_template(h, v, field);
    if (str_is(type, "Sequence")) return parse_list(h, v, field, "processors", parse_post);
    return unsupported(h, field, type, "TemplateProcessing, ByteLevel, Sequence");
}

/* ---- decoder ------------------------------------------------------------------------------------- */

static int parse_decoder_strip(HLoad *h, const JsonValue *v, const char *field) {
    const JsonValue *c = json_get(v, "content"), *start = json_get(v, "start"), *stop = json_get(v, "stop");
    if (!str_is(c, " ") || !start || start->type != JSON_NUMBER || !start->u.number.is_int || start->u.number.i < 0 ||
        start->u.number.i > 8 || (stop && !(stop->type == JSON_NUMBER && stop->u.number.num == 0)))
        return fail(h, field, "only Strip of up to 8 leading spaces is supported%s", "");
    h->t->dec_strip_first = (int)start->u.number.i;
    return 0;
}

static int parse_decoder(HLoad *h, const JsonValue *v, const char *field) {
    Tokenizer *t = h->t;
    const JsonValue *type;
    int rc = component_type(h, v, field, &type);
    if (rc) return rc < 0 ? -1 : 0;
    if (str_is(type, "ByteLevel")) t->dec_byte_level = true;
    else if (str_is(type, "ByteFallback")) t->dec_byte_fallback = true;
    else if (str_is(type, "Fuse")) return 0;
    else if (str_is(type, "Strip")) return parse_decoder_strip(h, v, field);
    else if (str_is(type, "Replace")) {
        const JsonValue *p = string_pattern(h, v, field);
        if (!p) return -1;
        if (!str_is(json_get(v, "content"), " ") || p->u.string.len == 0)
            return fail(h, field, "only Replace of a string with \" \" is supported%s", "");
        t->dec_replace = tok_strdup(t, p->u.string.s, p->u.string.len);
    } else if (str_is(type, "Metaspace")) {
        PreStep st;
        if (parse_metaspace(h, v, field, &st)) return -1;
        t->dec_replace = st.str;
        t->dec_strip_first = st.prepend != PREPEND_NEVER;
    } else if (str_is(type, "Sequence")) return parse_list(h, v, field, "decoders", parse_decoder);
    else return unsupported(h, field, type, "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence");
    return 0;
}

/* ---- tokenizer_config.json --------------------------------------------------------------------------- */

/* A special token named by a string or by {"content": string}; -1 if null. */
static int config_token(HLoad *h, const JsonValue *cfg, const char *key, int32_t *out) {
    const JsonValue *v = json_get(cfg, key);
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_STRING) return fail(h, key, "must be a token string, not %s", type_of(v));
    int32_t id = tokenizer_find_token(h->t, v->u.string.s);
    if (id < 0) return fail(h, key, "'%.40s' is not a token of the tokenizer", v->u.string.s);
    *out = id;
    return 0;
}

static int config_template(HLoad *h, const JsonValue *cfg) {
    const JsonValue *v = json_get(cfg, "chat_template"), *pick = NULL;
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type == JSON_STRING) pick = v;
    else if (v->type == JSON_ARRAY) {
        for (size_t i = 0; i < v->u.array.n; i++) {
            const JsonValue *it = &v->u.array.items[i], *tmpl = json_get(it, "template");
            if (tmpl && tmpl->type == JSON_STRING && (!pick || str_is(json_get(it, "name"), "default"))) pick = tmpl;
        }
    }
    if (!pick) return fail(h, "chat_template", "must be a string or a list of {name, template}%s", "");
    h->t->chat_template = tok_strdup(h->t, pick->u.string.s, pick->u.string.len);
    h->has_template = true;
    return h->t->chat_template ? 0 : fail(h, "chat_template", "out of memory%s", "");
}

static int load_config(HLoad *h, const char *path) {
    Tokenizer *t = h->t;
    Json *doc = json_parse_file(path, h->err);
    if (!doc) return -1;
    const char *saved = h->src;
    h->src = path;
    const JsonValue *cfg = json_root(doc);
    int rc = -1;
    bool add_bos = t->n_bos_seq > 0;
    if (!cfg || cfg->type != JSON_OBJECT) fail(h, "(root)", "must be an object%s", "");
    else if (!config_token(h, cfg, "bos_token", &t->bos) && !config_token(h, cfg, "eos_token", &t->eos) &&
             !opt_bool(h, cfg, "add_bos_token", add_bos, "add_bos_token", &t->add_bos) && !config_template(h, cfg))
        rc = 0;
    h->src = saved;
    json_free(doc);
    return rc;
}

/* transformers 5 saves the template as chat_template.jinja beside the JSON files. */
static int load_template_file(HLoad *h, const char *beside) {
    char path[4096];
    const char *slash = strrchr(beside, '/');
    int dir_len = slash ? (int)(slash - beside) : 1;
    snprintf(path, sizeof path, "%.*s/chat_template.jinja", dir_len, slash ? beside : ".");
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    TextBuf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, fp)) > 0 && b.len <= MAX_TEMPLATE)
        if (textbuf_append(&b, chunk, n)) break;
    fclose(fp);
    if (b.len > MAX_TEMPLATE) {
        textbuf_free(&b);
        return err_set(h->err, "%s: larger than %d bytes", path, MAX_TEMPLATE);
    }
    h->t->chat_template = tok_strdup(h->t, b.data ? b.data : "", b.len);
    textbuf_free(&b);
    return h->t->chat_template ? 0 : err_set(h->err, "%s: out of memory", path);
}

/* ---- the whole file ---------------------------------------------------------------------------------- */

static int load_all(HLoad *h, const JsonValue *root, const char *config_json) {
    Tokenizer *t = h->t;
    if (!root || root->type != JSON_OBJECT) return fail(h, "(root)", "must be an object%s", "");
    if (load_model(h, root) || load_added(h, root) || parse_normalizer(h, json_get(root, "normalizer"), "normalizer") ||
        parse_pre(h, json_get(root, "pre_tokenizer"), "pre_tokenizer") || check_pre_order(h) ||
        parse_post(h, json_get(root, "post_processor"), "post_processor") ||
        parse_decoder(h, json_get(root, "decoder"), "decoder"))
        return -1;
    t->add_bos = t->n_bos_seq > 0;
    if (t->n_bos_seq) t->bos = t->bos_seq[0];
    if (config_json && load_config(h, config_json)) return -1;
    if (!h->has_template && load_template_file(h, config_json ? config_json : h->src)) return -1;
    return tok_finish(t, h->err);
}

int tokenizer_load_hf(Tokenizer **out, const char *tokenizer_json, const char *config_json, Err *err) {
    *out = NULL;
    Json *doc = json_parse_file(tokenizer_json, err);
    if (!doc) return -1;
    Tokenizer *t = tok_new(tokenizer_json);
    if (!t) {
        json_free(doc);
        return err_set(err, "%s: out of memory", tokenizer_json);
    }
    HLoad h = {.t = t, .src = tokenizer_json, .err = err};
    int rc = load_all(&h, json_root(doc), config_json);
    json_free(doc);
    if (rc) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
