/* prompts.c — the streaming prompt-file reader of `cllm generate` (see
 * prompts.h): a line reader over zlib (plain, .gz and stdin alike), format
 * detection, one parser per format, per-line errors, duplicate ids; plus the
 * id set, UTF-8 and raw-JSON helpers that results.c shares.
 */
#include "app/prompts.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/utf8.h"

/* ------------------------------------------------------------------ id set */

typedef struct {
    char *key; /* NULL: empty slot */
    uint64_t hash;
    int64_t value;
} IdSlot;

struct IdSet {
    IdSlot *slots;
    size_t cap, n; /* cap is a power of two, kept at most half full */
};

static uint64_t id_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

IdSet *id_set_new(void) {
    IdSet *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cap = 64;
    s->slots = calloc(s->cap, sizeof *s->slots);
    if (!s->slots) { free(s); return NULL; }
    return s;
}

static IdSlot *id_set_find(const IdSet *s, const char *id, uint64_t h) {
    size_t i = h & (s->cap - 1);
    while (s->slots[i].key && (s->slots[i].hash != h || strcmp(s->slots[i].key, id))) i = (i + 1) & (s->cap - 1);
    return &s->slots[i];
}

static int id_set_grow(IdSet *s) {
    size_t cap = s->cap * 2;
    IdSlot *old = s->slots, *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    size_t old_cap = s->cap;
    s->slots = slots;
    s->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key) *id_set_find(s, old[i].key, old[i].hash) = old[i];
    free(old);
    return 0;
}

int id_set_add(IdSet *s, const char *id, int64_t value) {
    if ((s->n + 1) * 2 > s->cap && id_set_grow(s)) return -1;
    uint64_t h = id_hash(id);
    IdSlot *slot = id_set_find(s, id, h);
    if (slot->key) return 0;
    if (!(slot->key = strdup(id))) return -1;
    slot->hash = h;
    slot->value = value;
    s->n++;
    return 1;
}

bool id_set_has(const IdSet *s, const char *id) { return id_set_find(s, id, id_hash(id))->key != NULL; }

int64_t id_set_get(const IdSet *s, const char *id) {
    const IdSlot *slot = id_set_find(s, id, id_hash(id));
    return slot->key ? slot->value : -1;
}

int id_set_bump(IdSet *s, const char *id, int64_t *count) {
    int added = id_set_add(s, id, 1);
    if (added < 0) return -1;
    IdSlot *slot = id_set_find(s, id, id_hash(id));
    if (!added) slot->value++;
    *count = slot->value;
    return 0;
}

size_t id_set_count(const IdSet *s) { return s->n; }

void id_set_free(IdSet *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++) free(s->slots[i].key);
    free(s->slots);
    free(s);
}

/* ------------------------------------------------------ raw JSON walking */

/* These walk text that json_parse already accepted, to recover the exact
 * text of a number; they still stop at the end of the buffer on any input. */
static size_t raw_skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    return i;
}

static size_t raw_skip_string(const char *s, size_t n, size_t i) { /* s[i] == '"' */
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
    return i < n ? i + 1 : n;
}

static size_t raw_skip_value(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '"') return raw_skip_string(s, n, i);
    if (i < n && (s[i] == '{' || s[i] == '[')) {
        int depth = 0;
        while (i < n) {
            char c = s[i];
            if (c == '"') { i = raw_skip_string(s, n, i); continue; }
            if (c == '{' || c == '[') depth++;
            if ((c == '}' || c == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i;
}

/* Finds the value text of the last top-level member named key (written
 * without escapes). Returns 0 and the span, or -1. */
static int raw_find_member(const char *s, size_t n, const char *key, size_t *vs, size_t *ve) {
    size_t klen = strlen(key), i = raw_skip_ws(s, n, 0);
    int found = -1;
    if (i >= n || s[i] != '{') return -1;
    for (i++;;) {
        i = raw_skip_ws(s, n, i);
        if (i >= n || s[i] != '"') return found;
        size_t k0 = i + 1, k1 = raw_skip_string(s, n, i);
        bool match = k1 - k0 == klen + 1 && !memcmp(s + k0, key, klen);
        i = raw_skip_ws(s, n, k1);
        if (i >= n || s[i] != ':') return found;
        i = raw_skip_ws(s, n, i + 1);
        size_t v0 = i;
        i = raw_skip_value(s, n, i);
        if (match) { *vs = v0; *ve = i; found = 0; }
        i = raw_skip_ws(s, n, i);
        if (i >= n || s[i] != ',') return found;
        i++;
    }
}

char *prompts_id_text(const JsonValue *obj, const char *key, const char *line, size_t len, bool *is_number) {
    const JsonValue *v = json_get(obj, key);
    *is_number = false;
    if (!v) return NULL;
    if (v->type == JSON_STRING) return strndup(v->u.string.s, v->u.string.len);
    if (v->type != JSON_NUMBER) return NULL;
    *is_number = true;
    size_t vs = 0, ve = 0;
    if (!raw_find_member(line, len, key, &vs, &ve) && ve > vs && ve - vs < 400) {
        char tmp[400];
        memcpy(tmp, line + vs, ve - vs);
        tmp[ve - vs] = 0;
        char *end;
        double d = strtod(tmp, &end);
        /* Trust the raw text only when it is the number the parser read. */
        if (*end == 0 && (d == v->u.number.num || (isnan(d) && isnan(v->u.number.num)))) return strdup(tmp);
    }
    char tmp[64];
    if (v->u.number.is_int) snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.number.i);
    else snprintf(tmp, sizeof tmp, "%.17g", v->u.number.num);
    return strdup(tmp);
}

/* ------------------------------------------------------------ line reader */

#define READ_CHUNK ((size_t)256 << 10)
/* zlib drops what a gzread call (and the inflate pass that failed) had
 * decompressed when it meets corrupt data, so small calls over a small
 * buffer keep nearly every line before the damage. */
#define GZ_BUFFER ((unsigned)16 << 10)
#define GZ_CALL ((size_t)GZ_BUFFER * 2)

struct PromptReader {
    gzFile gz;
    char *path;            /* for messages */
    PromptFormat fmt;
    char *buf;             /* buf[pos..len): bytes read, not yet returned */
    size_t cap, pos, len, max_line;
    bool eof;
    int64_t line_no;       /* lines returned so far */
    int64_t n_req;         /* requests returned so far */
    IdSet *ids;            /* every id returned, with its line */
    IdSet *dups;           /* ids returned more than once, with their count */
    bool open_failed;      /* the read-ahead at open failed: prompts_next returns open_err */
    Err open_err;
    /* The line read ahead by format detection, returned by the next call. */
    bool has_peek, peek_too_long;
    const char *peek;
    size_t peek_len;
};

/* Moves the unread bytes to the front, grows the buffer when it is full (up
 * to the longest allowed line), and reads more. */
static int reader_fill(PromptReader *r, Err *err) {
    if (r->pos > 0) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    if (r->len == r->cap) {
        size_t cap = r->cap * 2 > r->max_line + 2 ? r->max_line + 2 : r->cap * 2;
        if (cap <= r->cap) cap = r->cap + READ_CHUNK;
        char *b = realloc(r->buf, cap);
        if (!b) return err_set(err, "%s: out of memory for a line of %zu bytes", r->path, r->len);
        r->buf = b;
        r->cap = cap;
    }
    size_t want = r->cap - r->len;
    if (want > GZ_CALL) want = GZ_CALL;
    int n = gzread(r->gz, r->buf + r->len, (unsigned)want);
    if (n < 0) {
        int code;
        const char *msg = gzerror(r->gz, &code);
        return err_set(err, "%s: read failed after line %lld: %s", r->path, (long long)r->line_no,
                       code == Z_ERRNO ? strerror(errno) : msg);
    }
    if (n == 0) {
        /* zlib reports a gzip stream cut short as a plain end with Z_BUF_ERROR. */
        int code;
        const char *msg = gzerror(r->gz, &code);
        if (code == Z_BUF_ERROR)
            return err_set(err, "%s: the gzip data is cut short after line %lld (%s)", r->path, (long long)r->line_no,
                           msg);
        r->eof = true;
    }
    r->len += (size_t)n;
    return 0;
}

/* Throws away the rest of a line longer than the limit. */
static int reader_skip_line(PromptReader *r, Err *err) {
    for (;;) {
        char *nl = memchr(r->buf + r->pos, '\n', r->len - r->pos);
        if (nl) { r->pos = (size_t)(nl - r->buf) + 1; return 0; }
        r->pos = r->len;
        if (r->eof) return 0;
        if (reader_fill(r, err)) return -1;
    }
}

/* Next raw line without its "\n" / "\r\n". 1 = line (too_long: over the
 * limit, content dropped), 0 = end, -1 = error. The line stays valid until
 * the next call. */
static int reader_line(PromptReader *r, const char **line, size_t *len, bool *too_long, Err *err) {
    size_t scanned = 0;
    *too_long = false;
    for (;;) {
        char *start = r->buf + r->pos;
        char *nl = memchr(start + scanned, '\n', r->len - r->pos - scanned);
        size_t n = nl ? (size_t)(nl - start) : r->len - r->pos;
        if (!nl && n > r->max_line + 1) { /* +1: room for a '\r' */
            *too_long = true;
            if (reader_skip_line(r, err)) return -1;
            r->line_no++;
            *line = NULL; *len = 0;
            return 1;
        }
        if (nl || (r->eof && n > 0)) {
            r->pos += n + (nl != NULL);
            r->line_no++;
            if (n > 0 && start[n - 1] == '\r') n--;
            if (r->line_no == 1 && n >= 3 && !memcmp(start, "\xEF\xBB\xBF", 3)) { start += 3; n -= 3; } /* BOM */
            *too_long = n > r->max_line;
            *line = start; *len = n;
            return 1;
        }
        if (r->eof) return 0;
        scanned = n;
        if (reader_fill(r, err)) return -1;
    }
}

static bool line_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\f\v", s[i]) || s[i] == 0) return false;
    return true;
}

/* Next non-blank line, the read-ahead one first. */
static int reader_next_nonblank(PromptReader *r, const char **line, size_t *len, bool *too_long, Err *err) {
    if (r->has_peek) {
        r->has_peek = false;
        *line = r->peek; *len = r->peek_len; *too_long = r->peek_too_long;
        return 1;
    }
    for (;;) {
        int rc = reader_line(r, line, len, too_long, err);
        if (rc <= 0 || *too_long || !line_blank(*line, *len)) return rc;
    }
}

/* ------------------------------------------------------- request parsing */

/* State of parsing one line into a request. */
typedef struct {
    PromptRequest *req;
    const char *pfx;   /* "" or "body." — how field names are shown */
    bool oom;
} Parse;

/* Sets the request's error (the first one wins) and returns -1. */
static int parse_fail(Parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int parse_fail(Parse *p, const char *fmt, ...) {
    if (p->req->error) return -1;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(msg) + 32;
    p->req->error = malloc(n);
    if (!p->req->error) { p->oom = true; return -1; }
    snprintf(p->req->error, n, "line %lld: %s", (long long)p->req->line, msg);
    return -1;
}

static int fail_field(Parse *p, const char *field, const char *must, const JsonValue *v) {
    char got[80];
    json_describe(v, got, sizeof got);
    return parse_fail(p, "field '%s%s' must %s (got %s)", p->pfx, field, must, got);
}

/* Copies a JSON string, refusing NUL and invalid UTF-8 (a tokenizer gets C
 * strings, and the output must be valid JSON). */
static int parse_string(Parse *p, const JsonValue *v, const char *field, char **out) {
    if (v->type != JSON_STRING) return fail_field(p, field, "be a string", v);
    const char *s = v->u.string.s;
    size_t n = v->u.string.len;
    if (strlen(s) != n) return parse_fail(p, "field '%s%s' contains a NUL character", p->pfx, field);
    size_t bad = utf8_valid_prefix(s, n);
    if (bad < n) return parse_fail(p, "field '%s%s' has invalid UTF-8 at byte offset %zu", p->pfx, field, bad);
    if (!(*out = strndup(s, n))) { p->oom = true; return -1; }
    return 0;
}

/* A float field in [lo, hi] (open ends when lo_open / hi_open). */
static int parse_float(Parse *p, const JsonValue *o, const char *field, float *out, double lo, bool lo_open,
                       double hi, bool hi_open) {
    const JsonValue *v = json_member(o, field);
    if (!v) return 0;
    double d = v->type == JSON_NUMBER ? v->u.number.num : NAN;
    bool ok = isfinite(d) && (lo_open ? d > lo : d >= lo) && (hi_open ? d < hi : d <= hi);
    if (!ok) {
        char must[96];
        if (isinf(hi)) snprintf(must, sizeof must, "be a number %s %g", lo_open ? ">" : ">=", lo);
        else snprintf(must, sizeof must, "be a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
        return fail_field(p, field, must, v);
    }
    *out = (float)d;
    return 0;
}

static int parse_stop(Parse *p, const JsonValue *o) {
    const JsonValue *v = json_member(o, "stop");
    if (!v) return 0;
    const char *must = "be a string or an array of strings";
    if (v->type != JSON_STRING && v->type != JSON_ARRAY) return fail_field(p, "stop", must, v);
    size_t n = v->type == JSON_STRING ? 1 : json_len(v);
    if (n > PROMPTS_MAX_STOP) return parse_fail(p, "field '%sstop' has %zu strings; at most %d", p->pfx, n, PROMPTS_MAX_STOP);
    PromptRequest *req = p->req;
    if (n == 0) return 0;
    if (!(req->stop = calloc(n, sizeof *req->stop))) { p->oom = true; return -1; }
    for (size_t i = 0; i < n; i++) {
        const JsonValue *s = v->type == JSON_STRING ? v : json_at(v, i);
        char name[32];
        snprintf(name, sizeof name, v->type == JSON_STRING ? "stop" : "stop[%zu]", i);
        if (s->type != JSON_STRING) return fail_field(p, "stop", must, s);
        if (s->u.string.len == 0) return parse_fail(p, "field '%s%s' must not be empty", p->pfx, name);
        if (parse_string(p, s, name, &req->stop[i])) return -1;
        req->n_stop++;
    }
    return 0;
}

/* The integer fields: max_tokens (max_completion_tokens wins), top_k, seed, n. */
static int parse_ints(Parse *p, const JsonValue *o) {
    PromptRequest *req = p->req;
    const char *mt[] = {"max_tokens", "max_completion_tokens"};
    int64_t i;
    for (int k = 0; k < 2; k++) {
        const JsonValue *v = json_member(o, mt[k]);
        if (!v) continue;
        if (!json_as_int64(v, &i) || i < 1 || i > INT_MAX) return fail_field(p, mt[k], "be a positive integer", v);
        req->max_tokens = (int)i;
    }
    const JsonValue *v = json_member(o, "top_k");
    if (v) {
        if (!json_as_int64(v, &i) || i < -1 || i > INT_MAX)
            return fail_field(p, "top_k", "be an integer >= -1 (-1 or 0: no limit)", v);
        req->top_k = i <= 0 ? 0 : (int)i;
    }
    if ((v = json_member(o, "seed"))) {
        if (!json_as_int64(v, &req->seed)) return fail_field(p, "seed", "be an integer", v);
        req->has_seed = true;
    }
    if ((v = json_member(o, "n")) && !(json_as_int64(v, &i) && i == 1))
        return fail_field(p, "n", "be 1", v);
    return 0;
}

/* Every optional sampling field of a JSONL line or an OpenAI body. */
static int parse_sampling(Parse *p, const JsonValue *o) {
    PromptRequest *req = p->req;
    if (parse_ints(p, o)) return -1;
    if (parse_float(p, o, "temperature", &req->temperature, 0, false, INFINITY, false)) return -1;
    if (parse_float(p, o, "top_p", &req->top_p, 0, true, 1, false)) return -1;
    if (parse_float(p, o, "min_p", &req->min_p, 0, false, 1, false)) return -1;
    if (parse_float(p, o, "repetition_penalty", &req->repetition_penalty, 0, true, INFINITY, false)) return -1;
    if (parse_float(p, o, "presence_penalty", &req->presence_penalty, -2, false, 2, false)) return -1;
    if (parse_float(p, o, "frequency_penalty", &req->frequency_penalty, -2, false, 2, false)) return -1;
    if (parse_stop(p, o)) return -1;
    const JsonValue *v = json_member(o, "model");
    if (v && parse_string(p, v, "model", &req->model)) return -1;
    return 0;
}

static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool"};

/* content: a string, or OpenAI's array of {"type": "text", "text": ...}
 * parts, joined with newlines. */
static int parse_content(Parse *p, const JsonValue *c, const char *field, char **out) {
    if (c->type == JSON_STRING) return parse_string(p, c, field, out);
    if (c->type != JSON_ARRAY) return fail_field(p, field, "be a string or an array of text parts", c);
    size_t total = 1, n = json_len(c);
    for (size_t i = 0; i < n; i++) {
        const JsonValue *part = json_at(c, i), *text = json_get(part, "text");
        const char *type = json_get_str(part, "type", "");
        if (strcmp(type, "text") || !text || text->type != JSON_STRING)
            return parse_fail(p, "field '%s%s[%zu]' must be {\"type\": \"text\", \"text\": string} (got type '%.40s')",
                              p->pfx, field, i, type);
        total += text->u.string.len + 1;
    }
    char *s = malloc(total);
    if (!s) { p->oom = true; return -1; }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const JsonValue *text = json_get(json_at(c, i), "text");
        char *t;
        if (parse_string(p, text, field, &t)) { free(s); return -1; }
        if (i) s[at++] = '\n';
        memcpy(s + at, t, text->u.string.len);
        at += text->u.string.len;
        free(t);
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int parse_messages(Parse *p, const JsonValue *m) {
    PromptRequest *req = p->req;
    if (m->type != JSON_ARRAY) return fail_field(p, "messages", "be an array of {role, content} objects", m);
    size_t n = json_len(m);
    if (n == 0) return parse_fail(p, "field '%smessages' must not be empty", p->pfx);
    if (!(req->messages = calloc(n, sizeof *req->messages))) { p->oom = true; return -1; }
    req->is_chat = true;
    for (size_t i = 0; i < n; i++) {
        const JsonValue *msg = json_at(m, i), *role, *content;
        char field[48];
        snprintf(field, sizeof field, "messages[%zu]", i);
        if (msg->type != JSON_OBJECT) return fail_field(p, field, "be an object with role and content", msg);
        PromptMessage *pm = &req->messages[req->n_messages++];
        snprintf(field, sizeof field, "messages[%zu].role", i);
        if (!(role = json_member(msg, "role"))) return parse_fail(p, "missing field '%s%s'", p->pfx, field);
        if (parse_string(p, role, field, &pm->role)) return -1;
        size_t r = 0;
        while (r < sizeof ROLES / sizeof *ROLES && strcmp(pm->role, ROLES[r])) r++;
        if (r == sizeof ROLES / sizeof *ROLES)
            return fail_field(p, field, "be one of system, developer, user, assistant, tool", role);
        snprintf(field, sizeof field, "messages[%zu].content", i);
        if (!(content = json_member(msg, "content"))) return parse_fail(p, "missing field '%s%s'", p->pfx, field);
        if (parse_content(p, content, field, &pm->content)) return -1;
    }
    return 0;
}

/* "prompt": [ids]: one prompt of token ids (OpenAI's token form); their range
 * is the vocabulary's, checked where the tokenizer is known. */
static int parse_prompt_ids(Parse *p, const JsonValue *v) {
    size_t n = json_len(v);
    if (n == 0) return parse_fail(p, "field '%sprompt' must not be empty", p->pfx);
    if (n > INT32_MAX) return parse_fail(p, "field '%sprompt' holds too many token ids", p->pfx);
    if (!(p->req->prompt_ids = malloc(n * sizeof *p->req->prompt_ids))) { p->oom = true; return -1; }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        const JsonValue *t = json_at(v, i);
        if (t->type == JSON_STRING || t->type == JSON_ARRAY) /* a batch of prompts, as the API allows */
            return fail_field(p, "prompt", "be a string or an array of token ids (arrays of prompts are not supported)",
                              v);
        if (t->type != JSON_NUMBER || !json_as_int64(t, &id) || id < 0 || id > INT32_MAX) {
            char field[48];
            snprintf(field, sizeof field, "prompt[%zu]", i);
            return fail_field(p, field, "be a token id (an integer >= 0)", t);
        }
        p->req->prompt_ids[p->req->n_prompt_ids++] = (int32_t)id;
    }
    return 0;
}

static int parse_prompt(Parse *p, const JsonValue *v) {
    if (v->type == JSON_ARRAY) return parse_prompt_ids(p, v);
    if (v->type != JSON_STRING) return fail_field(p, "prompt", "be a string or an array of token ids", v);
    if (v->u.string.len == 0) return parse_fail(p, "field '%sprompt' must not be empty", p->pfx);
    return parse_string(p, v, "prompt", &p->req->prompt);
}

/* The prompt part: exactly one of prompt / messages; want_chat: 1 needs
 * messages, 0 needs a prompt, -1 either. */
static int parse_body(Parse *p, const JsonValue *o, int want_chat) {
    const JsonValue *prompt = json_member(o, "prompt"), *messages = json_member(o, "messages");
    if (prompt && messages) return parse_fail(p, "give '%sprompt' or '%smessages', not both", p->pfx, p->pfx);
    if (want_chat == 1 && !messages)
        return parse_fail(p, "missing field '%smessages' (required for /v1/chat/completions)", p->pfx);
    if (want_chat == 0 && !prompt) return parse_fail(p, "missing field '%sprompt' (required for /v1/completions)", p->pfx);
    if (!prompt && !messages)
        return parse_fail(p, "missing field 'prompt' or 'messages'%s",
                          json_get(o, "body") ? " (this looks like an OpenAI batch line, but the first line made the "
                                                "format JSON Lines)" : "");
    if (messages ? parse_messages(p, messages) : parse_prompt(p, prompt)) return -1;
    if (parse_sampling(p, o)) return -1;
    char msg[256];
    return prompts_parse_logprobs(o, p->pfx, p->req, msg, sizeof msg) ? parse_fail(p, "%s", msg) : 0;
}

/* Reads the id member; an id of the wrong kind is an error (the request
 * then keeps "line-N"). */
static int parse_id(Parse *p, const JsonValue *o, const char *key, const char *line, size_t len) {
    PromptRequest *req = p->req;
    const JsonValue *v = json_member(o, key);
    if (!v) return 0;
    if (v->type == JSON_STRING) {
        if (v->u.string.len == 0) return parse_fail(p, "field '%s' must not be empty", key);
        return parse_string(p, v, key, &req->id);
    }
    if (v->type != JSON_NUMBER) return fail_field(p, key, "be a string or a number", v);
    if (!(req->id = prompts_id_text(o, key, line, len, &req->id_is_number))) p->oom = true;
    return p->oom ? -1 : 0;
}

static int parse_openai(Parse *p, const JsonValue *o, const char *line, size_t len) {
    if (!json_member(o, "custom_id")) return parse_fail(p, "missing field 'custom_id'");
    if (parse_id(p, o, "custom_id", line, len)) return -1;
    const JsonValue *method = json_member(o, "method"), *url = json_member(o, "url"), *body = json_member(o, "body");
    if (method && (method->type != JSON_STRING || strcmp(method->u.string.s, "POST")))
        return fail_field(p, "method", "be \"POST\"", method);
    int want_chat = -1; /* no url: whichever the body gives */
    if (url) {
        bool chat = url->type == JSON_STRING && !strcmp(url->u.string.s, "/v1/chat/completions");
        bool completion = url->type == JSON_STRING && !strcmp(url->u.string.s, "/v1/completions");
        if (!chat && !completion) return fail_field(p, "url", "be \"/v1/chat/completions\" or \"/v1/completions\"", url);
        want_chat = chat;
    }
    if (!body) return parse_fail(p, "missing field 'body'");
    if (body->type != JSON_OBJECT) return fail_field(p, "body", "be an object", body);
    p->pfx = "body.";
    return parse_body(p, body, want_chat);
}

static void parse_json_line(Parse *p, PromptFormat fmt, const char *line, size_t len) {
    char source[48];
    snprintf(source, sizeof source, "line %lld", (long long)p->req->line);
    Err jerr = {{0}};
    Json *doc = json_parse(line, len, source, &jerr);
    if (!doc) {
        /* The reader says "line N: offset O (line 1, column C): what"; within
         * one line the column is what a person looks for. */
        const char *rest = jerr.msg + (strncmp(jerr.msg, source, strlen(source)) ? 0 : strlen(source));
        size_t off, ln, col;
        int k = 0;
        if (sscanf(rest, ": offset %zu (line %zu, column %zu): %n", &off, &ln, &col, &k) == 3 && k > 0 && ln == 1)
            parse_fail(p, "invalid JSON at column %zu: %s", col, rest + k);
        else parse_fail(p, "invalid JSON%s%s", rest == jerr.msg ? ": " : "", rest);
        return;
    }
    const JsonValue *o = json_root(doc);
    if (o->type != JSON_OBJECT) parse_fail(p, "expected a JSON object, one request per line");
    else if (fmt == PROMPTS_OPENAI) parse_openai(p, o, line, len);
    else if (!parse_id(p, o, "id", line, len)) parse_body(p, o, -1);
    json_free(doc);
}

static void parse_text_line(Parse *p, const char *line, size_t len) {
    if (memchr(line, 0, len)) { parse_fail(p, "contains a NUL byte"); return; }
    size_t bad = utf8_valid_prefix(line, len);
    if (bad < len) { parse_fail(p, "invalid UTF-8 at byte offset %zu", bad); return; }
    if (!(p->req->prompt = strndup(line, len))) p->oom = true;
}

/* ----------------------------------------------------------------- reader */

static PromptFormat detect_format(const char *line, size_t len, bool too_long) {
    size_t i = 0;
    while (i < len && strchr(" \t\f\v", line[i])) i++;
    if (too_long) return PROMPTS_JSONL; /* only JSON can be that long and mean one request */
    if (i >= len || line[i] != '{') return PROMPTS_TEXT;
    Err e;
    Json *doc = json_parse(line, len, "first line", &e);
    PromptFormat fmt = PROMPTS_JSONL;
    if (doc && (json_get(json_root(doc), "custom_id") || json_get(json_root(doc), "body"))) fmt = PROMPTS_OPENAI;
    json_free(doc);
    return fmt;
}

PromptReader *prompts_open_limit(const char *path, PromptFormat fmt, size_t max_line, Err *err) {
    PromptReader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(strcmp(path, "-") ? path : "<stdin>")) || !(r->ids = id_set_new())) {
        err_set(err, "%s: out of memory", path);
        goto fail;
    }
    r->max_line = max_line ? max_line : PROMPTS_MAX_LINE;
    if (r->max_line > ((size_t)1 << 40)) r->max_line = (size_t)1 << 40;
    r->cap = r->max_line + 2 < READ_CHUNK ? r->max_line + 2 : READ_CHUNK;
    if (!(r->buf = malloc(r->cap))) { err_set(err, "%s: out of memory", path); goto fail; }
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : dup(0);
    if (fd < 0) { err_set(err, "%s: cannot open the prompts: %s", r->path, strerror(errno)); goto fail; }
    struct stat st;
    if (!fstat(fd, &st) && S_ISDIR(st.st_mode)) {
        close(fd);
        err_set(err, "%s: is a directory, not a prompt file", r->path);
        goto fail;
    }
    /* gzdopen reads gzip (by its magic bytes) and passes anything else through. */
    if (!(r->gz = gzdopen(fd, "rb"))) {
        close(fd);
        err_set(err, "%s: cannot open the prompts: out of memory", r->path);
        goto fail;
    }
    gzbuffer(r->gz, GZ_BUFFER);
    r->fmt = fmt;
    if (fmt == PROMPTS_AUTO) {
        /* A read error here (a corrupt .gz) is the first prompts_next's to
         * report: the caller has the input open and can still decide what
         * the output says. */
        int rc = reader_next_nonblank(r, &r->peek, &r->peek_len, &r->peek_too_long, &r->open_err);
        r->open_failed = rc < 0;
        r->has_peek = rc == 1;
        r->fmt = rc == 1 ? detect_format(r->peek, r->peek_len, r->peek_too_long) : PROMPTS_TEXT;
    }
    return r;
fail:
    prompts_close(r);
    return NULL;
}

PromptReader *prompts_open(const char *path, PromptFormat fmt, Err *err) {
    return prompts_open_limit(path, fmt, 0, err);
}

static void request_init(PromptRequest *req) {
    memset(req, 0, sizeof *req);
    req->max_tokens = -1;
    req->top_k = -1;
    req->logprobs = req->prompt_logprobs = -1;
    req->temperature = req->top_p = req->min_p = NAN;
    req->repetition_penalty = req->presence_penalty = req->frequency_penalty = NAN;
}

/* A bad request keeps its id, line, index, is_chat and model, and nothing
 * half-read: no prompt, messages, stop strings or sampling values. */
static void request_clear_body(PromptRequest *req) {
    PromptRequest keep = *req;
    keep.prompt = NULL;
    keep.messages = NULL;
    keep.n_messages = 0;
    keep.stop = NULL;
    keep.n_stop = 0;
    free(req->prompt);
    free(req->prompt_ids);
    for (int i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
    }
    free(req->messages);
    for (int i = 0; i < req->n_stop; i++) free(req->stop[i]);
    free(req->stop);
    request_init(req);
    req->id = keep.id;
    req->id_is_number = keep.id_is_number;
    req->index = keep.index;
    req->line = keep.line;
    req->occurrence = keep.occurrence;
    req->is_chat = keep.is_chat;
    req->model = keep.model;
    req->error = keep.error;
}

/* Gives the request its fallback id and checks the id against earlier ones. */
static int request_finish_id(PromptReader *r, Parse *p) {
    PromptRequest *req = p->req;
    if (!req->id) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "line-%lld", (long long)req->line);
        if (!(req->id = strdup(tmp))) return -1;
        req->id_is_number = false;
    }
    int added = id_set_add(r->ids, req->id, req->line);
    if (added < 0) return -1;
    req->occurrence = 1;
    if (added == 0) {
        if (!r->dups && !(r->dups = id_set_new())) return -1;
        if (id_set_bump(r->dups, req->id, &req->occurrence)) return -1;
        req->occurrence++; /* dups counts the repeats, not the first */
        char shown[64];
        snprintf(shown, sizeof shown, "%.40s%s", req->id, strlen(req->id) > 40 ? "..." : "");
        parse_fail(p, "duplicate id '%s' (first on line %lld)", shown, (long long)id_set_get(r->ids, req->id));
    }
    return p->oom ? -1 : 0;
}

int prompts_next(PromptReader *r, PromptRequest *req, Err *err) {
    const char *line;
    size_t len;
    bool too_long;
    request_init(req);
    if (r->open_failed) {
        *err = r->open_err;
        return -1;
    }
    int rc = reader_next_nonblank(r, &line, &len, &too_long, err);
    if (rc <= 0) return rc;
    req->line = r->line_no;
    req->index = r->n_req++;
    Parse p = {req, "", false};
    if (too_long) parse_fail(&p, "longer than the limit of %zu bytes", r->max_line);
    else if (r->fmt == PROMPTS_TEXT) parse_text_line(&p, line, len);
    else parse_json_line(&p, r->fmt, line, len);
    if (p.oom || request_finish_id(r, &p)) {
        prompt_request_free(req);
        return err_set(err, "%s: out of memory on line %lld", r->path, (long long)r->line_no);
    }
    if (req->error) request_clear_body(req);
    return 1;
}

PromptFormat prompts_format(const PromptReader *r) { return r->fmt; }

const char *prompts_format_name(PromptFormat fmt) {
    switch (fmt) {
    case PROMPTS_TEXT: return "text";
    case PROMPTS_JSONL: return "jsonl";
    case PROMPTS_OPENAI: return "openai";
    default: return "auto";
    }
}

void prompt_request_free(PromptRequest *req) {
    if (!req) return;
    request_clear_body(req);
    free(req->id);
    free(req->model);
    free(req->error);
    request_init(req);
}

void prompts_close(PromptReader *r) {
    if (!r) return;
    if (r->gz) gzclose(r->gz);
    id_set_free(r->ids);
    id_set_free(r->dups);
    free(r->buf);
    free(r->path);
    free(r);
}
