/* pipeline_open.h — a pipeline built from a loaded model: the stage plan,
 * a backend per stage (a GPU each, or CPU backends) and the links between
 * them; or, with one process per stage (several hosts, mpirun), this
 * process's stage only, the last rank driving the others.
 *
 * After pipeline_open the last stage's backend (p->be[n - 1]) and
 * pipeline_kv_blocks(p) are what the engine runs on (engine_init_stages
 * with pipeline_stages(p)); a rank that serves a stage for the driver has
 * p->serving set instead and runs pipeline_serve until told to stop. */
#ifndef CLLM_PIPELINE_OPEN_H
#define CLLM_PIPELINE_OPEN_H

#include <stdbool.h>

#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/pipeline.h"

typedef struct {
    int n_stages;
    const char *split;          /* layers per stage ("14,18"), or NULL: balanced by weight bytes */
    const char *gpus;           /* the stages' GPUs ("0,1"), or NULL: 0, 1, ... */
    bool cpu;                   /* CPU backends, GPUs or not */
    int tp;                     /* > 1: each stage a tensor-parallel group of tp ranks (one process) */
    BackendOptions backend;     /* every stage's (the device is set per stage) */
    int ctx_tokens;             /* tokens of one sequence: every stage's KV cache must hold them */
    int rank, world_size;       /* one process per stage: this one's rank of world_size (> 1); else 0, 0 */
    const char *master;         /* ADDR:PORT where the last rank listens */
    double timeout_s;           /* a peer silent this long fails the step (CLLM_PP_TIMEOUT, default 60) */
} PipelineOptions;

int pipeline_open(Pipeline *p, const Model *m, const PipelineOptions *o, Err *err);
/* After pipeline_slice: every stage's backend into p->be[] (with o->tp > 1
 * its group into p->tp[]), stage s on GPU dev[s] (its ranks on
 * dev[s * tp + r]; n_gpus 0: CPU backends). concurrent: a thread per stage, for
 * stages on GPUs of their own (pipeline_open's choice); else in stage
 * order, as a shared GPU needs. The first failing stage by stage order is
 * reported, naming it; backends made stay in p for pipeline_close. Sets
 * p->concurrent and, made, p->made_s. */
int pipeline_make_backends(Pipeline *p, const PipelineOptions *o, const int *dev, int n_gpus, bool concurrent,
                           Err *err);
/* A serving rank's loop: runs its stage for the driving process until it says stop. */
int pipeline_serve(Pipeline *p, Err *err);
/* Frees the pipeline (pipeline_free: every backend, the last stage's,
 * the engine's, included, so after the engine is gone), then closes the
 * links. */
void pipeline_close(Pipeline *p);

#endif
