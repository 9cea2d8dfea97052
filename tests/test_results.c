/* test_results.c — the result writer: both output shapes parsed back with
 * the JSON reader, escaping and U+FFFD replacement against Python
 * (tests/fixtures/prompts/utf8.json), resume after a half line / a cut gzip
 * member / failed lines / another format, a .gz output left by a process
 * that exits without closing, stdout, and the --ordered reorder buffer.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "app/results.h"
#include "base/json.h"
#include "tests/test.h"

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

/* The lines of a file (plain or gzip, read with gzread as any reader
 * would). *clean: every byte read without a zlib error and the file ends in
 * a newline. */
typedef struct {
    char **line;
    size_t n;
    bool clean;
} Lines;

static Lines read_lines(const char *path) {
    Lines L = {NULL, 0, false};
    gzFile g = gzopen(path, "rb");
    if (!g) return L;
    size_t len = 0, cap = 1 << 16;
    char *b = malloc(cap);
    int n;
    while ((n = gzread(g, b + len, (unsigned)(cap - len))) > 0) {
        len += (size_t)n;
        if (len == cap) b = realloc(b, cap *= 2);
    }
    int code;
    gzerror(g, &code);
    L.clean = n == 0 && code == Z_OK && (len == 0 || b[len - 1] == '\n');
    gzclose(g);
    L.line = calloc(len + 1, sizeof *L.line);
    for (size_t s = 0; s < len;) {
        char *nl = memchr(b + s, '\n', len - s);
        size_t e = nl ? (size_t)(nl - b) : len;
        L.line[L.n++] = strndup(b + s, e - s);
        s = e + 1;
    }
    free(b);
    return L;
}

static void lines_free(Lines *L) {
    for (size_t i = 0; i < L->n; i++) free(L->line[i]);
    free(L->line);
}

static Json *parse_line(const char *s) {
    Err err;
    return s ? json_parse(s, strlen(s), "output line", &err) : NULL;
}

static bool has_str(const JsonValue *o, const char *key, const char *want) {
    const char *s = json_get_str(o, key, NULL);
    return s && !strcmp(s, want);
}

static ResultWriter *open_or_fail(const char *path, PromptFormat fmt, bool resume, bool retry) {
    Err err = {{0}};
    ResultWriter *w = results_open(path, fmt, resume, retry, &err);
    CHECK(w, "open %s: %s", path, err.msg);
    return w;
}

static void write_or_fail(ResultWriter *w, const ResultLine *l) {
    Err err = {{0}};
    CHECK(results_write(w, l, &err) == 0, "write: %s", err.msg);
}

static void finish_or_fail(ResultWriter *w) {
    Err err = {{0}};
    CHECK(results_finish(w, &err) == 0, "finish: %s", err.msg);
}

/* Writes n simple successful lines with ids prefix0, prefix1, ... */
static void write_n(ResultWriter *w, const char *prefix, int from, int n);

/* A fresh output file holding n lines prefix0.. */
static bool make_output(const char *path, PromptFormat fmt, const char *prefix, int n) {
    ResultWriter *w = open_or_fail(path, fmt, false, false);
    if (!w) return false;
    write_n(w, prefix, 0, n);
    finish_or_fail(w);
    return true;
}

static void write_n(ResultWriter *w, const char *prefix, int from, int n) {
    char id[64];
    for (int i = from; i < from + n; i++) {
        snprintf(id, sizeof id, "%s%d", prefix, i);
        ResultLine l = {.id = id, .text = "answer", .prompt_tokens = 3, .completion_tokens = 1, .seconds = 0.5};
        write_or_fail(w, &l);
    }
}

/* Writes lines[0..n) to a fresh file, reads it back and parses each line
 * into d[i]. Returns whether every line came back and parsed. */
static bool write_and_parse(const char *path, PromptFormat fmt, const ResultLine *lines, size_t n, Json **d,
                            Lines *L) {
    ResultWriter *w = open_or_fail(path, fmt, false, false);
    if (!w) return false;
    for (size_t i = 0; i < n; i++) write_or_fail(w, &lines[i]);
    finish_or_fail(w);
    *L = read_lines(path);
    CHECK(L->n == n && L->clean, "%zu lines, want %zu", L->n, n);
    bool all = L->n == n;
    for (size_t i = 0; i < n; i++) {
        d[i] = parse_line(i < L->n ? L->line[i] : NULL);
        CHECK(d[i], "line %zu does not parse: %s", i, i < L->n ? L->line[i] : "(missing)");
        all &= d[i] != NULL;
    }
    return all;
}

static void test_jsonl_shape(void) {
    ResultLine ok = {.id = "q1", .text = "Hello", .prompt_tokens = 12, .completion_tokens = 5,
                     .finish_reason = "length", .seconds = 1.23456};
    ResultLine num = {.id = "1.50", .id_is_number = true, .text = "n", .completion_tokens = 1};
    ResultLine bad_num = {.id = "1.5.0", .id_is_number = true, .text = "x"}; /* not a number: quoted */
    ResultLine fail = {.id = "q3", .error = "line 3: field 'prompt' must not be empty"};
    ResultLine lines[] = {ok, num, bad_num, fail};
    Json *d[4] = {0};
    Lines L;
    if (write_and_parse(tmp_path("a.jsonl"), PROMPTS_JSONL, lines, 4, d, &L)) {
        const JsonValue *o = json_root(d[0]);
        CHECK(has_str(o, "id", "q1") && has_str(o, "text", "Hello") && json_get_int(o, "prompt_tokens", -1) == 12 &&
                  json_get_int(o, "completion_tokens", -1) == 5 && has_str(o, "finish_reason", "length") &&
                  fabs(json_get_num(o, "seconds", -1) - 1.235) < 1e-9 && !json_get(o, "error"),
              "line 1: %s", L.line[0]);
        CHECK(strstr(L.line[1], "\"id\":1.50,") && json_get(json_root(d[1]), "id")->type == JSON_NUMBER &&
                  has_str(json_root(d[1]), "finish_reason", "stop"),
              "numeric id written as given: %s", L.line[1]);
        CHECK(has_str(json_root(d[2]), "id", "1.5.0"), "a bad number id is quoted: %s", L.line[2]);
        o = json_root(d[3]);
        CHECK(has_str(o, "error", fail.error) && has_str(o, "finish_reason", "error") && has_str(o, "text", ""),
              "failed line: %s", L.line[3]);
    }
    for (int i = 0; i < 4; i++) json_free(d[i]);
    lines_free(&L);
}

static void test_openai_shape(void) {
    ResultLine chat = {.id = "r1", .text = "Hi there", .prompt_tokens = 9, .completion_tokens = 3,
                       .finish_reason = "stop", .is_chat = true, .model = "m1"};
    ResultLine comp = {.id = "42", .id_is_number = true, .text = " a time", .prompt_tokens = 2,
                       .completion_tokens = 2, .finish_reason = "context"};
    ResultLine fail = {.id = "r3", .error = "line 3: field 'method' must be \"POST\" (got 'GET')", .is_chat = true};
    ResultLine lines[] = {chat, comp, fail};
    Json *d[3] = {0};
    Lines L;
    if (write_and_parse(tmp_path("o.jsonl"), PROMPTS_OPENAI, lines, 3, d, &L)) {
        const JsonValue *o = json_root(d[0]), *resp = json_get(o, "response"), *body = json_get(resp, "body");
        const JsonValue *ch = json_at(json_get(body, "choices"), 0), *usage = json_get(body, "usage");
        const char *bid = json_get_str(o, "id", "");
        CHECK(!strncmp(bid, "batch_req_", 10) && strlen(bid) > 20 && has_str(o, "custom_id", "r1") &&
                  json_get(o, "error") && json_get(o, "error")->type == JSON_NULL,
              "envelope: %s", L.line[0]);
        CHECK(json_get_int(resp, "status_code", 0) == 200 && has_str(body, "object", "chat.completion") &&
                  has_str(body, "model", "m1") && json_get_int(ch, "index", -1) == 0 &&
                  has_str(json_get(ch, "message"), "role", "assistant") &&
                  has_str(json_get(ch, "message"), "content", "Hi there") && has_str(ch, "finish_reason", "stop"),
              "chat body: %s", L.line[0]);
        CHECK(json_get_int(usage, "prompt_tokens", 0) == 9 && json_get_int(usage, "completion_tokens", 0) == 3 &&
                  json_get_int(usage, "total_tokens", 0) == 12, "usage");
        o = json_root(d[1]);
        body = json_get(json_get(o, "response"), "body");
        ch = json_at(json_get(body, "choices"), 0);
        CHECK(json_get(o, "custom_id")->type == JSON_NUMBER && json_get_int(o, "custom_id", 0) == 42 &&
                  has_str(body, "object", "text_completion") && has_str(ch, "text", " a time") &&
                  has_str(ch, "finish_reason", "length") && strcmp(json_get_str(o, "id", ""), bid),
              "completion: %s", L.line[1]);
        o = json_root(d[2]);
        CHECK(json_get(o, "response") && json_get(o, "response")->type == JSON_NULL &&
                  has_str(json_get(o, "error"), "message", fail.error) && has_str(o, "custom_id", "r3"),
              "failed: %s", L.line[2]);
    }
    for (int i = 0; i < 3; i++) json_free(d[i]);
    lines_free(&L);
}

/* Model text with quotes, controls, NUL and invalid UTF-8: the line must be
 * one line of valid JSON whose text is Python's decode(errors="replace"). */
static void test_escaping(void) {
    char fx[512];
    snprintf(fx, sizeof fx, "%s/prompts/utf8.json", test_fixture_dir());
    Err err;
    Json *doc = json_parse_file(fx, &err);
    CHECK(doc, "%s", err.msg);
    if (!doc) return;
    const JsonValue *cases = json_root(doc);
    size_t n = json_len(cases);
    ResultWriter *w = open_or_fail(tmp_path("esc.jsonl.gz"), PROMPTS_JSONL, false, false);
    for (size_t i = 0; w && i < n; i++) {
        const char *hex = json_get_str(json_at(cases, i), "hex", "");
        size_t len = strlen(hex) / 2;
        char *b = malloc(len + 1), id[32];
        for (size_t j = 0; j < len; j++) sscanf(hex + 2 * j, "%2hhx", (unsigned char *)&b[j]);
        snprintf(id, sizeof id, "e\"%zu\n", i);
        ResultLine l = {.id = id, .text = b, .text_len = len, .error = i == 2 ? b : NULL};
        if (i == 2) b[len] = 0;
        write_or_fail(w, &l);
        free(b);
    }
    finish_or_fail(w);
    Lines L = read_lines(tmp_path("esc.jsonl.gz"));
    CHECK(L.n == n && L.clean, "%zu lines for %zu cases", L.n, n);
    for (size_t i = 0; i < L.n && i < n; i++) {
        const JsonValue *want = json_get(json_at(cases, i), "text");
        bool raw_ctl = false;
        for (const char *c = L.line[i]; *c; c++) raw_ctl |= (unsigned char)*c < 0x20;
        Json *d = parse_line(L.line[i]);
        const JsonValue *t = d ? json_get(json_root(d), "text") : NULL;
        char id[32];
        snprintf(id, sizeof id, "e\"%zu\n", i);
        CHECK(!raw_ctl && t && t->u.string.len == want->u.string.len &&
                  !memcmp(t->u.string.s, want->u.string.s, want->u.string.len) && has_str(json_root(d), "id", id),
              "case %zu: %s", i, L.line[i]);
        if (i == 2) CHECK(d && has_str(json_root(d), "error", "\xEF\xBF\xBD"), "error text replaced too");
        json_free(d);
    }
    lines_free(&L);
    json_free(doc);
}

/* A run killed in the middle of a line: resume cuts the half line, its id is
 * not done, and the next line starts on a fresh line. */
static void test_resume_half_line(void) {
    const char *path = tmp_path("r.jsonl");
    if (!make_output(path, PROMPTS_JSONL, "id", 3)) return;
    const char *half = "{\"id\":\"half\",\"text\":\"cut he";
    int fd = open(path, O_WRONLY | O_APPEND);
    CHECK(write(fd, half, strlen(half)) == (ssize_t)strlen(half), "append");
    close(fd);
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, true, false);
    if (!w) return;
    ResultResume info = results_resume_info(w);
    CHECK(info.lines == 3 && info.bytes_dropped == (int64_t)strlen(half) && info.failed == 0, "lines %lld dropped %lld",
          (long long)info.lines, (long long)info.bytes_dropped);
    CHECK(results_is_done(w, "id0") && results_is_done(w, "id2") && !results_is_done(w, "half") &&
              !results_is_done(w, "id3") && id_set_count(results_done(w)) == 3, "done set");
    ResultLine l = {.id = "half", .text = "whole now"};
    write_or_fail(w, &l);
    finish_or_fail(w);
    Lines L = read_lines(path);
    CHECK(L.n == 4 && L.clean, "%zu lines", L.n);
    for (size_t i = 0; i < L.n; i++) {
        Json *d = parse_line(L.line[i]);
        CHECK(d, "line %zu does not parse: %s", i, L.line[i]);
        json_free(d);
    }
    CHECK(L.n == 4 && strstr(L.line[3], "whole now"), "last line %s", L.n ? L.line[L.n - 1] : "");
    lines_free(&L);
    /* The scan on its own agrees and cuts nothing. */
    IdSet *s = id_set_new();
    Err err;
    CHECK(results_done_ids(path, PROMPTS_JSONL, false, s, &err) == 0 && id_set_count(s) == 4 && id_set_has(s, "half"),
          "done ids: %zu", id_set_count(s));
    id_set_free(s);
}

/* Failed lines: done unless retry_errors; with it, they leave the file. */
static void test_resume_failed_lines(void) {
    const char *path = tmp_path("f.jsonl");
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, false, false);
    if (!w) return;
    write_n(w, "ok", 0, 2);
    ResultLine f = {.id = "bad", .error = "out of memory"};
    write_or_fail(w, &f);
    write_n(w, "ok", 2, 1);
    finish_or_fail(w);
    w = open_or_fail(path, PROMPTS_JSONL, true, false);
    if (!w) return;
    CHECK(results_is_done(w, "bad") && results_resume_info(w).failed == 1 && !results_resume_info(w).rewritten,
          "a failed line is done by default");
    finish_or_fail(w);
    w = open_or_fail(path, PROMPTS_JSONL, true, true);
    if (!w) return;
    CHECK(!results_is_done(w, "bad") && results_is_done(w, "ok2") && results_resume_info(w).rewritten,
          "retry_errors: not done");
    ResultLine again = {.id = "bad", .text = "fine now"};
    write_or_fail(w, &again);
    finish_or_fail(w);
    Lines L = read_lines(path);
    int n_bad = 0;
    for (size_t i = 0; i < L.n; i++) n_bad += strstr(L.line[i], "\"id\":\"bad\"") != NULL;
    CHECK(L.n == 4 && L.clean && n_bad == 1 && strstr(L.line[3], "fine now"), "%zu lines, %d for 'bad'", L.n, n_bad);
    lines_free(&L);
    struct stat st;
    CHECK(stat(tmp_path("f.jsonl.resume-tmp"), &st) != 0, "temporary file left behind");
}

/* An id written twice (a request and its duplicate's error line): resume
 * counts the lines, so the k-th request with the id is done only when k
 * lines hold it; with retry_errors the error line is not counted. */
static void test_resume_counts_lines(void) {
    const char *path = tmp_path("d.jsonl");
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, false, false);
    if (!w) return;
    ResultLine x = {.id = "x", .text = "result"}, dup = {.id = "x", .error = "line 3: duplicate id 'x'"};
    ResultLine y = {.id = "y", .text = "result"};
    write_or_fail(w, &x);
    write_or_fail(w, &dup);
    write_or_fail(w, &y);
    finish_or_fail(w);
    w = open_or_fail(path, PROMPTS_JSONL, true, false);
    if (!w) return;
    CHECK(results_done_count(w, "x") == 2 && results_done_count(w, "y") == 1 && results_done_count(w, "z") == 0,
          "counts x %lld y %lld z %lld", (long long)results_done_count(w, "x"), (long long)results_done_count(w, "y"),
          (long long)results_done_count(w, "z"));
    finish_or_fail(w);
    w = open_or_fail(path, PROMPTS_JSONL, true, true);
    if (!w) return;
    CHECK(results_done_count(w, "x") == 1, "retry_errors: x counted %lld times", (long long)results_done_count(w, "x"));
    finish_or_fail(w);
}

/* .gz output of a process that dies without closing: every line written
 * must read back; then a cut member at the end is removed by resume. */
static void test_gz_abrupt_exit(void) {
    const char *path = tmp_path("k.jsonl.gz");
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, false, false);
    if (!w) return;
    write_n(w, "p", 0, 5);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        write_n(w, "c", 0, 2);
        _exit(0); /* no close, no flush, no atexit */
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status), "child");
    results_close(w); /* the parent's copy; writes nothing more */
    Lines L = read_lines(path);
    CHECK(L.n == 7 && L.clean, "%zu lines after the child died", L.n);
    CHECK(L.n == 7 && strstr(L.line[6], "\"c1\""), "last line %s", L.n ? L.line[L.n - 1] : "");
    lines_free(&L);
    /* A member cut in the middle (killed during a write). */
    gzFile g = gzopen(tmp_path("member.gz"), "wb");
    gzputs(g, "{\"id\":\"cut\",\"text\":\"a line whose member is cut short\"}\n");
    gzclose(g);
    int in = open(tmp_path("member.gz"), O_RDONLY), out = open(path, O_WRONLY | O_APPEND);
    char buf[256];
    ssize_t n = read(in, buf, sizeof buf);
    CHECK(n > 20 && write(out, buf, (size_t)n - 10) == n - 10, "append a cut member");
    close(in);
    close(out);
    L = read_lines(path);
    CHECK(!L.clean, "gzread must see the cut member");
    lines_free(&L);
    w = open_or_fail(path, PROMPTS_JSONL, true, false);
    if (!w) return;
    ResultResume info = results_resume_info(w);
    CHECK(info.lines == 7 && info.bytes_dropped == n - 10 && !results_is_done(w, "cut") && results_is_done(w, "c1"),
          "lines %lld dropped %lld", (long long)info.lines, (long long)info.bytes_dropped);
    write_n(w, "after", 0, 1);
    finish_or_fail(w);
    L = read_lines(path);
    CHECK(L.n == 8 && L.clean && strstr(L.line[7], "after0"), "%zu lines after resume", L.n);
    lines_free(&L);
}

/* A complete gzip member that ends inside a line (not ours, but possible):
 * the partial line is not done and the next line starts fresh. */
static void test_gz_open_line(void) {
    const char *path = tmp_path("open.jsonl.gz");
    gzFile g = gzopen(path, "wb");
    gzputs(g, "{\"id\":\"x\",\"text\":\"t\"}\n{\"id\":\"partial\",\"te");
    gzclose(g);
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, true, false);
    if (!w) return;
    CHECK(results_is_done(w, "x") && !results_is_done(w, "partial") && results_resume_info(w).bytes_dropped == 0,
          "done set");
    ResultLine l = {.id = "partial", .text = "redone"};
    write_or_fail(w, &l);
    finish_or_fail(w);
    Lines L = read_lines(path);
    Json *d = L.n == 3 ? parse_line(L.line[2]) : NULL;
    CHECK(L.n == 3 && L.clean && d && has_str(json_root(d), "text", "redone"), "%zu lines", L.n);
    json_free(d);
    lines_free(&L);
}

static void test_resume_refusals(void) {
    Err err = {{0}};
    /* JSONL output resumed for an OpenAI input (and back). */
    make_output(tmp_path("m.jsonl"), PROMPTS_JSONL, "a", 2);
    CHECK(!results_open(tmp_path("m.jsonl"), PROMPTS_OPENAI, true, false, &err) && strstr(err.msg, "custom_id"),
          "format mismatch: %s", err.msg);
    make_output(tmp_path("m2.jsonl"), PROMPTS_OPENAI, "a", 1);
    CHECK(!results_open(tmp_path("m2.jsonl"), PROMPTS_JSONL, true, false, &err) && strstr(err.msg, "another input format"),
          "format mismatch: %s", err.msg);
    /* The OpenAI output resumes by custom_id. */
    ResultWriter *w = open_or_fail(tmp_path("m2.jsonl"), PROMPTS_OPENAI, true, false);
    CHECK(w && results_is_done(w, "a0"), "custom_id done");
    if (w) finish_or_fail(w);
    /* Name and content disagree about gzip. */
    int fd = open(tmp_path("fake.jsonl.gz"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(write(fd, "{\"id\":1}\n", 9) == 9, "write");
    close(fd);
    CHECK(!results_open(tmp_path("fake.jsonl.gz"), PROMPTS_JSONL, true, false, &err) && strstr(err.msg, "not gzip"),
          "gz name, plain content: %s", err.msg);
    CHECK(!results_open("-", PROMPTS_JSONL, true, false, &err) && strstr(err.msg, "stdout"), "stdout resume: %s", err.msg);
    CHECK(!results_open(tmp_dir, PROMPTS_JSONL, true, false, &err) && strstr(err.msg, "regular file"), "dir: %s", err.msg);
    /* A missing file resumes as empty and is created. */
    w = open_or_fail(tmp_path("new.jsonl"), PROMPTS_JSONL, true, false);
    CHECK(w && id_set_count(results_done(w)) == 0, "new file");
    if (w) finish_or_fail(w);
    CHECK(access(tmp_path("new.jsonl"), F_OK) == 0, "created");
}

/* "-" writes to file descriptor 1. */
static void test_stdout(void) {
    fflush(stdout);
    int saved = dup(1), fd = open(tmp_path("stdout.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    Err err = {{0}};
    ResultWriter *w = results_open("-", PROMPTS_TEXT, false, false, &err);
    if (w) {
        write_n(w, "s", 0, 2);
        results_finish(w, &err);
    }
    dup2(saved, 1);
    close(saved);
    CHECK(w, "open -: %s", err.msg);
    CHECK(fcntl(1, F_GETFD) != -1, "stdout must stay open");
    Lines L = read_lines(tmp_path("stdout.txt"));
    CHECK(L.n == 2 && L.clean && strstr(L.line[1], "\"s1\""), "%zu lines", L.n);
    lines_free(&L);
}

static void check_order(const char *path, const char *const *want, size_t n) {
    Lines L = read_lines(path);
    CHECK(L.n == n, "%zu lines, want %zu", L.n, n);
    for (size_t i = 0; i < L.n && i < n; i++) {
        Json *d = parse_line(L.line[i]);
        CHECK(d && has_str(json_root(d), "id", want[i]), "line %zu: %s, want %s", i, L.line[i], want[i]);
        json_free(d);
    }
    lines_free(&L);
}

static void put(ResultOrder *o, int64_t index, const char *id) {
    Err err = {{0}};
    ResultLine l = {.id = id, .text = id};
    CHECK(results_ordered_put(o, index, &l, &err) == 0, "put %lld: %s", (long long)index, err.msg);
}

static void test_ordered(void) {
    const char *path = tmp_path("ord.jsonl");
    ResultWriter *w = open_or_fail(path, PROMPTS_JSONL, false, false);
    ResultOrder *o = w ? results_ordered_new(w, 0) : NULL;
    CHECK(o, "new");
    if (!o) { results_close(w); return; }
    Err err;
    put(o, 2, "two");
    put(o, 3, "three");
    CHECK(results_ordered_pending(o) == 2 && results_ordered_next(o) == 0, "held until 0 comes");
    put(o, 0, "zero");
    CHECK(results_ordered_pending(o) == 2 && results_ordered_next(o) == 1, "0 written, 1 awaited");
    const char *first[] = {"zero"};
    check_order(path, first, 1);
    CHECK(results_ordered_skip(o, 1, &err) == 0, "skip");
    CHECK(results_ordered_pending(o) == 0 && results_ordered_next(o) == 4, "all written");
    const char *four[] = {"zero", "two", "three"};
    check_order(path, four, 3);
    ResultLine l = {.id = "x"};
    CHECK(results_ordered_put(o, 2, &l, &err) == -1 && strstr(err.msg, "after it was written"), "old index: %s",
          err.msg);
    /* Far ahead: the ring grows; a repeated index is refused. */
    put(o, 1000, "k1000");
    CHECK(results_ordered_put(o, 1000, &l, &err) == -1 && strstr(err.msg, "twice"), "twice: %s", err.msg);
    char id[16];
    for (int i = 999; i >= 4; i--) {
        snprintf(id, sizeof id, "k%d", i);
        if (i == 500) continue; /* never comes */
        put(o, i, id);
    }
    CHECK(results_ordered_next(o) == 500 && results_ordered_pending(o) == 500, "waiting for 500: next %lld held %zu",
          (long long)results_ordered_next(o), results_ordered_pending(o));
    put(o, 1002, "k1002");
    int64_t gaps = -1;
    CHECK(results_ordered_finish(o, &gaps, &err) == 0 && gaps == 2 && results_ordered_pending(o) == 0,
          "finish: gaps %lld", (long long)gaps);
    results_ordered_free(o);
    finish_or_fail(w);
    Lines L = read_lines(path);
    bool in_order = L.n == 3 + 996 + 1;
    for (size_t i = 3; in_order && i < L.n - 1; i++) {
        int want = (int)i + 1 + (i >= 499);
        snprintf(id, sizeof id, "\"k%d\"", want);
        in_order = strstr(L.line[i], id) != NULL;
    }
    CHECK(in_order && strstr(L.line[L.n - 1], "k1002"), "%zu lines in index order", L.n);
    lines_free(&L);
}

/* Output files with random bytes changed: resume either refuses with a
 * message or leaves a file that reads back whole after one more line. */
static void test_hostile_resume(void) {
    const char *names[] = {"h.jsonl", "h.jsonl.gz"};
    unsigned seed = 777;
    int iters = getenv("CLLM_QUICK") ? 60 : 200, bad = 0, resumed = 0;
    for (int g = 0; g < 2; g++) {
        const char *path = tmp_path(names[g]);
        for (int it = 0; it < iters; it++) {
            if (!make_output(path, PROMPTS_JSONL, "h", 6)) return;
            int fd = open(path, O_RDWR);
            struct stat st;
            fstat(fd, &st);
            for (int k = 0; k < 1 + it % 4; k++) {
                seed = seed * 1103515245u + 12345u;
                unsigned char c = (unsigned char)(seed >> 16);
                seed = seed * 1103515245u + 12345u;
                if (pwrite(fd, &c, 1, (off_t)((seed >> 8) % (unsigned)st.st_size)) != 1) bad++;
            }
            if (it % 5 == 0 && ftruncate(fd, st.st_size - 1 - (off_t)(seed % 40))) bad++; /* and a cut tail */
            close(fd);
            Err err = {{0}};
            ResultWriter *w = results_open(path, PROMPTS_JSONL, true, false, &err);
            if (!w) { bad += err.msg[0] == 0; continue; }
            resumed++;
            write_n(w, "after", 0, 1);
            results_close(w);
            Lines L = read_lines(path);
            if (!L.clean || L.n == 0 || !strstr(L.line[L.n - 1], "\"after0\"")) bad++;
            lines_free(&L);
        }
    }
    CHECK(bad == 0 && resumed > iters, "%d bad, %d resumed", bad, resumed);
}

/* -o naming the input (by any path or link) is refused before anything is
 * opened for writing; the input keeps its bytes. */
static void test_output_is_input(void) {
    const char *in = tmp_path("same-in.jsonl");
    FILE *f = fopen(in, "w");
    fputs("{\"id\": 1, \"prompt\": \"x\"}\n", f);
    fclose(f);
    char dotted[300];
    snprintf(dotted, sizeof dotted, "%s/../%s/same-in.jsonl", tmp_dir, strrchr(tmp_dir, '/') + 1);
    symlink(in, tmp_path("same-sym.jsonl"));
    link(in, tmp_path("same-hard.jsonl"));
    const char *same[] = {in, dotted, tmp_path("same-sym.jsonl"), tmp_path("same-hard.jsonl")};
    for (int i = 0; i < 4; i++) {
        Err err = {{0}};
        CHECK(results_check_not_input(same[i], in, &err) == -1, "output %s accepted for input %s", same[i], in);
        CHECK(strstr(err.msg, same[i]) && strstr(err.msg, in), "message names both paths: %s", err.msg);
        CHECK(results_check_not_input(in, same[i], &err) == -1, "output %s accepted for input %s", in, same[i]);
    }
    Err err = {{0}};
    CHECK(results_check_not_input(tmp_path("same-new.jsonl"), in, &err) == 0, "a new output refused: %s", err.msg);
    fclose(fopen(tmp_path("same-other.jsonl"), "w"));
    CHECK(results_check_not_input(tmp_path("same-other.jsonl"), in, &err) == 0, "another file refused: %s", err.msg);
    CHECK(results_check_not_input("-", in, &err) == 0, "stdout (not the input) refused: %s", err.msg);
    /* stdin and stdout redirected to the input's file. */
    fflush(stdout);
    int saved_in = dup(0), saved_out = dup(1), fd = open(in, O_RDWR | O_APPEND);
    dup2(fd, 0);
    int rc_in = results_check_not_input(tmp_path("same-hard.jsonl"), "-", &err);
    dup2(fd, 1);
    int rc_out = results_check_not_input("-", in, &err);
    dup2(saved_in, 0);
    dup2(saved_out, 1);
    close(saved_in);
    close(saved_out);
    close(fd);
    CHECK(rc_in == -1, "-i - with stdin from the output file accepted");
    CHECK(rc_out == -1 && strstr(err.msg, "stdout"), "-o - with stdout into the input accepted: %s", err.msg);
    struct stat st;
    CHECK(stat(in, &st) == 0 && st.st_size == 25, "the input lost bytes: %lld", (long long)st.st_size);
}

/* An output holding results is not replaced without --resume/--overwrite:
 * the message names the file and both options; a missing or empty file,
 * stdout and a device pass. */
static void test_check_overwrite(void) {
    Err err = {{0}};
    FILE *f = fopen(tmp_path("full.jsonl"), "w");
    fputs("{\"id\":\"a\",\"text\":\"x\"}\n", f);
    fclose(f);
    CHECK(results_check_overwrite(tmp_path("full.jsonl"), &err) == -1, "a file with results accepted");
    CHECK(strstr(err.msg, tmp_path("full.jsonl")) && strstr(err.msg, "--resume") && strstr(err.msg, "--overwrite"),
          "message names the file and both ways out: %s", err.msg);
    fclose(fopen(tmp_path("empty.jsonl"), "w"));
    CHECK(results_check_overwrite(tmp_path("empty.jsonl"), &err) == 0, "an empty file refused: %s", err.msg);
    CHECK(results_check_overwrite(tmp_path("none.jsonl"), &err) == 0, "a missing file refused: %s", err.msg);
    CHECK(results_check_overwrite("-", &err) == 0, "stdout refused: %s", err.msg);
    CHECK(results_check_overwrite("/dev/null", &err) == 0, "/dev/null refused: %s", err.msg);
}

static void remove_tmp(void) {
    const char *names[] = {"a.jsonl", "o.jsonl", "esc.jsonl.gz", "r.jsonl", "f.jsonl", "k.jsonl.gz", "member.gz",
                           "open.jsonl.gz", "m.jsonl", "m2.jsonl", "fake.jsonl.gz", "new.jsonl", "stdout.txt",
                           "ord.jsonl", "h.jsonl", "h.jsonl.gz", "same-in.jsonl", "same-sym.jsonl",
                           "same-hard.jsonl", "same-other.jsonl", "d.jsonl", "full.jsonl", "empty.jsonl"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(tmp_path(names[i]));
    rmdir(tmp_dir);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/cllm-test-results-XXXXXX");
    if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_jsonl_shape);
    RUN(test_openai_shape);
    RUN(test_escaping);
    RUN(test_resume_half_line);
    RUN(test_resume_failed_lines);
    RUN(test_resume_counts_lines);
    RUN(test_gz_abrupt_exit);
    RUN(test_gz_open_line);
    RUN(test_resume_refusals);
    RUN(test_stdout);
    RUN(test_ordered);
    RUN(test_hostile_resume);
    RUN(test_output_is_input);
    RUN(test_check_overwrite);
    remove_tmp();
    TEST_EXIT();
}
