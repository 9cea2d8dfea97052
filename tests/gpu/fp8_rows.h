/* fp8_rows.h — test-only (tests/gpu/fp8_rows.cu). */
#ifndef CLLM_TESTS_GPU_FP8_ROWS_H
#define CLLM_TESTS_GPU_FP8_ROWS_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* codes [rows][n], scales [rows] = fp8_quantize_row of each row of x
 * [rows][n] (fp32, device memory), by the device code of the fp8 cache
 * write; with fixed ([rows], device; NULL: none) fp8_quantize_row_fixed of
 * row r with fixed[r] (static KV scales), scales[r] = fixed[r]. */
void cuda_fp8_quantize_rows(uint8_t *codes, float *scales, const float *x, const float *fixed, int rows, int n,
                            cudaStream_t s);
#ifdef __cplusplus
}
#endif

#endif
