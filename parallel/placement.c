/* placement.c — the GPU of every backend and the transport of every
 * tensor-parallel group (parallel/placement.h). */
#include "parallel/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "--pp 2 --tp 2", "--tp 2", "--pp 2": the options that made the count. */
static const char *what_needs(char *buf, size_t cap, int stages, int tp) {
    if (stages > 1 && tp > 1) snprintf(buf, cap, "--pp %d --tp %d", stages, tp);
    else if (tp > 1) snprintf(buf, cap, "--tp %d", tp);
    else snprintf(buf, cap, "--pp %d", stages);
    return buf;
}

static int parse_list(const char *gpus, int n, int *dev, const char *what, Err *err) {
    const char *s = gpus;
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1023 || (*end && *end != ','))
            return err_set(err, "--gpus '%s': expected comma-separated device numbers such as 0,1", gpus);
        dev[i] = (int)v;
        s = *end ? end + 1 : end;
        if (i < n - 1 && !*s)
            return err_set(err, "--gpus '%s': %d of the %d GPUs %s needs (one per backend, stage by stage)", gpus, i + 1,
                           n, what);
    }
    if (*s) return err_set(err, "--gpus '%s': more GPUs than the %d backends of %s", gpus, n, what);
    return 0;
}

int placement_devices(const char *gpus, int stages, int tp, int n_gpus, int *dev, Err *err) {
    int n = stages * tp;
    char what[48];
    what_needs(what, sizeof what, stages, tp);
    if (stages < 1 || tp < 1 || n > PLACEMENT_MAX) return err_set(err, "%s: %d backends (1..%d)", what, n, PLACEMENT_MAX);
    if (gpus) {
        if (parse_list(gpus, n, dev, what, err)) return -1;
        for (int i = 0; n_gpus > 0 && i < n; i++)
            if (dev[i] >= n_gpus)
                return err_set(err, "--gpus '%s': GPU %d asked for, this machine has %d (0..%d)", gpus, dev[i], n_gpus,
                               n_gpus - 1);
        return 0;
    }
    for (int i = 0; i < n; i++) dev[i] = i;
    if (tp > 1 && n_gpus > 0 && n > n_gpus) {
        char list[2 * PLACEMENT_MAX + 1] = "";
        for (int i = 0; i < n && 2 * i + 2 < (int)sizeof list; i++) strcat(list, i ? ",0" : "0");
        return err_set(err, "%s needs %d GPUs (one per rank), this machine has %d; --gpus %s puts them all on GPU 0 "
                       "(they then exchange through host memory: slower, for tests), --cpu runs them on the CPU",
                       what, n, n_gpus, list);
    }
    return 0;
}

int placement_own_device(const char *gpus, int stages, int tp, int rank, Err *err) {
    int dev[PLACEMENT_MAX];
    if (gpus) return placement_devices(gpus, stages, tp, 0, dev, err) ? -1 : dev[rank];
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK", NULL};
    for (int i = 0; names[i]; i++)
        if (getenv(names[i]) && *getenv(names[i])) return atoi(getenv(names[i]));
    return rank;
}

void placement_group(const int *dev, int n_all, int first, int n, TpPlacement *p) {
    memset(p, 0, sizeof *p);
    p->nccl = true;
    for (int r = 0; r < n; r++) {
        int d = dev[first + r];
        p->devices[r] = d;
        for (int j = first; j < n_all; j++) p->gpu_share[r] += dev[j] == d;
        if (d < 0) p->nccl = false; /* CPU ranks: the host group, nothing to say */
    }
    for (int r = 0; r < n && p->nccl; r++) {
        int d = dev[first + r];
        for (int j = 0; j < n_all && p->nccl; j++) {
            if (j == first + r || dev[j] != d) continue;
            p->nccl = false;
            if (j >= first && j < first + n)
                snprintf(p->why, sizeof p->why, "--tp %d: GPU %d holds ranks %d and %d: the ranks exchange through host "
                         "memory (slower than NCCL, which needs a GPU per rank)", n, d, r < j - first ? r : j - first,
                         r < j - first ? j - first : r);
            else
                snprintf(p->why, sizeof p->why, "--tp %d: GPU %d also holds another stage's backend: the ranks exchange "
                         "through host memory (slower than NCCL, which needs a GPU per rank)", n, d);
        }
    }
}

void placement_same(int device, int n, TpPlacement *p) {
    int dev[TP_MAX];
    for (int r = 0; r < n && r < TP_MAX; r++) dev[r] = device;
    placement_group(dev, n, 0, n, p);
}
