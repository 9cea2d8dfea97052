/* quant.cuh — quantized GGUF weights kept in block format on the GPU:
 * repack, fused dequantize + matrix-vector product (decode, T <= 8 rows),
 * and dequantize to bf16 (prefill: a bf16 scratch for cuBLASLt).
 *
 * Types: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (quant_type_supported).
 *
 * Layout on the device ("split" layout, made by quant_repack from the GGUF
 * bytes). GGUF blocks of 34, 18, 20 and 210 bytes do not keep 16-byte
 * alignment, so each block is split in two planes:
 *   qs plane: [rows][blocks per row][QB] the block's 16-byte-aligned part
 *             Q8_0 QB=32 (qs), Q4_0 16 (qs), Q4_1 16 (qs),
 *             Q4_K 144 and Q5_K 176 (the whole GGUF block: already aligned),
 *             Q6_K 208 (ql, qh, scales; the GGUF block without d)
 *   sc plane: [rows][blocks per row][SB] the rest
 *             Q8_0 SB=2 (d), Q4_0 2 (d), Q4_1 4 (d, m), Q6_K 2 (d), K4/K5 none
 * Bytes are those of the GGUF tensor (no padding but the plane alignment), and
 * rows stay independent: the native bytes of two matrices with the same
 * column count placed one after the other repack to one matrix (e.g. gate
 * and up for one GEMV).
 *
 * Every function returns 0, or -1 with err filled; the stream is last. */
#ifndef CLLM_QUANT_CUH
#define CLLM_QUANT_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/gemv_out.cuh"
#include "kernels/activation.h"
#include "base/dtype.h"
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QUANT_GEMV_MAX_T 8

typedef struct {
    DType type;
    int64_t rows, cols;     /* W is [rows][cols]: y = x @ W^T */
    void *qs;               /* device: the qs plane (16-byte aligned) */
    void *sc;               /* device: the sc plane; NULL for Q4_K/Q5_K */
} QuantMatrix;

bool quant_type_supported(DType t);

/* Device bytes of a repacked [rows][cols] matrix of type t (qs plane, then the
 * sc plane at the next 256-byte boundary). Fails for an unsupported type or
 * cols not a multiple of the block size. */
int quant_matrix_bytes(DType t, int64_t rows, int64_t cols, size_t *bytes, Err *err);

/* Points m's planes into buf (quant_matrix_bytes of device memory, 256-byte
 * aligned, e.g. straight from cudaMalloc). */
int quant_matrix_init(QuantMatrix *m, DType t, int64_t rows, int64_t cols, void *buf, Err *err);

/* Fills m from the GGUF tensor bytes `native` (device memory, rows *
 * dtype_row_bytes(t, cols) bytes, any alignment). */
int quant_repack(const QuantMatrix *m, const void *native, cudaStream_t s, Err *err);

/* y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < T (1..8).
 * x: [T][cols] bf16 (x_f32 false) or fp32, 16-byte aligned; y: [T][rows]
 * fp32 (y_f32) or bf16; bias: fp32 [rows] or NULL. fp32 accumulation. */
int quant_gemv(const QuantMatrix *W, const void *x, bool x_f32, void *y, bool y_f32, const float *bias, int T,
               cudaStream_t s, Err *err);

/* quant_gemv with the kernel chosen, for checks and benchmarks: version 1
 * (one tile of loads ahead, dequantize-then-FMA), 2 (several tiles of loads
 * in flight, sum-then-scale; rows per warp 1, 2 or 4, 0 = the default) or 3
 * (tensor cores, quant_gemv_mma: where quant_gemv_mma_supported, else an
 * error) or 4 (int8 tensor cores on x rounded to two int8 terms,
 * likewise) or 5 (dp4a, one bf16 x row: quant_gemv_x8 below); version 0 =
 * the default: at T = 1, 5 for Q4_K and for Q8_0 from 16384 rows; else 3
 * where supported for Q4_K, and for Q8_0 from T = 2 or on big matrices;
 * else 2 (kernels/NOTES.md, "v3 measured" and "v5"). */
int quant_gemv_variant(const QuantMatrix *W, const void *x, bool x_f32, void *y, bool y_f32, const float *bias,
                       int T, int version, int rows_per_warp, cudaStream_t s, Err *err);

/* The same (bf16 x, default rows per warp) with y stored in parts (a fused
 * Q|K|V matrix: gemv_out.cuh); out->end[2] must be W's rows. */
int quant_gemv_parts(const QuantMatrix *W, const void *x, const GemvOut *out, int T, int version, cudaStream_t s,
                     Err *err);

/* Versions 3 and 4 (quant_gemv_mma.cu): cp.async stages and mma.sync for
 * Q4_K and Q8_0 with cols a multiple of 256 and bf16 x (kernels/quant_mma.h):
 * bf16 tensor cores on the exact codes (3), or int8 ones on x rounded to
 * int8 per 32 values (4, int8_x: llama.cpp's way; the result is the exact
 * product with that rounded x). */
bool quant_gemv_mma_supported(DType t, int64_t cols, bool x_f32);
int quant_gemv_mma(const QuantMatrix *W, const void *x, const GemvOut *out, int T, bool int8_x, cudaStream_t s,
                   Err *err);

/* Version 5 (quant_gemv_x8.cu, kernels/quant_x8.h): each block rounds x to
 * two int8 terms per group of 32 values in shared memory, then integer dot
 * products (dp4a) of the weight codes with those terms; the result is
 * dequantize_row(W) times the rounded x (~15 bits, finer than bf16) up to
 * fp32 rounding. Q4_0, Q4_1, Q4_K, Q5_K, Q6_K and Q8_0, one bf16 x row (the batch-1
 * decode GEMV). */
bool quant_gemv_x8_supported(DType t, int64_t cols);
/* Whether the default (version 0) takes version 5 for W and T rows of bf16 x. */
bool quant_gemv_picks_x8(const QuantMatrix *W, int T);
/* With n, x is not read: each block makes it from the fp32 residual row
 * n->x [cols] as add_rmsnorm (no delta) would, bf16(x / rms(x) * (w + offset))
 * (both 16-byte aligned), which saves that kernel at batch-1 decode. */
typedef struct {
    const float *x, *w;
    float eps, offset;
} QxNorm;
int quant_gemv_x8(const QuantMatrix *W, const void *x, const QxNorm *n, const GemvOut *out, int T, cudaStream_t s,
                  Err *err);
/* The same for W = Wgate | Wup (2F rows, one repacked matrix) with the gated
 * activation fused: out [F] bf16 = act(x Wgate^T + bg, x Wup^T + bu) as
 * cpu_glu (biases may be NULL); replaces the GEMV and the GLU kernel at
 * batch-1 decode. */
int quant_gemv_x8_glu(const QuantMatrix *W, const void *x, const QxNorm *n, void *out, const float *bg,
                      const float *bu, Activation act, float limit, cudaStream_t s, Err *err);

/* The prefill GEMM on quantized weights (quant_gemm.cu, Hopper wgmma):
 * y[T][rows] (bf16, or fp32 when y_f32) = x[T][cols] bf16 @ W^T, W's tiles
 * dequantized to bf16 in registers or shared memory (v3 and v4: to
 * quant_dequant_bf16's values, so the result is dequantize + a bf16 GEMM up
 * to the order of fp32 sums; v5: within ~2^-8 of them); no bias. Q4_K
 * (cols % 256 == 0) and Q8_0 (cols % 64 == 0), rows % 128 == 0
 * (quant_gemm_supported), in an sm_90a build on a compute-capability 9.0
 * GPU (quant_gemm_available: a device query, so callers keep the answer).
 * x 16-byte aligned, T >= 1. quant_gemm_variant picks the tokens per block
 * (v3: 128 or 256; v4, v5: 16, 32, 64, 128 or 256; 0 = the default: the
 * least of 16 .. 128 that holds T up to 128 rows, above by tile count) and
 * the kernel (3: a maker
 * warpgroup dequantizes into shared memory; 4: each thread its wgmma A
 * fragments in registers; 5: 4 with bf16x2 dequantization arithmetic, its
 * values within ~2^-8 of quant_dequant_bf16's, not equal; 0 = the default:
 * 5 where it takes W, else 3).
 * 4 and 5 take W where quant_gemm_tma_takes (Q8_0: cols % 256 == 0). Q5_K
 * and Q6_K (cols % 256 == 0) by 5 only.
 * Split K (4 and 5 at up to 128 tokens a block): `splits` blocks share a tile's
 * K, each adds its fp32 partial sums into `work` and the tile's last adds
 * them all in split order (deterministic); 0 = as many as fill one wave of
 * blocks where work is given (a GEMM of few tiles: small batches), else 1.
 * work: quant_gemm_work_bytes(SM count) bytes, zeroed once before the first
 * use (its counters go back to 0 after each launch), one launch at a time. */
typedef struct {
    void *buf;
    size_t bytes;
} QuantGemmWork;
bool quant_gemm_available(void);
bool quant_gemm_supported(DType t, int64_t rows, int64_t cols);
bool quant_gemm_tma_takes(DType t, int64_t cols);
/* whether version ver (0 = the default) takes type t: Q5_K, Q6_K only by 5 */
bool quant_gemm_version_takes(DType t, int ver);
size_t quant_gemm_work_bytes(int sms);
int quant_gemm(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QuantGemmWork *work,
               cudaStream_t s, Err *err);
int quant_gemm_variant(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int ver, int splits,
                       const QuantGemmWork *work, cudaStream_t s, Err *err);

/* The fused GEMM with its epilogue storing more than y (v4 / v5; bf16 outputs, 16-byte aligned): with
 * parts (GemvOut of Wq|Wk|Wv: three parts, each end a multiple of 8, with biases; not f32 or add), y's rows
 * in their parts plus bias, as the QKV split kernel makes them; with glu (W = Wgate|Wup, 2F rows), out
 * [T][F] = act(x Wgate^T + bg, x Wup^T + bu) of the bf16-rounded products, as the GLU kernel makes them. Either
 * saves a kernel that reads and writes the GEMM's output again at prefill. bn, ver, splits as in
 * quant_gemm_variant (0: the defaults); quant_gemm_epi_takes says whether W and e can go this way. */
typedef struct {
    const GemvOut *parts;
    bool glu;
    void *out; /* glu's [T][F] */
    const float *bg, *bu;
    Activation act;
    float limit;
} QuantGemmEpi;
bool quant_gemm_epi_takes(const QuantMatrix *W, const QuantGemmEpi *e);
int quant_gemm_epi(const QuantMatrix *W, const void *x, int T, const QuantGemmEpi *e, int bn, int ver, int splits,
                   const QuantGemmWork *work, cudaStream_t s, Err *err);

/* dst [n_rows][cols] bf16 = rows row0 .. row0+n_rows-1 of W, bit-exact with
 * dequantize_row (kernels/dtype.c) followed by round-to-nearest-even bf16. */
int quant_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err);

/* quant_dequant_bf16 with the kernel chosen: version 1 (a thread per unit,
 * direct stores) or 2 (through shared memory, coalesced 16-byte stores; dst
 * 16-byte aligned); 0 = the default. */
int quant_dequant_bf16_variant(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, int version,
                               cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
