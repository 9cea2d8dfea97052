/* runtime.c — opens model, backend and engine for chat and generate. */
#include "app/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/models.h"
#include "base/clock.h"
#include "base/thread_each.h"

void run_options_default(RunOptions *o) {
    memset(o, 0, sizeof *o);
    o->prefill_chunk = 256;
    o->gpu_mem_util = 0.9f;
    o->dummy_type = DT_BF16;
    o->sampling = sampler_params_default();
}

static int env_int(const char *const *names, int fallback) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

int run_options_from_env(RunOptions *o, Err *err) {
    static const char *const rank[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", NULL};
    static const char *const size[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    if (o->world_size <= 0) o->world_size = env_int(size, 0);
    if (o->world_size > 1 && o->rank <= 0) o->rank = env_int(rank, o->rank);
    if (!o->master) o->master = getenv("CLLM_MASTER");
    if (o->world_size <= 1) return 0;
    if (o->tp > 1 && o->pp > 1 && o->pp * o->tp != o->world_size)
        return err_set(err, "--pp %d --tp %d but --world-size %d: one process per stage and rank, %d", o->pp, o->tp,
                       o->world_size, o->pp * o->tp);
    if (o->tp > 1 && o->pp <= 1 && o->tp != o->world_size)
        return err_set(err, "--tp %d but --world-size %d: one process per tensor-parallel rank", o->tp, o->world_size);
    if (o->pp > 1 && o->tp <= 1 && o->pp != o->world_size)
        return err_set(err, "--pp %d but --world-size %d: one process per stage", o->pp, o->world_size);
    if (o->rank < 0 || o->rank >= o->world_size)
        return err_set(err, "--rank %d: must be in [0, %d)", o->rank, o->world_size);
    if (!o->master) return err_set(err, "--world-size %d: --master ADDR:PORT (or CLLM_MASTER) is needed", o->world_size);
    if (o->tp <= 1) o->pp = o->world_size;
    return 0;
}

/* What every backend of the run shares (the device is the caller's). */
static BackendOptions backend_options(const Runtime *rt, const RunOptions *o, const ModelConfig *c, int ctx, int block,
                                      int chunk) {
    BackendOptions bo = {.device = -1, .threads = o->threads, .block_size = block, .max_seq_tokens = ctx,
                         .max_tokens = chunk, .mem_util = o->gpu_mem_util, .kv_dtype = o->kv_dtype,
                         .kv_scales = rt->kv_scales,
                         .bf16_weights = o->bf16_weights, .batch_invariant = o->batch_invariant,
                         .tp_nccl_sum = o->tp_nccl_sum};
    forward_buffer_elems(c, chunk, &bo.act_elems, &bo.f32_elems);
    return bo;
}

static double pp_timeout(void) {
    const char *t = getenv("CLLM_PP_TIMEOUT");
    return t && atof(t) > 0 ? atof(t) : 60.0;
}

/* The one-line notes of tensor-parallel groups whose GPU ranks exchange
 * through host memory (a note repeated by the next stage's group is said once). */
static void print_tp_notes(TpRanks *const *groups, int n) {
    const char *last = "";
    for (int s = 0; s < n; s++)
        if (groups[s] && groups[s]->note[0] && strcmp(groups[s]->note, last)) {
            fprintf(stderr, "cllm: %s\n", groups[s]->note);
            last = groups[s]->note;
        }
}

static void print_tp_ranks(const TpRanks *t, const char *indent) {
    const TpPlan *p = &t->plan;
    for (int r = 0; r < p->n_ranks; r++)
        fprintf(stderr, "%stensor-parallel rank %d on %s: heads %d-%d, KV heads %d-%d, MLP columns %d-%d, vocab %d-%d%s\n",
                indent, r, t->be[r]->name, p->head0[r], p->head0[r] + p->n_heads[r] - 1, p->kv0[r],
                p->kv0[r] + p->n_kv[r] - 1, p->ffn0[r], p->ffn0[r] + p->n_ffn[r] - 1, p->vocab0[r],
                p->vocab0[r] + p->n_vocab[r] - 1,
                t->be[r]->device < 0 ? "" : t->links ? ", NCCL" : ", through host memory");
}

/* The stages of --pp N (one process) or --world-size N (this rank's), and
 * the engine over them where this process drives. */
static int open_pipeline(Runtime *rt, const RunOptions *o, int ctx, int block, int chunk, Err *err) {
    PipelineOptions po = {.n_stages = o->pp, .split = o->pp_split, .gpus = o->gpus, .cpu = o->cpu, .tp = o->tp,
                          .backend = backend_options(rt, o, &rt->model.cfg, ctx, block, chunk), .ctx_tokens = ctx,
                          .rank = o->rank, .world_size = o->world_size, .master = o->master,
                          .timeout_s = pp_timeout()};
    if (pipeline_open(&rt->pp, &rt->model, &po, err)) return -1;
    rt->pipelined = true;
    const TpProcess *own = rt->pp.tpp; /* --pp P --tp N as processes: this one's rank of its stage's group */
    if (own && own->note[0])
        fprintf(stderr, "cllm: %s%s\n", own->note, o->tp_nccl_sum ? "; --tp-nccl-sum has no effect there" : "");
    if (own && o->verbose && !rt->pp.serving)
        fprintf(stderr, "stage %d's tensor-parallel rank 0 (rank %d of %d, the driver) on %s%s\n", own->stage, o->rank,
                o->world_size, own->be->name, own->be->device < 0 ? "" : own->nccl ? ", NCCL" : ", through host memory");
    if (rt->pp.serving) {
        rt->be = rt->pp.be[rt->pp.serve_stage];
        return 0;
    }
    int last = o->pp - 1;
    rt->be = rt->pp.be[last];
    rt->kv_tokens = (int64_t)pipeline_kv_blocks(&rt->pp) * block;
    ForwardStages stages = pipeline_stages(&rt->pp);
    if (engine_init_stages(&rt->engine, &rt->model, pipeline_stage_cfg(&rt->pp, last), rt->be,
                           pipeline_kv_blocks(&rt->pp), &stages, ctx, chunk, err))
        return -1;
    print_tp_notes(rt->pp.tp, o->pp);
    if (o->verbose && o->world_size <= 1) {
        char groups[64] = "";
        if (o->tp > 1) snprintf(groups, sizeof groups, " (groups of %d tensor-parallel ranks)", o->tp);
        fprintf(stderr, "pipeline: %d stage backends%s made in %.2f s, %s\n", o->pp, groups, rt->pp.made_s,
                rt->pp.concurrent ? "concurrently" : "one after another");
    }
    for (int s = 0; o->verbose && s <= last && o->world_size <= 1; s++) {
        fprintf(stderr, "stage %d on %s: layers %d-%d, KV cache %d blocks of %d\n", s, rt->pp.be[s]->name,
                rt->pp.plan.first_layer[s], rt->pp.plan.first_layer[s] + rt->pp.plan.n_layers[s] - 1,
                rt->pp.be[s]->kv_n_blocks, block);
        if (rt->pp.tp[s]) print_tp_ranks(rt->pp.tp[s], "  ");
    }
    return 0;
}

/* --tp N without --pp: N rank backends in one group, rank 0 the engine's,
 * the others on their threads (parallel/tp.h): on GPUs 0..N-1 or the --gpus
 * list (placement.h), else CPU backends. */
static int open_tensor_parallel(Runtime *rt, const RunOptions *o, int n_gpus, int ctx, int block, int chunk,
                                Err *err) {
    const Model *m = &rt->model;
    BackendOptions bo = backend_options(rt, o, &m->cfg, ctx, block, chunk);
    int n_blocks = (ctx + block - 1) / block + 1, dev[TP_MAX];
    TpPlacement where;
    if (n_gpus > 0) {
        if (o->gpu > 0 && !o->gpus)
            return err_set(err, "--gpu %d with --tp %d: --gpus names every rank's GPU (e.g. --gpus %d,%d%s)", o->gpu,
                           o->tp, o->gpu, o->gpu + 1, o->tp > 2 ? ",..." : "");
        if (placement_devices(o->gpus, 1, o->tp, n_gpus, dev, err)) return -1;
        placement_group(dev, o->tp, 0, o->tp, &where);
        where.timeout_s = pp_timeout();
        bo.device = dev[0];
        bo.n_blocks = 0; /* by the memory budget: tp_ranks_open plans every rank's share */
    } else {
        placement_same(-1, o->tp, &where);
        bo.device = -1;
        bo.n_blocks = n_blocks;
    }
    if (tp_ranks_open(&rt->tp, &m->cfg, &m->shape, &m->w, o->tp, &bo, &where, "the model", err)) {
        Backend *b0 = rt->tp.be[0];
        tp_ranks_free(&rt->tp);
        if (b0) b0->destroy(b0);
        return -1;
    }
    rt->tensor_parallel = true;
    rt->be = rt->tp.be[0];
    rt->kv_tokens = (int64_t)rt->be->kv_n_blocks * block;
    TpRanks *groups[1] = {&rt->tp};
    print_tp_notes(groups, 1);
    if (o->verbose) {
        print_tp_ranks(&rt->tp, "");
        fprintf(stderr, "tensor parallel: KV cache of %lld tokens on every rank (%d blocks of %d, its KV heads only)\n",
                (long long)rt->kv_tokens, rt->be->kv_n_blocks, block);
    }
    if (rt->be->kv_n_blocks < n_blocks) {
        int fit = (rt->be->kv_n_blocks - 1) * block;
        return err_set(err, "--tp %d: each rank's KV cache holds only %d tokens at --gpu-mem-util %.2f; use --ctx-size "
                       "%d or a larger --gpu-mem-util", o->tp, fit, o->gpu_mem_util, fit > 0 ? fit : 1);
    }
    ForwardStages stages = tp_stages(&rt->tp);
    return engine_init_stages(&rt->engine, m, tp_ranks_cfg(&rt->tp), rt->be, rt->be->kv_n_blocks, &stages, ctx, chunk,
                              err);
}

/* --tp N --world-size N: this process's rank (parallel/tp_process.h) on
 * its GPU (its --gpus entry, else the launcher's local rank, else the rank)
 * or the CPU; rank 0 runs the engine over the group, the others serve. */
static int open_tp_processes(Runtime *rt, const RunOptions *o, int n_gpus, int ctx, int block, int chunk,
                             Err *err) {
    const Model *m = &rt->model;
    BackendOptions bo = backend_options(rt, o, &m->cfg, ctx, block, chunk);
    int n_blocks = (ctx + block - 1) / block + 1;
    bo.device = n_gpus > 0 ? placement_own_device(o->gpus, 1, o->tp, o->rank, err) : -1;
    if (n_gpus > 0 && bo.device < 0) return -1;
    if (n_gpus > 0 && bo.device >= n_gpus)
        return err_set(err, "tensor-parallel rank %d: GPU %d, this machine has %d", o->rank, bo.device, n_gpus);
    bo.n_blocks = n_gpus > 0 ? 0 : n_blocks;
    TpProcessAt at = {.n = o->tp, .rank = o->rank, .stage = 0, .n_stages = 1, .master = o->master,
                      .timeout_s = pp_timeout()};
    int dev[TP_MAX];
    TpPlacement where;
    if (n_gpus > 0 && o->gpus) { /* the list's shared GPUs: host memory, as `cllm info --tp N --gpus` says */
        if (placement_devices(o->gpus, 1, o->tp, n_gpus, dev, err)) return -1;
        placement_group(dev, o->tp, 0, o->tp, &where);
        at.where = &where;
        bo.gpu_share = where.gpu_share[o->rank]; /* the processes on its GPU share what --gpu-mem-util leaves */
    }
    if (tp_process_open(&rt->tpp, &m->cfg, &m->shape, &m->w, &at, &bo, err)) {
        tp_process_close(&rt->tpp);
        return -1;
    }
    rt->tp_processes = true;
    rt->be = rt->tpp.be;
    if (rt->tpp.note[0])
        fprintf(stderr, "cllm: %s%s\n", rt->tpp.note, o->tp_nccl_sum ? "; --tp-nccl-sum has no effect there" : "");
    if (o->verbose)
        fprintf(stderr, "tensor-parallel rank %d of %d (a process) on %s: heads %d-%d, KV heads %d-%d, %s\n", o->rank,
                o->tp, rt->be->name, rt->tpp.plan.head0[o->rank], rt->tpp.plan.head0[o->rank] +
                rt->tpp.plan.n_heads[o->rank] - 1, rt->tpp.plan.kv0[o->rank], rt->tpp.plan.kv0[o->rank] +
                rt->tpp.plan.n_kv[o->rank] - 1, rt->tpp.nccl ? "NCCL" : "host memory and sockets");
    if (rt->tpp.rank > 0) return 0;
    rt->kv_tokens = (int64_t)rt->tpp.kv_blocks * block;
    if (rt->tpp.kv_blocks < n_blocks) {
        int fit = (rt->tpp.kv_blocks - 1) * block;
        return err_set(err, "--tp %d: a rank's KV cache holds only %d tokens at --gpu-mem-util %.2f; use --ctx-size "
                       "%d or a larger --gpu-mem-util", o->tp, fit, o->gpu_mem_util, fit > 0 ? fit : 1);
    }
    ForwardStages stages = tp_process_stages(&rt->tpp);
    return engine_init_stages(&rt->engine, m, &rt->tpp.rm.cfg, rt->be, rt->tpp.kv_blocks, &stages, ctx, chunk, err);
}

/* One backend: the GPU unless --cpu or none is there (n_gpus); its KV cache
 * takes what --gpu-mem-util leaves after weights and activations. */
static int open_backend(Runtime *rt, const RunOptions *o, int n_gpus, int ctx, int block, int chunk, Err *err) {
    const ModelConfig *c = &rt->model.cfg;
    BackendOptions bo = backend_options(rt, o, c, ctx, block, chunk);
    int n_blocks = (ctx + block - 1) / block + 1;
    if (n_gpus > 0 && (o->gpu < 0 || o->gpu >= n_gpus))
        return err_set(err, "--gpu %d: this machine has %d GPU(s) (0..%d)", o->gpu, n_gpus, n_gpus - 1);
    bo.device = n_gpus > 0 ? o->gpu : -1;
    bo.n_blocks = n_gpus > 0 ? 0 : n_blocks;
    if (!(rt->be = backend_create(&rt->model.shape, &rt->model.w, &bo, err))) return -1;
    if (rt->be->kv_n_blocks < n_blocks) {
        int fit = (rt->be->kv_n_blocks - 1) * block;
        return err_set(err, "GPU %d: the KV cache holds only %d tokens at --gpu-mem-util %.2f; use --ctx-size %d or "
                       "a larger --gpu-mem-util", o->gpu, fit, o->gpu_mem_util, fit > 0 ? fit : 1);
    }
    rt->kv_tokens = (int64_t)rt->be->kv_n_blocks * block;
    rt->load_gbps = rt->be->load_gbps;
    if (o->verbose && rt->load_gbps > 0)
        fprintf(stderr, "%s: weights uploaded at %.2f GB/s, %.2f GiB in GPU memory; KV cache %s: %lld tokens (%d "
                "blocks of %d, %.2f GiB, --gpu-mem-util %.2f)\n", rt->be->name, rt->load_gbps,
                rt->be->weight_bytes / 1073741824.0, kv_dtype_name(o->kv_dtype), (long long)rt->kv_tokens,
                rt->be->kv_n_blocks, block,
                (double)rt->kv_tokens * config_kv_bytes_per_token(c, o->kv_dtype) / 1073741824.0, o->gpu_mem_util);
    return engine_init(&rt->engine, &rt->model, rt->be, ctx, chunk, err);
}

/* The usable GPUs (n_gpus), and where there are none, one line saying why.
 * A GPU named explicitly (--gpu N > 0, --gpus) cannot be honoured on the CPU:
 * an error. --pp N runs its stages on the CPU (a pipeline of CPU stages is a
 * real configuration), saying so. */
static int gpu_fallback(const RunOptions *o, int *n_gpus, Err *err) {
    Err why = {{0}};
    if ((*n_gpus = backend_gpu_count(&why)) > 0) return 0;
    const char *reason = why.msg[0] ? why.msg : "this cllm is a CPU-only build";
    if (o->gpus && o->gpus[0])
        return err_set(err, "--gpus '%s': no usable GPU here (%s); leave --gpus out, or add --cpu, to run on the CPU",
                       o->gpus, reason);
    if (o->gpu > 0)
        return err_set(err, "--gpu %d: no usable GPU here (%s); leave --gpu out, or add --cpu, to run on the CPU",
                       o->gpu, reason);
    if (o->pp > 1) fprintf(stderr, "cllm: %s; --pp %d runs its stages on the CPU\n", reason, o->pp);
    else if (o->tp > 1) fprintf(stderr, "cllm: %s; --tp %d runs its ranks on the CPU\n", reason, o->tp);
    else if (why.msg[0]) fprintf(stderr, "cllm: %s; running on the CPU\n", why.msg); /* a CUDA build */
    return 0;
}

/* --kv-scales against the model: checkpoint needs its scales; left out,
 * an fp8 cache takes them where the model has them. */
static int resolve_kv_scales(const RunOptions *o, const Model *m, KVScales *out, Err *err) {
    bool has = m->cfg.n_layers > 0 && m->w.layers && m->w.layers[0].kv_scales.data;
    *out = o->kv_dtype == KV_DTYPE_FP8 && has ? KV_SCALES_CHECKPOINT : KV_SCALES_DYNAMIC;
    if (!o->kv_scales) return 0;
    if (kv_scales_from_name(o->kv_scales, out))
        return err_set(err, "--kv-scales '%s': expected one of %s", o->kv_scales, KV_SCALES_NAMES);
    if (*out != KV_SCALES_DYNAMIC && o->kv_dtype != KV_DTYPE_FP8)
        return err_set(err, "--kv-scales %s: only an fp8 KV cache has scales; add --kv-dtype fp8", o->kv_scales);
    if (*out == KV_SCALES_CHECKPOINT && !has)
        return err_set(err, "--kv-scales checkpoint: %s has no KV cache scales (k_scale / v_scale tensors); use "
                       "--kv-scales calibrate or dynamic", m->path);
    return 0;
}

/* The two jobs of a load that need nothing from each other: the model's
 * tensors (read, or made) and the GPUs' count (the driver's start, ~0.2-0.4 s
 * on an H200 machine), run side by side (thread_each). */
typedef struct {
    const RunOptions *o;
    Model *model;
    int model_rc, gpu_rc, n_gpus;
    Err model_err, gpu_err;
    double model_end, gpu_end;
} LoadJobs;

static void load_job(void *ctx, int i) {
    LoadJobs *j = (LoadJobs *)ctx;
    const RunOptions *o = j->o;
    if (i == 0) {
        int flags = o->weights && !strcmp(o->weights, "fp8") ? MODEL_LOAD_WEIGHTS_FP8 : 0;
        j->model_rc = o->dummy_weights ? model_load_dummy(j->model, o->model, flags, o->dummy_type, &j->model_err)
                                       : model_load(j->model, o->model, flags, &j->model_err);
        j->model_end = now_seconds();
    } else {
        j->gpu_rc = o->cpu ? 0 : gpu_fallback(o, &j->n_gpus, &j->gpu_err);
        j->gpu_end = now_seconds();
    }
}

int runtime_open(Runtime *rt, const RunOptions *o, Err *err) {
    memset(rt, 0, sizeof *rt);
    if (!(o->gpu_mem_util > 0 && o->gpu_mem_util <= 1))
        return err_set(err, "--gpu-mem-util %g: must be a fraction in (0, 1]", o->gpu_mem_util);
    LoadJobs jobs = {.o = o, .model = &rt->model};
    double t0 = now_seconds();
    thread_each(2, load_job, &jobs);
    if (jobs.model_rc) {
        *err = jobs.model_err;
        return -1;
    }
    rt->model_s = jobs.model_end - t0;
    app_warn_unused(&rt->model);
    int bad = resolve_kv_scales(o, &rt->model, &rt->kv_scales, err);
    if (!bad && jobs.gpu_rc) {
        *err = jobs.gpu_err;
        bad = -1;
    }
    if (bad) {
        runtime_close(rt);
        return -1;
    }
    const ModelConfig *c = &rt->model.cfg;
    int ctx = o->ctx_size > 0 ? o->ctx_size : (c->ctx_len < 4096 ? c->ctx_len : 4096);
    int block = 16, chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    double t1 = jobs.model_end, t2 = jobs.gpu_end > t1 ? jobs.gpu_end : t1;
    int n_gpus = jobs.n_gpus;
    int rc = o->pp > 1                           ? open_pipeline(rt, o, ctx, block, chunk, err)
             : o->tp > 1 && o->world_size > 1 ? open_tp_processes(rt, o, n_gpus, ctx, block, chunk, err)
             : o->tp > 1                         ? open_tensor_parallel(rt, o, n_gpus, ctx, block, chunk, err)
                         : open_backend(rt, o, n_gpus, ctx, block, chunk, err);
    if (rc) {
        runtime_close(rt);
        return rc;
    }
    rt->gpus_s = t2 - t1;           /* what the GPUs' count took beyond the tensors */
    rt->open_s = now_seconds() - t2;
    return 0;
}

int runtime_serve_main(const RunOptions *o, const char *cmd) {
    Runtime rt;
    Err err = {{0}};
    if (runtime_open(&rt, o, &err)) { fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, o->rank, err.msg); return 2; }
    if (rt.tp_processes) {
        if (o->verbose)
            fprintf(stderr, "cllm %s: rank %d of %d serves tensor-parallel rank %d on %s\n", cmd, o->rank,
                    o->world_size, rt.tpp.rank, rt.be->name);
        int rc = tp_process_serve(&rt.tpp, o->prefill_chunk > 0 ? o->prefill_chunk : 256, &err);
        if (rc) fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, o->rank, err.msg);
        runtime_close(&rt);
        return rc ? 2 : 0;
    }
    int r = rt.pp.serve_stage;
    char rank[48] = "";
    if (rt.pp.tpp) snprintf(rank, sizeof rank, "'s tensor-parallel rank %d", rt.pp.tpp->rank);
    if (o->verbose)
        fprintf(stderr, "cllm %s: rank %d of %d serves stage %d%s (layers %d-%d) on %s%s\n", cmd, o->rank,
                o->world_size, r, rank, rt.pp.plan.first_layer[r], rt.pp.plan.first_layer[r] + rt.pp.plan.n_layers[r] - 1,
                rt.be->name, !rt.pp.tpp || rt.be->device < 0 ? "" : rt.pp.tpp->nccl ? ", NCCL" : ", through host memory");
    int rc = pipeline_serve(&rt.pp, &err);
    if (rc) fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, o->rank, err.msg);
    runtime_close(&rt);
    return rc ? 2 : 0;
}

void runtime_print_limits(const char *cmd, const Runtime *rt, const SchedOptions *asked, const SchedOptions *took,
                          int n_engines) {
    const Engine *e = &rt->engine;
    int seq_tokens = e->ctx_limit < ENGINE_AUTO_SEQ_TOKENS ? e->ctx_limit : ENGINE_AUTO_SEQ_TOKENS;
    fprintf(stderr, "cllm %s: %d sequences and %d tokens per step", cmd, took->max_seqs, took->max_batched_tokens);
    if (asked->max_seqs <= 0)
        fprintf(stderr, " (sequences: the KV cache's %d blocks of %d%s hold %d sequences of %d tokens, kept in "
                "[%d, %d])", e->pool.n_blocks, e->block_size, n_engines > 1 ? " over the virtual engines" : "",
                e->pool.n_blocks / (n_engines > 0 ? n_engines : 1) / ((seq_tokens + e->block_size - 1) / e->block_size),
                seq_tokens, ENGINE_AUTO_MIN_SEQS, ENGINE_AUTO_MAX_SEQS);
    fprintf(stderr, "\n");
}

void runtime_close(Runtime *rt) {
    engine_free(&rt->engine);
    if (rt->pipelined) pipeline_close(&rt->pp); /* the stages' backends, the engine's included */
    if (rt->tensor_parallel) tp_ranks_free(&rt->tp); /* ranks 1..N-1; rank 0's backend is rt->be */
    if (rt->tp_processes) tp_process_close(&rt->tpp); /* this rank's backend (rt->be) included */
    if (!rt->pipelined && !rt->tp_processes && rt->be) rt->be->destroy(rt->be);
    model_free(&rt->model);
    memset(rt, 0, sizeof *rt);
}

static void token_text(const Tokenizer *tok, int32_t id, char *out, size_t cap) {
    int n = id >= 0 ? tokenizer_token_bytes(tok, id, out, cap - 1) : 0;
    out[n > 0 ? n : 0] = 0;
}

int runtime_chat_template(Runtime *rt, const char *override, ChatTemplate *t, Err *err) {
    const Tokenizer *tok = rt->model.tok;
    const char *tmpl = tokenizer_chat_template(tok);
    ChatFamily f = tmpl ? chat_template_detect(tmpl) : chat_template_guess(tok);
    if (override && chat_family_from_name(override, &f))
        return err_set(err, "unknown chat template '%s' (known: %s)", override, chat_family_names());
    token_text(tok, tokenizer_bos(tok), rt->bos_text, sizeof rt->bos_text);
    token_text(tok, tokenizer_eos(tok), rt->eos_text, sizeof rt->eos_text);
    chat_template_init(t, f, tmpl, rt->bos_text, rt->eos_text);
    return 0;
}
