/* line_edit.h — reading user turns for `cllm chat`.
 *
 * On a terminal: a small line editor in raw mode (cursor keys by UTF-8
 * character, Home/End, Backspace/Delete, Ctrl-A/E/U/K/W/L, history with
 * up/down kept in a file, a trailing backslash continues the turn on the next
 * line, a bracketed paste is taken whole with its newlines). Not a terminal:
 * one turn per input line (backslash continuation too), no escape codes. */
#ifndef CLLM_LINE_EDIT_H
#define CLLM_LINE_EDIT_H

#include "model/err.h"

typedef enum { LINE_OK, LINE_EOF, LINE_INTERRUPT, LINE_ERROR } LineResult;

typedef struct LineEditor LineEditor;

LineEditor *line_editor_create(int in_fd, int out_fd, const char *history_path, int history_max, Err *err);
void line_editor_destroy(LineEditor *le); /* saves the history */
/* LINE_OK: *out is a malloc'd turn (caller frees). LINE_EOF: Ctrl-D on an
 * empty line or end of input. LINE_INTERRUPT: Ctrl-C (the line is dropped). */
LineResult line_editor_read(LineEditor *le, const char *prompt, const char *continuation_prompt, char **out,
                            Err *err);
void line_editor_add_history(LineEditor *le, const char *line);

/* The editing core, without a terminal (for tests): feed bytes, read state. */
typedef struct {
    char *buf;
    size_t len, cap, cursor;  /* cursor: byte offset, on a character boundary */
} LineBuffer;
typedef enum { EDIT_CONTINUE, EDIT_SUBMIT, EDIT_EOF, EDIT_INTERRUPT } EditEvent;
EditEvent line_editor_feed(LineEditor *le, LineBuffer *lb, const unsigned char *bytes, size_t n, size_t *used);

#endif
