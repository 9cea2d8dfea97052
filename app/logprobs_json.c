/* logprobs_json.c — log-probabilities as JSON (see logprobs_json.h). */
#include "app/logprobs_json.h"

#include <math.h>

#include "app/results.h"

/* The bytes token id decodes to; its length (0 for an invalid id). */
static int token_text(const Tokenizer *tok, int32_t id, char *out, size_t cap) {
    int n = tok ? tokenizer_token_bytes(tok, id, out, cap) : -1;
    return n < 0 ? 0 : n > (int)cap ? (int)cap : n;
}

static int put_lp(JsonBuf *b, float lp) {
    if (isnan(lp)) return jsonbuf_printf(b, "null");
    return jsonbuf_printf(b, "%.9g", lp < -9999.0f ? -9999.0 : (double)lp);
}

static int put_token(JsonBuf *b, const Tokenizer *tok, int32_t id) {
    char s[512];
    int n = token_text(tok, id, s, sizeof s);
    return results_put_text(b, s, (size_t)n);
}

static int put_bytes(JsonBuf *b, const Tokenizer *tok, int32_t id) {
    char s[512];
    int n = token_text(tok, id, s, sizeof s), rc = jsonbuf_printf(b, "[");
    for (int i = 0; i < n; i++) rc |= jsonbuf_printf(b, "%s%u", i ? "," : "", (unsigned)(unsigned char)s[i]);
    return rc | jsonbuf_printf(b, "]");
}

static int top_of(const TokenLogprob *e, int top) { return e->n_top < top ? e->n_top : top; }

/* The i-th entry of the completions form: the echoed prompt's, then the reply's. */
static const TokenLogprob *nth(const TokenLogprob *p, int np, const TokenLogprob *g, int i) {
    return i < np ? &p[i] : &g[i - np];
}

int logprobs_json_completion(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *prompt, int n_prompt,
                             const TokenLogprob *gen, int n_gen, int top) {
    int n = n_prompt + n_gen, rc = jsonbuf_printf(b, "{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        rc |= jsonbuf_printf(b, i ? "," : "");
        rc |= put_token(b, tok, nth(prompt, n_prompt, gen, i)->id);
    }
    rc |= jsonbuf_printf(b, "],\"token_logprobs\":[");
    for (int i = 0; i < n; i++) {
        rc |= jsonbuf_printf(b, i ? "," : "");
        rc |= put_lp(b, nth(prompt, n_prompt, gen, i)->logprob);
    }
    rc |= jsonbuf_printf(b, "],\"top_logprobs\":[");
    for (int i = 0; i < n; i++) {
        const TokenLogprob *e = nth(prompt, n_prompt, gen, i);
        rc |= jsonbuf_printf(b, i ? "," : "");
        if (isnan(e->logprob)) { rc |= jsonbuf_printf(b, "null"); continue; }
        rc |= jsonbuf_printf(b, "{");
        for (int j = 0; j < top_of(e, top); j++) {
            rc |= jsonbuf_printf(b, j ? "," : "");
            rc |= put_token(b, tok, e->top_id[j]);
            rc |= jsonbuf_printf(b, ":");
            rc |= put_lp(b, e->top_logprob[j]);
        }
        rc |= jsonbuf_printf(b, "}");
    }
    rc |= jsonbuf_printf(b, "],\"text_offset\":[");
    /* Byte offsets into "text", which echoes the prompt as given: a BOS the
     * tokenizer added stands in no byte of it. */
    long long off = 0;
    bool added_bos = n_prompt > 0 && tokenizer_add_bos(tok) && prompt[0].id == tokenizer_bos(tok);
    for (int i = 0; i < n; i++) {
        char s[512];
        rc |= jsonbuf_printf(b, "%s%lld", i ? "," : "", off);
        if (!(i == 0 && added_bos)) off += token_text(tok, nth(prompt, n_prompt, gen, i)->id, s, sizeof s);
    }
    return rc | jsonbuf_printf(b, "]}");
}

/* {"token", "logprob", "bytes"} of one token. */
static int put_chat_token(JsonBuf *b, const Tokenizer *tok, int32_t id, float lp) {
    int rc = jsonbuf_printf(b, "{\"token\":");
    rc |= put_token(b, tok, id);
    rc |= jsonbuf_printf(b, ",\"logprob\":");
    rc |= put_lp(b, lp);
    rc |= jsonbuf_printf(b, ",\"bytes\":");
    return rc | put_bytes(b, tok, id);
}

int logprobs_json_chat(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *gen, int n_gen, int top) {
    int rc = jsonbuf_printf(b, "{\"content\":[");
    for (int i = 0; i < n_gen; i++) {
        const TokenLogprob *e = &gen[i];
        rc |= jsonbuf_printf(b, i ? "," : "");
        rc |= put_chat_token(b, tok, e->id, e->logprob);
        rc |= jsonbuf_printf(b, ",\"top_logprobs\":[");
        for (int j = 0; j < top_of(e, top); j++) {
            rc |= jsonbuf_printf(b, j ? "," : "");
            rc |= put_chat_token(b, tok, e->top_id[j], e->top_logprob[j]);
            rc |= jsonbuf_printf(b, "}");
        }
        rc |= jsonbuf_printf(b, "]}");
    }
    return rc | jsonbuf_printf(b, "]}");
}

static int put_ranked(JsonBuf *b, const Tokenizer *tok, int32_t id, float lp, int rank) {
    int rc = jsonbuf_printf(b, "\"%d\":{\"logprob\":", (int)id);
    rc |= put_lp(b, lp);
    rc |= jsonbuf_printf(b, ",\"rank\":%d,\"decoded_token\":", rank);
    rc |= put_token(b, tok, id);
    return rc | jsonbuf_printf(b, "}");
}

int logprobs_json_prompt(JsonBuf *b, const Tokenizer *tok, const TokenLogprob *prompt, int n_prompt, int top) {
    int rc = jsonbuf_printf(b, "[");
    for (int i = 0; i < n_prompt; i++) {
        const TokenLogprob *e = &prompt[i];
        rc |= jsonbuf_printf(b, i ? "," : "");
        if (isnan(e->logprob)) { rc |= jsonbuf_printf(b, "null"); continue; }
        rc |= jsonbuf_printf(b, "{");
        rc |= put_ranked(b, tok, e->id, e->logprob, e->rank);
        for (int j = 0; j < top_of(e, top); j++) {
            if (e->top_id[j] == e->id) continue; /* the prompt token itself is written first */
            rc |= jsonbuf_printf(b, ",");
            rc |= put_ranked(b, tok, e->top_id[j], e->top_logprob[j], j + 1);
        }
        rc |= jsonbuf_printf(b, "}");
    }
    return rc | jsonbuf_printf(b, "]");
}
