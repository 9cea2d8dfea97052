/* models.h — the model a command runs (app/models.c). */
#ifndef CLLM_APP_MODELS_H
#define CLLM_APP_MODELS_H

#include <stddef.h>

#include "engine/sampler.h"
#include "model/model.h"

/* Which sampling options the user gave on the command line. */
enum {
    SAMPLING_GIVEN_TEMP = 1,
    SAMPLING_GIVEN_TOP_K = 2,
    SAMPLING_GIVEN_TOP_P = 4,
    SAMPLING_GIVEN_MIN_P = 8,
    SAMPLING_GIVEN_REPEAT = 16,
};

/* Fills the fields of s the user did not give (bits of given) from the
 * settings the model's files recommend (m->gen); what neither sets keeps
 * s's value (cllm's default). Returns how many fields the model set. */
int app_sampling_from_model(SamplerParams *s, unsigned given, const GenerationDefaults *g);

/* The sampling m's own files recommend (m->gen); when they carry none and m
 * is a model of models.txt, the settings of its sampling column. Put into the
 * fields of s the user did not give, said once on stderr as "cllm CMD:
 * sampling as ... recommends" when it set any. -1 with err set on a
 * malformed models.txt column. */
int app_model_sampling(const char *cmd, const Model *m, unsigned given, SamplerParams *s, Err *err);

/* Path of the default model: the first of models.txt beside the executable,
 * in models/cache (or $CLLM_MODELS). 0, or 2 after printing why there is none. */
int app_default_model(char *out, size_t cap);

/* model_load (path NULL: the default model), or model_load_dummy in
 * dummy_type with MODEL_LOAD_DUMMY_WEIGHTS; 0, or 2 after printing the error
 * with "cllm CMD: " in front. */
int app_load_model(const char *cmd, const char *path, int flags, DType dummy_type, Model *m);

/* Names on stderr the tensors of m's file that nothing reads (the first 16,
 * then their count): the warning every command that loads a model gives. */
void app_warn_unused(const Model *m);

#endif
