/* chat_template.h — renders a conversation into the prompt text a chat model
 * was trained on.
 *
 * cllm does not run Jinja. Each family's official template is written out in
 * C, byte for byte for plain text conversations (system / user / assistant
 * messages; no tools, no images); tests/test_chat_template.c compares every
 * family with transformers' rendering of the real template strings. The
 * family is detected from the model's template string by distinctive markers
 * (or, for a model without one, from its special tokens) and can be forced by
 * name (--chat-template). Details that vary inside a family are read from the
 * template string by chat_template_init: ChatML's default system prompt,
 * Mistral v0.1's space after </s>, Llama 3.2's "today" date.
 *
 * Families and the templates they reproduce:
 *   chatml    ChatML: SmolLM2 (default system prompt), Qwen2 / Qwen2.5
 *             (default system prompt), OpenHermes-style (none)
 *   qwen3     ChatML with Qwen3's <think> handling of assistant turns after
 *             the last user turn
 *   llama3    Llama 3 / 3.0 (Meta-Llama-3-8B-Instruct): no date header
 *   llama3.1  Llama 3.1 / 3.2 / 3.3: a system header with "Cutting Knowledge
 *             Date: December 2023" and "Today Date" (3.1/3.3: the template's
 *             fixed 26 Jul 2024; 3.2: today, from the clock)
 *   llama2    Llama 2 chat: <s>[INST] <<SYS>>...<</SYS>> per turn, BOS per turn
 *   mistral   Mistral 7B Instruct v0.1 / v0.2 and Mixtral 8x7B v0.1: one BOS,
 *             "[INST] u [/INST]a</s>" (v0.1's template: "</s> "), no system role
 *   gemma     Gemma 3 (system prompt folded into the first user turn) and
 *             Gemma 2 (whose template refuses a system prompt; cllm folds it
 *             the Gemma 3 way instead)
 *   harmony   gpt-oss: the default system message with today's date, a
 *             system prompt as the developer message, final-channel replies
 */
#ifndef CLLM_CHAT_TEMPLATE_H
#define CLLM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/err.h"
#include "tokenizer/tokenizer.h"

typedef enum {
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_LLAMA2,
    CHAT_MISTRAL,
    CHAT_GEMMA,
    CHAT_HARMONY,
    CHAT_QWEN3,
    CHAT_LLAMA31,
    CHAT_COUNT
} ChatFamily;

typedef struct {
    const char *role;        /* system, user, assistant (developer: harmony) */
    const char *content;
} ChatMessage;


/* The family of a template string. *guessed (may be NULL) is set when no
 * family's markers were found (or the string is NULL) and the answer is the
 * ChatML fallback. */
ChatFamily chat_template_classify(const char *template_string, bool *guessed);
ChatFamily chat_template_detect(const char *template_string); /* classify without the flag */
/* For a model whose file has no template: the family its special tokens
 * belong to (e.g. <start_of_turn> -> Gemma). */
ChatFamily chat_template_guess(const Tokenizer *tok);
const char *chat_family_name(ChatFamily f);
const char *chat_family_names(void);                          /* "chatml, qwen3, ..." */
int chat_family_from_name(const char *name, ChatFamily *out); /* 0, or -1 unknown */

typedef struct {
    ChatFamily family;
    const char *bos;             /* BOS text ("" if none); borrowed */
    const char *eos;             /* EOS text, for templates that close turns with it; borrowed */
    char default_system[1024];   /* ChatML: the system prompt the template adds when none is given */
    bool qwen_roles;             /* Qwen2.5 ChatML: tool messages as <tool_response>, unknown roles dropped */
    bool eos_space;              /* Mistral v0.1: "</s> " after each assistant turn */
    bool date_from_clock;        /* Llama 3.2: "Today Date" is today, not fixed_date */
    char fixed_date[32];         /* Llama 3.1/3.3: the template's date_string ("26 Jul 2024") */
    int today_y, today_m, today_d; /* "today" for the templates that print it; 0 = the local clock */
} ChatTemplate;

/* Prepares a template for a family and the model's template string (NULL if
 * the model has none). bos/eos are borrowed (NULL = ""). */
void chat_template_init(ChatTemplate *t, ChatFamily f, const char *template_string, const char *bos,
                        const char *eos);
/* Renders the conversation into out (replacing what it held). Errors are the
 * ones the real templates raise (e.g. Llama 2's user/assistant alternation),
 * naming the family and the message; out is then empty. */
int chat_render(const ChatTemplate *t, const ChatMessage *msgs, int n, bool add_generation_prompt, TextBuf *out,
                Err *err);

#endif
