/* test_tokenizer.c — the tokenizers against Hugging Face.
 *
 * 1. Parity: every line of tests/fixtures/tokenizer/corpus.txt through every
 *    tokenizer (real SmolLM2 and Gemma 3 GGUFs, SmolLM2's tokenizer.json,
 *    synthetic Llama 3 / Qwen 2 / Llama 2-style tokenizers as tokenizer.json
 *    and GGUF) must give the ids HF gave (make_tokenizer_fixtures.py), with
 *    parse_special on and off, and the BOS rule; streaming detok of those ids
 *    must equal HF's decode (round trip where HF round-trips).
 * 2. NFC against unicodedata; detok of characters split over byte tokens and
 *    of invalid sequences; special ids and end-of-generation ids.
 * 3. Bad files: each error names the file and the field.
 * 4. Garbage input never crashes and gives ids in range; throughput on
 *    English (printed as a note; floor 1 MB/s).
 */
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "test.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

static bool quick(void) {
    const char *q = getenv("CLLM_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *models_dir(void) {
    const char *d = getenv("CLLM_MODELS");
    return d && *d ? d : "models/cache";
}

/* ---- fixture reading ------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n;
} Bytes;

static int b64_val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

static Bytes b64_decode(const char *s, size_t n) {
    Bytes b = {malloc(n / 4 * 3 + 4), 0};
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            b.p[b.n++] = (char)((acc >> bits) & 0xFF);
        }
    }
    return b;
}

/* Lines of a fixture file, '#' comments dropped. */
typedef struct {
    char **line;
    size_t n;
} Lines;

static Lines read_lines(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/%s", test_fixture_dir(), rel);
    Lines l = {0};
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL, "%s missing: run tests/fixtures/make_tokenizer_fixtures.py", path);
    if (!fp) return l;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t k;
    while ((k = getline(&buf, &cap, fp)) >= 0) {
        if (k > 0 && buf[k - 1] == '\n') buf[--k] = 0;
        if (buf[0] == '#') continue;
        l.line = realloc(l.line, (l.n + 1) * sizeof *l.line);
        l.line[l.n++] = strdup(buf);
    }
    free(buf);
    fclose(fp);
    return l;
}

static void lines_free(Lines *l) {
    for (size_t i = 0; i < l->n; i++) free(l->line[i]);
    free(l->line);
}

static Bytes *corpus;
static size_t n_corpus;

static void corpus_load(void) {
    Lines l = read_lines("corpus.txt");
    corpus = calloc(l.n ? l.n : 1, sizeof *corpus);
    for (size_t i = 0; i < l.n; i++) corpus[i] = b64_decode(l.line[i], strlen(l.line[i]));
    n_corpus = l.n;
    lines_free(&l);
}

/* Expected ids: S (parse_special on) and N (off) per corpus line, D (HF
 * decode, base64) and B (line 0 with add_special_tokens). */
typedef struct {
    TokenIds *s, *n;
    Bytes *d;
    TokenIds b;
} Expected;

static void parse_ids(const char *p, TokenIds *out) {
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        token_ids_push(out, (int32_t)v);
        p = end;
    }
}

static Expected expected_load(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "expected/%s.txt", name);
    Lines l = read_lines(rel);
    Expected e = {calloc(n_corpus + 1, sizeof(TokenIds)), calloc(n_corpus + 1, sizeof(TokenIds)),
                  calloc(n_corpus + 1, sizeof(Bytes)), {0}};
    for (size_t i = 0; i < l.n; i++) {
        char tag = l.line[i][0];
        char *rest;
        if (tag == 'B') {
            parse_ids(l.line[i] + 1, &e.b);
            continue;
        }
        long idx = strtol(l.line[i] + 2, &rest, 10);
        if (idx < 0 || (size_t)idx >= n_corpus) continue;
        if (tag == 'S') parse_ids(rest, &e.s[idx]);
        else if (tag == 'N') parse_ids(rest, &e.n[idx]);
        else if (tag == 'D') e.d[idx] = b64_decode(rest, strlen(rest));
    }
    lines_free(&l);
    return e;
}

static void expected_free(Expected *e) {
    for (size_t i = 0; i < n_corpus; i++) {
        token_ids_free(&e->s[i]);
        token_ids_free(&e->n[i]);
        free(e->d[i].p);
    }
    free(e->s);
    free(e->n);
    free(e->d);
    token_ids_free(&e->b);
}

/* ---- the tokenizers under test ------------------------------------------------------ */

typedef struct {
    const char *name;     /* for messages */
    const char *gguf;     /* model file (under CLLM_MODELS) or fixture GGUF, or NULL */
    bool gguf_is_model;
    const char *json_dir; /* fixture folder with tokenizer.json, or NULL */
    const char *expected;
    bool lossy; /* the pipeline changes text: no round trip expected */
    Tokenizer *tok;
    GGUFFile f;
    bool f_open;
} Case;

static Case cases[] = {
    {"smollm2 (GGUF)", "smollm2-135m-instruct.gguf", true, NULL, "smollm2", false, NULL, {0}, false},
    {"smollm2 (tokenizer.json)", NULL, false, "smollm2", "smollm2", false, NULL, {0}, false},
    {"gemma3 (GGUF)", "gemma3-270m.gguf", true, NULL, "gemma3", false, NULL, {0}, false},
    {"llama3syn (tokenizer.json)", NULL, false, "llama3syn", "llama3syn", false, NULL, {0}, false},
    {"llama3syn (GGUF)", "llama3syn/llama3syn.gguf", false, NULL, "llama3syn", false, NULL, {0}, false},
    {"qwen2syn (tokenizer.json)", NULL, false, "qwen2syn", "qwen2syn_json", false, NULL, {0}, false},
    {"qwen2syn (GGUF)", "qwen2syn/qwen2syn.gguf", false, NULL, "qwen2syn_gguf", false, NULL, {0}, false},
    {"llama2syn (tokenizer.json)", NULL, false, "llama2syn", "llama2syn", false, NULL, {0}, false},
    {"llama2legacy (tokenizer.json)", NULL, false, "llama2legacy", "llama2legacy", false, NULL, {0}, false},
    {"llama2syn (GGUF)", "llama2syn/llama2syn.gguf", false, NULL, "llama2syn_gguf", false, NULL, {0}, false},
    {"misc (tokenizer.json)", NULL, false, "misc", "misc", true, NULL, {0}, false},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static Tokenizer *case_load(Case *c, Err *err) {
    char path[1024], cfg[1024];
    if (c->gguf) {
        if (c->gguf_is_model) snprintf(path, sizeof path, "%s/%s", models_dir(), c->gguf);
        else snprintf(path, sizeof path, "%s/tokenizer/%s", test_fixture_dir(), c->gguf);
        if (gguf_open(&c->f, path, err)) {
            if (c->gguf_is_model) strncat(err->msg, " (run models/fetch.sh or set CLLM_MODELS)", 200);
            return NULL;
        }
        c->f_open = true;
        Tokenizer *t = NULL;
        tokenizer_load_gguf(&t, &c->f, err);
        return t;
    }
    snprintf(path, sizeof path, "%s/tokenizer/%s/tokenizer.json", test_fixture_dir(), c->json_dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer/%s/tokenizer_config.json", test_fixture_dir(), c->json_dir);
    Tokenizer *t = NULL;
    FILE *fp = fopen(cfg, "r"); /* a folder may have no tokenizer_config.json */
    if (fp) fclose(fp);
    tokenizer_load_hf(&t, path, fp ? cfg : NULL, err);
    return t;
}

static Case *find_case(const char *name) {
    for (size_t i = 0; i < N_CASES; i++)
        if (!strcmp(cases[i].name, name)) return &cases[i];
    return NULL;
}

/* ---- 1. parity ----------------------------------------------------------------------- */

static bool bytes_equal(const void *a, size_t an, const void *b, size_t bn) {
    return an == bn && (an == 0 || !memcmp(a, b, an));
}

static bool ids_equal(const TokenIds *a, const TokenIds *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->ids, b->ids, a->n * sizeof *a->ids));
}

/* First index where a and b differ (or the shorter length). */
static size_t first_diff(const TokenIds *a, const TokenIds *b) {
    size_t i = 0;
    while (i < a->n && i < b->n && a->ids[i] == b->ids[i]) i++;
    return i;
}

static int compare_line(const Case *c, size_t line, bool special, const TokenIds *want) {
    Err err = {{0}};
    TokenIds got = {0};
    int rc = tokenizer_encode(c->tok, corpus[line].p, corpus[line].n, special, false, &got, &err);
    CHECK(rc == 0, "%s line %zu: %s", c->name, line, err.msg);
    bool same = ids_equal(&got, want);
    if (!same) {
        size_t k = first_diff(&got, want);
        printf("  %s line %zu (parse_special %s): %zu ids vs HF %zu; first difference at %zu: got %d, HF %d\n",
               c->name, line, special ? "on" : "off", got.n, want->n, k, k < got.n ? got.ids[k] : -1,
               k < want->n ? want->ids[k] : -1);
    }
    token_ids_free(&got);
    return same ? 0 : 1;
}

/* detok over ids: all bytes, as a caller streaming to a terminal sees them. */
static Bytes detok_all(const Tokenizer *t, const TokenIds *ids) {
    Bytes b = {malloc(ids->n * 600 + 64), 0};
    Detok d;
    detok_init(&d);
    for (size_t i = 0; i < ids->n; i++) b.n += (size_t)detok_push(t, &d, ids->ids[i], b.p + b.n, 512);
    b.n += (size_t)detok_flush(&d, b.p + b.n, 64);
    return b;
}

static void check_case(Case *c) {
    Expected e = expected_load(c->expected);
    int bad_s = 0, bad_n = 0, bad_d = 0, round_trips = 0;
    for (size_t i = 0; i < n_corpus; i++) {
        bad_s += compare_line(c, i, true, &e.s[i]);
        bad_n += compare_line(c, i, false, &e.n[i]);
        Bytes d = detok_all(c->tok, &e.s[i]);
        if (!bytes_equal(d.p, d.n, e.d[i].p, e.d[i].n)) {
            bad_d++;
            printf("  %s line %zu: detok gives %zu bytes, HF decode %zu\n", c->name, i, d.n, e.d[i].n);
        } else if (bytes_equal(d.p, d.n, corpus[i].p, corpus[i].n)) round_trips++;
        free(d.p);
    }
    CHECK(bad_s == 0, "%s: %d of %zu lines differ from HF (parse_special on)", c->name, bad_s, n_corpus);
    CHECK(bad_n == 0, "%s: %d of %zu lines differ from HF (parse_special off)", c->name, bad_n, n_corpus);
    CHECK(bad_d == 0, "%s: %d of %zu decodes differ from HF", c->name, bad_d, n_corpus);
    CHECK(c->lossy || round_trips >= (int)n_corpus * 3 / 4, "%s: only %d lines round-trip", c->name, round_trips);
    /* BOS as the caller adds it: when the tokenizer says the model wants it. */
    Err err = {{0}};
    TokenIds got = {0};
    tokenizer_encode(c->tok, corpus[0].p, corpus[0].n, true, tokenizer_add_bos(c->tok), &got, &err);
    CHECK(ids_equal(&got, &e.b), "%s: BOS rule: %zu ids vs HF %zu",
          c->name, got.n, e.b.n);
    token_ids_free(&got);
    printf("# %s: %zu lines x2 match HF; %d round-trip exactly\n", c->name, n_corpus - (size_t)bad_s, round_trips);
    expected_free(&e);
}

static void test_parity(void) {
    CHECK(n_corpus >= 50, "corpus has %zu lines", n_corpus);
    for (size_t i = 0; i < N_CASES; i++) {
        CHECK(cases[i].tok != NULL, "%s did not load", cases[i].name);
        if (cases[i].tok) check_case(&cases[i]);
    }
}

/* ---- 2. NFC, detok, special ids --------------------------------------------------------- */

static void test_nfc(void) {
    Lines l = read_lines("nfc.txt");
    int bad = 0;
    for (size_t i = 0; i < l.n; i++) {
        char *sp = strchr(l.line[i], ' ');
        if (!sp) continue;
        Bytes in = b64_decode(l.line[i], (size_t)(sp - l.line[i])), want = b64_decode(sp + 1, strlen(sp + 1));
        TextBuf sane = {0}, out = {0};
        utf8_sanitize(in.p, in.n, &sane);
        uni_nfc(sane.data ? sane.data : "", sane.len, &out);
        if (!bytes_equal(out.data, out.len, want.p, want.n)) {
            bad++;
            printf("  nfc case %zu differs\n", i);
        }
        textbuf_free(&sane);
        textbuf_free(&out);
        free(in.p);
        free(want.p);
    }
    CHECK(l.n > 60 && bad == 0, "%d of %zu NFC cases differ from unicodedata", bad, l.n);
    lines_free(&l);
}

/* Pushes ids one at a time; returns what came out, with a '|' after each push. */
static void detok_trace(const Tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    Detok d;
    detok_init(&d);
    size_t w = 0;
    for (size_t i = 0; i < n && w + 80 < cap; i++) {
        w += (size_t)detok_push(t, &d, ids[i], out + w, 64);
        out[w++] = '|';
    }
    w += (size_t)detok_flush(&d, out + w, 64);
    out[w] = 0;
}

static int32_t byte_token(const Tokenizer *t, uint8_t b) {
    char s[8];
    if (tokenizer_kind(t) == TOK_SPM) snprintf(s, sizeof s, "<0x%02X>", b);
    else s[utf8_put(tok_byte_to_cp(b), s)] = 0;
    return tokenizer_find_token(t, s);
}

static void test_detok_split(void) {
    const char *names[] = {"smollm2 (GGUF)", "gemma3 (GGUF)", "llama2syn (tokenizer.json)"};
    for (size_t k = 0; k < 3; k++) {
        Case *c = find_case(names[k]);
        if (!c || !c->tok) continue;
        const Tokenizer *t = c->tok;
        /* "€" = E2 82 AC as three byte tokens, then "A": held back until whole. */
        int32_t euro[4] = {byte_token(t, 0xE2), byte_token(t, 0x82), byte_token(t, 0xAC), byte_token(t, 'A')};
        CHECK(euro[0] >= 0 && euro[1] >= 0 && euro[2] >= 0 && euro[3] >= 0, "%s: byte tokens", c->name);
        char out[512];
        detok_trace(t, euro, 4, out, sizeof out);
        CHECK(!strcmp(out, "||\xE2\x82\xAC|A|"), "%s: split euro gives '%s'", c->name, out);
        /* A sequence broken by another byte: U+FFFD, then the byte itself. */
        int32_t broken[3] = {euro[0], euro[1], euro[3]};
        detok_trace(t, broken, 3, out, sizeof out);
        CHECK(!strcmp(out, "||\xEF\xBF\xBD" "A|"), "%s: broken sequence gives '%s'", c->name, out);
        /* Cut at the end of the stream: flush gives U+FFFD. */
        detok_trace(t, euro, 2, out, sizeof out);
        CHECK(!strcmp(out, "||\xEF\xBF\xBD"), "%s: cut sequence gives '%s'", c->name, out);
        /* A byte that never starts a sequence. */
        int32_t lone[2] = {byte_token(t, 0x80), euro[3]};
        detok_trace(t, lone, 2, out, sizeof out);
        CHECK(!strcmp(out, "\xEF\xBF\xBD|A|"), "%s: lone continuation gives '%s'", c->name, out);
    }
    /* Llama 2 style: the first token's leading space is dropped (HF Strip). */
    Case *c = find_case("llama2syn (tokenizer.json)");
    if (c && c->tok) {
        TokenIds ids = {0};
        Err err = {{0}};
        tokenizer_encode(c->tok, "Hello world", 11, true, false, &ids, &err);
        char out[512];
        detok_trace(c->tok, ids.ids, ids.n, out, sizeof out);
        CHECK(ids.n >= 2 && out[0] == 'H', "llama2syn: first token keeps its space: '%s'", out);
        token_ids_free(&ids);
    }
}

static void test_special_ids_smollm2(void) {
    Case *s = find_case("smollm2 (GGUF)");
    if (s->tok) {
        const Tokenizer *t = s->tok;
        CHECK(tokenizer_kind(t) == TOK_BPE_BYTES && tokenizer_n_vocab(t) == 49152, "smollm2 kind/vocab");
        CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2 && !tokenizer_add_bos(t), "smollm2 bos/eos/add_bos");
        CHECK(tokenizer_find_token(t, "<|im_start|>") == 1 && tokenizer_find_token(t, "<|im_end|>") == 2, "ids");
        CHECK(tokenizer_is_eog(t, 2) && tokenizer_is_eog(t, 0) && !tokenizer_is_eog(t, 1) && !tokenizer_is_eog(t, 100),
              "smollm2 end-of-generation ids");
        CHECK(tokenizer_chat_template(t) && strstr(tokenizer_chat_template(t), "<|im_start|>"), "template");
        CHECK(!strcmp(tokenizer_piece(t, 905), "Ġworld"), "piece 905 = '%s'", tokenizer_piece(t, 905));
        char b[16];
        int n = tokenizer_token_bytes(t, 905, b, sizeof b);
        CHECK(n == 6 && !memcmp(b, " world", 6), "bytes of 905");
        CHECK(tokenizer_token_bytes(t, 49152, b, sizeof b) == -1 && tokenizer_token_bytes(t, -1, b, 4) == -1, "range");
        CHECK(tokenizer_token_bytes(t, 905, b, 3) == 3, "token_bytes writes at most cap");
        CHECK(tokenizer_max_token_bytes(t) == 81, "smollm2 longest token: %d bytes", tokenizer_max_token_bytes(t));
    }
}

static void test_special_ids_others(void) {
    Case *g = find_case("gemma3 (GGUF)"), *l = find_case("llama3syn (GGUF)"), *q = find_case("qwen2syn (tokenizer.json)"),
         *sj = find_case("smollm2 (tokenizer.json)");
    if (sj->tok) {
        CHECK(tokenizer_bos(sj->tok) == 1 && tokenizer_eos(sj->tok) == 2 && tokenizer_is_eog(sj->tok, 2) &&
                  tokenizer_chat_template(sj->tok),
              "smollm2 tokenizer.json + tokenizer_config.json: bos/eos/template");
    }
    if (g->tok) {
        const Tokenizer *t = g->tok;
        CHECK(tokenizer_kind(t) == TOK_SPM && tokenizer_n_vocab(t) == 262144, "gemma kind/vocab");
        CHECK(tokenizer_bos(t) == 2 && tokenizer_eos(t) == 1 && tokenizer_add_bos(t), "gemma bos/eos/add_bos");
        int32_t eot = tokenizer_find_token(t, "<end_of_turn>");
        CHECK(eot == 106 && tokenizer_is_eog(t, eot) && tokenizer_is_eog(t, 1), "gemma end_of_turn is eog");
        char b[16];
        CHECK(tokenizer_token_bytes(t, 236743, b, sizeof b) == 1 && b[0] == ' ', "gemma ▁ decodes to a space");
        CHECK(tokenizer_token_bytes(t, 138, b, sizeof b) == 2 && !memcmp(b, "  ", 2), "gemma space-run token");
    }
    if (l->tok) {
        int32_t eot = tokenizer_find_token(l->tok, "<|eot_id|>");
        CHECK(eot >= 0 && tokenizer_is_eog(l->tok, eot) && tokenizer_add_bos(l->tok) &&
                  tokenizer_bos(l->tok) == tokenizer_find_token(l->tok, "<|begin_of_text|>"),
              "llama3syn eot/bos");
    }
    if (q->tok) {
        int32_t im_end = tokenizer_find_token(q->tok, "<|im_end|>");
        CHECK(im_end >= 0 && tokenizer_eos(q->tok) == im_end && tokenizer_is_eog(q->tok, im_end) &&
                  !tokenizer_add_bos(q->tok),
              "qwen2syn eos/eog");
    }
}

/* ---- 3. bad files ---------------------------------------------------------------------------- */

static void expect_gguf_error(const char *file, const char *field) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/bad/%s", test_fixture_dir(), file);
    Err err = {{0}};
    GGUFFile f;
    if (gguf_open(&f, path, &err)) {
        CHECK(0, "%s: %s", path, err.msg);
        return;
    }
    Tokenizer *t = NULL;
    int rc = tokenizer_load_gguf(&t, &f, &err);
    CHECK(rc == -1 && t == NULL, "%s loaded", file);
    CHECK(strstr(err.msg, file) && strstr(err.msg, field), "%s: error '%s' should name the file and %s", file, err.msg,
          field);
    gguf_close(&f);
}

static void expect_json_error(const char *file, const char *field) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/bad/%s", test_fixture_dir(), file);
    Err err = {{0}};
    Tokenizer *t = NULL;
    int rc = tokenizer_load_hf(&t, path, NULL, &err);
    CHECK(rc == -1 && t == NULL, "%s loaded", file);
    CHECK(strstr(err.msg, file) && strstr(err.msg, field), "%s: error '%s' should name the file and %s", file, err.msg,
          field);
}

/* A tokenizer.json written here: hostile values too odd for a fixture. */
static void expect_json_text_error(const char *json, const char *field) {
    char path[] = "/tmp/cllm_tok_XXXXXX.json";
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0, "mkstemps");
    if (fd < 0) return;
    FILE *fp = fdopen(fd, "w");
    fputs(json, fp);
    fclose(fp);
    Err err = {{0}};
    Tokenizer *t = NULL;
    int rc = tokenizer_load_hf(&t, path, NULL, &err);
    CHECK(rc == -1 && t == NULL && strstr(err.msg, path) && strstr(err.msg, field), "%s: got '%s'", field, err.msg);
    tokenizer_free(t);
    remove(path);
}

/* A SentencePiece ("llama") GGUF vocabulary of single characters: no token
 * splits into two others, so there are no merges to rebuild. It must load and
 * encode character by character (under UBSan it once sorted a NULL array). */
static void test_spm_without_merges(void) {
    char path[] = "/tmp/cllm_spm_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0, "mkstemps");
    if (fd < 0) return;
    close(fd);
    GGUFValue tok[3] = {{GGUF_STRING, {.str = {"<unk>", 5}}}, {GGUF_STRING, {.str = {"a", 1}}},
                        {GGUF_STRING, {.str = {"\xE2\x96\x81", 3}}}};
    GGUFValue score[3] = {{GGUF_FLOAT32, {.f = 0}}, {GGUF_FLOAT32, {.f = -1}}, {GGUF_FLOAT32, {.f = -2}}};
    GGUFKV kv[3] = {
        {(char *)"tokenizer.ggml.model", {GGUF_STRING, {.str = {"llama", 5}}}},
        {(char *)"tokenizer.ggml.tokens", {GGUF_ARRAY, {.arr = {GGUF_STRING, 3, tok}}}},
        {(char *)"tokenizer.ggml.scores", {GGUF_ARRAY, {.arr = {GGUF_FLOAT32, 3, score}}}},
    };
    Err err = {{0}};
    GGUFFile f;
    Tokenizer *t = NULL;
    int rc = gguf_write(path, kv, 3, NULL, 0, 32, NULL, NULL, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0 && (rc = gguf_open(&f, path, &err)) == 0) {
        rc = tokenizer_load_gguf(&t, &f, &err);
        CHECK(rc == 0, "no merges: %s", err.msg);
        TokenIds ids = {0};
        if (t) {
            CHECK(tokenizer_encode(t, "a a", 3, false, false, &ids, &err) == 0, "%s", err.msg);
            /* Metaspace: "▁a▁a", one token per character. */
            CHECK(ids.n == 4 && ids.ids[0] == 2 && ids.ids[1] == 1 && ids.ids[2] == 2 && ids.ids[3] == 1,
                  "'a a' gave %zu ids", ids.n);
        }
        token_ids_free(&ids);
        tokenizer_free(t);
        gguf_close(&f);
    }
    remove(path);
}

/* A tokenizer.json whose Sequence repeats one step 10 times. */
static char *repeated_steps(const char *component, const char *list, const char *step) {
    TextBuf b = {0};
    char head[128];
    snprintf(head, sizeof head, "{\"model\":{\"vocab\":{\"a\":0}},\"%s\":{\"type\":\"Sequence\",\"%s\":[",
             component, list);
    textbuf_append(&b, head, strlen(head));
    for (int i = 0; i < 10; i++) {
        if (i) textbuf_append(&b, ",", 1);
        textbuf_append(&b, step, strlen(step));
    }
    textbuf_append(&b, "]}}", 4); /* with the NUL */
    return b.data;
}

/* Steps that lengthen text, chained, are refused at load: ten Replaces of
 * "a" by "aa" would make every "a" 1024 bytes (by eight "a"s: a gigabyte). */
static void test_growth_refused(void) {
    char *norm = repeated_steps("normalizer", "normalizers",
                                "{\"type\":\"Replace\",\"pattern\":{\"String\":\"a\"},\"content\":\"aa\"}");
    char *pre = repeated_steps("pre_tokenizer", "pretokenizers",
                               "{\"type\":\"Metaspace\",\"replacement\":\"  \",\"prepend_scheme\":\"never\","
                               "\"split\":false}");
    expect_json_text_error(norm, "normalizer: its steps can make text up to 1.02e+03 times longer (limit 64)");
    expect_json_text_error(pre, "pre_tokenizer: with the normalizer its steps can make text up to");
    free(norm);
    free(pre);
    /* One Replace of a char by a 65-byte string is as bad as a chain. */
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"Replace\",\"pattern\":"
                           "{\"String\":\"a\"},\"content\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}",
                           "normalizer: its steps can make text up to 65 times longer");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":\"Replace\",\"pattern\":"
                           "{\"String\":\"\"},\"content\":\"a\"}}",
                           "normalizer: a Replace of the empty string is not supported");
}

static void test_bad_files(void) {
    expect_json_text_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":16000000},\"merges\":[]}}", "model.vocab");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":-1}}}", "model.vocab[\"a\"]");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0,\"b\":0}}}", "model.vocab[\"b\"]");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a a a\"]}}", "model.merges[0]");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[[\"a\",1]]}}", "model.merges[0]");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0},\"dropout\":0.1}}", "model.dropout");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":0,\"content\":\"b\"}]}",
                           "added_tokens[0].content");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"Sequence\","
                           "\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Digits\"}]}}",
                           "pre_tokenizer");
    expect_json_text_error("{\"model\":{\"vocab\":{\"a\":0}},\"decoder\":{\"type\":\"Sequence\",\"decoders\":"
                           "[{\"type\":\"CTC\"}]}}", "decoder.decoders[0].type");
    expect_json_text_error("[1,2]", "(root)");
    expect_gguf_error("no_tokens.gguf", "tokenizer.ggml.tokens");
    expect_gguf_error("merge_unknown.gguf", "tokenizer.ggml.merges[1]");
    expect_gguf_error("unknown_pre.gguf", "tokenizer.ggml.pre");
    expect_gguf_error("types_length.gguf", "tokenizer.ggml.token_type");
    expect_gguf_error("bos_out_of_range.gguf", "tokenizer.ggml.bos_token_id");
    expect_gguf_error("unknown_model.gguf", "tokenizer.ggml.model");
    expect_json_error("no_vocab.json", "model.vocab");
    expect_json_error("vocab_not_object.json", "model.vocab");
    expect_json_error("unknown_model.json", "model.type");
    expect_json_error("merge_unknown.json", "model.merges[0]");
    expect_json_error("unknown_normalizer.json", "normalizer.type");
    expect_json_error("unknown_regex.json", "pre_tokenizer.pattern");
    expect_json_error("does_not_exist.json", "does_not_exist.json");
}

/* ---- 4. garbage and speed ---------------------------------------------------------------------- */

static void test_garbage(void) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
    size_t len = quick() ? 4000 : 20000;
    char *buf = malloc(len);
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* Mostly bytes that make trouble: high bytes, '<', '|', spaces, digits. */
        static const char pick[] = "<|>\xE2\x80\x81\xF0\x9F\x98\xC3\xA9 \t\n\r0123456789'sabc\xFF\xED\xA0";
        buf[i] = (x >> 33) % 3 ? pick[(x >> 40) % (sizeof pick - 1)] : (char)(x >> 48);
    }
    for (size_t k = 0; k < N_CASES; k++) {
        const Tokenizer *t = cases[k].tok;
        if (!t) continue;
        for (int special = 0; special < 2; special++) {
            TokenIds ids = {0};
            Err err = {{0}};
            CHECK(tokenizer_encode(t, buf, len, special, true, &ids, &err) == 0, "%s: %s", cases[k].name, err.msg);
            bool in_range = true;
            for (size_t i = 0; i < ids.n; i++) in_range = in_range && ids.ids[i] >= 0 && ids.ids[i] < tokenizer_n_vocab(t);
            CHECK(ids.n > 0 && in_range, "%s: garbage gives %zu ids, all in range: %d", cases[k].name, ids.n, in_range);
            Bytes d = detok_all(t, &ids);
            free(d.p);
            token_ids_free(&ids);
        }
    }
    free(buf);
}

static double encode_mb_per_s(const Tokenizer *t, const char *text, size_t len, size_t *n_ids) {
    TokenIds ids = {0};
    Err err = {{0}};
    double t0 = now_s();
    int rc = tokenizer_encode(t, text, len, true, false, &ids, &err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "%s", err.msg);
    *n_ids = ids.n;
    token_ids_free(&ids);
    return (double)len / 1e6 / (dt > 1e-9 ? dt : 1e-9);
}

static void test_throughput(void) {
    /* English prose: the corpus's English lines repeated to the size wanted. */
    size_t want = quick() ? (256u << 10) : (4u << 20), len = 0;
    char *text = malloc(want + 1024);
    while (len < want)
        for (size_t i = 1; i <= 4 && i < n_corpus; i++) {
            memcpy(text + len, corpus[i].p, corpus[i].n);
            len += corpus[i].n;
            text[len++] = i == 4 ? '\n' : ' ';
        }
    const char *names[] = {"smollm2 (GGUF)", "gemma3 (GGUF)"};
    for (int k = 0; k < 2; k++) {
        Case *c = find_case(names[k]);
        if (!c || !c->tok) continue;
        size_t n_ids;
        double mbs = encode_mb_per_s(c->tok, text, len, &n_ids);
        printf("# note: %s encodes English at %.1f MB/s (%zu bytes -> %zu ids, one core)\n", c->name, mbs, len, n_ids);
        CHECK(mbs >= 1.0, "%s: %.2f MB/s is below the 1 MB/s floor", c->name, mbs);
    }
    free(text);
}

static void load_all(void) {
    for (size_t i = 0; i < N_CASES; i++) {
        Err err = {{0}};
        double t0 = now_s();
        cases[i].tok = case_load(&cases[i], &err);
        CHECK(cases[i].tok != NULL, "%s: %s", cases[i].name, err.msg);
        if (cases[i].tok) printf("# %s loaded in %.2f s\n", cases[i].name, now_s() - t0);
    }
}

int main(void) {
    corpus_load();
    RUN(load_all);
    RUN(test_parity);
    RUN(test_nfc);
    RUN(test_detok_split);
    RUN(test_special_ids_smollm2);
    RUN(test_special_ids_others);
    RUN(test_spm_without_merges);
    RUN(test_bad_files);
    RUN(test_growth_refused);
    RUN(test_garbage);
    RUN(test_throughput);
    for (size_t i = 0; i < N_CASES; i++) {
        tokenizer_free(cases[i].tok);
        if (cases[i].f_open) gguf_close(&cases[i].f);
    }
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i].p);
    free(corpus);
    TEST_EXIT();
}
