/* stop.h — stop strings over streamed text.
 *
 * Generated text arrives in pieces and a stop string may straddle pieces.
 * Each push returns the bytes that are safe to show now: text that cannot be
 * the start of a stop string. A possible partial match is held back, and so
 * is an incomplete UTF-8 character at the end, so an emitted chunk never ends
 * inside a character the model is still writing. When a stop string
 * completes, the text before it is emitted and the matcher reports the stop;
 * the stop string itself and anything after it are never emitted (as
 * OpenAI's API does). Of several stop strings, the one that starts earliest
 * in the text wins.
 */
#ifndef CLLM_STOP_H
#define CLLM_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

typedef struct {
    const char *const *stop; /* borrowed: must outlive the matcher; NULL and "" entries are ignored */
    int n_stop;
    size_t max_stop;         /* the longest stop string */
    TextBuf buf;             /* held-back text, then the newest piece */
    size_t emitted;          /* the front of buf handed out by the last call */
    bool stopped;
} StopMatcher;

typedef struct {
    const char *emit;        /* the text to show now ("" if none); valid until the next call */
    size_t emit_len;
    bool stopped;            /* a stop string completed (or memory ran out): end the reply */
} StopResult;

void stop_matcher_init(StopMatcher *m, const char *const *stop, int n_stop);
/* Feeds the next piece of text. */
StopResult stop_matcher_push(StopMatcher *m, const char *text, size_t len);
/* At the end of a reply without a stop: emits whatever was held back. */
StopResult stop_matcher_flush(StopMatcher *m);
void stop_matcher_free(StopMatcher *m);

#endif
