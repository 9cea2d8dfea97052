/* peer_io.c — framed messages over a connected socket (peer_io.h). */
#include "parallel/peer_io.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int io_all(int fd, void *buf, size_t n, bool out, double timeout_s, const char *peer, Err *err) {
    char *p = buf;
    double deadline = timeout_s > 0 ? seconds_now() + timeout_s : 0;
    while (n > 0) {
        int wait_ms = -1;
        if (timeout_s > 0) {
            double left = deadline - seconds_now();
            if (left <= 0) return err_set(err, "%s: no answer within %.0f s", peer, timeout_s);
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd pfd = {fd, out ? POLLOUT : POLLIN, 0};
        int r = poll(&pfd, 1, wait_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return err_set(err, "%s: no answer within %.0f s", peer, timeout_s);
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k == 0) return err_set(err, "%s closed the connection (the process ended?)", peer);
        if (k < 0) return err_set(err, "%s: %s", peer, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int peer_write(int fd, const void *buf, size_t n, double timeout_s, const char *peer, Err *err) {
    return io_all(fd, (void *)buf, n, true, timeout_s, peer, err);
}

int peer_read(int fd, void *buf, size_t n, double timeout_s, const char *peer, Err *err) {
    return io_all(fd, buf, n, false, timeout_s, peer, err);
}

int peer_send(int fd, const void *buf, size_t len, double timeout_s, const char *peer, Err *err) {
    uint32_t n = (uint32_t)len;
    if (len > UINT32_MAX) return err_set(err, "%s: a %zu-byte message is too long", peer, len);
    return peer_write(fd, &n, 4, timeout_s, peer, err) || peer_write(fd, buf, len, timeout_s, peer, err);
}

int peer_recv(int fd, void **buf, size_t *cap, size_t *len, size_t max, double timeout_s, const char *peer, Err *err) {
    uint32_t n;
    if (peer_read(fd, &n, 4, timeout_s, peer, err)) return -1;
    if (n > max) return err_set(err, "%s sent a %u-byte message (at most %zu expected)", peer, n, max);
    if (n > *cap) {
        void *b = realloc(*buf, n);
        if (!b) return err_set(err, "out of memory for a %u-byte message", n);
        *buf = b;
        *cap = n;
    }
    *len = n;
    return peer_read(fd, *buf, n, timeout_s, peer, err);
}
