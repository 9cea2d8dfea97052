/* serve_api.h — the OpenAI JSON of `cllm serve`: a request body into an
 * ApiRequest (every field checked, with the field named in the error), the
 * prompt's token ids, a choice's GenParams, and the response bodies and
 * stream chunks in OpenAI's shapes. Pure functions: no sockets, no engine.
 *
 * The fields and ranges are those of a `cllm generate` request
 * (app/prompts.c), plus n, stream, stream_options.include_usage, logprobs
 * and top_logprobs. */
#ifndef CLLM_SERVE_API_H
#define CLLM_SERVE_API_H

#include <stdbool.h>
#include <stdint.h>

#include "base/json.h"
#include "engine/logprobs.h"
#include "engine/request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#define API_MAX_N 16     /* most choices per request */
#define API_MAX_STOP 64  /* most stop strings (as generate) */

typedef enum { API_CHAT, API_COMPLETIONS } ApiKind;

/* A parsed request; strings owned (api_request_free). Fields not given hold
 * sentinels: -1 for max_tokens, top_k and top_logprobs, NAN for the floats. */
typedef struct {
    ApiKind kind;
    char *prompt;                 /* completions */
    ChatMessage *messages;        /* chat; role and content owned */
    int n_messages;
    bool stream, include_usage;
    int n;                        /* choices, 1..API_MAX_N */
    int max_tokens, top_k;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int64_t seed;
    bool has_seed;
    char **stop;
    int n_stop;
    bool logprobs;                /* chat: logprobs true; completions: logprobs an integer (top_logprobs = it) */
    int top_logprobs;             /* alternatives per token asked for; -1 none */
} ApiRequest;

/* An OpenAI error: what to say, and the offending field ("" when none). */
typedef struct {
    char message[768];
    char param[64];
} ApiError;

/* Parses body[0..len) for the endpoint kind; -1 with e filled (and r freed)
 * when the JSON is malformed or a field is out of range. */
int api_parse(const char *body, size_t len, ApiKind kind, ApiRequest *r, ApiError *e);
void api_request_free(ApiRequest *r);

/* The prompt's ids: messages through the chat template, a completion's
 * prompt raw (special tokens parsed, BOS where the model wants one) — as
 * `cllm generate` does. */
int api_prompt_ids(const ApiRequest *r, const Tokenizer *tok, const ChatTemplate *t, TokenIds *ids, Err *err);
/* Choice i's parameters: the request's fields over dflt; the seed is the
 * request's (else fallback_seed) plus i, so n choices differ and a request
 * with a seed repeats. Stop strings are borrowed from r. */
void api_gen_params(const ApiRequest *r, const GenParams *dflt, uint64_t fallback_seed, int i, GenParams *out);

/* What a response says about one request. */
typedef struct {
    const char *id;               /* "chatcmpl-7" */
    const char *model;
    long long created;            /* Unix seconds */
    const Tokenizer *tok;         /* names the tokens of "logprobs" */
} ApiMeta;

typedef struct {
    const char *text;
    size_t len;
    const char *finish_reason;    /* "stop" or "length" */
    const TokenLogprob *lp;       /* the generated tokens' logprobs (request asked for logprobs) */
    int n_lp;
} ApiChoice;

/* The whole (non-streaming) response body. */
int api_put_response(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, const ApiChoice *c, int n,
                     int prompt_tokens, int completion_tokens);
/* One stream chunk's JSON (no "data: " framing): choice index, its new text,
 * first (chat: the delta carries the role), finish_reason (NULL: null). */
int api_put_chunk(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, int index, const char *text, size_t len,
                  bool first, const char *finish_reason, const TokenLogprob *lp, int n_lp);
/* The last chunk of a stream that asked for usage: no choices, the counts. */
int api_put_usage_chunk(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, int prompt_tokens,
                        int completion_tokens);
/* A choice's (or a chunk's) "logprobs" value: null unless the request asked;
 * else the tokens lp[0..n) in the shape of its API (app/logprobs_json.h:
 * chat {"content": [...]}, completions {"tokens", "token_logprobs", ...}). */
int api_put_logprobs(JsonBuf *out, const ApiRequest *r, const Tokenizer *tok, const TokenLogprob *lp, int n);
/* {"error": {"message", "type", "param", "code"}}; param "" writes null. */
int api_put_error(JsonBuf *out, const char *message, const char *type, const char *param, const char *code);

#endif
