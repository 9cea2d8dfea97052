/* info.h — printing what a model holds (`cllm info`). */
#ifndef CLLM_INFO_H
#define CLLM_INFO_H

#include <stdbool.h>
#include <stdio.h>

#include "model/model.h"

/* kv_tokens of KV cache are sized in kv_dtype; the GPU fit is shown for both. */
void model_print_info(FILE *out, const Model *m, int kv_tokens, KVDtype kv_dtype, const char *chat_family);
void model_print_tensors(FILE *out, const Model *m);

/* `cllm info`: what the model holds, what running it costs (the KV cache of
 * kv_tokens in kv_dtype; with pp or pp_split the split into pipeline
 * stages, with tp each stage's (or the model's) split over tensor-parallel
 * ranks) with each backend's GPU, the GPUs' memory and the groups'
 * transport, and with tensors every tensor. The exit code. */
typedef struct {
    const char *model;         /* NULL: the default model */
    bool tensors;
    bool dummy;                /* --dummy-weights: shapes only */
    DType dummy_type;
    int kv_tokens;             /* <= 0: the model's context */
    KVDtype kv_dtype;
    int pp;                    /* stages to show (0: none, unless pp_split) */
    const char *pp_split;
    int tp;                    /* tensor-parallel ranks to show (per stage with pp; <= 1: none) */
    const char *gpus;          /* every backend's GPU (placement.h's --gpus), or NULL: 0, 1, ... */
} InfoOptions;
int info_main(const InfoOptions *o);

#endif
