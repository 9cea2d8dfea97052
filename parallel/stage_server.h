/* stage_server.h — a pipeline stage in a process of its own (the
 * multi-process start-up: one process per GPU, e.g. under mpirun).
 *
 * The process of the last stage drives (parallel/pipeline.h, remote mode):
 * it sends every other stage each step (parallel/step_msg.h) over the
 * connection the rendezvous left open. A stage server says hello (its KV
 * blocks and block size), then for each step receives the hidden state from
 * the stage before (NCCL), runs its layers, passes its output on (NCCL, or
 * for CPU stages of a 2-process run over the connection to the driver),
 * until the driver says stop or goes away. */
#ifndef CLLM_STAGE_SERVER_H
#define CLLM_STAGE_SERVER_H

#include "kernels/backend.h"
#include "model/config.h"
#include "parallel/tp_process.h"

/* stage (0 .. n_stages-2) of n_stages on backend be with the stage's
 * config; fd: the connection to the driver. group: with --pp P --tp N as
 * processes, the stage's group of processes, this one its rank 0 (be its
 * backend, cfg its rank's config; each step runs on every rank, the hello
 * says the group's fewest KV blocks), else NULL. Returns 0 when told to stop. */
int stage_serve(Backend *be, const ModelConfig *cfg, int stage, int n_stages, int fd, int max_tokens, TpProcess *group,
                Err *err);

#endif
