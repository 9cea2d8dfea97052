/* stage_plan.h — how `--pp N` splits a model's layers into pipeline stages.
 *
 * Stage s holds layers [first_layer[s], first_layer[s] + n_layers[s]), one
 * GPU each; stage 0 also holds the token embedding, the last stage the final
 * norm and the LM head. The balanced split minimizes the largest stage's
 * weight bytes (as the GPU holds them by default: bf16 matrices and
 * embedding table, fp32 vectors, matrices of the types the GPU keeps
 * quantized in their blocks), so the stages take about equal time per step;
 * `--pp-split 14,18` gives the layer counts instead.
 */
#ifndef CLLM_STAGE_PLAN_H
#define CLLM_STAGE_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/forward.h"

#define STAGE_MAX FORWARD_MAX_STAGES

typedef struct {
    int n_stages;
    int first_layer[STAGE_MAX], n_layers[STAGE_MAX];
    uint64_t bytes[STAGE_MAX];   /* weight bytes on the stage's GPU */
} StagePlan;

/* Bytes one layer weight takes on the GPU: fp32 for vectors, the file's
 * blocks for a matrix of a type dtype_gpu_keeps_blocks, else bf16. */
uint64_t weight_device_bytes(const WeightRef *w);
uint64_t layer_device_bytes(const LayerWeights *lw);
/* The token embedding (or a tied LM head) as the GPU holds it: bf16
 * whatever its file type. */
uint64_t table_device_bytes(const WeightRef *w);
/* bytes as GB, or MB below 1 GB (the plans' printouts) */
void plan_print_size(FILE *out, uint64_t b);
/* "weights W + KV K = T" and the line's end */
void plan_print_memory(FILE *out, uint64_t weights, uint64_t kv);

/* The split into n_stages contiguous stages with the smallest largest stage. */
int stage_plan_balanced(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages, Err *err);

/* The split with counts[s] layers on stage s (they must sum to the model's
 * layers, each at least 1), with each stage's bytes. */
int stage_plan_from_counts(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages,
                           const int *counts, Err *err);

/* The split given as comma-separated layer counts ("14,18"); they must sum
 * to the model's layers, one count per stage, each at least 1. */
int stage_plan_parse(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages, const char *split,
                     Err *err);

/* The plan as `cllm info --pp N` prints it: each stage's layers, weight
 * bytes, and the bf16 KV cache of kv_tokens tokens for its layers. */
void stage_plan_print(FILE *out, const StagePlan *p, const ModelConfig *c, int64_t kv_tokens, KVDtype kv_dtype);
/* Stage s's KV cache of kv_tokens tokens (its layers, every KV head). */
uint64_t stage_plan_kv_bytes(const StagePlan *p, const ModelConfig *c, int s, int64_t kv_tokens, KVDtype kv_dtype);

#endif
