/* test_line_edit.c — the chat prompt's line editor: the history file, the
 * plain reader through a pipe, and the terminal path through a
 * pseudo-terminal whose output is replayed on a small terminal emulator
 * (the editing core alone: test_line_core.c).
 */
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

static void make_temp_dir(char *dir, size_t n) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/cllm-line-edit-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp %s: %s", dir, strerror(errno)); dir[0] = 0; }
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *read_file_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *n = fread(buf, 1, (1 << 16) - 1, f);
    buf[*n] = 0;
    fclose(f);
    return buf;
}

/* Every byte offset where a code-point unit starts, by a forward scan. */
static void test_history_file_round_trip(void) {
    char dir[512], path[700];
    make_temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/missing/folder/history", dir); /* folders made on save */
    const char *entries[] = {"plain", "two\nlines", "back\\slash", "lit \\n not newline", "cr\r\nlf", "\\",
                             "\xE4\xB8\xAD\xF0\x9F\x98\x80 tab\there", "\n\n", "trailing\\"};
    size_t n = sizeof entries / sizeof *entries;
    LineHistory h;
    line_history_init(&h, 50);
    for (size_t i = 0; i < n; i++) line_history_add(&h, entries[i]);
    Err err = {{0}};
    CHECK(line_history_save(&h, path, &err) == 0, "save: %s", err.msg);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 077) == 0, "history file private");
    size_t sz;
    char *raw = read_file_all(path, &sz);
    size_t lines = 0;
    for (size_t i = 0; raw && i < sz; i++) lines += raw[i] == '\n';
    CHECK(lines == n, "one line per entry: %zu lines for %zu entries", lines, n);
    free(raw);
    LineHistory back;
    line_history_init(&back, 50);
    CHECK(line_history_load(&back, path) == (int)n, "loaded %d", back.n);
    for (size_t i = 0; i < n && (int)i < back.n; i++)
        CHECK(!strcmp(back.items[i], entries[i]), "entry %zu: %s", i, back.items[i]);
    /* A smaller history_max keeps the newest entries. */
    LineHistory few;
    line_history_init(&few, 3);
    line_history_load(&few, path);
    CHECK(few.n == 3 && !strcmp(few.items[0], entries[n - 3]) && !strcmp(few.items[2], entries[n - 1]),
          "newest 3 kept (n %d)", few.n);
    /* A huge history_max costs nothing more than the file holds. */
    LineHistory huge;
    line_history_init(&huge, INT_MAX);
    CHECK(line_history_load(&huge, path) == (int)n, "INT_MAX history_max loaded %d", huge.n);
    line_history_free(&huge);
    /* Through the editor: destroy saves, create loads. */
    snprintf(path, sizeof path, "%s/editor-history", dir);
    int devnull = open("/dev/null", O_RDWR);
    LineEditor *le = line_editor_create(devnull, devnull, path, 100, &err);
    CHECK(le != NULL, "create: %s", err.msg);
    if (le) {
        line_editor_add_history(le, "one\ntwo");
        line_editor_add_history(le, "three");
        line_editor_destroy(le);
    }
    LineHistory ed;
    line_history_init(&ed, 100);
    line_history_load(&ed, path);
    CHECK(ed.n == 2 && !strcmp(ed.items[0], "one\ntwo") && !strcmp(ed.items[1], "three"), "editor saved %d", ed.n);
    close(devnull);
    line_history_free(&h);
    line_history_free(&back);
    line_history_free(&few);
    line_history_free(&ed);
    test_remove_tree(dir);
}

static void test_history_file_corrupt(void) {
    char dir[512], path[700];
    make_temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/history", dir);
    /* Bad escape, lone trailing backslash, a NUL, binary, CRLF, empty lines. */
    const char bad[] = "good one\nbad \\x escape\nends in \\\nnul\0inside\n\xFF\xFE\x01 binary ok\r\n\n\n"
                       "crlf\r\nlast without newline";
    write_file(path, bad, sizeof bad - 1);
    LineHistory h;
    line_history_init(&h, 50);
    int got = line_history_load(&h, path);
    const char *want[] = {"good one", "\xFF\xFE\x01 binary ok", "crlf", "last without newline"};
    CHECK(got == 4 && h.n == 4, "loaded %d", got);
    for (int i = 0; i < 4 && i < h.n; i++) CHECK(!strcmp(h.items[i], want[i]), "entry %d: %s", i, h.items[i]);
    line_history_free(&h);
    /* A folder, a missing file, a FIFO: nothing loaded, no hang, no crash. */
    line_history_init(&h, 50);
    CHECK(line_history_load(&h, dir) == 0, "folder");
    snprintf(path, sizeof path, "%s/absent", dir);
    CHECK(line_history_load(&h, path) == 0, "missing");
    snprintf(path, sizeof path, "%s/fifo", dir);
    if (mkfifo(path, 0600) == 0) CHECK(line_history_load(&h, path) == 0, "fifo");
    /* Random garbage files. */
    uint64_t x = 88172645463325252ull;
    char buf[2048];
    snprintf(path, sizeof path, "%s/garbage", dir);
    for (int round = 0; round < 50; round++) {
        size_t len = (size_t)(round * 37 % (int)sizeof buf);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[i] = (char)((x & 3) == 0 ? '\\' : (x & 7) == 1 ? '\n' : (char)(x >> 24));
        }
        write_file(path, buf, len);
        line_history_load(&h, path);
        for (int i = 0; i < h.n; i++) CHECK(h.items[i][0] != 0, "empty entry loaded");
    }
    CHECK(h.n <= 50, "max respected");
    /* Saving where a file blocks the folder fails with a message, no crash. */
    Err err = {{0}};
    snprintf(path, sizeof path, "%s/garbage/sub/history", dir);
    CHECK(line_history_save(&h, path, &err) == -1 && strstr(err.msg, "history file"), "save error: %s", err.msg);
    /* An editor whose history file is corrupt still starts. */
    snprintf(path, sizeof path, "%s/garbage", dir);
    int devnull = open("/dev/null", O_RDWR);
    LineEditor *le = line_editor_create(devnull, devnull, path, 10, &err);
    CHECK(le != NULL, "create with a corrupt file: %s", err.msg);
    line_editor_destroy(le);
    close(devnull);
    line_history_free(&h);
    test_remove_tree(dir);
}

/* -------------------------------------------------------- the pipe path */

static void *late_writer_main(void *arg) {
    int fd = *(int *)arg;
    struct timespec d = {0, 50 * 1000000};
    nanosleep(&d, NULL);
    if (write(fd, "late\n", 5) != 5) fprintf(stderr, "late write failed\n");
    close(fd);
    return NULL;
}

static void test_pipe_turns(void) {
    int in[2], out[2];
    CHECK(pipe(in) == 0 && pipe(out) == 0, "pipe");
    const char input[] = "hello\r\nworld\\\nagain\\\r\nand more\n\nnul\0byte\n\xE4\xB8\xAD\\\nlast";
    CHECK(write(in[1], input, sizeof input - 1) == (ssize_t)(sizeof input - 1), "write");
    close(in[1]);
    Err err = {{0}};
    LineEditor *le = line_editor_create(in[0], out[1], NULL, 10, &err);
    CHECK(le != NULL, "create: %s", err.msg);
    if (!le) return;
    const char *want[] = {"hello", "world\nagain\nand more", "", "nulbyte", "\xE4\xB8\xAD\nlast"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char *line = NULL;
        LineResult r = line_editor_read(le, "> ", "… ", &line, &err);
        CHECK(r == LINE_OK && line && !strcmp(line, want[i]), "turn %zu: r %d \"%s\"", i, r, line ? line : "(null)");
        free(line);
    }
    char *line = NULL;
    CHECK(line_editor_read(le, "> ", "… ", &line, &err) == LINE_EOF && !line, "EOF");
    CHECK(line_editor_read(le, "> ", "… ", &line, &err) == LINE_EOF, "EOF again");
    line_editor_destroy(le);
    /* Not a terminal: nothing at all was written (no prompt, no escapes). */
    close(out[1]);
    char b[64];
    CHECK(read(out[0], b, sizeof b) == 0, "output written to a pipe");
    close(out[0]);
    close(in[0]);
    /* A trailing backslash on the last line, and a turn longer than the
     * 4 KiB read buffer. */
    CHECK(pipe(in) == 0, "pipe");
    char big[20001];
    for (int i = 0; i < 20000; i++) big[i] = (char)('a' + i % 26);
    big[20000] = 0;
    if (write(in[1], big, 20000) != 20000 || write(in[1], "\nend\\", 5) != 5) CHECK(0, "write");
    close(in[1]);
    int devnull = open("/dev/null", O_WRONLY);
    le = line_editor_create(in[0], devnull, NULL, 0, &err);
    line = NULL;
    CHECK(line_editor_read(le, "", NULL, &line, &err) == LINE_OK && line && !strcmp(line, big), "20000-byte turn");
    free(line);
    line = NULL;
    CHECK(line_editor_read(le, "", NULL, &line, &err) == LINE_OK && line && !strcmp(line, "end\n"), "last: %s", line);
    free(line);
    CHECK(line_editor_read(le, "", NULL, &line, &err) == LINE_EOF, "EOF");
    line_editor_destroy(le);
    close(devnull);
    close(in[0]);
    /* A non-blocking descriptor with nothing to read yet waits for data. */
    CHECK(pipe(in) == 0, "pipe");
    fcntl(in[0], F_SETFL, fcntl(in[0], F_GETFL) | O_NONBLOCK);
    pthread_t th;
    pthread_create(&th, NULL, late_writer_main, &in[1]);
    le = line_editor_create(in[0], in[0], NULL, 0, &err);
    line = NULL;
    CHECK(line_editor_read(le, "", NULL, &line, &err) == LINE_OK && line && !strcmp(line, "late"), "non-blocking: %s",
          line ? line : err.msg);
    free(line);
    pthread_join(th, NULL);
    line_editor_destroy(le);
    close(in[0]);
    /* Bad arguments. */
    CHECK(line_editor_create(-1, 1, NULL, 10, &err) == NULL && strstr(err.msg, "input fd"), "bad fd: %s", err.msg);
    CHECK(line_editor_create(0, 1, NULL, -1, &err) == NULL && strstr(err.msg, "history_max"), "bad max: %s", err.msg);
}

/* ---------------------------------------------- a tiny terminal emulator */

/* Enough of an xterm to replay what the editor writes: UTF-8 glyphs with
 * widths, deferred auto-wrap at the right edge, CR, LF with scrolling, and
 * the CSI sequences the editor uses. Anything else is counted as junk. */
enum { EMU_ROWS_MAX = 16, EMU_COLS_MAX = 64 };
typedef struct {
    int rows, cols, row, col, pending_wrap;
    char cell[EMU_ROWS_MAX][EMU_COLS_MAX][5]; /* UTF-8 of each cell; "" for the right half of a wide glyph */
    int clamped;   /* a cursor move ran into the screen edge */
    int junk;      /* bytes or sequences the editor should not send */
    int paste_on, paste_off;
    char seq[32];
    int seq_len, in_esc;
    unsigned char u8[4];
    int u8_len;
} Emu;

static void emu_init(Emu *e, int rows, int cols) {
    memset(e, 0, sizeof *e);
    e->rows = rows;
    e->cols = cols;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) strcpy(e->cell[r][c], " ");
}

static void emu_clear_rows(Emu *e, int from_row, int from_col) {
    for (int r = from_row; r < e->rows; r++)
        for (int c = r == from_row ? from_col : 0; c < e->cols; c++) strcpy(e->cell[r][c], " ");
}

static void emu_linefeed(Emu *e) {
    if (e->row + 1 < e->rows) { e->row++; return; }
    memmove(e->cell[0], e->cell[1], sizeof e->cell[0] * (size_t)(e->rows - 1));
    emu_clear_rows(e, e->rows - 1, 0);
}

static void emu_glyph(Emu *e, const unsigned char *s, int n) {
    long cp;
    line_utf8_unit((const char *)s, (size_t)n, 0, &cp);
    int w = line_cp_width(cp);
    if (w == 0) return;
    if (e->pending_wrap || e->col + w > e->cols) { e->col = 0; emu_linefeed(e); }
    e->pending_wrap = 0;
    memcpy(e->cell[e->row][e->col], s, (size_t)n);
    e->cell[e->row][e->col][n] = 0;
    if (w == 2) e->cell[e->row][e->col + 1][0] = 0;
    e->col += w;
    if (e->col >= e->cols) { e->col = e->cols - 1; e->pending_wrap = 1; }
}

static void emu_csi(Emu *e) {
    char fin = e->seq[e->seq_len - 1];
    e->seq[e->seq_len - 1] = 0;
    if (!strcmp(e->seq, "?2004") && fin == 'h') { e->paste_on++; return; }
    if (!strcmp(e->seq, "?2004") && fin == 'l') { e->paste_off++; return; }
    if (!strcmp(e->seq, "?25") && (fin == 'h' || fin == 'l')) return;
    if (e->seq[0] == '?') { e->junk++; return; }
    int n = e->seq[0] ? atoi(e->seq) : 0, step = n ? n : 1;
    e->pending_wrap = 0;
    switch (fin) {
    case 'A': if (e->row - step < 0) e->clamped++; e->row = e->row - step < 0 ? 0 : e->row - step; break;
    case 'B': if (e->row + step >= e->rows) e->clamped++; e->row = e->row + step >= e->rows ? e->rows - 1 : e->row + step; break;
    case 'C': if (e->col + step >= e->cols) e->clamped++; e->col = e->col + step >= e->cols ? e->cols - 1 : e->col + step; break;
    case 'J': if (n == 2) emu_clear_rows(e, 0, 0); else emu_clear_rows(e, e->row, e->col); break;
    case 'H': e->row = e->col = 0; break;
    default: e->junk++;
    }
}

static void emu_feed(Emu *e, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (e->in_esc) {
            if (e->in_esc == 1) { if (b == '[') { e->in_esc = 2; e->seq_len = 0; } else { e->junk++; e->in_esc = 0; } continue; }
            if (e->seq_len < (int)sizeof e->seq - 1) e->seq[e->seq_len++] = (char)b;
            if (b >= 0x40 && b <= 0x7E) { e->seq[e->seq_len] = 0; e->in_esc = 0; emu_csi(e); }
            continue;
        }
        if (e->u8_len) {
            e->u8[e->u8_len++] = b;
            int need = e->u8[0] >= 0xF0 ? 4 : e->u8[0] >= 0xE0 ? 3 : 2;
            if (e->u8_len == need) { emu_glyph(e, e->u8, need); e->u8_len = 0; }
            continue;
        }
        if (b == 0x1b) e->in_esc = 1;
        else if (b == '\r') { e->col = 0; e->pending_wrap = 0; }
        else if (b == '\n') { emu_linefeed(e); e->pending_wrap = 0; }
        else if (b >= 0xC0) { e->u8[0] = b; e->u8_len = 1; }
        else if (b >= 0x20 && b < 0x7f) emu_glyph(e, &b, 1);
        else e->junk++;
    }
}

/* Row r as text, trailing blanks removed. */
static void emu_row(const Emu *e, int r, char *out, size_t n) {
    size_t k = 0;
    out[0] = 0;
    for (int c = 0; c < e->cols; c++) {
        size_t l = strlen(e->cell[r][c]);
        if (k + l + 1 >= n) break;
        memcpy(out + k, e->cell[r][c], l);
        k += l;
    }
    while (k > 0 && out[k - 1] == ' ') k--;
    out[k] = 0;
}

/* ------------------------------------------------ the pseudo-terminal */

enum { PTY_MAX_READS = 8 };
typedef struct {
    LineEditor *le;
    int n_reads;
    atomic_int allowed, started, finished; /* the main thread allows each read in turn */
    LineResult result[PTY_MAX_READS];
    char *line[PTY_MAX_READS];
    Err err;
} PtyReader;

static void *pty_reader_main(void *arg) {
    PtyReader *p = arg;
    for (int i = 0; i < p->n_reads; i++) {
        while (atomic_load(&p->allowed) < i + 1) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        atomic_store(&p->started, i + 1);
        p->result[i] = line_editor_read(p->le, "> ", "\xE2\x80\xA6 ", &p->line[i], &p->err);
        atomic_store(&p->finished, i + 1);
    }
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    int master, slave;
    Emu emu;
    char log[1 << 16];  /* everything the editor wrote, for messages */
    size_t log_len;
} Pty;

/* Reads what the editor wrote, for up to ms milliseconds. */
static void pty_pump(Pty *t, int ms) {
    double end = now_s() + ms / 1000.0;
    for (;;) {
        int left = (int)((end - now_s()) * 1000);
        struct pollfd p = {.fd = t->master, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) return;
        char b[4096];
        ssize_t n = read(t->master, b, sizeof b);
        if (n <= 0) return;
        emu_feed(&t->emu, b, (size_t)n);
        size_t room = sizeof t->log - 1 - t->log_len;
        size_t k = (size_t)n < room ? (size_t)n : room;
        memcpy(t->log + t->log_len, b, k);
        t->log_len += k;
    }
}

/* Waits (2 s at most) for a redraw written after log offset `since`: new
 * output that ends with "show cursor", the last thing of every redraw,
 * followed by 30 ms of quiet. */
static void pty_wait_render(Pty *t, size_t since) {
    double end = now_s() + 2;
    while (now_s() < end) {
        size_t before = t->log_len;
        pty_pump(t, 30);
        if (t->log_len == before && t->log_len > since && t->log_len >= 6 &&
            !memcmp(t->log + t->log_len - 6, "\x1b[?25h", 6))
            return;
    }
    CHECK(0, "no redraw came");
}

/* Waits until read number k (1-based) has put the terminal in raw mode. */
static int pty_wait_raw(Pty *t, PtyReader *r, int k) {
    atomic_store(&r->allowed, k);
    double end = now_s() + 5;
    while (now_s() < end) {
        struct termios tio;
        if (atomic_load(&r->started) >= k && tcgetattr(t->slave, &tio) == 0 && !(tio.c_lflag & ICANON)) return 1;
        pty_pump(t, 5);
    }
    return 0;
}

static int pty_wait_done(Pty *t, PtyReader *r, int k) {
    double end = now_s() + 5;
    while (now_s() < end) {
        pty_pump(t, 10);
        if (atomic_load(&r->finished) >= k) { pty_pump(t, 30); return 1; }
    }
    return 0;
}

/* Types keys: send them only (a key that ends the read), or send and wait
 * for the redraw they cause. */
static void pty_send(Pty *t, const char *keys) {
    size_t n = strlen(keys);
    CHECK(write(t->master, keys, n) == (ssize_t)n, "write keys");
}

static void pty_keys(Pty *t, const char *keys) {
    size_t since = t->log_len;
    pty_send(t, keys);
    pty_wait_render(t, since);
}

static int pty_open(Pty *t, int rows, int cols) {
    memset(t, 0, sizeof *t);
    t->master = posix_openpt(O_RDWR | O_NOCTTY);
    CHECK(t->master >= 0, "posix_openpt: %s", strerror(errno));
    if (t->master < 0) return -1;
    CHECK(grantpt(t->master) == 0 && unlockpt(t->master) == 0, "grantpt/unlockpt: %s", strerror(errno));
    const char *name = ptsname(t->master);
    t->slave = name ? open(name, O_RDWR | O_NOCTTY) : -1;
    CHECK(t->slave >= 0, "open slave %s: %s", name ? name : "?", strerror(errno));
    if (t->slave < 0) { close(t->master); return -1; }
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    ioctl(t->master, TIOCSWINSZ, &ws);
    emu_init(&t->emu, rows, cols);
    return 0;
}

static int termios_equal(const struct termios *a, const struct termios *b) {
    return a->c_iflag == b->c_iflag && a->c_oflag == b->c_oflag && a->c_cflag == b->c_cflag &&
           a->c_lflag == b->c_lflag && !memcmp(a->c_cc, b->c_cc, sizeof a->c_cc);
}

#define EMU_ROW_IS(t, r, want)                                                   \
    do {                                                                         \
        char row_[512];                                                          \
        emu_row(&(t)->emu, r, row_, sizeof row_);                                \
        CHECK(!strcmp(row_, want), "screen row %d is \"%s\", want \"%s\"", r, row_, want); \
    } while (0)

#define EMU_CURSOR_AT(t, r, c)                                                   \
    CHECK((t)->emu.row == (r) && (t)->emu.col == (c), "screen cursor at %d,%d, want %d,%d", (t)->emu.row, \
          (t)->emu.col, r, c)

/* Five reads on a 20x8 terminal: a wrapped line edited in the middle,
 * history recall, a paste, a backslash continuation, Ctrl-C, Ctrl-D. */
static void test_pty_session(void) {
    Pty *t = calloc(1, sizeof *t);
    if (pty_open(t, 8, 20)) { free(t); return; }
    setenv("TERM", "xterm", 1);
    struct termios before, after;
    CHECK(tcgetattr(t->slave, &before) == 0, "tcgetattr");
    Err err = {{0}};
    LineEditor *le = line_editor_create(t->slave, t->slave, NULL, 10, &err);
    CHECK(le != NULL, "create: %s", err.msg);
    if (!le) { close(t->slave); close(t->master); free(t); return; }
    PtyReader r = {.le = le, .n_reads = 6};
    pthread_t th;
    pthread_create(&th, NULL, pty_reader_main, &r);

    /* 1: "> " + 17 letters fill 19 columns; 中 does not fit the 20th and
     * wraps. Then "!" goes in before 中 and fills row 0 exactly. */
    CHECK(pty_wait_raw(t, &r, 1), "raw mode not entered");
    pty_keys(t, "abcdefghijklmnopq\xE4\xB8\xAD\xE6\x96\x87xyz");
    EMU_ROW_IS(t, 0, "> abcdefghijklmnopq");
    EMU_ROW_IS(t, 1, "\xE4\xB8\xAD\xE6\x96\x87xyz");
    EMU_CURSOR_AT(t, 1, 7);
    pty_keys(t, "\x1b[D\x1b[D\x1b[D\x1b[D\x1b[D");
    EMU_CURSOR_AT(t, 1, 0);
    pty_keys(t, "!");
    EMU_ROW_IS(t, 0, "> abcdefghijklmnopq!");
    EMU_ROW_IS(t, 1, "\xE4\xB8\xAD\xE6\x96\x87xyz");
    EMU_CURSOR_AT(t, 1, 0);
    pty_keys(t, "\x0b");                  /* Ctrl-K: the text now ends exactly at the right edge */
    EMU_ROW_IS(t, 1, "");
    EMU_CURSOR_AT(t, 1, 0);                /* on the next row, not over the last glyph */
    pty_keys(t, "\x19");                  /* Ctrl-Y puts it back */
    EMU_ROW_IS(t, 1, "\xE4\xB8\xAD\xE6\x96\x87xyz");
    pty_keys(t, "\x1b[H");
    EMU_CURSOR_AT(t, 0, 2);
    pty_send(t, "\r");
    CHECK(pty_wait_done(t, &r, 1), "read 1 did not return");
    CHECK(r.result[0] == LINE_OK && r.line[0] && !strcmp(r.line[0], "abcdefghijklmnopq!\xE4\xB8\xAD\xE6\x96\x87xyz"),
          "read 1: %d %s", r.result[0], r.line[0] ? r.line[0] : "(null)");
    EMU_CURSOR_AT(t, 2, 0);
    CHECK(tcgetattr(t->slave, &after) == 0 && termios_equal(&before, &after), "mode not restored after read 1");
    if (r.line[0]) line_editor_add_history(le, r.line[0]);

    /* 2: up recalls it; Ctrl-U clears; a paste with newlines; Enter. */
    CHECK(pty_wait_raw(t, &r, 2), "raw mode 2");
    pty_keys(t, "\x1b[A");
    EMU_ROW_IS(t, 2, "> abcdefghijklmnopq!");
    pty_keys(t, "\x15");
    EMU_ROW_IS(t, 2, ">");
    EMU_ROW_IS(t, 3, "");
    pty_keys(t, "\x1b[200~p1\r\np2\x1b[201~");
    EMU_ROW_IS(t, 2, "> p1");
    EMU_ROW_IS(t, 3, "\xE2\x80\xA6 p2");   /* the continuation prompt starts a pasted line */
    pty_send(t, "\r");
    CHECK(pty_wait_done(t, &r, 2), "read 2 did not return");
    CHECK(r.result[1] == LINE_OK && r.line[1] && !strcmp(r.line[1], "p1\np2"), "read 2: %s", r.line[1] ? r.line[1] : "");

    /* 3: backslash continuation, shown with its backslash. */
    CHECK(pty_wait_raw(t, &r, 3), "raw mode 3");
    pty_keys(t, "one\\\rtwo");
    EMU_ROW_IS(t, 4, "> one\\");
    EMU_ROW_IS(t, 5, "\xE2\x80\xA6 two");
    pty_send(t, "\r");
    CHECK(pty_wait_done(t, &r, 3), "read 3 did not return");
    CHECK(r.result[2] == LINE_OK && r.line[2] && !strcmp(r.line[2], "one\ntwo"), "read 3: %s", r.line[2] ? r.line[2] : "");

    /* 4: Ctrl-C; 5: a line taller than the screen (8 rows of 20) stays
     * inside the screen; 6: Ctrl-D. */
    CHECK(pty_wait_raw(t, &r, 4), "raw mode 4");
    pty_send(t, "junk\x03");
    CHECK(pty_wait_done(t, &r, 4) && r.result[3] == LINE_INTERRUPT, "read 4: %d", r.result[3]);
    CHECK(pty_wait_raw(t, &r, 5), "raw mode 5");
    char big[400];
    for (int i = 0; i < 300; i++) big[i] = (char)('A' + i % 26);
    big[300] = 0;
    char paste[420];
    snprintf(paste, sizeof paste, "\x1b[200~%s\x1b[201~", big);
    pty_keys(t, paste);
    pty_keys(t, "\x1b[H");
    EMU_ROW_IS(t, 0, "> ABCDEFGHIJKLMNOPQR");
    EMU_CURSOR_AT(t, 0, 2);
    pty_send(t, "\x1b[F\r");
    CHECK(pty_wait_done(t, &r, 5), "read 5 did not return");
    CHECK(r.result[4] == LINE_OK && r.line[4] && !strcmp(r.line[4], big), "read 5");
    CHECK(pty_wait_raw(t, &r, 6), "raw mode 6");
    pty_send(t, "\x04");
    CHECK(pty_wait_done(t, &r, 6) && r.result[5] == LINE_EOF, "read 6: %d", r.result[5]);

    pthread_join(th, NULL);
    CHECK(tcgetattr(t->slave, &after) == 0 && termios_equal(&before, &after), "mode not restored at the end");
    CHECK(t->emu.clamped == 0, "%d cursor moves ran into the screen edge", t->emu.clamped);
    CHECK(t->emu.junk == 0, "%d unexpected bytes or sequences", t->emu.junk);
    CHECK(t->emu.paste_on == 6 && t->emu.paste_off == 6, "bracketed paste on %d / off %d", t->emu.paste_on,
          t->emu.paste_off);
    for (int i = 0; i < r.n_reads; i++) free(r.line[i]);
    line_editor_destroy(le);
    close(t->slave);
    close(t->master);
    free(t);
}

int main(void) {
    RUN(test_history_file_round_trip);
    RUN(test_history_file_corrupt);
    RUN(test_pipe_turns);
    RUN(test_pty_session);
    TEST_EXIT();
}
