/* tensor_names.h — the file names of each weight role, for GGUF (llama.cpp's
 * names) and for Hugging Face safetensors, per architecture. */
#ifndef CLLM_TENSOR_NAMES_H
#define CLLM_TENSOR_NAMES_H

#include <stddef.h>

#include "model/config.h"
#include "kernels/weights.h"

typedef enum { SHAPE_VEC_C, SHAPE_VEC_D, SHAPE_VEC_H, SHAPE_Q, SHAPE_K, SHAPE_V, SHAPE_O, SHAPE_BQ, SHAPE_BK,
               SHAPE_BV, SHAPE_GATE, SHAPE_DOWN, SHAPE_BGATE, SHAPE_ROUTER, SHAPE_VEC_E } TensorShape;

typedef struct {
    size_t offset;         /* of the WeightRef in LayerWeights */
    const char *pattern;   /* printf pattern with one %d for the layer */
    TensorShape shape;
    int required;          /* 1: must exist; 0: optional */
} LayerTensorName;

/* The per-layer names for a config, terminated by pattern == NULL. For
 * safetensors gpt-oss, the expert tensors are not listed (the loader converts
 * them). */
const LayerTensorName *tensor_names_layer(const ModelConfig *c);

/* Global tensor names. */
typedef struct { const char *tok_embd, *output_norm, *output, *rope_freqs; } GlobalTensorNames;
GlobalTensorNames tensor_names_global(ModelSource src);

#endif
