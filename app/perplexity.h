/* perplexity.h — `cllm perplexity`: teacher-forced negative log-likelihood
 * and perplexity of a text, optionally saving the distributions
 * (--save-logits, app/logits_file.h) or comparing with saved ones
 * (--kl-divergence).
 *
 * Windowing: Hugging Face's "strided sliding window" (the perplexity page of
 * the transformers docs), so transformers gives the same numbers. The whole
 * text is tokenized once (BOS first exactly when the model's tokenizer adds
 * one, as `cllm tokenize`; special-token text is plain text); windows of ctx
 * tokens start at 0, stride, 2*stride, ... until one reaches the end; each
 * runs from an empty KV cache and scores only the tokens no earlier window
 * scored, never its own first token (nothing precedes it there):
 *     end = min(begin + ctx, n), targets [max(prev_end, begin + 1), end).
 * stride == ctx (the default) gives disjoint windows; stride > ctx is refused
 * (it would leave tokens unscored). */
#ifndef CLLM_PERPLEXITY_H
#define CLLM_PERPLEXITY_H

#include <stdbool.h>
#include <stdint.h>

#include "app/runtime.h"
#include "base/err.h"

/* One window: tokens [begin, end) in, targets [first, end) scored. */
typedef struct {
    int64_t begin, end, first;
} PplWindow;

/* Walks the windows of n tokens; windows that would score nothing are skipped. */
typedef struct {
    int64_t n, begin, prev_end;
    int ctx, stride;
    bool done;
} PplWindows;

void ppl_windows_init(PplWindows *it, int64_t n, int ctx, int stride);
bool ppl_windows_next(PplWindows *it, PplWindow *w);
/* Targets scored over n tokens (the sum of end - first). */
int64_t ppl_n_scored(int64_t n, int ctx, int stride);
/* n >= 2 tokens, ctx >= 2, 1 <= stride <= ctx; err says which is wrong. */
int ppl_check(int64_t n, int ctx, int stride, Err *err);

typedef struct {
    RunOptions run;          /* model, backend and its options (ctx_size is set from ctx) */
    const char *file;        /* the text */
    int ctx;                 /* tokens per window; <= 0: min(512, the model's context) */
    int stride;              /* <= 0: ctx */
    const char *save_logits; /* write the distributions here, or NULL */
    const char *kl_file;     /* compare with this --save-logits file, or NULL (ctx, stride from it) */
} PerplexityOptions;

/* The command; its exit code (2: bad input, 1: a failure while running). */
int perplexity_main(const PerplexityOptions *o);

#endif
