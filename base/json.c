/* json.c — a strict RFC 8259 reader for untrusted input, and a small writer
 * (see json.h).
 *
 * Recursive descent with a depth limit. Values, keys, unescaped strings and
 * object hash indexes live in one arena of large chunks owned by the document,
 * so parsing a multi-MB tokenizer.json makes a handful of allocations and
 * json_free releases everything at once. Members of the container being
 * parsed wait on one stack shared by all nesting levels (no allocation per
 * array or object); when the container closes they are copied to the arena.
 *
 * Objects with more than INDEX_MIN members get a hash index built at parse
 * time, so lookups in a 150k-member vocab are O(1) and a parsed document is
 * never written again (safe to read from several threads). The hash is
 * seeded per document so a hostile file cannot pick keys that all collide.
 *
 * Numbers: integers are converted here; anything else goes to strtod_l with
 * a "C" locale, so a process that called setlocale() still reads "0.5".
 */
#include "base/json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/utf8.h"

#define INDEX_MIN 16               /* objects with more members are hashed */
#define CHUNK_MIN ((size_t)1 << 10)
#define CHUNK_MAX ((size_t)1 << 20)

typedef struct Chunk { struct Chunk *next; size_t used, cap; _Alignas(16) char data[]; } Chunk;

struct Json {
    Chunk *chunks;
    size_t chunk_bytes;            /* size of the next chunk: grows to CHUNK_MAX */
    uint64_t seed;                 /* hash seed of this document's indexes */
    JsonValue root;
};

/* Hash index of a large object: open addressing, slot = member index + 1. */
typedef struct { uint64_t seed; size_t mask; uint32_t slots[]; } ObjIndex;

/* Members of the open containers, innermost last (keys unused for arrays). */
typedef struct { JsonValue *vals; const char **keys; size_t *klens; size_t n, cap; } Stack;

typedef struct {
    const char *s;
    size_t len, pos;
    const char *source;
    Json *doc;
    Err *err;
    int depth;
    Stack stack;
    locale_t c_locale;             /* created on the first non-integer number */
} Parser;

/* ---------- arena ---------- */

/* Chunks start small (a JSON Lines prompt is a few hundred bytes) and
 * double up to CHUNK_MAX, so a big document costs a few large chunks. */
static void *arena_alloc(Json *d, size_t n, size_t align) {
    Chunk *c = d->chunks;
    size_t at = c ? (c->used + align - 1) & ~(align - 1) : 0;
    if (c && at <= c->cap && c->cap - at >= n) {
        c->used = at + n;
        return c->data + at;
    }
    size_t cap = n > d->chunk_bytes ? n : d->chunk_bytes;
    if (cap > SIZE_MAX - sizeof *c) return NULL;
    Chunk *nc = malloc(sizeof *nc + cap);
    if (!nc) return NULL;
    nc->cap = cap;
    nc->used = n;
    if (d->chunk_bytes < CHUNK_MAX) d->chunk_bytes *= 2;
    /* A request bigger than a chunk gets a chunk of its own, linked behind
     * the current one so the current one's free space stays usable. */
    if (c && n > d->chunk_bytes) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        d->chunks = nc;
    }
    return nc->data;
}

/* ---------- errors ---------- */

static int parse_fail_at(Parser *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int parse_fail_at(Parser *p, size_t pos, const char *fmt, ...) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < p->len; i++) {
        if (p->s[i] == '\n') { line++; col = 1; } else col++;
    }
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return err_set(p->err, "%s: offset %zu (line %zu, column %zu): %s", p->source, pos, line, col, what);
}

#define parse_fail(p, ...) parse_fail_at((p), (p)->pos, __VA_ARGS__)

/* ---------- hashing ---------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    return x ^ (x >> 32);
}

static uint64_t hash_key(uint64_t seed, const char *s, size_t n) {
    uint64_t h = mix64(seed ^ (n * 0x9e3779b97f4a7c15ull)), w;
    for (; n >= 8; s += 8, n -= 8) {
        memcpy(&w, s, 8);
        h = mix64(h ^ w);
    }
    w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w);
}

/* A seed nobody outside this process can predict: ASLR'd addresses and the
 * clock. Lookups give the same answers whatever the seed. */
static uint64_t doc_seed(const Json *doc) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return mix64((uint64_t)(uintptr_t)doc ^ (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec);
}

static bool key_eq(const JsonValue *obj, size_t i, const char *key, size_t klen) {
    return obj->u.object.key_lens[i] == klen && !memcmp(obj->u.object.keys[i], key, klen);
}

/* Builds the index of an object in the arena. A duplicate key's slot ends on
 * its last occurrence: the last member wins, as in Python. */
static int object_build_index(Json *doc, JsonValue *obj) {
    size_t n = obj->u.object.n, cap = 32;
    if (n >= UINT32_MAX / 4) return 0; /* slots are 32-bit; stay linear */
    while (cap < n * 2) cap *= 2;
    ObjIndex *ix = arena_alloc(doc, sizeof *ix + cap * sizeof(uint32_t), 8);
    if (!ix) return -1;
    ix->seed = doc->seed;
    ix->mask = cap - 1;
    memset(ix->slots, 0, cap * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        const char *k = obj->u.object.keys[i];
        size_t kl = obj->u.object.key_lens[i];
        for (size_t h = hash_key(ix->seed, k, kl) & ix->mask;; h = (h + 1) & ix->mask) {
            uint32_t s = ix->slots[h];
            if (!s || key_eq(obj, s - 1, k, kl)) { ix->slots[h] = (uint32_t)i + 1; break; }
        }
    }
    obj->u.object.index = ix;
    return 0;
}

/* ---------- strings ---------- */

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Length of a valid UTF-8 sequence at s (at most n bytes), or 0: overlong
 * forms, surrogates and code points past U+10FFFF are invalid. */
static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    uint32_t cp;
    int k = utf8_next(s, n, &cp);
    return k > 0 ? (size_t)k : 0;
}

/* Decodes the \uXXXX escape (pair) whose 'u' is at p->pos - 1. */
static int parse_u_escape(Parser *p, size_t end, uint32_t *cp) {
    uint32_t lo;
    size_t at = p->pos - 2; /* the backslash, for messages */
    if (p->pos + 4 > end || hex4(p->s + p->pos, cp)) return parse_fail_at(p, at, "bad \\u escape (4 hex digits expected)");
    p->pos += 4;
    if (*cp >= 0xDC00 && *cp <= 0xDFFF) return parse_fail_at(p, at, "lone low surrogate \\u%04X", (unsigned)*cp);
    if (*cp < 0xD800 || *cp > 0xDBFF) return 0;
    if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' || hex4(p->s + p->pos + 2, &lo) ||
        lo < 0xDC00 || lo > 0xDFFF)
        return parse_fail_at(p, at, "high surrogate \\u%04X not followed by a low surrogate", (unsigned)*cp);
    p->pos += 6;
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    return 0;
}

static char escape_char(char e) {
    switch (e) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return 0;
    }
}

/* Parses the string whose opening quote is at p->pos into the arena. The
 * first pass finds the closing quote, so the output (never longer than the
 * raw text) is allocated once. */
static int parse_string(Parser *p, const char **out, size_t *out_len) {
    size_t open = p->pos, start = p->pos + 1, end = start;
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return parse_fail_at(p, p->len, "unterminated string (opened at offset %zu)", open);
    char *o = arena_alloc(p->doc, end - start + 1, 1), *w = o;
    if (!o) return parse_fail(p, "out of memory");
    p->pos = start;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return parse_fail(p, "control character 0x%02x in string (must be escaped)", c);
        if (c >= 0x80) {
            size_t n = utf8_valid_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!n) return parse_fail(p, "invalid UTF-8 byte 0x%02x in string", c);
            memcpy(w, p->s + p->pos, n);
            w += n;
            p->pos += n;
            continue;
        }
        p->pos++;
        if (c != '\\') { *w++ = (char)c; continue; }
        char e = p->s[p->pos++]; /* inside [start, end): the scan skipped it */
        if (e == 'u') {
            uint32_t cp;
            if (parse_u_escape(p, end, &cp)) return -1;
            w += utf8_put(cp, w);
        } else if ((*w = escape_char(e)) != 0) {
            w++;
        } else {
            return parse_fail_at(p, p->pos - 2, "invalid escape '\\%c' in string", e >= 0x20 && e < 0x7f ? e : '?');
        }
    }
    *w = 0;
    *out = o;
    *out_len = (size_t)(w - o);
    p->pos = end + 1;
    return 0;
}

/* ---------- numbers ---------- */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Integer text (optional '-', digits) that fits int64: exact, no libc. */
static bool int_fits(const char *s, size_t n, int64_t *out) {
    bool neg = s[0] == '-';
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (size_t i = neg; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (limit - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v; /* 0 - v wraps to INT64_MIN for 2^63: defined for unsigned */
    return true;
}

/* Full conversion through strtod_l in the "C" locale (correctly rounded;
 * overflow gives ±inf and underflow a subnormal or ±0, as Python does). */
static int number_strtod(Parser *p, const char *s, size_t n, double *out) {
    if (!p->c_locale && !(p->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0)))
        return parse_fail(p, "cannot create the C locale");
    char buf[128];
    char *tmp = n < sizeof buf ? buf : malloc(n + 1);
    if (!tmp) return parse_fail(p, "out of memory");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out = strtod_l(tmp, NULL, p->c_locale);
    if (tmp != buf) free(tmp);
    return 0;
}

/* Checks the RFC 8259 number grammar at p->pos and converts it. */
static int parse_number(Parser *p, JsonValue *v) {
    const char *s = p->s;
    size_t i = p->pos, n = p->len;
    bool is_int = true;
    if (i < n && s[i] == '-') i++;
    if (i >= n || !is_digit(s[i])) return parse_fail_at(p, i, "digit expected in number");
    if (s[i] == '0' && i + 1 < n && is_digit(s[i + 1])) return parse_fail_at(p, i, "leading zero in number");
    while (i < n && is_digit(s[i])) i++;
    if (i < n && s[i] == '.') {
        is_int = false;
        if (++i >= n || !is_digit(s[i])) return parse_fail_at(p, i, "digit expected after '.'");
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        is_int = false;
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return parse_fail_at(p, i, "digit expected in exponent");
        while (i < n && is_digit(s[i])) i++;
    }
    v->type = JSON_NUMBER;
    int64_t iv;
    if (is_int && int_fits(s + p->pos, i - p->pos, &iv)) {
        v->u.number.is_int = true;
        v->u.number.i = iv;
        v->u.number.num = iv == 0 && s[p->pos] == '-' ? -0.0 : (double)iv;
    } else if (number_strtod(p, s + p->pos, i - p->pos, &v->u.number.num)) {
        return -1;
    }
    p->pos = i;
    return 0;
}

/* ---------- values ---------- */

static int parse_value(Parser *p, JsonValue *v);

static int stack_push(Stack *st, const JsonValue *v, const char *key, size_t klen) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 32;
        JsonValue *vals = realloc(st->vals, cap * sizeof *vals);
        if (vals) st->vals = vals;
        const char **keys = realloc(st->keys, cap * sizeof *keys);
        if (keys) st->keys = keys;
        size_t *klens = realloc(st->klens, cap * sizeof *klens);
        if (klens) st->klens = klens;
        if (!vals || !keys || !klens) return -1;
        st->cap = cap;
    }
    st->vals[st->n] = *v;
    st->keys[st->n] = key;
    st->klens[st->n++] = klen;
    return 0;
}

/* Moves the members above `base` on the stack into the arena as v's items. */
static int container_close(Parser *p, JsonValue *v, bool object, size_t base) {
    Stack *st = &p->stack;
    size_t n = st->n - base;
    JsonValue *vals = n ? arena_alloc(p->doc, n * sizeof *vals, 8) : NULL;
    if (n && !vals) return parse_fail(p, "out of memory");
    if (n) memcpy(vals, st->vals + base, n * sizeof *vals);
    st->n = base;
    if (!object) {
        v->type = JSON_ARRAY;
        v->u.array.items = vals;
        v->u.array.n = n;
        return 0;
    }
    const char **keys = n ? arena_alloc(p->doc, n * sizeof *keys, 8) : NULL;
    size_t *klens = n ? arena_alloc(p->doc, n * sizeof *klens, 8) : NULL;
    if (n && (!keys || !klens)) return parse_fail(p, "out of memory");
    if (n) {
        memcpy(keys, st->keys + base, n * sizeof *keys);
        memcpy(klens, st->klens + base, n * sizeof *klens);
    }
    v->type = JSON_OBJECT;
    v->u.object.keys = keys;
    v->u.object.key_lens = klens;
    v->u.object.values = vals;
    v->u.object.n = n;
    v->u.object.index = NULL;
    if (n > INDEX_MIN && object_build_index(p->doc, v)) return parse_fail(p, "out of memory");
    return 0;
}

static void skip_ws(Parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* One member, pushed on the stack: `"key": value` in an object, `value` in an array. */
static int parse_member(Parser *p, bool object) {
    const char *key = NULL;
    size_t klen = 0;
    skip_ws(p);
    if (object) {
        if (p->pos >= p->len || p->s[p->pos] != '"') return parse_fail(p, "expected a string key in object");
        if (parse_string(p, &key, &klen)) return -1;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') return parse_fail(p, "expected ':' after key");
        p->pos++;
    }
    JsonValue v;
    if (parse_value(p, &v)) return -1;
    if (stack_push(&p->stack, &v, key, klen)) return parse_fail(p, "out of memory");
    return 0;
}

static int parse_container(Parser *p, JsonValue *v, bool object) {
    char close = object ? '}' : ']';
    if (++p->depth > JSON_MAX_DEPTH) return parse_fail(p, "nesting deeper than %d levels", JSON_MAX_DEPTH);
    size_t base = p->stack.n;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            if (parse_member(p, object)) return -1;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
            if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; break; }
            return parse_fail(p, object ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
        }
    }
    p->depth--;
    return container_close(p, v, object, base);
}

static int parse_literal(Parser *p, const char *word, JsonValue *v, JsonType t, bool b) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return parse_fail(p, "invalid literal (expected '%s')", word);
    p->pos += n;
    v->type = t;
    v->u.boolean = b;
    return 0;
}

static int parse_value(Parser *p, JsonValue *v) {
    skip_ws(p);
    memset(v, 0, sizeof *v);
    if (p->pos >= p->len) return parse_fail(p, "unexpected end of input (a value was expected)");
    unsigned char c = (unsigned char)p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, v, true);
    case '[': return parse_container(p, v, false);
    case '"': v->type = JSON_STRING; return parse_string(p, &v->u.string.s, &v->u.string.len);
    case 't': return parse_literal(p, "true", v, JSON_BOOL, true);
    case 'f': return parse_literal(p, "false", v, JSON_BOOL, false);
    case 'n': return parse_literal(p, "null", v, JSON_NULL, false);
    default:
        if (c == '-' || is_digit((char)c)) return parse_number(p, v);
        if (c > 0x20 && c < 0x7f) return parse_fail(p, "unexpected character '%c' (a value was expected)", c);
        return parse_fail(p, "unexpected byte 0x%02x (a value was expected)", c);
    }
}

/* ---------- documents ---------- */

void json_free(Json *doc) {
    if (!doc) return;
    for (Chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc);
}

Json *json_parse(const char *text, size_t len, const char *source, Err *err) {
    source = source ? source : "JSON";
    Json *doc = calloc(1, sizeof *doc);
    if (!doc) { err_set(err, "%s: out of memory", source); return NULL; }
    doc->seed = doc_seed(doc);
    /* The tree is about as big as the text (strings) plus a JsonValue per value. */
    doc->chunk_bytes = CHUNK_MIN;
    while (doc->chunk_bytes < CHUNK_MAX && doc->chunk_bytes < len) doc->chunk_bytes *= 2;
    Parser p = {.s = text, .len = len, .source = source, .doc = doc, .err = err};
    int rc = parse_value(&p, &doc->root);
    if (rc == 0) {
        skip_ws(&p);
        if (p.pos != len) rc = parse_fail(&p, "unexpected text after the JSON value");
    }
    free(p.stack.vals);
    free(p.stack.keys);
    free(p.stack.klens);
    if (p.c_locale) freelocale(p.c_locale);
    if (rc) { json_free(doc); return NULL; }
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

/* ---------- lookups ---------- */

void json_describe(const JsonValue *v, char *out, size_t n) {
    switch (v->type) {
    case JSON_NULL: snprintf(out, n, "null"); break;
    case JSON_BOOL: snprintf(out, n, "%s", v->u.boolean ? "true" : "false"); break;
    case JSON_NUMBER: snprintf(out, n, "%.10g", v->u.number.num); break;
    case JSON_STRING: snprintf(out, n, "'%.40s%s'", v->u.string.s, v->u.string.len > 40 ? "..." : ""); break;
    case JSON_ARRAY: snprintf(out, n, "an array"); break;
    case JSON_OBJECT: snprintf(out, n, "an object"); break;
    }
}

const JsonValue *json_member(const JsonValue *obj, const char *key) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

bool json_as_int64(const JsonValue *v, int64_t *out) {
    if (v->type != JSON_NUMBER) return false;
    if (v->u.number.is_int) { *out = v->u.number.i; return true; }
    double d = v->u.number.num;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) return false;
    *out = (int64_t)d;
    return true;
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    size_t klen = strlen(key);
    const ObjIndex *ix = obj->u.object.index;
    if (ix) {
        for (size_t h = hash_key(ix->seed, key, klen) & ix->mask;; h = (h + 1) & ix->mask) {
            uint32_t s = ix->slots[h];
            if (!s) return NULL;
            if (key_eq(obj, s - 1, key, klen)) return &obj->u.object.values[s - 1];
        }
    }
    for (size_t i = obj->u.object.n; i-- > 0;) /* from the end: the last duplicate wins */
        if (key_eq(obj, i, key, klen)) return &obj->u.object.values[i];
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

/* Quotes and backslashes are escaped, control characters (and DEL) become
 * \n-style or \u00XX escapes, valid UTF-8 is kept as is, and each byte that
 * is not part of valid UTF-8 becomes \ufffd, so the output always parses. */
int jsonbuf_put_string(JsonBuf *b, const char *s, size_t len) {
    if (len > SIZE_MAX / 8 || textbuf_reserve(b, len * 6 + 2)) return -1;
    char *w = b->data + b->len;
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
        else if (c < 0x20 || c == 0x7f) {
            static const char hex[] = "0123456789abcdef";
            memcpy(w, "\\u00", 4);
            w[4] = hex[c >> 4];
            w[5] = hex[c & 15];
            w += 6;
        }
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = 0;
    b->len = (size_t)(w - b->data);
    return 0;
}

int jsonbuf_printf(JsonBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || textbuf_reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void jsonbuf_free(JsonBuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}
