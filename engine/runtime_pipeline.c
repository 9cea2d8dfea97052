/* runtime_pipeline.c — `--pp N`: the model split into N stages, a backend
 * per stage (a GPU each, or CPU backends with --cpu), the engine over them
 * (parallel/pipeline.h). */
#include "engine/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/rendezvous.h"
#include "parallel/stage_server.h"

#ifdef CLLM_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_link.h"
#endif

/* The GPU of each stage: the --gpus list, or 0, 1, ... */
static int stage_devices(const RunOptions *o, int n, int *dev, Err *err) {
    const char *s = o->gpus;
    for (int i = 0; i < n; i++) {
        if (!s) { dev[i] = i; continue; }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || (*end && *end != ','))
            return err_set(err, "--gpus '%s': expected comma-separated device numbers such as 0,1", o->gpus);
        dev[i] = (int)v;
        s = *end ? end + 1 : end;
        if (i < n - 1 && !*s) return err_set(err, "--gpus '%s': %d devices for --pp %d", o->gpus, i + 1, n);
    }
    if (s && *s) return err_set(err, "--gpus '%s': more devices than the %d stages", o->gpus, n);
    return 0;
}

/* err, with the stage it is about in front. */
static int stage_failed(Err *err, int s, const StagePlan *p) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return err_set(err, "stage %d (layers %d-%d): %s", s, p->first_layer[s], p->first_layer[s] + p->n_layers[s] - 1,
                   why);
}

static Backend *stage_backend(const RunOptions *o, const StageModel *sm, int dev, int n_gpus, int ctx, int block,
                              int chunk, int n_blocks, Err *err) {
#ifdef CLLM_CUDA
    if (!o->cpu && n_gpus > 0) {
        if (dev >= n_gpus) return err_set(err, "--pp %d: GPU %d asked for, this machine has %d", o->pp, dev, n_gpus), NULL;
        CudaOptions co = {dev, block, 0, ctx, chunk, o->gpu_mem_util, false, false, o->bf16_weights,
                          o->batch_invariant, o->kv_dtype};
        return backend_cuda_create_opts(&sm->cfg, &sm->w, &co, NULL, err);
    }
#endif
    (void)dev, (void)n_gpus, (void)ctx, (void)chunk;
    return backend_cpu_create_kv(&sm->cfg, &sm->w, o->threads, block, n_blocks, o->kv_dtype, err);
}

/* CUDA stages on distinct GPUs pass hidden states over NCCL; others (CPU
 * stages, two stages on one GPU) through host memory. */
static int link_stages(Runtime *rt, const RunOptions *o, const int *dev, int n_gpus, Err *err) {
#ifdef CLLM_CUDA
    if (o->cpu || n_gpus == 0) return 0;
    for (int i = 0; i < o->pp; i++)
        for (int j = 0; j < i; j++)
            if (dev[i] == dev[j]) return 0;
    const char *t = getenv("CLLM_PP_TIMEOUT");
    double timeout = t && atof(t) > 0 ? atof(t) : 60.0;
    NcclGroup *g = nccl_group_open(dev, o->pp, timeout, err);
    if (!g) return -1;
    rt->stage_links = g;
    for (int s = 0; s < o->pp; s++)
        if (backend_cuda_link(rt->pp.be[s], g, s, err)) return -1;
#else
    (void)rt, (void)o, (void)dev, (void)n_gpus, (void)err;
#endif
    return 0;
}

static int open_stages(Runtime *rt, const RunOptions *o, int ctx, int block, int chunk, Err *err) {
    const ModelConfig *c = &rt->model.cfg;
    if (o->pp > STAGE_MAX || o->pp > c->n_layers)
        return err_set(err, "--pp %d: the model has %d layers (at most one stage per layer, %d stages)", o->pp,
                       c->n_layers, STAGE_MAX);
    StagePlan plan;
    if ((o->pp_split ? stage_plan_parse(&plan, c, &rt->model.w, o->pp, o->pp_split, err)
                     : stage_plan_balanced(&plan, c, &rt->model.w, o->pp, err)) ||
        pipeline_slice(&rt->pp, &rt->model, &plan, err))
        return -1;
    int dev[STAGE_MAX], n_gpus = 0;
    if (stage_devices(o, o->pp, dev, err)) return -1;
#ifdef CLLM_CUDA
    Err probe = {{0}};
    if (!o->cpu && cuda_device_count(&n_gpus, &probe)) n_gpus = 0;
#endif
    int n_blocks = (ctx + block - 1) / block + 1;
    for (int s = 0; s < o->pp; s++) {
        rt->pp.be[s] = stage_backend(o, &rt->pp.sm[s], dev[s], n_gpus, ctx, block, chunk, n_blocks, err);
        if (!rt->pp.be[s]) return stage_failed(err, s, &plan);
    }
    if (link_stages(rt, o, dev, n_gpus, err)) return -1;
    if (pipeline_kv_blocks(&rt->pp) < n_blocks)
        return err_set(err, "--pp %d: a stage's KV cache holds only %d tokens; use a smaller --ctx-size", o->pp,
                       (pipeline_kv_blocks(&rt->pp) - 1) * block);
    return pipeline_start(&rt->pp, chunk, err);
}

static double pp_timeout(void) {
    const char *t = getenv("CLLM_PP_TIMEOUT");
    return t && atof(t) > 0 ? atof(t) : 60.0;
}

/* Multi-process: this process's GPU is --gpus[rank], else the launcher's
 * local rank (several hosts), else the rank (one host). */
static int own_device(const RunOptions *o, Err *err) {
    int dev[STAGE_MAX];
    if (o->gpus) return stage_devices(o, o->world_size, dev, err) ? -1 : dev[o->rank];
    const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK", NULL};
    for (int i = 0; names[i]; i++)
        if (getenv(names[i]) && *getenv(names[i])) return atoi(getenv(names[i]));
    return o->rank;
}

/* The NCCL communicator of this rank (GPU stages). */
static int join_links(Runtime *rt, Backend *be, const RunOptions *o, const unsigned char *id, int dev, Err *err) {
#ifdef CLLM_CUDA
    NcclGroup *g = nccl_group_join(id, o->rank, o->world_size, dev, pp_timeout(), err);
    if (!g) return -1;
    rt->stage_links = g;
    return backend_cuda_link(be, g, o->rank, err);
#else
    (void)rt, (void)be, (void)o, (void)id, (void)dev;
    return err_set(err, "multi-process GPU stages need a CUDA build");
#endif
}

/* --world-size N: this process builds its own stage only. The last rank
 * listens at --master (it drives: scheduler, sampling, output), the others
 * connect to it; the NCCL id it makes travels with that rendezvous. */
static int open_own_stage(Runtime *rt, const RunOptions *o, int ctx, int block, int chunk, Err *err) {
    const ModelConfig *c = &rt->model.cfg;
    int n = o->world_size, r = o->rank, driver = n - 1;
    if (n > STAGE_MAX || n > c->n_layers)
        return err_set(err, "--world-size %d: the model has %d layers (at most %d stages)", n, c->n_layers, STAGE_MAX);
    StagePlan plan;
    if ((o->pp_split ? stage_plan_parse(&plan, c, &rt->model.w, n, o->pp_split, err)
                     : stage_plan_balanced(&plan, c, &rt->model.w, n, err)) ||
        pipeline_slice(&rt->pp, &rt->model, &plan, err))
        return -1;
    int dev = own_device(o, err), n_gpus = 0;
    if (dev < 0) return -1;
#ifdef CLLM_CUDA
    Err probe = {{0}};
    if (!o->cpu && cuda_device_count(&n_gpus, &probe)) n_gpus = 0;
#endif
    bool gpu = !o->cpu && n_gpus > 0;
    unsigned char id[128] = "cllm-cpu-stages";
#ifdef CLLM_CUDA
    if (gpu && r == driver && nccl_unique_id(id, err)) return -1;
#endif
    int fds[STAGE_MAX];
    if (rendezvous_open(o->master, (r + 1) % n, n, id, sizeof id, (int)(pp_timeout() * 1000), fds, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "rank %d of %d: the start-up rendezvous failed (the last rank listens at --master; its "
                       "peer k there is rank k-1): %s", r, n, why);
    }
    int n_blocks = (ctx + block - 1) / block + 1;
    Backend *be = stage_backend(o, &rt->pp.sm[r], dev, n_gpus, ctx, block, chunk, n_blocks, err);
    if (!be) return stage_failed(err, r, &plan);
    if (r != driver) {
        rt->be = be;
        rt->serving = true;
        rt->serve_fd = fds[0];
        rt->serve_stage = r;
        rt->serve_chunk = chunk;
        return gpu ? join_links(rt, be, o, id, dev, err) : 0;
    }
    rt->pp.be[r] = be;
    int peers[STAGE_MAX];
    for (int s = 0; s < driver; s++) peers[s] = fds[s + 1]; /* rendezvous rank s + 1 is stage s */
    if ((gpu && join_links(rt, be, o, id, dev, err)) || pipeline_set_remote(&rt->pp, peers, pp_timeout(), err))
        return -1;
    if (pipeline_kv_blocks(&rt->pp) < n_blocks)
        return err_set(err, "--world-size %d: a stage's KV cache holds only %d tokens; use a smaller --ctx-size", n,
                       (pipeline_kv_blocks(&rt->pp) - 1) * block);
    return pipeline_start(&rt->pp, chunk, err);
}

int runtime_serve_stage(Runtime *rt, Err *err) {
    int r = rt->serve_stage;
    return stage_serve(rt->be, &rt->pp.sm[r].cfg, r, rt->pp.plan.n_stages, rt->serve_fd, rt->serve_chunk, err);
}

int runtime_open_pipeline(Runtime *rt, const RunOptions *o, int ctx, int block, int chunk, Err *err) {
    int last = o->pp - 1;
    if (o->world_size > 1) {
        if (open_own_stage(rt, o, ctx, block, chunk, err) ||
            (!rt->serving && engine_init_pipeline(&rt->engine, &rt->model, &rt->pp, ctx, chunk, err))) {
            if (rt->serving && rt->be) rt->be->destroy(rt->be);
            Backend *tail = NULL;
            if (!rt->serving && last >= 0 && last < STAGE_MAX) tail = rt->pp.be[last], rt->pp.be[last] = NULL;
            pipeline_free(&rt->pp);
            if (tail) tail->destroy(tail);
#ifdef CLLM_CUDA
            nccl_group_close((NcclGroup *)rt->stage_links);
#endif
            model_free(&rt->model);
            return -1;
        }
        if (rt->serving) return 0;
        rt->be = rt->pp.be[last];
        rt->kv_tokens = (int64_t)pipeline_kv_blocks(&rt->pp) * block;
        return 0;
    }
    if (open_stages(rt, o, ctx, block, chunk, err) ||
        engine_init_pipeline(&rt->engine, &rt->model, &rt->pp, ctx, chunk, err)) {
        Backend *tail = last >= 0 && last < STAGE_MAX ? rt->pp.be[last] : NULL;
        pipeline_free(&rt->pp);
        if (tail) tail->destroy(tail);
#ifdef CLLM_CUDA
        nccl_group_close((NcclGroup *)rt->stage_links);
        rt->stage_links = NULL;
#endif
        model_free(&rt->model);
        return -1;
    }
    rt->be = rt->pp.be[last];
    rt->kv_tokens = (int64_t)pipeline_kv_blocks(&rt->pp) * block;
    if (o->verbose)
        for (int s = 0; s <= last; s++)
            fprintf(stderr, "stage %d on %s: layers %d-%d, KV cache %d blocks of %d\n", s, rt->pp.be[s]->name,
                    rt->pp.plan.first_layer[s], rt->pp.plan.first_layer[s] + rt->pp.plan.n_layers[s] - 1,
                    rt->pp.be[s]->kv_n_blocks, block);
    return 0;
}
