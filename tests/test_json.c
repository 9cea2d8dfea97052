/* test_json.c — the JSON reader and writer (model/json.c) on valid documents
 * of every value type, the RFC 8259 corner cases that must be refused (with
 * the error's source, offset, line and column checked), every truncation of a
 * sample document, nesting bombs, JsonBuf escaping round trips, lookups in
 * large objects with duplicate keys, and the parse speed of a generated
 * tokenizer.json-sized file.
 *
 * Every input is copied into a buffer of exactly its length (no NUL after
 * it), so under AddressSanitizer a read past the end fails the test.
 */
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "base/json.h"
#include "tests/test.h"

/* Parses text[0..len) from an exact-size heap copy. */
static Json *parse_n(const char *text, size_t len, const char *source, Err *err) {
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    Json *doc = json_parse(copy, len, source, err);
    free(copy);
    return doc;
}

static Json *parse(const char *text, Err *err) { return parse_n(text, strlen(text), "doc.json", err); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool str_is(const JsonValue *v, const char *s, size_t n) {
    return v && v->type == JSON_STRING && v->u.string.len == n && !memcmp(v->u.string.s, s, n) && v->u.string.s[n] == 0;
}

static void test_value_types(void) {
    Err err = {0};
    const char *text = " {\"null\": null, \"t\": true, \"f\": false, \"n\": -12.5e1, \"i\": 42,\n"
                       "  \"s\": \"hi\", \"a\": [1, [2, []], {}], \"o\": {\"k\": \"v\"}, \"e\": \"\"} \r\n\t";
    Json *doc = parse(text, &err);
    CHECK(doc, "parse failed: %s", err.msg);
    if (!doc) return;
    const JsonValue *r = json_root(doc);
    CHECK(r->type == JSON_OBJECT && json_len(r) == 9, "root: type %d, %zu members", r->type, json_len(r));
    CHECK(json_get(r, "null") && json_get(r, "null")->type == JSON_NULL, "null");
    CHECK(json_get_bool(r, "t", false) == true && json_get_bool(r, "f", true) == false, "booleans");
    CHECK(json_get_num(r, "n", 0) == -125.0, "n = %g", json_get_num(r, "n", 0));
    CHECK(json_get_int(r, "n", -1) == -1, "a number with '.' or 'e' is not is_int");
    CHECK(json_get_int(r, "i", -1) == 42 && json_get_num(r, "i", 0) == 42.0, "i");
    CHECK(!strcmp(json_get_str(r, "s", "?"), "hi"), "s");
    CHECK(str_is(json_get(r, "e"), "", 0), "empty string");
    const JsonValue *a = json_get(r, "a");
    CHECK(json_len(a) == 3 && json_at(a, 0)->u.number.i == 1, "array");
    CHECK(json_len(json_at(a, 1)) == 2 && json_len(json_at(json_at(a, 1), 1)) == 0, "nested arrays");
    CHECK(json_at(a, 2)->type == JSON_OBJECT && json_len(json_at(a, 2)) == 0, "empty object");
    CHECK(json_at(a, 3) == NULL && json_at(r, 0) == NULL, "json_at out of range / on an object");
    CHECK(!strcmp(json_get_str(json_get(r, "o"), "k", "?"), "v"), "nested object");
    /* Wrong types and missing members give the defaults. */
    CHECK(json_get_num(r, "s", 7.5) == 7.5 && json_get_int(r, "s", 3) == 3, "defaults on wrong type");
    CHECK(json_get_bool(r, "i", true) == true && !strcmp(json_get_str(r, "i", "d"), "d"), "defaults on wrong type");
    CHECK(json_get(r, "missing") == NULL && json_get(a, "k") == NULL && json_get(NULL, "k") == NULL, "missing");
    CHECK(json_len(json_get(r, "s")) == 0 && json_len(NULL) == 0, "json_len of a scalar");
    json_free(doc);
    /* Scalars at the root. */
    const char *roots[] = {"null", "true", "0", "\"x\"", " [ ] "};
    for (size_t i = 0; i < sizeof roots / sizeof *roots; i++) {
        doc = parse(roots[i], &err);
        CHECK(doc, "root %s: %s", roots[i], err.msg);
        json_free(doc);
    }
}

static void test_strings(void) {
    Err err = {0};
    const char *text = "[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\\ud83d\\ude00\", \"a\\u0000b\","
                       " \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\", \"\\uD834\\uDD1E\", \"\\u007f\\u0080\\u07ff\\u0800\\uffff\"]";
    Json *doc = parse(text, &err);
    CHECK(doc, "parse failed: %s", err.msg);
    if (!doc) return;
    const JsonValue *r = json_root(doc);
    CHECK(str_is(json_at(r, 0), "\"\\/\b\f\n\r\t", 8), "simple escapes");
    CHECK(str_is(json_at(r, 1), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9), "\\u escapes and a surrogate pair");
    CHECK(str_is(json_at(r, 2), "a\0b", 3), "\\u0000 kept, length 3");
    CHECK(str_is(json_at(r, 3), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14), "raw UTF-8 kept");
    CHECK(str_is(json_at(r, 4), "\xf0\x9d\x84\x9e", 4), "U+1D11E from upper-case hex");
    CHECK(str_is(json_at(r, 5), "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf", 11), "UTF-8 length boundaries");
    json_free(doc);
}

static void test_numbers(void) {
    Err err = {0};
    const char *text = "[-0, 0, -1, 1.5, 1e308, 1e-320, 9223372036854775807, -9223372036854775808,"
                       " 9223372036854775808, -9223372036854775809, 123456789012345678901234567890, 1E400, -1e400,"
                       " 0.1, 2.5e-3, 1.7976931348623157e308, 4.9e-324, 1e-400, 0e0, -0.0, 10E+2, 100000000000000000000000]";
    Json *doc = parse(text, &err);
    CHECK(doc, "parse failed: %s", err.msg);
    if (!doc) return;
    const JsonValue *r = json_root(doc);
    const JsonValue *v0 = json_at(r, 0);
    CHECK(v0->u.number.is_int && v0->u.number.i == 0 && v0->u.number.num == 0 && signbit(v0->u.number.num), "-0");
    CHECK(json_at(r, 1)->u.number.is_int && !signbit(json_at(r, 1)->u.number.num), "0");
    CHECK(json_at(r, 2)->u.number.is_int && json_at(r, 2)->u.number.i == -1, "-1");
    struct { size_t i; double want; bool is_int; } cases[] = {
        {3, 1.5, false}, {4, 1e308, false}, {5, 1e-320, false},
        {6, 9223372036854775807.0, true}, {7, -9223372036854775808.0, true},
        {8, 9223372036854775808.0, false}, {9, -9223372036854775809.0, false},
        {10, 123456789012345678901234567890.0, false}, {11, INFINITY, false}, {12, -INFINITY, false},
        {13, 0.1, false}, {14, 2.5e-3, false}, {15, 1.7976931348623157e308, false}, {16, 4.9e-324, false},
        {17, 0.0, false}, {18, 0.0, false}, {19, -0.0, false}, {20, 1000.0, false}, {21, 1e23, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const JsonValue *v = json_at(r, cases[k].i);
        CHECK(v && v->type == JSON_NUMBER && v->u.number.num == cases[k].want &&
                  !!signbit(v->u.number.num) == !!signbit(cases[k].want) && v->u.number.is_int == cases[k].is_int,
              "item %zu: %.17g is_int %d (want %.17g, %d)", cases[k].i, v ? v->u.number.num : 0.0,
              v ? v->u.number.is_int : -1, cases[k].want, cases[k].is_int);
    }
    CHECK(json_at(r, 6)->u.number.i == INT64_MAX && json_at(r, 7)->u.number.i == INT64_MIN, "int64 limits exact");
    json_free(doc);

    /* Random doubles printed with 17 digits must come back bit-exact (the C
     * library's printf is the reference), and random int64s exactly. */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int bad = 0;
    for (int k = 0; k < 2000; k++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        double d;
        uint64_t bits = s;
        memcpy(&d, &bits, 8);
        if (!isfinite(d)) continue;
        char buf[64];
        snprintf(buf, sizeof buf, k % 2 ? "%.17g" : "%.17e", d);
        int64_t iv = (int64_t)s;
        char ibuf[32];
        snprintf(ibuf, sizeof ibuf, "%lld", (long long)iv);
        Json *a = parse(buf, &err), *b = parse(ibuf, &err);
        if (!a || json_root(a)->u.number.num != d || !!signbit(json_root(a)->u.number.num) != !!signbit(d)) bad++;
        if (!b || !json_root(b)->u.number.is_int || json_root(b)->u.number.i != iv) bad++;
        json_free(a);
        json_free(b);
    }
    CHECK(bad == 0, "%d random numbers did not round-trip", bad);
}

/* Numbers must not depend on LC_NUMERIC: under a comma-decimal locale plain
 * strtod stops at the '.'. When no such locale is installed, one is compiled
 * with localedef into a temporary LOCPATH (about a second). */
static const char *set_comma_locale(char *tmpdir) {
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (setlocale(LC_NUMERIC, names[i])) return names[i];
    if (!mkdtemp(tmpdir)) return NULL;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", tmpdir);
    if (system(cmd) != 0) return NULL;
    setenv("LOCPATH", tmpdir, 1);
    return setlocale(LC_NUMERIC, "de_DE.UTF-8") ? "de_DE.UTF-8 (compiled by localedef)" : NULL;
}

static void test_numbers_locale(void) {
    char tmpdir[] = "/tmp/cllm-locale-XXXXXX";
    const char *got = set_comma_locale(tmpdir);
    if (!got) {
        printf("# note: no comma-decimal locale and localedef failed; locale independence not exercised\n");
    } else {
        CHECK(strtod("0.5", NULL) == 0.0, "locale %s does not use a decimal comma", got);
        Err err = {0};
        Json *doc = parse("[0.5, 1.25e2, -3.75, 1e-320]", &err);
        const JsonValue *r = json_root(doc);
        CHECK(doc && json_at(r, 0)->u.number.num == 0.5 && json_at(r, 1)->u.number.num == 125.0 &&
                  json_at(r, 2)->u.number.num == -3.75 && json_at(r, 3)->u.number.num == 1e-320,
              "numbers under locale %s: %s", got, doc ? "wrong values" : err.msg);
        json_free(doc);
        setlocale(LC_NUMERIC, "C");
    }
    if (strcmp(tmpdir + strlen(tmpdir) - 6, "XXXXXX")) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        CHECK(system(cmd) == 0, "%s", cmd);
        unsetenv("LOCPATH");
    }
}

/* Each invalid document with the offset its error must name and a piece of
 * the message. */
typedef struct { const char *text; size_t len; size_t offset; const char *msg; } Bad;
#define BAD(t, off, m) {t, sizeof(t) - 1, off, m}

static const Bad bad_docs[] = {
    BAD("", 0, "unexpected end of input"),
    BAD("   ", 3, "unexpected end of input"),
    BAD("[1,]", 3, "unexpected character ']'"),
    BAD("{\"a\":1,}", 7, "expected a string key"),
    BAD("[1,,2]", 3, "unexpected character ','"),
    BAD("[,1]", 1, "unexpected character ','"),
    BAD("[01]", 1, "leading zero"),
    BAD("[-01]", 2, "leading zero"),
    BAD("[00]", 1, "leading zero"),
    BAD("[1.]", 3, "digit expected after '.'"),
    BAD("[.5]", 1, "unexpected character '.'"),
    BAD("[1e]", 3, "digit expected in exponent"),
    BAD("[1e+]", 4, "digit expected in exponent"),
    BAD("[+1]", 1, "unexpected character '+'"),
    BAD("[-]", 2, "digit expected in number"),
    BAD("-", 1, "digit expected in number"),
    BAD("[0x10]", 2, "expected ',' or ']' in array"),
    BAD("[NaN]", 1, "unexpected character 'N'"),
    BAD("[Infinity]", 1, "unexpected character 'I'"),
    BAD("[1 2]", 3, "expected ',' or ']' in array"),
    BAD("{\"a\":1 \"b\":2}", 7, "expected ',' or '}' in object"),
    BAD("{\"a\" 1}", 5, "expected ':' after key"),
    BAD("{\"a\":}", 5, "unexpected character '}'"),
    BAD("{1:2}", 1, "expected a string key"),
    BAD("{'a':1}", 1, "expected a string key"),
    BAD("['a']", 1, "unexpected character '''"),
    BAD("[\"a\"\"b\"]", 4, "expected ',' or ']'"),
    BAD("[\"a\x01\"]", 3, "control character 0x01"),
    BAD("[\"a\tb\"]", 3, "control character 0x09"),
    BAD("[\"a\nb\"]", 3, "control character 0x0a"),
    BAD("[\"\\x\"]", 2, "invalid escape '\\x'"),
    BAD("[\"\\'\"]", 2, "invalid escape"),
    BAD("[\"\\u12\"]", 2, "bad \\u escape"),
    BAD("[\"\\u00G0\"]", 2, "bad \\u escape"),
    BAD("[\"\\ud800\"]", 2, "high surrogate \\uD800 not followed"),
    BAD("[\"\\ud800\\u0041\"]", 2, "not followed by a low surrogate"),
    BAD("[\"\\ud800\\ud800\"]", 2, "not followed by a low surrogate"),
    BAD("[\"x\\udc00\"]", 3, "lone low surrogate \\uDC00"),
    BAD("[\"\\uDFFF\"]", 2, "lone low surrogate"),
    BAD("[\"\xff\"]", 2, "invalid UTF-8 byte 0xff"),
    BAD("[\"ab\xc3\"]", 4, "invalid UTF-8 byte 0xc3"),
    BAD("[\"\xc0\xaf\"]", 2, "invalid UTF-8"),                 /* overlong '/' */
    BAD("[\"\xe0\x80\xaf\"]", 2, "invalid UTF-8"),             /* overlong 3-byte */
    BAD("[\"\xed\xa0\x80\"]", 2, "invalid UTF-8"),             /* UTF-8 encoded surrogate */
    BAD("[\"\xf4\x90\x80\x80\"]", 2, "invalid UTF-8"),         /* past U+10FFFF */
    BAD("[\"\x80\"]", 2, "invalid UTF-8 byte 0x80"),           /* lone continuation */
    BAD("[\"\xe2\x82\"]", 2, "invalid UTF-8"),                 /* cut sequence */
    BAD("\xef\xbb\xbf{}", 0, "unexpected byte 0xef"),          /* BOM */
    BAD("[1] x", 4, "unexpected text after the JSON value"),
    BAD("[1][2]", 3, "unexpected text after"),
    BAD("{} {}", 3, "unexpected text after"),
    BAD("[1]\0", 3, "unexpected text after"),
    BAD("\0", 0, "unexpected byte 0x00"),
    BAD("nul", 0, "invalid literal (expected 'null')"),
    BAD("[tru]", 1, "invalid literal (expected 'true')"),
    BAD("[True]", 1, "unexpected character 'T'"),
    BAD("[falsee]", 6, "expected ',' or ']'"),
    BAD("[\"abc", 5, "unterminated string (opened at offset 1)"),
    BAD("[\"abc\\\"]", 8, "unterminated string"),
    BAD("[\"\\", 3, "unterminated string"),
    BAD("[1", 2, "expected ',' or ']' in array"),
    BAD("{\"a\":1", 6, "expected ',' or '}' in object"),
    BAD("{\"a\"", 4, "expected ':' after key"),
    BAD("[\x0b]", 1, "unexpected byte 0x0b"),                  /* vertical tab is not whitespace */
    BAD("[\xc2\xa0]", 1, "unexpected byte 0xc2"),              /* nor is U+00A0 */
};

static void test_invalid(void) {
    for (size_t i = 0; i < sizeof bad_docs / sizeof *bad_docs; i++) {
        const Bad *b = &bad_docs[i];
        Err err = {0};
        Json *doc = parse_n(b->text, b->len, "bad.json", &err);
        CHECK(!doc, "case %zu was accepted", i);
        json_free(doc);
        char want[64];
        snprintf(want, sizeof want, "bad.json: offset %zu (", b->offset);
        CHECK(strstr(err.msg, want) == err.msg, "case %zu: '%s' does not start with '%s'", i, err.msg, want);
        CHECK(strstr(err.msg, b->msg) != NULL, "case %zu: '%s' does not say '%s'", i, err.msg, b->msg);
    }
}

static void test_error_position(void) {
    Err err = {0};
    const char *text = "{\n  \"a\": 1,\n  \"b\": [true,\n        fals]\n}";
    Json *doc = parse_n(text, strlen(text), "config.json", &err);
    CHECK(!doc, "accepted");
    const char *want = "config.json: offset 34 (line 4, column 9): invalid literal (expected 'false')";
    CHECK(!strcmp(err.msg, want), "got '%s', want '%s'", err.msg, want);
    doc = parse_n("{\"x\": 1 ]", 9, NULL, &err);
    CHECK(!doc && !strcmp(err.msg, "JSON: offset 8 (line 1, column 9): expected ',' or '}' in object"), "got '%s'", err.msg);
    json_free(doc);
    /* json_parse_file names the path, for I/O errors and parse errors alike. */
    char dir[] = "/tmp/cllm-json-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128];
    snprintf(path, sizeof path, "%s/missing.json", dir);
    CHECK(!json_parse_file(path, &err) && strstr(err.msg, path) == err.msg && strstr(err.msg, "cannot open"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "wb");
    fputs("{\"k\": [1, 2,]}", f);
    fclose(f);
    CHECK(!json_parse_file(path, &err) && strstr(err.msg, path) == err.msg && strstr(err.msg, "offset 12"), "%s", err.msg);
    f = fopen(path, "wb");
    fputs("{\"k\": [1, 2]}\n", f);
    fclose(f);
    doc = json_parse_file(path, &err);
    CHECK(doc && json_len(json_get(json_root(doc), "k")) == 2, "good file: %s", err.msg);
    json_free(doc);
    unlink(path);
    rmdir(dir);
}

/* Every proper prefix of a document whose root is an object is invalid and
 * its error offset lies inside the prefix; the whole document is valid. */
static void test_truncations(void) {
    const char *sample = "{\"name\": \"caf\xc3\xa9 \\u00e9\\ud83d\\ude00\", \"n\": [-1.5e-3, 0, 12345678901234567890, true,"
                         " false, null], \"nested\": {\"a\": [[], {}], \"b\\\"\": \"\\\\\"}, \"last\": -0}";
    size_t n = strlen(sample);
    Err err = {0};
    Json *doc = parse_n(sample, n, "sample.json", &err);
    CHECK(doc, "whole sample: %s", err.msg);
    json_free(doc);
    for (size_t len = 0; len < n; len++) {
        doc = parse_n(sample, len, "sample.json", &err);
        CHECK(!doc, "prefix of %zu bytes accepted", len);
        json_free(doc);
        size_t off = 0;
        CHECK(sscanf(err.msg, "sample.json: offset %zu", &off) == 1 && off <= len, "prefix %zu: %s", len, err.msg);
    }
}

static void test_depth(void) {
    Err err = {0};
    size_t n = 100000;
    char *bomb = malloc(2 * n);
    memset(bomb, '[', n);
    memset(bomb + n, ']', n);
    Json *doc = parse_n(bomb, 2 * n, "bomb.json", &err);
    CHECK(!doc && strstr(err.msg, "nesting deeper than 256 levels") && strstr(err.msg, "offset 256 "), "%s", err.msg);
    /* Exactly the limit is fine; one more is not. */
    doc = parse_n(bomb + n - JSON_MAX_DEPTH, 2 * JSON_MAX_DEPTH, "deep.json", &err);
    CHECK(doc, "depth %d: %s", JSON_MAX_DEPTH, err.msg);
    json_free(doc);
    doc = parse_n(bomb + n - JSON_MAX_DEPTH - 1, 2 * JSON_MAX_DEPTH + 2, "deep.json", &err);
    CHECK(!doc && strstr(err.msg, "nesting deeper"), "depth %d accepted", JSON_MAX_DEPTH + 1);
    json_free(doc);
    /* Objects nest the same way: {"a":{"a":... */
    char *obj = malloc(5 * n);
    for (size_t i = 0; i < n; i++) memcpy(obj + 5 * i, "{\"a\":", 5);
    doc = parse_n(obj, 5 * n, "objbomb.json", &err);
    CHECK(!doc && strstr(err.msg, "nesting deeper"), "%s", err.msg);
    free(obj);
    free(bomb);
}

/* What jsonbuf_put_string writes, as a C string. */
static char *put(const char *s, size_t n) {
    JsonBuf b = {0};
    CHECK(jsonbuf_put_string(&b, s, n) == 0, "put failed");
    CHECK(b.data && strlen(b.data) == b.len, "length / NUL");
    return b.data;
}

static void test_jsonbuf_escapes(void) {
    struct { const char *in; size_t n; const char *out; } cases[] = {
        {"plain", 5, "\"plain\""},
        {"q\"b\\s/", 6, "\"q\\\"b\\\\s/\""},
        {"\n\r\t\b\f", 5, "\"\\n\\r\\t\\u0008\\u000c\""},
        {"\x01\x1f\x7f", 3, "\"\\u0001\\u001f\\u007f\""},
        {"a\0b", 3, "\"a\\u0000b\""},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80", 10, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\""},
        {"a\xff" "b", 3, "\"a\\ufffdb\""},
        {"\xc3", 1, "\"\\ufffd\""},
        {"\xc0\xaf", 2, "\"\\ufffd\\ufffd\""},
        {"\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""},
        {"\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""},
        {"\xe2\x82" "x", 3, "\"\\ufffd\\ufffdx\""},
        {"", 0, "\"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *got = put(cases[i].in, cases[i].n);
        CHECK(got && !strcmp(got, cases[i].out), "case %zu: got %s want %s", i, got, cases[i].out);
        free(got);
    }
    JsonBuf b = {0};
    CHECK(jsonbuf_printf(&b, "{\"id\": %d, \"s\": ", 7) == 0 && jsonbuf_put_string(&b, "x\"", 2) == 0 &&
              jsonbuf_printf(&b, ", \"f\": %.3f}", 0.25) == 0,
          "appends");
    CHECK(b.data && !strcmp(b.data, "{\"id\": 7, \"s\": \"x\\\"\", \"f\": 0.250}"), "got %s", b.data);
    /* Many appends grow the buffer. */
    for (int i = 0; i < 5000; i++) jsonbuf_printf(&b, "%d,", i);
    CHECK(b.len == strlen(b.data) && b.len > 20000, "grown to %zu", b.len);
    jsonbuf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0, "free zeroes");
}

/* Random byte strings: the written literal always parses; valid UTF-8 comes
 * back unchanged, and each byte outside valid UTF-8 comes back as U+FFFD. */
static void test_jsonbuf_roundtrip(void) {
    uint64_t s = 12345;
    int bad = 0, iters = getenv("CLLM_QUICK") ? 500 : 3000;
    unsigned char buf[64];
    static const char *pieces[] = {"a", "\"", "\\", "\n", "\x01", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                   "\xff", "\xc3", "\xed\xa0\x80", "\x7f", "/", "\\u"};
    for (int it = 0; it < iters; it++) {
        size_t n = 0;
        char want[64 * 3];
        size_t wn = 0;
        while (n < 48) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            size_t k = s % (sizeof pieces / sizeof *pieces);
            const char *p = pieces[k];
            size_t pl = strlen(p);
            memcpy(buf + n, p, pl);
            n += pl;
            /* pieces 8..10 are invalid on their own (0xc3 may join a following
             * continuation byte only if one follows; none of the pieces starts
             * with one, so it stays invalid). */
            if (k >= 8 && k <= 10) {
                for (size_t j = 0; j < pl; j++, wn += 3) memcpy(want + wn, "\xef\xbf\xbd", 3);
            } else {
                memcpy(want + wn, p, pl);
                wn += pl;
            }
        }
        char *lit = put((const char *)buf, n);
        Err err = {0};
        Json *doc = lit ? parse(lit, &err) : NULL;
        const JsonValue *r = json_root(doc);
        if (!doc || r->type != JSON_STRING || r->u.string.len != wn || memcmp(r->u.string.s, want, wn)) {
            if (bad++ == 0) printf("  first mismatch: literal %s (%s)\n", lit, doc ? "parsed" : err.msg);
        }
        json_free(doc);
        free(lit);
    }
    CHECK(bad == 0, "%d of %d random strings did not round-trip", bad, iters);
}

/* Objects of 16 members are searched linearly, 17 and more through the
 * index; both must find every key, miss absent ones, and give the last of
 * duplicate keys. */
static void test_lookups(void) {
    int sizes[] = {1, 12, 13, 14, 100, 150000}; /* + 4 members: 16 is linear, 17 hashed */
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        JsonBuf b = {0};
        jsonbuf_printf(&b, "{\"dup\": -1, \"a\\u0000b\": -2");
        for (int i = 0; i < n; i++) jsonbuf_printf(&b, ", \"tok_%d\\u00e9\": %d", i, i);
        jsonbuf_printf(&b, ", \"dup\": -3, \"\": -4}");
        Err err = {0};
        Json *doc = parse_n(b.data, b.len, "big.json", &err);
        jsonbuf_free(&b);
        CHECK(doc, "n=%d: %s", n, err.msg);
        if (!doc) continue;
        const JsonValue *r = json_root(doc);
        CHECK(json_len(r) == (size_t)n + 4, "n=%d: %zu members", n, json_len(r));
        int wrong = 0;
        char key[64];
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            snprintf(key, sizeof key, "tok_%d\xc3\xa9", i);
            if (json_get_int(r, key, -100) != i) wrong++;
            snprintf(key, sizeof key, "tok_%d", i);
            if (json_get(r, key)) wrong++;
        }
        double dt = now_s() - t0;
        CHECK(wrong == 0, "n=%d: %d lookups wrong", n, wrong);
        CHECK(json_get_int(r, "dup", 0) == -3, "n=%d: duplicate key: last must win", n);
        CHECK(json_get_int(r, "", 0) == -4, "n=%d: empty key", n);
        CHECK(json_get(r, "a") == NULL && json_get(r, "ab") == NULL, "n=%d: a key with NUL is not its prefix", n);
        /* 300k lookups: a linear search would take minutes; hashed, milliseconds. */
        if (n == 150000) {
            printf("# note: %d lookups in a %d-member object: %.1f ms\n", 2 * n, n, dt * 1e3);
            CHECK(dt < 3.0, "lookups took %.2f s", dt);
        }
        json_free(doc);
    }
}

/* A tokenizer.json-shaped document of about 10 MB: a 150k vocab of
 * byte-level tokens with escapes and non-ASCII text, 150k merges as pairs,
 * added tokens, floats. */
static char *make_tokenizer_json(size_t *len) {
    JsonBuf b = {0};
    jsonbuf_printf(&b, "{\"version\": \"1.0\", \"truncation\": null, \"added_tokens\": [");
    for (int i = 0; i < 300; i++)
        jsonbuf_printf(&b, "%s{\"id\": %d, \"content\": \"<|reserved_%d|>\", \"single_word\": false, \"special\": true}",
                       i ? ", " : "", 150000 + i, i);
    jsonbuf_printf(&b, "], \"normalizer\": null, \"model\": {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {");
    static const char *frag[] = {"\\u0120", "in", "\\u010a", "er", "\xc3\xa9", "\\\"", "\xe4\xb8\xad", "t", "\\\\", "on"};
    for (int i = 0; i < 150000; i++) {
        jsonbuf_printf(&b, "%s\"", i ? ", " : "");
        for (int k = i, j = 0; j < 4 || k; j++, k /= 10) jsonbuf_printf(&b, "%s", frag[k % 10]);
        jsonbuf_printf(&b, "\": %d", i);
    }
    jsonbuf_printf(&b, "}, \"merges\": [");
    for (int i = 0; i < 150000; i++)
        jsonbuf_printf(&b, "%s[\"%s%d\", \"%s\"]", i ? ", " : "", frag[i % 10], i, frag[(i / 10) % 10]);
    jsonbuf_printf(&b, "]}, \"scores\": [");
    for (int i = 0; i < 250000; i++) jsonbuf_printf(&b, "%s%.9g", i ? ", " : "", -i * 0.001953125 - 1e-7 * i);
    jsonbuf_printf(&b, "]}");
    *len = b.len;
    return b.data;
}

static void test_speed(void) {
    size_t len;
    char *text = make_tokenizer_json(&len);
    Err err = {0};
    double best = 1e9;
    Json *doc = NULL;
    int reps = getenv("CLLM_QUICK") ? 1 : 3;
    for (int rep = 0; rep < reps; rep++) {
        json_free(doc);
        double t0 = now_s();
        doc = json_parse(text, len, "tokenizer.json", &err);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    CHECK(doc, "%s", err.msg);
    const JsonValue *vocab = json_get(json_get(json_root(doc), "model"), "vocab");
    CHECK(json_len(vocab) == 150000, "vocab has %zu members", json_len(vocab));
    CHECK(json_get_int(vocab, "\xc4\xa0" "in" "\xc4\x8a" "\xc4\xa0", -1) == 210, "vocab lookup: %lld",
          (long long)json_get_int(vocab, "\xc4\xa0" "in" "\xc4\x8a" "\xc4\xa0", -1));
    CHECK(json_len(json_get(json_get(json_root(doc), "model"), "merges")) == 150000, "merges");
    printf("# note: parsed a %.1f MB tokenizer.json in %.1f ms (best of %d)\n", len / 1e6, best * 1e3, reps);
    CHECK(len > 10000000, "generated only %zu bytes", len);
#if defined(__SANITIZE_ADDRESS__)
    CHECK(best < 5.0, "parse took %.2f s under ASan", best);
#else
    CHECK(best < 0.5, "parse took %.3f s (limit 0.5 s)", best);
#endif
    json_free(doc);
    free(text);
}

int main(void) {
    RUN(test_value_types);
    RUN(test_strings);
    RUN(test_numbers);
    RUN(test_numbers_locale);
    RUN(test_invalid);
    RUN(test_error_position);
    RUN(test_truncations);
    RUN(test_depth);
    RUN(test_jsonbuf_escapes);
    RUN(test_jsonbuf_roundtrip);
    RUN(test_lookups);
    RUN(test_speed);
    TEST_EXIT();
}
