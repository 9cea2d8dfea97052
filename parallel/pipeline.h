/* pipeline.h — a model run as a chain of pipeline stages, one backend each.
 *
 * The engine owns the last stage (its backend samples and its Forward holds
 * the logits); the stages before it live here. A step runs stage 0, then
 * hands the residual stream x (fp32) and the pending sublayer output proj
 * of its rows to stage 1, and so on to the engine's. This version hands
 * them over through host memory, one stage after another (no overlap of
 * stages: every GPU but one idles); NCCL transfers and virtual engines that
 * keep all stages busy are the next steps (issue 6).
 *
 * Use: pipeline_slice (the stages' model slices), make a backend for each
 * slice into be[s], pipeline_start, engine_init_pipeline.
 */
#ifndef CLLM_PIPELINE_H
#define CLLM_PIPELINE_H

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/stage.h"
#include "parallel/stage_plan.h"

typedef struct {
    StagePlan plan;
    StageModel sm[STAGE_MAX];     /* every stage's slice, the last included */
    Backend *be[STAGE_MAX];       /* every stage's backend; the caller makes them after pipeline_slice */
    Forward fw[STAGE_MAX];        /* stages 0 .. n-2 (the last stage's Forward is the engine's) */
    float *x_host, *proj_host;    /* [max_tokens][dim] handoff staging */
    int dim;
} Pipeline;

/* The slices of plan's stages (plan has at least 2). */
int pipeline_slice(Pipeline *p, const Model *m, const StagePlan *plan, Err *err);
/* After be[] is set: the Forwards of the stages before the last, and the
 * staging for max_tokens rows. */
int pipeline_start(Pipeline *p, int max_tokens, Err *err);
/* Runs one step through the stages before the last and hands x and proj to
 * last (the last stage's Forward, from_prev set), then runs it. Arguments
 * as forward_run's. */
int pipeline_run(Pipeline *p, Forward *last, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows,
                 int n_logits, float *logits_out, Err *err);
/* Fewest KV blocks of any stage's backend (the engine's pool). */
int pipeline_kv_blocks(const Pipeline *p);
/* Frees the Forwards and the backends of every stage but the last. */
void pipeline_free(Pipeline *p);

#endif
