/* tp.c — the ranks of a tensor-parallel group, a thread each (parallel/tp.h). */
#include "parallel/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/thread_each.h"

/* A rank after 0: waits for a step, runs it, says it is done. A rank that
 * fails breaks the group, so no rank waits for it in a reduce. */
static void *rank_main(void *arg) {
    TpRankThread *rt = arg;
    TpRanks *t = rt->t;
    int r = rt->rank;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->steps == seen && !t->stopping) pthread_cond_wait(&t->go, &t->mu);
        if (t->steps == seen) { pthread_mutex_unlock(&t->mu); break; }
        seen = t->steps;
        ForwardStep s = t->step;
        pthread_mutex_unlock(&t->mu);
        Err e = {{0}};
        int rc = forward_run(&t->fw[r], s.ids, &s.b, s.logit_rows, s.n_logits, NULL, &e);
        if (rc) tp_group_abort(t->group);
        pthread_mutex_lock(&t->mu);
        t->failed[r] = rc != 0;
        t->err[r] = e;
        t->n_done++;
        pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

static int rank_failed(Err *err, const TpRanks *t, int r, const char *what) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return err_set(err, "%s, tensor-parallel rank %d of %d: %s", what, r, t->plan.n_ranks, why);
}

/* NCCL where the placement allows and it connects the GPUs; else the host
 * group, and the note says why. */
static void open_transport(TpRanks *t, const TpPlacement *p, int n, bool nccl_sum) {
    snprintf(t->note, sizeof t->note, "%s", p->why);
    if (p->nccl) {
        Err e = {{0}};
        t->links = backend_tp_links_open(p->devices, n, p->timeout_s > 0 ? p->timeout_s : 60.0, &e);
        if (!t->links)
            snprintf(t->note, sizeof t->note, "--tp %d: NCCL cannot connect the ranks' GPUs (%.200s): they exchange "
                     "through host memory (slower)", n, e.msg);
    }
    if (nccl_sum && !t->links && t->note[0]) {
        size_t len = strlen(t->note);
        snprintf(t->note + len, sizeof t->note - len, "; --tp-nccl-sum has no effect there");
    }
}

/* GPU ranks whose caches the memory budget sizes: every rank gets the
 * blocks the tightest one holds in its share of its GPU (planned before
 * any rank allocates), so the block ids of one manager fit every cache. */
static int plan_kv_blocks(TpRanks *t, BackendOptions *bo, const TpPlacement *p, int n, const char *what, Err *err) {
    if (bo->n_blocks > 0) return 0;
    int64_t least = -1;
    for (int r = 0; r < n; r++) {
        BackendOptions ro = *bo;
        ro.device = p->devices[r];
        ro.gpu_share = p->gpu_share[r];
        ro.tp_rank = r;
        uint64_t weight_bytes = 0;
        int64_t tokens = 0;
        if (ro.device < 0) return err_set(err, "%s: tensor-parallel rank %d runs on the CPU: it needs a KV cache size", what, r);
        if (backend_gpu_plan(&t->rm[r].shape, &t->rm[r].w, &ro, &weight_bytes, &tokens, err))
            return rank_failed(err, t, r, what);
        if (least < 0 || tokens < least) least = tokens;
    }
    bo->n_blocks = (int)(least / bo->block_size);
    if (bo->n_blocks < 1)
        return err_set(err, "%s: no room for a KV cache beside the weights of the tensor-parallel ranks at "
                       "--gpu-mem-util %.2f (each rank's share of its GPU)", what, bo->mem_util);
    return 0;
}

/* One rank's backend, made on a thread of its own. */
typedef struct {
    TpRanks *t;
    BackendOptions bo;
    int rank;
    Err err;
} RankStart;

static void start_rank(void *ctx, int r) {
    RankStart *s = (RankStart *)ctx + r;
    TpRankModel *rm = &s->t->rm[s->rank];
    s->t->be[s->rank] = backend_create(&rm->shape, &rm->w, &s->bo, &s->err);
}

/* Every rank's backend at once, a thread each, so the ranks upload their
 * weights to their GPUs together. backend_create may run concurrently: each
 * sets its GPU on its own thread, fills its own backend, reads the slices
 * and options only, loads the CUDA libraries once (cuda_libs.c), and of the
 * NCCL group writes only its own rank's entry of the peer table (read at the
 * first step, after every thread here is joined); no collective runs before
 * a step. The KV blocks are planned already, so no rank sizes its cache by
 * what another has taken. The first failing rank, by rank order, is
 * reported; those made stay in be[] for tp_ranks_free (be[0]: the caller)
 * to destroy. */
static int start_ranks(TpRanks *t, const BackendOptions *base, const TpPlacement *where, int n, const char *what,
                       Err *err) {
    RankStart s[TP_MAX];
    for (int r = 0; r < n; r++) {
        s[r] = (RankStart){t, *base, r, {{0}}};
        s[r].bo.tp_rank = r;
        s[r].bo.device = where->devices[r];
        s[r].bo.gpu_share = where->gpu_share[r];
    }
    thread_each(n, start_rank, s);
    for (int r = 0; r < n; r++)
        if (!t->be[r]) {
            *err = s[r].err;
            return rank_failed(err, t, r, what);
        }
    return 0;
}

int tp_ranks_open(TpRanks *t, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w, int n,
                  const BackendOptions *o, const TpPlacement *where, const char *what, Err *err) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->dim = c->dim;
    t->max_tokens = o->max_tokens;
    TpPlacement same;
    if (!where) {
        placement_same(o->device, n, &same);
        where = &same;
    }
    if (tp_plan_make(&t->plan, c, w, n, err) || !(t->group = tp_group_create(n, err))) return -1;
    for (int r = 0; r < n; r++) /* GPU ranks upload views of the model's rows; CPU ranks compute from copies */
        if (tp_rank_make(&t->rm[r], c, shape, w, &t->plan, r, where->devices[r] < 0, err))
            return rank_failed(err, t, r, what);
    open_transport(t, where, n, o->tp_nccl_sum);
    BackendOptions base = *o;
    base.tp_group = t->group;
    base.tp_links = t->links;
    base.tp_nccl_sum = o->tp_nccl_sum && t->links;
    if (where->devices[0] >= 0 && plan_kv_blocks(t, &base, where, n, what, err)) return -1;
    if (start_ranks(t, &base, where, n, what, err)) return -1;
    for (int r = 0; r < n; r++) {
        if (t->be[r]->kv_n_blocks != t->be[0]->kv_n_blocks || t->be[r]->kv_block_size != t->be[0]->kv_block_size)
            return err_set(err, "%s: tensor-parallel rank %d has %d KV blocks of %d tokens, rank 0 %d of %d", what, r,
                           t->be[r]->kv_n_blocks, t->be[r]->kv_block_size, t->be[0]->kv_n_blocks,
                           t->be[0]->kv_block_size);
        if (r > 0 && forward_init(&t->fw[r], &t->rm[r].cfg, t->be[r], o->max_tokens, err))
            return rank_failed(err, t, r, what);
    }
    size_t bytes = (size_t)o->max_tokens * c->dim * sizeof(float);
    if (!(t->x_host = malloc(bytes)) || !(t->proj_host = malloc(bytes)))
        return err_set(err, "%s: out of memory for the tensor-parallel hand-over of %d rows", what, o->max_tokens);
    for (int r = 1; r < n; r++) {
        t->rt[r] = (TpRankThread){t, r};
        if (pthread_create(&t->thread[r], NULL, rank_main, &t->rt[r]))
            return err_set(err, "%s: cannot start the thread of tensor-parallel rank %d", what, r);
        t->n_threads = r;
    }
    return 0;
}

const ModelConfig *tp_ranks_cfg(const TpRanks *t) { return &t->rm[0].cfg; }

/* With from_prev, every rank starts from rank 0's x and proj (they came
 * from the previous pipeline stage, whole): through the host here where
 * the group has no device broadcast (forward_ops broadcasts otherwise). */
static int copy_inputs(TpRanks *t, Forward *rank0, int T, Err *err) {
    int64_t n = (int64_t)T * t->dim;
    Backend *be = rank0->be;
    if (be->read(be, t->x_host, rank0->x, n, err) || be->read(be, t->proj_host, rank0->proj, n, err)) return -1;
    for (int r = 1; r < t->plan.n_ranks; r++) {
        Backend *b = t->be[r];
        if (b->write(b, t->fw[r].x, t->x_host, n, err) || b->write(b, t->fw[r].proj, t->proj_host, n, err)) return -1;
    }
    return 0;
}

int tp_ranks_run(TpRanks *t, Forward *rank0, const ForwardStep *s, Err *err) {
    int n = t->plan.n_ranks;
    if (t->broken) return err_set(err, "tensor parallel: a rank failed earlier; its state is unknown");
    if (s->b.n_tokens > t->max_tokens)
        return err_set(err, "tensor parallel: a step of %d rows; the ranks hold %d", s->b.n_tokens, t->max_tokens);
    for (int r = 1; r < n; r++) {
        t->fw[r].from_prev = rank0->from_prev;
        t->fw[r].to_next = rank0->to_next;
    }
    if (rank0->from_prev && !rank0->be->broadcast && copy_inputs(t, rank0, s->b.n_tokens, err)) return -1;
    pthread_mutex_lock(&t->mu);
    t->step = *s;
    t->n_done = 0;
    t->steps++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    int rc = forward_run(rank0, s->ids, &s->b, s->logit_rows, s->n_logits, s->logits_out, err);
    if (rc) tp_group_abort(t->group);
    pthread_mutex_lock(&t->mu);
    while (t->n_done < n - 1) pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
    for (int r = 1; r < n; r++) /* a rank's own failure says more than "another rank failed" */
        if (t->failed[r] && (rc == 0 || strstr(err->msg, "another rank"))) {
            rc = -1;
            err_set(err, "tensor-parallel rank %d: %s", r, t->err[r].msg);
            break;
        }
    t->broken = rc != 0;
    return rc;
}

int tp_hold_step(ForwardStep *pending, bool *has_pending, const int32_t *ids, const AttnBatch *b,
                 const int32_t *logit_rows, int n_logits, float *logits_out, Err *err) {
    if (*has_pending) return err_set(err, "tensor parallel: a step already in flight");
    *pending = (ForwardStep){ids, *b, logit_rows, n_logits, logits_out};
    *has_pending = true;
    return 0;
}

const ForwardStep *tp_take_step(const ForwardStep *pending, bool *has_pending, Err *err) {
    if (!*has_pending) return err_set(err, "tensor parallel: no step in flight"), NULL;
    *has_pending = false;
    return pending;
}

static int stages_launch(void *ctx, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                         float *logits_out, Err *err) {
    TpRanks *t = ctx;
    return tp_hold_step(&t->pending, &t->has_pending, ids, b, logit_rows, n_logits, logits_out, err);
}

/* The engine's Forward is rank 0's; without a pipeline it embeds (the
 * engine made it for a last stage, from_prev). */
static int stages_finish(void *ctx, Forward *last, Err *err) {
    TpRanks *t = ctx;
    const ForwardStep *s = tp_take_step(&t->pending, &t->has_pending, err);
    if (!s) return -1;
    last->from_prev = false;
    return tp_ranks_run(t, last, s, err);
}

ForwardStages tp_stages(TpRanks *t) { return (ForwardStages){t, 1, stages_launch, stages_finish}; }

void tp_ranks_free(TpRanks *t) {
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int r = 1; r <= t->n_threads; r++) pthread_join(t->thread[r], NULL);
    for (int r = 1; r < TP_MAX; r++) {
        if (t->fw[r].cfg) forward_free(&t->fw[r]);
        if (t->be[r]) t->be[r]->destroy(t->be[r]);
    }
    for (int r = 0; r < TP_MAX; r++) tp_rank_free(&t->rm[r]);
    backend_link_close(t->links); /* after the backends that used it (rank 0's is idle: the caller's) */
    tp_group_free(t->group);
    free(t->x_host);
    free(t->proj_host);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    memset(t, 0, sizeof *t);
}
