/* line_history.c — the chat prompt's history and its file (line_edit.h
 * LineHistory): one entry per line, backslash, newline and CR escaped. */
#include "app/line_edit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/line_bytes.h"

#define HISTORY_FILE_MAX (64u << 20)      /* a bigger history file is ignored */


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

