/* test_stop.c — the streaming stop-string matcher.
 *
 * The oracle is the non-streaming answer: the text up to the earliest
 * occurrence of any stop string (all of it when none occurs). Every case is
 * fed split at every byte position (two pieces), at every pair of positions
 * (three pieces) and byte by byte; the streamed output must equal the oracle,
 * be emitted as early as possible (nothing held that cannot start a stop
 * string or finish a UTF-8 character), never end a chunk inside a UTF-8
 * character, and report the stop exactly when one occurs. */
#include "engine/stop.h"
#include "tests/test.h"

typedef struct {
    const char *text;
    const char *stops[4];
    int n_stops;
} StopCase;

/* The non-streaming oracle: how much of text survives, and whether it stops. */
static size_t oracle_keep(const StopCase *c, bool *stops) {
    const char *first = NULL;
    for (int i = 0; i < c->n_stops; i++) {
        if (!c->stops[i] || !c->stops[i][0]) continue;
        const char *hit = strstr(c->text, c->stops[i]);
        if (hit && (!first || hit < first)) first = hit;
    }
    *stops = first != NULL;
    return first ? (size_t)(first - c->text) : strlen(c->text);
}

/* The most a correct matcher may hold after seeing text[0..seen): the longest
 * tail that is a proper prefix of a stop, widened to a character start. */
static size_t allowed_hold(const StopCase *c, size_t seen) {
    size_t hold = 0;
    for (int i = 0; i < c->n_stops; i++) {
        const char *s = c->stops[i];
        size_t n = s ? strlen(s) : 0;
        for (size_t k = n ? n - 1 : 0; k > hold; k--)
            if (k <= seen && !memcmp(c->text + seen - k, s, k)) { hold = k; break; }
    }
    /* plus the start of a character the seen bytes do not finish */
    size_t cut = seen - hold, q = cut;
    while (q > 0 && cut - q < 3 && ((unsigned char)c->text[q - 1] & 0xC0) == 0x80) q--;
    if (q == 0) return hold;
    unsigned char lead = (unsigned char)c->text[q - 1];
    size_t need = (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 1;
    return need > cut - (q - 1) ? seen - (q - 1) : hold;
}

typedef struct {
    char out[512];
    size_t len;
    bool stopped;
    int bad;       /* checks already failed: report one case once */
} Stream;

static void stream_take(Stream *st, const StopCase *c, StopResult r, size_t seen, const char *how) {
    if (r.emit_len > 0 && st->len + r.emit_len < sizeof st->out) {
        memcpy(st->out + st->len, r.emit, r.emit_len);
        st->len += r.emit_len;
        /* a chunk never ends inside a character: the next text byte is no continuation byte */
        if (st->len < strlen(c->text) && ((unsigned char)c->text[st->len] & 0xC0) == 0x80 && !st->bad++)
            CHECK(0, "'%s' %s: a chunk ends inside a UTF-8 character at %zu", c->text, how, st->len);
    }
    if (r.stopped) st->stopped = true;
    if (!st->stopped && seen - st->len > allowed_hold(c, seen) && !st->bad++)
        CHECK(0, "'%s' %s: holds %zu bytes after %zu, may hold %zu", c->text, how, seen - st->len, seen,
              allowed_hold(c, seen));
}

/* Feeds text cut at the given positions, then flushes; checks the result. */
static void stream_check(const StopCase *c, const size_t *cuts, int n_cuts, const char *how) {
    StopMatcher m;
    stop_matcher_init(&m, c->stops, c->n_stops);
    Stream st = {.len = 0};
    size_t len = strlen(c->text), from = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        stream_take(&st, c, stop_matcher_push(&m, c->text + from, to - from), to, how);
        from = to;
    }
    StopResult r = stop_matcher_flush(&m);
    stream_take(&st, c, r, len, how);
    bool want_stop;
    size_t keep = oracle_keep(c, &want_stop);
    if (!st.bad) {
        CHECK(st.len == keep && !memcmp(st.out, c->text, keep), "'%s' %s: got '%.*s', want '%.*s'", c->text, how,
              (int)st.len, st.out, (int)keep, c->text);
        CHECK(st.stopped == want_stop, "'%s' %s: stopped %d, want %d", c->text, how, st.stopped, want_stop);
    }
    stop_matcher_free(&m);
}

static const StopCase CASES[] = {
    {"Hello world", {NULL}, 0},
    {"Hello END world", {"END"}, 1},
    {"Hello EN", {"END"}, 1},                          /* a partial match at the end is text */
    {"ENENDEND", {"END"}, 1},
    {"aaab", {"aab"}, 1},                              /* the match starts inside a held prefix */
    {"xxabcd", {"bcd", "abc"}, 2},                     /* overlapping stops: the earliest start wins */
    {"zxab", {"ab", "xab"}, 2},
    {"one\n\nUser: two", {"\n\nUser:", "\n\n###"}, 2},
    {"one\n\n##x\n\n###", {"\n\nUser:", "\n\n###"}, 2},
    {"<|im_end|> tail", {"<|im_end|>"}, 1},
    {"これは日本語です", {"日本"}, 1},                   /* multi-byte stop */
    {"café → done", {"é"}, 1},
    {"cafè! no stop", {"é"}, 1},                       /* shares é's lead byte, never matches */
    {"emoji 😀😃 and 🇫🇷 flags", {"🙂"}, 1},             /* 4-byte characters, no stop */
    {"stop at 😃 here", {"😃 h"}, 1},
    {"ab", {"", NULL, "b"}, 3},                         /* empty and NULL stops are ignored */
    {"a\xe2 broken \xff utf8 \xf0\x9f end", {"zz"}, 1}, /* invalid bytes are emitted, not held forever */
};
#define N_CASES (int)(sizeof CASES / sizeof CASES[0])

static void test_every_split(void) {
    int runs = 0;
    for (int k = 0; k < N_CASES; k++) {
        const StopCase *c = &CASES[k];
        size_t len = strlen(c->text);
        stream_check(c, NULL, 0, "whole");
        for (size_t i = 0; i <= len; i++, runs++) stream_check(c, &i, 1, "two pieces");
        for (size_t i = 0; i <= len; i++)
            for (size_t j = i; j <= len; j++, runs++) stream_check(c, (size_t[]){i, j}, 2, "three pieces");
        size_t bytes[64];
        for (size_t i = 1; i < len && i <= 64; i++) bytes[i - 1] = i;
        stream_check(c, bytes, len > 1 ? (int)(len - 1 < 64 ? len - 1 : 64) : 0, "byte by byte");
    }
    printf("  %d streamed runs\n", runs);
}

/* The exact hold-back and what happens after a stop. */
static void test_hold_and_after_stop(void) {
    const char *stops[] = {"END"};
    StopMatcher m;
    stop_matcher_init(&m, stops, 1);
    StopResult r = stop_matcher_push(&m, "Hello E", 7);
    CHECK(r.emit_len == 6 && !memcmp(r.emit, "Hello ", 6) && !r.stopped, "emitted %zu", r.emit_len);
    r = stop_matcher_push(&m, "N", 1);
    CHECK(r.emit_len == 0 && !r.stopped, "emitted %zu", r.emit_len);
    r = stop_matcher_push(&m, "Dless", 5);
    CHECK(r.emit_len == 0 && r.stopped, "stop not reported");
    r = stop_matcher_push(&m, "more", 4);
    CHECK(r.emit_len == 0 && r.stopped, "text after the stop");
    r = stop_matcher_flush(&m);
    CHECK(r.emit_len == 0 && r.stopped, "flush after the stop");
    stop_matcher_free(&m);

    /* No stops at all (NULL array): each piece passes through unchanged. */
    stop_matcher_init(&m, NULL, 3);
    r = stop_matcher_push(&m, "abc", 3);
    CHECK(r.emit_len == 3 && !memcmp(r.emit, "abc", 3), "pass-through");
    r = stop_matcher_push(&m, "", 0);
    CHECK(r.emit_len == 0 && r.emit && !r.stopped, "empty push");
    stop_matcher_free(&m);
}

/* A long stream: held text stays bounded and everything comes out. */
static void test_long_stream(void) {
    const char *stops[] = {"<|im_end|>", "\n\nUser:"};
    StopMatcher m;
    stop_matcher_init(&m, stops, 2);
    size_t total = 0, pushed = 0;
    int n = getenv("CLLM_QUICK") ? 2000 : 20000;
    for (int i = 0; i < n; i++) {
        const char *piece = i % 3 == 0 ? "<|im" : i % 3 == 1 ? " word\n" : "é";
        StopResult r = stop_matcher_push(&m, piece, strlen(piece));
        pushed += strlen(piece);
        total += r.emit_len;
        CHECK(pushed - total < 16, "holding %zu bytes", pushed - total);
        if (pushed - total >= 16) break;
    }
    total += stop_matcher_flush(&m).emit_len;
    CHECK(total == pushed, "emitted %zu of %zu", total, pushed);
    CHECK(m.buf.cap <= 1024, "buffer grew to %zu", m.buf.cap);
    stop_matcher_free(&m);
}

int main(void) {
    RUN(test_every_split);
    RUN(test_hold_and_after_stop);
    RUN(test_long_stream);
    TEST_EXIT();
}
