/* logprobs.h — the log-probabilities a request may ask for: of the token
 * drawn (or of a prompt token) and of the k most likely alternatives.
 *
 * Definition: log-softmax of the model's raw logits row (before temperature,
 * penalties, top-k/top-p/min-p: vLLM's default "raw logprobs"), computed in
 * fp32/fp64 on the host from the logits the forward pass wrote. The CPU and
 * GPU backends share this code, so they differ only by their logits.
 */
#ifndef CLLM_LOGPROBS_H
#define CLLM_LOGPROBS_H

#include <stdint.h>

#define LOGPROBS_MAX_TOP 20 /* most alternatives per token (OpenAI's top_logprobs limit) */

/* One token's entry. A logit of -inf gives a logprob of -inf. */
typedef struct {
    int32_t id;                          /* the token drawn, or the prompt token */
    float logprob;                       /* its log-probability; NAN: none (a prompt's first token) */
    int32_t rank;                        /* 1 + tokens with a larger logit */
    int n_top;                           /* alternatives: min(k, vocab) */
    int32_t top_id[LOGPROBS_MAX_TOP];    /* most likely first; ties: lower id first */
    float top_logprob[LOGPROBS_MAX_TOP];
} TokenLogprob;

/* Fills *out for token id of logits[0..vocab) with the k (0..LOGPROBS_MAX_TOP,
 * clamped) most likely tokens. */
void logprobs_row(const float *logits, int vocab, int32_t id, int k, TokenLogprob *out);

/* A growable list of entries (one per generated token). */
typedef struct {
    TokenLogprob *v;
    int n, cap;
} TokenLogprobs;

/* A new entry at the end (zeroed), or NULL when out of memory. */
TokenLogprob *token_logprobs_push(TokenLogprobs *l);
void token_logprobs_free(TokenLogprobs *l);

#endif
