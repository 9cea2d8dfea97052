/* tp_plan.h — how `--tp N` splits every layer of a model over N ranks.
 *
 * Rank r of N holds query heads [r*H/N, (r+1)*H/N) and the KV heads they
 * read: KV/N of them when KV >= N, else the one their group shares (a KV
 * head then lives on N/KV ranks); the rows of Wq, Wk, Wv (and their biases)
 * and the sinks of those heads, and Wo's columns of its heads; the rows
 * [r*F/N, (r+1)*F/N) of Wgate and Wup (and biases) and those columns of
 * Wdown; the LM head's rows of the vocabulary range [r*V/N, (r+1)*V/N)
 * (uneven where N does not divide V). The biases of Wo and Wdown are added
 * once, on rank 0 (after the reduce they would count N times). The token
 * embedding is whole on every rank: a lookup reads T rows, and a split
 * table would cost one more all-reduce per step for memory the LM head
 * already saves. Norms are whole everywhere. Refused: H % N, KV neither
 * dividing nor divisible by N, F % N, a column split inside a quantized
 * block, mixture-of-experts models.
 */
#ifndef CLLM_TP_PLAN_H
#define CLLM_TP_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "kernels/tp_group.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/shape.h"

#define TP_MAX TP_GROUP_MAX

typedef struct {
    int n_ranks;
    int head0[TP_MAX], n_heads[TP_MAX];     /* query heads */
    int kv0[TP_MAX], n_kv[TP_MAX];          /* KV heads */
    int ffn0[TP_MAX], n_ffn[TP_MAX];        /* MLP columns */
    int vocab0[TP_MAX], n_vocab[TP_MAX];    /* LM head rows */
    bool head;                              /* the part split holds the LM head (a pipeline's last stage, or no pipeline) */
    uint64_t bytes[TP_MAX];                 /* weight bytes on the rank's GPU (stage_plan.h's weight_device_bytes) */
} TpPlan;

/* The split of model (c, w) over n ranks, or an error naming the count
 * that does not divide (and the matrix and block size of a split inside a
 * quantized block). */
int tp_plan_make(TpPlan *p, const ModelConfig *c, const ModelWeights *w, int n, Err *err);

/* Rank r's part of the model: its config (n_heads, n_kv_heads, ffn_dim its
 * own; vocab stays the model's, the LM head's rows say its range), its shape
 * (rope tables the model's) and its weights: row slices are views of the
 * model's; the column slices of Wo and Wdown are views too, each row's byte
 * range of the model's rows (src_stride: their stride, kernels/weight_rows.h),
 * which the GPU backend uploads as they lie. copy: packed copies it owns
 * instead (made on a thread per core), for the CPU backend, which computes
 * from packed rows. */
typedef struct {
    ModelConfig cfg;
    ModelShape shape;
    ModelWeights w;
    LayerWeights *layers;    /* [n_layers], owned */
    void **owned;            /* the column copies (copy) */
    int n_owned;
    int rank;
} TpRankModel;

int tp_rank_make(TpRankModel *rm, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                 const TpPlan *p, int r, bool copy, Err *err);
void tp_rank_free(TpRankModel *rm);

/* The plan as `cllm info --tp N` prints it: each rank's heads, KV heads,
 * MLP columns, vocabulary range, and its weight bytes plus the KV cache of
 * kv_tokens tokens of its KV heads. pp_stage >= 0: the ranks of that
 * pipeline stage (indented under it). */
void tp_plan_print(FILE *out, const TpPlan *p, const ModelConfig *c, int64_t kv_tokens, KVDtype kv_dtype,
                   int pp_stage);
/* Rank r's KV cache of kv_tokens tokens (its KV heads, c's layers). */
uint64_t tp_plan_kv_bytes(const TpPlan *p, const ModelConfig *c, int r, int64_t kv_tokens, KVDtype kv_dtype);

#endif
