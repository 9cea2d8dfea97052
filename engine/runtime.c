/* runtime.c — opens model, backend and engine for chat and generate. */
#include "engine/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef CLLM_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_link.h"
#endif

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
    if (o->pp > 1 && o->pp != o->world_size)
        return err_set(err, "--pp %d but --world-size %d: one process per stage", o->pp, o->world_size);
    if (o->rank < 0 || o->rank >= o->world_size)
        return err_set(err, "--rank %d: must be in [0, %d)", o->rank, o->world_size);
    if (!o->master) return err_set(err, "--world-size %d: --master ADDR:PORT (or CLLM_MASTER) is needed", o->world_size);
    o->pp = o->world_size;
    return 0;
}

int runtime_open(Runtime *rt, const RunOptions *o, Err *err) {
    memset(rt, 0, sizeof *rt);
    if (o->dummy_weights ? model_load_dummy(&rt->model, o->model, 0, o->dummy_type, err)
                         : model_load(&rt->model, o->model, 0, err))
        return -1;
    const ModelConfig *c = &rt->model.cfg;
    int ctx = o->ctx_size > 0 ? o->ctx_size : (c->ctx_len < 4096 ? c->ctx_len : 4096);
    int block = 16, n_blocks = (ctx + block - 1) / block + 1;
    int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    rt->be = NULL;
    if (!(o->gpu_mem_util > 0 && o->gpu_mem_util <= 1)) {
        model_free(&rt->model);
        return err_set(err, "--gpu-mem-util %g: must be a fraction in (0, 1]", o->gpu_mem_util);
    }
    if (o->pp > 1) return runtime_open_pipeline(rt, o, ctx, block, chunk, err);
#ifdef CLLM_CUDA
    int n_gpus = 0;
    Err probe = {{0}};
    if (!o->cpu && cuda_device_count(&n_gpus, &probe) == 0 && n_gpus > 0) {
        if (o->gpu < 0 || o->gpu >= n_gpus) {
            model_free(&rt->model);
            return err_set(err, "--gpu %d: this machine has %d GPU(s) (0..%d)", o->gpu, n_gpus, n_gpus - 1);
        }
        /* The KV cache takes what --gpu-mem-util leaves after weights and activations. */
        CudaOptions co = {o->gpu, block, 0, ctx, chunk, o->gpu_mem_util, false, false, o->bf16_weights,
                          o->batch_invariant, o->kv_dtype};
        rt->be = backend_cuda_create_opts(c, &rt->model.w, &co, &rt->load_gbps, err);
        if (!rt->be) { model_free(&rt->model); return -1; }
        if (rt->be->kv_n_blocks < n_blocks) {
            int fit = (rt->be->kv_n_blocks - 1) * block;
            rt->be->destroy(rt->be);
            model_free(&rt->model);
            return err_set(err, "GPU %d: the KV cache holds only %d tokens at --gpu-mem-util %.2f; use --ctx-size %d or "
                           "a larger --gpu-mem-util", o->gpu, fit, o->gpu_mem_util, fit > 0 ? fit : 1);
        }
    }
#endif
    if (!rt->be) rt->be = backend_cpu_create_kv(c, &rt->model.w, o->threads, block, n_blocks, o->kv_dtype, err);
    if (!rt->be) { model_free(&rt->model); return -1; }
    rt->kv_tokens = (int64_t)rt->be->kv_n_blocks * block;
    uint64_t wbytes = 0;
#ifdef CLLM_CUDA
    if (rt->load_gbps > 0) wbytes = cuda_weight_bytes(rt->be);
#endif
    if (o->verbose && rt->load_gbps > 0)
        fprintf(stderr, "%s: weights uploaded at %.2f GB/s, %.2f GiB in GPU memory; KV cache %s: %lld tokens (%d "
                "blocks of %d, %.2f GiB, --gpu-mem-util %.2f)\n", rt->be->name, rt->load_gbps, wbytes / 1073741824.0,
                kv_dtype_name(o->kv_dtype), (long long)rt->kv_tokens, rt->be->kv_n_blocks, block,
                (double)rt->kv_tokens * config_kv_bytes_per_token(c, o->kv_dtype) / 1073741824.0, o->gpu_mem_util);
    if (engine_init(&rt->engine, &rt->model, rt->be, ctx, chunk, err)) {
        rt->be->destroy(rt->be);
        model_free(&rt->model);
        return -1;
    }
    return 0;
}

int runtime_serve_main(const RunOptions *o, const char *cmd) {
    Runtime rt;
    Err err = {{0}};
    if (runtime_open(&rt, o, &err)) { fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, o->rank, err.msg); return 2; }
    if (o->verbose)
        fprintf(stderr, "cllm %s: rank %d of %d serves stage %d (layers %d-%d) on %s\n", cmd, o->rank, o->world_size,
                rt.serve_stage, rt.pp.plan.first_layer[rt.serve_stage],
                rt.pp.plan.first_layer[rt.serve_stage] + rt.pp.plan.n_layers[rt.serve_stage] - 1, rt.be->name);
    int rc = runtime_serve_stage(&rt, &err);
    if (rc) fprintf(stderr, "cllm %s: rank %d: %s\n", cmd, o->rank, err.msg);
    runtime_close(&rt);
    return rc ? 2 : 0;
}

void runtime_close(Runtime *rt) {
    if (rt->serving && rt->serve_fd >= 0) close(rt->serve_fd);
    engine_free(&rt->engine);
    pipeline_free(&rt->pp);
    if (rt->be) rt->be->destroy(rt->be);
#ifdef CLLM_CUDA
    nccl_group_close((NcclGroup *)rt->stage_links);
#endif
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
