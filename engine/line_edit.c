/* line_edit.c — the chat prompt's line editor (see line_edit.h).
 *
 * The editing core (line_editor_feed) turns input bytes into edits of a
 * LineBuffer and events; the terminal part puts the terminal in raw mode,
 * feeds it, and redraws the line (one row, scrolled horizontally when longer
 * than the terminal). Raw mode is restored on every return. */
#include "engine/line_edit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

struct LineEditor {
    int in_fd, out_fd;
    bool tty;
    char *history_path;
    char **history;
    int n_history, max_history, hist_pos;   /* hist_pos: entry being shown (n_history = the new line) */
    char *saved_line;                       /* the line being edited while browsing history */
    bool in_paste;
    unsigned char inbuf[4096];              /* unread input (pipe mode and escape parsing) */
    size_t in_len, in_pos;
};

static int lb_insert(LineBuffer *lb, const char *s, size_t n) {
    if (lb->len + n + 1 > lb->cap) {
        size_t cap = lb->cap ? lb->cap : 128;
        while (cap < lb->len + n + 1) cap *= 2;
        char *b = realloc(lb->buf, cap);
        if (!b) return -1;
        lb->buf = b;
        lb->cap = cap;
    }
    memmove(lb->buf + lb->cursor + n, lb->buf + lb->cursor, lb->len - lb->cursor);
    memcpy(lb->buf + lb->cursor, s, n);
    lb->len += n;
    lb->cursor += n;
    lb->buf[lb->len] = 0;
    return 0;
}

static void lb_delete(LineBuffer *lb, size_t from, size_t to) {
    memmove(lb->buf + from, lb->buf + to, lb->len - to);
    lb->len -= to - from;
    if (lb->cursor > to) lb->cursor -= to - from;
    else if (lb->cursor > from) lb->cursor = from;
    if (lb->buf) lb->buf[lb->len] = 0;
}

static size_t utf8_prev(const LineBuffer *lb, size_t i) {
    if (i == 0) return 0;
    i--;
    while (i > 0 && ((unsigned char)lb->buf[i] & 0xC0) == 0x80) i--;
    return i;
}

static size_t utf8_next(const LineBuffer *lb, size_t i) {
    if (i >= lb->len) return lb->len;
    i++;
    while (i < lb->len && ((unsigned char)lb->buf[i] & 0xC0) == 0x80) i++;
    return i;
}

static void lb_set(LineBuffer *lb, const char *s) {
    lb->len = lb->cursor = 0;
    lb_insert(lb, s, strlen(s));
}

static void history_show(LineEditor *le, LineBuffer *lb, int pos) {
    if (pos < 0 || pos > le->n_history || pos == le->hist_pos) return;
    if (le->hist_pos == le->n_history) {
        free(le->saved_line);
        le->saved_line = strdup(lb->buf ? lb->buf : "");
    }
    le->hist_pos = pos;
    lb_set(lb, pos == le->n_history ? (le->saved_line ? le->saved_line : "") : le->history[pos]);
}

/* Length of a complete escape sequence at b (n bytes), 0 if incomplete. */
static size_t escape_len(const unsigned char *b, size_t n) {
    if (n < 2) return 0;
    if (b[1] != '[' && b[1] != 'O') return 2;
    for (size_t i = 2; i < n; i++)
        if (b[i] >= 0x40 && b[i] <= 0x7E) return i + 1;
    return n > 32 ? n : 0; /* overlong junk is swallowed whole */
}

static void handle_escape(LineEditor *le, LineBuffer *lb, const unsigned char *e, size_t n) {
    char seq[40] = {0};
    memcpy(seq, e + 1, n - 1 < sizeof seq - 1 ? n - 1 : sizeof seq - 1);
    if (!strcmp(seq, "[D") || !strcmp(seq, "OD")) lb->cursor = utf8_prev(lb, lb->cursor);
    else if (!strcmp(seq, "[C") || !strcmp(seq, "OC")) lb->cursor = utf8_next(lb, lb->cursor);
    else if (!strcmp(seq, "[H") || !strcmp(seq, "OH") || !strcmp(seq, "[1~")) lb->cursor = 0;
    else if (!strcmp(seq, "[F") || !strcmp(seq, "OF") || !strcmp(seq, "[4~")) lb->cursor = lb->len;
    else if (!strcmp(seq, "[3~")) lb_delete(lb, lb->cursor, utf8_next(lb, lb->cursor));
    else if (!strcmp(seq, "[A")) history_show(le, lb, le->hist_pos - 1);
    else if (!strcmp(seq, "[B")) history_show(le, lb, le->hist_pos + 1);
    else if (!strcmp(seq, "[200~")) le->in_paste = true;
    else if (!strcmp(seq, "[201~")) le->in_paste = false;
    /* anything else: swallowed */
}

EditEvent line_editor_feed(LineEditor *le, LineBuffer *lb, const unsigned char *b, size_t n, size_t *used) {
    size_t i = 0;
    EditEvent ev = EDIT_CONTINUE;
    while (i < n && ev == EDIT_CONTINUE) {
        unsigned char c = b[i];
        if (c == 27) {
            size_t el = escape_len(b + i, n - i);
            if (el == 0) break; /* wait for the rest */
            handle_escape(le, lb, b + i, el);
            i += el;
            continue;
        }
        i++;
        if (le->in_paste) { /* pasted text, newlines included, is inserted as is */
            char ch = c == '\r' ? '\n' : (char)c;
            lb_insert(lb, &ch, 1);
            continue;
        }
        switch (c) {
        case '\r': case '\n': ev = EDIT_SUBMIT; break;
        case 3: ev = EDIT_INTERRUPT; break;                                     /* Ctrl-C */
        case 4: if (lb->len == 0) ev = EDIT_EOF;                                 /* Ctrl-D */
                else lb_delete(lb, lb->cursor, utf8_next(lb, lb->cursor));
                break;
        case 1: lb->cursor = 0; break;                                          /* Ctrl-A */
        case 5: lb->cursor = lb->len; break;                                    /* Ctrl-E */
        case 2: lb->cursor = utf8_prev(lb, lb->cursor); break;                  /* Ctrl-B */
        case 6: lb->cursor = utf8_next(lb, lb->cursor); break;                  /* Ctrl-F */
        case 21: lb_delete(lb, 0, lb->cursor); break;                           /* Ctrl-U */
        case 11: lb_delete(lb, lb->cursor, lb->len); break;                     /* Ctrl-K */
        case 23: {                                                              /* Ctrl-W */
            size_t s = lb->cursor;
            while (s > 0 && lb->buf[s - 1] == ' ') s--;
            while (s > 0 && lb->buf[s - 1] != ' ') s--;
            lb_delete(lb, s, lb->cursor);
            break;
        }
        case 8: case 127: lb_delete(lb, utf8_prev(lb, lb->cursor), lb->cursor); break; /* Backspace */
        case 16: history_show(le, lb, le->hist_pos - 1); break;                 /* Ctrl-P */
        case 14: history_show(le, lb, le->hist_pos + 1); break;                 /* Ctrl-N */
        default:
            if (c >= 32 || c == '\t') lb_insert(lb, (const char *)&c, 1);
            break;
        }
    }
    *used = i;
    return ev;
}

/* ---------- terminal ---------- */

static int term_width(int fd) {
    struct winsize ws;
    return ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
}

static int display_width(const char *s, size_t n) { /* characters; wide CJK counted twice */
    int w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c & 0xC0) == 0x80) continue;
        w += c >= 0xE3 && c <= 0xED ? 2 : c >= 0xF0 ? 2 : 1;
    }
    return w;
}

static void write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* Redraws prompt + line; scrolls so the cursor stays visible. */
static void redraw(LineEditor *le, const char *prompt, const LineBuffer *lb) {
    int cols = term_width(le->out_fd), pw = display_width(prompt, strlen(prompt));
    size_t start = 0;
    while (pw + display_width(lb->buf + start, lb->cursor - start) >= cols - 1 && start < lb->cursor) start++;
    while (start < lb->len && ((unsigned char)lb->buf[start] & 0xC0) == 0x80) start++;
    size_t end = start;
    while (end < lb->len && pw + display_width(lb->buf + start, end - start) < cols - 1) end++;
    while (end < lb->len && ((unsigned char)lb->buf[end] & 0xC0) == 0x80) end++;
    char tail[64];
    write_all(le->out_fd, "\r\x1b[K", 4);
    write_all(le->out_fd, prompt, strlen(prompt));
    for (size_t i = start; i < end; i++) write_all(le->out_fd, lb->buf[i] == '\n' ? " " : lb->buf + i, 1);
    int back = display_width(lb->buf + lb->cursor, end > lb->cursor ? end - lb->cursor : 0);
    if (back > 0) write_all(le->out_fd, tail, (size_t)snprintf(tail, sizeof tail, "\x1b[%dD", back));
}

static LineResult read_tty(LineEditor *le, const char *prompt, LineBuffer *lb, Err *err) {
    struct termios old, raw;
    if (tcgetattr(le->in_fd, &old) != 0) return err_set(err, "terminal: %s", strerror(errno)), LINE_ERROR;
    raw = old;
    raw.c_iflag &= ~(unsigned)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_lflag &= ~(unsigned)(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(le->in_fd, TCSAFLUSH, &raw);
    write_all(le->out_fd, "\x1b[?2004h", 8); /* bracketed paste on */
    le->hist_pos = le->n_history;
    redraw(le, prompt, lb);
    LineResult r = LINE_OK;
    for (;;) {
        if (le->in_pos == le->in_len) le->in_pos = le->in_len = 0;
        ssize_t n = read(le->in_fd, le->inbuf + le->in_len, sizeof le->inbuf - le->in_len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { r = lb->len ? LINE_OK : LINE_EOF; break; }
        le->in_len += (size_t)n;
        size_t used;
        EditEvent ev = line_editor_feed(le, lb, le->inbuf + le->in_pos, le->in_len - le->in_pos, &used);
        le->in_pos += used;
        if (le->in_pos < le->in_len && le->in_pos > 0) { /* keep an incomplete escape at the front */
            memmove(le->inbuf, le->inbuf + le->in_pos, le->in_len - le->in_pos);
            le->in_len -= le->in_pos;
            le->in_pos = 0;
        }
        if (ev == EDIT_SUBMIT) break;
        if (ev == EDIT_EOF) { r = LINE_EOF; break; }
        if (ev == EDIT_INTERRUPT) { r = LINE_INTERRUPT; break; }
        redraw(le, prompt, lb);
    }
    write_all(le->out_fd, "\x1b[?2004l\r\n", 10);
    tcsetattr(le->in_fd, TCSAFLUSH, &old);
    return r;
}

/* One input line from a pipe or file (no editing). */
static LineResult read_pipe(LineEditor *le, LineBuffer *lb, Err *err) {
    for (;;) {
        while (le->in_pos < le->in_len) {
            unsigned char c = le->inbuf[le->in_pos++];
            if (c == '\n') {
                if (lb->len && lb->buf[lb->len - 1] == '\r') lb_delete(lb, lb->len - 1, lb->len);
                return LINE_OK;
            }
            lb->cursor = lb->len;
            if (lb_insert(lb, (const char *)&c, 1)) return err_set(err, "out of memory"), LINE_ERROR;
        }
        ssize_t n = read(le->in_fd, le->inbuf, sizeof le->inbuf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return err_set(err, "reading input: %s", strerror(errno)), LINE_ERROR;
        if (n == 0) return lb->len ? LINE_OK : LINE_EOF;
        le->in_len = (size_t)n;
        le->in_pos = 0;
    }
}

LineResult line_editor_read(LineEditor *le, const char *prompt, const char *cont, char **out, Err *err) {
    LineBuffer lb = {0};
    LineResult r;
    for (const char *p = prompt;; p = cont) {
        size_t before = lb.len;
        lb.cursor = lb.len;
        r = le->tty ? read_tty(le, p, &lb, err) : read_pipe(le, &lb, err);
        if (r != LINE_OK) break;
        if (lb.len > before && lb.buf[lb.len - 1] == '\\') { /* continues on the next line */
            lb.buf[lb.len - 1] = '\n';
            continue;
        }
        break;
    }
    if (r == LINE_EOF && lb.len > 0) r = LINE_OK;
    if (r != LINE_OK) { free(lb.buf); return r; }
    *out = lb.buf ? lb.buf : strdup("");
    return *out ? LINE_OK : LINE_ERROR;
}

void line_editor_add_history(LineEditor *le, const char *line) {
    if (!line[0] || (le->n_history > 0 && !strcmp(le->history[le->n_history - 1], line))) return;
    char *copy = strdup(line);
    if (!copy) return;
    if (le->n_history == le->max_history) {
        free(le->history[0]);
        memmove(le->history, le->history + 1, (le->n_history - 1) * sizeof *le->history);
        le->n_history--;
    }
    le->history[le->n_history++] = copy;
}

/* History file: one entry per line, newlines and backslashes escaped. */
static void history_load(LineEditor *le) {
    FILE *f = le->history_path ? fopen(le->history_path, "r") : NULL;
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n"), w = 0;
        for (size_t i = 0; i < n; i++) {
            if (line[i] == '\\' && i + 1 < n) { line[w++] = line[i + 1] == 'n' ? '\n' : line[i + 1]; i++; }
            else line[w++] = line[i];
        }
        line[w] = 0;
        line_editor_add_history(le, line);
    }
    if (f) fclose(f);
}

static void history_save(const LineEditor *le) {
    FILE *f = le->history_path ? fopen(le->history_path, "w") : NULL;
    for (int i = 0; f && i < le->n_history; i++) {
        for (const char *s = le->history[i]; *s; s++) {
            if (*s == '\n') fputs("\\n", f);
            else if (*s == '\\') fputs("\\\\", f);
            else fputc(*s, f);
        }
        fputc('\n', f);
    }
    if (f) fclose(f);
}

LineEditor *line_editor_create(int in_fd, int out_fd, const char *history_path, int history_max, Err *err) {
    LineEditor *le = calloc(1, sizeof *le);
    if (!le) { err_set(err, "out of memory"); return NULL; }
    le->in_fd = in_fd;
    le->out_fd = out_fd;
    le->tty = isatty(in_fd) && isatty(out_fd);
    le->max_history = history_max > 0 ? history_max : 1;
    le->history = calloc(le->max_history, sizeof *le->history);
    le->history_path = history_path ? strdup(history_path) : NULL;
    if (!le->history) { free(le); err_set(err, "out of memory"); return NULL; }
    history_load(le);
    le->hist_pos = le->n_history;
    return le;
}

void line_editor_destroy(LineEditor *le) {
    if (!le) return;
    history_save(le);
    for (int i = 0; i < le->n_history; i++) free(le->history[i]);
    free(le->history);
    free(le->history_path);
    free(le->saved_line);
    free(le);
}
