/* tok_internal.h — the Tokenizer struct shared by tokenizer.c (encode,
 * decode) and the two loaders (tok_gguf.c, tok_hf.c). Not part of the public
 * API.
 *
 * A tokenizer is a pipeline, configured by the loader the way Hugging Face
 * `tokenizers` would be for the same model:
 *   text -> U+FFFD for invalid UTF-8 -> split on added tokens (raw text)
 *        -> normalizer steps -> split on "normalized" added tokens
 *        -> pre-tokenizer steps -> BPE model (byte-level or char-level with
 *           byte fallback) -> ids
 * Decoding uses a table of each token's bytes built once at load.
 */
#ifndef CLLM_TOK_INTERNAL_H
#define CLLM_TOK_INTERNAL_H

#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

/* The most times longer the normalizer and pre-tokenizer steps together may
 * make a text, counted per step in the worst case (tok_finish refuses a file
 * whose steps could exceed it; real files: 3 to 12). */
#define TOK_MAX_GROWTH 64

typedef enum { NORM_NFC, NORM_REPLACE, NORM_PREPEND } NormKind;
typedef struct {
    NormKind kind;
    char *from, *to; /* Replace: from -> to; Prepend: to */
    size_t from_len, to_len;
} NormStep;

typedef enum { PRE_BYTELEVEL, PRE_DIGITS, PRE_SPLIT_REGEX, PRE_SPLIT_STRING, PRE_METASPACE } PreKind;
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };
typedef struct {
    PreKind kind;
    bool add_prefix_space, use_regex; /* ByteLevel */
    bool individual_digits;           /* Digits */
    RegexKind rx;                     /* Split with a regex, ByteLevel's regex */
    SplitBehavior behavior;           /* Split */
    char *str;                        /* Split: the literal pattern; Metaspace: the replacement */
    size_t str_len;
    int prepend;                      /* Metaspace: PREPEND_* */
    bool split;                       /* Metaspace: split before each replacement char */
} PreStep;

typedef struct {
    int32_t id;
    char *text;  /* content */
    size_t len;
    char *match; /* what is searched for: text, or its normalized form for a
                    normalized token (HF matches those in normalized text) */
    size_t match_len;
    bool special, normalized, lstrip, rstrip, single_word;
} AddedTok;

/* Byte trie over added-token strings for leftmost-longest matching. */
typedef struct {
    int32_t root[256];            /* first node for each first byte, -1 none */
    struct TrieNode *node;
    size_t n, cap;
} AddedTrie;

typedef struct TrieNode {
    int32_t child, sibling, tok; /* tok: index into Tokenizer.added or -1 */
    uint8_t byte;
} TrieNode;

struct Tokenizer {
    TokenizerKind kind;
    char *source; /* file name for messages */

    /* vocabulary: ids 0..n_vocab-1 */
    int32_t n_vocab;
    char **piece;        /* NUL-terminated */
    uint32_t *piece_len;
    bool *in_model;      /* part of the BPE model's vocab (not only an added token) */
    StrMap vocab;        /* model vocab: piece -> id */
    MergeMap merges;

    /* model */
    bool byte_level;     /* symbols are bytes through the GPT-2 byte->char map */
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t unk;
    int32_t byte_sym[256]; /* byte_level: id of each byte's char */
    int32_t byte_fb[256];  /* byte_fallback: id of <0xXX> */
    int32_t ascii_sym[128];/* char-level: id of each ASCII char */

    NormStep *norm;
    size_t n_norm;
    PreStep *pre;
    size_t n_pre;
    AddedTok *added;
    size_t n_added;
    AddedTrie trie_raw, trie_norm;

    int32_t bos, eos;
    bool add_bos;
    int32_t *bos_seq;    /* what add_bos prepends (the template's tokens before $A) */
    size_t n_bos_seq;
    int32_t *suffix_seq; /* and appends (the template's tokens after $A) */
    size_t n_suffix_seq;
    int32_t *eog;
    size_t n_eog;
    char *chat_template;

    /* decoding */
    bool dec_byte_level;    /* ByteLevel decoder */
    bool dec_byte_fallback; /* ByteFallback decoder: <0xXX> -> that byte */
    char *dec_replace;      /* Replace / Metaspace decoder: this string -> ' ' (NULL: none) */
    int dec_strip_first; /* leading spaces stripped from the first token */
    char **dec;          /* decoded bytes of each token */
    uint32_t *dec_len;
    uint32_t max_dec_len;

    /* memory of all the strings above */
    struct ArenaBlock *arena;
};

/* ---- building (tokenizer.c) ---- */
Tokenizer *tok_new(const char *source);
char *tok_strdup(Tokenizer *t, const char *s, size_t len); /* NUL-terminated copy in the arena */
int tok_alloc_vocab(Tokenizer *t, int32_t n, Err *err);
/* Adds an added token (its content must already be the piece of id or the id
 * an added-only id). First one of equal content wins. */
int tok_add_added(Tokenizer *t, int32_t id, const char *text, size_t len, bool special, bool normalized,
                  bool lstrip, bool rstrip, bool single_word, Err *err);
int tok_push_norm(Tokenizer *t, NormStep s, Err *err);
int tok_push_pre(Tokenizer *t, PreStep s, Err *err);
/* After vocab, merges, added tokens and the pipeline are set: builds the
 * lookup tables, the decode table and the end-of-generation list. */
int tok_finish(Tokenizer *t, Err *err);
/* Builds the piece -> id map of the model vocab (pieces and in_model set);
 * tok_finish does it when the loader did not need it earlier. */
int tok_build_vocab_map(Tokenizer *t, Err *err);
int32_t tok_vocab_get(const Tokenizer *t, const char *s, size_t n); /* -1 if absent */
/* Adds the merge a + b with this rank (merges must be initialized); errors
 * name field[index] when a, b or a+b is not in the vocabulary. */
int tok_add_merge(Tokenizer *t, const char *a, size_t al, const char *b, size_t bl, int32_t rank, const char *field,
                  size_t index, Err *err);
/* Adds an end-of-generation id (ignored when out of range or present). */
int tok_add_eog(Tokenizer *t, int32_t id);
/* Applies the normalizer steps to s[0..n) (valid UTF-8); out is replaced. */
int tok_normalize(const Tokenizer *t, const char *s, size_t n, TextBuf *out);
/* The same with tmp as the second buffer of the ping-pong (kept by the caller). */
int tok_normalize_into(const Tokenizer *t, const char *s, size_t n, TextBuf *out, TextBuf *tmp);
/* Appends s[0..n) to out with every st->from replaced by st->to (NORM_REPLACE). */
int tok_replace_all(const char *s, size_t n, const NormStep *st, TextBuf *out);
/* GPT-2's byte -> code point map. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the map */

#endif
