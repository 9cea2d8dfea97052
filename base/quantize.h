/* quantize.h — the CPU quantizer: fp32 rows to GGUF blocks (kernels/dtype.h
 * has the layouts; dequantize_row is the inverse).
 *
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 give the same bytes as the `gguf` Python
 * package's gguf.quants.quantize (the reference ggml algorithms: one scale
 * from the block's extreme values, round-to-nearest codes), checked by
 * tests/test_quantize.c against blocks the package made. The package has no
 * K-quant quantizer; Q4_K, Q5_K and Q6_K here pick each sub-block's scale
 * (and min) from its range, then quantize the scales themselves (6-bit or
 * int8 against one fp16 super-scale) and choose codes against the quantized
 * scales, so rounding errors of the scales do not add up. */
#ifndef CLLM_QUANTIZE_H
#define CLLM_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

/* true for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F32 */
bool quantize_type_supported(DType t);

/* Writes n values of src (n a multiple of the block size) as type t to dst
 * (dtype_row_bytes(t, n) bytes). Returns 0, or -1 for an unsupported type or
 * a partial block. Non-finite inputs give unspecified (but in-range) codes. */
int quantize_row(DType t, const float *src, void *dst, int64_t n);

/* The 12 scale bytes of a Q4_K / Q5_K block from its 8 sub-block scales
 * and 8 mins (each 0..63); the layout is in base/dtype.c (kquant_scale_min). */
void quantize_pack_k_scales(const int sc[8], const int mn[8], uint8_t s12[12]);

#endif
