/* fuzz_loaders.h — what one fuzz input does to the loaders above the file
 * readers, shared by tests/test_fuzz_loaders.c and the libFuzzer targets
 * beside this file (README.md): config.json -> ModelConfig, GGUF metadata ->
 * ModelConfig and GGUF vocabulary -> Tokenizer, tokenizer.json (+
 * tokenizer_config.json) -> Tokenizer, a whole model file or folder through
 * model_load, the prompt-file reader (text, JSONL, OpenAI batch), and
 * `cllm serve`'s HTTP request parser with the OpenAI body parser behind it.
 *
 * A loaded tokenizer then encodes text (fuzz_text: words, special tokens,
 * multi-byte and invalid UTF-8, long runs) and every id is decoded back.
 * Each function returns NULL when all is well or the broken promise; a
 * refusal is fine when its message names the file; crashes, hangs and
 * out-of-bounds reads are left to the sanitizers (and the fuzzer's timeout).
 */
#ifndef CLLM_FUZZ_LOADERS_H
#define CLLM_FUZZ_LOADERS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "app/logits_file.h"
#include "app/perplexity.h"
#include "app/http.h"
#include "app/prompts.h"
#include "app/serve_api.h"
#include "base/json.h"
#include "formats/gguf.h"
#include "model/config.h"
#include "model/model.h"
#include "tests/fuzz/fuzz_common.h"
#include "tokenizer/tokenizer.h"

/* ---------- text to encode ---------- */

static const char *const fuzz_text_pieces[] = {
    "hello", " world", "The", " quick", "  ", "\n", "\n\n", "\t", "123", "4567890", "'s", "'ll", "!", "?!",
    "<s>", "</s>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>",
    "<|start|>", "<|channel|>", "<unk>", "<pad>", "<0x0A>", "\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87",
    "\xf0\x9f\x98\x80", "\xe2\x96\x81", "\xc4\xa0", "\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80",
    "\xef\xbb\xbf", "\xcc\x81", "\xef\xbc\xa1", "\xe2\x84\xab", "\xef\xac\x81",
};

/* Text built from `bytes` (the fuzzer's own choice): each byte picks a piece,
 * a raw byte or a run of one character. out holds at least cap bytes. */
static inline size_t fuzz_text(const uint8_t *bytes, size_t n, char *out, size_t cap) {
    size_t len = 0;
    const size_t npieces = sizeof fuzz_text_pieces / sizeof *fuzz_text_pieces;
    for (size_t i = 0; i < n && len + 80 < cap; i++) {
        uint8_t b = bytes[i];
        if (b < 160) {
            const char *p = fuzz_text_pieces[b % npieces];
            size_t l = strlen(p);
            memcpy(out + len, p, l);
            len += l;
        } else if (b < 240) {
            out[len++] = (char)(i + 1 < n ? bytes[++i] : b); /* any byte, NUL included */
        } else {
            char c = " a\n\xe2"[b % 4];
            for (int k = 0; k < 64; k++) out[len++] = c; /* long runs (pre-tokenizer, BPE merges) */
        }
    }
    return len;
}

/* Encodes text with and without special tokens; checks every id and
 * decodes each one (streaming and whole) with room for any token. */
static inline const char *fuzz_tokenizer_use(const Tokenizer *t, const char *text, size_t len) {
    int32_t nv = tokenizer_n_vocab(t);
    if (nv <= 0) return "a loaded tokenizer has no vocabulary";
    int maxb = tokenizer_max_token_bytes(t);
    if (maxb < 0) return "tokenizer_max_token_bytes < 0";
    size_t cap = (size_t)maxb + 8;
    char *piece = malloc(cap);
    const char *bad = NULL;
    for (int special = 0; special < 2 && !bad; special++) {
        TokenIds ids = {0};
        Err err = {{0}};
        if (tokenizer_encode(t, text, len, special, special, &ids, &err)) {
            if (!err.msg[0]) bad = "tokenizer_encode failed without a message";
            token_ids_free(&ids);
            continue;
        }
        Detok d;
        detok_init(&d);
        for (size_t i = 0; i < ids.n && !bad; i++) {
            int32_t id = ids.ids[i];
            if (id < 0 || id >= nv) { bad = "tokenizer_encode gave an id outside the vocabulary"; break; }
            if (!tokenizer_piece(t, id)) bad = "an encoded id has no piece";
            int n = tokenizer_token_bytes(t, id, piece, cap);
            if (n < 0 || n > maxb) bad = "tokenizer_token_bytes longer than tokenizer_max_token_bytes";
            n = detok_push(t, &d, id, piece, cap);
            if (n < 0 || (size_t)n > cap) bad = "detok_push wrote past its room";
            (void)tokenizer_is_eog(t, id);
        }
        int n = detok_flush(&d, piece, cap);
        if (!bad && (n < 0 || (size_t)n > cap)) bad = "detok_flush wrote past its room";
        token_ids_free(&ids);
    }
    /* ids the encoder never gives: out of range must be refused, not read */
    if (!bad && (tokenizer_token_bytes(t, nv, piece, cap) != -1 || tokenizer_token_bytes(t, -1, piece, cap) != -1))
        bad = "tokenizer_token_bytes of an id outside the vocabulary is not -1";
    free(piece);
    return bad;
}

/* ---------- config.json ---------- */

static inline const char *fuzz_config_checks(const ModelConfig *c) {
    if (c->n_layers < 1 || c->n_layers > CONFIG_MAX_LAYERS) return "config: n_layers out of range";
    if (c->dim < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim_k < 1 || c->head_dim_v < 1 || c->vocab < 1)
        return "config: a size < 1 accepted";
    if ((uint64_t)(uint32_t)c->arch >= ARCH_COUNT) return "config: arch out of range";
    return NULL;
}

static inline const char *fuzz_config_json(const uint8_t *data, size_t n, long *accepted) {
    Err err = {{0}};
    Json *doc = json_parse((const char *)data, n, "config.json", &err);
    if (!doc) return NULL; /* the JSON reader has its own fuzzer */
    ModelConfig *c = calloc(1, sizeof *c);
    const char *bad = NULL;
    if (config_from_hf(c, json_root(doc), "fz/config.json", &err)) {
        if (!strstr(err.msg, "config.json")) bad = "config error without the file name";
    } else {
        bad = fuzz_config_checks(c);
        if (accepted) ++*accepted;
    }
    free(c);
    json_free(doc);
    return bad;
}

/* ---------- GGUF metadata: config and vocabulary ---------- */

/* *accepted counts what loaded (config, tokenizer). */
static inline const char *fuzz_gguf_loaders(const char *path, const char *text, size_t len, long *accepted) {
    GGUFFile f;
    Err err = {{0}};
    if (gguf_open(&f, path, &err)) return NULL; /* the GGUF reader has its own fuzzer */
    const char *bad = NULL;
    ModelConfig *c = calloc(1, sizeof *c);
    if (config_from_gguf(c, &f, &err) == 0) {
        bad = fuzz_config_checks(c);
        if (accepted) ++*accepted;
    } else if (!err.msg[0]) {
        bad = "config_from_gguf failed without a message";
    }
    free(c);
    Tokenizer *t = NULL;
    Err terr = {{0}};
    if (!bad && tokenizer_load_gguf(&t, &f, &terr) == 0) {
        if (accepted) ++*accepted;
        bad = fuzz_tokenizer_use(t, text, len);
        tokenizer_free(t);
    } else if (!bad && !terr.msg[0]) {
        bad = "tokenizer_load_gguf failed without a message";
    }
    gguf_close(&f);
    return bad;
}

/* ---------- tokenizer.json ---------- */

static inline const char *fuzz_tokenizer_hf(const char *tok_path, const char *cfg_path, const char *text, size_t len,
                                            long *accepted) {
    Tokenizer *t = NULL;
    Err err = {{0}};
    if (tokenizer_load_hf(&t, tok_path, cfg_path, &err)) {
        if (!strstr(err.msg, tok_path) && !(cfg_path && strstr(err.msg, cfg_path)))
            return "tokenizer error without the file name";
        return NULL;
    }
    if (accepted) ++*accepted;
    const char *bad = fuzz_tokenizer_use(t, text, len);
    tokenizer_free(t);
    return bad;
}

/* ---------- a whole model ---------- */

static inline const char *fuzz_model(const char *path, const char *text, size_t len, long *accepted) {
    Model m;
    Err err = {{0}};
    if (model_load(&m, path, 0, &err)) return err.msg[0] ? NULL : "model_load failed without a message";
    if (accepted) ++*accepted;
    const char *bad = fuzz_config_checks(&m.cfg);
    if (!bad && !m.tok) bad = "a loaded model has no tokenizer";
    if (!bad && m.w.tok_embd.data == NULL) bad = "a loaded model has no embedding";
    if (!bad) bad = fuzz_tokenizer_use(m.tok, text, len);
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < model_tensor_count(&m) && !bad; i++) {
        const TensorInfo *ti = model_tensor_at(&m, i);
        const uint8_t *d = ti->data;
        if (ti->nbytes) sink ^= d[0] ^ d[ti->nbytes - 1]; /* inside the mapping, or ASan says so */
    }
    (void)sink;
    model_free(&m);
    return bad;
}

/* ---------- prompt files ---------- */

static inline const char *fuzz_prompts(const char *path, PromptFormat fmt, size_t max_line, long *accepted) {
    Err err = {{0}};
    PromptReader *r = prompts_open_limit(path, fmt, max_line, &err);
    if (!r) return err.msg[0] ? NULL : "prompts_open failed without a message";
    const char *bad = NULL;
    int64_t want = 0;
    for (int k = 0; k < 100000 && !bad; k++) {
        PromptRequest req;
        memset(&req, 0, sizeof req);
        int rc = prompts_next(r, &req, &err);
        if (rc == 0) break;
        if (rc < 0) { if (!err.msg[0]) bad = "prompts_next failed without a message"; break; }
        if (!req.id) bad = "a request without an id";
        else if (req.index != want++) bad = "request indices not consecutive";
        else if (!req.error && !req.prompt && req.n_messages < 1) bad = "a request without prompt or messages";
        else if (!req.error && req.prompt && req.is_chat) bad = "a chat request with a plain prompt";
        for (int i = 0; i < req.n_messages && !bad && !req.error; i++)
            if (!req.messages[i].role || !req.messages[i].content) bad = "a message without role or content";
        if (!req.error && accepted) ++*accepted;
        prompt_request_free(&req);
    }
    prompts_close(r);
    return bad;
}

/* A --save-logits file (app/logits_file.h) read as `cllm perplexity
 * --kl-divergence` reads it: the header (sizes against the file's, the
 * windows' count), the ids, every row. Promises: ids inside the vocabulary,
 * a row's fields in range and its renormalized log-probabilities finite. */
static inline const char *fuzz_logits_file(const char *path, long *accepted) {
    Err err = {{0}};
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st)) { if (f) fclose(f); return "cannot open the input"; }
    LogitsHeader h;
    const char *bad = NULL;
    if (logits_file_read_header(f, path, (int64_t)st.st_size, ppl_n_scored, &h, &err)) {
        fclose(f);
        return err.msg[0] && strstr(err.msg, path) ? NULL : "a refused header without the file's name";
    }
    for (int64_t i = 0; i < h.n_tokens && !bad; i++)
        if (h.ids[i] < 0 || h.ids[i] >= h.vocab) bad = "an id outside the vocabulary";
    LogitsRow r = {0};
    double *logp = malloc((size_t)h.vocab * sizeof *logp);
    r.q = malloc((size_t)h.vocab * sizeof *r.q);
    if (!logp || !r.q) abort();
    int64_t i = 0;
    for (; i < h.n_scored && !bad; i++) {
        if (logits_file_read_row(f, path, i, h.vocab, &r, &err)) {
            if (!err.msg[0] || !strstr(err.msg, path)) bad = "a refused row without the file's name";
            break;
        }
        logits_row_logp(&r, h.vocab, logp);
        for (int v = 0; v < h.vocab && !bad; v++)
            if (!(logp[v] <= 1e-9 && logp[v] > -2e6)) bad = "a row's log-probability out of range";
        if (r.top1 < 0 || r.top1 >= h.vocab || !(r.target_logp <= 0)) bad = "a row field out of range";
    }
    if (!bad && i == h.n_scored && accepted) ++*accepted;
    free(logp);
    free(r.q);
    logits_header_free(&h);
    fclose(f);
    return bad;
}

/* ---------- HTTP requests (cllm serve) ---------- */

/* data as the bytes a client sent: the request parser (the body limit from
 * the last byte: 1 MiB, or an eighth of the time a short one to reach 413), then a whole
 * request's body through the OpenAI parser as both endpoints read it. */
static inline const char *fuzz_http(const uint8_t *data, size_t n, long *accepted) {
    size_t max_body = n && (data[n - 1] & 7) == 7 ? n / 2 : (size_t)1 << 20;
    HttpRequest h;
    int status = 0;
    Err err = {{0}};
    HttpParse rc = http_parse_request((const char *)data, n, max_body, &h, &status, &err);
    if (rc == HTTP_BAD) return status >= 400 && status < 600 && err.msg[0] ? NULL : "a refusal without status or message";
    if (rc != HTTP_COMPLETE) return rc == HTTP_INCOMPLETE ? NULL : "an unknown parse result";
    if (h.header_bytes > n || h.content_length > n - h.header_bytes) return "a request past the bytes given";
    if (h.content_length > max_body) return "a body over the limit accepted";
    if (h.n_headers > HTTP_MAX_HEADERS || h.method_len == 0 || h.target_len == 0 || h.target[0] != '/')
        return "a request line or headers out of their limits";
    for (int kind = 0; kind < 2; kind++) {
        ApiRequest r;
        ApiError e;
        if (api_parse((const char *)data + h.header_bytes, h.content_length, kind ? API_COMPLETIONS : API_CHAT, &r,
                      &e)) {
            if (!e.message[0]) return "a body refused without a message";
            continue;
        }
        if (r.n < 1 || r.n > API_MAX_N || r.n_stop > API_MAX_STOP) return "n or stop out of range accepted";
        if (kind ? !r.prompt : r.n_messages < 1) return "a body without its prompt accepted";
        if (accepted) ++*accepted;
        api_request_free(&r);
    }
    return NULL;
}

#endif
