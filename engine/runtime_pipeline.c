/* runtime_pipeline.c — `--pp N`: the model split into N stages, a backend
 * per stage (a GPU each, or CPU backends with --cpu), the engine over them
 * (parallel/pipeline.h). */
#include "engine/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CLLM_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
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
        CudaOptions co = {dev, block, 0, ctx, chunk, o->gpu_mem_util, false, false, o->bf16_weights, o->kv_dtype};
        return backend_cuda_create_opts(&sm->cfg, &sm->w, &co, NULL, err);
    }
#endif
    (void)dev, (void)n_gpus, (void)ctx, (void)chunk;
    return backend_cpu_create_kv(&sm->cfg, &sm->w, o->threads, block, n_blocks, o->kv_dtype, err);
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
    if (pipeline_kv_blocks(&rt->pp) < n_blocks)
        return err_set(err, "--pp %d: a stage's KV cache holds only %d tokens; use a smaller --ctx-size", o->pp,
                       (pipeline_kv_blocks(&rt->pp) - 1) * block);
    return pipeline_start(&rt->pp, chunk, err);
}

int runtime_open_pipeline(Runtime *rt, const RunOptions *o, int ctx, int block, int chunk, Err *err) {
    int last = o->pp - 1;
    if (open_stages(rt, o, ctx, block, chunk, err) ||
        engine_init_pipeline(&rt->engine, &rt->model, &rt->pp, ctx, chunk, err)) {
        Backend *tail = last >= 0 && last < STAGE_MAX ? rt->pp.be[last] : NULL;
        pipeline_free(&rt->pp);
        if (tail) tail->destroy(tail);
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
