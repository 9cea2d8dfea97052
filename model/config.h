/* config.h — one normalized hyperparameter struct for every architecture.
 *
 * Architectures differ only in these fields (DESIGN.md: "architectures are
 * data"); forward.c reads them and never asks which architecture it runs.
 * Filled from GGUF metadata (config_from_gguf) or from a Hugging Face
 * config.json (config_from_hf). Where the two formats store a weight
 * differently (llama Q/K rows permuted for interleaved rope in GGUF, Gemma norm
 * weights stored with +1 in GGUF), the config records what the weights need so
 * the loader and forward pass do the right thing for either source.
 */
#ifndef CLLM_CONFIG_H
#define CLLM_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "formats/gguf.h"
#include "base/json.h"

#define CONFIG_MAX_LAYERS 1024

typedef enum { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_GPT_OSS, ARCH_COUNT } Arch;
typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3, ROPE_SCALING_YARN } RopeScaling;
typedef enum { ACT_KIND_SILU, ACT_KIND_GELU_TANH, ACT_KIND_SWIGLU_OAI } ActKind;
typedef enum { SRC_GGUF, SRC_HF } ModelSource;

typedef struct {
    RopeScaling type;
    float factor;                 /* linear / llama3 / yarn scale factor */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int original_ctx;             /* llama3 / yarn: original max positions */
    float beta_fast, beta_slow;   /* yarn */
    float attn_factor;            /* yarn: multiplier of cos/sin (0 = derive from factor) */
    bool truncate;                /* yarn: round the correction range to whole dims */
} RopeScalingParams;

typedef struct {
    Arch arch;
    ModelSource source;
    char name[128];               /* general.name or the folder name */

    int n_layers;
    int dim;                      /* hidden size C */
    int ffn_dim;                  /* MLP intermediate size (per expert for MoE) */
    int n_heads, n_kv_heads;
    int head_dim_k, head_dim_v;
    int vocab;
    int ctx_len;                  /* trained context length */
    float norm_eps;
    float norm_offset;            /* added to every RMSNorm weight (1 for HF Gemma) */
    bool tied_embeddings;         /* LM head = token embedding */
    float embed_scale;            /* multiplies embeddings (sqrt(dim) for Gemma) */

    /* attention */
    float attn_scale;             /* multiplies q.k */
    float attn_softcap;           /* 0 = none */
    float final_softcap;          /* on the logits; 0 = none */
    int layer_window[CONFIG_MAX_LAYERS]; /* per layer: sliding window size, 0 = global */
    bool sinks;                   /* per-head learned sink logits (gpt-oss) */
    bool qk_norm;                 /* RMSNorm on q and k per head (qwen3, gemma3) */
    bool qkv_bias, o_bias;
    bool post_norms;              /* Gemma 2/3: norms after attention and after the MLP */

    /* rope */
    bool rope_neox;               /* pairs (i, i + d/2) rather than (2i, 2i+1) */
    int rope_dim;                 /* channels rotated per head */
    float rope_theta;             /* base of global layers */
    float rope_theta_local;       /* base of windowed layers (Gemma 3); = rope_theta elsewhere */
    RopeScalingParams rope_scaling;       /* of global layers */
    bool rope_scaling_local;      /* scaling applies to windowed layers too */

    /* MLP */
    ActKind act;
    float act_limit;              /* gpt-oss swiglu clamp; 0 = none */
    int n_experts, n_experts_used; /* 0 = dense MLP */
    bool mlp_bias;                /* biases on MLP / expert projections */
} ModelConfig;

/* src names the file in error messages. */
int config_from_gguf(ModelConfig *c, const GGUFFile *f, Err *err);
int config_from_hf(ModelConfig *c, const JsonValue *config_json, const char *src, Err *err);

const char *arch_name(Arch a);
const char *config_supported_archs(void); /* "llama, mistral, ..." for error messages */

/* Inverse frequencies of the rotary embedding for a layer (rot_dim/2 values)
 * and the cos/sin multiplier; factors: GGUF rope_freqs.weight or NULL. */
void config_rope_freqs(const ModelConfig *c, int layer, const float *factors, float *inv_freq, float *mscale);

/* Bytes of GPU KV cache per token (all layers, K and V) in dtype t
 * (kv_head_token_bytes per layer and KV head). */
uint64_t config_kv_bytes_per_token(const ModelConfig *c, KVDtype t);

#endif
