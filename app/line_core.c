/* line_core.c — the line editor's state machine (line_edit.h LineCore):
 * the bytes a terminal sends (keys, escape sequences, bracketed paste) in,
 * the edited buffer, its cursor and the turn's events out; and the UTF-8
 * units and column widths it moves over. It never touches a file
 * descriptor, so the tests drive it with byte strings. */
#include "app/line_edit.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app/line_bytes.h"

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

