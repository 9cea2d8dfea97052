/* stop.c — the stop-string matcher (see stop.h). */
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

void stop_matcher_init(StopMatcher *m, const char *const *stop, int n_stop) {
    memset(m, 0, sizeof *m);
    m->stop = stop;
    m->n_stop = n_stop;
}

void stop_matcher_free(StopMatcher *m) {
    free(m->held);
    free(m->out);
    memset(m, 0, sizeof *m);
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

/* Copies held[0..n) to out and drops it from held. */
static StopResult emit_front(StopMatcher *m, size_t n, bool stopped, size_t drop) {
    StopResult r = {"", 0, stopped};
    if (n > 0 && grow(&m->out, &m->cap_out, n) == 0) {
        memcpy(m->out, m->held, n);
        r.emit = m->out;
        r.emit_len = n;
    }
    memmove(m->held, m->held + drop, m->n_held - drop);
    m->n_held -= drop;
    return r;
}

/* Length of the longest suffix of s[0..n) that begins some stop string. */
static size_t partial_suffix(const StopMatcher *m, const char *s, size_t n) {
    size_t best = 0;
    for (int k = 0; k < m->n_stop; k++) {
        size_t sl = strlen(m->stop[k]);
        if (sl == 0) continue;
        for (size_t l = sl - 1 < n ? sl - 1 : n; l > best; l--)
            if (!memcmp(s + n - l, m->stop[k], l)) { best = l; break; }
    }
    return best;
}

StopResult stop_matcher_push(StopMatcher *m, const char *text, size_t len) {
    StopResult none = {"", 0, m->stopped};
    if (m->stopped) return none;
    if (grow(&m->held, &m->cap_held, m->n_held + len + 1)) return none;
    memcpy(m->held + m->n_held, text, len);
    m->n_held += len;
    if (m->n_stop == 0) return emit_front(m, m->n_held, false, m->n_held);
    size_t first = (size_t)-1;
    for (int k = 0; k < m->n_stop; k++) {
        size_t sl = strlen(m->stop[k]);
        if (sl == 0) continue;
        m->held[m->n_held] = 0;
        const char *hit = memmem(m->held, m->n_held, m->stop[k], sl);
        if (hit && (size_t)(hit - m->held) < first) first = (size_t)(hit - m->held);
    }
    if (first != (size_t)-1) {
        m->stopped = true;
        return emit_front(m, first, true, m->n_held);
    }
    size_t keep = partial_suffix(m, m->held, m->n_held);
    return emit_front(m, m->n_held - keep, false, m->n_held - keep);
}

StopResult stop_matcher_flush(StopMatcher *m) {
    if (m->stopped) return (StopResult){"", 0, true};
    return emit_front(m, m->n_held, false, m->n_held);
}
