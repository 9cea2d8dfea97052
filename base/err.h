/* err.h — the one error style of cllm.
 *
 * A function that can fail returns 0 on success and -1 on failure, and fills
 * an Err the caller passed in with one line that names the file, the field and
 * the value that was wrong, and (where it helps) what to do about it. Nothing
 * below main.c prints errors or exits; main.c prints err.msg and exits 2 for a
 * user error.
 */
#ifndef CLLM_ERR_H
#define CLLM_ERR_H

#include <stdarg.h>
#include <stdio.h>

typedef struct {
    char msg[1024];
} Err;

/* Formats msg into err (err may be NULL). Always returns -1 so callers can
 * write `return err_set(err, "...")`. */
static inline int err_set(Err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline int err_set(Err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

#endif
