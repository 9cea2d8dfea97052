/* quant_gemv_kernels.cuh — what quant_gemv.cu (quant.cuh's quant_gemv and
 * quant_gemv_takes) needs from the other two GEMV kernels' files: whether
 * each takes a matrix, and the tensor-core one's launcher (the dp4a one's,
 * quant_gemv_x8, is public). Between the quantized kernels' files only;
 * callers use quant.cuh. */
#ifndef CLLM_QUANT_GEMV_KERNELS_CUH
#define CLLM_QUANT_GEMV_KERNELS_CUH

#include "kernels/cuda/quant.cuh"

/* quant_gemv_mma.cu: Q4_K and Q8_0, cols a multiple of 256, bf16 x, 1 .. QUANT_GEMV_MAX_T rows */
bool quant_gemv_mma_takes(DType t, int64_t cols, int T, bool x_f32);
int quant_gemv_mma(const QuantMatrix *W, const void *x, const GemvOut *out, int T, cudaStream_t s, Err *err);

/* quant_gemv_x8.cu: every type of quant.cuh up to 65536 columns (x rounded in shared memory), up to 2^24
 * rows, one bf16 x row */
bool quant_gemv_x8_takes(DType t, int64_t rows, int64_t cols, int T, bool x_f32);

#endif
