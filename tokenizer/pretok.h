/* pretok.h — pre-tokenizer splitting: the regexes of the GPT-2, Llama 3 and
 * Qwen 2 families written as hand matchers over code points, the Digits
 * splitter, and splitting on a literal string, each with the
 * SplitDelimiterBehavior semantics of Hugging Face `tokenizers`.
 *
 * A piece of text is a byte range (Span) in a buffer owned by the caller.
 * Splitters append the sub-pieces of one span to a SpanList; empty pieces are
 * dropped, as `tokenizers` does.
 */
#ifndef CLLM_PRETOK_H
#define CLLM_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    RX_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    RX_LLAMA3, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    RX_QWEN2,  /* as RX_LLAMA3 with \p{N} in place of \p{N}{1,3} */
} RegexKind;

typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } SplitBehavior;

typedef struct {
    size_t start, end;
    bool first; /* starts at offset 0 of the whole input (Metaspace "first") */
} Span;

typedef struct {
    Span *v;
    size_t n, cap;
} SpanList;

/* Reusable working memory of the splitters (freed by pretok_scratch_free). */
typedef struct {
    uint32_t *cp;   /* code points of the span being matched */
    uint8_t *cls;   /* their UNI_* class bits */
    size_t *off;    /* byte offset of each code point, plus one past the end */
    size_t cap;
    Span *seg;      /* matches and gaps before the behavior is applied */
    bool *is_match;
    size_t seg_cap, match_cap;
} PretokScratch;

int spans_push(SpanList *l, size_t start, size_t end, bool first); /* -1 on allocation failure */
void spans_free(SpanList *l);
void pretok_scratch_free(PretokScratch *ws);

/* Returns the regex named by its exact source text, or -1 if it is not one
 * of the three families implemented here. */
int pretok_regex_from_pattern(const char *pattern, size_t len);

/* Each returns 0, or -1 on allocation failure. */
int pretok_split_regex(RegexKind k, SplitBehavior b, const char *text, Span sp, SpanList *out, PretokScratch *ws);
/* Digits: every numeric character alone (individual) or runs of them. */
int pretok_split_digits(bool individual, const char *text, Span sp, SpanList *out, PretokScratch *ws);
int pretok_split_string(const char *pat, size_t plen, SplitBehavior b, const char *text, Span sp, SpanList *out,
                        PretokScratch *ws);

#endif
