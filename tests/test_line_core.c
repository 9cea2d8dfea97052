/* test_line_core.c — the chat prompt's editing core (app/line_core.c) fed
 * byte strings, and its column widths against the C library's wcwidth. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "app/line_edit.h"
#include "tests/test.h"

/* ------------------------------------------------------------ helpers */

/* Feeds every byte of s; returns the last event other than LINE_EV_NONE. */
static LineEvent feed_n(LineCore *c, const char *s, size_t n) {
    LineEvent last = LINE_EV_NONE;
    for (size_t i = 0; i < n; i++) {
        LineEvent ev = line_core_feed(c, (unsigned char)s[i]);
        if (ev != LINE_EV_NONE) last = ev;
    }
    return last;
}

static LineEvent feed(LineCore *c, const char *s) { return feed_n(c, s, strlen(s)); }

/* The line equals want (want_len bytes) and the cursor is at want_cursor. */
static int line_is_n(LineCore *c, const char *want, size_t want_len, size_t want_cursor) {
    size_t len;
    const char *s = line_core_line(c, &len);
    return len == want_len && memcmp(s, want, len) == 0 && line_core_cursor(c) == want_cursor;
}

#define LINE_IS(c, want, cur)                                                                 \
    do {                                                                                      \
        size_t l_;                                                                            \
        const char *s_ = line_core_line(c, &l_);                                              \
        CHECK(line_is_n(c, want, strlen(want), cur), "line \"%.*s\" cursor %zu, want \"%s\" cursor %zu", \
              (int)l_, s_, line_core_cursor(c), want, (size_t)(cur));                         \
    } while (0)

static LineCore *core_with(LineHistory *h) {
    LineCore *c = line_core_create(h);
    CHECK(c != NULL, "line_core_create");
    return c;
}

/* A fresh folder under TMPDIR (or /tmp). */

static int is_boundary(const char *s, size_t len, size_t at) {
    size_t i = 0;
    while (i < at) i += (size_t)line_utf8_unit(s, len, i, NULL);
    return i == at;
}

/* ------------------------------------------------------ the core: keys */

static void test_insert_in_multibyte_text(void) {
    LineCore *c = core_with(NULL);
    feed(c, "a\xE4\xB8\xAD" "b");                       /* a中b */
    LINE_IS(c, "a\xE4\xB8\xAD" "b", 5);
    feed(c, "\x1b[D\x1b[D");                             /* before 中 */
    LINE_IS(c, "a\xE4\xB8\xAD" "b", 1);
    feed(c, "\xC3\xA9");                                 /* é */
    LINE_IS(c, "a\xC3\xA9\xE4\xB8\xAD" "b", 3);
    feed(c, "\x1b[C");                                   /* over 中 in one step */
    LINE_IS(c, "a\xC3\xA9\xE4\xB8\xAD" "b", 6);
    feed(c, "\xF0\x9F\x98\x80");                         /* 😀 between 中 and b */
    LINE_IS(c, "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80" "b", 10);
    line_core_destroy(c);
}

static void test_cursor_keys(void) {
    LineCore *c = core_with(NULL);
    feed(c, "h\xC3\xA9llo");                             /* héllo, 6 bytes */
    feed(c, "\x1b[H");  LINE_IS(c, "h\xC3\xA9llo", 0);   /* Home */
    feed(c, "\x1b[C");  LINE_IS(c, "h\xC3\xA9llo", 1);
    feed(c, "\x1b[C");  LINE_IS(c, "h\xC3\xA9llo", 3);   /* é is one step */
    feed(c, "\x1b[D");  LINE_IS(c, "h\xC3\xA9llo", 1);
    feed(c, "\x1b[F");  LINE_IS(c, "h\xC3\xA9llo", 6);   /* End */
    feed(c, "\x1b[1~"); LINE_IS(c, "h\xC3\xA9llo", 0);   /* Home, vt style */
    feed(c, "\x1b[4~"); LINE_IS(c, "h\xC3\xA9llo", 6);   /* End, vt style */
    feed(c, "\x1b[7~"); LINE_IS(c, "h\xC3\xA9llo", 0);   /* Home, rxvt */
    feed(c, "\x1b[8~"); LINE_IS(c, "h\xC3\xA9llo", 6);   /* End, rxvt */
    feed(c, "\x1bOH");  LINE_IS(c, "h\xC3\xA9llo", 0);   /* Home, application mode */
    feed(c, "\x1bOF");  LINE_IS(c, "h\xC3\xA9llo", 6);
    feed(c, "\x01");    LINE_IS(c, "h\xC3\xA9llo", 0);   /* Ctrl-A */
    feed(c, "\x05");    LINE_IS(c, "h\xC3\xA9llo", 6);   /* Ctrl-E */
    feed(c, "\x02\x02\x02\x02"); LINE_IS(c, "h\xC3\xA9llo", 1); /* Ctrl-B x4 */
    feed(c, "\x06");    LINE_IS(c, "h\xC3\xA9llo", 3);   /* Ctrl-F */
    feed(c, "\x1b[D\x1b[3~");                            /* Delete removes é whole */
    LINE_IS(c, "hllo", 1);
    feed(c, "\x1b[D\x1b[D\x1b[D");                       /* stops at 0 */
    LINE_IS(c, "hllo", 0);
    feed(c, "\x1b[F\x1b[C\x1b[3~");                      /* right and Delete at the end: nothing */
    LINE_IS(c, "hllo", 4);
    feed(c, "\x1b[1;5D");                                /* Ctrl-Left: word left */
    LINE_IS(c, "hllo", 0);
    feed(c, " two\x1b" "b");                             /* Alt-b */
    LINE_IS(c, " twohllo", 1);
    feed(c, "\x1b" "f");                                 /* Alt-f */
    LINE_IS(c, " twohllo", 8);
    line_core_destroy(c);
}

static void test_backspace_wide_chars(void) {
    LineCore *c = core_with(NULL);
    feed(c, "x\xF0\x9F\x98\x80");                        /* x😀 */
    feed(c, "\x7f");
    LINE_IS(c, "x", 1);
    line_core_reset(c);
    feed(c, "\xE4\xB8\xAD\xE6\x96\x87");                 /* 中文 */
    feed(c, "\x08");                                     /* Ctrl-H backspace */
    LINE_IS(c, "\xE4\xB8\xAD", 3);
    feed(c, "\x7f\x7f\x7f");                             /* past the start: nothing breaks */
    LINE_IS(c, "", 0);
    feed(c, "\xF0\x9F\x98\x80" "a\xF0\x9F\x91\x8D");     /* 😀a👍 */
    feed(c, "\x1b[D\x7f");                               /* backspace a */
    LINE_IS(c, "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D", 4);
    feed(c, "\x1b[H\x1b[3~");                            /* Delete over 😀 */
    LINE_IS(c, "\xF0\x9F\x91\x8D", 0);
    line_core_destroy(c);
}

static void test_kill_keys(void) {
    LineCore *c = core_with(NULL);
    feed(c, "hello big world");
    feed(c, "\x17");                                     /* Ctrl-W */
    LINE_IS(c, "hello big ", 10);
    feed(c, "\x17");                                     /* spaces then the word */
    LINE_IS(c, "hello ", 6);
    feed(c, "\x19");                                     /* Ctrl-Y yanks "big " back */
    LINE_IS(c, "hello big ", 10);
    feed(c, "\x1b[H\x1b[C\x1b[C");
    feed(c, "\x0b");                                     /* Ctrl-K */
    LINE_IS(c, "he", 2);
    feed(c, "\x1b[H");
    feed(c, "\x0b");
    LINE_IS(c, "", 0);
    feed(c, "abc \xE4\xB8\xAD\xE6\x96\x87 d");
    feed(c, "\x1b[D\x1b[D");                             /* before " d" */
    feed(c, "\x15");                                     /* Ctrl-U */
    LINE_IS(c, " d", 0);
    feed(c, "\x19");
    LINE_IS(c, "abc \xE4\xB8\xAD\xE6\x96\x87 d", 10);
    feed(c, "\x1b[H\x1b" "d");                           /* Alt-d kills a word forward */
    LINE_IS(c, " \xE4\xB8\xAD\xE6\x96\x87 d", 0);
    feed(c, "\x1b[F\x1b\x7f");                           /* Alt-Backspace */
    LINE_IS(c, " \xE4\xB8\xAD\xE6\x96\x87 ", 8);
    feed(c, "\x17");                                     /* Ctrl-W over CJK */
    LINE_IS(c, " ", 1);
    line_core_destroy(c);
}

static void test_history_browse(void) {
    LineHistory h;
    line_history_init(&h, 10);
    CHECK(line_history_add(&h, "first") == 0, "add");
    line_history_add(&h, "second\nline");
    line_history_add(&h, "second\nline");           /* a repeat is not added */
    line_history_add(&h, "");                       /* nor an empty line */
    CHECK(h.n == 2, "n = %d", h.n);
    LineCore *c = core_with(&h);
    feed(c, "draft");
    feed(c, "\x1b[A");
    LINE_IS(c, "second\nline", 11);
    feed(c, "\x10");                                 /* Ctrl-P */
    LINE_IS(c, "first", 5);
    feed(c, "\x1b[A");                               /* no older entry: stays */
    LINE_IS(c, "first", 5);
    feed(c, "\x7f\x7fXY");                           /* edit an old entry, then leave it */
    LINE_IS(c, "firXY", 5);
    feed(c, "\x1b[B");
    LINE_IS(c, "second\nline", 11);
    feed(c, "\x1b[A");                               /* the edit was not kept, the file entry untouched */
    LINE_IS(c, "first", 5);
    CHECK(!strcmp(h.items[0], "first"), "history changed: %s", h.items[0]);
    feed(c, "\x1b[B\x0e");                           /* down, Ctrl-N: back to the draft */
    LINE_IS(c, "draft", 5);
    feed(c, "\x1b[B");                               /* nothing newer */
    LINE_IS(c, "draft", 5);
    feed(c, "\x1b[A\x1b[B!");                        /* the draft keeps its edits */
    LINE_IS(c, "draft!", 6);
    /* history_max: the oldest entry goes. */
    LineHistory small;
    line_history_init(&small, 2);
    line_history_add(&small, "a");
    line_history_add(&small, "b");
    line_history_add(&small, "c");
    CHECK(small.n == 2 && !strcmp(small.items[0], "b") && !strcmp(small.items[1], "c"), "max 2: n %d", small.n);
    line_history_free(&small);
    line_core_destroy(c);
    line_history_free(&h);
}

static void test_backslash_continuation(void) {
    LineCore *c = core_with(NULL);
    CHECK(feed(c, "abc\\\r") == LINE_EV_CONTINUE, "continue");
    CHECK(line_core_continued(c), "continued");
    size_t n;
    const char *last = line_core_last_continued(c, &n);
    CHECK(n == 3 && !memcmp(last, "abc", 3), "last continued %.*s", (int)n, last);
    LINE_IS(c, "", 0);
    CHECK(feed(c, "d\\e\\\n") == LINE_EV_CONTINUE, "second continue (LF as Enter)");
    CHECK(feed(c, "fin\r") == LINE_EV_SUBMIT, "submit");
    char *t = line_core_take_text(c);
    CHECK(t && !strcmp(t, "abc\nd\\e\nfin"), "text %s", t);
    free(t);
    /* Ctrl-D on the empty line after a backslash ends the turn. */
    line_core_reset(c);
    CHECK(!line_core_continued(c), "reset");
    feed(c, "x\\\r");
    CHECK(feed(c, "\x04") == LINE_EV_SUBMIT, "Ctrl-D after continuation");
    t = line_core_take_text(c);
    CHECK(t && !strcmp(t, "x\n"), "text %s", t);
    free(t);
    /* A backslash in the middle does not continue. */
    line_core_reset(c);
    CHECK(feed(c, "a\\b\r") == LINE_EV_SUBMIT, "mid backslash");
    line_core_destroy(c);
}

static void test_bracketed_paste(void) {
    LineCore *c = core_with(NULL);
    feed(c, "say: ");
    LineEvent ev = feed(c, "\x1b[200~line1\r\nline2\rline3\n\tend\\\r\x01\x1b[A\x7f\x1b[201~");
    CHECK(ev == LINE_EV_NONE, "no event inside a paste, got %d", ev);
    LINE_IS(c, "say: line1\nline2\nline3\n\tend\\\n", 29);
    CHECK(feed(c, "\r") == LINE_EV_SUBMIT, "Enter after the paste submits");
    char *t = line_core_take_text(c);
    CHECK(t && !strcmp(t, "say: line1\nline2\nline3\n\tend\\\n"), "text %s", t);
    free(t);
    /* Pasted into the middle, with UTF-8, then keys work again. */
    line_core_reset(c);
    feed(c, "AB\x1b[D\x1b[200~\xE4\xB8\xAD\n\xF0\x9F\x98\x80\x1b[201~\x1b[D");
    LINE_IS(c, "A\xE4\xB8\xAD\n\xF0\x9F\x98\x80" "B", 5);
    /* Ctrl-C still gets out of a paste whose end never comes. */
    CHECK(feed(c, "\x1b[200~stuck\x03") == LINE_EV_INTERRUPT, "Ctrl-C in a paste");
    feed(c, "\r");
    LINE_IS(c, "", 0);
    line_core_destroy(c);
}

static void test_unknown_escapes_swallowed(void) {
    LineCore *c = core_with(NULL);
    const char *junk[] = {
        "\x1b[99~", "\x1b[1;2P", "\x1b[?25h", "\x1b[<0;10;5M", "\x1b]0;title\x07", "\x1b]8;;http://x\x1b\\",
        "\x1bP1$r0m\x1b\\", "\x1b(B", "\x1bx", "\x1bOZ", "\x1b[2~", "\x1b[5~", "\x1b[6~", "\x1b[Z",
        "\x1b\xC3\xA9", "\x1b\xF0\x9F\x98\x80", "\x1b[1;2;3;4;5;6;7;8;9;10;11;12;13C", "\x1b[200;5~",
        "\x1b\x1b[A",
    };
    feed(c, "ok");
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
        LineEvent ev = feed(c, junk[i]);
        CHECK(ev == LINE_EV_NONE, "junk %zu gave event %d", i, ev);
        CHECK(!line_core_escape_pending(c), "junk %zu left an escape open", i);
        LINE_IS(c, "ok", 2);
    }
    /* A lone Esc: the next key is taken as Alt+key unless the input went
     * quiet first (the terminal loop calls line_core_timeout). */
    feed(c, "\x1b");
    CHECK(line_core_escape_pending(c), "pending");
    CHECK(line_core_timeout(c) == 1, "timeout dropped it");
    feed(c, "!");
    LINE_IS(c, "ok!", 3);
    CHECK(line_core_timeout(c) == 0, "nothing pending");
    /* A control key inside a broken sequence still acts. */
    CHECK(feed(c, "\x1b[12\x03") == LINE_EV_INTERRUPT, "Ctrl-C inside CSI");
    feed(c, "z\x1b[");
    CHECK(feed(c, "\r") == LINE_EV_SUBMIT, "Enter inside CSI");
    LINE_IS(c, "z", 1);
    line_core_destroy(c);
}

static void test_ctrl_c_and_ctrl_d(void) {
    LineCore *c = core_with(NULL);
    CHECK(feed(c, "\x04") == LINE_EV_EOF, "Ctrl-D on an empty line");
    feed(c, "abc\x1b[D\x1b[D");
    CHECK(feed(c, "\x04") == LINE_EV_NONE, "Ctrl-D deletes");
    LINE_IS(c, "ac", 1);
    feed(c, "\x04\x04");                             /* at the end: nothing more to delete */
    LINE_IS(c, "a", 1);
    CHECK(feed(c, "\x03") == LINE_EV_INTERRUPT, "Ctrl-C");
    LINE_IS(c, "", 0);
    CHECK(!line_core_continued(c), "continuation dropped");
    feed(c, "q\\\r");
    CHECK(feed(c, "\x03") == LINE_EV_INTERRUPT, "Ctrl-C in a continuation");
    CHECK(!line_core_continued(c), "continuation dropped");
    CHECK(feed(c, "\x0c") == LINE_EV_CLEAR, "Ctrl-L");
    CHECK(feed(c, "\x1a") == LINE_EV_SUSPEND, "Ctrl-Z");
    feed_n(c, "\x00\x12\x14\x1f", 4);                     /* other controls: ignored */
    LINE_IS(c, "", 0);
    line_core_destroy(c);
}

static void test_invalid_utf8_kept(void) {
    LineCore *c = core_with(NULL);
    /* FF, overlong C0 80, truncated E4 B8 then 'a', a lone continuation,
     * an encoded surrogate, a code point above U+10FFFF. */
    const char in[] = "\xFF\xC0\x80\xE4\xB8" "a\x80\xED\xA0\x80\xF4\x90\x80\x80" "b";
    feed_n(c, in, sizeof in - 1);
    CHECK(line_is_n(c, in, sizeof in - 1, sizeof in - 1), "bytes kept as typed");
    /* Each invalid byte is one step of the cursor. */
    size_t steps = 0, len;
    const char *s = line_core_line(c, &len);
    while (line_core_cursor(c) > 0 && steps < 100) {
        feed(c, "\x1b[D");
        steps++;
        CHECK(is_boundary(s, len, line_core_cursor(c)), "cursor %zu inside a unit", line_core_cursor(c));
    }
    CHECK(steps == 15, "%zu steps back over 15 units", steps);
    CHECK(feed(c, "\x1b[F\x7f\x7f\x7f") == LINE_EV_NONE, "backspace");
    CHECK(line_is_n(c, in, sizeof in - 4, sizeof in - 4), "three units removed");
    /* Completing a sequence around an invalid byte moves the cursor past
     * the new character instead of leaving it inside. */
    line_core_reset(c);
    feed(c, "\xAD\x1b[H");                           /* a lone continuation byte, cursor before it */
    feed(c, "\xE4\xB8" "\x1b[H");                    /* E4 B8 flushed by Esc: now E4 B8 AD = 中 */
    s = line_core_line(c, &len);
    CHECK(len == 3 && is_boundary(s, len, line_core_cursor(c)), "cursor %zu len %zu", line_core_cursor(c), len);
    feed(c, "\x1b[C");
    CHECK(line_core_cursor(c) == 3, "中 is one unit now: cursor %zu", line_core_cursor(c));
    /* The unit decoder itself. */
    long cp;
    CHECK(line_utf8_unit("\xF0\x9F\x98\x80", 4, 0, &cp) == 4 && cp == 0x1F600, "emoji");
    CHECK(line_utf8_unit("\xF4\x8F\xBF\xBF", 4, 0, &cp) == 4 && cp == 0x10FFFF, "max");
    CHECK(line_utf8_unit("\xE0\x80\x80", 3, 0, &cp) == 1 && cp == -1, "overlong 3");
    CHECK(line_utf8_unit("\xF0\x80\x80\x80", 4, 0, &cp) == 1 && cp == -1, "overlong 4");
    CHECK(line_utf8_unit("\xED\xA0\x80", 3, 0, &cp) == 1 && cp == -1, "surrogate");
    CHECK(line_utf8_unit("\xE4\xB8", 2, 0, &cp) == 1 && cp == -1, "truncated at the end");
    CHECK(line_utf8_unit("\xC2\x80", 2, 0, &cp) == 2 && cp == 0x80, "C1 is valid UTF-8");
    line_core_destroy(c);
}

/* Random bytes, biased toward the interesting ones: the core must keep its
 * cursor in range and on a unit boundary, whatever comes. */
static void test_core_random_bytes(void) {
    LineHistory h;
    line_history_init(&h, 4);
    line_history_add(&h, "old \xE4\xB8\xAD entry");
    line_history_add(&h, "multi\nline");
    LineCore *c = core_with(&h);
    static const unsigned char pick[] = {0x1b, '[', 'O', '~', '2', '0', '1', ';', '5', 'A', 'B', 'C', 'D', 'H', 'F',
                                         '3', 'a', ' ', '\\', '\r', '\n', 0x7f, 0x01, 0x05, 0x0b, 0x15, 0x17, 0x19,
                                         0x04, 0x10, 0x0e, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x80, 0xC3, 0xFF, 0x07};
    uint64_t x = 0x243F6A8885A308D3ull;
    int n = getenv("CLLM_QUICK") ? 20000 : 200000, bad = 0;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        unsigned char b = (x >> 8) % 4 ? pick[(x >> 16) % sizeof pick] : (unsigned char)(x >> 24);
        LineEvent ev = line_core_feed(c, b);
        if (ev == LINE_EV_SUBMIT || ev == LINE_EV_EOF) {
            char *t = line_core_take_text(c);
            if (!t) bad++;
            free(t);
            line_core_reset(c);
        }
        size_t len, cur = line_core_cursor(c);
        const char *s = line_core_line(c, &len);
        if (cur > len || !is_boundary(s, len, cur)) bad++;
        if (len > 4096) line_core_reset(c);
    }
    CHECK(bad == 0, "%d bad states", bad);
    line_core_destroy(c);
    line_history_free(&h);
}

/* ------------------------------------------------------------ widths */

/* The C library's wcwidth in a UTF-8 locale is the reference: every code
 * point it calls wide must be 2 here and the reverse; every one we call 0
 * must be 0 there (we know fewer zero-width marks than it does). */
static void test_widths_match_wcwidth(void) {
    const char *loc = setlocale(LC_CTYPE, "C.UTF-8");
    if (!loc) loc = setlocale(LC_CTYPE, "en_US.UTF-8");
    CHECK(loc != NULL, "no UTF-8 locale for the wcwidth reference");
    if (!loc) return;
    long wide_bad = 0, zero_bad = 0, first = -1;
    for (long cp = 0x20; cp < 0x40000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        int ref = wcwidth((wchar_t)cp), ours = line_cp_width(cp);
        if (ref < 0) continue; /* unassigned or control: no reference */
        if ((ref == 2) != (ours == 2)) { wide_bad++; if (first < 0) first = cp; }
        if (ours == 0 && ref != 0) { zero_bad++; if (first < 0) first = cp; }
    }
    CHECK(wide_bad == 0 && zero_bad == 0, "%ld wide and %ld zero-width mismatches, first U+%04lX", wide_bad,
          zero_bad, first);
    CHECK(line_cp_width(0x4E2D) == 2 && line_cp_width(0x1F600) == 2 && line_cp_width('a') == 1 &&
          line_cp_width(0x301) == 0, "spot checks");
    setlocale(LC_CTYPE, "C");
}

/* ----------------------------------------------------------- history file */

int main(void) {
    RUN(test_insert_in_multibyte_text);
    RUN(test_cursor_keys);
    RUN(test_backspace_wide_chars);
    RUN(test_kill_keys);
    RUN(test_history_browse);
    RUN(test_backslash_continuation);
    RUN(test_bracketed_paste);
    RUN(test_unknown_escapes_swallowed);
    RUN(test_ctrl_c_and_ctrl_d);
    RUN(test_invalid_utf8_kept);
    RUN(test_core_random_bytes);
    RUN(test_widths_match_wcwidth);
    TEST_EXIT();
}
