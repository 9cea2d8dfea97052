/* rendezvous.h — start-up of a multi-process run without MPI.
 *
 * With `--rank R --world-size N --master ADDR:PORT`, each process of a
 * pipeline must learn the same NCCL unique id before ncclCommInitRank. Rank 0
 * listens on ADDR:PORT and sends its blob to every other rank; each other rank
 * connects (retrying while rank 0 is not up yet) and receives it. Every wait
 * has a deadline, so a peer that never comes gives a clear error, not a hang.
 */
#ifndef CLLM_RENDEZVOUS_H
#define CLLM_RENDEZVOUS_H

#include <stddef.h>

#include "base/err.h"

#define RENDEZVOUS_MAX_BLOB 4096

/* Splits "host:port" (port 1..65535); host may be a name or an address. */
int rendezvous_parse_master(const char *master, char *host, size_t host_len, int *port, Err *err);

/* The same, keeping the connections open for the run's control messages:
 * rank 0 gets fds[r] connected to rank r (r = 1..world_size-1), another
 * rank fds[0] connected to rank 0; the others are -1. */
int rendezvous_open(const char *master, int rank, int world_size, void *blob, size_t len, int timeout_ms, int *fds,
                    Err *err);

#endif
