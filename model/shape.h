/* shape.h — what a backend is told of a model (kernels/backend.h
 * ModelShape): its sizes and op constants from the config, and the rope
 * tables of every layer computed once. */
#ifndef CLLM_SHAPE_H
#define CLLM_SHAPE_H

#include "kernels/backend.h"
#include "model/config.h"

/* Fills s from c; the rope tables (rope_freqs: GGUF llama3 factors, or
 * data NULL) are allocated: model_shape_free releases them. */
int model_shape_build(ModelShape *s, const ModelConfig *c, const WeightRef *rope_freqs, Err *err);
void model_shape_free(ModelShape *s);

/* The gated activation of c's MLP. */
Activation config_activation(const ModelConfig *c);

#endif
