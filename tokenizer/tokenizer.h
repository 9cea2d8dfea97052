/* tokenizer.h — text to token ids and back, exactly as the model's own
 * tokenizer does it.
 *
 * Two families, one struct:
 * - byte-level BPE (GPT-2 style; SmolLM2, Qwen2, Llama 3): a pre-tokenizer
 *   regex splits the text, each piece's bytes map to printable code points,
 *   merges apply by rank.
 * - SentencePiece-style (Llama 2, Gemma): spaces become U+2581 "▁", pieces are
 *   merged by score (GGUF "llama" model) or by merge rank (tokenizer.json BPE
 *   with byte_fallback), unknown bytes fall back to <0xXX> tokens.
 * Special / added tokens are matched before the model runs when parse_special
 * is on (as HF does for added tokens); with it off they are plain text.
 *
 * Loaded from GGUF metadata (tokenizer.ggml.*) or from tokenizer.json (+
 * tokenizer_config.json). Both inputs are untrusted: errors name the file and
 * the field.
 */
#ifndef CLLM_TOKENIZER_H
#define CLLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "formats/gguf.h"

typedef enum { TOK_BPE_BYTES, TOK_SPM } TokenizerKind;

typedef struct Tokenizer Tokenizer; /* opaque; see tokenizer.c */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} TokenIds;

int tokenizer_load_gguf(Tokenizer **out, const GGUFFile *f, Err *err);
/* tokenizer_json: path of tokenizer.json; config_json: path of
 * tokenizer_config.json or NULL (bos/eos, add_bos_token, chat_template). */
int tokenizer_load_hf(Tokenizer **out, const char *tokenizer_json, const char *config_json, Err *err);
void tokenizer_free(Tokenizer *t);

/* Appends the ids of text[0..len) to out. add_bos prepends BOS when the
 * tokenizer has one. text may be invalid UTF-8 (handled as HF does). */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool parse_special, bool add_bos,
                     TokenIds *out, Err *err);
void token_ids_free(TokenIds *ids);
int token_ids_push(TokenIds *ids, int32_t id); /* -1 on allocation failure */

TokenizerKind tokenizer_kind(const Tokenizer *t);
int32_t tokenizer_n_vocab(const Tokenizer *t);
int32_t tokenizer_bos(const Tokenizer *t);          /* -1 if none */
int32_t tokenizer_eos(const Tokenizer *t);          /* -1 if none */
bool tokenizer_add_bos(const Tokenizer *t);         /* does the model expect BOS first */
/* Ids that end a reply: EOS plus end-of-turn tokens (<|im_end|>, <|eot_id|>,
 * <end_of_turn>, <|return|>, ...). */
bool tokenizer_is_eog(const Tokenizer *t, int32_t id);
/* Id of a special/added token by its exact text, or -1. */
int32_t tokenizer_find_token(const Tokenizer *t, const char *text);
/* The chat template string of the model (NULL if none). */
const char *tokenizer_chat_template(const Tokenizer *t);

/* The vocabulary string of a token as stored (e.g. "Ġhello", "▁hello"). */
const char *tokenizer_piece(const Tokenizer *t, int32_t id);
/* The bytes a token stands for when decoded (byte-level mapping undone, ▁ ->
 * space, <0xXX> -> that byte). Writes up to cap bytes, returns the length
 * (or -1 for an invalid id). Special tokens decode to their text. */
int tokenizer_token_bytes(const Tokenizer *t, int32_t id, char *out, size_t cap);
/* The longest tokenizer_token_bytes of any token. */
int tokenizer_max_token_bytes(const Tokenizer *t);

/* Streaming detokenizer: feeds ids one at a time, emits only whole UTF-8
 * sequences (a multi-byte character split over tokens is held back until
 * complete; bytes that can never form a valid sequence come out as U+FFFD).
 * Applies the same first-token rule as HF decode (SPM leading-space strip). */
typedef struct {
    char pending[8];
    int n_pending;
    int n_tokens;       /* tokens pushed so far */
} Detok;

void detok_init(Detok *d);
/* Returns the number of bytes written to out. Enough room: cap >=
 * tokenizer_max_token_bytes(t) + 8 (81 + 8 for SmolLM2, 48 + 8 for Gemma 3);
 * with less, what does not fit is dropped (never a partial character). */
int detok_push(const Tokenizer *t, Detok *d, int32_t id, char *out, size_t cap);
/* Flushes held-back bytes (as U+FFFD) at the end of a stream. */
int detok_flush(Detok *d, char *out, size_t cap);

#endif
