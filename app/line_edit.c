/* line_edit.c — the prompt of `cllm chat` (see line_edit.h for the layers).
 *
 * Order of this file: growable bytes; UTF-8 and column widths; history and
 * its file; the editing state machine (LineCore); the renderer; the terminal
 * loop; the plain (non-terminal) reader; the public LineEditor calls.
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

#define LINE_MAX_BYTES (16u << 20)        /* one turn; longer input is refused */
#define HISTORY_FILE_MAX (64u << 20)      /* a bigger history file is ignored */
#define ESC_TIMEOUT_MS 500                /* quiet time that ends a lone Esc */

/* ------------------------------------------------------------------ bytes */

/* A growable byte string, always NUL-terminated once allocated. */
typedef struct {
    char *p;
    size_t len, cap;
} Bytes;

static int bytes_reserve(Bytes *b, size_t extra) {
    if (extra > SIZE_MAX / 4 - b->len) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int bytes_insert(Bytes *b, size_t at, const char *s, size_t n) {
    if (bytes_reserve(b, n)) return -1;
    memmove(b->p + at + n, b->p + at, b->len - at);
    memcpy(b->p + at, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static int bytes_add(Bytes *b, const char *s, size_t n) { return bytes_insert(b, b->len, s, n); }
static int bytes_adds(Bytes *b, const char *s) { return bytes_add(b, s, strlen(s)); }

static void bytes_erase(Bytes *b, size_t from, size_t to) {
    memmove(b->p + from, b->p + to, b->len - to);
    b->len -= to - from;
    b->p[b->len] = 0;
}

static int bytes_set(Bytes *b, const char *s, size_t n) {
    b->len = 0;
    if (bytes_reserve(b, n)) return -1;
    return bytes_add(b, s, n);
}

static void bytes_free(Bytes *b) {
    free(b->p);
    *b = (Bytes){0};
}

/* ---------------------------------------------------- UTF-8 and columns */

int line_utf8_unit(const char *s, size_t len, size_t i, long *cp) {
    const unsigned char *u = (const unsigned char *)s + i;
    size_t left = len - i;
    long v = -1;
    int n = 1;
    if (u[0] < 0x80) {
        v = u[0];
    } else {
        int want = u[0] >= 0xC2 && u[0] <= 0xDF ? 2 : u[0] >= 0xE0 && u[0] <= 0xEF ? 3
                 : u[0] >= 0xF0 && u[0] <= 0xF4 ? 4 : 0;
        long x = want == 2 ? (u[0] & 0x1F) : want == 3 ? (u[0] & 0x0F) : (u[0] & 0x07);
        int k = 1;
        for (; want && k < want && (size_t)k < left && (u[k] & 0xC0) == 0x80; k++) x = x << 6 | (u[k] & 0x3F);
        static const long min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (want && k == want && x >= min_of_len[want] && x <= 0x10FFFF && (x < 0xD800 || x > 0xDFFF)) {
            v = x;
            n = want;
        }
    }
    if (cp) *cp = v;
    return n;
}

typedef struct {
    long lo, hi;
} CpRange;

/* Marks that draw on the previous cell, and invisible format characters. */
static const CpRange zero_width[] = {
    {0x0300, 0x036F}, {0x0483, 0x0489}, {0x0591, 0x05BD}, {0x0610, 0x061A}, {0x064B, 0x065F},
    {0x1160, 0x11FF}, {0x1AB0, 0x1AFF}, {0x1DC0, 0x1DFF}, {0x200B, 0x200F}, {0x202A, 0x202E},
    {0x2060, 0x2064}, {0x20D0, 0x20FF}, {0x302A, 0x302D}, {0x3099, 0x309A}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F}, {0xFEFF, 0xFEFF},
    {0x16FE4, 0x16FE4}, {0xE0000, 0xE007F}, {0xE0100, 0xE01EF},
};

/* East Asian Wide and Fullwidth blocks, and the emoji shown 2 columns wide. */
static const CpRange wide[] = {
    {0x1100, 0x115F}, {0x231A, 0x231B}, {0x2329, 0x232A}, {0x23E9, 0x23EC}, {0x23F0, 0x23F0},
    {0x23F3, 0x23F3}, {0x25FD, 0x25FE}, {0x2614, 0x2615}, {0x2648, 0x2653}, {0x267F, 0x267F},
    {0x2693, 0x2693}, {0x26A1, 0x26A1}, {0x26AA, 0x26AB}, {0x26BD, 0x26BE}, {0x26C4, 0x26C5},
    {0x26CE, 0x26CE}, {0x26D4, 0x26D4}, {0x26EA, 0x26EA}, {0x26F2, 0x26F3}, {0x26F5, 0x26F5},
    {0x26FA, 0x26FA}, {0x26FD, 0x26FD}, {0x2705, 0x2705}, {0x270A, 0x270B}, {0x2728, 0x2728},
    {0x274C, 0x274C}, {0x274E, 0x274E}, {0x2753, 0x2755}, {0x2757, 0x2757}, {0x2795, 0x2797},
    {0x27B0, 0x27B0}, {0x27BF, 0x27BF}, {0x2B1B, 0x2B1C}, {0x2B50, 0x2B50}, {0x2B55, 0x2B55},
    {0x2E80, 0x303E}, {0x3041, 0x33FF}, {0x3400, 0x9FFF}, {0xA000, 0xA4CF},
    {0xA960, 0xA97F}, {0xAC00, 0xD7A3}, {0xF900, 0xFAFF}, {0xFE10, 0xFE19}, {0xFE30, 0xFE6F},
    {0xFF00, 0xFF60}, {0xFFE0, 0xFFE6}, {0x16FE0, 0x16FE3}, {0x16FF0, 0x16FF1}, {0x17000, 0x18D7F},
    {0x1AFF0, 0x1AFFE}, {0x1B000, 0x1B2FF},
    {0x1F004, 0x1F004}, {0x1F0CF, 0x1F0CF}, {0x1F18E, 0x1F18E}, {0x1F191, 0x1F19A}, {0x1F200, 0x1F202},
    {0x1F210, 0x1F23B}, {0x1F240, 0x1F248}, {0x1F250, 0x1F251}, {0x1F260, 0x1F265}, {0x1F300, 0x1F320},
    {0x1F32D, 0x1F335}, {0x1F337, 0x1F37C}, {0x1F37E, 0x1F393}, {0x1F3A0, 0x1F3CA}, {0x1F3CF, 0x1F3D3},
    {0x1F3E0, 0x1F3F0}, {0x1F3F4, 0x1F3F4}, {0x1F3F8, 0x1F43E}, {0x1F440, 0x1F440}, {0x1F442, 0x1F4FC},
    {0x1F4FF, 0x1F53D}, {0x1F54B, 0x1F54E}, {0x1F550, 0x1F567}, {0x1F57A, 0x1F57A}, {0x1F595, 0x1F596},
    {0x1F5A4, 0x1F5A4}, {0x1F5FB, 0x1F64F}, {0x1F680, 0x1F6C5}, {0x1F6CC, 0x1F6CC}, {0x1F6D0, 0x1F6D2},
    {0x1F6D5, 0x1F6D7}, {0x1F6DC, 0x1F6DF}, {0x1F6EB, 0x1F6EC}, {0x1F6F4, 0x1F6FC}, {0x1F7E0, 0x1F7EB},
    {0x1F7F0, 0x1F7F0}, {0x1F90C, 0x1F93A}, {0x1F93C, 0x1F945}, {0x1F947, 0x1F9FF}, {0x1FA70, 0x1FAFF},
    {0x20000, 0x2FFFD}, {0x30000, 0x3FFFD},
};

static int cp_in(const CpRange *r, size_t n, long cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int line_cp_width(long cp) {
    if (cp < 0x300) return 1;
    if (cp_in(zero_width, sizeof zero_width / sizeof *zero_width, cp)) return 0;
    return cp_in(wide, sizeof wide / sizeof *wide, cp) ? 2 : 1;
}

static int is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

/* Start of the code-point unit that holds byte p. Units begin at every byte
 * that is not a continuation byte, so the unit holding p starts at the
 * nearest such byte within 3 before p if that one's unit reaches p; else p
 * is a lone (invalid) continuation byte, a unit of its own. */
static size_t unit_start(const char *s, size_t len, size_t p) {
    size_t lo = p >= 3 ? p - 3 : 0;
    for (size_t q = p + 1; q-- > lo;) {
        if (!is_cont((unsigned char)s[q])) return q + (size_t)line_utf8_unit(s, len, q, NULL) > p ? q : p;
    }
    return p;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n'; }

/* ---------------------------------------------------------------- history */

void line_history_init(LineHistory *h, int max) { *h = (LineHistory){.max = max > 0 ? max : 0}; }

void line_history_free(LineHistory *h) {
    for (int i = 0; i < h->n; i++) free(h->items[i]);
    free(h->items);
    line_history_init(h, h->max);
}

int line_history_add(LineHistory *h, const char *line) {
    if (h->max <= 0 || !line || !line[0]) return 0;
    if (h->n > 0 && !strcmp(h->items[h->n - 1], line)) return 0;
    char *copy = strdup(line);
    if (!copy) return -1;
    if (h->n == h->max) {
        free(h->items[0]);
        memmove(h->items, h->items + 1, (size_t)(h->n - 1) * sizeof *h->items);
        h->n--;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? (h->cap > h->max / 2 ? h->max : h->cap * 2) : (h->max < 16 ? h->max : 16);
        char **items = realloc(h->items, (size_t)cap * sizeof *items);
        if (!items) { free(copy); return -1; }
        h->items = items;
        h->cap = cap;
    }
    h->items[h->n++] = copy;
    return 0;
}

/* Decodes one file line into out; -1 when it is malformed (bad escape, NUL). */
static int history_unescape(const char *s, size_t n, Bytes *out) {
    out->len = 0;
    if (bytes_reserve(out, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == 0) return -1;
        if (ch == '\\') {
            if (++i == n) return -1;
            ch = s[i] == '\\' ? '\\' : s[i] == 'n' ? '\n' : s[i] == 'r' ? '\r' : 0;
            if (!ch) return -1;
        }
        out->p[out->len++] = ch;
    }
    out->p[out->len] = 0;
    return 0;
}

static int history_escape(Bytes *out, const char *s) {
    for (; *s; s++) {
        const char *e = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : *s == '\r' ? "\\r" : NULL;
        if (e ? bytes_adds(out, e) : bytes_add(out, s, 1)) return -1;
    }
    return bytes_add(out, "\n", 1);
}

/* Reads a whole regular file of at most HISTORY_FILE_MAX bytes; NULL if
 * anything is off (O_NONBLOCK so a FIFO cannot hang the start-up). */
static char *history_slurp(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return NULL;
    struct stat st;
    char *data = NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0 && (uint64_t)st.st_size <= HISTORY_FILE_MAX)
        data = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (data && got < (size_t)st.st_size) {
        ssize_t k = read(fd, data + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    *size = got;
    return data;
}

int line_history_load(LineHistory *h, const char *path) {
    if (!path || h->max <= 0) return 0;
    size_t size = 0;
    char *data = history_slurp(path, &size);
    if (!data) return 0;
    /* Walk back from the end and keep the newest max valid lines, so a huge
     * file costs one pass over its tail, not max-sized shifts per line. */
    size_t lines = 1;
    for (const char *q = data; (q = memchr(q, '\n', size - (size_t)(q - data))) != NULL; q++) lines++;
    size_t slots = lines < (size_t)h->max ? lines : (size_t)h->max; /* not more than the file can hold */
    size_t *starts = malloc(slots * sizeof *starts), *ends = malloc(slots * sizeof *ends);
    int kept = 0, loaded = 0;
    Bytes tmp = {0};
    size_t end = size;
    while (starts && ends && end > 0 && (size_t)kept < slots) {
        size_t start = end;
        while (start > 0 && data[start - 1] != '\n') start--;
        size_t stop = end > start && data[end - 1] == '\r' ? end - 1 : end;
        if (stop > start && history_unescape(data + start, stop - start, &tmp) == 0) {
            starts[kept] = start;
            ends[kept++] = stop;
        }
        end = start > 0 ? start - 1 : 0;
    }
    for (int i = kept - 1; i >= 0; i--) {
        if (history_unescape(data + starts[i], ends[i] - starts[i], &tmp) == 0 && line_history_add(h, tmp.p) == 0)
            loaded++;
    }
    bytes_free(&tmp);
    free(starts);
    free(ends);
    free(data);
    return loaded;
}

/* mkdir -p for the folders above path (mode 0700: history is private). */
static void history_make_folders(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    for (char *s = dir + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        mkdir(dir, 0700);
        *s = '/';
    }
    free(dir);
}

int line_history_save(const LineHistory *h, const char *path, Err *err) {
    Bytes text = {0}, tmp = {0};
    for (int i = 0; i < h->n; i++) {
        if (history_escape(&text, h->items[i])) { bytes_free(&text); return err_set(err, "history file %s: out of memory", path); }
    }
    char pid[32];
    snprintf(pid, sizeof pid, ".tmp%ld", (long)getpid());
    if (bytes_adds(&tmp, path) || bytes_adds(&tmp, pid)) {
        bytes_free(&text);
        bytes_free(&tmp);
        return err_set(err, "history file %s: out of memory", path);
    }
    history_make_folders(path);
    int rc = 0, fd = open(tmp.p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0) rc = err_set(err, "history file %s: cannot create %s: %s", path, tmp.p, strerror(errno));
    for (size_t off = 0; rc == 0 && off < text.len;) {
        ssize_t k = write(fd, text.p + off, text.len - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) rc = err_set(err, "history file %s: write failed: %s", path, strerror(errno));
        else off += (size_t)k;
    }
    if (fd >= 0 && close(fd) && rc == 0) rc = err_set(err, "history file %s: close failed: %s", path, strerror(errno));
    if (rc == 0 && rename(tmp.p, path)) rc = err_set(err, "history file %s: rename failed: %s", path, strerror(errno));
    if (rc && fd >= 0) unlink(tmp.p);
    bytes_free(&text);
    bytes_free(&tmp);
    return rc;
}

/* ------------------------------------------------------------- the core */

typedef enum { ESC_NONE, ESC_START, ESC_CSI, ESC_SS3, ESC_INTER, ESC_STRING } EscState;

struct LineCore {
    const LineHistory *hist;
    Bytes line;          /* the line being edited */
    size_t cursor;       /* byte offset into line, on a unit boundary */
    Bytes done;          /* lines of this turn already continued, each + '\n' */
    size_t last_start;   /* where the newest continued line starts in done */
    Bytes saved;         /* the new line, kept while browsing older entries */
    Bytes kill;          /* the text Ctrl-U/K/W removed last, for Ctrl-Y */
    int hist_pos;        /* entry shown; hist->n means the new line */
    EscState esc;
    char csi[16];        /* parameter and intermediate bytes of a CSI */
    int csi_len, csi_bad;
    char utf8[4];        /* a multi-byte character arriving byte by byte */
    int utf8_len, utf8_need;
    int skip_cont;       /* continuation bytes still to drop (Alt + non-ASCII) */
    int pasting;         /* between ESC[200~ and ESC[201~ */
    int paste_cr;        /* the previous pasted byte was CR: a LF after it is dropped */
};

LineCore *line_core_create(const LineHistory *history) {
    LineCore *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->hist = history;
    line_core_reset(c);
    return c;
}

void line_core_destroy(LineCore *c) {
    if (!c) return;
    bytes_free(&c->line);
    bytes_free(&c->done);
    bytes_free(&c->saved);
    bytes_free(&c->kill);
    free(c);
}

void line_core_reset(LineCore *c) {
    c->line.len = c->done.len = c->saved.len = 0;
    if (c->line.p) c->line.p[0] = 0;
    c->cursor = c->last_start = 0;
    c->hist_pos = c->hist ? c->hist->n : 0;
    c->esc = ESC_NONE;
    c->csi_len = c->csi_bad = c->utf8_len = c->utf8_need = c->skip_cont = 0;
    c->pasting = c->paste_cr = 0;
}

const char *line_core_line(const LineCore *c, size_t *len) {
    *len = c->line.len;
    return c->line.p ? c->line.p : "";
}

size_t line_core_cursor(const LineCore *c) { return c->cursor; }
int line_core_continued(const LineCore *c) { return c->done.len > 0; }
int line_core_escape_pending(const LineCore *c) { return c->esc != ESC_NONE; }

const char *line_core_last_continued(const LineCore *c, size_t *len) {
    *len = c->done.len > c->last_start ? c->done.len - c->last_start - 1 : 0;
    return c->done.p ? c->done.p + c->last_start : "";
}

char *line_core_take_text(LineCore *c) {
    char *s = malloc(c->done.len + c->line.len + 1);
    if (!s) return NULL;
    if (c->done.len) memcpy(s, c->done.p, c->done.len);
    if (c->line.len) memcpy(s + c->done.len, c->line.p, c->line.len);
    s[c->done.len + c->line.len] = 0;
    return s;
}

int line_core_timeout(LineCore *c) {
    int was = c->esc != ESC_NONE;
    c->esc = ESC_NONE;
    return was;
}

/* After an edit the bytes around the cursor may form a new unit (an invalid
 * byte next to one that now completes it): move the cursor past it. */
static void core_snap(LineCore *c) {
    if (c->cursor > c->line.len) c->cursor = c->line.len;
    if (c->cursor == c->line.len) return;
    size_t s = unit_start(c->line.p, c->line.len, c->cursor);
    if (s != c->cursor) c->cursor = s + (size_t)line_utf8_unit(c->line.p, c->line.len, s, NULL);
}

static LineEvent core_insert(LineCore *c, const char *s, size_t n) {
    if ((size_t)c->done.len + c->line.len + n > LINE_MAX_BYTES) return LINE_EV_NONE; /* full: dropped */
    if (bytes_insert(&c->line, c->cursor, s, n)) return LINE_EV_ERROR;
    c->cursor += n;
    core_snap(c);
    return LINE_EV_NONE;
}

/* Removes line[from, to) into the kill buffer when kill is set. */
static LineEvent core_cut(LineCore *c, size_t from, size_t to, int kill) {
    if (from >= to) return LINE_EV_NONE;
    if (kill && bytes_set(&c->kill, c->line.p + from, to - from)) return LINE_EV_ERROR;
    bytes_erase(&c->line, from, to);
    c->cursor = from;
    core_snap(c);
    return LINE_EV_NONE;
}

static size_t core_prev(const LineCore *c) { return c->cursor ? unit_start(c->line.p, c->line.len, c->cursor - 1) : 0; }

static size_t core_next(const LineCore *c) {
    return c->cursor < c->line.len ? c->cursor + (size_t)line_utf8_unit(c->line.p, c->line.len, c->cursor, NULL)
                                   : c->cursor;
}

static size_t core_word_left(const LineCore *c) {
    size_t i = c->cursor;
    while (i > 0 && is_space(c->line.p[i - 1])) i--;
    while (i > 0 && !is_space(c->line.p[i - 1])) i--;
    return i;
}

static size_t core_word_right(const LineCore *c) {
    size_t i = c->cursor;
    while (i < c->line.len && is_space(c->line.p[i])) i++;
    while (i < c->line.len && !is_space(c->line.p[i])) i++;
    return i;
}

/* Up (dir -1) / down (+1) through the history. Leaving the new line saves
 * it; coming back restores it; edits to older entries are not kept. */
static LineEvent core_history(LineCore *c, int dir) {
    int n = c->hist ? c->hist->n : 0;
    if (c->hist_pos > n) c->hist_pos = n;
    int to = c->hist_pos + dir;
    if (to < 0 || to > n) return LINE_EV_NONE;
    if (c->hist_pos == n && bytes_set(&c->saved, c->line.p ? c->line.p : "", c->line.len)) return LINE_EV_ERROR;
    const char *s = to == n ? (c->saved.p ? c->saved.p : "") : c->hist->items[to];
    size_t len = to == n ? c->saved.len : strlen(s);
    if (bytes_set(&c->line, s, len)) return LINE_EV_ERROR;
    c->hist_pos = to;
    c->cursor = c->line.len;
    return LINE_EV_NONE;
}

static LineEvent core_enter(LineCore *c) {
    if (c->line.len == 0 || c->line.p[c->line.len - 1] != '\\') return LINE_EV_SUBMIT;
    c->last_start = c->done.len;
    if (bytes_add(&c->done, c->line.p, c->line.len - 1) || bytes_add(&c->done, "\n", 1)) {
        c->done.len = c->last_start;
        return LINE_EV_ERROR;
    }
    c->line.len = 0;
    c->line.p[0] = 0;
    c->cursor = 0;
    c->hist_pos = c->hist ? c->hist->n : 0;
    return LINE_EV_CONTINUE;
}

/* Keys named by an escape sequence, or their control-key twins. */
typedef enum { KEY_LEFT, KEY_RIGHT, KEY_UP, KEY_DOWN, KEY_HOME, KEY_END, KEY_DELETE, KEY_WORD_LEFT, KEY_WORD_RIGHT } Key;

static LineEvent core_key(LineCore *c, Key k) {
    switch (k) {
    case KEY_LEFT: c->cursor = core_prev(c); break;
    case KEY_RIGHT: c->cursor = core_next(c); break;
    case KEY_UP: return core_history(c, -1);
    case KEY_DOWN: return core_history(c, +1);
    case KEY_HOME: c->cursor = 0; break;
    case KEY_END: c->cursor = c->line.len; break;
    case KEY_DELETE: return core_cut(c, c->cursor, core_next(c), 0);
    case KEY_WORD_LEFT: c->cursor = core_word_left(c); break;
    case KEY_WORD_RIGHT: c->cursor = core_word_right(c); break;
    }
    return LINE_EV_NONE;
}

static LineEvent core_control(LineCore *c, unsigned char b) {
    switch (b) {
    case 0x01: return core_key(c, KEY_HOME);                          /* Ctrl-A */
    case 0x02: return core_key(c, KEY_LEFT);                          /* Ctrl-B */
    case 0x03: line_core_reset(c); return LINE_EV_INTERRUPT;          /* Ctrl-C */
    case 0x04:                                                        /* Ctrl-D */
        if (c->line.len) return core_key(c, KEY_DELETE);
        return c->done.len ? LINE_EV_SUBMIT : LINE_EV_EOF;
    case 0x05: return core_key(c, KEY_END);                           /* Ctrl-E */
    case 0x06: return core_key(c, KEY_RIGHT);                         /* Ctrl-F */
    case 0x08: case 0x7f: return core_cut(c, core_prev(c), c->cursor, 0); /* Backspace */
    case 0x09: return core_insert(c, "\t", 1);
    case 0x0a: case 0x0d: return core_enter(c);
    case 0x0b: return core_cut(c, c->cursor, c->line.len, 1);         /* Ctrl-K */
    case 0x0c: return LINE_EV_CLEAR;                                  /* Ctrl-L */
    case 0x0e: return core_key(c, KEY_DOWN);                          /* Ctrl-N */
    case 0x10: return core_key(c, KEY_UP);                            /* Ctrl-P */
    case 0x15: return core_cut(c, 0, c->cursor, 1);                   /* Ctrl-U */
    case 0x17: return core_cut(c, core_word_left(c), c->cursor, 1);   /* Ctrl-W */
    case 0x19: return c->kill.len ? core_insert(c, c->kill.p, c->kill.len) : LINE_EV_NONE; /* Ctrl-Y */
    case 0x1a: return LINE_EV_SUSPEND;                                /* Ctrl-Z */
    default: return LINE_EV_NONE;
    }
}

/* Inside a paste: text and newlines go in as they are (CR and CRLF become
 * LF); other control bytes are dropped, except Ctrl-C, the way out should
 * the end marker never come. */
static LineEvent core_paste_byte(LineCore *c, unsigned char b, int after_cr) {
    if (b == 0x03) return core_control(c, b);
    if (b == '\r') { c->paste_cr = 1; return core_insert(c, "\n", 1); }
    if (b == '\n') return after_cr ? LINE_EV_NONE : core_insert(c, "\n", 1);
    if (b == '\t' || (b >= 0x20 && b != 0x7f)) return core_insert(c, (const char *)&b, 1);
    return LINE_EV_NONE;
}

/* Reads "p1;p2" of a CSI; -1 for a private sequence (leading <, =, >, ?). */
static int csi_params(const char *s, int *p1, int *p2) {
    *p1 = *p2 = 0;
    if (*s >= '<' && *s <= '?') return -1;
    int *p = p1;
    for (; *s; s++) {
        if (*s >= '0' && *s <= '9') { if (*p < 100000) *p = *p * 10 + (*s - '0'); }
        else if (*s == ';' && p == p1) p = p2;
        else return -1;
    }
    return 0;
}

static LineEvent core_csi(LineCore *c, unsigned char final) {
    int p1, p2;
    c->csi[c->csi_len] = 0;
    if (c->csi_bad || csi_params(c->csi, &p1, &p2)) return LINE_EV_NONE;
    if (final == '~' && p1 == 200 && p2 == 0) { c->pasting = 1; c->paste_cr = 0; return LINE_EV_NONE; }
    if (final == '~' && p1 == 201 && p2 == 0) { c->pasting = 0; return LINE_EV_NONE; }
    if (c->pasting) return LINE_EV_NONE;
    if (final == '~') {
        if (p1 == 1 || p1 == 7) return core_key(c, KEY_HOME);
        if (p1 == 4 || p1 == 8) return core_key(c, KEY_END);
        if (p1 == 3) return core_key(c, KEY_DELETE);
        return LINE_EV_NONE;
    }
    int word = p2 == 3 || p2 == 5; /* Alt or Ctrl held */
    switch (final) {
    case 'A': return core_key(c, KEY_UP);
    case 'B': return core_key(c, KEY_DOWN);
    case 'C': return core_key(c, word ? KEY_WORD_RIGHT : KEY_RIGHT);
    case 'D': return core_key(c, word ? KEY_WORD_LEFT : KEY_LEFT);
    case 'H': return core_key(c, KEY_HOME);
    case 'F': return core_key(c, KEY_END);
    default: return LINE_EV_NONE;
    }
}

/* ESC followed by one byte: Alt+key. Known ones edit words; any other is
 * swallowed (with the rest of a multi-byte character). */
static LineEvent core_alt(LineCore *c, unsigned char b) {
    if (b >= 0xC0) c->skip_cont = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    if (c->pasting) return LINE_EV_NONE;
    if (b == 'b' || b == 'B') return core_key(c, KEY_WORD_LEFT);
    if (b == 'f' || b == 'F') return core_key(c, KEY_WORD_RIGHT);
    if (b == 'd' || b == 'D') return core_cut(c, c->cursor, core_word_right(c), 1);
    if (b == 0x7f) return core_cut(c, core_word_left(c), c->cursor, 1);
    return LINE_EV_NONE;
}

static LineEvent core_escape_byte(LineCore *c, unsigned char b) {
    EscState st = c->esc;
    c->esc = ESC_NONE;
    if (b == 0x1b && st != ESC_STRING) { c->esc = ESC_START; return LINE_EV_NONE; } /* restart */
    switch (st) {
    case ESC_START:
        if (b == '[') { c->esc = ESC_CSI; c->csi_len = c->csi_bad = 0; return LINE_EV_NONE; }
        if (b == 'O') { c->esc = ESC_SS3; return LINE_EV_NONE; }
        if (b == ']' || b == 'P' || b == '_' || b == '^' || b == 'X') { c->esc = ESC_STRING; return LINE_EV_NONE; }
        if (b >= 0x20 && b <= 0x2F) { c->esc = ESC_INTER; return LINE_EV_NONE; }
        if (b < 0x20) return line_core_feed(c, b); /* Esc then Ctrl-C still interrupts */
        return core_alt(c, b);
    case ESC_SS3:
        if (b < 0x20) return line_core_feed(c, b);
        if (c->pasting || !strchr("ABCDHF", b)) return LINE_EV_NONE;
        c->csi_len = c->csi_bad = 0;
        return core_csi(c, b);
    case ESC_INTER:
        if (b >= 0x20 && b <= 0x2F) c->esc = ESC_INTER;
        else if (b < 0x20) return line_core_feed(c, b);
        return LINE_EV_NONE;
    case ESC_STRING: /* OSC/DCS/...: ends at BEL, or at ESC (the ESC \ terminator) */
        if (b == 0x1b) c->esc = ESC_START;
        else if (b != 0x07) c->esc = ESC_STRING;
        return LINE_EV_NONE;
    case ESC_CSI:
        if (b >= 0x20 && b <= 0x3F) {
            if (c->csi_len < (int)sizeof c->csi - 1) c->csi[c->csi_len++] = (char)b;
            else c->csi_bad = 1;
            c->esc = ESC_CSI;
            return LINE_EV_NONE;
        }
        if (b >= 0x40 && b <= 0x7E) return core_csi(c, b);
        if (b < 0x20) return line_core_feed(c, b); /* a broken sequence: the control still counts */
        return LINE_EV_NONE;
    case ESC_NONE: break;
    }
    return LINE_EV_NONE;
}

/* A byte >= 0x80: collect a multi-byte character and insert it whole; a
 * byte that cannot start one goes in alone (kept, shown as U+FFFD). */
static LineEvent core_utf8_byte(LineCore *c, unsigned char b) {
    if (c->utf8_len > 0 && is_cont(b)) {
        c->utf8[c->utf8_len++] = (char)b;
        if (c->utf8_len < c->utf8_need) return LINE_EV_NONE;
        c->utf8_len = 0;
        return core_insert(c, c->utf8, (size_t)c->utf8_need);
    }
    if (b >= 0xC2 && b <= 0xF4) {
        c->utf8[0] = (char)b;
        c->utf8_len = 1;
        c->utf8_need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        return LINE_EV_NONE;
    }
    return core_insert(c, (const char *)&b, 1);
}

LineEvent line_core_feed(LineCore *c, unsigned char b) {
    int after_cr = c->paste_cr;
    c->paste_cr = 0;
    if (c->esc != ESC_NONE) return core_escape_byte(c, b);
    if (c->skip_cont > 0 && is_cont(b)) { c->skip_cont--; return LINE_EV_NONE; }
    c->skip_cont = 0;
    if (c->utf8_len > 0 && !is_cont(b)) { /* an unfinished character: keep its bytes */
        int n = c->utf8_len;
        c->utf8_len = 0;
        if (core_insert(c, c->utf8, (size_t)n) == LINE_EV_ERROR) return LINE_EV_ERROR;
    }
    if (b >= 0x80) return core_utf8_byte(c, b);
    if (b == 0x1b) { c->esc = ESC_START; return LINE_EV_NONE; }
    if (c->pasting) return core_paste_byte(c, b, after_cr);
    if (b >= 0x20 && b != 0x7f) return core_insert(c, (const char *)&b, 1);
    return core_control(c, b);
}

LineEvent line_core_feed_bytes(LineCore *c, const void *bytes, size_t n, size_t *used) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        LineEvent ev = line_core_feed(c, p[i]);
        if (ev != LINE_EV_NONE) { *used = i + 1; return ev; }
    }
    *used = n;
    return LINE_EV_NONE;
}

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
        for (size_t i = 0; i < take; i++) if (start[i]) turn.p[turn.len++] = (char)start[i]; /* NULs dropped */
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
    if (le->out_fd == fileno(stdout)) fflush(stdout); /* the caller's buffered text goes before the prompt */
    if (!prompt) prompt = "";
    if (!continuation_prompt) continuation_prompt = prompt;
    if (le->edit) return editor_read_tty(le, prompt, continuation_prompt, out, err);
    return plain_read(le, prompt, continuation_prompt, out, err);
}

void line_editor_add_history(LineEditor *le, const char *line) { line_history_add(&le->hist, line); }
