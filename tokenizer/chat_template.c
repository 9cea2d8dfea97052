/* chat_template.c — the chat families written out in C (see
 * chat_template.h). Each renderer follows its reference Jinja template
 * step by step; tests/test_chat_template.c compares the output with
 * transformers' apply_chat_template. */
#include "tokenizer/chat_template.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const FAMILY_NAMES[CHAT_COUNT] = {"chatml", "llama3", "llama2", "mistral", "gemma", "harmony"};

int chat_buf_append(ChatBuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void chat_buf_free(ChatBuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int put(ChatBuf *b, const char *s) { return chat_buf_append(b, s, strlen(s)); }

/* Appends s without leading and trailing whitespace (Jinja's trim). */
static int put_trimmed(ChatBuf *b, const char *s) {
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)*s)) { s++; n--; }
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    return chat_buf_append(b, s, n);
}

const char *chat_family_name(ChatFamily f) { return (unsigned)f < CHAT_COUNT ? FAMILY_NAMES[f] : "?"; }

const char *chat_family_names(void) { return "chatml, llama3, llama2, mistral, gemma, harmony"; }

int chat_family_from_name(const char *name, ChatFamily *out) {
    for (int f = 0; f < CHAT_COUNT; f++)
        if (!strcmp(name, FAMILY_NAMES[f])) { *out = (ChatFamily)f; return 0; }
    return -1;
}

ChatFamily chat_template_detect(const char *t) {
    if (!t) return CHAT_CHATML;
    if (strstr(t, "<|start|>") && strstr(t, "<|channel|>")) return CHAT_HARMONY;
    if (strstr(t, "<start_of_turn>")) return CHAT_GEMMA;
    if (strstr(t, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (strstr(t, "<<SYS>>")) return CHAT_LLAMA2;
    if (strstr(t, "[INST]")) return CHAT_MISTRAL;
    return CHAT_CHATML;
}

ChatFamily chat_template_guess(const Tokenizer *tok) {
    if (!tok) return CHAT_CHATML;
    if (tokenizer_find_token(tok, "<|channel|>") >= 0) return CHAT_HARMONY;
    if (tokenizer_find_token(tok, "<start_of_turn>") >= 0) return CHAT_GEMMA;
    if (tokenizer_find_token(tok, "<|start_header_id|>") >= 0) return CHAT_LLAMA3;
    if (tokenizer_find_token(tok, "[INST]") >= 0) return CHAT_MISTRAL;
    return CHAT_CHATML;
}

/* ChatML templates that add a system prompt when the conversation has none
 * carry it as a literal: '<|im_start|>system\n' ... '<|im_end|>'. */
static void chatml_default_system(const char *t, char *out, size_t cap) {
    out[0] = 0;
    const char *key = "<|im_start|>system\\n";
    const char *p = t ? strstr(t, key) : NULL;
    if (!p) return;
    p += strlen(key);
    const char *e = strstr(p, "<|im_end|>");
    if (!e || memchr(p, '{', (size_t)(e - p)) || memchr(p, '\'', (size_t)(e - p))) return; /* not a plain literal */
    size_t n = 0;
    for (const char *s = p; s < e && n + 1 < cap; s++) {
        if (s[0] == '\\' && s + 1 < e && s[1] == 'n') { out[n++] = '\n'; s++; }
        else out[n++] = *s;
    }
    out[n] = 0;
}

void chat_template_init(ChatTemplate *t, ChatFamily f, const char *template_string, const char *bos,
                        const char *eos) {
    memset(t, 0, sizeof *t);
    t->family = f;
    t->bos = bos ? bos : "";
    t->eos = eos ? eos : "";
    if (f == CHAT_CHATML) chatml_default_system(template_string, t->default_system, sizeof t->default_system);
}

static int render_chatml(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, ChatBuf *o) {
    int rc = 0;
    if (t->default_system[0] && (n == 0 || strcmp(m[0].role, "system"))) {
        rc |= put(o, "<|im_start|>system\n");
        rc |= put(o, t->default_system);
        rc |= put(o, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        rc |= put(o, "<|im_start|>");
        rc |= put(o, m[i].role);
        rc |= put(o, "\n");
        rc |= put(o, m[i].content);
        rc |= put(o, "<|im_end|>\n");
    }
    if (gen) rc |= put(o, "<|im_start|>assistant\n");
    return rc;
}

static int render_llama3(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, ChatBuf *o) {
    int rc = put(o, t->bos);
    for (int i = 0; i < n; i++) {
        rc |= put(o, "<|start_header_id|>");
        rc |= put(o, m[i].role);
        rc |= put(o, "<|end_header_id|>\n\n");
        rc |= put_trimmed(o, m[i].content);
        rc |= put(o, "<|eot_id|>");
    }
    if (gen) rc |= put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return rc;
}

/* Llama 2 chat: [INST] turns, the system prompt inside the first one. */
static int render_llama2(const ChatTemplate *t, const ChatMessage *m, int n, ChatBuf *o, Err *err) {
    const char *sys = NULL;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = m[0].content; m++; n--; }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        bool user = !strcmp(m[i].role, "user");
        if (user != (i % 2 == 0))
            return err_set(err, "chat template llama2: message %d must be from the %s (roles must alternate "
                           "user/assistant/user/...)", i + 1 + (sys != NULL), i % 2 == 0 ? "user" : "assistant");
        if (user) {
            rc |= put(o, t->bos);
            rc |= put(o, "[INST] ");
            if (i == 0 && sys) {
                ChatBuf c = {0};
                rc |= put(&c, "<<SYS>>\n");
                rc |= put(&c, sys);
                rc |= put(&c, "\n<</SYS>>\n\n");
                rc |= put(&c, m[i].content);
                rc |= put_trimmed(o, c.data ? c.data : "");
                chat_buf_free(&c);
            } else {
                rc |= put_trimmed(o, m[i].content);
            }
            rc |= put(o, " [/INST]");
        } else {
            rc |= put(o, " ");
            rc |= put_trimmed(o, m[i].content);
            rc |= put(o, " ");
            rc |= put(o, t->eos);
        }
    }
    return rc;
}

/* Mistral Instruct v0.1/v0.2: [INST] turns, no system role (a system prompt
 * is prepended to the first user message, as later Mistral templates do). */
static int render_mistral(const ChatTemplate *t, const ChatMessage *m, int n, ChatBuf *o, Err *err) {
    const char *sys = NULL;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = m[0].content; m++; n--; }
    int rc = put(o, t->bos);
    for (int i = 0; i < n; i++) {
        bool user = !strcmp(m[i].role, "user");
        if (user != (i % 2 == 0))
            return err_set(err, "chat template mistral: roles must alternate user/assistant (message %d)", i + 1);
        if (user) {
            rc |= put(o, "[INST] ");
            if (i == 0 && sys) { rc |= put(o, sys); rc |= put(o, "\n\n"); }
            rc |= put(o, m[i].content);
            rc |= put(o, " [/INST]");
        } else {
            rc |= put(o, m[i].content);
            rc |= put(o, t->eos);
        }
    }
    return rc;
}

/* Gemma 2/3: turns of user and model; a system prompt is folded into the
 * first user turn. */
static int render_gemma(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, ChatBuf *o, Err *err) {
    const char *sys = NULL;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = m[0].content; m++; n--; }
    int rc = put(o, t->bos);
    for (int i = 0; i < n; i++) {
        bool user = !strcmp(m[i].role, "user");
        if (user != (i % 2 == 0))
            return err_set(err, "chat template gemma: roles must alternate user/assistant (message %d)", i + 1);
        rc |= put(o, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == 0 && sys) { rc |= put(o, sys); rc |= put(o, "\n\n"); }
        rc |= put_trimmed(o, m[i].content);
        rc |= put(o, "<end_of_turn>\n");
    }
    if (gen) rc |= put(o, "<start_of_turn>model\n");
    return rc;
}

/* gpt-oss harmony: a fixed system message, the user's system prompt as the
 * developer's instructions, final-channel assistant turns. */
static int render_harmony(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, ChatBuf *o) {
    int rc = put(o, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                    "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
                    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
                    "<|end|>");
    if (n > 0 && !strcmp(m[0].role, "system")) {
        rc |= put(o, "<|start|>developer<|message|># Instructions\n\n");
        rc |= put(o, m[0].content);
        rc |= put(o, "\n\n<|end|>");
        m++;
        n--;
    }
    for (int i = 0; i < n; i++) {
        if (!strcmp(m[i].role, "assistant")) {
            rc |= put(o, "<|start|>assistant<|channel|>final<|message|>");
            rc |= put(o, m[i].content);
            rc |= put(o, "<|end|>");
        } else {
            rc |= put(o, "<|start|>");
            rc |= put(o, m[i].role);
            rc |= put(o, "<|message|>");
            rc |= put(o, m[i].content);
            rc |= put(o, "<|end|>");
        }
    }
    if (gen) rc |= put(o, "<|start|>assistant");
    return rc;
}

int chat_render(const ChatTemplate *t, const ChatMessage *m, int n, bool gen, ChatBuf *out, Err *err) {
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content) return err_set(err, "chat message %d has no role or content", i + 1);
    int rc;
    switch (t->family) {
    case CHAT_LLAMA3: rc = render_llama3(t, m, n, gen, out); break;
    case CHAT_LLAMA2: rc = render_llama2(t, m, n, out, err); break;
    case CHAT_MISTRAL: rc = render_mistral(t, m, n, out, err); break;
    case CHAT_GEMMA: rc = render_gemma(t, m, n, gen, out, err); break;
    case CHAT_HARMONY: rc = render_harmony(t, m, n, gen, out); break;
    default: rc = render_chatml(t, m, n, gen, out); break;
    }
    if (rc && err && !err->msg[0]) err_set(err, "out of memory rendering the chat");
    return rc ? -1 : 0;
}
