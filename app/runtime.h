/* runtime.h — what `cllm chat` and `cllm generate` share: the options parsed
 * by main.c, and the model + backend + engine they open. */
#ifndef CLLM_RUNTIME_H
#define CLLM_RUNTIME_H

#include <stdbool.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "parallel/pipeline_open.h"
#include "parallel/tp.h"
#include "parallel/tp_process.h"
#include "tokenizer/chat_template.h"

typedef struct {
    const char *model;            /* NULL: the default model (main.c resolves it) */
    bool cpu;                     /* force the CPU backend */
    int gpu;                      /* CUDA device index */
    float gpu_mem_util;           /* fraction of the GPU's memory to use, in (0, 1] (run_options_default: 0.9) */
    int threads;                  /* CPU threads; <= 0: one per core */
    int ctx_size;                 /* tokens per sequence; <= 0: min(model context, 4096) */
    int max_tokens;               /* per reply; <= 0: until the context is full (chat), 512 (generate) */
    int prefill_chunk;            /* tokens per forward step */
    SamplerParams sampling;
    int pp;                       /* pipeline stages (one GPU each); <= 1: none */
    const char *pp_split;         /* layers per stage ("14,18"), or NULL: balanced by bytes */
    int tp;                       /* tensor-parallel ranks (per pipeline stage with --pp); <= 1: none */
    bool tp_nccl_sum;             /* --tp on GPUs over NCCL: ncclAllReduce's sum, not the rank-order one */
    const char *gpus;             /* every stage's and rank's GPU ("0,1"; parallel/placement.h), or NULL: 0, 1, ... */
    const char *chat_template;    /* family name override, or NULL */
    const char *system;           /* system prompt, or NULL */
    bool ignore_eos;
    bool verbose;
    bool host_sampling;           /* draw tokens on the host even where the GPU could */
    bool bf16_weights;            /* GPU: quantized matrices as bf16 too (--bf16-weights) */
    bool dummy_weights;           /* MODEL_LOAD_DUMMY_WEIGHTS: random weights of the config's shapes (benchmarks) */
    DType dummy_type;             /* their matrices' type (--dummy-weights=TYPE; run_options_default: bf16) */
    int rank, world_size;         /* multi-process pipeline: this process's stage of world_size (> 1) */
    const char *master;           /* ADDR:PORT where the last rank (the driver) listens */
    bool batch_invariant;         /* GPU: each sequence's results independent of the batch it runs in */
    KVDtype kv_dtype;             /* KV cache elements (--kv-dtype): bf16 (fp32 on the CPU) or fp8 e4m3 + scales */
    const char *kv_scales;        /* --kv-scales: "dynamic", "checkpoint", "calibrate" (base/dtype.h KVScales), or
                                     NULL: checkpoint where the model has KV cache scales and the cache is fp8 */
    const char *weights;          /* --weights: "fp8" quantizes float matrices at load (MODEL_LOAD_WEIGHTS_FP8); NULL/"file": as stored */
} RunOptions;

void run_options_default(RunOptions *o);
/* rank / world size / master left unset on the command line from the
 * launcher's environment (mpirun: OMPI_COMM_WORLD_RANK / _SIZE; PMI_RANK /
 * PMI_SIZE; CLLM_MASTER); -1 with err when they contradict --pp. */
int run_options_from_env(RunOptions *o, Err *err);
/* This process serves another one (multi-process): a pipeline stage (not
 * the last rank, which drives), a tensor-parallel rank (not rank 0), or
 * with both a rank of a stage (not the last stage's rank 0: world rank
 * (P-1)*N, parallel/process_grid.h). */
static inline bool run_options_serves_stage(const RunOptions *o) {
    int driver = o->tp > 1 && o->pp > 1 ? (o->pp - 1) * o->tp : o->tp > 1 ? 0 : o->world_size - 1;
    return o->world_size > 1 && o->rank != driver;
}

typedef struct {
    Model model;
    Backend *be;
    Engine engine;
    char bos_text[64], eos_text[64];  /* the texts of BOS and EOS, for templates */
    double load_gbps;                 /* weight upload rate to the GPU (0 on the CPU) */
    int64_t kv_tokens;                /* tokens the KV cache holds */
    KVScales kv_scales;               /* where the fp8 cache's scales come from (--kv-scales resolved) */
    Pipeline pp;                      /* the stages, when o->pp > 1 (pp.serving: this rank serves one, no engine) */
    bool pipelined;
    TpRanks tp;                       /* the ranks, when o->tp > 1 without --pp (with it: the pipeline's stages hold them) */
    bool tensor_parallel;
    TpProcess tpp;                    /* this process's rank, with --tp N --world-size N (tpp.rank > 0: it serves) */
    bool tp_processes;
    double model_s, gpus_s, open_s;   /* runtime_open's seconds: the model's tensors (read, or made with
                                       * --dummy-weights), counting the GPUs (the driver's start; it runs beside
                                       * the tensors, so only what it took beyond them), then the backends, their
                                       * links and the engine (-v's load line) */
} Runtime;

/* Loads o->model and builds the backend and engine. Prints nothing but a
 * line on stderr where the backends run otherwise than asked (no usable
 * GPU; tensor-parallel ranks exchanging through host memory) and, with
 * o->verbose, where each runs. */
int runtime_open(Runtime *rt, const RunOptions *o, Err *err);
void runtime_close(Runtime *rt);
/* -v: the step limits a command's schedulers took (o: what the options
 * asked, 0 for the default) and, for a default, the KV-cache rule behind
 * it (engine_auto_max_seqs), on stderr. */
void runtime_print_limits(const char *cmd, const Runtime *rt, const SchedOptions *asked, const SchedOptions *took,
                          int n_engines);
/* chat / generate on a rank that serves a stage: open, serve, close; the exit code. */
int runtime_serve_main(const RunOptions *o, const char *cmd);

/* The chat template to use: the family named by override (or NULL), else the
 * one the model's template string (or, lacking one, its special tokens)
 * belongs to. The template keeps pointers into rt: it lives as long as rt. */
int runtime_chat_template(Runtime *rt, const char *override, ChatTemplate *t, Err *err);

#endif
