/* weights.h — the weights of a decoder, bound by name from the model file.
 *
 * Every field is a view of one tensor as the file stores it (type, shape),
 * named by its role. Matrices use the PyTorch Linear layout: rows = output
 * features, cols = input features (GGUF ne[1] x ne[0]); expert tensors stack
 * n_mats such matrices. Shapes in the comments: C = dim, H/KV = query/KV heads,
 * D/Dv = head sizes, F = ffn_dim, E = experts, V = vocab. An optional tensor
 * the file lacks has data == NULL.
 */
#ifndef CLLM_WEIGHTS_H
#define CLLM_WEIGHTS_H

#include <stdint.h>

#include "base/dtype.h"

typedef struct {
    const void *data;     /* NULL: absent */
    DType type;
    int64_t rows, cols;   /* a vector has rows = 1 */
    int64_t n_mats;       /* 1, or E for stacked experts */
    uint64_t row_bytes;   /* bytes of one row */
    const char *name;     /* the file's tensor name, for messages */
    const float *scale;   /* DT_F8_E4M3: [rows * n_mats] fp32, one per output row (a per-tensor scale repeated); else NULL */
    float input_scale;    /* DT_F8_E4M3: static activation scale from the checkpoint; 0: dynamic (per token) */
    uint64_t src_stride;  /* bytes from one row's start to the next's in data; 0: row_bytes (packed rows). A
                             tensor-parallel column slice is a view of the model's wider rows (tp_plan.h): only
                             loaders and uploaders read rows that way (kernels/weight_rows.h), no backend op does */
} WeightRef;

typedef struct {
    WeightRef attn_norm;       /* [C] */
    WeightRef wq, wk, wv;      /* [H*D][C], [KV*D][C], [KV*Dv][C] */
    WeightRef bq, bk, bv;      /* [H*D], [KV*D], [KV*Dv] (biases, optional) */
    WeightRef q_norm, k_norm;  /* [D] (qk-norm, optional) */
    WeightRef wo, bo;          /* [C][H*Dv], [C] */
    WeightRef sinks;           /* [H] (optional) */
    WeightRef post_attn_norm;  /* [C] (Gemma) */
    WeightRef ffn_norm;        /* [C] */
    WeightRef w_gate, w_up;    /* dense: [F][C]; MoE: E x [F][C] */
    WeightRef w_down;          /* dense: [C][F]; MoE: E x [C][F] */
    WeightRef b_gate, b_up, b_down; /* dense: [F],[F],[C]; MoE: E x [F], E x [C] (optional) */
    WeightRef router, router_bias;  /* [E][C], [E] (MoE) */
    WeightRef post_ffn_norm;   /* [C] (Gemma) */
    WeightRef kv_scales;       /* [2*KV] fp32: the checkpoint's static FP8 KV-cache scales, K's per KV head
                                  then V's (a per-tensor one repeated; model/kv_scales.c) (optional) */
} LayerWeights;

typedef struct {
    WeightRef tok_embd;        /* [V][C] */
    WeightRef output_norm;     /* [C] */
    WeightRef output;          /* [V][C]; = tok_embd when tied */
    WeightRef rope_freqs;      /* [rope_dim/2] llama3 factors (GGUF, optional) */
    LayerWeights *layers;      /* [n_layers] */
} ModelWeights;

#endif
