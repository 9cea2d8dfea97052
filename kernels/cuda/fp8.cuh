/* fp8.cuh — products with FP8 (e4m3) weight matrices: the decode GEMV
 * (fp8_gemv.cu, T <= FP8_GEMV_MAX_T rows of x) and the GEMM of larger steps
 * (fp8_gemm.cu: x quantized per token, then a cuBLASLt FP8 GEMM).
 *
 * W is a QuantMatrix of type DT_F8_E4M3 (quant.cuh): qs = [rows][cols] e4m3
 * codes, sc = fp32 [rows] row scales, input_scale the checkpoint's static
 * activation scale (0: dynamic). Both kernels compute the one product the
 * CPU reference defines:
 *
 *   a_scale[t] = input_scale, or amax(|x[t][:]|) / 448 when it is 0
 *   code_x[t][k] = e4m3(x[t][k] / a_scale[t])    (round to nearest even, saturated to +-448,
 *                                                 as fp8_quantize_row, base/dtype.h)
 *   y[t][n] = a_scale[t] * scale[n] * sum_k code_x[t][k] * code_w[n][k]   (fp32 sum, then bf16 or fp32)
 *
 * A product of two e4m3 codes is exact in fp32 (4 + 4 significant bits), so
 * the GEMV and the GEMM differ only in the order of their fp32 sums.
 * Every function returns 0, or -1 with err filled; the stream is last. */
#ifndef CLLM_FP8_CUH
#define CLLM_FP8_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/activation.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/norm_fold.cuh"
#include "kernels/cuda/quant.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* The GEMV takes up to this many rows of x; more go to the GEMM. */
#define FP8_GEMV_MAX_T 8

/* Whether fp8_gemv takes W at T rows (F8_E4M3, columns a multiple of 16,
 * T x columns bytes of x codes fit a block's shared memory). */
bool fp8_gemv_takes(const QuantMatrix *W, int T);

/* y in parts (GemvOut: bias, q|k|v parts, residual add) = x @ W^T by the
 * GEMV, T in 1 .. FP8_GEMV_MAX_T; x [T][cols] bf16, 16-byte aligned. Each
 * block quantizes x itself (no kernel before it). With n (n->x not NULL) x
 * is not read: x is add_rmsnorm's output (no delta) of the residual rows
 * n->x [T][cols], made by each block, the same codes bit for bit
 * (norm_fold.cuh; where fp8_gemv_norm_takes, else an error; widths up
 * to 8192, 4096 for the GLU). */
int fp8_gemv(const QuantMatrix *W, const void *x, const RowNorm *n, const GemvOut *out, int T, cudaStream_t s,
             Err *err);
bool fp8_gemv_norm_takes(const QuantMatrix *W, const RowNorm *n, bool glu, int T); /* glu: fp8_gemv_glu's */

/* The same over W = Wgate | Wup (2F rows, one matrix) with the gated
 * activation fused: out [T][F] bf16 = act(x Wgate^T + bg, x Wup^T + bu) from
 * the fp32 values, as the dp4a GEMV's GLU (biases may be NULL); replaces
 * the GEMV and the GLU kernel at decode. */
int fp8_gemv_glu(const QuantMatrix *W, const void *x, const RowNorm *n, void *out, const float *bg, const float *bu,
                 Activation act, float limit, int T, cudaStream_t s, Err *err);

/* Whether fp8_gemm takes W: F8_E4M3, rows and columns multiples of 16.
 * cuBLASLt's FP8 kernels want leading dimensions in 16-byte multiples (y's
 * rows are W's rows) and had no algorithm for a 1-row W at T <= 3 on an
 * H200; a matrix of other rows (odd vocabularies) is dequantized instead. */
bool fp8_gemm_takes(const QuantMatrix *W);

/* x [T][K] bf16 -> codes [T][K] e4m3 and a_scale [T] fp32 (input_scale > 0:
 * that scale for every row, else each row's amax / 448); K % 8 == 0, both
 * buffers 16-byte aligned. */
int fp8_quantize_rows(const void *x, int T, int K, float input_scale, uint8_t *codes, float *a_scale, cudaStream_t s,
                      Err *err);

/* dst [n_rows][cols] bf16 = rows row0 .. of W dequantized: bf16(e4m3 code x
 * row scale), the product in fp32 (the batch-invariant mode's and the
 * pre-Ada GPUs' GEMM route: dequantize, then a bf16 GEMM). */
int fp8_dequant_bf16(const QuantMatrix *W, int64_t row0, int64_t n_rows, void *dst, cudaStream_t s, Err *err);

#ifdef CLLM_CUDA_LIBS_TABLES
/* The GEMM's state: cuBLASLt plans (one per shape), the quantized x, the
 * fp32 product of the fallback mode. Built by fp8_gemm_init once, before
 * any capture (the GEMM itself allocates nothing: graph-capturable). */
#define FP8_PLANS 32

typedef enum {
    FP8_MODE_UNKNOWN,   /* no plan made yet */
    FP8_MODE_OUTER_VEC, /* cuBLASLt applies scale[n] and a_scale[t] (OUTER_VEC_32F scale modes), D bf16 / fp32 */
    FP8_MODE_RESCALE,   /* cuBLASLt with unit scales into fp32, then fp8_rescale's kernel (+ bias) */
} Fp8GemmMode;

typedef struct {
    int m, n, k;
    int ldd;               /* D's leading dimension: m (OUTER_VEC, D is y), m padded to 16 (RESCALE, D is acc) */
    bool out_f32;          /* D fp32 (the OUTER_VEC mode's logits); the fallback's D is always fp32 */
    bool rescale_only;     /* asked for RESCALE (a bias into bf16 y): a separate entry of the same shape */
    Fp8GemmMode mode;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} Fp8Plan;

typedef struct {
    cublasLtHandle_t lt;   /* borrowed */
    void *workspace;       /* borrowed */
    size_t workspace_bytes;
    uint8_t *xq;           /* [max_t][max_k] codes */
    float *xs;             /* [max_t] a_scale */
    float *acc;            /* FP8_MODE_RESCALE: [acc_elems] fp32 D, T chunked to fit */
    int max_t;
    int64_t max_k, acc_elems;
    Fp8Plan plans[FP8_PLANS];
    int n_plans;
    Fp8GemmMode mode;      /* decided by the first plan: the heuristic's answer for OUTER_VEC, else RESCALE */
    int n_outer, n_rescale; /* plans made in each mode (the heuristic answers per shape) */
    bool force_rescale;    /* tests and the benchmark: take the fallback even where OUTER_VEC works */
} Fp8Gemm;

/* Buffers for steps of up to max_t rows and matrices up to max_k wide. */
int fp8_gemm_init(Fp8Gemm *g, cublasLtHandle_t lt, void *workspace, size_t workspace_bytes, int max_t, int64_t max_k,
                  Err *err);
void fp8_gemm_free(Fp8Gemm *g);

/* y[T][W->rows] (bf16, or fp32 when y_f32) = x[T][W->cols] bf16 @ W^T
 * (+ bias [rows]): fp8_quantize_rows, then cuBLASLt; T <= max_t. */
int fp8_gemm(Fp8Gemm *g, const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const float *bias,
             cudaStream_t s, Err *err);

/* "outer-vector scales" / "unit scales + rescale" / "undecided". */
const char *fp8_gemm_mode_name(Fp8GemmMode m);
#endif

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include "kernels/cuda/e4m3.cuh"

/* The four codes of w as fp32, in byte order. */
static __device__ __forceinline__ void fp8x4_to_f32(uint32_t w, float *f) {
    uint32_t lo = e4m3x2_to_f16x2(w), hi = e4m3x2_to_f16x2(w >> 16);
    float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
}

/* x / scale as an e4m3 code, as fp32_to_e4m3(x / scale) on the host: the
 * IEEE division, round to nearest even, saturating; a nan becomes 0x7f
 * whatever its sign (the host's nan). scale 0 (a row of zeros): x * 0. */
static __device__ __forceinline__ uint32_t fp8_encode(float x, float scale) {
    const float e = scale > 0.0f ? __fdiv_rn(x, scale) : __fmul_rn(x, 0.0f);
    return e != e ? 0x7fu : (uint32_t)__nv_cvt_float_to_fp8(e, __NV_SATFINITE, __NV_E4M3);
}

/* Eight bf16 values (one 16-byte load) as eight codes (8 bytes, in order). */
static __device__ __forceinline__ uint2 fp8_encode8(uint4 v, float scale) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t c[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t bits = (w[i / 2] >> (16 * (i % 2))) & 0xffffu;
        const float f = __uint_as_float(bits << 16); /* bf16 -> fp32, exact */
        c[i / 4] |= fp8_encode(f, scale) << (8 * (i % 4));
    }
    return make_uint2(c[0], c[1]);
}

/* max |value| of eight bf16 values; a nan is ignored (fmaxf keeps the other). */
static __device__ __forceinline__ float bf16x8_amax(uint4 v, float m) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(__uint_as_float(((w[i / 2] >> (16 * (i % 2))) & 0xffffu) << 16)));
    return m;
}
#endif

#endif
