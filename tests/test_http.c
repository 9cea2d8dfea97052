/* test_http.c — the HTTP/1.1 request parser of `cllm serve` (app/http.c):
 * good requests, every prefix of them (incomplete, never bad), and hostile
 * ones: each refused with its status, never read past its bytes (every
 * input is copied into a buffer of exactly its length, so ASan sees any
 * overread). */
#include "app/http.h"
#include "tests/test.h"

#define MAX_BODY 1024

/* Parses s[0..n) from an exact-size heap copy, which lives until the next
 * call (req points into it). */
static char *copy;
static HttpParse parse_n(const char *s, size_t n, HttpRequest *req, int *status) {
    free(copy);
    copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    Err err = {{0}};
    HttpParse rc = http_parse_request(copy, n, MAX_BODY, req, status, &err);
    if (rc == HTTP_BAD && !err.msg[0]) rc = 99; /* a refusal must say why */
    /* the pointers point into copy: check them before it goes */
    if (rc == HTTP_COMPLETE) {
        CHECK(req->method >= copy && req->method + req->method_len <= copy + n, "method in bounds");
        CHECK(req->header_bytes + req->content_length <= n, "request within the buffer");
    }
    return rc;
}

static HttpParse parse(const char *s, HttpRequest *req, int *status) { return parse_n(s, strlen(s), req, status); }

static void test_good_requests(void) {
    HttpRequest r;
    int st;
    const char *get = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(parse(get, &r, &st) == HTTP_COMPLETE, "GET");
    CHECK(r.method_len == 3 && r.keep_alive && r.minor == 1 && r.n_headers == 1 && r.content_length == 0, "GET fields");
    CHECK(r.header_bytes == strlen(get), "header bytes %zu", r.header_bytes);
    const char *post = "POST /v1/completions?x=1 HTTP/1.0\r\nContent-Length:  5 \r\nX-A:\r\n"
                       "Authorization: Bearer k\r\nConnection: keep-alive\r\n\r\nhello";
    CHECK(parse(post, &r, &st) == HTTP_COMPLETE, "POST");
    CHECK(r.content_length == 5 && r.minor == 0 && r.keep_alive, "POST fields");
    size_t n;
    const char *v = http_header(&r, "AUTHORIZATION", &n);
    CHECK(v && n == 8 && !memcmp(v, "Bearer k", 8), "header lookup, case-insensitive");
    v = http_header(&r, "x-a", &n);
    CHECK(v && n == 0, "empty header value");
    CHECK(http_header(&r, "missing", NULL) == NULL, "missing header");
    CHECK(http_path_is(&r, "/v1/completions") && !http_path_is(&r, "/v1/completion"), "path before '?'");
    CHECK(http_method_is(&r, "POST") && !http_method_is(&r, "GET"), "method");
    CHECK(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", &r, &st) == HTTP_COMPLETE && !r.keep_alive, "close");
    CHECK(parse("GET / HTTP/1.0\r\n\r\n", &r, &st) == HTTP_COMPLETE && !r.keep_alive, "1.0 closes by default");
    /* a pipelined second request is left for the next parse */
    const char *two = "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n";
    CHECK(parse(two, &r, &st) == HTTP_COMPLETE && r.header_bytes + r.content_length == strlen(two) - 18, "pipelined");
}

/* Every proper prefix of a good request is incomplete, never bad. */
static void test_prefixes_incomplete(void) {
    const char *reqs[] = {"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n{\"a\": true}",
                          "GET /health HTTP/1.1\r\n\r\n"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(reqs[k]);
        HttpRequest r;
        int st;
        for (size_t i = 0; i < n; i++) {
            HttpParse rc = parse_n(reqs[k], i, &r, &st);
            CHECK(rc == HTTP_INCOMPLETE, "request %d cut at %zu: %d (status %d)", k, i, rc, st);
        }
        CHECK(parse_n(reqs[k], n, &r, &st) == HTTP_COMPLETE, "request %d whole", k);
    }
}

typedef struct {
    const char *what, *req;
    size_t len; /* 0: strlen */
    int status;
} Hostile;

static void test_hostile_requests(void) {
    static const char nul_head[] = "GET /\0x HTTP/1.1\r\n\r\n";
    static const char nul_value[] = "GET / HTTP/1.1\r\nA: b\0c\r\n\r\n";
    const Hostile cases[] = {
        {"lower-case method", "get / HTTP/1.1\r\n\r\n", 0, 400},
        {"method with a digit", "G3T / HTTP/1.1\r\n\r\n", 0, 400},
        {"no method", " / HTTP/1.1\r\n\r\n", 0, 400},
        {"long method", "GETGETGETGETGETGETGET / HTTP/1.1\r\n\r\n", 0, 400},
        {"target without /", "GET x HTTP/1.1\r\n\r\n", 0, 400},
        {"absolute target", "GET http://a/ HTTP/1.1\r\n\r\n", 0, 400},
        {"two spaces", "GET  / HTTP/1.1\r\n\r\n", 0, 400},
        {"no version", "GET /\r\n\r\n", 0, 400},
        {"bad version", "GET / HTTQ/1.1\r\n\r\n", 0, 400},
        {"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 0, 505},
        {"HTTP/1.2", "GET / HTTP/1.2\r\n\r\n", 0, 505},
        {"NUL in the request line", nul_head, sizeof nul_head - 1, 400},
        {"NUL in a header value", nul_value, sizeof nul_value - 1, 400},
        {"NUL before the head ends", "GET / HTTP/1.1\r\nA: \0", 20, 400},
        {"bare LF", "GET / HTTP/1.1\nA: b\r\n\r\n", 0, 400},
        {"bare CR", "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 0, 400},
        {"empty request line", "\r\n\r\n", 0, 400},
        {"header without colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", 0, 400},
        {"space before colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", 0, 400},
        {"obs-fold", "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 0, 400},
        {"control byte in a value", "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 0, 400},
        {"Content-Length twice", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 0, 400},
        {"Content-Length twice, differing", "POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\nxy", 0,
         400},
        {"Content-Length negative", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 0, 400},
        {"Content-Length hex", "POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 0, 400},
        {"Content-Length empty", "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 0, 400},
        {"Content-Length list", "POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\nx", 0, 400},
        {"Content-Length over the limit", "POST / HTTP/1.1\r\nContent-Length: 1025\r\n\r\n", 0, 413},
        {"Content-Length huge", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999999999\r\n\r\n", 0, 413},
        {"chunked body", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 0, 411},
        {"gzip transfer coding", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 0, 501},
        {"chunked with a length", "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 0,
         411},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const Hostile *c = &cases[i];
        HttpRequest r;
        int st = 0;
        HttpParse rc = parse_n(c->req, c->len ? c->len : strlen(c->req), &r, &st);
        CHECK(rc == HTTP_BAD && st == c->status, "%s: rc %d status %d, expected %d", c->what, rc, st, c->status);
    }
}

/* Limits: a head that never ends, too many headers, a body at the limit. */
static void test_limits(void) {
    HttpRequest r;
    int st;
    size_t n = HTTP_MAX_HEADER_BYTES + 10;
    char *big = malloc(n);
    memcpy(big, "GET / HTTP/1.1\r\nA: ", 19);
    memset(big + 19, 'a', n - 19);
    CHECK(parse_n(big, HTTP_MAX_HEADER_BYTES - 1, &r, &st) == HTTP_INCOMPLETE, "just under the head limit");
    CHECK(parse_n(big, n, &r, &st) == HTTP_BAD && st == 431, "a head that never ends: %d", st);
    free(big);
    TextBuf b = {0};
    textbuf_append(&b, "GET / HTTP/1.1\r\n", 16);
    for (int i = 0; i < HTTP_MAX_HEADERS; i++) textbuf_append(&b, "A: b\r\n", 6);
    textbuf_append(&b, "\r\n", 2);
    CHECK(parse_n(b.data, b.len, &r, &st) == HTTP_COMPLETE && r.n_headers == HTTP_MAX_HEADERS, "64 headers");
    b.len -= 2;
    textbuf_append(&b, "A: b\r\n\r\n", 8);
    CHECK(parse_n(b.data, b.len, &r, &st) == HTTP_BAD && st == 431, "65 headers: %d", st);
    textbuf_free(&b);
    char at[128];
    snprintf(at, sizeof at, "POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n", MAX_BODY);
    CHECK(parse(at, &r, &st) == HTTP_INCOMPLETE, "a body at the limit waits for its bytes");
    CHECK(r.content_length == MAX_BODY, "its length %zu", r.content_length);
}

/* Random bytes and random cuts of good requests: never a crash, never a
 * bad verdict without a status and a message. */
static void test_random_inputs(void) {
    const char *seed = "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n{}{}";
    uint64_t x = 88172645463325252ull;
    char buf[256];
    int iters = getenv("CLLM_QUICK") ? 20000 : 200000;
    for (int it = 0; it < iters; it++) {
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        for (int m = 0; m < 1 + it % 4 && n > 0; m++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t at = (x >> 8) % n;
            switch (x % 3) {
            case 0: buf[at] = (char)(x >> 32); break;                      /* flip a byte */
            case 1: n = at; break;                                         /* cut */
            default: if (n < sizeof buf) { memmove(buf + at + 1, buf + at, n - at); buf[at] = (char)(x >> 40); n++; }
            }
        }
        HttpRequest r;
        int st = 0;
        HttpParse rc = parse_n(buf, n, &r, &st);
        CHECK(rc == HTTP_COMPLETE || rc == HTTP_INCOMPLETE || (rc == HTTP_BAD && st >= 400 && st < 600),
              "iteration %d: rc %d status %d", it, rc, st);
        if (test_failed_checks) break;
    }
}

static void test_response_head(void) {
    TextBuf b = {0};
    CHECK(http_put_head(&b, 404, "application/json", 12, true, "X-A: b\r\n") == 0, "head");
    CHECK(b.data && !strcmp(b.data, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 12\r\n"
                                    "Connection: keep-alive\r\nX-A: b\r\n\r\n"), "%s", b.data);
    textbuf_free(&b);
    CHECK(http_put_head(&b, 200, "text/event-stream", -1, true, NULL) == 0, "stream head");
    CHECK(b.data && strstr(b.data, "Connection: close") && !strstr(b.data, "Content-Length"), "%s", b.data);
    textbuf_free(&b);
}

int main(void) {
    RUN(test_good_requests);
    RUN(test_prefixes_incomplete);
    RUN(test_hostile_requests);
    RUN(test_limits);
    RUN(test_random_inputs);
    RUN(test_response_head);
    free(copy);
    TEST_EXIT();
}
