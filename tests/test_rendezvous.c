/* test_rendezvous.c — the TCP start-up of multi-process runs
 * (parallel/rendezvous.c): ranks as threads on 127.0.0.1, peers that start
 * before rank 0, a rank that never comes, a foreign program on the port, and
 * bad --master values. */
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/rendezvous.h"
#include "tests/test.h"

/* A port that was free a moment ago. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &n);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct {
    char master[64];
    int rank, world, timeout_ms, delay_ms, rc;
    unsigned char blob[128];
    Err err;
} Rank;

static void *rank_main(void *arg) {
    Rank *r = arg;
    usleep(r->delay_ms * 1000);
    r->rc = rendezvous_open(r->master, r->rank, r->world, r->blob, sizeof r->blob, r->timeout_ms, NULL, &r->err);
    return NULL;
}

static void run_ranks(Rank *ranks, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* Fills n rank records of a world of `world` ranks (n may be less). */
static void setup(Rank *ranks, int n, int world, int port, int timeout_ms) {
    for (int i = 0; i < n; i++) {
        memset(&ranks[i], 0, sizeof ranks[i]);
        snprintf(ranks[i].master, sizeof ranks[i].master, "127.0.0.1:%d", port);
        ranks[i].rank = i;
        ranks[i].world = world;
        ranks[i].timeout_ms = timeout_ms;
        for (int b = 0; b < 128; b++) ranks[i].blob[b] = i == 0 ? (unsigned char)(b * 7 + 3) : 0xEE;
    }
}

static void test_share(void) {
    Rank ranks[4];
    setup(ranks, 4, 4, free_port(), 5000);
    ranks[0].delay_ms = 300; /* the peers start first and must retry */
    run_ranks(ranks, 4);
    for (int i = 0; i < 4; i++) {
        CHECK(ranks[i].rc == 0, "rank %d: %s", i, ranks[i].err.msg);
        CHECK(!memcmp(ranks[i].blob, ranks[0].blob, 128), "rank %d received other bytes", i);
    }
}

static void test_missing_rank(void) {
    Rank ranks[3];
    setup(ranks, 3, 3, free_port(), 600);
    run_ranks(ranks, 2); /* rank 2 never starts */
    CHECK(ranks[0].rc != 0 && strstr(ranks[0].err.msg, "ranks 2 did not connect"), "rank 0: rc %d '%s'", ranks[0].rc,
          ranks[0].err.msg);
    CHECK(ranks[1].rc == 0, "rank 1: %s", ranks[1].err.msg);
}

static void test_no_master(void) {
    Rank r;
    setup(&r, 1, 2, free_port(), 400);
    r.rank = 1;
    rank_main(&r);
    CHECK(r.rc != 0 && strstr(r.err.msg, "could not reach rank 0"), "rc %d '%s'", r.rc, r.err.msg);
}

/* Something else listens on the port and answers garbage. */
static void *foreign_server(void *arg) {
    int port = *(int *)arg, fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    listen(fd, 4);
    int c = accept(fd, NULL, NULL);
    char junk[16];
    if (recv(c, junk, sizeof junk, 0) > 0) send(c, "HTTP/1.1 400\r\n\r\n", 17, MSG_NOSIGNAL);
    usleep(100000);
    close(c);
    close(fd);
    return NULL;
}

static void test_foreign_peer(void) {
    int port = free_port();
    pthread_t th;
    pthread_create(&th, NULL, foreign_server, &port);
    usleep(100000);
    Rank r;
    setup(&r, 1, 2, port, 2000);
    r.rank = 1;
    rank_main(&r);
    pthread_join(th, NULL);
    CHECK(r.rc != 0 && strstr(r.err.msg, "something else"), "rc %d '%s'", r.rc, r.err.msg);
}

static void test_bad_master(void) {
    static const char *BAD[] = {"", "localhost", ":80", "host:", "host:0", "host:65536", "host:12x", NULL};
    for (int i = 0; BAD[i]; i++) {
        unsigned char blob[8] = {0};
        Err err = {""};
        int rc = rendezvous_open(BAD[i], 1, 2, blob, sizeof blob, 100, NULL, &err);
        CHECK(rc != 0 && strstr(err.msg, "--master"), "'%s': rc %d '%s'", BAD[i], rc, err.msg);
    }
    unsigned char blob[8];
    Err err = {""};
    CHECK(rendezvous_open("127.0.0.1:9", 2, 2, blob, sizeof blob, 100, NULL, &err) != 0 && strstr(err.msg, "--rank"),
          "rank outside the world: '%s'", err.msg);
}

int main(void) {
    RUN(test_share);
    RUN(test_missing_rank);
    RUN(test_no_master);
    RUN(test_foreign_peer);
    RUN(test_bad_master);
    return test_failed_tests != 0;
}
