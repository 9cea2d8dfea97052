/* quant.cuh — quantized GGUF weights kept in block format on the GPU:
 * repack, fused dequantize + matrix-vector products (decode, T <= 8 rows),
 * the fused prefill GEMM (Hopper wgmma), and dequantize to bf16 (a bf16
 * scratch for cuBLASLt).
 *
 * Types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (quant_type_supported), and
 * F8_E4M3 (FP8 checkpoints), whose matrices are plain [rows][cols] e4m3 codes
 * in the qs plane and one fp32 scale a row in the sc plane; its products are
 * fp8.cuh's (the GEMV and GEMM entry points here refuse it), its
 * quant_dequant_bf16 is bf16(e4m3 code x row scale).
 *
 * Layout on the device ("split" layout, made by quant_repack from the GGUF
 * bytes). GGUF blocks of 34, 18, 20, 22, 24 and 210 bytes do not keep
 * 16-byte alignment, so each block is split in two planes:
 *   qs plane: [rows][blocks per row][QB] the block's 16-byte-aligned part
 *             Q8_0 QB=32 (qs), Q4_0, Q4_1, Q5_0, Q5_1 16 (qs: the nibbles),
 *             Q4_K 144 and Q5_K 176 (the whole GGUF block: already aligned),
 *             Q6_K 208 (ql, qh, scales; the GGUF block without d)
 *   sc plane: [rows][blocks per row][SB] the rest, in the GGUF order
 *             Q8_0 SB=2 (d), Q4_0 2 (d), Q4_1 4 (d, m), Q5_0 6 (d, qh),
 *             Q5_1 8 (d, m, qh), Q6_K 2 (d), K4/K5 none
 * Bytes are those of the GGUF tensor (no padding but the plane alignment:
 * the qs plane to 256 bytes, the sc plane to 4), and rows stay independent:
 * the native bytes of two matrices with the same column count placed one
 * after the other repack to one matrix (e.g. gate and up for one GEMV).
 * Q5_0's qh stays unpadded, at 2 bytes past a 4-byte boundary in every other
 * record: padding the record to 8 bytes would make its qh one aligned load
 * but add 2 bytes to every 22 (9% more memory and bytes streamed by every
 * GEMV, and device bytes no longer the file's, which the stage plan assumes:
 * parallel/stage_plan.c), while reading a record as the two aligned 32-bit
 * words that hold it costs a load and a funnel shift a block, and a warp's
 * loads still cover its records' bytes contiguously (quant_q5_record,
 * quant_layout.cuh). Q5_1's 8-byte records are aligned as they are.
 *
 * Every function returns 0, or -1 with err filled; the stream is last. Which
 * kernel runs a product is the caller's choice (the backend's route table):
 * each entry point here runs the one it is asked for, or refuses. */
#ifndef CLLM_QUANT_CUH
#define CLLM_QUANT_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/norm_fold.cuh"
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
    void *sc;               /* device: the sc plane; NULL for Q4_K/Q5_K; F8_E4M3: float [rows] */
    float input_scale;      /* F8_E4M3: the checkpoint's static activation scale; 0: per token (fp8.cuh) */
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
 * dtype_row_bytes(t, cols) bytes, any alignment). Not F8_E4M3: its codes
 * are copied into the qs plane as they are and its scales into sc. */
int quant_repack(const QuantMatrix *m, const void *native, cudaStream_t s, Err *err);

/* The quantized matrix-vector kernels (T <= QUANT_GEMV_MAX_T rows of x), by
 * method. All accumulate in fp32; they differ in how a weight becomes a
 * product, and so in which shapes each is fastest (the backend's route
 * table picks):
 *   QGEMV_SCALAR (quant_gemv.cu): codes to fp32 and FMAs, several tiles of
 *     loads in flight a lane, x staged in shared memory; every type, bf16 or
 *     fp32 x.
 *   QGEMV_MMA (quant_gemv_mma.cu, kernels/quant_mma.h): weights and x by
 *     cp.async into per-warp rings, bf16 mma.sync on the exact codes; Q4_K
 *     and Q8_0 with cols a multiple of 256, bf16 x (no other type).
 *   QGEMV_X8 (quant_gemv_x8.cu, kernels/quant_x8.h): each block rounds x to
 *     two int8 terms per group of 32 values in shared memory, then integer
 *     dot products (dp4a) of the weight codes with those terms; the result is
 *     dequantize_row(W) times the rounded x (~15 bits, finer than bf16) up to
 *     fp32 rounding. Every type, one bf16 x row (the batch-1 decode GEMV).
 * Whether kernel k takes W at T rows (x_f32: fp32 x; only QGEMV_SCALAR takes
 * fp32 x). */
typedef enum { QGEMV_SCALAR, QGEMV_MMA, QGEMV_X8 } QuantGemvKernel;
bool quant_gemv_takes(QuantGemvKernel k, const QuantMatrix *W, int T, bool x_f32);

/* y in parts (GemvOut, gemv_out.cuh; out->end[2] == W->rows) = x @ W^T by
 * kernel k (an error where it does not take W, T). x: [T][cols] bf16 (x_f32
 * false) or fp32, 16-byte aligned; y[t][r] = sum_c x[t][c] W[r][c] (+ bias). */
int quant_gemv(const QuantMatrix *W, const void *x, bool x_f32, const GemvOut *out, int T, QuantGemvKernel k,
               cudaStream_t s, Err *err);

/* The dp4a kernel called directly. With n, x is not read: each block makes
 * it from the fp32 residual row n->x [cols] as add_rmsnorm (no delta) would,
 * bf16(x / rms(x) * (w + offset)) (both 16-byte aligned), which saves that
 * kernel at batch-1 decode. T must be 1. */
typedef RowNorm QxNorm; /* norm_fold.cuh */
int quant_gemv_x8(const QuantMatrix *W, const void *x, const QxNorm *n, const GemvOut *out, int T, cudaStream_t s,
                  Err *err);
/* The same for W = Wgate | Wup (2F rows, one repacked matrix) with the gated
 * activation fused: out [F] bf16 = act(x Wgate^T + bg, x Wup^T + bu) as
 * cpu_glu (biases may be NULL); replaces the GEMV and the GLU kernel at
 * batch-1 decode. */
int quant_gemv_x8_glu(const QuantMatrix *W, const void *x, const QxNorm *n, void *out, const float *bg,
                      const float *bu, Activation act, float limit, cudaStream_t s, Err *err);

/* The prefill GEMM on quantized weights (quant_gemm.cu, Hopper wgmma):
 * y[T][rows] (bf16, or fp32 when y_f32) = x[T][cols] bf16 @ W^T; each
 * multiplying thread dequantizes its own wgmma A fragment in registers with
 * bf16x2 arithmetic (values within ~2^-8 of quant_dequant_bf16's, not
 * equal), W's stages and x's tiles come by TMA; no bias. Q4_K, Q5_K, Q6_K
 * and Q8_0 with rows % 128 == 0 and cols % 256 == 0 (quant_gemm_supported:
 * W must tile as TMA boxes), in an sm_90a build on a compute-capability 9.0
 * GPU (quant_gemm_available: a device query, so callers keep the answer).
 * x 16-byte aligned, T >= 1.
 * bn: tokens per block, 16, 32, 64, 128 or 256; 0 = the picker's (the least
 * of 16 .. 128 that holds T up to 128 rows, above by tile count; where that
 * takes 256 and T % 256 is 1 .. 128, those last tokens go in a launch of
 * their own of smaller tiles).
 * splits: split K, `splits` blocks share a tile's K, each adds its fp32
 * partial sums into `work` and the tile's last adds them all in split order
 * (deterministic); 0 = the picker's (as many as fill one wave of blocks
 * where work is given: a GEMM of few tiles, or the last partial wave's
 * tiles; else 1). Tests force bn and splits.
 * work: quant_gemm_work_bytes(SM count) bytes, zeroed once before the first
 * use (its counters go back to 0 after each launch), one launch at a time. */
typedef struct {
    void *buf;
    size_t bytes;
} QuantGemmWork;
bool quant_gemm_available(void);
bool quant_gemm_supported(DType t, int64_t rows, int64_t cols);
size_t quant_gemm_work_bytes(int sms);
int quant_gemm(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int splits,
               const QuantGemmWork *work, cudaStream_t s, Err *err);

/* The fused GEMM with its epilogue storing more than y (bf16 outputs, 16-byte aligned): with parts (GemvOut
 * of Wq|Wk|Wv: three parts, each end a multiple of 8, with biases; not f32 or add), y's rows in their parts
 * plus bias, as the QKV split kernel makes them; with glu (W = Wgate|Wup, 2F rows), out [T][F] = act(x
 * Wgate^T + bg, x Wup^T + bu) of the bf16-rounded products, as the GLU kernel makes them. Either saves a
 * kernel that reads and writes the GEMM's output again at prefill. bn, splits as in quant_gemm (0: the
 * picker's); quant_gemm_epi_takes says whether W and e can go this way. */
typedef struct {
    const GemvOut *parts;
    bool glu;
    void *out; /* glu's [T][F] */
    const float *bg, *bu;
    Activation act;
    float limit;
} QuantGemmEpi;
bool quant_gemm_epi_takes(const QuantMatrix *W, const QuantGemmEpi *e);
int quant_gemm_epi(const QuantMatrix *W, const void *x, int T, const QuantGemmEpi *e, int bn, int splits,
                   const QuantGemmWork *work, cudaStream_t s, Err *err);

/* dst [n_rows][cols] bf16 (16-byte aligned) = rows row0 .. row0+n_rows-1 of
 * W, bit-exact with dequantize_row (base/dtype.c) followed by
 * round-to-nearest-even bf16. */
int quant_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
