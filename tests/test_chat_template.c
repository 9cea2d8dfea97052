/* test_chat_template.c — chat families against transformers' rendering of the
 * real templates (fixtures from tests/fixtures/make_chat_template_fixtures.py):
 * family detection from each real template string, byte-for-byte renders of
 * every conversation with and without the generation prompt, and the errors
 * the templates raise. */
#include <time.h>

#include "base/json.h"
#include "tests/test.h"
#include "tokenizer/chat_template.h"

/* Each fixture and the family its template string must be detected as. */
static const struct {
    const char *name;
    ChatFamily family;
} FIXTURES[] = {
    {"smollm2", CHAT_CHATML}, {"qwen2.5", CHAT_CHATML},   {"qwen3", CHAT_QWEN3},          {"chatml-openhermes", CHAT_CHATML},
    {"llama3", CHAT_LLAMA3},  {"llama3.2", CHAT_LLAMA31}, {"llama3.3", CHAT_LLAMA31},      {"llama2", CHAT_LLAMA2},
    {"mistral-v0.1", CHAT_MISTRAL}, {"mixtral", CHAT_MISTRAL}, {"gemma2", CHAT_GEMMA}, {"gemma3", CHAT_GEMMA},
    {"gpt-oss", CHAT_HARMONY},
};
#define N_FIXTURES (int)(sizeof FIXTURES / sizeof FIXTURES[0])

static Json *fixture_load(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat/%s.json", test_fixture_dir(), name);
    Err err = {{0}};
    Json *doc = json_parse_file(path, &err);
    CHECK(doc != NULL, "%s", err.msg);
    return doc;
}

/* Prints where two renders first differ, with some context. */
static void show_difference(const char *what, const char *got, size_t got_len, const char *want, size_t want_len) {
    size_t i = 0;
    while (i < got_len && i < want_len && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("  %s: first difference at byte %zu\n    got:  \"%.*s\"\n    want: \"%.*s\"\n", what, i,
           (int)(got_len - from < 80 ? got_len - from : 80), got + from,
           (int)(want_len - from < 80 ? want_len - from : 80), want + from);
}

/* Renders one fixture case and compares it with the expected text or error. */
static void case_check(const char *fixture, const ChatTemplate *t, const JsonValue *c) {
    const JsonValue *msgs = json_get(c, "messages");
    size_t n = json_len(msgs);
    ChatMessage m[16];
    CHECK(n > 0 && n <= 16, "%s: %zu messages", fixture, n);
    if (n == 0 || n > 16) return;
    for (size_t i = 0; i < n; i++)
        m[i] = (ChatMessage){json_get_str(json_at(msgs, i), "role", NULL), json_get_str(json_at(msgs, i), "content", NULL)};
    bool gen = json_get_bool(c, "add_generation_prompt", false);
    const JsonValue *want = json_get(c, "expected");
    const char *name = json_get_str(c, "name", "?");
    char what[160];
    snprintf(what, sizeof what, "%s/%s gen=%d", fixture, name, gen);
    TextBuf out = {0};
    Err err = {{0}};
    int rc = chat_render(t, m, (int)n, gen, &out, &err);
    if (want && want->type == JSON_STRING) {
        CHECK(rc == 0, "%s: %s", what, err.msg);
        bool same = rc == 0 && out.len == want->u.string.len && !memcmp(out.data, want->u.string.s, out.len);
        CHECK(same, "%s: render differs from transformers", what);
        if (!same && rc == 0) show_difference(what, out.data, out.len, want->u.string.s, want->u.string.len);
    } else {
        /* The template raised: cllm must refuse too, with the template's words. */
        const char *raised = json_get_str(c, "error", "");
        char key[41];
        snprintf(key, sizeof key, "%s", raised);
        CHECK(rc == -1, "%s: rendered although the template raises '%s'", what, raised);
        CHECK(rc == 0 || strstr(err.msg, key) != NULL, "%s: error '%s' lacks the template's '%s'", what, err.msg, key);
        CHECK(rc == 0 || out.len == 0, "%s: output left after an error", what);
    }
    textbuf_free(&out);
}

static void test_real_templates_render_like_transformers(void) {
    int cases = 0;
    for (int f = 0; f < N_FIXTURES; f++) {
        Json *doc = fixture_load(FIXTURES[f].name);
        if (!doc) continue;
        const JsonValue *root = json_root(doc);
        const char *tmpl = json_get_str(root, "template", NULL);
        bool guessed = true;
        ChatFamily fam = chat_template_classify(tmpl, &guessed);
        CHECK(fam == FIXTURES[f].family && !guessed, "%s: detected %s%s, want %s", FIXTURES[f].name,
              chat_family_name(fam), guessed ? " (guessed)" : "", chat_family_name(FIXTURES[f].family));
        ChatTemplate t;
        chat_template_init(&t, FIXTURES[f].family, tmpl, json_get_str(root, "bos", ""), json_get_str(root, "eos", ""));
        const JsonValue *date = json_get(root, "date");
        t.today_y = (int)json_at(date, 0)->u.number.i;
        t.today_m = (int)json_at(date, 1)->u.number.i;
        t.today_d = (int)json_at(date, 2)->u.number.i;
        const JsonValue *cs = json_get(root, "cases");
        CHECK(json_len(cs) >= 20, "%s: only %zu cases", FIXTURES[f].name, json_len(cs));
        for (size_t i = 0; i < json_len(cs); i++, cases++) case_check(FIXTURES[f].name, &t, json_at(cs, i));
        json_free(doc);
    }
    printf("  %d renders compared over %d real templates\n", cases, N_FIXTURES);
    CHECK(cases >= 13 * 20, "only %d cases", cases);
}

/* Template details read from the strings: ChatML default system prompts,
 * Mistral v0.1's trailing space, Llama 3.2's clock date. */
static void test_template_details(void) {
    const struct { const char *name; const char *system; } chatml[] = {
        {"smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"qwen2.5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
        {"chatml-openhermes", ""},
    };
    for (int i = 0; i < 3; i++) {
        Json *doc = fixture_load(chatml[i].name);
        if (!doc) continue;
        ChatTemplate t;
        chat_template_init(&t, CHAT_CHATML, json_get_str(json_root(doc), "template", NULL), "", "");
        CHECK(!strcmp(t.default_system, chatml[i].system), "%s: default system '%s'", chatml[i].name, t.default_system);
        json_free(doc);
    }
    const char *names[] = {"mistral-v0.1", "mixtral", "llama3.2", "llama3.3"};
    ChatTemplate t[4];
    for (int i = 0; i < 4; i++) {
        Json *doc = fixture_load(names[i]);
        if (!doc) return;
        chat_template_init(&t[i], i < 2 ? CHAT_MISTRAL : CHAT_LLAMA31, json_get_str(json_root(doc), "template", NULL),
                           "<s>", "</s>");
        json_free(doc);
    }
    CHECK(t[0].eos_space && !t[1].eos_space, "eos_space %d %d", t[0].eos_space, t[1].eos_space);
    CHECK(t[2].date_from_clock && !t[3].date_from_clock, "date_from_clock %d %d", t[2].date_from_clock,
          t[3].date_from_clock);
    CHECK(!strcmp(t[3].fixed_date, "26 Jul 2024"), "fixed date '%s'", t[3].fixed_date);

    /* Without a pinned date, Llama 3.2 prints today's local date as strftime "%d %b %Y". */
    ChatMessage one = {"user", "hi"};
    TextBuf out = {0};
    Err err = {{0}};
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char want[64], line[80];
    strftime(want, sizeof want, "%d %b %Y", &tm);
    snprintf(line, sizeof line, "Today Date: %s\n", want);
    CHECK(chat_render(&t[2], &one, 1, true, &out, &err) == 0, "%s", err.msg);
    CHECK(out.data && strstr(out.data, line), "no '%s' in %s", line, out.data ? out.data : "(null)");
    textbuf_free(&out);
}

static void test_detection_fallback_and_names(void) {
    bool guessed = false;
    CHECK(chat_template_classify(NULL, &guessed) == CHAT_CHATML && guessed, "NULL template");
    guessed = false;
    CHECK(chat_template_classify("{{ messages[0]['content'] }}", &guessed) == CHAT_CHATML && guessed, "unknown template");
    CHECK(chat_template_detect("{% for m in messages %}<|im_start|>{% endfor %}") == CHAT_CHATML, "chatml");
    for (int f = 0; f < CHAT_COUNT; f++) {
        ChatFamily back = CHAT_COUNT;
        CHECK(chat_family_from_name(chat_family_name((ChatFamily)f), &back) == 0 && back == (ChatFamily)f,
              "name round trip %d", f);
        CHECK(strstr(chat_family_names(), chat_family_name((ChatFamily)f)) != NULL, "%s not listed",
              chat_family_name((ChatFamily)f));
    }
    ChatFamily f = CHAT_COUNT;
    CHECK(chat_family_from_name("gpt-oss", &f) == 0 && f == CHAT_HARMONY, "alias gpt-oss");
    CHECK(chat_family_from_name("llama3.2", &f) == 0 && f == CHAT_LLAMA31, "alias llama3.2");
    CHECK(chat_family_from_name("nope", &f) == -1, "unknown name accepted");
    CHECK(chat_family_from_name(NULL, &f) == -1, "NULL name accepted");
}

/* Inputs no template accepts: an empty conversation, a message without role
 * or content. Each is a clear error, never a crash. */
static void test_bad_input(void) {
    for (int fam = 0; fam < CHAT_COUNT; fam++) {
        ChatTemplate t;
        chat_template_init(&t, (ChatFamily)fam, NULL, NULL, NULL);
        TextBuf out = {0};
        Err err = {{0}};
        ChatMessage m[2] = {{"user", "hi"}, {NULL, "x"}};
        CHECK(chat_render(&t, m, 0, true, &out, &err) == -1 && strstr(err.msg, "no messages"), "%s: empty: %s",
              chat_family_name(t.family), err.msg);
        CHECK(chat_render(&t, m, 2, true, &out, &err) == -1 && strstr(err.msg, "message 2 has no role"), "%s: %s",
              chat_family_name(t.family), err.msg);
        m[1] = (ChatMessage){"assistant", NULL};
        CHECK(chat_render(&t, m, 2, true, &out, &err) == -1 && strstr(err.msg, "no content"), "%s: %s",
              chat_family_name(t.family), err.msg);
        m[1] = (ChatMessage){"assistant", "ok"};
        CHECK(chat_render(&t, m, 2, false, &out, &err) == 0 && out.len > 0, "%s: %s", chat_family_name(t.family), err.msg);
        textbuf_free(&out);
    }
}

int main(void) {
    RUN(test_real_templates_render_like_transformers);
    RUN(test_template_details);
    RUN(test_detection_fallback_and_names);
    RUN(test_bad_input);
    TEST_EXIT();
}
