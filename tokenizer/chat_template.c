/* chat_template.c — the chat families written out in C (see chat_template.h).
 *
 * Each renderer follows its reference Jinja template statement by statement,
 * including the places where Jinja and Python differ from C string handling:
 * `trim` / `.strip()` remove Python's Unicode whitespace (not just ASCII),
 * an empty string is false, `content is iterable` is true for a string (so
 * Llama 3.1 writes a tool message as a JSON string). tests/test_chat_template.c
 * checks each family against transformers' rendering of the real templates
 * (tests/fixtures/make_chat_template_fixtures.py).
 */
#include "tokenizer/chat_template.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const FAMILY_NAMES[CHAT_COUNT] = {
    [CHAT_CHATML] = "chatml", [CHAT_LLAMA3] = "llama3",   [CHAT_LLAMA2] = "llama2", [CHAT_MISTRAL] = "mistral",
    [CHAT_GEMMA] = "gemma",   [CHAT_HARMONY] = "harmony", [CHAT_QWEN3] = "qwen3",   [CHAT_LLAMA31] = "llama3.1",
};

/* ---- the growing buffer ---- */

static int put(TextBuf *b, const char *s) { return textbuf_append(b, s, strlen(s)); }

/* ---- Python string semantics ---- */

/* A text span: what Python's slicing and stripping produce, without copies. */
typedef struct {
    const char *p;
    size_t n;
} Span;

static Span span_of(const char *s) { return (Span){s, strlen(s)}; }
static int put_span(TextBuf *b, Span s) { return textbuf_append(b, s.p, s.n); }

/* Decodes the UTF-8 character at s[0..n) (n > 0); *len gets its length, and
 * an invalid byte reads as itself with length 1 (it is never whitespace). */
static uint32_t utf8_decode(const unsigned char *s, size_t n, size_t *len) {
    int need = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : s[0] >= 0xE0 && s[0] < 0xF0 ? 3
             : s[0] >= 0xF0 && s[0] < 0xF5 ? 4 : 0;
    *len = 1;
    if (need <= 1 || (size_t)need > n) return s[0];
    uint32_t c = s[0] & (0x7F >> need);
    for (int i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return s[0];
        c = (c << 6) | (s[i] & 0x3F);
    }
    *len = (size_t)need;
    return c;
}

/* Python's str.isspace(): the characters str.strip() removes. */
static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* The length of the whitespace character ending at s[n-1], or 0. */
static size_t space_before_end(const char *s, size_t n) {
    size_t start = n - 1;
    while (start > 0 && n - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
    size_t len;
    uint32_t c = utf8_decode((const unsigned char *)s + start, n - start, &len);
    return start + len == n && py_isspace(c) ? len : 0;
}

/* Jinja's trim / Python's str.strip() with no argument. */
static Span py_strip(Span s) {
    size_t len;
    while (s.n > 0 && py_isspace(utf8_decode((const unsigned char *)s.p, s.n, &len))) { s.p += len; s.n -= len; }
    while (s.n > 0 && (len = space_before_end(s.p, s.n)) > 0) s.n -= len;
    return s;
}

static Span lstrip_newlines(Span s) {
    while (s.n > 0 && *s.p == '\n') { s.p++; s.n--; }
    return s;
}

static Span rstrip_newlines(Span s) {
    while (s.n > 0 && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

static bool span_starts(Span s, const char *pre) { size_t k = strlen(pre); return s.n >= k && !memcmp(s.p, pre, k); }
static bool span_ends(Span s, const char *suf) {
    size_t k = strlen(suf);
    return s.n >= k && !memcmp(s.p + s.n - k, suf, k);
}

/* The first / last occurrence of needle in s, or NULL. */
static const char *span_find(Span s, const char *needle) { return memmem(s.p, s.n, needle, strlen(needle)); }
static const char *span_find_last(Span s, const char *needle) {
    const char *last = NULL;
    size_t k = strlen(needle);
    for (const char *h = span_find(s, needle); h; h = memmem(h + 1, s.n - (size_t)(h + 1 - s.p), needle, k)) last = h;
    return last;
}

/* Python's json.dumps(s, ensure_ascii=False), which transformers' tojson is. */
static int put_json_string(TextBuf *b, const char *s) {
    int rc = put(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8] = {0};
        if (c == '"') strcpy(esc, "\\\"");
        else if (c == '\\') strcpy(esc, "\\\\");
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\b') strcpy(esc, "\\b");
        else if (c == '\f') strcpy(esc, "\\f");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        rc |= esc[0] ? put(b, esc) : textbuf_append(b, s, 1);
    }
    return rc | put(b, "\"");
}

/* ---- names and detection ---- */

const char *chat_family_name(ChatFamily f) { return (unsigned)f < CHAT_COUNT ? FAMILY_NAMES[f] : "?"; }

const char *chat_family_names(void) {
    return "chatml, qwen3, llama3, llama3.1 (also llama3.2, llama3.3), llama2, mistral, gemma, harmony (also gpt-oss)";
}

int chat_family_from_name(const char *name, ChatFamily *out) {
    static const struct { const char *name; ChatFamily f; } ALIASES[] = {
        {"llama3.2", CHAT_LLAMA31}, {"llama3.3", CHAT_LLAMA31}, {"gpt-oss", CHAT_HARMONY},
        {"qwen2", CHAT_CHATML},     {"qwen2.5", CHAT_CHATML},   {"smollm2", CHAT_CHATML},
    };
    if (!name) return -1;
    for (int f = 0; f < CHAT_COUNT; f++)
        if (!strcmp(name, FAMILY_NAMES[f])) { *out = (ChatFamily)f; return 0; }
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcmp(name, ALIASES[i].name)) { *out = ALIASES[i].f; return 0; }
    return -1;
}

ChatFamily chat_template_classify(const char *t, bool *guessed) {
    bool dummy;
    if (!guessed) guessed = &dummy;
    *guessed = false;
    if (t && strstr(t, "<|start|>") && strstr(t, "<|message|>")) return CHAT_HARMONY;
    if (t && strstr(t, "<start_of_turn>")) return CHAT_GEMMA;
    if (t && strstr(t, "<|start_header_id|>"))
        return strstr(t, "Cutting Knowledge Date") ? CHAT_LLAMA31 : CHAT_LLAMA3;
    if (t && strstr(t, "<|im_start|>")) return strstr(t, "</think>") ? CHAT_QWEN3 : CHAT_CHATML;
    if (t && strstr(t, "<<SYS>>")) return CHAT_LLAMA2;
    if (t && strstr(t, "[INST]")) return CHAT_MISTRAL;
    *guessed = true;
    return CHAT_CHATML;
}

ChatFamily chat_template_detect(const char *t) { return chat_template_classify(t, NULL); }

ChatFamily chat_template_guess(const Tokenizer *tok) {
    if (!tok) return CHAT_CHATML;
    if (tokenizer_find_token(tok, "<|channel|>") >= 0) return CHAT_HARMONY;
    if (tokenizer_find_token(tok, "<start_of_turn>") >= 0) return CHAT_GEMMA;
    if (tokenizer_find_token(tok, "<|start_header_id|>") >= 0) return CHAT_LLAMA3;
    if (tokenizer_find_token(tok, "[INST]") >= 0) return CHAT_MISTRAL;
    return CHAT_CHATML;
}

/* ---- per-template details read from the template string ---- */

/* Reads the Jinja string literal that starts at p (just after its opening
 * quote q) into out, unescaping \n \t \\ \' \"; returns 0 when it is a plain
 * literal that fits. */
static int jinja_literal(const char *p, char q, char *out, size_t cap) {
    size_t n = 0;
    for (; *p && *p != q; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            c = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
            if (!c) return -1;
        }
        if (n + 1 >= cap) return -1;
        out[n++] = c;
    }
    out[n] = 0;
    return *p == q ? 0 : -1;
}

/* ChatML templates that add a system prompt when the conversation has none
 * (SmolLM2, Qwen2.5) write it as one literal: '<|im_start|>system\n...<|im_end|>\n'. */
static void chatml_default_system(const char *t, char *out, size_t cap) {
    out[0] = 0;
    for (const char *p = t ? strstr(t, "<|im_start|>system") : NULL; p; p = strstr(p + 1, "<|im_start|>system")) {
        char q = p > t ? p[-1] : 0;
        if (q != '\'' && q != '"') continue;
        char lit[1200];
        if (jinja_literal(p, q, lit, sizeof lit)) continue;
        const char *body = lit + strlen("<|im_start|>system");
        if (*body != '\n') continue;
        char *end = strstr(body, "<|im_end|>");
        size_t len = end ? (size_t)(end - body - 1) : 0;
        if (len == 0 || len >= cap) continue;
        memcpy(out, body + 1, len);
        out[len] = 0;
        return;
    }
}

/* Llama 3.1's `set date_string = "26 Jul 2024"`. */
static void llama_fixed_date(const char *t, char *out, size_t cap) {
    snprintf(out, cap, "26 Jul 2024");
    const char *p = t ? strstr(t, "set date_string = ") : NULL;
    if (!p) return;
    p += strlen("set date_string = ");
    char lit[32];
    if ((*p == '"' || *p == '\'') && jinja_literal(p + 1, *p, lit, sizeof lit) == 0) snprintf(out, cap, "%s", lit);
}

void chat_template_init(ChatTemplate *t, ChatFamily f, const char *template_string, const char *bos,
                        const char *eos) {
    memset(t, 0, sizeof *t);
    t->family = f;
    t->bos = bos ? bos : "";
    t->eos = eos ? eos : "";
    const char *s = template_string;
    if (f == CHAT_CHATML) chatml_default_system(s, t->default_system, sizeof t->default_system);
    t->qwen_roles = f == CHAT_CHATML && s && strstr(s, "<tool_response>");
    t->eos_space = f == CHAT_MISTRAL && s && (strstr(s, "eos_token + ' '") || strstr(s, "eos_token + \" \""));
    t->date_from_clock = f == CHAT_LLAMA31 && s && strstr(s, "strftime_now");
    llama_fixed_date(f == CHAT_LLAMA31 ? s : NULL, t->fixed_date, sizeof t->fixed_date);
}

/* Today as year/month/day: the template's override, or the local clock (as
 * transformers' strftime_now reads datetime.now()). */
static void template_today(const ChatTemplate *t, int *y, int *m, int *d) {
    if (t->today_y > 0) {
        *y = t->today_y, *m = t->today_m, *d = t->today_d;
        return;
    }
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    *y = tm.tm_year + 1900, *m = tm.tm_mon + 1, *d = tm.tm_mday;
}

/* ---- the renderers ---- */

typedef struct {
    const ChatTemplate *t;
    const ChatMessage *m;
    int n;
    bool gen;           /* add_generation_prompt */
    TextBuf *o;
    Err *err;
    int oom;            /* any append failed */
} Render;

static void out(Render *r, const char *s) { r->oom |= put(r->o, s); }
static void out_span(Render *r, Span s) { r->oom |= put_span(r->o, s); }
static bool role_is(const ChatMessage *m, const char *role) { return !strcmp(m->role, role); }

/* The user/assistant alternation check that Llama 2, Mistral and Gemma
 * raise: message i (counted after the system prompt, at offset `first`). */
static int check_alternation(Render *r, int first, const char *family) {
    for (int i = first; i < r->n; i++)
        if (role_is(&r->m[i], "user") != ((i - first) % 2 == 0))
            return err_set(r->err, "chat template %s: message %d has role '%s' where %s was expected: "
                           "Conversation roles must alternate user/assistant/user/assistant/...",
                           family, i + 1, r->m[i].role, (i - first) % 2 == 0 ? "'user'" : "anything but 'user'");
    return 0;
}

/* Qwen2.5 / Qwen3: consecutive tool messages share one user turn. */
static void qwen_tool_message(Render *r, int i) {
    if (i == 0 || !role_is(&r->m[i - 1], "tool")) out(r, "<|im_start|>user");
    out(r, "\n<tool_response>\n");
    out(r, r->m[i].content);
    out(r, "\n</tool_response>");
    if (i == r->n - 1 || !role_is(&r->m[i + 1], "tool")) out(r, "<|im_end|>\n");
}

static void chatml_message(Render *r, const ChatMessage *m) {
    out(r, "<|im_start|>");
    out(r, m->role);
    out(r, "\n");
    out(r, m->content);
    out(r, "<|im_end|>\n");
}

/* SmolLM2 and OpenHermes render every message as is; Qwen2.5's template
 * (it has <tool_response>) groups tool messages and drops unknown roles. */
static int render_chatml(Render *r) {
    const ChatTemplate *t = r->t;
    bool qwen = t->qwen_roles;
    if (t->default_system[0] && !role_is(&r->m[0], "system")) {
        out(r, "<|im_start|>system\n");
        out(r, t->default_system);
        out(r, "<|im_end|>\n");
    }
    for (int i = 0; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        if (!qwen || role_is(m, "user") || role_is(m, "system") || role_is(m, "assistant")) chatml_message(r, m);
        else if (role_is(m, "tool")) qwen_tool_message(r, i);
    }
    if (r->gen) out(r, "<|im_start|>assistant\n");
    return 0;
}

/* Qwen3: an assistant turn after the last real user turn shows its reasoning
 * in <think> tags (empty when it had none) if it is the last message or has
 * reasoning; reasoning in earlier turns is dropped. */
static void qwen3_assistant(Render *r, int i, int last_query) {
    Span content = span_of(r->m[i].content), reasoning = {"", 0};
    const char *close = span_find(content, "</think>");
    if (close) {
        Span before = rstrip_newlines((Span){content.p, (size_t)(close - content.p)});
        const char *open = span_find_last(before, "<think>");
        if (open) before = (Span){open + 7, before.n - (size_t)(open + 7 - before.p)};
        reasoning = lstrip_newlines(before);
        const char *last = span_find_last(content, "</think>") + 8;
        content = lstrip_newlines((Span){last, content.n - (size_t)(last - content.p)});
    }
    out(r, "<|im_start|>assistant\n");
    if (i > last_query && (i == r->n - 1 || reasoning.n > 0)) {
        out(r, "<think>\n");
        out_span(r, lstrip_newlines(rstrip_newlines(reasoning)));
        out(r, "\n</think>\n\n");
        content = lstrip_newlines(content);
    }
    out_span(r, content);
    out(r, "<|im_end|>\n");
}

static int render_qwen3(Render *r) {
    if (role_is(&r->m[0], "system")) chatml_message(r, &r->m[0]);
    int last_query = r->n - 1;
    for (int i = r->n - 1; i >= 0; i--) {
        Span c = span_of(r->m[i].content);
        if (role_is(&r->m[i], "user") && !(span_starts(c, "<tool_response>") && span_ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        if (role_is(m, "user") || (role_is(m, "system") && i > 0)) chatml_message(r, m);
        else if (role_is(m, "assistant")) qwen3_assistant(r, i, last_query);
        else if (role_is(m, "tool")) qwen_tool_message(r, i);
    }
    if (r->gen) out(r, "<|im_start|>assistant\n");
    return 0;
}

static void llama3_header(Render *r, const char *role) {
    out(r, "<|start_header_id|>");
    out(r, role);
    out(r, "<|end_header_id|>\n\n");
}

/* Llama 3.0: BOS on the first message, content trimmed, any role as is. */
static int render_llama3(Render *r) {
    for (int i = 0; i < r->n; i++) {
        if (i == 0) out(r, r->t->bos);
        llama3_header(r, r->m[i].role);
        out_span(r, py_strip(span_of(r->m[i].content)));
        out(r, "<|eot_id|>");
    }
    if (r->gen) llama3_header(r, "assistant");
    return 0;
}

/* Llama 3.1 / 3.2 / 3.3 without tools: a system header with the knowledge
 * cutoff and a date, then the turns; tool results go in an ipython turn. */
static int render_llama31(Render *r) {
    const ChatTemplate *t = r->t;
    int first = 0;
    out(r, t->bos);
    llama3_header(r, "system");
    out(r, "Cutting Knowledge Date: December 2023\nToday Date: ");
    if (t->date_from_clock) {
        static const char *const MONTHS[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                               "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        int y, m, d;
        template_today(t, &y, &m, &d);
        char date[32];
        snprintf(date, sizeof date, "%02d %s %d", d, MONTHS[(m - 1 + 12) % 12], y); /* strftime "%d %b %Y" */
        out(r, date);
    } else {
        out(r, t->fixed_date);
    }
    out(r, "\n\n");
    if (role_is(&r->m[0], "system")) {
        out_span(r, py_strip(span_of(r->m[0].content)));
        first = 1;
    }
    out(r, "<|eot_id|>");
    for (int i = first; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        if (role_is(m, "tool") || role_is(m, "ipython")) {
            llama3_header(r, "ipython");
            r->oom |= put_json_string(r->o, m->content); /* a string "is iterable" to Jinja: tojson */
        } else {
            llama3_header(r, m->role);
            out_span(r, py_strip(span_of(m->content)));
        }
        out(r, "<|eot_id|>");
    }
    if (r->gen) llama3_header(r, "assistant");
    return 0;
}

/* Llama 2 chat: BOS before every user turn, the system prompt in <<SYS>>
 * inside the first, contents stripped; add_generation_prompt changes nothing. */
static int render_llama2(Render *r) {
    const ChatTemplate *t = r->t;
    int first = role_is(&r->m[0], "system") ? 1 : 0;
    if (check_alternation(r, first, "llama2")) return -1;
    for (int i = first; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        TextBuf content = {0};
        if (i == first && first) {
            r->oom |= put(&content, "<<SYS>>\n") | put(&content, r->m[0].content) | put(&content, "\n<</SYS>>\n\n");
        }
        r->oom |= put(&content, m->content);
        Span c = py_strip((Span){content.data ? content.data : "", content.len});
        if (role_is(m, "user")) {
            out(r, t->bos);
            out(r, "[INST] ");
            out_span(r, c);
            out(r, " [/INST]");
        } else if (role_is(m, "assistant")) {
            out(r, " ");
            out_span(r, c);
            out(r, " ");
            out(r, t->eos);
        }
        textbuf_free(&content);
    }
    return 0;
}

/* Mistral Instruct v0.1 / v0.2, Mixtral v0.1: one BOS, no system role. */
static int render_mistral(Render *r) {
    const ChatTemplate *t = r->t;
    if (check_alternation(r, 0, "mistral")) return -1;
    out(r, t->bos);
    for (int i = 0; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        if (role_is(m, "user")) {
            out(r, "[INST] ");
            out(r, m->content);
            out(r, " [/INST]");
        } else if (role_is(m, "assistant")) {
            out(r, m->content);
            out(r, t->eos);
            if (t->eos_space) out(r, " ");
        } else {
            return err_set(r->err, "chat template mistral: message %d has role '%s': "
                           "Only user and assistant roles are supported!", i + 1, m->role);
        }
    }
    return 0;
}

/* Gemma 3: the system prompt and a blank line open the first user turn;
 * assistant turns are "model" turns; contents trimmed. */
static int render_gemma(Render *r) {
    int first = role_is(&r->m[0], "system") ? 1 : 0;
    if (check_alternation(r, first, "gemma")) return -1;
    out(r, r->t->bos);
    for (int i = first; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        out(r, "<start_of_turn>");
        out(r, role_is(m, "assistant") ? "model" : m->role);
        out(r, "\n");
        if (i == first && first) {
            out(r, r->m[0].content);
            out(r, "\n\n");
        }
        out_span(r, py_strip(span_of(m->content)));
        out(r, "<end_of_turn>\n");
    }
    if (r->gen) out(r, "<start_of_turn>model\n");
    return 0;
}

/* gpt-oss harmony, as its template renders without tools: the system message
 * (identity, knowledge cutoff, today's date, reasoning effort medium, the
 * channels), a system/developer prompt as the developer's instructions,
 * final-channel assistant turns (the last one closed by <|return|> when no
 * generation prompt follows). */
static int render_harmony(Render *r) {
    int y, mo, d;
    template_today(r->t, &y, &mo, &d);
    char date[48];
    snprintf(date, sizeof date, "%04d-%02d-%02d", y, mo, d);
    out(r, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
           "Knowledge cutoff: 2024-06\nCurrent date: ");
    out(r, date);
    out(r, "\n\nReasoning: medium\n\n"
           "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>");
    int first = role_is(&r->m[0], "system") || role_is(&r->m[0], "developer") ? 1 : 0;
    if (first && r->m[0].content[0]) {
        out(r, "<|start|>developer<|message|># Instructions\n\n");
        out(r, r->m[0].content);
        out(r, "\n\n<|end|>");
    }
    for (int i = first; i < r->n; i++) {
        const ChatMessage *m = &r->m[i];
        if (role_is(m, "assistant")) {
            if (strstr(m->content, "<|channel|>analysis<|message|>") || strstr(m->content, "<|channel|>final<|message|>"))
                return err_set(r->err, "chat template harmony: message %d: You have passed a message containing "
                               "<|channel|> tags in the content field.", i + 1);
            out(r, "<|start|>assistant<|channel|>final<|message|>");
            out(r, m->content);
            out(r, i == r->n - 1 && !r->gen ? "<|return|>" : "<|end|>");
        } else if (role_is(m, "user")) {
            out(r, "<|start|>user<|message|>");
            out(r, m->content);
            out(r, "<|end|>");
        } else if (role_is(m, "tool")) {
            return err_set(r->err, "chat template harmony: message %d: Message has tool role, but there was no "
                           "previous assistant message with a tool call!", i + 1);
        } /* any other role: the template skips it */
    }
    if (r->gen) out(r, "<|start|>assistant");
    return 0;
}

int chat_render(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, TextBuf *o, Err *err) {
    o->len = 0;
    if (o->data) o->data[0] = 0;
    if (n <= 0 || !m) return err_set(err, "chat template %s: the conversation has no messages", chat_family_name(t->family));
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content)
            return err_set(err, "chat template %s: message %d has no %s", chat_family_name(t->family), i + 1,
                           m[i].role ? "content" : "role");
    Render r = {t, m, n, gen, o, err, 0};
    int rc;
    switch (t->family) {
    case CHAT_QWEN3: rc = render_qwen3(&r); break;
    case CHAT_LLAMA3: rc = render_llama3(&r); break;
    case CHAT_LLAMA31: rc = render_llama31(&r); break;
    case CHAT_LLAMA2: rc = render_llama2(&r); break;
    case CHAT_MISTRAL: rc = render_mistral(&r); break;
    case CHAT_GEMMA: rc = render_gemma(&r); break;
    case CHAT_HARMONY: rc = render_harmony(&r); break;
    default: rc = render_chatml(&r); break;
    }
    if (rc == 0 && r.oom) rc = err_set(err, "chat template %s: out of memory", chat_family_name(t->family));
    if (rc) {
        o->len = 0;
        if (o->data) o->data[0] = 0;
    }
    return rc;
}
