/* results.c — the output writer of `cllm generate` (see results.h): whole
 * lines through write(2) on an O_APPEND descriptor (one gzip member per line
 * for .gz), the resume scan that cuts a partial tail and collects the done
 * ids, and the reorder buffer behind --ordered.
 */
#include "app/results.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "base/utf8.h"

#define RESUME_MAX_LINE ((size_t)256 << 20)  /* longer output lines are not ours: skipped */
#define RESUME_MAX_DROP ((int64_t)64 << 20)  /* a partial tail longer than this is not a crash */

struct ResultWriter {
    int fd;
    char *path;
    bool gz, is_stdout, need_newline; /* need_newline: the file ends inside a line */
    PromptFormat fmt;
    z_stream zs;                      /* deflate state, reset for every member */
    bool zs_ready;
    unsigned char *zbuf;
    size_t zcap;
    JsonBuf line;                     /* reused for every line */
    uint32_t tag;                     /* makes batch_req ids differ between runs */
    uint64_t counter;
    IdSet *done;
    ResultResume info;
};

/* ------------------------------------------------------------- low level */

static bool path_is_gz(const char *path) {
    size_t n = strlen(path);
    return n > 3 && !strcmp(path + n - 3, ".gz");
}

static int write_all(int fd, const void *data, size_t len, const char *path, Err *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return err_set(err, "%s: write failed: %s", path, n < 0 ? strerror(errno) : "no progress");
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One complete gzip member holding data[0..len). */
static int gz_member(ResultWriter *w, const char *data, size_t len, size_t *out_len, Err *err) {
    if (!w->zs_ready) {
        if (deflateInit2(&w->zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return err_set(err, "%s: cannot start gzip compression", w->path);
        w->zs_ready = true;
    } else deflateReset(&w->zs);
    size_t bound = deflateBound(&w->zs, (uLong)len) + 64;
    if (bound > w->zcap) {
        unsigned char *b = realloc(w->zbuf, bound);
        if (!b) return err_set(err, "%s: out of memory compressing a line of %zu bytes", w->path, len);
        w->zbuf = b;
        w->zcap = bound;
    }
    w->zs.next_in = (unsigned char *)data;
    w->zs.avail_in = (uInt)len;
    w->zs.next_out = w->zbuf;
    w->zs.avail_out = (uInt)w->zcap;
    if (deflate(&w->zs, Z_FINISH) != Z_STREAM_END) return err_set(err, "%s: gzip compression failed", w->path);
    *out_len = w->zcap - w->zs.avail_out;
    return 0;
}

static int write_chunk(ResultWriter *w, const char *data, size_t len, Err *err) {
    if (!w->gz) return write_all(w->fd, data, len, w->path, err);
    size_t n = 0;
    if (len > (size_t)UINT32_MAX / 2) return err_set(err, "%s: a line of %zu bytes is too long", w->path, len);
    if (gz_member(w, data, len, &n, err)) return -1;
    return write_all(w->fd, w->zbuf, n, w->path, err);
}

int results_write_raw(ResultWriter *w, const char *bytes, size_t len, Err *err) {
    /* After a file that ends inside a line, the first write starts a fresh one. */
    if (w->need_newline) {
        if (write_chunk(w, "\n", 1, err)) return -1;
        w->need_newline = false;
    }
    return write_chunk(w, bytes, len, err);
}

/* --------------------------------------------------------------- format */

/* A JSON string of s[0..n) with every invalid UTF-8 sequence as U+FFFD. */
int results_put_text(JsonBuf *b, const char *s, size_t n) {
    if (utf8_valid_prefix(s, n) == n) return jsonbuf_put_string(b, s, n);
    JsonBuf clean = {0};
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        int k = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (textbuf_append(&clean, k > 0 ? s + i : "\xEF\xBF\xBD", k > 0 ? (size_t)k : 3)) {
            jsonbuf_free(&clean);
            return -1;
        }
        i += (size_t)(k > 0 ? k : -k);
    }
    int rc = jsonbuf_put_string(b, clean.data, clean.len);
    jsonbuf_free(&clean);
    return rc;
}

static int put_text(JsonBuf *b, const char *s, size_t n) { return results_put_text(b, s, n); }
static int put_cstr(JsonBuf *b, const char *s) { return put_text(b, s ? s : "", s ? strlen(s) : 0); }

/* Whether s is a JSON number as the grammar writes it (so a raw id can go
 * into the output unquoted without breaking the line). */
static bool json_number_ok(const char *s) {
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (*s >= '0' && *s <= '9') s++;
    else return false;
    if (*s == '.') {
        if (!(*++s >= '0' && *s <= '9')) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    return *s == 0;
}

static int put_id(JsonBuf *b, const ResultLine *l) {
    if (l->id && l->id_is_number && json_number_ok(l->id)) return jsonbuf_printf(b, "%s", l->id);
    return put_cstr(b, l->id);
}

static const char *finish_of(const ResultLine *l) {
    if (l->finish_reason) return l->finish_reason;
    return l->error ? "error" : "stop";
}

static int format_jsonl(const ResultLine *l, JsonBuf *b) {
    size_t tlen = l->text ? (l->text_len ? l->text_len : strlen(l->text)) : 0;
    double secs = isfinite(l->seconds) && l->seconds >= 0 ? l->seconds : 0;
    int rc = jsonbuf_printf(b, "{\"id\":");
    rc |= put_id(b, l);
    rc |= jsonbuf_printf(b, ",\"text\":");
    rc |= put_text(b, l->text ? l->text : "", tlen);
    rc |= jsonbuf_printf(b, ",\"prompt_tokens\":%d,\"completion_tokens\":%d,\"finish_reason\":", l->prompt_tokens,
                         l->completion_tokens);
    rc |= put_cstr(b, finish_of(l));
    rc |= jsonbuf_printf(b, ",\"seconds\":%.3f", secs);
    if (l->logprobs) rc |= jsonbuf_printf(b, ",\"logprobs\":%s", l->logprobs);
    if (l->prompt_logprobs) rc |= jsonbuf_printf(b, ",\"prompt_logprobs\":%s", l->prompt_logprobs);
    if (l->error) {
        rc |= jsonbuf_printf(b, ",\"error\":");
        rc |= put_cstr(b, l->error);
    }
    return rc | jsonbuf_printf(b, "}\n");
}

/* OpenAI names: a too-full context is "length"; the rest pass through. */
static const char *openai_finish(const ResultLine *l) {
    const char *f = finish_of(l);
    return !strcmp(f, "context") ? "length" : f;
}

static int format_openai(ResultWriter *w, const ResultLine *l, JsonBuf *b) {
    unsigned long long n = (unsigned long long)++w->counter;
    int rc = jsonbuf_printf(b, "{\"id\":\"batch_req_%08x%016llx\",\"custom_id\":", w->tag, n);
    rc |= put_id(b, l);
    if (l->error) {
        rc |= jsonbuf_printf(b, ",\"response\":null,\"error\":{\"message\":");
        rc |= put_cstr(b, l->error);
        return rc | jsonbuf_printf(b, "}}\n");
    }
    size_t tlen = l->text ? (l->text_len ? l->text_len : strlen(l->text)) : 0;
    rc |= jsonbuf_printf(b,
                         ",\"response\":{\"status_code\":200,\"request_id\":\"%08x%016llx\",\"body\":{\"id\":\"%s%08x%016llx\","
                         "\"object\":\"%s\",\"created\":%lld,\"model\":",
                         w->tag, n, l->is_chat ? "chatcmpl-" : "cmpl-", w->tag, n,
                         l->is_chat ? "chat.completion" : "text_completion", (long long)time(NULL));
    rc |= put_cstr(b, l->model);
    rc |= jsonbuf_printf(b, l->is_chat ? ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                                       : ",\"choices\":[{\"index\":0,\"text\":");
    rc |= put_text(b, l->text ? l->text : "", tlen);
    rc |= jsonbuf_printf(b, "%s,\"logprobs\":%s", l->is_chat ? "}" : "", l->logprobs ? l->logprobs : "null");
    if (l->prompt_logprobs) rc |= jsonbuf_printf(b, ",\"prompt_logprobs\":%s", l->prompt_logprobs);
    rc |= jsonbuf_printf(b, ",\"finish_reason\":");
    rc |= put_cstr(b, openai_finish(l));
    rc |= jsonbuf_printf(b, "}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%lld}}},"
                            "\"error\":null}\n",
                         l->prompt_tokens, l->completion_tokens, (long long)l->prompt_tokens + l->completion_tokens);
    return rc;
}

int results_format(ResultWriter *w, const ResultLine *line, JsonBuf *out) {
    return w->fmt == PROMPTS_OPENAI ? format_openai(w, line, out) : format_jsonl(line, out);
}

int results_write(ResultWriter *w, const ResultLine *line, Err *err) {
    w->line.len = 0;
    if (results_format(w, line, &w->line)) return err_set(err, "%s: out of memory formatting a result", w->path);
    return results_write_raw(w, w->line.data, w->line.len, err);
}

/* ------------------------------------------------------------ resume scan */

/* The scan reads an output file as lines. on_line sees each complete line;
 * on_commit says that every line seen so far lies in the durable part of the
 * file (a plain file: up to its last '\n'; .gz: up to the end of the last
 * complete gzip member, since a cut member cannot be read past). */
typedef struct {
    int (*on_line)(void *ctx, const char *line, size_t len, Err *err);
    void (*on_commit)(void *ctx);
    void *ctx;
} ScanSink;

typedef struct {
    int64_t size, valid_end; /* bytes in the file; bytes worth keeping */
    bool open_line;          /* the kept part ends inside a line */
} ScanResult;

typedef struct {
    JsonBuf line;  /* the current line so far */
    bool overflow; /* the current line went past RESUME_MAX_LINE */
} LineAcc;

static int acc_append(LineAcc *a, const char *s, size_t n) {
    if (a->overflow) return 0;
    if (a->line.len + n > RESUME_MAX_LINE) { a->overflow = true; return 0; }
    return textbuf_append(&a->line, s, n);
}

/* Feeds bytes; calls on_line for each line completed. *last_nl gets the
 * offset in data just past the last '\n' (0 when none). */
static int acc_feed(LineAcc *a, const char *data, size_t n, ScanSink *sink, size_t *last_nl, const char *path,
                    Err *err) {
    size_t start = 0;
    *last_nl = 0;
    for (;;) {
        const char *nl = memchr(data + start, '\n', n - start);
        if (!nl) break;
        size_t k = (size_t)(nl - data);
        if (acc_append(a, data + start, k - start)) return err_set(err, "%s: out of memory reading a line", path);
        if (!a->overflow && sink->on_line(sink->ctx, a->line.data ? a->line.data : "", a->line.len, err)) return -1;
        a->line.len = 0;
        a->overflow = false;
        start = k + 1;
        *last_nl = start;
    }
    if (acc_append(a, data + start, n - start)) return err_set(err, "%s: out of memory reading a line", path);
    return 0;
}

typedef struct {
    int fd;
    const char *path;
    char *chunk;
    size_t csize;
    LineAcc acc;
} ScanIn;

static int scan_plain(ScanIn *in, ScanSink *sink, ScanResult *res, Err *err) {
    int64_t off = 0;
    for (;;) {
        ssize_t n = read(in->fd, in->chunk, in->csize);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return err_set(err, "%s: read failed: %s", in->path, strerror(errno));
        if (n == 0) break;
        size_t last_nl;
        if (acc_feed(&in->acc, in->chunk, (size_t)n, sink, &last_nl, in->path, err)) return -1;
        if (last_nl) {
            sink->on_commit(sink->ctx);
            res->valid_end = off + (int64_t)last_nl;
        }
        off += n;
    }
    res->size = off;
    return 0;
}

/* Inflates member after member; commits at each member's end. A member that
 * is cut short or corrupt ends the scan: the file is kept up to before it. */
static int scan_gz(ScanIn *in, ScanSink *sink, ScanResult *res, Err *err) {
    z_stream zs = {0};
    unsigned char out[64 << 10];
    int64_t consumed = 0;
    bool at_eof = false, out_full = false;
    if (inflateInit2(&zs, 15 + 16) != Z_OK) return err_set(err, "%s: cannot start gzip decompression", in->path);
    int rc = 0;
    for (;;) {
        if (zs.avail_in == 0 && !at_eof) {
            ssize_t n = read(in->fd, in->chunk, in->csize);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) { rc = err_set(err, "%s: read failed: %s", in->path, strerror(errno)); break; }
            at_eof = n == 0;
            zs.next_in = (unsigned char *)in->chunk;
            zs.avail_in = (uInt)n;
            res->size += n;
        }
        /* At the end of the input inflate may still hold output for a full buffer. */
        if (zs.avail_in == 0 && at_eof && !out_full) break;
        uInt before = zs.avail_in;
        zs.next_out = out;
        zs.avail_out = sizeof out;
        int z = inflate(&zs, Z_NO_FLUSH);
        consumed += before - zs.avail_in;
        out_full = zs.avail_out == 0;
        size_t last_nl;
        if ((z == Z_OK || z == Z_STREAM_END || z == Z_BUF_ERROR) &&
            acc_feed(&in->acc, (const char *)out, sizeof out - zs.avail_out, sink, &last_nl, in->path, err)) {
            rc = -1;
            break;
        }
        if (z == Z_STREAM_END) {
            sink->on_commit(sink->ctx);
            res->valid_end = consumed;
            res->open_line = in->acc.line.len > 0 || in->acc.overflow;
            inflateReset(&zs);
        } else if (z != Z_OK && !(z == Z_BUF_ERROR && zs.avail_in == 0)) break; /* corrupt: stop here */
    }
    inflateEnd(&zs);
    return rc;
}

/* Scans the output at path (must exist). gz by name; the content must agree. */
static int scan_output(const char *path, bool gz, ScanSink *sink, ScanResult *res, Err *err) {
    memset(res, 0, sizeof *res);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: cannot read the output to resume: %s", path, strerror(errno));
    ScanIn in = {.fd = fd, .path = path, .chunk = malloc(1 << 20), .csize = 1 << 20};
    unsigned char magic[2];
    ssize_t m = pread(fd, magic, 2, 0);
    bool is_gz = m == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    int rc;
    if (!in.chunk) rc = err_set(err, "%s: out of memory", path);
    else if (m > 0 && is_gz != gz)
        rc = err_set(err, "%s: the name says %s but the content is %s; refusing to append", path,
                     gz ? "gzip (.gz)" : "plain text", is_gz ? "gzip" : "not gzip");
    else rc = (gz ? scan_gz : scan_plain)(&in, sink, res, err);
    jsonbuf_free(&in.acc.line);
    free(in.chunk);
    close(fd);
    return rc;
}

/* Collects done ids. Ids of lines not yet committed wait in pend. */
typedef struct {
    const char *path, *key;
    PromptFormat fmt;
    bool retry_errors;
    IdSet *done;
    char **pend;
    bool *pend_failed;
    size_t n_pend, cap_pend;
    ResultResume *info;
    bool oom;
} DoneScan;

/* Whether a parsed output line records a failed request. */
static bool line_failed(const JsonValue *o, PromptFormat fmt) {
    const JsonValue *e = json_get(o, "error");
    if (e && e->type != JSON_NULL) return true;
    if (fmt != PROMPTS_OPENAI) return false;
    const JsonValue *r = json_get(o, "response");
    return !r || r->type != JSON_OBJECT || json_get_int(r, "status_code", 0) != 200;
}

static int done_on_line(void *ctx, const char *line, size_t len, Err *err) {
    DoneScan *d = ctx;
    Err perr;
    Json *doc = json_parse(line, len, d->path, &perr);
    const JsonValue *o = doc ? json_root(doc) : NULL;
    if (!o || o->type != JSON_OBJECT) {
        d->info->unreadable++;
        json_free(doc);
        return 0;
    }
    bool is_num;
    char *id = prompts_id_text(o, d->key, line, len, &is_num);
    bool other_shape = d->fmt == PROMPTS_OPENAI ? !json_get(o, "custom_id") && json_get(o, "text")
                                                : json_get(o, "custom_id") && json_get(o, "response");
    bool failed = line_failed(o, d->fmt);
    json_free(doc);
    if (other_shape || !id) {
        free(id);
        return err_set(err, "%s: a line has no '%s'%s; resume with the input format that wrote this output",
                       d->path, d->key, other_shape ? " (it was written for another input format)" : "");
    }
    if (d->n_pend == d->cap_pend) {
        size_t cap = d->cap_pend ? d->cap_pend * 2 : 16;
        char **p = realloc(d->pend, cap * sizeof *p);
        if (p) d->pend = p;
        bool *f = p ? realloc(d->pend_failed, cap * sizeof *f) : NULL;
        if (f) d->pend_failed = f;
        if (!p || !f) { free(id); return err_set(err, "%s: out of memory", d->path); }
        d->cap_pend = cap;
    }
    d->pend[d->n_pend] = id;
    d->pend_failed[d->n_pend++] = failed;
    return 0;
}

static void done_on_commit(void *ctx) {
    DoneScan *d = ctx;
    for (size_t i = 0; i < d->n_pend; i++) {
        d->info->lines++;
        d->info->failed += d->pend_failed[i];
        int64_t count;
        if ((!d->pend_failed[i] || !d->retry_errors) && id_set_bump(d->done, d->pend[i], &count)) d->oom = true;
        free(d->pend[i]);
    }
    d->n_pend = 0;
}

static int done_scan(const char *path, PromptFormat fmt, bool retry_errors, IdSet *done, ResultResume *info,
                     ScanResult *res, Err *err) {
    DoneScan d = {path, fmt == PROMPTS_OPENAI ? "custom_id" : "id", fmt, retry_errors, done, NULL, NULL, 0, 0,
                  info, false};
    ScanSink sink = {done_on_line, done_on_commit, &d};
    int rc = scan_output(path, path_is_gz(path), &sink, res, err);
    for (size_t i = 0; i < d.n_pend; i++) free(d.pend[i]);
    free(d.pend);
    free(d.pend_failed);
    if (!rc && d.oom) rc = err_set(err, "%s: out of memory collecting done ids", path);
    return rc;
}

int results_done_ids(const char *path, PromptFormat fmt, bool retry_errors, IdSet *done, Err *err) {
    ResultResume info = {0};
    ScanResult res;
    if (access(path, F_OK)) return 0;
    return done_scan(path, fmt, retry_errors, done, &info, &res, err);
}

/* ---------------------------------------------------------------- rewrite */

/* retry_errors: copies every line but those of failed requests to a new file
 * and renames it over the old one, so a retried id keeps one line. */
typedef struct {
    ResultWriter *out;
    PromptFormat fmt;
} Rewrite;

static int rewrite_on_line(void *ctx, const char *line, size_t len, Err *err) {
    Rewrite *rw = ctx;
    Err perr;
    Json *doc = json_parse(line, len, "output", &perr);
    bool drop = doc && json_root(doc)->type == JSON_OBJECT && line_failed(json_root(doc), rw->fmt);
    json_free(doc);
    if (drop) return 0;
    /* The line and its '\n' as one write (one member for .gz). */
    JsonBuf *b = &rw->out->line;
    b->len = 0;
    if (textbuf_append(b, line, len) || textbuf_append(b, "\n", 1))
        return err_set(err, "%s: out of memory rewriting the output", rw->out->path);
    return results_write_raw(rw->out, b->data, b->len, err);
}

static void rewrite_on_commit(void *ctx) { (void)ctx; }

static int open_fd(ResultWriter *w, int flags, Err *err);

static int rewrite_without_failed(ResultWriter *w, Err *err) {
    size_t n = strlen(w->path) + 16;
    char *tmp = malloc(n);
    if (!tmp) return err_set(err, "%s: out of memory", w->path);
    snprintf(tmp, n, "%s.resume-tmp", w->path);
    ResultWriter out = {.fd = -1, .path = tmp, .gz = w->gz, .fmt = w->fmt};
    Rewrite rw = {&out, w->fmt};
    ScanSink sink = {rewrite_on_line, rewrite_on_commit, &rw};
    ScanResult res;
    int rc = open_fd(&out, O_CREAT | O_TRUNC, err);
    if (!rc) rc = scan_output(w->path, w->gz, &sink, &res, err);
    if (!rc && fsync(out.fd)) rc = err_set(err, "%s: fsync failed: %s", tmp, strerror(errno));
    if (out.fd >= 0 && close(out.fd) && !rc) rc = err_set(err, "%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, w->path)) rc = err_set(err, "%s: cannot replace it: %s", w->path, strerror(errno));
    if (rc) unlink(tmp);
    if (out.zs_ready) deflateEnd(&out.zs);
    free(out.zbuf);
    jsonbuf_free(&out.line);
    free(tmp);
    return rc;
}

/* ------------------------------------------------------------ open/close */

/* path made absolute with its links resolved; a path that does not exist
 * yet: its folder resolved and its name appended. NULL when neither works. */
static char *canonical_path(const char *path) {
    char *full = realpath(path, NULL);
    if (full || errno != ENOENT) return full;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    char *rdir = dir ? realpath(dir, NULL) : NULL;
    free(dir);
    if (!rdir || !*name) { free(rdir); return NULL; }
    size_t n = strlen(rdir) + strlen(name) + 2;
    if ((full = malloc(n))) snprintf(full, n, "%s/%s", strcmp(rdir, "/") ? rdir : "", name);
    free(rdir);
    return full;
}

int results_check_not_input(const char *out, const char *in, Err *err) {
    struct stat si, so;
    bool in_std = !strcmp(in, "-"), out_std = !strcmp(out, "-");
    if (in_std && out_std) return 0;
    if ((in_std ? fstat(0, &si) : stat(in, &si)) || !S_ISREG(si.st_mode)) return 0; /* prompts_open says why */
    bool same = false;
    if (!(out_std ? fstat(1, &so) : stat(out, &so))) same = si.st_dev == so.st_dev && si.st_ino == so.st_ino;
    else if (!in_std) {
        char *a = canonical_path(in), *b = canonical_path(out);
        same = a && b && !strcmp(a, b);
        free(a);
        free(b);
    }
    if (!same) return 0;
    return err_set(err, "the output %s is the input %s (the same file%s): writing results would destroy the prompts; "
                        "give another output file", out_std ? "(stdout)" : out, in_std ? "(stdin)" : in,
                   in_std || out_std ? ", redirected" : "");
}

int results_check_overwrite(const char *out, Err *err) {
    struct stat st;
    if (!strcmp(out, "-") || stat(out, &st) || !S_ISREG(st.st_mode) || st.st_size == 0) return 0;
    return err_set(err, "the output %s already holds %lld bytes of results; add --resume to keep them and run only "
                        "the prompts it lacks, or --overwrite to replace it", out, (long long)st.st_size);
}

static int open_fd(ResultWriter *w, int flags, Err *err) {
    w->fd = open(w->path, O_WRONLY | O_APPEND | O_CLOEXEC | flags, 0644);
    if (w->fd < 0) return err_set(err, "%s: cannot open the output: %s", w->path, strerror(errno));
    return 0;
}

/* Resume: scan, cut the partial tail, drop failed lines when retrying. */
static int writer_resume(ResultWriter *w, bool retry_errors, Err *err) {
    struct stat st;
    if (!(w->done = id_set_new())) return err_set(err, "%s: out of memory", w->path);
    if (stat(w->path, &st)) return errno == ENOENT ? open_fd(w, O_CREAT, err)
                                                   : err_set(err, "%s: %s", w->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return err_set(err, "%s: can only resume into a regular file", w->path);
    ScanResult res;
    if (done_scan(w->path, w->fmt, retry_errors, w->done, &w->info, &res, err)) return -1;
    w->info.bytes_dropped = res.size - res.valid_end;
    if (w->info.bytes_dropped > RESUME_MAX_DROP)
        return err_set(err, "%s: the last %lld bytes do not form complete %s; that is more than a cut-off write, so "
                            "the file is left as it is (check it, or write to a new file)",
                       w->path, (long long)w->info.bytes_dropped, w->gz ? "gzip members" : "lines");
    if (w->info.bytes_dropped > 0 && truncate(w->path, res.valid_end))
        return err_set(err, "%s: cannot cut the partial last line: %s", w->path, strerror(errno));
    w->need_newline = res.open_line;
    if (retry_errors && w->info.failed > 0) {
        if (rewrite_without_failed(w, err)) return -1;
        w->info.rewritten = true;
        w->need_newline = false;
    }
    return open_fd(w, 0, err);
}

ResultWriter *results_open(const char *path, PromptFormat fmt, bool resume, bool retry_errors, Err *err) {
    ResultWriter *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        err_set(err, "%s: out of memory", path);
        return NULL;
    }
    w->fd = -1;
    w->fmt = fmt;
    w->tag = (uint32_t)time(NULL) * 2654435761u ^ (uint32_t)getpid() ^ (uint32_t)(uintptr_t)w;
    w->is_stdout = !strcmp(path, "-");
    w->gz = !w->is_stdout && path_is_gz(path);
    int rc;
    if (w->is_stdout) {
        rc = resume ? err_set(err, "--resume needs an output file, not stdout") : 0;
        w->fd = 1;
    } else rc = resume ? writer_resume(w, retry_errors, err) : open_fd(w, O_CREAT | O_TRUNC, err);
    if (rc) {
        w->is_stdout = true; /* nothing of ours to sync */
        results_close(w);
        return NULL;
    }
    return w;
}

bool results_is_done(const ResultWriter *w, const char *id) { return w->done && id_set_has(w->done, id); }

int64_t results_done_count(const ResultWriter *w, const char *id) {
    int64_t n = w->done ? id_set_get(w->done, id) : -1;
    return n > 0 ? n : 0;
}
const IdSet *results_done(const ResultWriter *w) { return w->done; }
ResultResume results_resume_info(const ResultWriter *w) { return w->info; }

int results_finish(ResultWriter *w, Err *err) {
    if (!w) return 0;
    int rc = 0;
    if (!w->is_stdout && w->fd >= 0) {
        if (fsync(w->fd) && errno != EINVAL) rc = err_set(err, "%s: fsync failed: %s", w->path, strerror(errno));
        if (close(w->fd) && !rc) rc = err_set(err, "%s: close failed: %s", w->path, strerror(errno));
    } else if (w->is_stdout && w->fd >= 0 && w->fd != 1) close(w->fd);
    if (w->zs_ready) deflateEnd(&w->zs);
    free(w->zbuf);
    jsonbuf_free(&w->line);
    id_set_free(w->done);
    free(w->path);
    free(w);
    return rc;
}

void results_close(ResultWriter *w) { results_finish(w, NULL); }

/* ------------------------------------------------------- reorder buffer */

enum { SLOT_EMPTY, SLOT_LINE, SLOT_SKIP };
#define ORDER_MAX_AHEAD ((int64_t)1 << 24) /* results held at most this far ahead */

typedef struct {
    char *bytes;
    size_t len;
    int state;
} OrderSlot;

struct ResultOrder {
    ResultWriter *w;
    int64_t next;     /* lowest index not yet written */
    OrderSlot *ring;  /* index i lives at ring[i & (cap - 1)], next <= i < next + cap */
    size_t cap, held;
};

ResultOrder *results_ordered_new(ResultWriter *w, int64_t first_index) {
    ResultOrder *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->w = w;
    o->next = first_index;
    o->cap = 64;
    if (!(o->ring = calloc(o->cap, sizeof *o->ring))) { free(o); return NULL; }
    return o;
}

static int order_grow(ResultOrder *o, int64_t index, Err *err) {
    size_t cap = o->cap;
    while ((int64_t)cap <= index - o->next) cap *= 2;
    OrderSlot *ring = calloc(cap, sizeof *ring);
    if (!ring) return err_set(err, "%s: out of memory holding results for --ordered", o->w->path);
    for (int64_t i = o->next; i < o->next + (int64_t)o->cap; i++)
        ring[(size_t)i & (cap - 1)] = o->ring[(size_t)i & (o->cap - 1)];
    free(o->ring);
    o->ring = ring;
    o->cap = cap;
    return 0;
}

/* Writes the results that are now next in line. */
static int order_drain(ResultOrder *o, Err *err) {
    for (;;) {
        OrderSlot *s = &o->ring[(size_t)o->next & (o->cap - 1)];
        if (s->state == SLOT_EMPTY) return 0;
        int rc = s->state == SLOT_LINE ? results_write_raw(o->w, s->bytes, s->len, err) : 0;
        if (s->state == SLOT_LINE) o->held--;
        free(s->bytes);
        *s = (OrderSlot){0};
        o->next++;
        if (rc) return -1;
    }
}

static OrderSlot *order_slot(ResultOrder *o, int64_t index, Err *err) {
    if (index < o->next) {
        err_set(err, "%s: result %lld given after it was written or skipped", o->w->path, (long long)index);
        return NULL;
    }
    if (index - o->next >= ORDER_MAX_AHEAD) {
        err_set(err, "%s: result %lld is more than %lld ahead of the oldest unfinished one (%lld)", o->w->path,
                (long long)index, (long long)ORDER_MAX_AHEAD, (long long)o->next);
        return NULL;
    }
    if (index - o->next >= (int64_t)o->cap && order_grow(o, index, err)) return NULL;
    OrderSlot *s = &o->ring[(size_t)index & (o->cap - 1)];
    if (s->state != SLOT_EMPTY) {
        err_set(err, "%s: result %lld given twice", o->w->path, (long long)index);
        return NULL;
    }
    return s;
}

int results_ordered_put(ResultOrder *o, int64_t index, const ResultLine *line, Err *err) {
    OrderSlot *s = order_slot(o, index, err);
    if (!s) return -1;
    JsonBuf b = {0};
    if (results_format(o->w, line, &b)) {
        jsonbuf_free(&b);
        return err_set(err, "%s: out of memory formatting a result", o->w->path);
    }
    *s = (OrderSlot){b.data, b.len, SLOT_LINE};
    o->held++;
    return order_drain(o, err);
}

int results_ordered_skip(ResultOrder *o, int64_t index, Err *err) {
    OrderSlot *s = order_slot(o, index, err);
    if (!s) return -1;
    s->state = SLOT_SKIP;
    return order_drain(o, err);
}

size_t results_ordered_pending(const ResultOrder *o) { return o->held; }
int64_t results_ordered_next(const ResultOrder *o) { return o->next; }

int results_ordered_finish(ResultOrder *o, int64_t *gaps, Err *err) {
    int64_t missing = 0;
    while (o->held > 0) {
        OrderSlot *s = &o->ring[(size_t)o->next & (o->cap - 1)];
        if (s->state == SLOT_EMPTY) {
            missing++;
            o->next++;
            continue;
        }
        if (order_drain(o, err)) return -1;
    }
    if (gaps) *gaps = missing;
    return 0;
}

void results_ordered_free(ResultOrder *o) {
    if (!o) return;
    for (size_t i = 0; i < o->cap; i++) free(o->ring[i].bytes);
    free(o->ring);
    free(o);
}
