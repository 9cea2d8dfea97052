/* generate.h — one reply: prefill the new prompt tokens of a sequence, then
 * sample token by token until a stop condition, streaming the text.
 *
 * Stop conditions: an end-of-generation token (unless ignore_eos), a stop
 * string (excluded from the text), max_tokens, the context filling up, or an
 * interrupt (Ctrl-C sets *interrupt; the reply ends at the next token). The
 * sequence keeps every token of the reply, so a chat's next turn reuses its
 * KV cache. */
#ifndef CLLM_GENERATE_H
#define CLLM_GENERATE_H

#include <signal.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "engine/sampler.h"

typedef struct {
    SamplerParams sampling;
    int max_tokens;               /* <= 0: until the context is full */
    const char *const *stop;      /* stop strings */
    int n_stop;
    bool ignore_eos;
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

int generate_reply(Engine *e, Sequence *s, const int32_t *prompt, int n_prompt, const GenParams *p, GenEmit emit,
                   void *emit_ctx, volatile sig_atomic_t *interrupt, GenStats *st, Err *err);

double now_seconds(void); /* monotonic clock */

#endif
