/* line_edit.c — the prompt of `cllm chat`, its terminal side (see
 * line_edit.h for the layers; the state machine is line_core.c, the history
 * line_history.c).
 *
 * Order of this file: the renderer; the terminal loop; the plain
 * (non-terminal) reader; the public LineEditor calls.
 *
 * Rendering is "multi-row wrapping": the prompt and the text are laid out in
 * rows of the terminal width, every row break is written as an explicit
 * "\r\n" (so the terminal's own auto-wrap never decides anything), and a
 * redraw moves up to the first row, clears to the end of the screen and
 * writes everything again in one write(). When the text needs more rows
 * than the screen has, only a window of rows around the cursor is drawn, so
 * cursor-up never runs into the top of the screen.
 */
#include "app/line_edit.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "app/line_bytes.h"

#define ESC_TIMEOUT_MS 500                /* quiet time that ends a lone Esc */

/* ----------------------------------------------------------- rendering */

/* Lays text out in rows of `width` columns. Rows are numbered from the
 * prompt's first row; only rows in [top, bottom) are written to out. */
typedef struct {
    Bytes *out;
    int width, top, bottom;
    int row, col;
    int last_row;   /* the row the terminal cursor is on after the output */
    int wrapped;    /* the last row break was an automatic wrap */
    int failed;     /* out of memory */
} Layout;

static int layout_visible(const Layout *L) { return L->row >= L->top && L->row < L->bottom; }

static void layout_emit(Layout *L, const char *s, size_t n) {
    if (!layout_visible(L)) return;
    if (bytes_add(L->out, s, n)) L->failed = 1;
    L->last_row = L->row;
}

static void layout_break(Layout *L, int wrap) {
    if (L->row + 1 >= L->top && L->row + 1 < L->bottom && L->row >= L->top) layout_emit(L, "\r\n", 2);
    L->row++;
    L->col = 0;
    L->wrapped = wrap;
    if (layout_visible(L)) L->last_row = L->row;
}

/* Wraps first when a glyph of w columns does not fit the row. */
static void layout_fit(Layout *L, int w) {
    if (L->col > 0 && L->col + w > L->width) layout_break(L, 1);
}

static void layout_glyph(Layout *L, const char *s, size_t n, int w) {
    layout_emit(L, s, n);
    L->col += w;
    L->wrapped = 0;
    if (L->col >= L->width) layout_break(L, 1);
}

/* How a unit is shown: controls as ^X, invalid bytes and C1 controls as
 * U+FFFD, never raw, so text from anywhere cannot drive the terminal. */
static int unit_glyph(const char *s, int n, long cp, char *g, int *w) {
    if (cp < 0 || (cp >= 0x80 && cp < 0xA0)) { memcpy(g, "\xEF\xBF\xBD", 3); *w = 1; return 3; }
    if (cp < 0x20 || cp == 0x7f) { g[0] = '^'; g[1] = (char)(cp ^ 0x40); *w = 2; return 2; }
    memcpy(g, s, (size_t)n);
    *w = line_cp_width(cp);
    return n;
}

/* Lays out s[0, len); returns the position of byte offset `mark` (or of
 * the end when mark == len) in *mrow and *mcol. In a prompt, escape sequences
 * (colours) are copied and take no room. After a '\n' of the text the
 * continuation prompt starts the next row. */
static void layout_text(Layout *L, const char *s, size_t len, size_t mark, int *mrow, int *mcol, int is_prompt,
                        const char *cont) {
    for (size_t i = 0; i < len;) {
        long cp;
        int n = line_utf8_unit(s, len, i, &cp), w;
        if (is_prompt && cp == 0x1b) {
            size_t j = i + 1;
            if (j < len && s[j] == '[') for (j++; j < len && !(s[j] >= 0x40 && s[j] <= 0x7E); j++) {}
            j = j < len ? j + 1 : len;
            layout_emit(L, s + i, j - i);
            i = j;
            continue;
        }
        if (cp == '\n' || cp == '\t') {
            if (i == mark) { *mrow = L->row; *mcol = L->col; }
            if (cp == '\n') {
                layout_break(L, 0);
                layout_text(L, cont, strlen(cont), (size_t)-1, NULL, NULL, 1, "");
            } else {
                int k = 8 - L->col % 8; /* to the next tab stop, not past the row's end */
                if (k > L->width - L->col) k = L->width - L->col;
                while (k-- > 0) layout_glyph(L, " ", 1, 1);
            }
            i++;
            continue;
        }
        char g[8];
        int gn = unit_glyph(s + i, n, cp, g, &w);
        layout_fit(L, w);
        if (i == mark) { *mrow = L->row; *mcol = L->col; }
        layout_glyph(L, g, (size_t)gn, w);
        i += (size_t)n;
    }
    if (mark == len && mrow) { *mrow = L->row; *mcol = L->col; }
}

/* ------------------------------------------------------- the terminal */

struct LineEditor {
    int in_fd, out_fd;
    int edit;          /* raw-mode editing (input and output are terminals) */
    int show_prompt;   /* plain mode on a terminal: print the prompt */
    char *history_path;
    LineHistory hist;
    LineCore *core;
    unsigned char in[4096]; /* read-ahead, kept across calls */
    size_t in_pos, in_len;
    struct termios saved;   /* the mode to restore */
    int raw;
    const char *prompt, *cont; /* the prompt of the row being edited; continuation */
    int cursor_row;    /* screen rows from the first drawn row to the cursor */
    int last_row;      /* ... to the last drawn row */
    int end_fresh;     /* the text ended exactly at the right edge: a new row is open */
    int top;           /* first layout row drawn (text taller than the screen) */
    Bytes out;         /* output being assembled */
    size_t nul_bytes;  /* NUL bytes dropped from the last turn (plain input) */
};

static int fd_write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int editor_flush(LineEditor *le, Err *err) {
    int rc = fd_write_all(le->out_fd, le->out.p, le->out.len);
    le->out.len = 0;
    if (rc) return err_set(err, "line editor: writing to the terminal (fd %d) failed: %s", le->out_fd, strerror(errno));
    return 0;
}

static int editor_send(LineEditor *le, const char *s, Err *err) {
    if (bytes_adds(&le->out, s)) return err_set(err, "line editor: out of memory");
    return editor_flush(le, err);
}

static void term_size(const LineEditor *le, int *cols, int *rows) {
    struct winsize ws = {0};
    if (ioctl(le->out_fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) {
        if (ioctl(le->in_fd, TIOCGWINSZ, &ws) != 0) ws = (struct winsize){0};
    }
    *cols = ws.ws_col ? ws.ws_col : 80;
    *rows = ws.ws_row ? ws.ws_row : 24;
}

static void add_move(Bytes *o, int n, char dir) {
    char s[24];
    if (n <= 0) return;
    snprintf(s, sizeof s, "\x1b[%d%c", n, dir);
    bytes_adds(o, s);
}

/* Redraws the prompt and text with the cursor at byte `cursor`. */
static int editor_draw(LineEditor *le, const char *text, size_t len, size_t cursor, Err *err) {
    int cols, rows;
    term_size(le, &cols, &rows);
    /* Pass 1 measures: how many rows, and where the cursor lands. */
    Layout M = {.out = NULL, .width = cols, .top = 0, .bottom = 0}; /* nothing visible: no output */
    int crow = 0, ccol = 0;
    layout_text(&M, le->prompt, strlen(le->prompt), (size_t)-1, NULL, NULL, 1, "");
    layout_text(&M, text, len, cursor, &crow, &ccol, 0, le->cont);
    int total = M.row + 1;
    if (total <= rows) le->top = 0;
    else if (crow < le->top) le->top = crow;
    else if (crow >= le->top + rows) le->top = crow - rows + 1;
    if (le->top > total - rows) le->top = total > rows ? total - rows : 0;
    /* Pass 2 writes the visible rows. */
    Bytes *o = &le->out;
    o->len = 0;
    bytes_adds(o, "\x1b[?25l");
    add_move(o, le->cursor_row, 'A');
    bytes_adds(o, "\r\x1b[J");
    Layout L = {.out = o, .width = cols, .top = le->top, .bottom = le->top + rows, .last_row = le->top};
    layout_text(&L, le->prompt, strlen(le->prompt), (size_t)-1, NULL, NULL, 1, "");
    layout_text(&L, text, len, cursor, &crow, &ccol, 0, le->cont);
    int last = L.last_row - le->top, cur = crow - le->top;
    add_move(o, last - cur, 'A');
    bytes_adds(o, "\r");
    add_move(o, ccol, 'C');
    bytes_adds(o, "\x1b[?25h");
    le->cursor_row = cur;
    le->last_row = last;
    le->end_fresh = L.wrapped && L.col == 0 && L.row == L.last_row;
    if (L.failed || !o->p) return err_set(err, "line editor: out of memory");
    return editor_flush(le, err);
}

static int editor_draw_core(LineEditor *le, Err *err) {
    size_t len;
    const char *s = line_core_line(le->core, &len);
    return editor_draw(le, s, len, line_core_cursor(le->core), err);
}

/* Leaves the drawn rows: cursor below the last one, mark (e.g. "^C") first. */
static int editor_end_rows(LineEditor *le, const char *mark, Err *err) {
    add_move(&le->out, le->last_row - le->cursor_row, 'B');
    bytes_adds(&le->out, mark);
    bytes_adds(&le->out, le->end_fresh && !mark[0] ? "\r" : "\r\n");
    le->cursor_row = le->last_row = le->end_fresh = le->top = 0;
    return editor_flush(le, err);
}

/* Shows the line just continued as it was typed (with its backslash), then
 * opens a row with the continuation prompt. */
static int editor_continue(LineEditor *le, Err *err) {
    size_t len;
    const char *s = line_core_last_continued(le->core, &len);
    Bytes typed = {0};
    if (bytes_add(&typed, s, len) || bytes_add(&typed, "\\", 1)) { bytes_free(&typed); return err_set(err, "line editor: out of memory"); }
    int rc = editor_draw(le, typed.p, typed.len, typed.len, err);
    bytes_free(&typed);
    if (rc || editor_end_rows(le, "", err)) return -1;
    le->prompt = le->cont;
    return editor_draw_core(le, err);
}

static int editor_raw_on(LineEditor *le, Err *err) {
    if (tcgetattr(le->in_fd, &le->saved) != 0)
        return err_set(err, "line editor: terminal settings of fd %d: %s", le->in_fd, strerror(errno));
    struct termios raw = le->saved;
    raw.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INLCR | IGNCR | INPCK | ISTRIP | IXON);
    raw.c_oflag &= ~(tcflag_t)OPOST;
    raw.c_cflag |= CS8;
    raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    int rc;
    while ((rc = tcsetattr(le->in_fd, TCSADRAIN, &raw)) != 0 && errno == EINTR) {}
    if (rc) return err_set(err, "line editor: cannot set raw mode on fd %d: %s", le->in_fd, strerror(errno));
    le->raw = 1;
    return 0;
}

static void editor_raw_off(LineEditor *le) {
    if (!le->raw) return;
    while (tcsetattr(le->in_fd, TCSADRAIN, &le->saved) != 0 && errno == EINTR) {}
    le->raw = 0;
}

/* Ctrl-Z: give the terminal back, stop, and take it again on SIGCONT. */
static int editor_suspend(LineEditor *le, Err *err) {
    if (editor_end_rows(le, "", err) || editor_send(le, "\x1b[?2004l", err)) return -1;
    editor_raw_off(le);
    kill(getpid(), SIGTSTP);
    if (editor_raw_on(le, err) || editor_send(le, "\x1b[?2004h", err)) return -1;
    return editor_draw_core(le, err);
}

/* Refills the read-ahead. Returns bytes read, 0 at end of input (EIO: the
 * terminal went away), -1 on error (errno), -2 after timeout_ms of quiet. */
static ssize_t editor_fill(LineEditor *le, int timeout_ms) {
    if (timeout_ms >= 0) {
        struct pollfd p = {.fd = le->in_fd, .events = POLLIN};
        int k = poll(&p, 1, timeout_ms);
        if (k == 0) return -2;
        if (k < 0) return -1;
    }
    ssize_t n;
    while ((n = read(le->in_fd, le->in, sizeof le->in)) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        struct pollfd p = {.fd = le->in_fd, .events = POLLIN}; /* a non-blocking descriptor: wait */
        if (poll(&p, 1, -1) < 0) return -1;
    }
    if (n < 0 && errno == EIO) n = 0;
    le->in_pos = 0;
    le->in_len = n > 0 ? (size_t)n : 0;
    return n;
}

static int input_waiting(const LineEditor *le) {
    struct pollfd p = {.fd = le->in_fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* What the loop should do after an event: keep going (1) or return r. */
static int editor_event(LineEditor *le, LineEvent ev, LineResult *r, char **out, Err *err) {
    size_t len;
    switch (ev) {
    case LINE_EV_NONE: return 1;
    case LINE_EV_SUBMIT: {
        *out = line_core_take_text(le->core);
        if (!*out) { err_set(err, "line editor: out of memory"); break; }
        const char *line = line_core_line(le->core, &len); /* shown whole, cursor at the end */
        if (editor_draw(le, line, len, len, err) || editor_end_rows(le, "", err)) {
            free(*out);
            *out = NULL;
            break;
        }
        *r = LINE_OK;
        return 0;
    }
    case LINE_EV_EOF:
        *r = editor_draw_core(le, err) || editor_end_rows(le, "", err) ? LINE_ERROR : LINE_EOF;
        return 0;
    case LINE_EV_INTERRUPT:
        *r = editor_end_rows(le, "^C", err) ? LINE_ERROR : LINE_INTERRUPT;
        return 0;
    case LINE_EV_CONTINUE:
        if (editor_continue(le, err) == 0) return 1;
        break;
    case LINE_EV_CLEAR:
        le->cursor_row = 0;
        if (editor_send(le, "\x1b[H\x1b[2J", err) == 0) return 1;
        break;
    case LINE_EV_SUSPEND:
        if (editor_suspend(le, err) == 0) return 1;
        break;
    case LINE_EV_ERROR: err_set(err, "line editor: out of memory"); break;
    }
    *r = LINE_ERROR;
    return 0;
}

/* End of input on the terminal: a turn in progress is returned first. */
static LineResult editor_at_end(LineEditor *le, char **out, Err *err) {
    size_t len;
    line_core_line(le->core, &len);
    if (len == 0 && !line_core_continued(le->core)) {
        LineResult r;
        editor_event(le, LINE_EV_EOF, &r, out, err);
        return r;
    }
    LineResult r;
    editor_event(le, LINE_EV_SUBMIT, &r, out, err);
    return r;
}

static LineResult editor_loop(LineEditor *le, char **out, Err *err) {
    LineResult r = LINE_ERROR;
    int dirty = 1;
    for (;;) {
        if (le->in_pos == le->in_len) {
            /* Draw only once the input is drained: a paste redraws once. */
            if (dirty && !input_waiting(le)) {
                if (editor_draw_core(le, err)) return LINE_ERROR;
                dirty = 0;
            }
            ssize_t n = editor_fill(le, line_core_escape_pending(le->core) ? ESC_TIMEOUT_MS : -1);
            if (n == -2) { line_core_timeout(le->core); continue; }
            if (n == 0) return editor_at_end(le, out, err);
            if (n < 0 && errno == EINTR) {
                line_core_reset(le->core);
                editor_event(le, LINE_EV_INTERRUPT, &r, out, err);
                return r;
            }
            if (n < 0) { err_set(err, "line editor: reading fd %d failed: %s", le->in_fd, strerror(errno)); return LINE_ERROR; }
            continue;
        }
        size_t used;
        LineEvent ev = line_core_feed_bytes(le->core, le->in + le->in_pos, le->in_len - le->in_pos, &used);
        le->in_pos += used;
        dirty = 1;
        if (!editor_event(le, ev, &r, out, err)) return r;
    }
}

static LineResult editor_read_tty(LineEditor *le, const char *prompt, const char *cont, char **out, Err *err) {
    if (editor_raw_on(le, err)) return LINE_ERROR;
    line_core_reset(le->core);
    le->prompt = prompt;
    le->cont = cont;
    le->cursor_row = le->last_row = le->end_fresh = le->top = 0;
    LineResult r = LINE_ERROR;
    if (editor_send(le, "\x1b[?2004h", err) == 0) r = editor_loop(le, out, err);
    Err ignored;
    editor_send(le, "\x1b[?2004l", &ignored);
    editor_raw_off(le);
    return r;
}

/* ------------------------------------------------------- plain input */

/* One turn from a pipe, a file or a line-mode terminal: a line per turn,
 * CRLF or LF stripped, a trailing backslash joins the next line. */
static LineResult plain_read(LineEditor *le, const char *prompt, const char *cont, char **out, Err *err) {
    Bytes turn = {0};
    size_t line_start = 0;
    if (le->show_prompt) fd_write_all(le->out_fd, prompt, strlen(prompt)); /* a lost prompt is harmless */
    for (;;) {
        if (le->in_pos == le->in_len) {
            ssize_t n = editor_fill(le, -1);
            if (n < 0 && errno == EINTR) { bytes_free(&turn); return LINE_INTERRUPT; }
            if (n < 0) { bytes_free(&turn); err_set(err, "line editor: reading fd %d failed: %s", le->in_fd, strerror(errno)); return LINE_ERROR; }
            if (n == 0) {
                if (turn.len > line_start && turn.p[turn.len - 1] == '\r') turn.p[--turn.len] = 0;
                if (turn.len > line_start && turn.p[turn.len - 1] == '\\') turn.p[turn.len - 1] = '\n';
                if (turn.len == 0) { bytes_free(&turn); return LINE_EOF; }
                *out = turn.p;
                return LINE_OK;
            }
            continue;
        }
        const unsigned char *start = le->in + le->in_pos;
        size_t avail = le->in_len - le->in_pos;
        const unsigned char *nl = memchr(start, '\n', avail);
        size_t take = nl ? (size_t)(nl - start) : avail;
        le->in_pos += take + (nl ? 1 : 0);
        if (turn.len + take > LINE_MAX_BYTES) {
            bytes_free(&turn);
            err_set(err, "line editor: input turn on fd %d is longer than %u bytes", le->in_fd, LINE_MAX_BYTES);
            return LINE_ERROR;
        }
        if (bytes_reserve(&turn, take)) { bytes_free(&turn); err_set(err, "line editor: out of memory"); return LINE_ERROR; }
        for (size_t i = 0; i < take; i++) { /* NULs dropped (the turn is a C string), and counted */
            if (start[i]) turn.p[turn.len++] = (char)start[i];
            else le->nul_bytes++;
        }
        turn.p[turn.len] = 0;
        if (!nl) continue;
        if (turn.len > line_start && turn.p[turn.len - 1] == '\r') turn.p[--turn.len] = 0;
        if (turn.len > line_start && turn.p[turn.len - 1] == '\\') {
            turn.p[turn.len - 1] = '\n';
            line_start = turn.len;
            if (le->show_prompt) fd_write_all(le->out_fd, cont, strlen(cont));
            continue;
        }
        *out = turn.p ? turn.p : strdup("");
        if (!*out) { err_set(err, "line editor: out of memory"); return LINE_ERROR; }
        return LINE_OK;
    }
}

/* ------------------------------------------------------- the public API */

static int term_is_dumb(void) {
    const char *t = getenv("TERM");
    return t && !strcmp(t, "dumb");
}

LineEditor *line_editor_create(int in_fd, int out_fd, const char *history_path, int history_max, Err *err) {
    if (in_fd < 0 || fcntl(in_fd, F_GETFL) < 0) { err_set(err, "line editor: input fd %d is not open", in_fd); return NULL; }
    if (out_fd < 0 || fcntl(out_fd, F_GETFL) < 0) { err_set(err, "line editor: output fd %d is not open", out_fd); return NULL; }
    if (history_max < 0) { err_set(err, "line editor: history_max %d must be >= 0", history_max); return NULL; }
    LineEditor *le = calloc(1, sizeof *le);
    if (!le) { err_set(err, "line editor: out of memory"); return NULL; }
    le->in_fd = in_fd;
    le->out_fd = out_fd;
    le->show_prompt = isatty(in_fd);
    le->edit = le->show_prompt && isatty(out_fd) && !term_is_dumb();
    line_history_init(&le->hist, history_max);
    le->core = line_core_create(&le->hist);
    if (history_path) le->history_path = strdup(history_path);
    if (!le->core || (history_path && !le->history_path)) {
        line_editor_destroy(le);
        err_set(err, "line editor: out of memory");
        return NULL;
    }
    line_history_load(&le->hist, le->history_path);
    return le;
}

void line_editor_destroy(LineEditor *le) {
    if (!le) return;
    editor_raw_off(le);
    if (le->history_path && le->hist.max > 0) {
        Err ignored;
        line_history_save(&le->hist, le->history_path, &ignored);
    }
    line_history_free(&le->hist);
    line_core_destroy(le->core);
    bytes_free(&le->out);
    free(le->history_path);
    free(le);
}

LineResult line_editor_read(LineEditor *le, const char *prompt, const char *continuation_prompt, char **out,
                            Err *err) {
    *out = NULL;
    le->nul_bytes = 0;
    if (le->out_fd == fileno(stdout)) fflush(stdout); /* the caller's buffered text goes before the prompt */
    if (!prompt) prompt = "";
    if (!continuation_prompt) continuation_prompt = prompt;
    if (le->edit) return editor_read_tty(le, prompt, continuation_prompt, out, err);
    return plain_read(le, prompt, continuation_prompt, out, err);
}

void line_editor_add_history(LineEditor *le, const char *line) { line_history_add(&le->hist, line); }

size_t line_editor_nul_bytes(const LineEditor *le) { return le->nul_bytes; }

