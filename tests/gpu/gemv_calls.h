/* gemv_calls.h — test-only (tests/gpu/gemv_calls.cu): the bf16 GEMV
 * kernels and add_rmsnorm (C++ entry points) callable from the C checks,
 * on the default stream. */
#ifndef CLLM_TESTS_GPU_GEMV_CALLS_H
#define CLLM_TESTS_GPU_GEMV_CALLS_H

#include <stdbool.h>

#include "base/err.h"
#include "kernels/cuda/gemv_out.cuh"
#include "kernels/cuda/norm_fold.cuh"

#ifdef __cplusplus
extern "C" {
#endif
/* norm.cuh cuda_add_rmsnorm: out (bf16) = rmsnorm(x += delta) */
void test_add_rmsnorm(float *x, const void *delta, void *out, const float *w, int T, int C, float eps, float offset);
/* gemv.cuh: y in parts = x @ W^T (W, x bf16), and the GLU (SiLU) */
void test_gemv_parts(const GemvOut *o, const void *W, const void *x, int M, int K, int T);
void test_gemv_glu(void *out, const void *W, const void *x, const float *bg, const float *bu, int F, int K, int T);
/* the same with the norm folded in */
bool test_gemv_norm_takes(const void *W, const RowNorm *n, int K, int T);
int test_gemv_parts_norm(const GemvOut *o, const void *W, const RowNorm *n, int M, int K, int T, Err *err);
int test_gemv_glu_norm(void *out, const void *W, const RowNorm *n, const float *bg, const float *bu, int F, int K,
                       int T, Err *err);
#ifdef __cplusplus
}
#endif

#endif
