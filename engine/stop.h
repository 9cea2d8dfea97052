/* stop.h — stop strings over streamed text.
 *
 * Text arrives in pieces; a stop string may straddle pieces. The matcher
 * emits only text that cannot be the start of a stop string, holds back a
 * possible partial match, and reports when one completes. The stop string
 * itself and anything after it are never emitted (OpenAI semantics). */
#ifndef CLLM_STOP_H
#define CLLM_STOP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *const *stop;
    int n_stop;
    char *held;              /* text not yet emitted */
    size_t n_held, cap_held;
    char *out;               /* what the last call emits */
    size_t cap_out;
    bool stopped;
} StopMatcher;

typedef struct {
    const char *emit;        /* valid until the next call */
    size_t emit_len;
    bool stopped;            /* a stop string completed: end the reply */
} StopResult;

void stop_matcher_init(StopMatcher *m, const char *const *stop, int n_stop);
StopResult stop_matcher_push(StopMatcher *m, const char *text, size_t len);
/* At the end of a reply: emits whatever was held back. */
StopResult stop_matcher_flush(StopMatcher *m);
void stop_matcher_free(StopMatcher *m);

#endif
