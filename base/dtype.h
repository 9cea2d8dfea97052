/* dtype.h — the element types of weights and activations, and their block
 * layouts.
 *
 * Quantized GGUF types store a tensor row as a sequence of fixed-size blocks:
 * `block_elems` values packed into `block_bytes` bytes. Unquantized types are
 * blocks of one element. A row of n elements (n a multiple of block_elems)
 * takes n / block_elems * block_bytes bytes. The numeric values of the enum are
 * GGUF's ggml_type ids, so a GGUF tensor info maps to DType without a table
 * (except DT_F8_E4M3, cllm's own, which the GGUF reader refuses: see
 * dtype_is_ggml).
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
    DT_F8_E4M3 = 40, /* FP8 weights from safetensors or --weights fp8: one e4m3 code a value, times a
                      * per-row fp32 scale (WeightRef.scale). Not a ggml type: GGUF's id 40 is refused */
    DT_COUNT = 41, /* one past the largest id; ids in between are unsupported */
} DType;

typedef struct {
    const char *name;   /* "Q4_K", as GGUF and `cllm info` print it; NULL = unsupported id */
    int block_elems;    /* values per block (1 for F32/F16/BF16) */
    int block_bytes;    /* bytes per block */
} DTypeInfo;

/* Info for a dtype id; returns NULL for ids cllm does not know (any value,
 * including out-of-range ones read from a hostile file). */
const DTypeInfo *dtype_info(uint32_t id);

/* Whether id is a ggml type cllm reads from GGUF (dtype_info of it is
 * non-NULL and it is not DT_F8_E4M3, which only safetensors carry). */
bool dtype_is_ggml(uint32_t id);

/* Bytes taken by n elements of type t, or 0 when n is not a whole number of
 * blocks or the size would overflow. */
uint64_t dtype_row_bytes(DType t, uint64_t n);

/* Whether the CUDA backend keeps a weight matrix of type t in its blocks on
 * the GPU (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and F8_E4M3 as
 * its codes plus fp32 row scales; the rest become bf16 there).
 * The list behind quant_type_supported (kernels/cuda/quant.cuh), here so
 * code built without CUDA sizes stages the same way (`--pp`, `cllm info`). */
bool dtype_gpu_keeps_blocks(DType t);

/* Converts n values (n a multiple of block_elems) from src in type t to fp32.
 * The CPU reference of every quantized format. DT_F8_E4M3 gives the codes'
 * values without the row's scale (which lives in WeightRef.scale, not in the
 * row's bytes): callers multiply by it. */
void dequantize_row(DType t, const void *src, float *dst, int64_t n);

/* Q4_K / Q5_K: sub-block k's (0..7) 6-bit scale and min from the block's 12
 * packed scale bytes (GGUF's get_scale_min_k4 layout). */
void kquant_scale_min(const uint8_t *scales12, int k, int *scale, int *min);

/* Scalar conversions used everywhere. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t b);
uint16_t fp32_to_bf16(float f); /* round to nearest even */

/* FP8 E4M3 (OCP "e4m3fn"; CUDA's __NV_E4M3): sign, 4 exponent bits (bias 7),
 * 3 mantissa bits; subnormals down to 2^-9; largest finite 448; no infinity;
 * 0x7f / 0xff are NaN. fp32_to_e4m3 rounds to nearest, ties to even, and
 * saturates: |f| >= 448 (inf included) gives +-448, a NaN gives 0x7f. That
 * is exactly what the GPU's cvt.rn.satfinite.e4m3x2.f32 does, so the CPU and
 * the CUDA backends store the same bytes for the same floats. */
#define E4M3_MAX 448.0f
uint8_t fp32_to_e4m3(float f);
float e4m3_to_fp32(uint8_t c); /* exact */

/* A row of n values as e4m3 codes with one scale (the FP8 KV cache stores
 * each token's head vector so): scale = amax / 448 with amax = max |x_i|
 * (NaNs ignored), code_i = fp32_to_e4m3(x_i / scale), both divisions in
 * fp32; a row of zeros (and nans) gets scale 0 and zero (nan) codes; a nan
 * stays a nan; an infinite amax makes every code 0 or nan. Read back as
 * e4m3_to_fp32(code_i) * scale, exact in fp32 (the GPU's attention kernels
 * multiply exact codes by the scales in fp32 too): relative error <= 2^-4 for values at or
 * above 2^-6 * scale, absolute <= 2^-10 * scale below. */
void fp8_quantize_row(const float *x, int n, uint8_t *codes, float *scale);
void fp8_dequantize_row(const uint8_t *codes, int n, float scale, float *y);

/* A row as e4m3 codes under a scale fixed beforehand (the FP8 KV cache
 * with static scales: --kv-scales checkpoint / calibrate): code_i =
 * fp32_to_e4m3(x_i / scale), saturating at +-448, the division in fp32 as
 * fp8_quantize_row's. scale must be a positive finite number. */
void fp8_quantize_row_fixed(const float *x, int n, float scale, uint8_t *codes);
/* The static scale of a calibration amax (--kv-scales calibrate): amax /
 * 448, or 1 where amax is zero, NaN or infinite (a head that was all zeros
 * on the first step: any scale keeps its zeros; an inf one saturates). */
float fp8_scale_of_amax(float amax);

/* A weight row as e4m3 codes with one scale (--weights fp8, cllm quantize
 * --type fp8): as fp8_quantize_row but an all-zero (or all-nan) row gets
 * scale 1, never 0, so every scale of an FP8 matrix is a positive finite
 * number (the loader refuses others). Returns the scale. */
float fp8_quantize_weight_row(const float *x, int64_t n, uint8_t *codes);

/* The element type of the KV cache (--kv-dtype). KV_DTYPE_BF16, the
 * default, is bf16 on the GPU and fp32 on the CPU backend (whose every
 * activation is fp32); KV_DTYPE_FP8 is e4m3 codes with one fp32 scale per
 * (token, KV head) for K and one for V (fp8_quantize_row), on both. */
typedef enum { KV_DTYPE_BF16 = 0, KV_DTYPE_FP8 = 1 } KVDtype;
#define KV_DTYPE_NAMES "bf16, fp8"
const char *kv_dtype_name(KVDtype t);                 /* "bf16", "fp8" */
int kv_dtype_from_name(const char *s, KVDtype *t);    /* 0, or -1 for a name not in KV_DTYPE_NAMES */
/* Where the fp8 KV cache's scales come from (--kv-scales): computed per
 * (token, KV head) as the token is written (amax / 448); the checkpoint's
 * static k_scale / v_scale (per tensor or per KV head, per layer); or
 * computed once from the first step's keys and values (per KV head, per
 * layer: vLLM's calculate_kv_scales) and then fixed. Static scales are
 * written into each (token, KV head)'s scale slot, so the cache layout and
 * the attention kernels are the dynamic form's. */
typedef enum { KV_SCALES_DYNAMIC = 0, KV_SCALES_CHECKPOINT = 1, KV_SCALES_CALIBRATE = 2 } KVScales;
#define KV_SCALES_NAMES "dynamic, checkpoint, calibrate"
const char *kv_scales_name(KVScales s);
int kv_scales_from_name(const char *s, KVScales *out); /* 0, or -1 for a name not in KV_SCALES_NAMES */
/* Bytes one token's K and V take on the GPU, per layer and KV head:
 * (head_dim_k + head_dim_v) x 2 (bf16), or x 1 + 2 x 4 (fp8 codes + scales). */
uint64_t kv_head_token_bytes(KVDtype t, int head_dim_k, int head_dim_v);

#ifdef __cplusplus
}
#endif

#endif
