/* dtype.h — the element types of weights and activations, and their block
 * layouts.
 *
 * Quantized GGUF types store a tensor row as a sequence of fixed-size blocks:
 * `block_elems` values packed into `block_bytes` bytes. Unquantized types are
 * blocks of one element. A row of n elements (n a multiple of block_elems)
 * takes n / block_elems * block_bytes bytes. The numeric values of the enum are
 * GGUF's ggml_type ids, so a GGUF tensor info maps to DType without a table.
 */
#ifndef CLLM_DTYPE_H
#define CLLM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend */
#endif

typedef enum {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q2_K = 10,
    DT_Q3_K = 11,
    DT_Q4_K = 12,
    DT_Q5_K = 13,
    DT_Q6_K = 14,
    DT_BF16 = 30,
    DT_MXFP4 = 39,
    DT_COUNT = 40, /* one past the largest id; ids in between are unsupported */
} DType;

typedef struct {
    const char *name;   /* "Q4_K", as GGUF and `cllm info` print it; NULL = unsupported id */
    int block_elems;    /* values per block (1 for F32/F16/BF16) */
    int block_bytes;    /* bytes per block */
} DTypeInfo;

/* Info for a dtype id; returns NULL for ids cllm does not know (any value,
 * including out-of-range ones read from a hostile file). */
const DTypeInfo *dtype_info(uint32_t id);

/* Bytes taken by n elements of type t, or 0 when n is not a whole number of
 * blocks or the size would overflow. */
uint64_t dtype_row_bytes(DType t, uint64_t n);

/* Converts n values (n a multiple of block_elems) from src in type t to fp32.
 * The CPU reference of every quantized format. */
void dequantize_row(DType t, const void *src, float *dst, int64_t n);

/* Scalar conversions used everywhere. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t b);
uint16_t fp32_to_bf16(float f); /* round to nearest even */

#ifdef __cplusplus
}
#endif

#endif
