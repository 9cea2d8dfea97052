/* test_placement.c — where `--pp P --tp N` puts its backends and how a
 * tensor-parallel group's ranks talk (parallel/placement.h): the --gpus
 * list read stage by stage, rank by rank; the default 0, 1, ...; the
 * refusals (a malformed list, too few or too many entries, a GPU the
 * machine lacks, fewer GPUs than ranks); each rank's share of its GPU; and
 * the transport: NCCL for ranks on GPUs of their own, the host group when
 * a GPU holds two ranks or another stage's backend (saying so), and
 * nothing said for CPU ranks. */
#include <string.h>

#include "parallel/placement.h"
#include "tests/test.h"

static bool same_ints(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static void test_lists(void) {
    int dev[PLACEMENT_MAX];
    Err err = {{0}};
    CHECK(placement_devices("3,1", 1, 2, 4, dev, &err) == 0 && dev[0] == 3 && dev[1] == 1, "%s", err.msg);
    CHECK(placement_devices("0,0,0,0", 1, 4, 1, dev, &err) == 0 && same_ints(dev, (int[]){0, 0, 0, 0}, 4), "%s",
          err.msg);
    /* --pp 2 --tp 2: stage 0's ranks, then stage 1's */
    CHECK(placement_devices("2,3,0,1", 2, 2, 4, dev, &err) == 0 && same_ints(dev, (int[]){2, 3, 0, 1}, 4), "%s",
          err.msg);
    /* the CPU: the list's form only */
    CHECK(placement_devices("7,9", 2, 1, 0, dev, &err) == 0 && dev[0] == 7 && dev[1] == 9, "%s", err.msg);
    /* no list: 0, 1, ... */
    CHECK(placement_devices(NULL, 2, 2, 4, dev, &err) == 0 && same_ints(dev, (int[]){0, 1, 2, 3}, 4), "%s", err.msg);
    CHECK(placement_devices(NULL, 3, 1, 1, dev, &err) == 0 && same_ints(dev, (int[]){0, 1, 2}, 3),
          "a pipeline alone keeps 0, 1, ...: %s", err.msg);
}

static void expect_refusal(const char *gpus, int stages, int tp, int n_gpus, const char *want) {
    int dev[PLACEMENT_MAX];
    Err err = {{0}};
    int rc = placement_devices(gpus, stages, tp, n_gpus, dev, &err);
    CHECK(rc == -1 && strstr(err.msg, want), "--gpus %s --pp %d --tp %d on %d GPUs: rc %d, '%s' (want '%s')",
          gpus ? gpus : "(none)", stages, tp, n_gpus, rc, err.msg, want);
}

static void test_refusals(void) {
    expect_refusal("0,x", 1, 2, 2, "--gpus '0,x': expected comma-separated device numbers such as 0,1");
    expect_refusal("0,-1", 1, 2, 2, "expected comma-separated device numbers");
    expect_refusal("0,", 1, 2, 2, "--gpus '0,': 1 of the 2 GPUs --tp 2 needs");
    expect_refusal("0", 1, 2, 2, "--gpus '0': 1 of the 2 GPUs --tp 2 needs (one per backend, stage by stage)");
    expect_refusal("0,1,2", 2, 2, 4, "--gpus '0,1,2': 3 of the 4 GPUs --pp 2 --tp 2 needs");
    expect_refusal("0,1,2", 1, 2, 4, "--gpus '0,1,2': more GPUs than the 2 backends of --tp 2");
    expect_refusal("0,1", 3, 1, 4, "2 of the 3 GPUs --pp 3 needs");
    expect_refusal("0,4", 1, 2, 4, "--gpus '0,4': GPU 4 asked for, this machine has 4 (0..3)");
    expect_refusal(NULL, 1, 2, 1, "--tp 2 needs 2 GPUs (one per rank), this machine has 1; --gpus 0,0 puts them all "
                                  "on GPU 0");
    expect_refusal(NULL, 2, 2, 2, "--pp 2 --tp 2 needs 4 GPUs (one per rank), this machine has 2; --gpus 0,0,0,0");
    expect_refusal("0,1", 0, 2, 2, "backends (1..");
}

static void test_transport(void) {
    TpPlacement p;
    int own[] = {0, 1, 2, 3};
    placement_group(own, 4, 0, 4, &p);
    CHECK(p.nccl && !p.why[0], "GPUs of their own: NCCL (%s)", p.why);
    CHECK(same_ints(p.devices, own, 4) && same_ints(p.gpu_share, (int[]){1, 1, 1, 1}, 4), "devices and shares");

    int one[] = {0, 0};
    placement_group(one, 2, 0, 2, &p);
    CHECK(!p.nccl && strstr(p.why, "--tp 2: GPU 0 holds ranks 0 and 1: the ranks exchange through host memory"),
          "'%s'", p.why);
    CHECK(same_ints(p.gpu_share, (int[]){2, 2}, 2), "two ranks on GPU 0 share it: %d %d", p.gpu_share[0],
          p.gpu_share[1]);

    int mixed[] = {1, 0, 1, 2};
    placement_group(mixed, 4, 0, 4, &p);
    CHECK(!p.nccl && strstr(p.why, "GPU 1 holds ranks 0 and 2"), "'%s'", p.why);

    /* --pp 2 --tp 2 --gpus 0,1,1,2: stage 0's rank 1 shares GPU 1 with stage 1's rank 0 */
    int pipe[] = {0, 1, 1, 2};
    placement_group(pipe, 4, 0, 2, &p);
    CHECK(!p.nccl && strstr(p.why, "GPU 1 also holds another stage's backend"), "stage 0: '%s'", p.why);
    CHECK(same_ints(p.gpu_share, (int[]){1, 2}, 2), "stage 0's shares: %d %d", p.gpu_share[0], p.gpu_share[1]);
    placement_group(pipe, 4, 2, 2, &p);
    CHECK(!p.nccl && same_ints(p.devices, (int[]){1, 2}, 2), "stage 1: GPUs 1, 2 (%s)", p.why);
    CHECK(same_ints(p.gpu_share, (int[]){1, 1}, 2), "stage 1 is the last made on GPU 1: shares %d %d",
          p.gpu_share[0], p.gpu_share[1]);

    int pp_own[] = {0, 1, 2, 3};
    placement_group(pp_own, 4, 2, 2, &p);
    CHECK(p.nccl && same_ints(p.devices, (int[]){2, 3}, 2), "stage 1 on GPUs 2, 3: NCCL");

    placement_same(-1, 4, &p);
    CHECK(!p.nccl && !p.why[0] && p.devices[3] == -1, "CPU ranks: the host group, nothing said");
    placement_same(0, 3, &p);
    CHECK(!p.nccl && p.why[0] && p.gpu_share[2] == 3, "three ranks on GPU 0: host memory, each a third");
}

int main(void) {
    RUN(test_lists);
    RUN(test_refusals);
    RUN(test_transport);
    TEST_EXIT();
}
