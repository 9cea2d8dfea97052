/* generation_defaults.h — the sampling settings a model's files recommend:
 * Hugging Face generation_config.json beside config.json, or GGUF
 * general.sampling.* metadata (the keys llama.cpp's gguf-py writes). Read at
 * load into Model.gen; the commands fill whatever the user did not set from
 * them (model_sampling_apply) before their own defaults. */
#ifndef CLLM_GENERATION_DEFAULTS_H
#define CLLM_GENERATION_DEFAULTS_H

#include <stdbool.h>

#include "base/err.h"
#include "formats/gguf.h"

typedef struct {
    bool has_temperature, has_top_k, has_top_p, has_min_p, has_repetition_penalty;
    float temperature;         /* 0: the model asks for greedy decoding (HF do_sample false) */
    int top_k;
    float top_p, min_p, repetition_penalty;
    char source[64];           /* "generation_config.json", "GGUF general.sampling.*" or "" (none) */
} GenerationDefaults;

/* dir/generation_config.json if the file exists (absent: *g empty, 0). A
 * field of the wrong type or out of range is an error naming the file, the
 * field and the value: a file that says something cllm would misread is not
 * silently half-applied. Returns 0 or -1. */
int generation_defaults_from_hf(GenerationDefaults *g, const char *dir, Err *err);

/* GGUF general.sampling.{temp,top_k,top_p,min_p,penalty_repeat}; same rules. */
int generation_defaults_from_gguf(GenerationDefaults *g, const GGUFFile *f, Err *err);

/* A list "temperature=0.2,top_p=0.9" (keys as in generation_config.json:
 * temperature, top_k, top_p, min_p, repetition_penalty), as models.txt's
 * sampling column gives a model card's recommendation; "-" is none. src
 * names the list in errors and becomes g->source. Same rules. */
int generation_defaults_from_list(GenerationDefaults *g, const char *list, const char *src, Err *err);

#endif
