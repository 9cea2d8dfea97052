/* serve_api.c — OpenAI request bodies in, OpenAI response bodies out
 * (serve_api.h). The checks mirror app/prompts.c's for a generate request
 * (same fields, same ranges, same messages), written again here because
 * prompts.c's parser is private to its line reader and refuses n > 1. */
#include "app/serve_api.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/logprobs_json.h"
#include "base/utf8.h"

static int api_fail(ApiError *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int api_fail(ApiError *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param);
    return -1;
}

static int fail_field(ApiError *e, const char *field, const char *must, const JsonValue *v) {
    char got[80];
    json_describe(v, got, sizeof got);
    return api_fail(e, field, "field '%s' must %s (got %s)", field, must, got);
}

/* A copy of a JSON string: no NUL, valid UTF-8 (the tokenizer takes C strings). */
static int dup_string(const JsonValue *v, const char *field, char **out, ApiError *e) {
    if (v->type != JSON_STRING) return fail_field(e, field, "be a string", v);
    size_t n = v->u.string.len;
    if (strlen(v->u.string.s) != n) return api_fail(e, field, "field '%s' contains a NUL character", field);
    size_t ok = utf8_valid_prefix(v->u.string.s, n);
    if (ok < n) return api_fail(e, field, "field '%s' has invalid UTF-8 at byte offset %zu", field, ok);
    if (!(*out = strndup(v->u.string.s, n))) return api_fail(e, "", "out of memory");
    return 0;
}

/* An optional integer in [lo, hi] into *out. */
static int get_int(const JsonValue *o, const char *field, int64_t lo, int64_t hi, int *out, ApiError *e) {
    const JsonValue *v = json_member(o, field);
    int64_t i;
    if (!v) return 0;
    if (!json_as_int64(v, &i) || i < lo || i > hi) {
        char must[96];
        snprintf(must, sizeof must, "be an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return fail_field(e, field, must, v);
    }
    *out = (int)i;
    return 0;
}

/* An optional float in [lo, hi] (lo_open: (lo, hi]). */
static int get_float(const JsonValue *o, const char *field, float *out, double lo, bool lo_open, double hi,
                     ApiError *e) {
    const JsonValue *v = json_member(o, field);
    if (!v) return 0;
    double d = v->type == JSON_NUMBER ? v->u.number.num : NAN;
    if (isfinite(d) && (lo_open ? d > lo : d >= lo) && d <= hi) { *out = (float)d; return 0; }
    char must[96];
    if (isinf(hi)) snprintf(must, sizeof must, "be a number %s %g", lo_open ? ">" : ">=", lo);
    else snprintf(must, sizeof must, "be a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
    return fail_field(e, field, must, v);
}

static int parse_stop(const JsonValue *o, ApiRequest *r, ApiError *e) {
    const JsonValue *v = json_member(o, "stop");
    if (!v) return 0;
    const char *must = "be a string or an array of strings";
    if (v->type != JSON_STRING && v->type != JSON_ARRAY) return fail_field(e, "stop", must, v);
    size_t n = v->type == JSON_STRING ? 1 : json_len(v);
    if (n > API_MAX_STOP) return api_fail(e, "stop", "field 'stop' has %zu strings; at most %d", n, API_MAX_STOP);
    if (n == 0) return 0;
    if (!(r->stop = calloc(n, sizeof *r->stop))) return api_fail(e, "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const JsonValue *s = v->type == JSON_STRING ? v : json_at(v, i);
        if (s->type != JSON_STRING) return fail_field(e, "stop", must, s);
        if (s->u.string.len == 0) return api_fail(e, "stop", "field 'stop' must not hold an empty string");
        if (dup_string(s, "stop", &r->stop[i], e)) return -1;
        r->n_stop++;
    }
    return 0;
}

/* logprobs / top_logprobs: chat takes logprobs true|false and top_logprobs
 * 0..20 (only with logprobs); completions takes logprobs 0..5. */
static int parse_logprobs(const JsonValue *o, ApiRequest *r, ApiError *e) {
    const JsonValue *lp = json_member(o, "logprobs");
    if (r->kind == API_COMPLETIONS) {
        int k = -1;
        if (get_int(o, "logprobs", 0, 5, &k, e)) return -1;
        r->logprobs = lp != NULL;
        r->top_logprobs = k;
        return 0;
    }
    if (lp && lp->type != JSON_BOOL) return fail_field(e, "logprobs", "be true or false", lp);
    r->logprobs = lp && lp->u.boolean;
    if (get_int(o, "top_logprobs", 0, 20, &r->top_logprobs, e)) return -1;
    if (r->top_logprobs >= 0 && !r->logprobs)
        return api_fail(e, "top_logprobs", "field 'top_logprobs' needs 'logprobs' true");
    return 0;
}

/* Every optional field: the sampling ones as generate has them, and n,
 * stream, stream_options, logprobs. */
static int parse_fields(const JsonValue *o, ApiRequest *r, ApiError *e) {
    int top_k = INT_MIN;
    if (get_int(o, "max_tokens", 1, INT_MAX, &r->max_tokens, e) ||
        get_int(o, "max_completion_tokens", 1, INT_MAX, &r->max_tokens, e) ||
        get_int(o, "top_k", -1, INT_MAX, &top_k, e) || get_int(o, "n", 1, API_MAX_N, &r->n, e) ||
        get_float(o, "temperature", &r->temperature, 0, false, INFINITY, e) ||
        get_float(o, "top_p", &r->top_p, 0, true, 1, e) || get_float(o, "min_p", &r->min_p, 0, false, 1, e) ||
        get_float(o, "repetition_penalty", &r->repetition_penalty, 0, true, INFINITY, e) ||
        get_float(o, "presence_penalty", &r->presence_penalty, -2, false, 2, e) ||
        get_float(o, "frequency_penalty", &r->frequency_penalty, -2, false, 2, e) || parse_stop(o, r, e) ||
        parse_logprobs(o, r, e))
        return -1;
    if (top_k != INT_MIN) r->top_k = top_k < 0 ? 0 : top_k; /* -1 and 0: no limit */
    const JsonValue *v;
    if ((v = json_member(o, "seed"))) {
        if (!json_as_int64(v, &r->seed)) return fail_field(e, "seed", "be an integer", v);
        r->has_seed = true;
    }
    if ((v = json_member(o, "stream"))) {
        if (v->type != JSON_BOOL) return fail_field(e, "stream", "be true or false", v);
        r->stream = v->u.boolean;
    }
    if ((v = json_member(o, "stream_options"))) {
        const JsonValue *u = json_member(v, "include_usage");
        if (v->type != JSON_OBJECT || (u && u->type != JSON_BOOL))
            return fail_field(e, "stream_options", "be an object {\"include_usage\": bool}", v);
        r->include_usage = u && u->u.boolean;
    }
    if ((v = json_member(o, "model")) && v->type != JSON_STRING) return fail_field(e, "model", "be a string", v);
    return 0;
}

static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool"};

/* content: a string, or an array of {"type": "text", "text"} parts joined with newlines. */
static int parse_content(const JsonValue *c, const char *field, char **out, ApiError *e) {
    if (c->type == JSON_STRING) return dup_string(c, field, out, e);
    if (c->type != JSON_ARRAY) return fail_field(e, field, "be a string or an array of text parts", c);
    TextBuf b = {0};
    for (size_t i = 0; i < json_len(c); i++) {
        const JsonValue *part = json_at(c, i), *text = json_get(part, "text");
        char *t;
        if (strcmp(json_get_str(part, "type", ""), "text") || !text) {
            textbuf_free(&b);
            return api_fail(e, field, "field '%s[%zu]' must be {\"type\": \"text\", \"text\": string}", field, i);
        }
        if (dup_string(text, field, &t, e)) { textbuf_free(&b); return -1; }
        int rc = (i && textbuf_append(&b, "\n", 1)) || textbuf_append(&b, t, strlen(t));
        free(t);
        if (rc) { textbuf_free(&b); return api_fail(e, "", "out of memory"); }
    }
    *out = b.data ? b.data : strdup("");
    return *out ? 0 : api_fail(e, "", "out of memory");
}

static int parse_messages(const JsonValue *m, ApiRequest *r, ApiError *e) {
    if (!m) return api_fail(e, "messages", "missing field 'messages'");
    if (m->type != JSON_ARRAY) return fail_field(e, "messages", "be an array of {role, content} objects", m);
    size_t n = json_len(m);
    if (n == 0) return api_fail(e, "messages", "field 'messages' must not be empty");
    if (!(r->messages = calloc(n, sizeof *r->messages))) return api_fail(e, "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const JsonValue *msg = json_at(m, i), *role = json_member(msg, "role"), *content = json_member(msg, "content");
        char field[48];
        ChatMessage *cm = &r->messages[r->n_messages++];
        snprintf(field, sizeof field, "messages[%zu].role", i);
        if (msg->type != JSON_OBJECT || !role) return api_fail(e, "messages", "'messages[%zu]' needs a role", i);
        if (dup_string(role, field, (char **)&cm->role, e)) return -1;
        size_t k = 0;
        while (k < sizeof ROLES / sizeof *ROLES && strcmp(cm->role, ROLES[k])) k++;
        if (k == sizeof ROLES / sizeof *ROLES)
            return fail_field(e, field, "be one of system, developer, user, assistant, tool", role);
        snprintf(field, sizeof field, "messages[%zu].content", i);
        if (!content) cm->content = strdup(""); /* an assistant turn of tool calls only */
        else if (parse_content(content, field, (char **)&cm->content, e)) return -1;
        if (!cm->content) return api_fail(e, "", "out of memory");
    }
    return 0;
}

/* prompt: a string, or an array of exactly one string. */
static int parse_prompt(const JsonValue *v, ApiRequest *r, ApiError *e) {
    if (v && v->type == JSON_ARRAY && json_len(v) == 1) v = json_at(v, 0);
    if (!v) return api_fail(e, "prompt", "missing field 'prompt'");
    if (v->type != JSON_STRING)
        return fail_field(e, "prompt", "be a string (token arrays and several prompts are not supported)", v);
    if (v->u.string.len == 0) return api_fail(e, "prompt", "field 'prompt' must not be empty");
    return dup_string(v, "prompt", &r->prompt, e);
}

int api_parse(const char *body, size_t len, ApiKind kind, ApiRequest *r, ApiError *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->n = 1;
    r->max_tokens = r->top_k = r->top_logprobs = -1;
    r->temperature = r->top_p = r->min_p = r->repetition_penalty = r->presence_penalty = r->frequency_penalty = NAN;
    Err err = {{0}};
    Json *doc = json_parse(body, len, "the request body", &err);
    if (!doc) return api_fail(e, "", "%s", err.msg);
    const JsonValue *o = json_root(doc);
    int rc;
    if (o->type != JSON_OBJECT) rc = api_fail(e, "", "the request body must be a JSON object");
    else rc = kind == API_CHAT ? parse_messages(json_member(o, "messages"), r, e) : parse_prompt(json_member(o, "prompt"), r, e);
    if (!rc) rc = parse_fields(o, r, e);
    json_free(doc);
    if (rc) api_request_free(r);
    return rc;
}

void api_request_free(ApiRequest *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_messages; i++) {
        free((char *)r->messages[i].role);
        free((char *)r->messages[i].content);
    }
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

int api_prompt_ids(const ApiRequest *r, const Tokenizer *tok, const ChatTemplate *t, TokenIds *ids, Err *err) {
    if (r->kind == API_COMPLETIONS)
        return tokenizer_encode(tok, r->prompt, strlen(r->prompt), true, tokenizer_add_bos(tok), ids, err);
    TextBuf text = {0};
    int rc = chat_render(t, r->messages, r->n_messages, true, &text, err);
    if (rc == 0) rc = tokenizer_encode(tok, text.data ? text.data : "", text.len, true, false, ids, err);
    textbuf_free(&text);
    return rc;
}

void api_gen_params(const ApiRequest *r, const GenParams *dflt, uint64_t fallback_seed, int i, GenParams *p) {
    *p = *dflt;
    if (r->max_tokens > 0) p->max_tokens = r->max_tokens;
    sampler_params_override(&p->sampling, &(SamplerOverrides){r->temperature, r->top_p, r->min_p,
                                                                r->repetition_penalty, r->presence_penalty,
                                                                r->frequency_penalty, r->top_k});
    p->sampling.seed = (r->has_seed ? (uint64_t)r->seed : fallback_seed) + (uint64_t)i;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
    p->logprobs = r->logprobs;
    p->top_logprobs = r->top_logprobs > 0 ? r->top_logprobs : 0;
}

/* ---------------------------------------------------------------- output */

static const char *object_name(const ApiRequest *r, bool chunk) {
    if (r->kind == API_COMPLETIONS) return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

static int put_head(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, bool chunk) {
    return jsonbuf_printf(out, "{\"id\":") || jsonbuf_put_string(out, m->id, strlen(m->id)) ||
           jsonbuf_printf(out, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object_name(r, chunk), m->created) ||
           jsonbuf_put_string(out, m->model, strlen(m->model));
}

static int put_usage(JsonBuf *out, int prompt_tokens, int completion_tokens) {
    return jsonbuf_printf(out, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}",
                          prompt_tokens, completion_tokens, prompt_tokens + completion_tokens);
}

int api_put_logprobs(JsonBuf *out, const ApiRequest *r, const Tokenizer *tok, const TokenLogprob *lp, int n) {
    if (!r->logprobs || !tok) return jsonbuf_printf(out, "null");
    int top = r->top_logprobs > 0 ? r->top_logprobs : 0;
    return r->kind == API_CHAT ? logprobs_json_chat(out, tok, lp, n, top)
                               : logprobs_json_completion(out, tok, NULL, 0, lp, n, top);
}

/* "finish_reason": a string, or null. */
static int put_finish(JsonBuf *out, const char *finish_reason) {
    if (!finish_reason) return jsonbuf_printf(out, ",\"finish_reason\":null}");
    return jsonbuf_printf(out, ",\"finish_reason\":\"%s\"}", finish_reason);
}

int api_put_response(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, const ApiChoice *c, int n,
                     int prompt_tokens, int completion_tokens) {
    if (put_head(out, r, m, false) || jsonbuf_printf(out, ",\"choices\":[")) return -1;
    for (int i = 0; i < n; i++) {
        if (jsonbuf_printf(out, "%s{\"index\":%d,", i ? "," : "", i)) return -1;
        if (r->kind == API_CHAT ? jsonbuf_printf(out, "\"message\":{\"role\":\"assistant\",\"content\":")
                                : jsonbuf_printf(out, "\"text\":"))
            return -1;
        if (jsonbuf_put_string(out, c[i].text ? c[i].text : "", c[i].len) ||
            jsonbuf_printf(out, "%s,\"logprobs\":", r->kind == API_CHAT ? "}" : "") ||
            api_put_logprobs(out, r, m->tok, c[i].lp, c[i].n_lp) || put_finish(out, c[i].finish_reason))
            return -1;
    }
    return jsonbuf_printf(out, "],") || put_usage(out, prompt_tokens, completion_tokens) || jsonbuf_printf(out, "}");
}

int api_put_chunk(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, int index, const char *text, size_t len,
                  bool first, const char *finish_reason, const TokenLogprob *lp, int n_lp) {
    if (put_head(out, r, m, true) || jsonbuf_printf(out, ",\"choices\":[{\"index\":%d,", index)) return -1;
    int rc;
    if (r->kind == API_COMPLETIONS) {
        rc = jsonbuf_printf(out, "\"text\":") || jsonbuf_put_string(out, text ? text : "", len);
    } else {
        rc = jsonbuf_printf(out, "\"delta\":{%s", first ? "\"role\":\"assistant\"" : "");
        if (!rc && (len > 0 || first))
            rc = jsonbuf_printf(out, "%s\"content\":", first ? "," : "") || jsonbuf_put_string(out, text ? text : "", len);
        if (!rc) rc = jsonbuf_printf(out, "}");
    }
    /* a chunk without tokens (the role, the finish reason) says null */
    return rc || jsonbuf_printf(out, ",\"logprobs\":") || api_put_logprobs(out, r, n_lp ? m->tok : NULL, lp, n_lp) ||
           put_finish(out, finish_reason) || jsonbuf_printf(out, "]}");
}

int api_put_usage_chunk(JsonBuf *out, const ApiRequest *r, const ApiMeta *m, int prompt_tokens,
                        int completion_tokens) {
    return put_head(out, r, m, true) || jsonbuf_printf(out, ",\"choices\":[],") ||
           put_usage(out, prompt_tokens, completion_tokens) || jsonbuf_printf(out, "}");
}

int api_put_error(JsonBuf *out, const char *message, const char *type, const char *param, const char *code) {
    if (jsonbuf_printf(out, "{\"error\":{\"message\":") || jsonbuf_put_string(out, message, strlen(message)) ||
        jsonbuf_printf(out, ",\"type\":\"%s\",\"param\":", type))
        return -1;
    if (param && *param ? jsonbuf_put_string(out, param, strlen(param)) : jsonbuf_printf(out, "null")) return -1;
    if (code ? jsonbuf_printf(out, ",\"code\":\"%s\"}}", code) : jsonbuf_printf(out, ",\"code\":null}}")) return -1;
    return 0;
}
