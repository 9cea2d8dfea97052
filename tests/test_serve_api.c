/* test_serve_api.c — the OpenAI JSON of `cllm serve` (app/serve_api.c):
 * request bodies into fields (and refusals naming the field), the choices'
 * parameters, and the response shapes read back with the JSON parser. */
#include "app/serve_api.h"
#include "tests/test.h"

static int parse(const char *body, ApiKind kind, ApiRequest *r, ApiError *e) {
    return api_parse(body, strlen(body), kind, r, e);
}

static void test_parse_fields(void) {
    ApiRequest r;
    ApiError e;
    const char *chat = "{\"model\": \"x\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
                       "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": "
                       "\"b\"}]}], \"n\": 3, \"stream\": true, \"stream_options\": {\"include_usage\": true}, "
                       "\"max_completion_tokens\": 9, \"temperature\": 0.5, \"top_k\": -1, \"seed\": 42, "
                       "\"stop\": [\"x\", \"y\"], \"logprobs\": true, \"top_logprobs\": 3, \"user\": \"ignored\"}";
    CHECK(parse(chat, API_CHAT, &r, &e) == 0, "chat body: %s", e.message);
    CHECK(r.n_messages == 2 && !strcmp(r.messages[1].content, "a\nb") && !strcmp(r.messages[0].role, "system"),
          "messages");
    CHECK(r.n == 3 && r.stream && r.include_usage && r.max_tokens == 9 && r.top_k == 0 && r.has_seed &&
              r.seed == 42 && r.n_stop == 2 && r.logprobs && r.top_logprobs == 3,
          "fields");
    GenParams d = {.sampling = sampler_params_default(), .max_tokens = 100}, p;
    api_gen_params(&r, &d, 7, 2, &p);
    CHECK(p.max_tokens == 9 && p.sampling.temperature == 0.5f && p.sampling.seed == 44 && p.n_stop == 2,
          "choice 2: seed 42 + 2 (%llu)", (unsigned long long)p.sampling.seed);
    api_request_free(&r);
    CHECK(parse("{\"prompt\": [\"Once\"], \"logprobs\": 2}", API_COMPLETIONS, &r, &e) == 0, "%s", e.message);
    CHECK(r.prompt && !strcmp(r.prompt, "Once") && r.n == 1 && r.max_tokens == -1 && r.top_logprobs == 2, "prompt");
    api_gen_params(&r, &d, 7, 1, &p);
    CHECK(p.max_tokens == 100 && p.sampling.seed == 8 && p.sampling.temperature == d.sampling.temperature,
          "defaults kept, fallback seed + 1");
    api_request_free(&r);
}

static void test_parse_refusals(void) {
    const struct {
        const char *body;
        ApiKind kind;
        const char *param;
    } cases[] = {
        {"{bad", API_CHAT, ""},
        {"[1]", API_CHAT, ""},
        {"{}", API_CHAT, "messages"},
        {"{\"messages\": []}", API_CHAT, "messages"},
        {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", API_CHAT, "messages[0].role"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", API_CHAT, "messages[0].content"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", API_CHAT, "messages[0].content"},
        {"{\"prompt\": \"\"}", API_COMPLETIONS, "prompt"},
        {"{\"prompt\": [1, 2]}", API_COMPLETIONS, "prompt"},
        {"{\"prompt\": \"a\", \"n\": 17}", API_COMPLETIONS, "n"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1.5}", API_COMPLETIONS, "max_tokens"},
        {"{\"prompt\": \"a\", \"temperature\": \"hot\"}", API_COMPLETIONS, "temperature"},
        {"{\"prompt\": \"a\", \"top_p\": 1.5}", API_COMPLETIONS, "top_p"},
        {"{\"prompt\": \"a\", \"presence_penalty\": 3}", API_COMPLETIONS, "presence_penalty"},
        {"{\"prompt\": \"a\", \"stop\": [\"\"]}", API_COMPLETIONS, "stop"},
        {"{\"prompt\": \"a\", \"stop\": 3}", API_COMPLETIONS, "stop"},
        {"{\"prompt\": \"a\", \"stream\": 1}", API_COMPLETIONS, "stream"},
        {"{\"prompt\": \"a\", \"seed\": \"s\"}", API_COMPLETIONS, "seed"},
        {"{\"prompt\": \"a\", \"logprobs\": 6}", API_COMPLETIONS, "logprobs"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 1}", API_CHAT, "logprobs"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 21, \"logprobs\": true}",
         API_CHAT, "top_logprobs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ApiRequest r;
        ApiError e;
        int rc = parse(cases[i].body, cases[i].kind, &r, &e);
        CHECK(rc == -1 && e.message[0] && !strcmp(e.param, cases[i].param), "%s: rc %d param '%s' (want '%s'): %s",
              cases[i].body, rc, e.param, cases[i].param, e.message);
    }
}

/* out parses as JSON; the root object. */
static Json *reparse(const JsonBuf *b) {
    Err err = {{0}};
    Json *doc = json_parse(b->data, b->len, "response", &err);
    CHECK(doc != NULL, "%s: %.200s", err.msg, b->data);
    return doc;
}

static void test_responses(void) {
    ApiRequest r;
    ApiError e;
    CHECK(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 2}", API_CHAT, &r, &e) == 0, "body");
    ApiMeta m = {.id = "chatcmpl-1", .model = "model \"q\"", .created = 1700000000};
    ApiChoice ch[2] = {{.text = "Hello \"you\"\n", .len = 12, .finish_reason = "stop"},
                       {.text = "", .len = 0, .finish_reason = "length"}};
    JsonBuf b = {0};
    CHECK(api_put_response(&b, &r, &m, ch, 2, 10, 5) == 0, "response");
    Json *doc = reparse(&b);
    const JsonValue *root = doc ? json_root(doc) : NULL;
    if (root) {
        const JsonValue *c1 = json_at(json_get(root, "choices"), 1), *c0 = json_at(json_get(root, "choices"), 0);
        CHECK(!strcmp(json_get_str(root, "object", ""), "chat.completion") &&
                  !strcmp(json_get_str(root, "model", ""), "model \"q\""), "object, model");
        CHECK(!strcmp(json_get_str(json_get(c0, "message"), "content", ""), "Hello \"you\"\n"), "content");
        CHECK(json_get(c0, "logprobs")->type == JSON_NULL && !strcmp(json_get_str(c1, "finish_reason", ""), "length"),
              "logprobs null, finish");
        CHECK(json_get_int(json_get(root, "usage"), "total_tokens", 0) == 15, "usage");
    }
    json_free(doc);
    b.len = 0;
    CHECK(api_put_chunk(&b, &r, &m, 1, "hi", 2, true, NULL, NULL, 0) == 0, "chunk");
    doc = reparse(&b);
    if (doc) {
        const JsonValue *c = json_at(json_get(json_root(doc), "choices"), 0), *d = json_get(c, "delta");
        CHECK(json_get_int(c, "index", -1) == 1 && !strcmp(json_get_str(d, "role", ""), "assistant") &&
                  !strcmp(json_get_str(d, "content", ""), "hi") && json_get(c, "finish_reason")->type == JSON_NULL,
              "%s", b.data);
    }
    json_free(doc);
    b.len = 0;
    CHECK(api_put_error(&b, "bad \"x\"", "invalid_request_error", "x", NULL) == 0, "error");
    doc = reparse(&b);
    if (doc) {
        const JsonValue *er = json_get(json_root(doc), "error");
        CHECK(!strcmp(json_get_str(er, "message", ""), "bad \"x\"") && !strcmp(json_get_str(er, "param", ""), "x") &&
                  json_get(er, "code")->type == JSON_NULL, "%s", b.data);
    }
    json_free(doc);
    jsonbuf_free(&b);
    api_request_free(&r);
}

int main(void) {
    RUN(test_parse_fields);
    RUN(test_parse_refusals);
    RUN(test_responses);
    TEST_EXIT();
}
