/* stop.c — the streaming stop-string matcher (see stop.h).
 *
 * buf holds the text not yet shown: at most (longest stop - 1) bytes of a
 * possible partial match, up to 3 bytes of an unfinished UTF-8 character, and
 * the newest piece. Since what is held never contains a whole stop string (the
 * matcher would have stopped), searching buf again after each push finds a
 * stop string that straddles pieces, and nothing twice. */
#include "engine/stop.h"

#include <string.h>

void stop_matcher_init(StopMatcher *m, const char *const *stop, int n_stop) {
    memset(m, 0, sizeof *m);
    m->stop = stop;
    m->n_stop = stop ? n_stop : 0;
    for (int i = 0; i < m->n_stop; i++) {
        size_t n = m->stop[i] ? strlen(m->stop[i]) : 0;
        if (n > m->max_stop) m->max_stop = n;
    }
}

void stop_matcher_free(StopMatcher *m) {
    textbuf_free(&m->buf);
    memset(m, 0, sizeof *m);
}

/* Hands out buf[0..n) and remembers to drop it on the next call. */
static StopResult stop_emit(StopMatcher *m, size_t n) {
    m->emitted = n;
    return (StopResult){n ? m->buf.data : "", n, m->stopped};
}

/* Appends text after dropping what the last call handed out. */
static int stop_buf_append(StopMatcher *m, const char *text, size_t len) {
    TextBuf *b = &m->buf;
    if (m->emitted) memmove(b->data, b->data + m->emitted, b->len - m->emitted);
    b->len -= m->emitted;
    m->emitted = 0;
    return textbuf_append(b, text, len);
}

/* Where the earliest complete stop string starts in buf, or -1. */
static long stop_find_first(const StopMatcher *m) {
    long first = -1;
    for (int i = 0; i < m->n_stop; i++) {
        const char *s = m->stop[i];
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || n > m->buf.len) continue;
        const char *hit = memmem(m->buf.data, m->buf.len, s, n);
        if (hit && (first < 0 || hit - m->buf.data < first)) first = hit - m->buf.data;
    }
    return first;
}

/* The length of the longest tail of buf that is a proper prefix of a stop
 * string: text that may still become a stop. */
static size_t stop_partial_tail(const StopMatcher *m) {
    size_t limit = m->max_stop > 0 ? m->max_stop - 1 : 0;
    if (limit > m->buf.len) limit = m->buf.len;
    for (size_t k = limit; k > 0; k--) {
        const char *tail = m->buf.data + m->buf.len - k;
        for (int i = 0; i < m->n_stop; i++) {
            const char *s = m->stop[i];
            if (s && strlen(s) > k && !memcmp(tail, s, k)) return k;
        }
    }
    return 0;
}

/* Moves cut back to the start of a UTF-8 character that buf[0..cut) would
 * otherwise end inside of. Invalid bytes are not held: they never complete. */
static size_t utf8_safe_cut(const char *buf, size_t cut) {
    size_t q = cut;
    while (q > 0 && cut - q < 3 && ((unsigned char)buf[q - 1] & 0xC0) == 0x80) q--;
    if (q == 0) return cut;
    unsigned char lead = (unsigned char)buf[q - 1];
    size_t need = lead >= 0xF0 && lead < 0xF8 ? 4 : lead >= 0xE0 && lead < 0xF0 ? 3 : lead >= 0xC0 && lead < 0xE0 ? 2 : 1;
    return need > cut - (q - 1) ? q - 1 : cut;
}

StopResult stop_matcher_push(StopMatcher *m, const char *text, size_t len) {
    if (m->stopped) return (StopResult){"", 0, true};
    if (stop_buf_append(m, text, len)) {
        m->stopped = true; /* out of memory: end the reply rather than lose text silently */
        return stop_emit(m, 0);
    }
    long first = stop_find_first(m);
    if (first >= 0) {
        m->stopped = true;
        return stop_emit(m, (size_t)first);
    }
    size_t cut = m->buf.len - stop_partial_tail(m);
    return stop_emit(m, utf8_safe_cut(m->buf.data, cut));
}

StopResult stop_matcher_flush(StopMatcher *m) {
    if (m->stopped) return (StopResult){"", 0, true};
    if (stop_buf_append(m, "", 0)) return stop_emit(m, 0);
    return stop_emit(m, m->buf.len);
}
