/* process_grid.c — the start-up of P stages of N processes each
 * (parallel/process_grid.h). */
#include "parallel/process_grid.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/peer_io.h"
#include "parallel/placement.h"
#include "parallel/rendezvous.h"

/* "ADDR:PORT" of fd's far end, port as given. */
static int peer_address(int fd, int port, char *out, size_t cap, Err *err) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    char host[72]; /* a numeric address */
    if (getpeername(fd, (struct sockaddr *)&a, &len) ||
        getnameinfo((struct sockaddr *)&a, len, host, sizeof host, NULL, 0, NI_NUMERICHOST))
        return err_set(err, "process grid: cannot read a connection's address");
    snprintf(out, cap, "%s:%d", host, port);
    return 0;
}

/* World rank w's rank in the first rendezvous (the driver's is 0). */
static int meet_rank(const ProcessGrid *g, int w) { return (w + g->tp) % (g->stages * g->tp); }

/* The driver: every other process's group address; keeps the hubs' fds. */
static int tell_groups(ProcessGrid *g, int *fds, const char *host, int port, double timeout_s, Err *err) {
    int world = g->stages * g->tp, last = g->stages - 1;
    for (int w = 0; w < world; w++) {
        int k = meet_rank(g, w), s = w / g->tp, hub = meet_rank(g, s * g->tp);
        char addr[sizeof g->group_master], peer[64];
        if (k == 0) continue;
        snprintf(peer, sizeof peer, "stage %d's tensor-parallel rank %d's process", s, w % g->tp);
        /* the hub's address as the driver's connection to it sees it; for the driver's stage, --master's host */
        if (s == last) snprintf(addr, sizeof addr, "%s:%d", host, port + 1 + s);
        if ((s != last && peer_address(fds[hub], port + 1 + s, addr, sizeof addr, err)) ||
            peer_send(fds[k], addr, strlen(addr) + 1, timeout_s, peer, err))
            return -1;
    }
    snprintf(g->group_master, sizeof g->group_master, "%s:%d", host, port + 1 + last);
    for (int s = 0; s < last; s++) {
        g->hub_fd[s] = fds[meet_rank(g, s * g->tp)];
        fds[meet_rank(g, s * g->tp)] = -1;
    }
    return 0;
}

/* Another process: its group's address; a hub keeps the driver's fd. */
static int hear_group(ProcessGrid *g, int *fds, double timeout_s, Err *err) {
    void *buf = NULL;
    size_t cap = 0, len = 0;
    int rc = peer_recv(fds[0], &buf, &cap, &len, sizeof g->group_master, timeout_s, "the driving process", err);
    if (rc == 0 && (len < 2 || ((char *)buf)[len - 1]))
        rc = err_set(err, "the driving process sent a group address of %zu bytes", len);
    if (rc == 0) memcpy(g->group_master, buf, len);
    free(buf);
    if (rc == 0 && g->tp_rank == 0) g->driver_fd = fds[0], fds[0] = -1;
    return rc;
}

int process_grid_open(ProcessGrid *g, const char *master, int rank, int stages, int tp, void *blob, size_t len,
                      double timeout_s, Err *err) {
    int world = stages * tp, fds[PLACEMENT_MAX], port;
    char host[256];
    memset(g, 0, sizeof *g);
    g->stages = stages, g->tp = tp, g->rank = rank, g->stage = rank / tp, g->tp_rank = rank % tp, g->driver_fd = -1;
    for (int s = 0; s < STAGE_MAX; s++) g->hub_fd[s] = -1;
    if (stages < 2 || stages > STAGE_MAX || tp < 2 || world > PLACEMENT_MAX || rank < 0 || rank >= world)
        return err_set(err, "--pp %d --tp %d: rank %d of %d processes", stages, tp, rank, world);
    if (rendezvous_parse_master(master, host, sizeof host, &port, err)) return -1;
    if (port + stages > 65535)
        return err_set(err, "--master %s: the stages' groups meet at ports %d..%d (the port + 1 + stage); use a port "
                       "below %d", master, port + 1, port + stages, 65535 - stages);
    int me = meet_rank(g, rank);
    if (rendezvous_open(master, me, world, blob, len, (int)(timeout_s * 1000), fds, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "rank %d of %d (stage %d's tensor-parallel rank %d): the start-up rendezvous failed (the "
                       "driver, rank %d, listens at --master): %s", rank, world, g->stage, g->tp_rank,
                       process_grid_driver(stages, tp), why);
    }
    int rc = me == 0 ? tell_groups(g, fds, host, port, timeout_s, err) : hear_group(g, fds, timeout_s, err);
    for (int k = 0; k < world; k++)
        if (fds[k] >= 0) close(fds[k]);
    if (rc) {
        if (g->driver_fd >= 0) close(g->driver_fd);
        for (int s = 0; s < STAGE_MAX; s++)
            if (g->hub_fd[s] >= 0) close(g->hub_fd[s]);
    }
    return rc;
}
