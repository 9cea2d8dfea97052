/* chat_template.h — renders a conversation into the prompt text a chat model
 * was trained on.
 *
 * cllm does not run Jinja: each family's template is written out in C,
 * detected from the model's template string by its distinctive markers (or,
 * for a model without one, from its special tokens), and overridable with
 * --chat-template. Per-model details the families share a shape but not text
 * for (ChatML's default system prompt) are read from the template string. */
#ifndef CLLM_CHAT_TEMPLATE_H
#define CLLM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "model/err.h"
#include "tokenizer/tokenizer.h"

typedef enum { CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_MISTRAL, CHAT_GEMMA, CHAT_HARMONY, CHAT_COUNT } ChatFamily;

typedef struct {
    const char *role;        /* system, user, assistant */
    const char *content;
} ChatMessage;

/* A growing text buffer (NUL-terminated). */
typedef struct {
    char *data;
    size_t len, cap;
} ChatBuf;

int chat_buf_append(ChatBuf *b, const char *s, size_t n); /* 0, or -1 out of memory */
void chat_buf_free(ChatBuf *b);

/* The family of a template string (NULL: CHAT_CHATML). */
ChatFamily chat_template_detect(const char *template_string);
/* For a model whose file has no template: the family its special tokens
 * belong to (e.g. <start_of_turn> -> Gemma). */
ChatFamily chat_template_guess(const Tokenizer *tok);
const char *chat_family_name(ChatFamily f);
const char *chat_family_names(void);                     /* "chatml, llama3, ..." */
int chat_family_from_name(const char *name, ChatFamily *out); /* 0, or -1 unknown */

typedef struct {
    ChatFamily family;
    const char *bos;             /* BOS text ("" if none) */
    const char *eos;             /* EOS text, for templates that close turns with it */
    char default_system[1024];   /* ChatML: the system prompt the template adds when none is given */
} ChatTemplate;

/* Prepares a template for a family and the model's template string. */
void chat_template_init(ChatTemplate *t, ChatFamily f, const char *template_string, const char *bos,
                        const char *eos);
/* Appends the rendered conversation to out. Errors (e.g. Llama 2's strict
 * user/assistant alternation) name the message. */
int chat_render(const ChatTemplate *t, const ChatMessage *msgs, int n, bool add_generation_prompt, ChatBuf *out,
                Err *err);

#endif
