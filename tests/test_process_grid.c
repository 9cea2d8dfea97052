/* test_process_grid.c — the start-up of `--pp P --tp N --world-size P*N`
 * (parallel/process_grid.c): ranks as threads on 127.0.0.1. Each learns its
 * stage and rank (world rank s*N + t), the driver's blob, and its group's
 * meeting point (the hub's address, port + 1 + s), where the group's own
 * rendezvous then works; the driver holds a connection to every other
 * stage's hub; a missing rank fails the start-up by the deadline; a port
 * with no room for the groups is refused. */
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/process_grid.h"
#include "parallel/rendezvous.h"
#include "tests/test.h"

/* A port that was free a moment ago (with the 4 after it, as likely free). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &n);
    close(fd);
    return ntohs(a.sin_port) < 60000 ? ntohs(a.sin_port) : 40000;
}

typedef struct {
    char master[64];
    int rank, stages, tp, rc, group_rc, group_fds[16];
    double timeout_s;
    unsigned char blob[16];
    ProcessGrid g;
    Err err, group_err;
} Proc;

static void *proc_main(void *arg) {
    Proc *p = arg;
    p->rc = process_grid_open(&p->g, p->master, p->rank, p->stages, p->tp, p->blob, sizeof p->blob, p->timeout_s,
                              &p->err);
    if (p->rc) return NULL;
    unsigned char group_blob[4] = {1, 2, 3, 4};
    p->group_rc = rendezvous_open(p->g.group_master, p->g.tp_rank, p->tp, group_blob, sizeof group_blob, 5000,
                                  p->group_fds, &p->group_err);
    return NULL;
}

static void setup(Proc *procs, int stages, int tp, int port, double timeout_s) {
    int world = stages * tp;
    for (int w = 0; w < world; w++) {
        memset(&procs[w], 0, sizeof procs[w]);
        snprintf(procs[w].master, sizeof procs[w].master, "127.0.0.1:%d", port);
        procs[w].rank = w, procs[w].stages = stages, procs[w].tp = tp, procs[w].timeout_s = timeout_s;
        for (int b = 0; b < 16; b++)
            procs[w].blob[b] = w == process_grid_driver(stages, tp) ? (unsigned char)(b * 5 + 1) : 0xEE;
    }
}

static void run(Proc *procs, int n) {
    pthread_t th[16];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, proc_main, &procs[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void close_all(Proc *procs, int n) {
    for (int i = 0; i < n; i++) {
        if (procs[i].rc) continue;
        if (procs[i].g.driver_fd >= 0) close(procs[i].g.driver_fd);
        for (int s = 0; s < 8; s++)
            if (procs[i].g.hub_fd[s] >= 0) close(procs[i].g.hub_fd[s]);
        for (int r = 0; r < procs[i].tp && !procs[i].group_rc; r++)
            if (procs[i].group_fds[r] >= 0) close(procs[i].group_fds[r]);
    }
}

static void check_grid(int stages, int tp) {
    int world = stages * tp, port = free_port(), driver = process_grid_driver(stages, tp);
    Proc procs[16];
    setup(procs, stages, tp, port, 10);
    run(procs, world);
    for (int w = 0; w < world; w++) {
        Proc *p = &procs[w];
        char want[64];
        snprintf(want, sizeof want, "127.0.0.1:%d", port + 1 + w / tp);
        CHECK(p->rc == 0, "rank %d: %s", w, p->err.msg);
        if (p->rc) continue;
        CHECK(p->g.stage == w / tp && p->g.tp_rank == w % tp, "rank %d: stage %d rank %d", w, p->g.stage, p->g.tp_rank);
        CHECK(!memcmp(p->blob, procs[driver].blob, sizeof p->blob), "rank %d: not the driver's blob", w);
        CHECK(!strcmp(p->g.group_master, want), "rank %d: group at '%s', want '%s'", w, p->g.group_master, want);
        CHECK(p->group_rc == 0, "rank %d: the group's rendezvous: %s", w, p->group_err.msg);
        bool hub_before_last = w % tp == 0 && w != driver;
        CHECK((p->g.driver_fd >= 0) == hub_before_last, "rank %d: driver_fd %d", w, p->g.driver_fd);
        for (int s = 0; s < stages - 1; s++)
            CHECK((p->g.hub_fd[s] >= 0) == (w == driver), "rank %d: hub_fd[%d] %d", w, s, p->g.hub_fd[s]);
    }
    /* each hub's connection reaches the driver's hub_fd of its stage */
    for (int s = 0; s < stages - 1; s++) {
        Proc *hub = &procs[s * tp];
        unsigned char out = (unsigned char)(40 + s), in = 0;
        if (hub->rc || procs[driver].rc) continue;
        CHECK(send(hub->g.driver_fd, &out, 1, 0) == 1 && recv(procs[driver].g.hub_fd[s], &in, 1, 0) == 1 && in == out,
              "stage %d's hub: sent %d, the driver got %d", s, out, in);
    }
    close_all(procs, world);
}

static void test_pp2_tp2(void) { check_grid(2, 2); }
static void test_pp3_tp2(void) { check_grid(3, 2); }
static void test_pp2_tp4(void) { check_grid(2, 4); }

static void test_missing_rank(void) {
    Proc procs[4];
    setup(procs, 2, 2, free_port(), 1);
    pthread_t th[3];
    int who[3] = {0, 2, 3}; /* world rank 1 (stage 0's rank 1) never starts */
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, proc_main, &procs[who[i]]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(procs[2].rc != 0 && strstr(procs[2].err.msg, "rank 2 of 4 (stage 1's tensor-parallel rank 0)") &&
              strstr(procs[2].err.msg, "ranks 3 did not connect"), /* rendezvous rank (1 + 2) % 4 */
          "the driver: rc %d '%s'", procs[2].rc, procs[2].err.msg);
    close_all(procs, 4);
}

static void test_refused(void) {
    ProcessGrid g;
    unsigned char blob[4] = {0};
    Err err = {""};
    CHECK(process_grid_open(&g, "127.0.0.1:65534", 0, 2, 2, blob, sizeof blob, 1, &err) != 0 &&
              strstr(err.msg, "ports 65535..65536"), "'%s'", err.msg);
    CHECK(process_grid_open(&g, "127.0.0.1:9", 4, 2, 2, blob, sizeof blob, 1, &err) != 0 &&
              strstr(err.msg, "rank 4 of 4 processes"), "'%s'", err.msg);
    CHECK(process_grid_open(&g, "127.0.0.1:9", 0, 2, 1, blob, sizeof blob, 1, &err) != 0, "--tp 1 accepted");
}

int main(void) {
    RUN(test_pp2_tp2);
    RUN(test_pp3_tp2);
    RUN(test_pp2_tp4);
    RUN(test_missing_rank);
    RUN(test_refused);
    return test_failed_tests != 0;
}
