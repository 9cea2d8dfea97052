/* pipeline_open.c — `--pp N` and `--world-size N`: the model split into
 * stages, a backend per stage, the links between them (pipeline_open.h). */
#include "parallel/pipeline_open.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/thread_each.h"
#include "parallel/placement.h"
#include "parallel/process_grid.h"
#include "parallel/rendezvous.h"
#include "parallel/stage_server.h"

/* err, with the stage it is about in front. */
static int stage_failed(Err *err, int s, const StagePlan *p) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return err_set(err, "stage %d (layers %d-%d): %s", s, p->first_layer[s], p->first_layer[s] + p->n_layers[s] - 1,
                   why);
}

/* GPUs the stages may use: 0 with --cpu or none present. */
static int stage_gpus(const PipelineOptions *o) { return o->cpu ? 0 : backend_gpu_count(NULL); }

static BackendOptions stage_backend_options(const PipelineOptions *o, int dev, int n_gpus) {
    BackendOptions bo = o->backend;
    bo.device = n_gpus > 0 ? dev : -1;
    bo.gpu_share = 1;
    bo.n_blocks = n_gpus > 0 ? 0 : (o->ctx_tokens + bo.block_size - 1) / bo.block_size + 1;
    bo.max_seq_tokens = o->ctx_tokens;
    return bo;
}

/* share: backends still to be made on its GPU, this one included (placement.h). */
static Backend *stage_backend(const PipelineOptions *o, const StageModel *sm, int dev, int share, int n_gpus,
                              Err *err) {
    BackendOptions bo = stage_backend_options(o, dev, n_gpus);
    bo.gpu_share = share;
    if (n_gpus > 0 && dev >= n_gpus)
        return err_set(err, "--pp %d: GPU %d asked for, this machine has %d", o->n_stages, dev, n_gpus), NULL;
    return backend_create(&sm->shape, &sm->w, &bo, err);
}

/* --tp: stage s as a group of o->tp ranks (on dev[s * tp ...] of the run's
 * n_all backends), its backend rank 0's. */
static int stage_group(Pipeline *p, const PipelineOptions *o, int s, const int *dev, int n_all, int n_gpus,
                       Err *err) {
    BackendOptions bo = stage_backend_options(o, dev[s * o->tp], n_gpus);
    TpPlacement where;
    placement_group(dev, n_all, s * o->tp, o->tp, &where);
    where.timeout_s = o->timeout_s;
    char what[32];
    snprintf(what, sizeof what, "stage %d", s);
    if (!(p->tp[s] = calloc(1, sizeof *p->tp[s]))) return err_set(err, "out of memory");
    if (tp_ranks_open(p->tp[s], &p->sm[s].cfg, &p->sm[s].shape, &p->sm[s].w, o->tp, &bo, &where, what, err)) {
        p->be[s] = p->tp[s]->be[0]; /* destroyed with the pipeline */
        return strncmp(err->msg, what, strlen(what)) ? stage_failed(err, s, &p->plan) : -1;
    }
    p->be[s] = p->tp[s]->be[0];
    return 0;
}

/* Stage s's backend, or with --tp its group (be[s] its rank 0's). share
 * counts the stages from s on that use its GPU: made in stage order, each
 * takes its part of what the earlier ones left (placement.h). */
static int make_stage(Pipeline *p, const PipelineOptions *o, int s, const int *dev, int n_gpus, Err *err) {
    int n = o->n_stages;
    if (o->tp > 1) return stage_group(p, o, s, dev, n * o->tp, n_gpus, err);
    int share = 0;
    for (int j = s; j < n; j++) share += dev[j] == dev[s];
    if (!(p->be[s] = stage_backend(o, &p->sm[s], dev[s], share, n_gpus, err))) return stage_failed(err, s, &p->plan);
    return 0;
}

/* The stages being made a thread each: their results, a slot per stage. */
typedef struct {
    Pipeline *p;
    const PipelineOptions *o;
    const int *dev;
    int n_gpus;
    int rc[STAGE_MAX];
    Err err[STAGE_MAX];
} StageMakes;

static void make_stage_of(void *ctx, int s) {
    StageMakes *m = ctx;
    m->rc[s] = make_stage(m->p, m->o, s, m->dev, m->n_gpus, &m->err[s]);
}

/* Concurrently: backend_create may run on several threads at once for
 * different GPUs (tp.c start_ranks says why: each sets its own GPU, fills
 * its own backend, loads the CUDA libraries once); stage s writes be[s] and
 * tp[s] only and reads the plan and its slice. */
int pipeline_make_backends(Pipeline *p, const PipelineOptions *o, const int *dev, int n_gpus, bool concurrent,
                           Err *err) {
    int n = o->n_stages;
    double t0 = now_seconds();
    p->concurrent = concurrent; /* pipeline_free destroys them the same way */
    if (!concurrent) {
        for (int s = 0; s < n; s++)
            if (make_stage(p, o, s, dev, n_gpus, err)) return -1;
    } else {
        StageMakes *m = calloc(1, sizeof *m);
        if (!m) return err_set(err, "pipeline: out of memory");
        *m = (StageMakes){.p = p, .o = o, .dev = dev, .n_gpus = n_gpus};
        thread_each(n, make_stage_of, m);
        for (int s = 0; s < n; s++) /* the first failure by stage order; those made stay for pipeline_free */
            if (m->rc[s]) {
                *err = m->err[s];
                free(m);
                return -1;
            }
        free(m);
    }
    p->made_s = now_seconds() - t0;
    return 0;
}

static int make_plan(Pipeline *p, const Model *m, const PipelineOptions *o, int n, Err *err) {
    const ModelConfig *c = &m->cfg;
    if (n > STAGE_MAX || n > c->n_layers)
        return err_set(err, "--pp %d: the model has %d layers (at most one stage per layer, %d stages)", n,
                       c->n_layers, STAGE_MAX);
    StagePlan plan;
    if (o->split ? stage_plan_parse(&plan, c, &m->w, n, o->split, err) : stage_plan_balanced(&plan, c, &m->w, n, err))
        return -1;
    return pipeline_slice(p, m, &plan, err);
}

static int check_kv(const Pipeline *p, const PipelineOptions *o, Err *err) {
    int need = (o->ctx_tokens + o->backend.block_size - 1) / o->backend.block_size + 1;
    if (pipeline_kv_blocks(p) < need)
        return err_set(err, "--pp %d: a stage's KV cache holds only %d tokens; use a smaller --ctx-size", o->n_stages,
                       (pipeline_kv_blocks(p) - 1) * o->backend.block_size);
    return 0;
}

/* One process: every stage, a thread each (with --tp, a group of ranks
 * each: rank r of stage s on dev[s * tp + r]). GPU stages whose backends
 * all have GPUs of their own pass hidden states over the backends' links;
 * others (CPU stages, a GPU holding two backends) through host memory. */
static int open_stages(Pipeline *p, const Model *m, const PipelineOptions *o, Err *err) {
    int n = o->n_stages, tp = o->tp > 1 ? o->tp : 1, n_all = n * tp, n_gpus = stage_gpus(o);
    int dev[PLACEMENT_MAX];
    if (make_plan(p, m, o, n, err) || placement_devices(o->gpus, n, tp, n_gpus, dev, err)) return -1;
    bool shared = false;
    for (int i = 0; i < n_all; i++) {
        if (n_gpus == 0) dev[i] = -1;
        for (int j = 0; j < i; j++) shared |= dev[i] == dev[j];
    }
    if (n_gpus > 0 && !shared && backend_link_available(err)) return -1; /* before any weights move */
    /* GPUs of their own: they load together; a shared GPU's backends (and
     * CPU stages) one after another, as each sizes its part by the others' */
    if (pipeline_make_backends(p, o, dev, n_gpus, n_gpus > 0 && !shared, err)) return -1;
    for (int s = 1; s < n; s++)
        if (p->be[s]->kv_block_size != p->be[0]->kv_block_size)
            return err_set(err, "pipeline: stage %d has KV blocks of %d tokens, stage 0 of %d", s,
                           p->be[s]->kv_block_size, p->be[0]->kv_block_size);
    if (n_gpus > 0 && !shared && !(p->links = backend_link_open(p->be, n, o->timeout_s, err))) return -1;
    if (check_kv(p, o, err)) return -1;
    return pipeline_start(p, o->backend.max_tokens, err);
}

/* --world-size N: this process builds its own stage only. The last rank
 * listens at --master (it drives: scheduler, sampling, output), the others
 * connect to it; the link id it makes travels with that rendezvous. */
static int open_own_stage(Pipeline *p, const Model *m, const PipelineOptions *o, Err *err) {
    int n = o->world_size, r = o->rank, driver = n - 1;
    if (make_plan(p, m, o, n, err)) return -1;
    int dev = placement_own_device(o->gpus, n, 1, r, err), n_gpus = stage_gpus(o);
    if (dev < 0 || (n_gpus > 0 && backend_link_available(err))) return -1;
    unsigned char id[BACKEND_LINK_ID_BYTES] = "cllm-cpu-stages";
    if (n_gpus > 0 && r == driver && backend_link_id(id, err)) return -1;
    int fds[STAGE_MAX];
    if (rendezvous_open(o->master, (r + 1) % n, n, id, sizeof id, (int)(o->timeout_s * 1000), fds, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "rank %d of %d: the start-up rendezvous failed (the last rank listens at --master; its "
                       "peer k there is rank k-1): %s", r, n, why);
    }
    Backend *be = stage_backend(o, &p->sm[r], dev, 1, n_gpus, err);
    if (!be) return stage_failed(err, r, &p->plan);
    p->be[r] = be;
    if (n_gpus > 0 && !(p->links = backend_link_join(be, id, r, n, o->timeout_s, err))) return -1;
    if (r != driver) {
        p->serving = true;
        p->serve_fd = fds[0];
        p->serve_stage = r;
        p->serve_chunk = o->backend.max_tokens;
        return 0;
    }
    int peers[STAGE_MAX];
    for (int s = 0; s < driver; s++) peers[s] = fds[s + 1]; /* rendezvous rank s + 1 is stage s */
    if (pipeline_set_remote(p, peers, o->timeout_s, err) || check_kv(p, o, err)) return -1;
    return pipeline_start(p, o->backend.max_tokens, err);
}

/* The connections process_grid_open left this process, now the pipeline's
 * (closed with it): a hub's to the driver, the driver's to the hubs. */
static void take_grid_fds(Pipeline *p, const ProcessGrid *g, int chunk) {
    if (g->rank == process_grid_driver(g->stages, g->tp)) {
        p->remote = true;
        for (int s = 0; s < g->stages - 1; s++) p->peer_fd[s] = g->hub_fd[s];
        return;
    }
    p->serving = true;
    p->serve_fd = g->driver_fd; /* -1 for a rank after a stage's 0: it hears its hub only */
    p->serve_stage = g->stage;
    p->serve_chunk = chunk;
}

/* Where a rank of `--pp P --tp N` as processes runs, by its --gpus entry
 * (else its local rank) and the list as `cllm info` places it. */
typedef struct {
    int dev;                    /* its GPU, or -1: the CPU */
    int share;                  /* processes on that GPU by the list (each takes its share), 0 without one */
    bool listed;                /* a --gpus list: group is its stage's group as placed */
    TpPlacement group;
    bool hubs_nccl;             /* the stages' rank 0s on GPUs of their own: NCCL between them */
} RankPlace;

static int place_rank(const PipelineOptions *o, int n_gpus, RankPlace *pl, Err *err) {
    int n = o->n_stages, tp = o->tp, r = o->rank, all[PLACEMENT_MAX];
    memset(pl, 0, sizeof *pl);
    pl->dev = -1;
    if (n_gpus == 0) return 0;
    if ((pl->dev = placement_own_device(o->gpus, n, tp, r, err)) < 0) return -1;
    if (pl->dev >= n_gpus)
        return err_set(err, "rank %d (stage %d's tensor-parallel rank %d): GPU %d, this machine has %d", r, r / tp,
                       r % tp, pl->dev, n_gpus);
    pl->hubs_nccl = true;
    if (!o->gpus) return 0;
    if (placement_devices(o->gpus, n, tp, n_gpus, all, err)) return -1;
    placement_group(all, n * tp, r / tp * tp, tp, &pl->group); /* a GPU twice in it: host memory, as `cllm info` says */
    pl->listed = true;
    for (int b = 0; b < n * tp; b++) pl->share += all[b] == pl->dev;
    for (int s = 1; s < n; s++)
        for (int q = 0; q < s; q++) {
            if (all[s * tp] != all[q * tp]) continue;
            if (n > 2)
                return err_set(err, "--gpus '%s': stages %d and %d have their rank 0 on GPU %d; as processes, more than "
                               "2 stages pass the hidden state over NCCL, which needs a GPU per stage's rank 0", o->gpus,
                               q, s, all[s * tp]);
            pl->hubs_nccl = false; /* 2 stages: over the driver's connection, as CPU stages */
        }
    return 0;
}

/* --pp P --tp N --world-size P*N: this process is one rank of its stage's
 * group of processes (process_grid.h: who is who, tp_process.h: the
 * group). The stages' hubs are linked as open_own_stage's processes are;
 * the last stage's hub drives. */
static int open_own_rank(Pipeline *p, const Model *m, const PipelineOptions *o, Err *err) {
    int n = o->n_stages, tp = o->tp, r = o->rank, n_gpus = stage_gpus(o);
    if (n * tp != o->world_size)
        return err_set(err, "--pp %d --tp %d: %d processes (one per stage and rank), not --world-size %d", n, tp, n * tp,
                       o->world_size);
    if (n_gpus == 0 && n > 2) /* as open_own_stage's CPU stages: the first hands over through the driver's connection */
        return err_set(err, "--pp %d --tp %d as processes on CPU backends: at most 2 stages (more need NCCL between the "
                       "stages' GPUs)", n, tp);
    TpPlan split; /* refused before any process waits for the others */
    RankPlace pl;
    if (make_plan(p, m, o, n, err) || tp_plan_make(&split, &p->sm[r / tp].cfg, &p->sm[r / tp].w, tp, err) ||
        place_rank(o, n_gpus, &pl, err) || (n_gpus > 0 && backend_link_available(err)))
        return -1;
    bool driver = r == process_grid_driver(n, tp), hub = r % tp == 0;
    unsigned char id[BACKEND_LINK_ID_BYTES] = "cllm-cpu-stages";
    if (pl.hubs_nccl && driver && backend_link_id(id, err)) return -1;
    ProcessGrid g;
    if (process_grid_open(&g, o->master, r, n, tp, id, sizeof id, o->timeout_s, err)) return -1;
    take_grid_fds(p, &g, o->backend.max_tokens);
    int s = g.stage;
    BackendOptions bo = stage_backend_options(o, pl.dev, n_gpus);
    if (pl.listed) bo.gpu_share = pl.share; /* the processes on this GPU share what --gpu-mem-util leaves of it */
    TpProcessAt at = {.n = tp, .rank = g.tp_rank, .stage = s, .n_stages = n, .master = g.group_master,
                      .timeout_s = o->timeout_s, .where = pl.listed ? &pl.group : NULL};
    if (!(p->tpp = calloc(1, sizeof *p->tpp))) return err_set(err, "out of memory");
    if (tp_process_open(p->tpp, &p->sm[s].cfg, &p->sm[s].shape, &p->sm[s].w, &at, &bo, err))
        return stage_failed(err, s, &p->plan);
    p->be[s] = p->tpp->be;
    if (hub && pl.hubs_nccl && !(p->links = backend_link_join(p->be[s], id, s, n, o->timeout_s, err))) return -1;
    if (!driver) return 0;
    if (pipeline_set_remote(p, g.hub_fd, o->timeout_s, err) || check_kv(p, o, err)) return -1;
    return pipeline_start(p, o->backend.max_tokens, err);
}

int pipeline_open(Pipeline *p, const Model *m, const PipelineOptions *o, Err *err) {
    memset(p, 0, sizeof *p);
    int rc = o->world_size > 1 && o->tp > 1 ? open_own_rank(p, m, o, err)
             : o->world_size > 1            ? open_own_stage(p, m, o, err)
                                            : open_stages(p, m, o, err);
    if (rc) pipeline_close(p);
    return rc;
}

int pipeline_serve(Pipeline *p, Err *err) {
    int r = p->serve_stage;
    if (p->tpp && p->tpp->rank > 0) return tp_process_serve(p->tpp, p->serve_chunk, err);
    int rc = stage_serve(p->be[r], pipeline_stage_cfg(p, r), r, p->plan.n_stages, p->serve_fd, p->serve_chunk, p->tpp,
                         err);
    if (rc && p->tpp) tp_group_abort(p->tpp->group); /* its ranks learn at once (a dead driver, a failed step) */
    return rc;
}

void pipeline_close(Pipeline *p) {
    TpProcess *tpp = p->tpp; /* owns its stage's backend */
    BackendLinks *links = p->links;
    int fd = p->serving ? p->serve_fd : -1;
    pipeline_free(p); /* every backend but tpp's, the engine's (the last stage's) included */
    if (fd >= 0) close(fd);
    if (tpp) tp_process_close(tpp); /* its ranks told to stop */
    free(tpp);
    backend_link_close(links); /* last: the backends' streams used the communicators */
}
