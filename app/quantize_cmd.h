/* quantize_cmd.h — `cllm quantize IN OUT --type T`: writes a GGUF copy of a
 * model with its weight matrices quantized to T (model/quantize.h); vectors
 * (norms, biases) keep their type, metadata (tokenizer included) is copied. */
#ifndef CLLM_QUANTIZE_CMD_H
#define CLLM_QUANTIZE_CMD_H

#include <stdbool.h>
#include <stdio.h>

#include "base/dtype.h"
#include "base/err.h"

/* The subcommand: argv holds the arguments after "quantize". Returns the exit
 * code (0, 2 on a user error). */
int quantize_main(int argc, char **argv);

/* Quantizes the GGUF model in_path to out_path; progress lines go to log
 * (may be NULL). */
int quantize_model(const char *in_path, const char *out_path, DType type, FILE *log, Err *err);

/* quantize_model with k_m: llama.cpp's Q4_K_M / Q5_K_M mix of type (Q4_K or
 * Q5_K) and Q6_K (the LM head; attn_v and ffn_down in some layers). */
int quantize_model_mix(const char *in_path, const char *out_path, DType type, bool k_m, FILE *log, Err *err);

/* --type fp8 (app/quantize_fp8.c): the safetensors model folder in_path
 * written to the folder out_dir as an FP8 checkpoint (compressed-tensors
 * float-quantized, per-channel weight scales, dynamic per-token activations)
 * whose matrices are exactly what --weights fp8 makes of them. */
int quantize_fp8_checkpoint(const char *in_path, const char *out_dir, Err *err);

/* "q8_0", "Q4_K", ... -> the type; -1 when not a type quantize_model writes. */
int quantize_parse_type(const char *name);
/* quantize_parse_type, and "q4_k_m" / "q5_k_m": the base type with *k_m set; -1 when neither. */
int quantize_parse_recipe(const char *name, DType *type, bool *k_m);

#endif
