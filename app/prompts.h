/* prompts.h — the input side of `cllm generate`: a streaming reader of prompt
 * files.
 *
 * The reader never holds more than one line (plus one read buffer) in memory,
 * so inputs of many GB work. It reads a path, "-" for stdin, or a gzip file
 * (by extension or not: zlib recognises the gzip magic bytes 1f 8b and reads
 * anything else as it is).
 *
 * Formats (PROMPTS_AUTO picks one from the first non-empty line: a line that
 * starts with '{' is JSON — OpenAI batch when it has "custom_id" or "body",
 * else JSON Lines; anything else is plain text):
 *   text    one prompt per line; id "line-N" (N = 1-based line number).
 *   JSONL   {"id": string|number, "prompt": "..."} or {"id", "messages":
 *           [{"role","content"},...]} with optional sampling fields (below);
 *           a missing id becomes "line-N". "prompt" may also be an array of
 *           token ids (OpenAI's token prompt: [1, 2, 3]), used as they are:
 *           no template, no BOS added; exact prompt lengths for benchmarks.
 *   OpenAI  {"custom_id", "method": "POST", "url": "/v1/chat/completions" |
 *           "/v1/completions", "body": {"messages" | "prompt", "max_tokens" |
 *           "max_completion_tokens", "temperature", ...}}.
 *
 * A bad line does not stop the reading: prompts_next returns it as a request
 * with `error` set ("line 17: field 'max_tokens' must be a positive integer
 * (got -3)") and the id when one could be read, so every input line gets an
 * output line. Lines empty or only blanks are skipped. A second request with
 * an id seen before gets the error "duplicate id" and its occurrence (2, 3,
 * ...: the how-manieth request with that id). Ids are compared as text: 7
 * and "7" are the same id.
 *
 * An input that opens but cannot be read (a .gz that does not decompress,
 * even at its first line) opens fine: the error comes from prompts_next,
 * after the requests read before it.
 */
#ifndef CLLM_PROMPTS_H
#define CLLM_PROMPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/json.h"

#define PROMPTS_MAX_LINE ((size_t)64 << 20) /* default longest line, bytes */
#define PROMPTS_MAX_STOP 64                 /* most stop strings per request */

typedef enum { PROMPTS_AUTO, PROMPTS_TEXT, PROMPTS_JSONL, PROMPTS_OPENAI } PromptFormat;

typedef struct {
    char *role;    /* system, developer, user, assistant or tool */
    char *content; /* UTF-8, no NUL; text parts of an array content joined */
} PromptMessage;

/* One request. Strings are owned (prompt_request_free). Sampling fields that
 * the line did not give hold a sentinel, and the caller uses its defaults:
 *   max_tokens  -1 not given, else >= 1
 *   top_k       -1 not given, 0 = no top-k limit (input 0 or -1), else k
 *   temperature, top_p, min_p, repetition_penalty, presence_penalty,
 *   frequency_penalty: NAN not given (test with isnan)
 *   seed        valid only when has_seed
 *   logprobs, prompt_logprobs: -1 not asked (prompt_logprobs.c reads them)
 * JSON null counts as not given. */
typedef struct {
    char *id;            /* never NULL: the line's id or "line-N" */
    bool id_is_number;   /* id is the raw JSON number text: write it unquoted */
    int64_t index;       /* 0-based count of requests returned before this one */
    int64_t line;        /* 1-based line number in the input */
    int64_t occurrence;  /* 1: the first request with this id; k > 1: the k-th (a duplicate, error set) */
    char *prompt;        /* plain prompt, or NULL when messages or token ids are given */
    int32_t *prompt_ids; /* "prompt": [ids]: the prompt's tokens as given (each >= 0), else NULL */
    int n_prompt_ids;
    PromptMessage *messages;
    int n_messages;
    bool is_chat;        /* given as messages (chat completion) */
    char *model;         /* OpenAI body "model" or JSONL "model"; NULL if absent */
    int max_tokens;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
    int64_t seed;
    bool has_seed;
    char **stop;
    int n_stop;
    int logprobs;        /* -1 not asked; else the alternatives per generated token (completions:
                            "logprobs": K; chat: "logprobs": true with "top_logprobs": K, default 0) */
    bool echo;           /* completions: the prompt comes first in the text (and in logprobs) */
    int prompt_logprobs; /* -1 not asked; else "prompt_logprobs": K (vLLM) */
    char *error;         /* non-NULL: this line is bad; says which line and why. Such a
                            request keeps id, line, index, occurrence, is_chat and model only. */
} PromptRequest;

typedef struct PromptReader PromptReader;

/* Opens path ("-" = stdin) and, for PROMPTS_AUTO, reads ahead to the first
 * non-empty line to pick the format. NULL + err when the file cannot be read. */
PromptReader *prompts_open(const char *path, PromptFormat fmt, Err *err);
/* The same with a different longest-line limit (bytes; 0 = the default). */
PromptReader *prompts_open_limit(const char *path, PromptFormat fmt, size_t max_line, Err *err);
/* 1 = a request (possibly with error set), 0 = end of input, -1 = I/O error
 * (a read failure or a corrupt .gz; err set). req is overwritten: free the
 * previous one first. */
int prompts_next(PromptReader *r, PromptRequest *req, Err *err);
/* The format in use (never PROMPTS_AUTO; an empty input reads as text). */
PromptFormat prompts_format(const PromptReader *r);
const char *prompts_format_name(PromptFormat fmt); /* "auto", "text", "jsonl", "openai" */
void prompt_request_free(PromptRequest *req);
void prompts_close(PromptReader *r);

/* The log-probability fields of a parsed line or body o (prompt_logprobs.c);
 * req->is_chat picks the form. -1 with a message (field named with pfx)
 * in msg when a value is bad. */
int prompts_parse_logprobs(const JsonValue *o, const char *pfx, PromptRequest *req, char *msg, size_t cap);

/* ---- helpers shared with results.c ---- */

/* A set of id strings with a value each (the reader keeps the first line of
 * each id; the resume scan keeps nothing). Open addressing, keys copied. */
typedef struct IdSet IdSet;
IdSet *id_set_new(void);
/* 1 = added, 0 = already present (value unchanged), -1 = out of memory. */
int id_set_add(IdSet *s, const char *id, int64_t value);
bool id_set_has(const IdSet *s, const char *id);
/* The value stored with id, or -1 when id is absent. */
int64_t id_set_get(const IdSet *s, const char *id);
/* Counts id: adds it with value 1, or adds 1 to its value; the new value in
 * *count. 0, or -1 when out of memory. */
int id_set_bump(IdSet *s, const char *id, int64_t *count);
size_t id_set_count(const IdSet *s);
void id_set_free(IdSet *s);


/* The id member `key` of a parsed JSON object line as text: a string's
 * characters, or a number's exact text in `line` (so 1.50 stays 1.50).
 * Returns a malloc'd string and sets *is_number; NULL when the member is
 * missing or of another type. */
char *prompts_id_text(const JsonValue *obj, const char *key, const char *line, size_t len, bool *is_number);

#endif
