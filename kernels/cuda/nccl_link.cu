/* nccl_link.cu — NCCL communicators, point-to-point transfers between
 * pipeline stages and the collectives of tensor-parallel ranks (see
 * nccl_link.h). NCCL is loaded at run time, by the
 * first call that needs it (cuda_libs.h): a group keeps its table. */
#include "kernels/cuda/nccl_link.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <nccl.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_libs.h"

#define MAX_RANKS 64

struct NcclGroup {
    const Nccl *nc;               /* the loaded library */
    int n;                        /* ranks */
    ncclComm_t comm[MAX_RANKS];   /* NULL for ranks of other processes */
    int device[MAX_RANKS];
    double timeout_s;
    bool aborted;
    bool peers;                   /* nccl_peer_open: every GPU of the group maps every other's memory */
    const void *peer_part[MAX_RANKS]; /* nccl_peer_register: each rank's part buffer and flag area */
    unsigned *peer_flags[MAX_RANKS];
};

#define NCCL_CHECK(nc, stmt, err)                                                                              \
    do {                                                                                                       \
        ncclResult_t r_ = (stmt);                                                                              \
        if (r_ != ncclSuccess)                                                                                 \
            return err_set((err), "NCCL error '%s' in %s at %s:%d", (nc)->GetErrorString(r_), #stmt, __FILE__, \
                           __LINE__);                                                                          \
    } while (0)

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

extern "C" NcclGroup *nccl_group_open(const int *devs, int n, double timeout_s, Err *err) {
    if (n < 2 || n > MAX_RANKS) { err_set(err, "nccl: %d ranks (2..%d)", n, MAX_RANKS); return NULL; }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j]) { err_set(err, "nccl: GPU %d given to two ranks", devs[i]); return NULL; }
    const Nccl *nc = nccl_lib(err);
    if (!nc) return NULL;
    NcclGroup *g = (NcclGroup *)calloc(1, sizeof *g);
    if (!g) { err_set(err, "out of memory"); return NULL; }
    g->nc = nc;
    g->n = n;
    g->timeout_s = timeout_s;
    memcpy(g->device, devs, n * sizeof *devs);
    ncclResult_t r = nc->CommInitAll(g->comm, n, devs);
    if (r != ncclSuccess) {
        err_set(err, "NCCL: cannot connect the stage GPUs: %s", nc->GetErrorString(r));
        free(g);
        return NULL;
    }
    return g;
}

extern "C" int nccl_unique_id(unsigned char id[CLLM_NCCL_ID_BYTES], Err *err) {
    const Nccl *nc = nccl_lib(err);
    if (!nc) return -1;
    ncclUniqueId u;
    static_assert(sizeof u == CLLM_NCCL_ID_BYTES, "ncclUniqueId size");
    NCCL_CHECK(nc, nc->GetUniqueId(&u), err);
    memcpy(id, &u, sizeof u);
    return 0;
}

extern "C" NcclGroup *nccl_group_join(const unsigned char id[CLLM_NCCL_ID_BYTES], int rank, int n, int device,
                                      double timeout_s, Err *err) {
    if (n < 2 || n > MAX_RANKS || rank < 0 || rank >= n) {
        err_set(err, "nccl: rank %d of %d", rank, n);
        return NULL;
    }
    const Nccl *nc = nccl_lib(err);
    if (!nc) return NULL;
    NcclGroup *g = (NcclGroup *)calloc(1, sizeof *g);
    if (!g) { err_set(err, "out of memory"); return NULL; }
    g->nc = nc;
    g->n = n;
    g->timeout_s = timeout_s;
    g->device[rank] = device;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    cudaError_t ce = cudaSetDevice(device);
    ncclResult_t r = ce == cudaSuccess ? nc->CommInitRank(&g->comm[rank], n, u, rank) : ncclInvalidUsage;
    if (r != ncclSuccess) {
        err_set(err, "NCCL: rank %d of %d cannot join on GPU %d: %s", rank, n, device,
                ce != cudaSuccess ? cudaGetErrorString(ce) : nc->GetErrorString(r));
        free(g);
        return NULL;
    }
    return g;
}

extern "C" void nccl_group_close(NcclGroup *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        if (!g->comm[i] || g->aborted) continue; /* aborted ones are gone */
        cudaSetDevice(g->device[i]);
        g->nc->CommDestroy(g->comm[i]);
    }
    free(g);
}

/* Peer access both ways between every pair of the group's GPUs (one
 * process: every rank's communicator is here), or false and none used.
 * Access NCCL enabled already counts; the calling thread's device is kept. */
extern "C" bool nccl_peer_open(NcclGroup *g) {
    if (g->n > TP_PEER_MAX_RANKS) return false;
    for (int i = 0; i < g->n; i++)
        if (!g->comm[i]) return false;
    int here = 0;
    if (cudaGetDevice(&here) != cudaSuccess) return false;
    bool ok = true;
    for (int i = 0; i < g->n && ok; i++)
        for (int j = 0; j < g->n && ok; j++) {
            int can = 0;
            if (i == j) continue;
            ok = cudaDeviceCanAccessPeer(&can, g->device[i], g->device[j]) == cudaSuccess && can &&
                 cudaSetDevice(g->device[i]) == cudaSuccess;
            cudaError_t e = ok ? cudaDeviceEnablePeerAccess(g->device[j], 0) : cudaSuccess;
            if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError(); /* clears it: not an error here */
            else ok = ok && e == cudaSuccess;
        }
    cudaSetDevice(here);
    g->peers = ok;
    return ok;
}

bool nccl_peer_register(NcclGroup *g, int rank, const void *part, unsigned *flags) {
    if (!g->peers || rank < 0 || rank >= g->n) return false;
    g->peer_part[rank] = part;
    g->peer_flags[rank] = flags;
    return true;
}

bool nccl_peer_table(const NcclGroup *g, int rank, TpPeers *p) {
    if (!g->peers) return false;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < g->n; i++) {
        if (!g->peer_part[i] || !g->peer_flags[i]) return false;
        p->part[i] = g->peer_part[i];
        p->flags[i] = g->peer_flags[i];
    }
    p->n_ranks = g->n;
    p->rank = rank;
    return true;
}

static int comm_of(NcclGroup *g, int rank, int peer, ncclComm_t *c, Err *err) {
    if (g->aborted) return err_set(err, "NCCL: the communicators were aborted after an earlier failure");
    if (rank < 0 || rank >= g->n || !g->comm[rank] || peer < 0 || peer >= g->n)
        return err_set(err, "NCCL: no link from rank %d to rank %d", rank, peer);
    *c = g->comm[rank];
    return 0;
}

int nccl_link_send(NcclGroup *g, int rank, const void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err) {
    ncclComm_t c = NULL;
    if (comm_of(g, rank, peer, &c, err)) return -1;
    NCCL_CHECK(g->nc, g->nc->Send(buf, n, bf16 ? ncclBfloat16 : ncclFloat32, peer, c, s), err);
    return 0;
}

int nccl_link_recv(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, int peer, cudaStream_t s, Err *err) {
    ncclComm_t c = NULL;
    if (comm_of(g, rank, peer, &c, err)) return -1;
    NCCL_CHECK(g->nc, g->nc->Recv(buf, n, bf16 ? ncclBfloat16 : ncclFloat32, peer, c, s), err);
    return 0;
}

/* Aborting every communicator of the group ends the transfers still
 * waiting on a peer (their kernels return), so the streams drain. */
void nccl_link_abort(NcclGroup *g) {
    if (!g || g->aborted) return;
    g->aborted = true;
    for (int i = 0; i < g->n; i++)
        if (g->comm[i]) g->nc->CommAbort(g->comm[i]);
}

/* An NCCL error seen on rank's communicator aborts the group. */
static int link_poll(NcclGroup *g, int rank, const char *who, Err *err) {
    ncclResult_t async = ncclSuccess;
    if (!g->aborted && g->comm[rank] && g->nc->CommGetAsyncError(g->comm[rank], &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
        nccl_link_abort(g);
        return err_set(err, "NCCL error on %s (GPU %d): %s; communicators aborted", who, g->device[rank],
                       g->nc->GetErrorString(async));
    }
    if (g->aborted)
        return err_set(err, "%s (GPU %d): its communicators were aborted (another stage or rank failed)", who,
                       g->device[rank]);
    return 0;
}

int nccl_link_wait_all(const NcclWatch *w, int n, cudaStream_t s, bool (*stop)(void *), void *stop_ctx, Err *err) {
    double timeout = 0;
    for (int i = 0; i < n; i++) timeout = w[i].g->timeout_s > timeout ? w[i].g->timeout_s : timeout;
    double deadline = seconds_now() + timeout;
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) CUDA_CHECK(e, err);
        if (stop && stop(stop_ctx)) { /* the peer will never come: end the collectives that wait for it */
            for (int i = 0; i < n; i++) nccl_link_abort(w[i].g);
            return err_set(err, "%s: another rank of its group failed; communicators aborted", w[0].who);
        }
        for (int i = 0; i < n; i++)
            if (link_poll(w[i].g, w[i].rank, w[i].who, err)) {
                for (int j = 0; j < n; j++) nccl_link_abort(w[j].g);
                return -1;
            }
        if (seconds_now() > deadline) {
            for (int i = 0; i < n; i++) nccl_link_abort(w[i].g);
            return err_set(err,
                           "%s (GPU %d) waited more than %.0f s for a transfer: a peer died or hangs; NCCL "
                           "communicators aborted (CLLM_PP_TIMEOUT sets the limit)",
                           w[0].who, w[0].g->device[w[0].rank], timeout);
        }
        if (spins > 1000) {
            struct timespec ts = {0, 20000}; /* 20 us: after a first busy stretch, do not burn a core */
            nanosleep(&ts, NULL);
        }
    }
}

int nccl_link_wait(NcclGroup *g, int rank, cudaStream_t s, Err *err) {
    char who[48];
    snprintf(who, sizeof who, "the link of stage %d", rank);
    NcclWatch w = {g, rank, who};
    return nccl_link_wait_all(&w, 1, s, NULL, NULL, err);
}

int nccl_link_all_gather(NcclGroup *g, int rank, const void *send, void *recv, size_t count, bool bf16,
                         cudaStream_t s, Err *err) {
    ncclComm_t c = NULL;
    if (comm_of(g, rank, rank, &c, err)) return -1;
    NCCL_CHECK(g->nc, g->nc->AllGather(send, recv, count, bf16 ? ncclBfloat16 : ncclFloat32, c, s), err);
    return 0;
}

int nccl_link_all_reduce_sum(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, cudaStream_t s, Err *err) {
    ncclComm_t c = NULL;
    if (comm_of(g, rank, rank, &c, err)) return -1;
    NCCL_CHECK(g->nc, g->nc->AllReduce(buf, buf, n, bf16 ? ncclBfloat16 : ncclFloat32, ncclSum, c, s), err);
    return 0;
}

int nccl_link_broadcast(NcclGroup *g, int rank, void *buf, size_t n, bool bf16, cudaStream_t s, Err *err) {
    ncclComm_t c = NULL;
    if (comm_of(g, rank, rank, &c, err)) return -1;
    NCCL_CHECK(g->nc, g->nc->Broadcast(buf, buf, n, bf16 ? ncclBfloat16 : ncclFloat32, 0, c, s), err);
    return 0;
}
