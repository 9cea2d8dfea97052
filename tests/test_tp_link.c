/* test_tp_link.c — a tensor-parallel group's collectives between processes
 * (parallel/tp_link.c), ranks as threads over socket pairs: the all-reduce
 * and all-gather of 2 and 4 ranks give the bits of the one-process host
 * group (kernels/tp_group.c); a peer that closes, one that stays silent
 * past the deadline, a rank that aborts, and ranks that disagree on the
 * counts each fail with an error naming the rank, never a hang. */
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "parallel/tp_link.h"
#include "tests/test.h"

#define N_VALS 1001
#define ROWS 3

typedef struct {
    TpGroup *g;
    int rank, n;
    float sum[N_VALS];              /* after the all-reduce */
    float gathered[ROWS * 64];      /* after the all-gather: rank r gives r + 2 columns */
} RankRun;

static float value(int rank, int i) { return (float)((rank * 7919 + i * 104729) % 2003) / 97.0f - 10.3f; }

static void *run_rank(void *arg) {
    RankRun *rr = arg;
    for (int i = 0; i < N_VALS; i++) rr->sum[i] = value(rr->rank, i);
    tp_group_all_reduce_f32(rr->g, rr->rank, rr->sum, N_VALS);
    float src[ROWS * 32];
    int cols = rr->rank + 2;
    for (int i = 0; i < ROWS * cols; i++) src[i] = value(rr->rank + 100, i);
    tp_group_all_gather_f32(rr->g, rr->rank, rr->gathered, src, ROWS, cols);
    return NULL;
}

static void run_all(RankRun *rr, int n) {
    pthread_t th[TP_GROUP_MAX];
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, run_rank, &rr[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

/* Rank 0 the hub: fds[r][...] as each rank's tp_link_open takes them. */
static void make_star(int n, int fds[][TP_GROUP_MAX]) {
    for (int r = 0; r < n; r++)
        for (int k = 0; k < n; k++) fds[r][k] = -1;
    for (int r = 1; r < n; r++) {
        int sv[2];
        socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        fds[0][r] = sv[0], fds[r][0] = sv[1];
    }
}

static void close_star(int n, int fds[][TP_GROUP_MAX]) {
    for (int r = 0; r < n; r++)
        for (int k = 0; k < n; k++)
            if (fds[r][k] >= 0) close(fds[r][k]);
}

static void check_same_bits(int n) {
    static RankRun host[TP_GROUP_MAX], linked[TP_GROUP_MAX];
    Err err = {{0}};
    TpGroup *g = tp_group_create(n, &err);
    for (int r = 0; r < n; r++) host[r] = (RankRun){.g = g, .rank = r, .n = n};
    run_all(host, n);
    int fds[TP_GROUP_MAX][TP_GROUP_MAX];
    make_star(n, fds);
    TpLink *links[TP_GROUP_MAX];
    for (int r = 0; r < n; r++) {
        links[r] = tp_link_open(r, n, fds[r], 10.0, &err);
        TpGroupLink ops = tp_link_ops(links[r]);
        linked[r] = (RankRun){.g = tp_group_create_linked(n, &ops, &err), .rank = r, .n = n};
    }
    run_all(linked, n);
    int width = 0;
    for (int r = 0; r < n; r++) width += r + 2;
    for (int r = 0; r < n; r++) {
        CHECK(!tp_group_broken(linked[r].g), "--tp %d rank %d: %s", n, r, tp_link_error(links[r]));
        CHECK(!memcmp(linked[r].sum, host[0].sum, sizeof host[0].sum), "--tp %d rank %d: the sum's bits differ", n, r);
        CHECK(!memcmp(linked[r].gathered, host[0].gathered, (size_t)(ROWS * width) * sizeof(float)),
              "--tp %d rank %d: the gathered rows differ", n, r);
        tp_group_free(linked[r].g);
        tp_link_free(links[r]);
    }
    float s0 = value(0, 5);
    for (int r = 1; r < n; r++) s0 += value(r, 5);
    CHECK(host[0].sum[5] == s0, "the host group sums in rank order: %g vs %g", host[0].sum[5], s0);
    tp_group_free(g);
    close_star(n, fds);
}

static void test_same_bits(void) {
    check_same_bits(2);
    check_same_bits(4);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Rank 0 of 2 reduces while rank 1 does `what`: rank 0's group breaks within
 * the deadline, its error holding want (stage >= 0: the link names the
 * peers as that pipeline stage's, tp_link_name_stage). */
typedef enum { PEER_CLOSES, PEER_SILENT, PEER_ABORTS, PEER_OTHER_COUNT } PeerFault;

static void check_fault(PeerFault what, double timeout_s, const char *want, int stage) {
    int fds[TP_GROUP_MAX][TP_GROUP_MAX];
    make_star(2, fds);
    Err err = {{0}};
    TpLink *l0 = tp_link_open(0, 2, fds[0], timeout_s, &err), *l1 = tp_link_open(1, 2, fds[1], timeout_s, &err);
    if (stage >= 0) tp_link_name_stage(l0, stage);
    TpGroupLink o0 = tp_link_ops(l0), o1 = tp_link_ops(l1);
    TpGroup *g0 = tp_group_create_linked(2, &o0, &err), *g1 = tp_group_create_linked(2, &o1, &err);
    if (what == PEER_CLOSES) { close(fds[1][0]); fds[1][0] = -1; }
    if (what == PEER_ABORTS) tp_group_abort(g1);
    pthread_t th;
    static RankRun other;
    float buf[N_VALS] = {0};
    other = (RankRun){.g = g1, .rank = 1, .n = 2};
    if (what == PEER_OTHER_COUNT) pthread_create(&th, NULL, run_rank, &other); /* N_VALS values, rank 0 7 */
    double t0 = now_s();
    tp_group_all_reduce_f32(g0, 0, buf, what == PEER_OTHER_COUNT ? 7 : N_VALS);
    double took = now_s() - t0;
    CHECK(tp_group_broken(g0), "fault %d: rank 0's group is broken", (int)what);
    CHECK(strstr(tp_link_error(l0), want), "fault %d: '%s' lacks '%s'", (int)what, tp_link_error(l0), want);
    CHECK(took < timeout_s + 2, "fault %d: %.1f s (deadline %.1f s)", (int)what, took, timeout_s);
    if (what == PEER_OTHER_COUNT) { tp_group_abort(g0); pthread_join(th, NULL); }
    tp_group_free(g0), tp_group_free(g1);
    tp_link_free(l0), tp_link_free(l1);
    close_star(2, fds);
}

static void test_faults(void) {
    check_fault(PEER_CLOSES, 30, "tensor-parallel rank 1 closed the connection", -1);
    check_fault(PEER_ABORTS, 30, "tensor-parallel rank 1 closed the connection", -1);
    check_fault(PEER_SILENT, 0.3, "tensor-parallel rank 1: no answer within", -1);
    check_fault(PEER_OTHER_COUNT, 30, "tensor-parallel rank 1: an all-reduce of 1001 x 0, rank 0's of 7 x 0", -1);
    /* a pipeline stage's group of processes (--pp P --tp N as processes) */
    check_fault(PEER_CLOSES, 30, "stage 1's tensor-parallel rank 1 closed the connection", 1);
    check_fault(PEER_SILENT, 0.3, "stage 2's tensor-parallel rank 1: no answer within", 2);
    check_fault(PEER_OTHER_COUNT, 30, "stage 0's tensor-parallel rank 1: an all-reduce of 1001 x 0, rank 0's of 7 x 0",
                0);
}

static void test_refusals(void) {
    Err err = {{0}};
    int fds[2] = {-1, -1};
    CHECK(!tp_link_open(0, 2, fds, 1, &err) && strstr(err.msg, "rank 0 has no connection to rank 1"), "%s", err.msg);
    CHECK(!tp_link_open(2, 2, fds, 1, &err) && strstr(err.msg, "rank 2 of 2"), "%s", err.msg);
    TpGroupLink none = {0};
    CHECK(!tp_group_create_linked(2, &none, &err) && strstr(err.msg, "a link without"), "%s", err.msg);
}

int main(void) {
    RUN(test_same_bits);
    RUN(test_faults);
    RUN(test_refusals);
    return test_failed_tests ? 1 : 0;
}
