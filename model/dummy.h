/* dummy.h — made-up weights for MODEL_LOAD_DUMMY_WEIGHTS (`--dummy-weights[=TYPE]`):
 * benchmarks of shapes too big for the disk, in bf16 or in a quantized GGUF
 * type the GPU keeps in its blocks.
 *
 * fp8 (F8_E4M3) is an FP8 checkpoint's layout: the attention and MLP
 * matrices in e4m3 with a scale per row (dummy_fp8_scale, the same for
 * every row), the embedding, the LM head and stacked experts in bf16.
 *
 * Which tensor gets which type (dummy_tensor_type, dummy_head_type) mirrors a
 * llama.cpp file of that type: every weight matrix and the token embedding
 * in TYPE, the LM head (output.weight) in Q6_K (Q8_0 for a q8_0 model), norms
 * and other vectors in bf16, MoE routers in bf16 (llama.cpp keeps
 * ffn_gate_inp unquantized).
 *
 * Values (dummy_fill): uniform random codes under scales chosen so that the
 * dequantized weights have mean about 0 and standard deviation about
 * DUMMY_STD (a Llama init: activations stay finite through 126 layers). Each
 * block is valid: its fp16 scales are finite normal numbers and its 6-bit
 * sub-block scales and mins are in range. */
#ifndef CLLM_DUMMY_H
#define CLLM_DUMMY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

#define DUMMY_STD 0.02
#define DUMMY_TYPE_NAMES "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, fp8"

/* true for BF16 and the block types of DUMMY_TYPE_NAMES */
bool dummy_type_supported(DType t);

/* The type named (case-insensitive, one of DUMMY_TYPE_NAMES) into *t; -1 with
 * err naming the option --dummy-weights and the value otherwise. */
int dummy_type_parse(const char *name, DType *t, Err *err);

/* The type of a dummy [rows][cols] tensor asked for as t: bf16 for a vector
 * (rows == 1) and for a matrix whose rows are not whole blocks of t (e.g.
 * an ffn size that is not a multiple of 256 under a K type); else t. */
DType dummy_tensor_type(DType t, int64_t rows, int64_t cols);

/* The LM head's type in a model whose matrices are t (llama.cpp's rule:
 * Q6_K unless the model is Q8_0; bf16 stays bf16). */
DType dummy_head_type(DType t);

/* The row scale of dummy F8_E4M3 matrices: DUMMY_STD over the rms of the
 * finite e4m3 codes (uniform random codes then have about DUMMY_STD). */
float dummy_fp8_scale(void);

/* Fills bytes of buf (a whole number of blocks of t, a supported type) with
 * random values of type t as described above. Byte k depends on t and k
 * alone (a counter-based generator): the same t gives the same contents,
 * and a shorter fill the same first bytes. Split over the online CPUs (one
 * thread for a buffer under 4 MiB). */
void dummy_fill(DType t, void *buf, uint64_t bytes);

/* dummy_fill over n_threads threads (<= 0: dummy_fill's choice): the same
 * bytes for any n_threads (for the tests). */
void dummy_fill_threads(DType t, void *buf, uint64_t bytes, int n_threads);

#endif
