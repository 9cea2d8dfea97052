/* config_internal.h — what config.c (GGUF, shared checks) and config_hf.c
 * (config.json) share; not part of the model API.
 *
 * Both readers fill a ModelConfig, then config_check validates it. Its
 * messages name the file's own key for each field (GGUF "llama.block_count",
 * config.json "num_hidden_layers"), so each reader passes its key names.
 */
#ifndef CLLM_CONFIG_INTERNAL_H
#define CLLM_CONFIG_INTERNAL_H

#include "model/config.h"

typedef enum {
    CK_LAYERS, CK_DIM, CK_FFN, CK_HEADS, CK_KV_HEADS, CK_HEAD_DIM_K, CK_HEAD_DIM_V, CK_ROPE_DIM, CK_VOCAB, CK_EPS,
    CK_THETA, CK_THETA_LOCAL, CK_EXPERTS, CK_EXPERTS_USED, CK_ATTN_SOFTCAP, CK_FINAL_SOFTCAP, CK_COUNT
} ConfigKey;

/* The file's key for each field, as messages print it. */
typedef struct {
    char name[CK_COUNT][160];
} ConfigKeyNames;

/* The 1.702 of gpt-oss's SwiGLU, g * sigmoid(1.702 g): both backends hard-code it
 * (kernels/activation.h), as transformers and llama.cpp do. */
#define CONFIG_SWIGLU_OAI_ALPHA 1.702

/* Architecture defaults that neither file states. */
void config_set_arch_defaults(ModelConfig *c);
/* Which layers are windowed when a file gives only the window size. */
bool config_layer_is_windowed(Arch a, int layer);
/* Validates c; errors name src and the key of the field with its value.
 * Fills ctx_len when the file had none. */
int config_check(ModelConfig *c, const char *src, const ConfigKeyNames *k, Err *err);

#endif
