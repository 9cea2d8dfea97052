/* gemv_calls.cu — test-only: gemv.cuh's and norm.cuh's entry points for
 * the C checks (tests/gpu/gemv_calls.h). Compiled into the GPU checks only. */
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/norm.cuh"
#include "tests/gpu/gemv_calls.h"

extern "C" void test_add_rmsnorm(float *x, const void *delta, void *out, const float *w, int T, int C, float eps,
                                 float offset) {
    cuda_add_rmsnorm(x, (const bf16 *)delta, (bf16 *)out, w, T, C, eps, offset, 0);
}

extern "C" void test_gemv_parts(const GemvOut *o, const void *W, const void *x, int M, int K, int T) {
    cuda_gemv_parts(o, (const bf16 *)W, (const bf16 *)x, M, K, T, 0);
}

extern "C" void test_gemv_glu(void *out, const void *W, const void *x, const float *bg, const float *bu, int F, int K,
                              int T) {
    cuda_gemv_glu((bf16 *)out, (const bf16 *)W, (const bf16 *)x, bg, bu, F, K, T, ACT_SILU, 0.0f, 0);
}

extern "C" bool test_gemv_norm_takes(const void *W, const RowNorm *n, int K, int T) {
    return cuda_gemv_norm_takes(W, n, K, T);
}

extern "C" int test_gemv_parts_norm(const GemvOut *o, const void *W, const RowNorm *n, int M, int K, int T, Err *err) {
    return cuda_gemv_parts_norm(o, (const bf16 *)W, n, M, K, T, 0, err);
}

extern "C" int test_gemv_glu_norm(void *out, const void *W, const RowNorm *n, const float *bg, const float *bu, int F,
                                  int K, int T, Err *err) {
    return cuda_gemv_glu_norm((bf16 *)out, (const bf16 *)W, n, bg, bu, F, K, T, ACT_SILU, 0.0f, 0, err);
}
