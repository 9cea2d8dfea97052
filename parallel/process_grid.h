/* process_grid.h — `--pp P --tp N --world-size P*N`: which process is which,
 * and the start-up that connects them.
 *
 * World rank w is tensor-parallel rank w % N of pipeline stage w / N: the
 * order of the --gpus list and of `cllm info`'s placement (backend s*N + t),
 * so a process's GPU is its --gpus entry (or its local rank). Rank 0 of a
 * stage is the stage's hub: it alone talks to the other stages; the last
 * stage's hub (world rank (P-1)*N) drives the run (scheduler, sampling,
 * output), as the last rank does in a pipeline of processes.
 *
 * Start-up: every process meets the driver at --master (parallel/
 * rendezvous.h; its rendezvous rank is (w + N) % (P*N), so the driver is its
 * rank 0, and the link id the driver makes travels with it). The driver
 * then tells each process where its stage's group meets: the hub's address
 * as the driver's connection to it sees it (--master's host for the last
 * stage, the driver's), port PORT + 1 + s; the hub listens there for its
 * group's rendezvous (parallel/tp_process.h). The driver keeps its connections to the other
 * stages' hubs (the pipeline's step messages), a hub its connection to the
 * driver; every other start-up connection is closed.
 */
#ifndef CLLM_PROCESS_GRID_H
#define CLLM_PROCESS_GRID_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "parallel/stage_plan.h"

typedef struct {
    int stages, tp, rank;        /* P, N, this process's world rank */
    int stage, tp_rank;          /* rank / N, rank % N */
    char group_master[300];      /* ADDR:PORT where this stage's group meets (its hub listens) */
    int driver_fd;               /* a hub of a stage before the last: to the driver (else -1) */
    int hub_fd[STAGE_MAX];       /* the driver: hub_fd[s] to stage s's hub, s < P - 1 (else -1) */
} ProcessGrid;

/* The driver's world rank. */
static inline int process_grid_driver(int stages, int tp) { return (stages - 1) * tp; }

/* This process's place, its connections and its group's address; blob
 * (len bytes) is the driver's, received by every other process. The fds
 * left open are the caller's to close. */
int process_grid_open(ProcessGrid *g, const char *master, int rank, int stages, int tp, void *blob, size_t len,
                      double timeout_s, Err *err);

#endif
