/* prompt_logprobs.c — the log-probability fields of a request line (see
 * prompts.h): OpenAI's two shapes and vLLM's prompt scoring.
 *
 *   completions ("prompt"): "logprobs": K (0..20; OpenAI's legacy API takes
 *       0..5), "echo": true|false (the prompt comes first in the text, and
 *       with logprobs its tokens' entries come first);
 *   chat ("messages"): "logprobs": true|false, "top_logprobs": K (0..20,
 *       only with logprobs true); no echo;
 *   either: "prompt_logprobs": K (0..20), vLLM's per prompt token scores.
 * A field of the other form's shape is an error of that request alone. */
#include <math.h>
#include <stdio.h>

#include "app/prompts.h"
#include "engine/logprobs.h"

/* An integral number as int64 (1e3 counts; 1.5 does not). */
static bool int_of(const JsonValue *v, int64_t *out) {
    if (v->type != JSON_NUMBER) return false;
    if (v->u.number.is_int) { *out = v->u.number.i; return true; }
    double d = v->u.number.num;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 1e15) return false;
    *out = (int64_t)d;
    return true;
}

static const JsonValue *given(const JsonValue *o, const char *key) {
    const JsonValue *v = json_get(o, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static void describe(const JsonValue *v, char *out, size_t n) {
    switch (v->type) {
    case JSON_BOOL: snprintf(out, n, "%s", v->u.boolean ? "true" : "false"); break;
    case JSON_NUMBER: snprintf(out, n, "%.10g", v->u.number.num); break;
    case JSON_STRING: snprintf(out, n, "'%.40s%s'", v->u.string.s, v->u.string.len > 40 ? "..." : ""); break;
    case JSON_ARRAY: snprintf(out, n, "an array"); break;
    default: snprintf(out, n, "an object"); break;
    }
}

static int bad(char *msg, size_t cap, const char *pfx, const char *field, const char *must, const JsonValue *v) {
    char got[80];
    describe(v, got, sizeof got);
    snprintf(msg, cap, "field '%s%s' must %s (got %s)", pfx, field, must, got);
    return -1;
}

/* A top count field: absent leaves *k; else 0..LOGPROBS_MAX_TOP. */
static int top_field(const JsonValue *o, const char *field, const char *pfx, int *k, char *msg, size_t cap) {
    const JsonValue *v = given(o, field);
    int64_t i;
    if (!v) return 0;
    if (!int_of(v, &i) || i < 0 || i > LOGPROBS_MAX_TOP) {
        char must[48];
        snprintf(must, sizeof must, "be an integer in [0, %d]", LOGPROBS_MAX_TOP);
        return bad(msg, cap, pfx, field, must, v);
    }
    *k = (int)i;
    return 0;
}

int prompts_parse_logprobs(const JsonValue *o, const char *pfx, PromptRequest *req, char *msg, size_t cap) {
    const JsonValue *lp = given(o, "logprobs"), *top = given(o, "top_logprobs"), *echo = given(o, "echo");
    if (top_field(o, "prompt_logprobs", pfx, &req->prompt_logprobs, msg, cap)) return -1;
    if (req->is_chat) {
        if (echo) return bad(msg, cap, pfx, "echo", "be absent in a chat request (it is for 'prompt' requests)", echo);
        if (lp && lp->type != JSON_BOOL)
            return bad(msg, cap, pfx, "logprobs", "be true or false in a chat request (the count is 'top_logprobs')", lp);
        if (top && !(lp && lp->u.boolean)) return bad(msg, cap, pfx, "top_logprobs", "come with \"logprobs\": true", top);
        if (lp && lp->u.boolean) req->logprobs = 0;
        return top_field(o, "top_logprobs", pfx, &req->logprobs, msg, cap);
    }
    if (top) return bad(msg, cap, pfx, "top_logprobs", "be absent in a 'prompt' request (its count is 'logprobs')", top);
    if (echo && echo->type != JSON_BOOL) return bad(msg, cap, pfx, "echo", "be true or false", echo);
    req->echo = echo && echo->u.boolean;
    if (lp && lp->type == JSON_BOOL)
        return bad(msg, cap, pfx, "logprobs", "be an integer count in a 'prompt' request (true/false is the chat form)", lp);
    return top_field(o, "logprobs", pfx, &req->logprobs, msg, cap);
}
