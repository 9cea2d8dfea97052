/* quant_config.h — what config.json's quantization_config says about a
 * safetensors checkpoint's weights, for the FP8 layouts cllm reads.
 *
 * Read: "quant_method": "fp8" (vLLM / HF FP8: per-tensor weight_scale,
 * activation_scheme dynamic or static) and "compressed-tensors" with format
 * float-quantized (or naive-quantized holding float 8-bit weights) whose
 * config_groups quantize weights as {num_bits 8, type float, strategy tensor
 * or channel} and activations not at all, dynamically per token, or with a
 * static per-tensor scale. Every other quantization (int weights, group or
 * block strategies, weight_block_size, awq, gptq, bitsandbytes, ...) is
 * refused with an error naming quant_method and the field. Which layers are
 * quantized follows the tensors' own dtypes (an `ignore`d layer is stored in
 * bf16), so the ignore list needs no reading. Either method may carry a
 * kv_cache_scheme (compressed-tensors' form: {num_bits 8, type float,
 * strategy tensor or attn_head, dynamic false}): the file then holds static
 * FP8 KV-cache scales (model/kv_scales.c binds them); another scheme is
 * refused, a dynamic one needs no tensors.
 */
#ifndef CLLM_QUANT_CONFIG_H
#define CLLM_QUANT_CONFIG_H

#include <stdbool.h>

#include "base/err.h"
#include "base/json.h"

typedef struct {
    bool fp8;             /* a quantization_config of FP8 weights was read */
    char method[32];      /* its quant_method: "fp8", "compressed-tensors" */
    bool static_input;    /* activations use the checkpoint's input_scale tensors */
    bool kv_static;       /* kv_cache_scheme: static FP8 KV-cache scales (k_scale / v_scale) are in the file */
} QuantConfig;

/* Reads root's "quantization_config" (absent: q->fp8 false, 0). src names
 * the file in errors. */
int quant_config_from_hf(QuantConfig *q, const JsonValue *root, const char *src, Err *err);

#endif
