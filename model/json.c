/* json.c — a strict JSON reader for untrusted input (see json.h).
 *
 * Recursive descent with a depth limit. Values, keys and unescaped strings
 * live in one arena of large chunks owned by the document, so parsing a
 * multi-MB tokenizer.json makes few allocations and json_free releases
 * everything at once. Objects with many members get a hash index (built
 * lazily on the first lookup) so vocab lookups are O(1).
 */
#include "model/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Chunk { struct Chunk *next; size_t used, cap; char data[]; } Chunk;

struct Json {
    Chunk *chunks;
    JsonValue root;
};

typedef struct {
    const char *s;
    size_t len, pos;
    const char *source;
    Json *doc;
    Err *err;
    int depth;
} Parser;

typedef struct { uint32_t *slots; size_t cap; } ObjIndex; /* slot = member index + 1, 0 = empty */

static void *arena_alloc(Json *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Chunk *c = d->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (1 << 20) ? n : (1 << 20);
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = d->chunks;
        d->chunks = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

static int parse_fail(Parser *p, const char *what) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') { line++; col = 1; } else col++;
    }
    return err_set(p->err, "%s: offset %zu (line %zu, column %zu): %s", p->source, p->pos, line, col, what);
}

static void skip_ws(Parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Length of a valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Parses a string at p->pos (on the opening quote). */
static int parse_string(Parser *p, const char **out, size_t *out_len) {
    size_t start = ++p->pos, end = start;
    bool plain = true;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\') { plain = false; end++; }
        end++;
    }
    if (end >= p->len) { p->pos = p->len; return parse_fail(p, "unterminated string"); }
    char *o = arena_alloc(p->doc, end - start + 1), *w = o;
    if (!o) return parse_fail(p, "out of memory");
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return parse_fail(p, "control character in string (must be escaped)");
        if (c >= 0x80) {
            size_t n = utf8_valid_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!n) return parse_fail(p, "invalid UTF-8 in string");
            memcpy(w, p->s + p->pos, n);
            w += n;
            p->pos += n;
            continue;
        }
        if (c != '\\' || plain) { *w++ = (char)c; p->pos++; continue; }
        char e = p->s[++p->pos];
        p->pos++;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (p->pos + 4 > end || hex4(p->s + p->pos, &cp)) return parse_fail(p, "bad \\u escape");
            p->pos += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return parse_fail(p, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                    hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return parse_fail(p, "high surrogate not followed by a low surrogate");
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            w += utf8_put(w, cp);
            break;
        }
        default: p->pos -= 2; return parse_fail(p, "invalid escape in string");
        }
    }
    *w = 0;
    *out = o;
    *out_len = (size_t)(w - o);
    p->pos = end + 1;
    return 0;
}

static int parse_number(Parser *p, JsonValue *v) {
    size_t i = p->pos;
    const char *s = p->s;
    bool is_int = true;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return parse_fail(p, "invalid number");
    if (s[i] == '0' && i + 1 < p->len && s[i + 1] >= '0' && s[i + 1] <= '9') return parse_fail(p, "leading zero in number");
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    if (i < p->len && s[i] == '.') {
        is_int = false;
        i++;
        if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return parse_fail(p, "digit expected after '.'");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        is_int = false;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) return parse_fail(p, "digit expected in exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    char buf[512];
    size_t n = i - p->pos;
    char *tmp = n < sizeof buf ? buf : malloc(n + 1);
    if (!tmp) return parse_fail(p, "out of memory");
    memcpy(tmp, s + p->pos, n);
    tmp[n] = 0;
    v->type = JSON_NUMBER;
    v->u.number.num = strtod(tmp, NULL); /* the grammar above admits only C-locale-safe text */
    v->u.number.is_int = false;
    if (is_int) {
        errno = 0;
        long long iv = strtoll(tmp, NULL, 10);
        if (errno == 0) { v->u.number.is_int = true; v->u.number.i = iv; }
    }
    if (tmp != buf) free(tmp);
    p->pos = i;
    return 0;
}

static int parse_value(Parser *p, JsonValue *v);

/* Growable temporary list while an array/object is parsed; copied to the arena at the end. */
typedef struct { JsonValue *vals; const char **keys; size_t *klens; size_t n, cap; } Items;

static int items_push(Items *it, bool with_key) {
    if (it->n < it->cap) return 0;
    size_t cap = it->cap ? it->cap * 2 : 8;
    JsonValue *v = realloc(it->vals, cap * sizeof *v);
    if (!v) return -1;
    it->vals = v;
    if (with_key) {
        const char **k = realloc(it->keys, cap * sizeof *k);
        if (!k) return -1;
        it->keys = k;
        size_t *kl = realloc(it->klens, cap * sizeof *kl);
        if (!kl) return -1;
        it->klens = kl;
    }
    it->cap = cap;
    return 0;
}

static void items_free(Items *it) { free(it->vals); free(it->keys); free(it->klens); }

static int parse_container(Parser *p, JsonValue *v, bool object) {
    char close = object ? '}' : ']';
    if (++p->depth > JSON_MAX_DEPTH) return parse_fail(p, "nesting deeper than the limit");
    p->pos++;
    Items it = {0};
    skip_ws(p);
    int rc = 0;
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            skip_ws(p);
            if (items_push(&it, object)) { rc = parse_fail(p, "out of memory"); break; }
            if (object) {
                if (p->pos >= p->len || p->s[p->pos] != '"') { rc = parse_fail(p, "expected a string key in object"); break; }
                if ((rc = parse_string(p, &it.keys[it.n], &it.klens[it.n]))) break;
                skip_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') { rc = parse_fail(p, "expected ':' after key"); break; }
                p->pos++;
            }
            if ((rc = parse_value(p, &it.vals[it.n]))) break;
            it.n++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
            if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; break; }
            rc = parse_fail(p, object ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
            break;
        }
    }
    if (rc == 0) {
        JsonValue *vals = it.n ? arena_alloc(p->doc, it.n * sizeof *vals) : NULL;
        if (it.n && !vals) rc = parse_fail(p, "out of memory");
        else if (it.n) memcpy(vals, it.vals, it.n * sizeof *vals);
        if (rc == 0 && object) {
            const char **keys = it.n ? arena_alloc(p->doc, it.n * sizeof *keys) : NULL;
            size_t *klens = it.n ? arena_alloc(p->doc, it.n * sizeof *klens) : NULL;
            if (it.n && (!keys || !klens)) rc = parse_fail(p, "out of memory");
            else if (it.n) { memcpy(keys, it.keys, it.n * sizeof *keys); memcpy(klens, it.klens, it.n * sizeof *klens); }
            v->type = JSON_OBJECT;
            v->u.object.keys = keys;
            v->u.object.key_lens = klens;
            v->u.object.values = vals;
            v->u.object.n = it.n;
            v->u.object.index = NULL;
        } else if (rc == 0) {
            v->type = JSON_ARRAY;
            v->u.array.items = vals;
            v->u.array.n = it.n;
        }
    }
    items_free(&it);
    p->depth--;
    return rc;
}

static int parse_literal(Parser *p, const char *word, JsonValue *v, JsonType t, bool b) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return parse_fail(p, "unexpected character");
    p->pos += n;
    v->type = t;
    v->u.boolean = b;
    return 0;
}

static int parse_value(Parser *p, JsonValue *v) {
    skip_ws(p);
    memset(v, 0, sizeof *v);
    if (p->pos >= p->len) return parse_fail(p, "unexpected end of input");
    switch (p->s[p->pos]) {
    case '{': return parse_container(p, v, true);
    case '[': return parse_container(p, v, false);
    case '"': v->type = JSON_STRING; return parse_string(p, &v->u.string.s, &v->u.string.len);
    case 't': return parse_literal(p, "true", v, JSON_BOOL, true);
    case 'f': return parse_literal(p, "false", v, JSON_BOOL, false);
    case 'n': return parse_literal(p, "null", v, JSON_NULL, false);
    default: return parse_number(p, v);
    }
}

static void free_indexes(JsonValue *v);

void json_free(Json *doc) {
    if (!doc) return;
    free_indexes(&doc->root); /* object indexes live outside the arena */
    for (Chunk *c = doc->chunks, *next; c; c = next) { next = c->next; free(c); }
    free(doc);
}

static void free_indexes(JsonValue *v) {
    if (v->type == JSON_ARRAY)
        for (size_t i = 0; i < v->u.array.n; i++) free_indexes(&v->u.array.items[i]);
    if (v->type == JSON_OBJECT) {
        ObjIndex *ix = v->u.object.index;
        if (ix) { free(ix->slots); free(ix); v->u.object.index = NULL; }
        for (size_t i = 0; i < v->u.object.n; i++) free_indexes(&v->u.object.values[i]);
    }
}

Json *json_parse(const char *text, size_t len, const char *source, Err *err) {
    Json *doc = calloc(1, sizeof *doc);
    if (!doc) { err_set(err, "%s: out of memory", source); return NULL; }
    Parser p = {text, len, 0, source ? source : "JSON", doc, err, 0};
    if (parse_value(&p, &doc->root)) { json_free(doc); return NULL; }
    skip_ws(&p);
    if (p.pos != len) { parse_fail(&p, "unexpected text after the JSON value"); json_free(doc); return NULL; }
    return doc;
}

Json *json_parse_file(const char *path, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { err_set(err, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[1 << 16];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n > cap) {
            cap = (len + n) * 2;
            char *b = realloc(buf, cap);
            if (!b) { free(buf); fclose(f); err_set(err, "%s: out of memory", path); return NULL; }
            buf = b;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); err_set(err, "%s: read error", path); return NULL; }
    Json *doc = json_parse(buf ? buf : "", len, path, err);
    free(buf);
    return doc;
}

const JsonValue *json_root(const Json *doc) { return doc ? &doc->root : NULL; }

static uint64_t hash_key(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* Builds the hash index of a large object (once; later members win, as in
 * Python, so the index keeps the last index of a duplicate key). */
static ObjIndex *object_index(const JsonValue *obj) {
    ObjIndex *ix = obj->u.object.index;
    if (ix) return ix;
    ix = malloc(sizeof *ix);
    size_t cap = 16;
    while (cap < obj->u.object.n * 2) cap *= 2;
    if (!ix || !(ix->slots = calloc(cap, sizeof *ix->slots))) { free(ix); return NULL; }
    ix->cap = cap;
    for (size_t i = 0; i < obj->u.object.n; i++) {
        size_t h = hash_key(obj->u.object.keys[i], obj->u.object.key_lens[i]) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            uint32_t s = ix->slots[h];
            if (!s) { ix->slots[h] = (uint32_t)i + 1; break; }
            if (obj->u.object.key_lens[s - 1] == obj->u.object.key_lens[i] &&
                !memcmp(obj->u.object.keys[s - 1], obj->u.object.keys[i], obj->u.object.key_lens[i])) {
                ix->slots[h] = (uint32_t)i + 1;
                break;
            }
        }
    }
    ((JsonValue *)obj)->u.object.index = ix; /* a cache: logically const */
    return ix;
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t klen = strlen(key), n = obj->u.object.n;
    if (n > 16) {
        ObjIndex *ix = object_index(obj);
        if (ix) {
            for (size_t h = hash_key(key, klen) & (ix->cap - 1);; h = (h + 1) & (ix->cap - 1)) {
                uint32_t s = ix->slots[h];
                if (!s) return NULL;
                if (obj->u.object.key_lens[s - 1] == klen && !memcmp(obj->u.object.keys[s - 1], key, klen))
                    return &obj->u.object.values[s - 1];
            }
        }
    }
    for (size_t i = n; i-- > 0;)
        if (obj->u.object.key_lens[i] == klen && !memcmp(obj->u.object.keys[i], key, klen))
            return &obj->u.object.values[i];
    return NULL;
}

const JsonValue *json_at(const JsonValue *arr, size_t i) {
    return arr && arr->type == JSON_ARRAY && i < arr->u.array.n ? &arr->u.array.items[i] : NULL;
}

size_t json_len(const JsonValue *v) {
    if (!v) return 0;
    return v->type == JSON_ARRAY ? v->u.array.n : v->type == JSON_OBJECT ? v->u.object.n : 0;
}

double json_get_num(const JsonValue *obj, const char *key, double def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->u.number.num : def;
}

int64_t json_get_int(const JsonValue *obj, const char *key, int64_t def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER && v->u.number.is_int ? v->u.number.i : def;
}

bool json_get_bool(const JsonValue *obj, const char *key, bool def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_BOOL ? v->u.boolean : def;
}

const char *json_get_str(const JsonValue *obj, const char *key, const char *def) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->u.string.s : def;
}

/* ---------- writing ---------- */

static int jsonbuf_reserve(JsonBuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->buf, cap);
    if (!p) return -1;
    b->buf = p;
    b->cap = cap;
    return 0;
}

int jsonbuf_put_string(JsonBuf *b, const char *s, size_t len) {
    if (jsonbuf_reserve(b, len * 6 + 2)) return -1;
    char *w = b->buf + b->len;
    *w++ = '"';
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t n = utf8_valid_len((const unsigned char *)s + i, len - i);
            if (n) { memcpy(w, s + i, n); w += n; i += n; }
            else { memcpy(w, "\\ufffd", 6); w += 6; i++; }
            continue;
        }
        i++;
        if (c == '"' || c == '\\') { *w++ = '\\'; *w++ = (char)c; }
        else if (c == '\n') { *w++ = '\\'; *w++ = 'n'; }
        else if (c == '\r') { *w++ = '\\'; *w++ = 'r'; }
        else if (c == '\t') { *w++ = '\\'; *w++ = 't'; }
        else if (c < 0x20 || c == 0x7f) w += sprintf(w, "\\u%04x", c);
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = 0;
    b->len = (size_t)(w - b->buf);
    return 0;
}

int jsonbuf_printf(JsonBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || jsonbuf_reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void jsonbuf_free(JsonBuf *b) {
    free(b->buf);
    memset(b, 0, sizeof *b);
}
