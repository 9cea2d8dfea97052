/* rendezvous.c — the TCP exchange of rendezvous.h.
 *
 * Wire format, each direction one message: a peer sends "CLLM" + its rank
 * (uint32, network order) + the blob length it expects; rank 0 answers "CLLM"
 * + the blob. Anything else is a foreign or broken peer and is refused. */
#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char MAGIC[4] = {'C', 'L', 'L', 'M'};

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int rendezvous_parse_master(const char *master, char *host, size_t host_len, int *port, Err *err) {
    const char *colon = master ? strrchr(master, ':') : NULL;
    if (!colon || colon == master || (size_t)(colon - master) >= host_len)
        return err_set(err, "--master '%s': expected HOST:PORT", master ? master : "");
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 1 || p > 65535)
        return err_set(err, "--master '%s': port must be a number from 1 to 65535", master);
    memcpy(host, master, colon - master);
    host[colon - master] = 0;
    *port = (int)p;
    return 0;
}

/* Moves exactly n bytes, waiting at most until deadline. */
static int io_all(int fd, void *buf, size_t n, bool send_it, long long deadline) {
    char *p = buf;
    while (n > 0) {
        int left = (int)(deadline - now_ms());
        struct pollfd pfd = {fd, send_it ? POLLOUT : POLLIN, 0};
        if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
        ssize_t k = send_it ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int resolve(const char *host, int port, bool passive, struct addrinfo **res) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    return getaddrinfo(host, ps, &hints, res);
}

static int serve(const char *host, int port, int world, const void *blob, size_t len, long long deadline, int *fds,
                 Err *err) {
    struct addrinfo *ai;
    if (resolve(host, port, true, &ai)) return err_set(err, "--master %s:%d: cannot resolve the host", host, port);
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, world)) {
        int e = errno;
        freeaddrinfo(ai);
        if (fd >= 0) close(fd);
        return err_set(err, "--master %s:%d: rank 0 cannot listen there: %s", host, port, strerror(e));
    }
    freeaddrinfo(ai);
    bool *seen = calloc(world, 1);
    int n_seen = 1, rc = 0;
    while (seen && n_seen < world) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int left = (int)(deadline - now_ms());
        if (left <= 0 || poll(&pfd, 1, left) <= 0) break;
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        unsigned char hello[12];
        uint32_t r = 0, want = 0;
        if (io_all(c, hello, sizeof hello, false, deadline) == 0 && !memcmp(hello, MAGIC, 4)) {
            memcpy(&r, hello + 4, 4); memcpy(&want, hello + 8, 4);
            r = ntohl(r); want = ntohl(want);
        } else {
            r = 0; /* not one of ours: ignore it */
        }
        if (r >= 1 && (int)r < world && want == len && !seen[r] && io_all(c, (void *)MAGIC, 4, true, deadline) == 0 &&
            io_all(c, (void *)blob, len, true, deadline) == 0) {
            seen[r] = true;
            n_seen++;
            if (fds) { fds[r] = c; continue; }
        }
        close(c);
    }
    if (!seen) rc = err_set(err, "out of memory");
    else if (n_seen < world) {
        char missing[256] = "";
        for (int r = 1, off = 0; r < world && off < 200; r++)
            if (!seen[r]) off += snprintf(missing + off, sizeof missing - off, "%s%d", off ? "," : "", r);
        rc = err_set(err, "--master %s:%d: ranks %s did not connect before the deadline", host, port, missing);
    }
    free(seen);
    close(fd);
    if (rc && fds)
        for (int r = 1; r < world; r++)
            if (fds[r] >= 0) { close(fds[r]); fds[r] = -1; }
    return rc;
}

static int join(const char *host, int port, int rank, void *blob, size_t len, long long deadline, int *fds, Err *err) {
    while (now_ms() < deadline) {
        struct addrinfo *ai;
        if (resolve(host, port, false, &ai)) return err_set(err, "--master %s:%d: cannot resolve the host", host, port);
        int fd = socket(ai->ai_family, SOCK_STREAM, 0);
        int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        freeaddrinfo(ai);
        if (ok) {
            unsigned char hello[12], magic[4];
            uint32_t r = htonl((uint32_t)rank), n = htonl((uint32_t)len);
            memcpy(hello, MAGIC, 4); memcpy(hello + 4, &r, 4); memcpy(hello + 8, &n, 4);
            if (io_all(fd, hello, sizeof hello, true, deadline) == 0 && io_all(fd, magic, 4, false, deadline) == 0) {
                int got = !memcmp(magic, MAGIC, 4) && io_all(fd, blob, len, false, deadline) == 0;
                if (got && fds) { fds[0] = fd; return 0; }
                close(fd);
                if (got) return 0;
                return err_set(err, "--master %s:%d: rank 0 answered rank %d with something else (another program on that port?)",
                               host, port, rank);
            }
        }
        if (fd >= 0) close(fd);
        struct timespec pause = {0, 100 * 1000 * 1000}; /* rank 0 may not be up yet */
        nanosleep(&pause, NULL);
    }
    return err_set(err, "--master %s:%d: rank %d could not reach rank 0 before the deadline", host, port, rank);
}

int rendezvous_open(const char *master, int rank, int world_size, void *blob, size_t len, int timeout_ms, int *fds,
                    Err *err) {
    char host[256];
    int port;
    if (rendezvous_parse_master(master, host, sizeof host, &port, err)) return -1;
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return err_set(err, "--rank %d --world-size %d: the rank must be in [0, world size)", rank, world_size);
    if (len == 0 || len > RENDEZVOUS_MAX_BLOB) return err_set(err, "rendezvous: blob of %zu bytes", len);
    for (int r = 0; fds && r < world_size; r++) fds[r] = -1;
    long long deadline = now_ms() + timeout_ms;
    if (rank == 0) return world_size == 1 ? 0 : serve(host, port, world_size, blob, len, deadline, fds, err);
    return join(host, port, rank, blob, len, deadline, fds, err);
}

