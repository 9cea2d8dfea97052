/* test_prompts.c — the prompt-file reader: every format against the
 * expectations that tests/fixtures/prompts/make_prompts_fixtures.py wrote with
 * Python's json module, the same files through gzip and a stdin pipe, forced
 * formats, the line-length limit, duplicate ids, unreadable inputs, the id
 * set and the UTF-8 decoder.
 */
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "app/prompts.h"
#include "base/json.h"
#include "base/utf8.h"
#include "tests/test.h"

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static const char *fixture(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/prompts/%s", test_fixture_dir(), name);
    return buf[k];
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

static void write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

static void write_gz(const char *path, const char *data, size_t len) {
    gzFile g = gzopen(path, "wb");
    gzwrite(g, data, (unsigned)len);
    gzclose(g);
}

/* ---- comparing a request with one expected entry ---- */

static bool str_eq(const char *a, const JsonValue *e) {
    if (!e || e->type == JSON_NULL) return a == NULL;
    return a && e->type == JSON_STRING && strlen(a) == e->u.string.len && !memcmp(a, e->u.string.s, e->u.string.len);
}

static void check_float(float got, const JsonValue *e, const char *name, int64_t line) {
    const JsonValue *v = json_get(e, name);
    if (!v || v->type == JSON_NULL) CHECK(isnan(got), "line %lld: %s = %g, want not given", (long long)line, name, got);
    else CHECK(fabs(got - v->u.number.num) <= 1e-6 * fmax(1, fabs(v->u.number.num)),
               "line %lld: %s = %.9g, want %.9g", (long long)line, name, got, v->u.number.num);
}

static void check_sampling(const PromptRequest *r, const JsonValue *e) {
    static const char *floats[] = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                                   "frequency_penalty"};
    const float got[] = {r->temperature, r->top_p, r->min_p, r->repetition_penalty, r->presence_penalty,
                         r->frequency_penalty};
    for (int i = 0; i < 6; i++) check_float(got[i], e, floats[i], r->line);
    CHECK(r->max_tokens == json_get_int(e, "max_tokens", -99), "line %lld: max_tokens %d", (long long)r->line,
          r->max_tokens);
    CHECK(r->top_k == json_get_int(e, "top_k", -99), "line %lld: top_k %d", (long long)r->line, r->top_k);
    const JsonValue *seed = json_get(e, "seed");
    bool want_seed = seed && seed->type != JSON_NULL;
    CHECK(r->has_seed == want_seed, "line %lld: has_seed %d", (long long)r->line, r->has_seed);
    if (want_seed && r->has_seed) CHECK(r->seed == seed->u.number.i, "line %lld: seed %lld", (long long)r->line,
                                        (long long)r->seed);
    const JsonValue *stop = json_get(e, "stop");
    CHECK(r->n_stop == (int)json_len(stop), "line %lld: %d stop strings", (long long)r->line, r->n_stop);
    for (int i = 0; i < r->n_stop && i < (int)json_len(stop); i++)
        CHECK(str_eq(r->stop[i], json_at(stop, (size_t)i)), "line %lld: stop[%d] '%s'", (long long)r->line, i,
              r->stop[i]);
    CHECK(str_eq(r->model, json_get(e, "model")), "line %lld: model '%s'", (long long)r->line,
          r->model ? r->model : "(null)");
}

static void check_request(const PromptRequest *r, const JsonValue *e) {
    int64_t line = json_get_int(e, "line", -1);
    CHECK(r->line == line, "line %lld, want %lld", (long long)r->line, (long long)line);
    CHECK(str_eq(r->id, json_get(e, "id")), "line %lld: id '%s', want '%s'", (long long)line, r->id,
          json_get_str(e, "id", "?"));
    const char *want_err = json_get_str(e, "error", NULL);
    if (want_err) {
        char prefix[48];
        snprintf(prefix, sizeof prefix, "line %lld: ", (long long)line);
        CHECK(r->error && strstr(r->error, want_err) && !strncmp(r->error, prefix, strlen(prefix)),
              "line %lld: error '%s', want one with '%s'", (long long)line, r->error ? r->error : "(none)", want_err);
        CHECK(!r->prompt && !r->n_messages && !r->n_stop && r->max_tokens == -1 && isnan(r->temperature),
              "line %lld: a bad request carries half-read fields", (long long)line);
        return;
    }
    CHECK(!r->error, "line %lld: unexpected error '%s'", (long long)line, r->error);
    CHECK(r->id_is_number == json_get_bool(e, "id_is_number", false), "line %lld: id_is_number", (long long)line);
    CHECK(str_eq(r->prompt, json_get(e, "prompt")), "line %lld: prompt '%s'", (long long)line,
          r->prompt ? r->prompt : "(null)");
    const JsonValue *msgs = json_get(e, "messages");
    size_t n = msgs && msgs->type == JSON_ARRAY ? json_len(msgs) : 0;
    CHECK(r->n_messages == (int)n && r->is_chat == (n > 0), "line %lld: %d messages, want %zu", (long long)line,
          r->n_messages, n);
    for (size_t i = 0; i < n && (int)i < r->n_messages; i++) {
        const JsonValue *m = json_at(msgs, i);
        CHECK(str_eq(r->messages[i].role, json_at(m, 0)) && str_eq(r->messages[i].content, json_at(m, 1)),
              "line %lld: message %zu = %s '%s'", (long long)line, i, r->messages[i].role, r->messages[i].content);
    }
    check_sampling(r, e);
}

/* Reads every request of path and compares with the fixture's expectations. */
static void check_file(const char *path, PromptFormat fmt, PromptFormat want_fmt, const char *expected) {
    Err err = {{0}};
    Json *doc = json_parse_file(fixture(expected), &err);
    CHECK(doc, "%s", err.msg);
    PromptReader *r = prompts_open(path, fmt, &err);
    CHECK(r, "%s", err.msg);
    if (!doc || !r) { json_free(doc); prompts_close(r); return; }
    CHECK(prompts_format(r) == want_fmt, "%s: format %s", path, prompts_format_name(prompts_format(r)));
    const JsonValue *exp = json_root(doc);
    size_t k = 0;
    PromptRequest req;
    int rc;
    while ((rc = prompts_next(r, &req, &err)) == 1) {
        if (k < json_len(exp)) check_request(&req, json_at(exp, k));
        CHECK(req.index == (int64_t)k, "index %lld, want %zu", (long long)req.index, k);
        k++;
        prompt_request_free(&req);
    }
    CHECK(rc == 0, "%s: %s", path, err.msg);
    CHECK(k == json_len(exp), "%s: %zu requests, want %zu", path, k, json_len(exp));
    CHECK(prompts_next(r, &req, &err) == 0, "reading past the end");
    prompts_close(r);
    json_free(doc);
}

static void test_text_file(void) { check_file(fixture("text.txt"), PROMPTS_AUTO, PROMPTS_TEXT, "text.txt.expected.json"); }
static void test_jsonl_file(void) {
    check_file(fixture("jsonl.jsonl"), PROMPTS_AUTO, PROMPTS_JSONL, "jsonl.jsonl.expected.json");
}
static void test_openai_file(void) {
    check_file(fixture("openai.jsonl"), PROMPTS_AUTO, PROMPTS_OPENAI, "openai.jsonl.expected.json");
    /* A forced format gives the same. */
    check_file(fixture("openai.jsonl"), PROMPTS_OPENAI, PROMPTS_OPENAI, "openai.jsonl.expected.json");
}

/* .gz by name, gzip without the name (magic bytes), and a non-gzip .gz name. */
static void test_gzip_input(void) {
    size_t n;
    char *data = read_all(fixture("jsonl.jsonl"), &n);
    CHECK(data, "cannot read the fixture");
    if (!data) return;
    write_gz(tmp_path("p.jsonl.gz"), data, n);
    check_file(tmp_path("p.jsonl.gz"), PROMPTS_AUTO, PROMPTS_JSONL, "jsonl.jsonl.expected.json");
    write_gz(tmp_path("p_noext"), data, n);
    check_file(tmp_path("p_noext"), PROMPTS_AUTO, PROMPTS_JSONL, "jsonl.jsonl.expected.json");
    write_file(tmp_path("plain.gz"), data, n);
    check_file(tmp_path("plain.gz"), PROMPTS_AUTO, PROMPTS_JSONL, "jsonl.jsonl.expected.json");
    free(data);
}

/* The gzip bytes of a fixture (made with zlib through path). */
static char *gz_fixture(const char *name, const char *path, size_t *gn) {
    size_t n;
    char *data = read_all(fixture(name), &n);
    CHECK(data, "cannot read fixture %s", name);
    if (!data) return NULL;
    write_gz(path, data, n);
    free(data);
    return read_all(path, gn);
}

/* A truncated .gz is an I/O error (-1), not a silent short read. */
static void test_corrupt_gzip(void) {
    size_t gn;
    char *gz = gz_fixture("jsonl.jsonl", tmp_path("cut.gz"), &gn);
    if (!gz) return;
    write_file(tmp_path("cut.gz"), gz, gn / 2);
    Err err = {{0}};
    PromptReader *r = prompts_open(tmp_path("cut.gz"), PROMPTS_JSONL, &err);
    CHECK(r, "%s", err.msg);
    PromptRequest req;
    int rc = 0, got = 0;
    while (r && (rc = prompts_next(r, &req, &err)) == 1) { got++; prompt_request_free(&req); }
    CHECK(rc == -1 && strstr(err.msg, "cut.gz"), "rc %d after %d requests: %s", rc, got, err.msg);
    prompts_close(r);
    free(gz);
}

/* Damaged gzip data: the reader opens (the caller can still make its output
 * say so), the requests before the damage come back intact, then -1 naming
 * the file; a .gz that is damaged from its first bytes reads as -1 at once. */
static void test_damaged_gzip(void) {
    const char junk[] = "\x1f\x8b\x08\x00garbage that does not inflate";
    write_file(tmp_path("junk.gz"), junk, sizeof junk - 1);
    Err err = {{0}};
    PromptReader *r = prompts_open(tmp_path("junk.gz"), PROMPTS_AUTO, &err);
    PromptRequest q;
    CHECK(r, "a .gz damaged at its start does not open: %s", err.msg);
    CHECK(r && prompts_next(r, &q, &err) == -1 && strstr(err.msg, "junk.gz"), "junk.gz: %s", err.msg);
    CHECK(r && prompts_next(r, &q, &err) == -1, "junk.gz: reads on after the error");
    prompts_close(r);

    enum { LINES = 20000 };
    size_t cap = (size_t)LINES * 40, n = 0;
    char *text = malloc(cap);
    for (int i = 1; i <= LINES; i++) n += (size_t)snprintf(text + n, cap - n, "Prompt number %d says hello\n", i);
    /* A good member, then one whose header is damaged: zlib notices at once
     * (damage inside a member's data can inflate to wrong text, caught only
     * by the CRC at the member's end). */
    write_gz(tmp_path("damaged.gz"), text, n);
    size_t gn;
    char *gz = read_all(tmp_path("damaged.gz"), &gn);
    if (!gz) { free(text); return; }
    FILE *f = fopen(tmp_path("damaged.gz"), "ab");
    fwrite(junk, 1, sizeof junk - 1, f);
    fclose(f);
    r = prompts_open(tmp_path("damaged.gz"), PROMPTS_AUTO, &err);
    CHECK(r, "%s", err.msg);
    int got = 0, wrong = 0, rc = 0;
    char want[64];
    while (r && (rc = prompts_next(r, &q, &err)) == 1) {
        snprintf(want, sizeof want, "Prompt number %d says hello", ++got);
        wrong += q.error || strcmp(q.prompt, want);
        prompt_request_free(&q);
    }
    /* zlib drops what the failing gzread call had (a 32 KB call: ~1200 of
     * these lines); a 256 KB call lost ~9000. */
    CHECK(rc == -1 && strstr(err.msg, "damaged.gz"), "rc %d: %s", rc, err.msg);
    CHECK(got >= LINES - 1300 && wrong == 0, "%d of %d requests before the damage, %d wrong", got, LINES, wrong);
    prompts_close(r);
    free(gz);
    free(text);
}

/* "-" reads stdin; here a pipe fed by a child, gzip-compressed. */
static void test_stdin_pipe(void) {
    size_t gn;
    char *gz = gz_fixture("openai.jsonl", tmp_path("stdin.gz"), &gn);
    if (!gz) return;
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        for (size_t i = 0; i < gn; i += 7) /* small pieces: the reader must not count on whole reads */
            if (write(fds[1], gz + i, gn - i < 7 ? gn - i : 7) < 0) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    int saved = dup(0);
    dup2(fds[0], 0);
    close(fds[0]);
    check_file("-", PROMPTS_AUTO, PROMPTS_OPENAI, "openai.jsonl.expected.json");
    dup2(saved, 0);
    close(saved);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer child failed");
    /* stdin as a plain file, through freopen. */
    FILE *f = freopen(fixture("text.txt"), "rb", stdin);
    CHECK(f, "freopen");
    check_file("-", PROMPTS_AUTO, PROMPTS_TEXT, "text.txt.expected.json");
    free(gz);
}

/* A JSON Lines file forced to text: every line is a prompt as written. */
static void test_forced_text(void) {
    Err err;
    PromptReader *r = prompts_open(fixture("jsonl.jsonl"), PROMPTS_TEXT, &err);
    CHECK(r && prompts_format(r) == PROMPTS_TEXT, "open");
    if (!r) return;
    PromptRequest req;
    CHECK(prompts_next(r, &req, &err) == 1, "first");
    CHECK(req.prompt && !strcmp(req.prompt, "{\"id\": \"a\", \"prompt\": \"Say \\\"hi\\\"\\n\\ttab \\\\ back\"}"),
          "prompt '%s'", req.prompt);
    CHECK(!strcmp(req.id, "line-1"), "id %s", req.id);
    prompt_request_free(&req);
    CHECK(prompts_next(r, &req, &err) == 1 && req.prompt && !strcmp(req.prompt, "{\"id\": 7, \"prompt\": \"numeric id\"}"),
          "CRLF line '%s'", req.prompt);
    prompt_request_free(&req);
    prompts_close(r);
}

static void expect_next(PromptReader *r, int64_t line, const char *prompt, const char *err_part) {
    PromptRequest req;
    Err err = {{0}};
    int rc = prompts_next(r, &req, &err);
    CHECK(rc == 1, "want line %lld, got rc %d: %s", (long long)line, rc, err.msg);
    if (rc != 1) return;
    CHECK(req.line == line, "line %lld, want %lld", (long long)req.line, (long long)line);
    if (err_part) CHECK(req.error && strstr(req.error, err_part), "line %lld: error '%s'", (long long)line, req.error);
    else CHECK(!req.error && req.prompt && !strcmp(req.prompt, prompt), "line %lld: '%.40s' error '%s'",
               (long long)line, req.prompt, req.error);
    prompt_request_free(&req);
}

/* Lines at and over a small limit, CRLF counted out, the last line cut. */
static void test_line_limit(void) {
    char *a100 = malloc(101), *a101 = malloc(102), *b5000 = malloc(5001);
    memset(a100, 'a', 100); a100[100] = 0;
    memset(a101, 'a', 101); a101[101] = 0;
    memset(b5000, 'b', 5000); b5000[5000] = 0;
    FILE *f = fopen(tmp_path("limit.txt"), "wb");
    fprintf(f, "%s\n%s\r\n%s\n%s\nafter\n%s", a100, a100, a101, b5000, b5000);
    fclose(f);
    Err err;
    PromptReader *r = prompts_open_limit(tmp_path("limit.txt"), PROMPTS_AUTO, 100, &err);
    CHECK(r, "%s", err.msg);
    if (r) {
        expect_next(r, 1, a100, NULL);
        expect_next(r, 2, a100, NULL);
        expect_next(r, 3, NULL, "longer than the limit of 100 bytes");
        expect_next(r, 4, NULL, "longer than the limit of 100 bytes");
        expect_next(r, 5, "after", NULL);
        expect_next(r, 6, NULL, "longer than the limit");
        PromptRequest req;
        CHECK(prompts_next(r, &req, &err) == 0, "end");
        prompts_close(r);
    }
    /* A first line over the limit that starts with '{' still reads as JSON. */
    f = fopen(tmp_path("limit.jsonl"), "wb");
    fprintf(f, "{\"prompt\": \"%s\"}\n{\"id\": \"ok\", \"prompt\": \"fine\"}\n", b5000);
    fclose(f);
    r = prompts_open_limit(tmp_path("limit.jsonl"), PROMPTS_AUTO, 100, &err);
    CHECK(r && prompts_format(r) == PROMPTS_JSONL, "format");
    if (r) {
        expect_next(r, 1, NULL, "longer than the limit");
        expect_next(r, 2, "fine", NULL);
        prompts_close(r);
    }
    free(a100); free(a101); free(b5000);
}

/* The real 64 MiB limit (skipped under CLLM_QUICK: it writes 64 MiB). */
static void test_default_line_limit(void) {
    if (getenv("CLLM_QUICK")) { CHECK(PROMPTS_MAX_LINE == (size_t)64 << 20, "limit"); return; }
    size_t big = PROMPTS_MAX_LINE + 1;
    char *line = malloc(big);
    memset(line, 'x', big);
    FILE *f = fopen(tmp_path("huge.txt"), "wb");
    fputs("short\n", f);
    fwrite(line, 1, big - 1, f); /* exactly the limit: accepted */
    fputs("\n", f);
    fwrite(line, 1, big, f);     /* one over */
    fputs("\ntail\n", f);
    fclose(f);
    Err err;
    PromptReader *r = prompts_open(tmp_path("huge.txt"), PROMPTS_AUTO, &err);
    CHECK(r, "%s", err.msg);
    if (r) {
        PromptRequest req;
        expect_next(r, 1, "short", NULL);
        CHECK(prompts_next(r, &req, &err) == 1 && !req.error && req.prompt && strlen(req.prompt) == big - 1,
              "line at the limit: %s", req.error);
        prompt_request_free(&req);
        expect_next(r, 3, NULL, "longer than the limit of 67108864 bytes");
        expect_next(r, 4, "tail", NULL);
        prompts_close(r);
    }
    unlink(tmp_path("huge.txt"));
    free(line);
}

static void test_duplicates_and_ids(void) {
    const char *text = "{\"id\": 7, \"prompt\": \"a\"}\n{\"id\": \"7\", \"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n"
                       "{\"id\": \"line-3\", \"prompt\": \"d\"}\n{\"id\": -0.5e+2, \"prompt\": \"e\"}\n"
                       "{\"id\": \"\", \"prompt\": \"f\"}\n{\"id\": \"x\", \"prompt\": \"\xff\"}\n"
                       "{\"id\": \"y\", \"prompt\": \"g\"}\n{\"id\": \"7\", \"prompt\": \"h\"}\n";
    write_file(tmp_path("dup.jsonl"), text, strlen(text));
    Err err;
    PromptReader *r = prompts_open(tmp_path("dup.jsonl"), PROMPTS_AUTO, &err);
    CHECK(r, "%s", err.msg);
    if (!r) return;
    PromptRequest q;
    prompts_next(r, &q, &err);
    CHECK(!q.error && !strcmp(q.id, "7") && q.id_is_number && q.occurrence == 1, "numeric id %s", q.id);
    prompt_request_free(&q);
    prompts_next(r, &q, &err);
    CHECK(q.error && strstr(q.error, "line 2: duplicate id '7' (first on line 1)") && !q.id_is_number &&
              q.occurrence == 2, "'%s' occurrence %lld", q.error, (long long)q.occurrence);
    prompt_request_free(&q);
    prompts_next(r, &q, &err);
    CHECK(!q.error && !strcmp(q.id, "line-3"), "fallback id %s", q.id);
    prompt_request_free(&q);
    prompts_next(r, &q, &err);
    CHECK(q.error && strstr(q.error, "duplicate id 'line-3'") && q.occurrence == 2, "'%s'", q.error);
    prompt_request_free(&q);
    prompts_next(r, &q, &err);
    CHECK(!q.error && !strcmp(q.id, "-0.5e+2") && q.id_is_number, "raw number text '%s'", q.id);
    prompt_request_free(&q);
    prompts_next(r, &q, &err);
    CHECK(q.error && strstr(q.error, "field 'id' must not be empty") && !strcmp(q.id, "line-6"), "'%s' %s", q.error,
          q.id);
    prompt_request_free(&q);
    prompts_next(r, &q, &err); /* raw invalid UTF-8 inside a JSON string: the reader or we refuse it */
    CHECK(q.error != NULL, "invalid UTF-8 in a JSON string accepted");
    prompt_request_free(&q);
    expect_next(r, 8, "g", NULL);
    prompts_next(r, &q, &err);
    CHECK(q.error && strstr(q.error, "duplicate id '7'") && q.occurrence == 3, "third 7: '%s' occurrence %lld", q.error,
          (long long)q.occurrence);
    prompt_request_free(&q);
    prompts_close(r);
}

static void test_empty_and_bad_inputs(void) {
    Err err = {{0}};
    write_file(tmp_path("empty.txt"), "", 0);
    write_file(tmp_path("blank.txt"), "\n  \r\n\t\n", 7);
    const char *names[] = {"empty.txt", "blank.txt"};
    for (int i = 0; i < 2; i++) {
        PromptReader *r = prompts_open(tmp_path(names[i]), PROMPTS_AUTO, &err);
        PromptRequest q;
        CHECK(r && prompts_format(r) == PROMPTS_TEXT && prompts_next(r, &q, &err) == 0, "%s", names[i]);
        prompts_close(r);
    }
    CHECK(!prompts_open(tmp_path("missing.jsonl"), PROMPTS_AUTO, &err) && strstr(err.msg, "missing.jsonl") &&
              strstr(err.msg, "No such file"), "missing: %s", err.msg);
    CHECK(!prompts_open(tmp_dir, PROMPTS_AUTO, &err) && strstr(err.msg, "directory"), "dir: %s", err.msg);
    /* NUL in a text line; a line of only NUL is not blank. */
    write_file(tmp_path("nul.txt"), "a\0b\n\0\nok\n", 9);
    PromptReader *r = prompts_open(tmp_path("nul.txt"), PROMPTS_TEXT, &err);
    if (r) {
        expect_next(r, 1, NULL, "NUL");
        expect_next(r, 2, NULL, "NUL");
        expect_next(r, 3, "ok", NULL);
        prompts_close(r);
    }
}

/* Many lines through gzip: streaming, line numbers, the index. */
static void test_many_lines(void) {
    int n = getenv("CLLM_QUICK") ? 20000 : 200000;
    gzFile g = gzopen(tmp_path("many.jsonl.gz"), "wb1");
    for (int i = 0; i < n; i++) gzprintf(g, "{\"id\": %d, \"prompt\": \"prompt number %d\", \"max_tokens\": %d}\n", i, i, i % 50 + 1);
    gzclose(g);
    Err err;
    PromptReader *r = prompts_open(tmp_path("many.jsonl.gz"), PROMPTS_AUTO, &err);
    CHECK(r, "%s", err.msg);
    if (!r) return;
    PromptRequest q;
    int k = 0, bad = 0;
    char want[64];
    while (prompts_next(r, &q, &err) == 1) {
        snprintf(want, sizeof want, "prompt number %d", k);
        if (q.error || q.line != k + 1 || q.index != k || strcmp(q.prompt, want) || q.max_tokens != k % 50 + 1) bad++;
        k++;
        prompt_request_free(&q);
    }
    CHECK(k == n && bad == 0, "%d of %d read, %d wrong", k, n, bad);
    prompts_close(r);
}

/* The UTF-8 decoder against Python's strict decoding (utf8.json). */
static void test_utf8(void) {
    Err err;
    Json *doc = json_parse_file(fixture("utf8.json"), &err);
    CHECK(doc, "%s", err.msg);
    if (!doc) return;
    const JsonValue *cases = json_root(doc);
    for (size_t i = 0; i < json_len(cases); i++) {
        const char *hex = json_get_str(json_at(cases, i), "hex", "");
        const char *text = json_get_str(json_at(cases, i), "text", "");
        size_t n = strlen(hex) / 2;
        char *b = malloc(n + 1);
        for (size_t j = 0; j < n; j++) sscanf(hex + 2 * j, "%2hhx", (unsigned char *)&b[j]);
        bool py_valid = !strstr(text, "\xEF\xBF\xBD");
        CHECK((utf8_valid_prefix(b, n) == n) == py_valid, "case %zu (%s): valid %d", i, hex, py_valid);
        free(b);
    }
    json_free(doc);
    uint32_t cp;
    CHECK(utf8_next((const uint8_t *)"\xF0\x9F\x98\x80", 4, &cp) == 4 && cp == 0x1F600, "emoji");
    CHECK(utf8_next((const uint8_t *)"\xE2\x82", 2, &cp) == -2, "cut 3-byte sequence is one run of 2");
    CHECK(utf8_next((const uint8_t *)"\xED\xA0\x80", 3, &cp) == -1, "surrogate lead alone");
}

static void test_id_set(void) {
    IdSet *s = id_set_new();
    char id[32];
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        snprintf(id, sizeof id, "id-%d", i);
        if (id_set_add(s, id, i) != 1) bad++;
    }
    for (int i = 0; i < 100000; i += 3) {
        snprintf(id, sizeof id, "id-%d", i);
        if (id_set_add(s, id, -5) != 0 || id_set_get(s, id) != i || !id_set_has(s, id)) bad++;
    }
    CHECK(bad == 0 && id_set_count(s) == 100000, "%d wrong, %zu ids", bad, id_set_count(s));
    CHECK(!id_set_has(s, "id-100000") && id_set_get(s, "nope") == -1 && !id_set_has(s, ""), "absent ids");
    id_set_free(s);
}

/* Fixture lines with random bytes changed: every call must return a request
 * (good or with an error) and never crash, hang or read out of bounds. */
static void test_hostile_lines(void) {
    size_t n1, n2;
    char *a = read_all(fixture("jsonl.jsonl"), &n1), *b = read_all(fixture("openai.jsonl"), &n2);
    if (!a || !b) { CHECK(0, "fixtures"); free(a); free(b); return; }
    size_t n = n1 + 1 + n2;
    char *data = malloc(n), *mut = malloc(n);
    memcpy(data, b, n2);  /* OpenAI first, so AUTO picks it unless the first line breaks */
    data[n2] = '\n';
    memcpy(data + n2 + 1, a, n1);
    static const char pick[] = "\n\r{}[]\":,\\u0 \xff\xc3\x80\x01";
    unsigned seed = 12345;
    int iters = getenv("CLLM_QUICK") ? 100 : 400, bad = 0, total = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(mut, data, n);
        for (int k = 0; k < 1 + it % 8; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % n;
            seed = seed * 1103515245u + 12345u;
            mut[at] = (seed >> 16) % 3 ? pick[(seed >> 8) % (sizeof pick - 1)] : (char)(seed >> 20);
        }
        write_file(tmp_path("hostile.jsonl"), mut, n);
        Err err;
        PromptReader *r = prompts_open(tmp_path("hostile.jsonl"), it % 3 ? PROMPTS_AUTO : PROMPTS_JSONL, &err);
        if (!r) { bad++; continue; }
        PromptRequest q;
        int rc;
        int64_t last = 0;
        while ((rc = prompts_next(r, &q, &err)) == 1) {
            bool shape = q.id && q.line > last && (q.error ? true : (q.prompt != NULL) != (q.n_messages > 0));
            if (!shape) bad++;
            last = q.line;
            total++;
            prompt_request_free(&q);
        }
        if (rc != 0) bad++;
        prompts_close(r);
    }
    CHECK(bad == 0 && total > iters * 20, "%d bad of %d requests", bad, total);
    free(a); free(b); free(data); free(mut);
}

static void remove_tmp(void) {
    const char *names[] = {"p.jsonl.gz", "p_noext", "plain.gz", "cut.gz", "stdin.gz", "limit.txt", "limit.jsonl",
                           "dup.jsonl", "empty.txt", "blank.txt", "nul.txt", "many.jsonl.gz", "huge.txt",
                           "hostile.jsonl", "junk.gz", "damaged.gz"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(tmp_path(names[i]));
    rmdir(tmp_dir);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/cllm-test-prompts-XXXXXX");
    if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_text_file);
    RUN(test_jsonl_file);
    RUN(test_openai_file);
    RUN(test_gzip_input);
    RUN(test_corrupt_gzip);
    RUN(test_damaged_gzip);
    RUN(test_stdin_pipe);
    RUN(test_forced_text);
    RUN(test_line_limit);
    RUN(test_default_line_limit);
    RUN(test_duplicates_and_ids);
    RUN(test_empty_and_bad_inputs);
    RUN(test_many_lines);
    RUN(test_hostile_lines);
    RUN(test_utf8);
    RUN(test_id_set);
    remove_tmp();
    TEST_EXIT();
}
