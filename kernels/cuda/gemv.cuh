/* gemv.cuh — the bf16 matrix-vector kernels of decode (kernels/cuda/gemv.cu):
 * y = x @ W^T for a few rows of x, W bf16 [M][K] row-major, fp32 sums. */
#ifndef CLLM_GEMV_CUH
#define CLLM_GEMV_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/activation.h"
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/norm_fold.cuh"

/* y[t][m] = sum_k W[m][k] x[t][k] (+ bias[m]) for T <= GEMV_MAX_T rows,
 * W [M][K] bf16, x [T][K] bf16, y bf16 or fp32 (y_f32), row stride M. */
#define GEMV_MAX_T 8
void cuda_gemv(void *y, bool y_f32, const bf16 *W, const bf16 *x, const float *bias, int M, int K, int T,
               cudaStream_t s);
/* The same with y stored in parts (a fused Q|K|V matrix: gemv_out.cuh; o->end[2] = M). */
void cuda_gemv_parts(const GemvOut *o, const bf16 *W, const bf16 *x, int M, int K, int T, cudaStream_t s);
/* The gate/up pair of a GLU MLP from one concatenated W [2F][K] (gate rows
 * 0..F, up rows F..2F): out[t][i] = act(gate + bg) * (up + bu). */
void cuda_gemv_glu(bf16 *out, const bf16 *W, const bf16 *x, const float *bg, const float *bu, int F, int K, int T,
                   Activation act, float limit, cudaStream_t s);

/* The two above with the norm folded in (norm_fold.cuh): x is not an
 * input; each block makes it from n (the fp32 residual rows [T][K] and the
 * norm weight [K]) as add_rmsnorm without delta would, bit for bit, which
 * saves that launch at decode. A persistent grid of 512-thread blocks;
 * where cuda_gemv_norm_takes (K a multiple of 8 up to 8192, aligned
 * pointers, T <= GEMV_MAX_T), else an error. Return 0, or -1 with err. */
bool cuda_gemv_norm_takes(const void *W, const RowNorm *n, int K, int T);
int cuda_gemv_parts_norm(const GemvOut *o, const bf16 *W, const RowNorm *n, int M, int K, int T, cudaStream_t s,
                         Err *err);
int cuda_gemv_glu_norm(bf16 *out, const bf16 *W, const RowNorm *n, const float *bg, const float *bu, int F, int K,
                       int T, Activation act, float limit, cudaStream_t s, Err *err);

/* Decode MoE: pair p (< n_pairs) runs expert sel[p] on x row p / x_div.
 * Wb != NULL: out[p][M] = act(Wa[e] x + ba[e]) * (Wb[e] x + bb[e]) (gate/up,
 * each [E][M][K]); else out[p][M] = Wa[e] x + ba[e] (down). Biases may be NULL. */
void cuda_gemv_experts(bf16 *out, const bf16 *Wa, const bf16 *Wb, const float *ba, const float *bb, const bf16 *x,
                       int x_div, const int32_t *sel, int n_pairs, int M, int K, Activation act, float limit,
                       cudaStream_t s);

#endif
