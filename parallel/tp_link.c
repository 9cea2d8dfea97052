/* tp_link.c — a tensor-parallel group's all-reduce and all-gather between
 * processes, rank 0 the hub (parallel/tp_link.h). */
#include "parallel/tp_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "parallel/peer_io.h"

struct TpLink {
    int rank, n;
    int stage;                  /* >= 0: the pipeline stage whose group this is (in the peers' names) */
    int fds[TP_GROUP_MAX];
    double timeout_s;
    float *parts;               /* rank 0: the other ranks' buffers, one after another */
    size_t cap;                 /* bytes of parts */
    Err err;                    /* the first failure */
};

TpLink *tp_link_open(int rank, int n_ranks, const int *fds, double timeout_s, Err *err) {
    if (n_ranks < 2 || n_ranks > TP_GROUP_MAX || rank < 0 || rank >= n_ranks)
        return err_set(err, "tensor-parallel link: rank %d of %d (2..%d ranks)", rank, n_ranks, TP_GROUP_MAX), NULL;
    for (int r = 0; r < n_ranks; r++)
        if ((rank == 0 ? r > 0 : r == 0) && fds[r] < 0)
            return err_set(err, "tensor-parallel link: rank %d has no connection to rank %d", rank, r), NULL;
    TpLink *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, "out of memory"), NULL;
    l->rank = rank, l->n = n_ranks, l->timeout_s = timeout_s, l->stage = -1;
    for (int r = 0; r < n_ranks; r++) {
        l->fds[r] = fds[r];
        int one = 1; /* each op is a few small writes then a wait: Nagle would hold them back (not a TCP socket: ignored) */
        if (fds[r] >= 0) setsockopt(fds[r], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return l;
}

void tp_link_free(TpLink *l) {
    if (!l) return;
    free(l->parts);
    free(l);
}

const char *tp_link_error(const TpLink *l) { return l->err.msg; }

void tp_link_name_stage(TpLink *l, int stage) { l->stage = stage; }

/* The first failure stays: later ones follow from it. */
static int failed(TpLink *l, const Err *e) {
    if (!l->err.msg[0]) l->err = *e;
    return -1;
}

static const char *peer_name(const TpLink *l, char *buf, size_t cap, int r) {
    if (l->stage >= 0) snprintf(buf, cap, "stage %d's tensor-parallel rank %d", l->stage, r);
    else snprintf(buf, cap, "tensor-parallel rank %d", r);
    return buf;
}

static int send_to(TpLink *l, int r, const void *buf, size_t n, Err *e) {
    char peer[64];
    return peer_write(l->fds[r], buf, n, l->timeout_s, peer_name(l, peer, sizeof peer, r), e);
}

static int recv_from(TpLink *l, int r, void *buf, size_t n, Err *e) {
    char peer[64];
    return peer_read(l->fds[r], buf, n, l->timeout_s, peer_name(l, peer, sizeof peer, r), e);
}

static int grow_parts(TpLink *l, size_t bytes, Err *e) {
    if (bytes <= l->cap) return 0;
    float *p = realloc(l->parts, bytes);
    if (!p) return err_set(e, "tensor-parallel link: out of memory for %zu bytes", bytes);
    l->parts = p, l->cap = bytes;
    return 0;
}

/* Rank 0: rank r's rows (or values) must be ours; its columns its own. */
static int check_counts(const TpLink *l, int r, const int64_t got[2], const int64_t want[2], const char *what, Err *e) {
    char peer[64];
    if (got[0] == want[0] && got[1] >= 0 && got[1] <= (int64_t)1 << 32) return 0;
    return err_set(e, "%s: %s of %lld x %lld, rank 0's of %lld x %lld (the ranks run different steps)",
                   peer_name(l, peer, sizeof peer, r), what, (long long)got[0], (long long)got[1], (long long)want[0],
                   (long long)want[1]);
}

static int link_all_reduce(void *ctx, float *buf, int64_t n) {
    TpLink *l = ctx;
    Err e = {{0}};
    size_t bytes = (size_t)n * sizeof(float);
    int64_t head[2] = {n, 0};
    if (l->rank > 0) {
        if (send_to(l, 0, head, sizeof head, &e) || send_to(l, 0, buf, bytes, &e) || recv_from(l, 0, buf, bytes, &e))
            return failed(l, &e);
        return 0;
    }
    if (grow_parts(l, bytes * (size_t)(l->n - 1), &e)) return failed(l, &e);
    for (int r = 1; r < l->n; r++) {
        int64_t got[2];
        if (recv_from(l, r, got, sizeof got, &e) || check_counts(l, r, got, head, "an all-reduce", &e) ||
            recv_from(l, r, l->parts + (size_t)(r - 1) * (size_t)n, bytes, &e))
            return failed(l, &e);
    }
    for (int64_t i = 0; i < n; i++) { /* rank order, as tp_group.c sums */
        float s = buf[i];
        for (int k = 1; k < l->n; k++) s += l->parts[(size_t)(k - 1) * (size_t)n + (size_t)i];
        buf[i] = s;
    }
    for (int r = 1; r < l->n; r++)
        if (send_to(l, r, buf, bytes, &e)) return failed(l, &e);
    return 0;
}

static int link_all_gather(void *ctx, float *dst, const float *src, int64_t rows, int64_t cols) {
    TpLink *l = ctx;
    Err e = {{0}};
    int64_t head[2] = {rows, cols}, width = cols, col0[TP_GROUP_MAX] = {0}, ncols[TP_GROUP_MAX] = {cols};
    if (l->rank > 0) {
        if (send_to(l, 0, head, sizeof head, &e) || send_to(l, 0, src, (size_t)(rows * cols) * sizeof(float), &e) ||
            recv_from(l, 0, &width, sizeof width, &e) || recv_from(l, 0, dst, (size_t)(rows * width) * sizeof(float), &e))
            return failed(l, &e);
        return 0;
    }
    size_t at = 0;
    for (int r = 1; r < l->n; r++) { /* each rank's [rows][cols] after the one before's */
        int64_t got[2];
        if (recv_from(l, r, got, sizeof got, &e) || check_counts(l, r, got, head, "an all-gather", &e) ||
            grow_parts(l, (at + (size_t)(rows * got[1])) * sizeof(float), &e) ||
            recv_from(l, r, l->parts + at, (size_t)(rows * got[1]) * sizeof(float), &e))
            return failed(l, &e);
        col0[r] = (int64_t)at, ncols[r] = got[1];
        at += (size_t)(rows * got[1]);
        width += got[1];
    }
    for (int64_t i = 0; i < rows; i++) {
        float *row = dst + i * width;
        memcpy(row, src + i * cols, (size_t)cols * sizeof(float));
        int64_t c = cols;
        for (int r = 1; r < l->n; r++) {
            memcpy(row + c, l->parts + col0[r] + i * ncols[r], (size_t)ncols[r] * sizeof(float));
            c += ncols[r];
        }
    }
    for (int r = 1; r < l->n; r++)
        if (send_to(l, r, &width, sizeof width, &e) || send_to(l, r, dst, (size_t)(rows * width) * sizeof(float), &e))
            return failed(l, &e);
    return 0;
}

/* A rank that broke: shut its connections so the peers' waits end now. */
static void link_abort(void *ctx) {
    TpLink *l = ctx;
    for (int r = 0; r < l->n; r++)
        if (r != l->rank && l->fds[r] >= 0) shutdown(l->fds[r], SHUT_RDWR);
}

TpGroupLink tp_link_ops(TpLink *l) {
    return (TpGroupLink){.ctx = l, .all_reduce_f32 = link_all_reduce, .all_gather_f32 = link_all_gather,
                         .abort = link_abort};
}
