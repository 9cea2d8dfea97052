/* quantize_cmd.h — `cllm quantize IN OUT --type T`: writes a GGUF copy of a
 * model with its weight matrices quantized to T (model/quantize.h); vectors
 * (norms, biases) keep their type, metadata (tokenizer included) is copied. */
#ifndef CLLM_QUANTIZE_CMD_H
#define CLLM_QUANTIZE_CMD_H

#include <stdio.h>

#include "kernels/dtype.h"
#include "model/err.h"

/* The subcommand: argv holds the arguments after "quantize". Returns the exit
 * code (0, 2 on a user error). */
int quantize_main(int argc, char **argv);

/* Quantizes the GGUF model in_path to out_path; progress lines go to log
 * (may be NULL). */
int quantize_model(const char *in_path, const char *out_path, DType type, FILE *log, Err *err);

/* "q8_0", "Q4_K", ... -> the type; -1 when not a type quantize_model writes. */
int quantize_parse_type(const char *name);

#endif
