/* line_edit.h — the line editor behind the prompt of `cllm chat`.
 *
 * Three layers, each usable alone:
 *   - LineHistory: the list of past turns, loaded from and saved to a file
 *     (one entry per line; backslash, newline and CR escaped as \\ \n \r).
 *   - LineCore: the editing state machine. It consumes the bytes a terminal
 *     sends (keys, escape sequences, bracketed paste) and keeps a buffer, a
 *     cursor and the lines already continued with a trailing backslash; it
 *     reports events (submit, continue, EOF, interrupt, ...). It never touches
 *     a file descriptor, so tests drive it with byte strings.
 *   - LineEditor: the terminal side. On a terminal it switches to raw mode,
 *     enables bracketed paste, draws the prompt and the buffer (wrapping rows
 *     longer than the terminal width) and feeds keys to a LineCore. On
 *     anything else (a pipe, a file, or TERM=dumb) it reads plain lines with
 *     no escape codes at all.
 * No globals: the chat loop owns SIGINT; in raw mode Ctrl-C arrives as a byte.
 */
#ifndef CLLM_LINE_EDIT_H
#define CLLM_LINE_EDIT_H

#include <stddef.h>

#include "base/err.h"

/* ---- the terminal-facing editor ---- */

typedef enum { LINE_OK, LINE_EOF, LINE_INTERRUPT, LINE_ERROR } LineResult;

typedef struct LineEditor LineEditor;

/* history_path may be NULL (no file). history_max >= 0 entries are kept in
 * memory (0: no history). A missing, unreadable or corrupt history file is
 * not an error (bad lines are skipped). Returns NULL with err set on a bad
 * argument or when out of memory. */
LineEditor *line_editor_create(int in_fd, int out_fd, const char *history_path, int history_max,
                               Err *err);

/* Restores the terminal if it is still raw, saves the history to its file
 * (creating the missing folder; failures are silent) and frees everything. */
void line_editor_destroy(LineEditor *le);

/* Reads one user turn. LINE_OK: *out is a malloc'd string (caller frees)
 * with the lines of the turn joined by '\n'. LINE_EOF: Ctrl-D at an empty
 * line, or end of input with nothing pending (a last line without a newline
 * is returned first; Ctrl-D on the empty line after a backslash ends the
 * turn, LINE_OK). LINE_INTERRUPT: Ctrl-C, or a signal interrupted the
 * read (EINTR); the line is discarded. LINE_ERROR: err says why. The terminal
 * mode is restored before every return. continuation_prompt may be NULL
 * (then prompt is used). Bytes read past the end of the turn are kept for the
 * next call. NUL bytes in the input are dropped (line_editor_nul_bytes
 * counts them, so the caller can refuse a turn that is not what was sent). */
LineResult line_editor_read(LineEditor *le, const char *prompt, const char *continuation_prompt,
                            char **out, Err *err);

/* NUL bytes dropped from the turn of the last line_editor_read (pipes and
 * files; a NUL typed at a terminal is an unbound key). */
size_t line_editor_nul_bytes(const LineEditor *le);

/* Adds a turn to the in-memory history (not when it equals the newest entry
 * or is empty); the oldest entry goes when history_max is reached. */
void line_editor_add_history(LineEditor *le, const char *line);

/* ---- history ---- */

typedef struct {
    char **items; /* [n] malloc'd entries, oldest first; cap slots allocated */
    int n, cap, max;
} LineHistory;

void line_history_init(LineHistory *h, int max);
void line_history_free(LineHistory *h);
/* Returns 0, or -1 when out of memory. Empty lines and repeats of the newest
 * entry are not added (and return 0). */
int line_history_add(LineHistory *h, const char *line);
/* Loads entries from path, appending them through line_history_add. A
 * missing or unreadable file loads nothing; malformed lines (bad escape,
 * NUL byte) are skipped; a file over 64 MiB is ignored. Returns the number
 * of entries loaded. */
int line_history_load(LineHistory *h, const char *path);
/* Writes all entries to path (through a temporary file and rename), creating
 * missing folders (mode 0700). Returns 0, or -1 with err set. */
int line_history_save(const LineHistory *h, const char *path, Err *err);

/* ---- the editing state machine ---- */

typedef enum {
    LINE_EV_NONE,      /* byte consumed; buffer or cursor may have changed */
    LINE_EV_SUBMIT,    /* Enter on a line not ending in '\\': take the turn */
    LINE_EV_CONTINUE,  /* Enter after a trailing '\\': a new line began */
    LINE_EV_EOF,       /* Ctrl-D on an empty turn */
    LINE_EV_INTERRUPT, /* Ctrl-C: the turn was discarded */
    LINE_EV_CLEAR,     /* Ctrl-L: the screen should be cleared */
    LINE_EV_SUSPEND,   /* Ctrl-Z: the process should stop itself */
    LINE_EV_ERROR      /* out of memory; the byte was lost */
} LineEvent;

typedef struct LineCore LineCore;

/* history may be NULL; it is read (never changed) by up/down. */
LineCore *line_core_create(const LineHistory *history);
void line_core_destroy(LineCore *c);
/* Starts a new turn: empty buffer, no continued lines, history at the
 * newest position, no escape sequence or paste in progress. */
void line_core_reset(LineCore *c);
LineEvent line_core_feed(LineCore *c, unsigned char byte);
/* Feeds bytes until one produces an event other than LINE_EV_NONE; returns
 * it and sets *used to the bytes consumed (including that one). */
LineEvent line_core_feed_bytes(LineCore *c, const void *bytes, size_t n, size_t *used);
/* The input went quiet in the middle of an escape sequence (a lone Esc key):
 * drop the partial sequence. Returns 1 when one was pending. */
int line_core_timeout(LineCore *c);
int line_core_escape_pending(const LineCore *c);

/* The line being edited (not NUL-terminated in general) and the cursor, a
 * byte offset at a code-point boundary (an invalid byte counts as one). */
const char *line_core_line(const LineCore *c, size_t *len);
size_t line_core_cursor(const LineCore *c);
/* 1 when earlier lines of this turn were continued with '\\'. */
int line_core_continued(const LineCore *c);
/* After LINE_EV_CONTINUE: the line just continued, without its backslash
 * (the renderer shows it once more, as typed, before the new row). */
const char *line_core_last_continued(const LineCore *c, size_t *len);
/* After LINE_EV_SUBMIT: the whole turn (continued lines + this line) as a
 * malloc'd string; NULL when out of memory. Does not reset. */
char *line_core_take_text(LineCore *c);

/* ---- text measure (shared with the renderer and the tests) ---- */

/* Length of the code point at s[i] (1..4), or 1 for a byte that does not
 * start a valid, shortest-form UTF-8 sequence; *cp gets the code point or
 * -1 for such a byte. Requires i < len. */
int line_utf8_unit(const char *s, size_t len, size_t i, long *cp);
/* Terminal columns of a code point: 2 for East Asian wide and emoji, 0 for
 * combining marks and zero-width characters, else 1. */
int line_cp_width(long cp);

#endif
