/* request.h — what a request asks of a reply and what it reports.
 *
 * A reply samples token by token until a stop condition, streaming the
 * text: an end-of-generation token (unless ignore_eos), a stop string
 * (excluded from the text), max_tokens, the context filling up, or an
 * interrupt (Ctrl-C sets the request's flag; the reply ends at the next
 * token). The scheduler (engine/scheduler.h) runs requests. */
#ifndef CLLM_REQUEST_H
#define CLLM_REQUEST_H

#include <signal.h>
#include <stdbool.h>

#include "engine/sampler.h"

typedef struct {
    SamplerParams sampling;
    int max_tokens;               /* <= 0: until the context is full */
    const char *const *stop;      /* stop strings */
    int n_stop;
    bool ignore_eos;
    /* Log-probabilities (engine/logprobs.h; all off when zeroed): of each
     * generated token with its top_logprobs alternatives, and of each prompt
     * token with prompt_top alternatives. A request asking for the prompt's
     * takes none of it from the prefix cache (its logits are needed). */
    bool logprobs;
    int top_logprobs;             /* 0..LOGPROBS_MAX_TOP */
    bool prompt_logprobs;
    int prompt_top;               /* 0..LOGPROBS_MAX_TOP */
} GenParams;

typedef struct {
    int prompt_tokens;            /* tokens prefilled by this call */
    int completion_tokens;
    double prefill_s, ttft_s, total_s;
    const char *finish_reason;    /* "stop", "length", "context", "interrupted" */
} GenStats;

/* Receives each piece of text as soon as it is final; a nonzero return ends
 * the reply (finish_reason "interrupted"). */
typedef int (*GenEmit)(void *ctx, const char *text, size_t len);

#endif
