/* tp_group.c — a tensor-parallel group's barrier, all-reduce and gather
 * over host buffers (kernels/tp_group.h). */
#include "kernels/tp_group.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct TpGroup {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t generation;        /* barriers passed: a waiter leaves when it changes */
    bool broken;
    float *buf[TP_GROUP_MAX];   /* the current operation's buffers, by rank */
    const float *src[TP_GROUP_MAX];
    int64_t cols[TP_GROUP_MAX];
    bool linked;                /* one rank here, the others through link */
    TpGroupLink link;
};

TpGroup *tp_group_create(int n_ranks, Err *err) {
    if (n_ranks < 1 || n_ranks > TP_GROUP_MAX)
        return err_set(err, "--tp %d: between 1 and %d ranks", n_ranks, TP_GROUP_MAX), NULL;
    TpGroup *g = calloc(1, sizeof *g);
    if (!g) return err_set(err, "out of memory"), NULL;
    g->n = n_ranks;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

TpGroup *tp_group_create_linked(int n_ranks, const TpGroupLink *link, Err *err) {
    if (!link || !link->all_reduce_f32 || !link->all_gather_f32)
        return err_set(err, "tensor-parallel group: a link without its all-reduce and all-gather"), NULL;
    TpGroup *g = tp_group_create(n_ranks, err);
    if (!g) return NULL;
    g->linked = true;
    g->link = *link;
    return g;
}

void tp_group_free(TpGroup *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

int tp_group_size(const TpGroup *g) { return g->n; }

void tp_group_abort(TpGroup *g) {
    pthread_mutex_lock(&g->mu);
    bool tell = g->linked && !g->broken && g->link.abort;
    g->broken = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (tell) g->link.abort(g->link.ctx);
}

bool tp_group_broken(const TpGroup *g) {
    pthread_mutex_lock((pthread_mutex_t *)&g->mu);
    bool b = g->broken;
    pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
    return b;
}

/* Waits until every rank has arrived; false when the group is broken. */
static bool barrier(TpGroup *g) {
    pthread_mutex_lock(&g->mu);
    uint64_t gen = g->generation;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->generation && !g->broken) pthread_cond_wait(&g->cv, &g->mu);
    }
    bool ok = !g->broken;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* Rank r sums elements [r*n/N, (r+1)*n/N) over every rank's buffer, in
 * rank order, and writes the sum to all of them: the shares are disjoint,
 * so the ranks work at once, and the second barrier keeps every buffer
 * until all shares are written. */
void tp_group_all_reduce_f32(TpGroup *g, int rank, float *buf, int64_t n) {
    if (g->n == 1) return;
    if (g->linked) {
        if (!tp_group_broken(g) && g->link.all_reduce_f32(g->link.ctx, buf, n)) tp_group_abort(g);
        return;
    }
    g->buf[rank] = buf;
    if (!barrier(g)) return;
    int64_t lo = n * rank / g->n, hi = n * (rank + 1) / g->n;
    for (int64_t i = lo; i < hi; i++) {
        float s = g->buf[0][i];
        for (int k = 1; k < g->n; k++) s += g->buf[k][i];
        for (int k = 0; k < g->n; k++) g->buf[k][i] = s;
    }
    barrier(g);
}

void tp_group_all_gather_f32(TpGroup *g, int rank, float *dst, const float *src, int64_t rows, int64_t cols) {
    if (g->linked) {
        if (!tp_group_broken(g) && g->link.all_gather_f32(g->link.ctx, dst, src, rows, cols)) tp_group_abort(g);
        return;
    }
    g->src[rank] = src;
    g->cols[rank] = cols;
    if (!barrier(g)) return;
    int64_t width = 0;
    for (int k = 0; k < g->n; k++) width += g->cols[k];
    for (int64_t r = 0; r < rows; r++) {
        int64_t at = 0;
        for (int k = 0; k < g->n; k++) {
            memcpy(dst + r * width + at, g->src[k] + r * g->cols[k], (size_t)g->cols[k] * sizeof(float));
            at += g->cols[k];
        }
    }
    barrier(g);
}
