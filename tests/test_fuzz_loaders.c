/* test_fuzz_loaders.c — the deterministic mutation fuzzer (the engine of
 * tests/fuzz/fuzz_mutate.h, as in test_fuzz.c) on the loaders above the
 * file readers, each input through tests/fuzz/fuzz_loaders.h:
 *   config      tiny/<arch>/config.json mutated -> config_from_hf
 *   gguf_meta   a tiny GGUF's metadata and tensor table mutated (its tensor
 *               data kept) -> config_from_gguf, tokenizer_load_gguf, encode
 *               and decode of generated text
 *   tokenizer   tiny/<arch>/tokenizer.json or tokenizer_config.json
 *               mutated -> tokenizer_load_hf, encode and decode
 *   model_gguf  as gguf_meta, through model_load (config, vocabulary,
 *               every weight bound and shape-checked)
 *   model_st    a tiny safetensors folder with one of config.json,
 *               tokenizer.json, tokenizer_config.json or the header of
 *               model.safetensors mutated -> model_load
 *   prompts     the prompt fixtures (text, JSONL, OpenAI batch) mutated ->
 *               prompts_open (auto and forced formats, short line limits)
 *               and every request read
 *   logits      a --save-logits file (a small one written here) mutated ->
 *               the header, ids and every row as --kl-divergence reads them
 *   http        HTTP requests with OpenAI bodies mutated -> cllm serve's
 *               request parser and body parser (app/http.c, serve_api.c)
 * Seeds: the committed fixtures under tests/fixtures (tiny models, prompts).
 * Inputs are files in a fresh folder under $TMPDIR (else /dev/shm, else
 * /tmp; printed): after a crash the input that caused it is still there.
 *
 * CLLM_FUZZ_SEED picks the seed, CLLM_FUZZ_ITERS sets N (config gets N,
 * prompts, the tokenizer and GGUF metadata N/4, whole models N/8). The
 * default N = 16000 takes about 20 s under ASan on 2 cores.
 */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_loaders.h"
#include "tests/fuzz/fuzz_mutate.h"
#include "tests/test.h"

static const char *const ARCHS[] = {"llama", "gemma2", "gemma3", "gpt-oss", "mistral", "qwen2", "qwen3"};
#define N_ARCHS (sizeof ARCHS / sizeof *ARCHS)

typedef struct {
    Rng rng;
    uint64_t seed;
    long iters;
    char tmp[96];                  /* this run's folder */
    Seeds config, tok_json, tok_cfg; /* per arch: tiny/<arch>/config.json, tokenizer.json, tokenizer_config.json */
    Seeds gguf;                    /* tiny/<arch>.gguf */
    size_t gguf_head[N_ARCHS];     /* bytes before each GGUF's tensor data */
    Seeds st;                      /* tiny/<arch>/model.safetensors */
    Seeds prompts;                 /* prompt fixtures */
    Seeds logits;                  /* --save-logits files written by make_logits_seeds */
    Seeds http;                    /* HTTP requests (written here) */
    char text[8192];               /* the text the current tokenizer encodes */
    size_t text_len;
    long accepted;
} Fuzz;

static void path_in(const Fuzz *fz, char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", fz->tmp, name); }

static void write_file(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { if (n) fwrite(p, 1, n, f); fclose(f); }
}

static size_t gguf_data_offset(const char *path) {
    GGUFFile f;
    Err err;
    if (gguf_open(&f, path, &err)) return 0;
    size_t off = (size_t)f.data_offset;
    gguf_close(&f);
    return off;
}

static void load_seeds(Fuzz *fz) {
    char path[1024];
    const char *fx = test_fixture_dir();
    for (size_t a = 0; a < N_ARCHS; a++) {
        snprintf(path, sizeof path, "%s/tiny/%s/config.json", fx, ARCHS[a]);
        seeds_add_file(&fz->config, path, 1 << 20);
        snprintf(path, sizeof path, "%s/tiny/%s/tokenizer.json", fx, ARCHS[a]);
        seeds_add_file(&fz->tok_json, path, 1 << 20);
        snprintf(path, sizeof path, "%s/tiny/%s/tokenizer_config.json", fx, ARCHS[a]);
        seeds_add_file(&fz->tok_cfg, path, 1 << 20);
        snprintf(path, sizeof path, "%s/tiny/%s/model.safetensors", fx, ARCHS[a]);
        seeds_add_file(&fz->st, path, 4 << 20);
        snprintf(path, sizeof path, "%s/tiny/%s.gguf", fx, ARCHS[a]);
        seeds_add_file(&fz->gguf, path, 4 << 20);
        fz->gguf_head[a] = gguf_data_offset(path);
    }
    static const char *prompt_files[] = {"text.txt", "jsonl.jsonl", "openai.jsonl"};
    for (size_t i = 0; i < sizeof prompt_files / sizeof *prompt_files; i++) {
        snprintf(path, sizeof path, "%s/prompts/%s", fx, prompt_files[i]);
        seeds_add_file(&fz->prompts, path, 1 << 20);
    }
    static const char *http[] = {
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 187\r\n\r\n"
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"n\": 2, \"stream\": true, "
        "\"stop\": [\"a\", \"b\"], \"temperature\": 0.5, \"top_k\": 3, \"seed\": 7, \"logprobs\": true, \"top_logprobs\": 2}",
        "POST /v1/completions HTTP/1.1\r\nContent-Length: 93\r\nAuthorization: Bearer k\r\n\r\n"
        "{\"prompt\": [\"Once\"], \"max_tokens\": 5, \"stop\": \"x\", \"stream_options\": {\"include_usage\": true}}",
        "GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\nGET /health HTTP/1.0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof http / sizeof *http; i++) seeds_add(&fz->http, http[i], strlen(http[i]));
}

/* Small --save-logits files (no fixture is committed: the writer makes
 * them): vocab 8 or 40, windows over 10 or 23 tokens, rows of random
 * log-probabilities. */
static void make_logits_seeds(Fuzz *fz) {
    static const int shapes[][4] = {{8, 10, 4, 2}, {40, 23, 8, 8}, {8, 2, 2, 1}}; /* vocab, tokens, ctx, stride */
    char path[200];
    path_in(fz, path, sizeof path, "seed.logits");
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int V = shapes[k][0];
        int32_t ids[32];
        double logp[40];
        uint16_t scratch[40];
        for (int i = 0; i < shapes[k][1]; i++) ids[i] = (int32_t)rng_below(&fz->rng, (uint64_t)V);
        LogitsHeader h = {V, shapes[k][2], shapes[k][3], shapes[k][1], ppl_n_scored(shapes[k][1], shapes[k][2], shapes[k][3]), ids};
        FILE *f = fopen(path, "wb");
        Err err;
        int rc = f ? logits_file_write_header(f, path, &h, &err) : -1;
        for (int64_t r = 0; rc == 0 && r < h.n_scored; r++) {
            double m = 0, s = 0;
            for (int v = 0; v < V; v++) { logp[v] = -8.0 * (double)rng_below(&fz->rng, 1000) / 1000; m = logp[v] > m ? logp[v] : m; }
            for (int v = 0; v < V; v++) s += exp(logp[v]);
            for (int v = 0; v < V; v++) logp[v] -= log(s);
            rc = logits_file_write_row(f, path, logp, V, ids[1], scratch, &err);
        }
        if (f) fclose(f);
        if (rc == 0) seeds_add_file(&fz->logits, path, 1 << 20);
        unlink(path);
    }
}

/* New text for the tokenizer to encode: from random bytes, as the libFuzzer
 * targets make it from theirs. */
static void next_text(Fuzz *fz) {
    uint8_t b[96];
    size_t n = rng_below(&fz->rng, sizeof b);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng_next(&fz->rng);
    fz->text_len = fuzz_text(b, n, fz->text, sizeof fz->text);
}

/* Mutations that keep a JSON text parseable more often than not, so they
 * reach the loader rather than the JSON reader: numbers swapped for extreme
 * ones (ids, ranks, sizes), letters for other letters or a multi-byte
 * character. */
static void mutate_json_gently(Rng *r, Buf *b) {
    int n = 1 + (int)rng_below(r, 4);
    for (int i = 0; i < n && b->n; i++) {
        if (rng_below(r, 2)) { mut_number(r, b); continue; }
        size_t at = rng_below(r, b->n);
        for (size_t k = 0; k < b->n && !((b->b[at] | 32) >= 'a' && (b->b[at] | 32) <= 'z'); k++) at = (at + 1) % b->n;
        static const char *subst[] = {"a", "Z", "\\u0120", "\\u2581", "\\u0000", "Ã©", "â", " "};
        const char *t = subst[rng_below(r, sizeof subst / sizeof *subst)];
        buf_splice(b, at, 1, (const uint8_t *)t, strlen(t));
    }
}

/* A JSON seed mutated: gently half the time, freely otherwise. */
static void mutate_json(Fuzz *fz, Buf *b, const Seeds *others) {
    if (rng_below(&fz->rng, 2)) mutate_json_gently(&fz->rng, b);
    else mutate_n(&fz->rng, b, others, true);
}

/* A GGUF seed with only its head (metadata, tensor table) mutated: the
 * tensor data stays, so mutations reach the loaders instead of the size
 * checks. A quarter of the time the whole file is fair game. */
static void mutate_gguf(Fuzz *fz, size_t a, Buf *b) {
    const Buf *s = &fz->gguf.items[a];
    size_t head = fz->gguf_head[a];
    if (!head || head > s->n || rng_below(&fz->rng, 4) == 0) {
        buf_set(b, s->b, s->n);
        mutate_n(&fz->rng, b, &fz->gguf, false);
        return;
    }
    buf_set(b, s->b, head);
    mutate_n(&fz->rng, b, &fz->gguf, false);
    buf_splice(b, b->n, 0, s->b + head, s->n - head);
}

static void report(Fuzz *fz, const char *target, long it, const char *why, int *bad) {
    if (!why || (*bad)++ >= 3) return;
    CHECK(why == NULL, "%s iteration %ld: %s (seed %llu; inputs in %s)", target, it, why,
          (unsigned long long)fz->seed, fz->tmp);
}

/* ---------- the targets ---------- */

static void test_seeds_load(Fuzz *fz) {
    CHECK(fz->config.n == N_ARCHS && fz->tok_json.n == N_ARCHS && fz->gguf.n == N_ARCHS && fz->st.n == N_ARCHS &&
              fz->prompts.n == 3,
          "seeds: %zu config, %zu tokenizer, %zu gguf, %zu safetensors, %zu prompts", fz->config.n, fz->tok_json.n,
          fz->gguf.n, fz->st.n, fz->prompts.n);
    /* the logits seeds are read whole: the fuzzing starts from accepted files */
    char lpath[200];
    path_in(fz, lpath, sizeof lpath, "check.logits");
    long acc = 0;
    for (size_t k = 0; k < fz->logits.n; k++) {
        write_file(lpath, fz->logits.items[k].b, fz->logits.items[k].n);
        const char *why = fuzz_logits_file(lpath, &acc);
        CHECK(why == NULL, "logits seed %zu: %s", k, why);
    }
    unlink(lpath);
    CHECK(fz->logits.n == 3 && acc == 3, "logits seeds: %zu written, %ld accepted", fz->logits.n, acc);
    /* every seed loads whole, so the fuzzing starts from inputs that reach the end */
    char path[200];
    for (size_t a = 0; a < fz->gguf.n; a++) {
        Model m;
        Err err = {{0}};
        snprintf(path, sizeof path, "%s/tiny/%s.gguf", test_fixture_dir(), ARCHS[a]);
        CHECK(fz->gguf_head[a] > 0 && model_load(&m, path, 0, &err) == 0, "%s: %s", path, err.msg);
        if (m.path) model_free(&m);
        snprintf(path, sizeof path, "%s/tiny/%s", test_fixture_dir(), ARCHS[a]);
        CHECK(model_load(&m, path, 0, &err) == 0, "%s: %s", path, err.msg);
        if (m.path) model_free(&m);
    }
}

static void fuzz_config_run(Fuzz *fz, long n) {
    Buf b = {0};
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->config.items[rng_below(&fz->rng, fz->config.n)];
        buf_set(&b, s->b, s->n);
        mutate_json(fz, &b, &fz->config);
        uint8_t *exact = malloc(b.n ? b.n : 1);
        memcpy(exact, b.b, b.n);
        const char *why = fuzz_config_json(exact, b.n, &fz->accepted);
        free(exact);
        report(fz, "config", it, why, &bad);
    }
    free(b.b);
}

static void fuzz_gguf_meta_run(Fuzz *fz, long n) {
    Buf b = {0};
    char path[160];
    path_in(fz, path, sizeof path, "meta.gguf");
    int bad = 0;
    for (long it = 0; it < n; it++) {
        mutate_gguf(fz, rng_below(&fz->rng, fz->gguf.n), &b);
        write_file(path, b.b, b.n);
        next_text(fz);
        report(fz, "gguf_meta", it, fuzz_gguf_loaders(path, fz->text, fz->text_len, &fz->accepted), &bad);
    }
    free(b.b);
}

static void fuzz_tokenizer_run(Fuzz *fz, long n) {
    Buf b = {0};
    char tok[160], cfg[160];
    path_in(fz, tok, sizeof tok, "tokenizer.json");
    path_in(fz, cfg, sizeof cfg, "tokenizer_config.json");
    int bad = 0;
    for (long it = 0; it < n; it++) {
        size_t a = rng_below(&fz->rng, fz->tok_json.n);
        bool mutate_cfg = rng_below(&fz->rng, 4) == 0 && fz->tok_cfg.items[a].n;
        const Buf *js = &fz->tok_json.items[a], *cs = &fz->tok_cfg.items[a];
        buf_set(&b, js->b, js->n);
        if (!mutate_cfg) mutate_json(fz, &b, &fz->tok_json);
        write_file(tok, b.b, b.n);
        buf_set(&b, cs->b, cs->n);
        if (mutate_cfg) mutate_json(fz, &b, &fz->tok_cfg);
        write_file(cfg, b.b, b.n);
        next_text(fz);
        report(fz, "tokenizer", it,
               fuzz_tokenizer_hf(tok, rng_below(&fz->rng, 8) ? cfg : NULL, fz->text, fz->text_len, &fz->accepted), &bad);
    }
    free(b.b);
}

static void fuzz_model_gguf_run(Fuzz *fz, long n) {
    Buf b = {0};
    char path[160];
    path_in(fz, path, sizeof path, "model.gguf");
    int bad = 0;
    for (long it = 0; it < n; it++) {
        mutate_gguf(fz, rng_below(&fz->rng, fz->gguf.n), &b);
        write_file(path, b.b, b.n);
        next_text(fz);
        report(fz, "model_gguf", it, fuzz_model(path, fz->text, fz->text_len, &fz->accepted), &bad);
    }
    free(b.b);
}

/* A folder of one arch's four files, one of them mutated. */
static void fuzz_model_st_run(Fuzz *fz, long n) {
    static const char *names[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"};
    char dir[160], path[200];
    path_in(fz, dir, sizeof dir, "st");
    mkdir(dir, 0755);
    Buf b = {0};
    int bad = 0;
    for (long it = 0; it < n; it++) {
        size_t a = rng_below(&fz->rng, N_ARCHS), k = rng_below(&fz->rng, 4);
        const Buf *orig[] = {&fz->config.items[a], &fz->tok_json.items[a], &fz->tok_cfg.items[a], &fz->st.items[a]};
        const Seeds *others[] = {&fz->config, &fz->tok_json, &fz->tok_cfg, &fz->st};
        for (size_t i = 0; i < 4; i++) {
            buf_set(&b, orig[i]->b, orig[i]->n);
            if (i == k && i == 3) mutate_st_header(&fz->rng, &b, others[i]);
            else if (i == k) mutate_json(fz, &b, others[i]);
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            write_file(path, b.b, b.n);
        }
        next_text(fz);
        report(fz, "model_st", it, fuzz_model(dir, fz->text, fz->text_len, &fz->accepted), &bad);
    }
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    free(b.b);
}

static void fuzz_prompts_run(Fuzz *fz, long n) {
    static const PromptFormat fmts[] = {PROMPTS_AUTO, PROMPTS_AUTO, PROMPTS_TEXT, PROMPTS_JSONL, PROMPTS_OPENAI};
    Buf b = {0};
    char path[160];
    path_in(fz, path, sizeof path, "prompts.jsonl");
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->prompts.items[rng_below(&fz->rng, fz->prompts.n)];
        buf_set(&b, s->b, s->n);
        mutate_json(fz, &b, &fz->prompts);
        write_file(path, b.b, b.n);
        PromptFormat fmt = fmts[rng_below(&fz->rng, sizeof fmts / sizeof *fmts)];
        size_t max_line = rng_below(&fz->rng, 4) ? PROMPTS_MAX_LINE : 1 + rng_below(&fz->rng, 200);
        report(fz, "prompts", it, fuzz_prompts(path, fmt, max_line, &fz->accepted), &bad);
    }
    free(b.b);
}

/* Mutations anywhere: the header's sizes, the ids, the rows' fields. */
static void fuzz_logits_run(Fuzz *fz, long n) {
    Buf b = {0};
    char path[160];
    path_in(fz, path, sizeof path, "input.logits");
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->logits.items[rng_below(&fz->rng, fz->logits.n)];
        buf_set(&b, s->b, s->n);
        mutate_n(&fz->rng, &b, &fz->logits, false);
        write_file(path, b.b, b.n);
        report(fz, "logits", it, fuzz_logits_file(path, &fz->accepted), &bad);
    }
    free(b.b);
}

/* Sets a mutated request's Content-Length to its body's real length, so the
 * body parser behind the HTTP parser gets the mutated bodies too. */
static void fix_content_length(Buf *b) {
    const char *key = "Content-Length: ";
    size_t k = strlen(key), at = 0, end = 0;
    while (at + k <= b->n && memcmp(b->b + at, key, k)) at++;
    while (end + 4 <= b->n && memcmp(b->b + end, "\r\n\r\n", 4)) end++;
    if (at + k > b->n || end + 4 > b->n || at > end) return;
    size_t v = at + k, ve = v;
    while (ve < b->n && b->b[ve] >= '0' && b->b[ve] <= '9') ve++;
    char len[32];
    int n = snprintf(len, sizeof len, "%zu", b->n - (end + 4));
    /* the body's length does not change when the digits do */
    buf_splice(b, v, ve - v, (const uint8_t *)len, (size_t)n);
}

/* In memory: the parsers take a buffer. */
static void fuzz_http_run(Fuzz *fz, long n) {
    Buf b = {0};
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->http.items[rng_below(&fz->rng, fz->http.n)];
        buf_set(&b, s->b, s->n);
        mutate_json(fz, &b, &fz->http);
        if (rng_below(&fz->rng, 4)) fix_content_length(&b);
        uint8_t *exact = malloc(b.n ? b.n : 1); /* no slack behind the bytes: ASan sees any overread */
        memcpy(exact, b.b, b.n);
        report(fz, "http", it, fuzz_http(exact, b.n, &fz->accepted), &bad);
        free(exact);
    }
    free(b.b);
}

static void seeds_free_all(Fuzz *fz) {
    Seeds *all[] = {&fz->config, &fz->tok_json, &fz->tok_cfg, &fz->gguf, &fz->st, &fz->prompts, &fz->logits,
                    &fz->http};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) seeds_free(all[i]);
}

static void remove_inputs(const Fuzz *fz) {
    static const char *names[] = {"meta.gguf", "tokenizer.json", "tokenizer_config.json",
                                  "model.gguf", "prompts.jsonl", "input.logits"};
    char path[200];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        path_in(fz, path, sizeof path, names[i]);
        unlink(path);
    }
    rmdir(fz->tmp);
}

int main(void) {
    Fuzz fz = {0};
    const char *s = getenv("CLLM_FUZZ_SEED"), *it = getenv("CLLM_FUZZ_ITERS");
    fz.seed = s ? strtoull(s, NULL, 0) : 20250117;
    fz.iters = it ? atol(it) : 16000;
    rng_seed(&fz.rng, fz.seed);
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fz.tmp, sizeof fz.tmp, "%s/cllm-fuzz-loaders-XXXXXX", tmpdir); /* memory-backed: many writes */
    if (!mkdtemp(fz.tmp)) { printf("not ok - fuzz setup (mkdtemp)\n"); return 1; }
    printf("# fuzz loaders: seed %llu (CLLM_FUZZ_SEED), N = %ld (CLLM_FUZZ_ITERS), inputs in %s\n",
           (unsigned long long)fz.seed, fz.iters, fz.tmp);
    load_seeds(&fz);
    make_logits_seeds(&fz);
    test_failed_checks = 0;
    test_seeds_load(&fz);
    printf("%s - test_seeds_load\n", test_failed_checks ? "not ok" : "ok");
    if (test_failed_checks) test_failed_tests++;
    FUZZ_RUN(fuzz_config_run, &fz, fz.iters);
    FUZZ_RUN(fuzz_prompts_run, &fz, fz.iters / 4);
    FUZZ_RUN(fuzz_http_run, &fz, fz.iters / 4);
    FUZZ_RUN(fuzz_tokenizer_run, &fz, fz.iters / 4);
    FUZZ_RUN(fuzz_gguf_meta_run, &fz, fz.iters / 4);
    FUZZ_RUN(fuzz_model_gguf_run, &fz, fz.iters / 8);
    FUZZ_RUN(fuzz_model_st_run, &fz, fz.iters / 8);
    FUZZ_RUN(fuzz_logits_run, &fz, fz.iters / 4);
    if (!test_failed_tests) remove_inputs(&fz); /* kept for replay when something failed */
    seeds_free_all(&fz);
    TEST_EXIT();
}
