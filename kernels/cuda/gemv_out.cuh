/* gemv_out.cuh — where the matrix-vector kernels (gemv.cu, quant_gemv.cu,
 * quant_gemv_mma.cu) store y[t][row] (+ bias): one [T][rows] array, or, for
 * a fused Q|K|V matrix, three: rows [0, end[0]) to y[0] as [T][end[0]],
 * [end[0], end[1]) to y[1], [end[1], end[2]) to y[2], each part with its own
 * bias (NULL: none). Why: storing the parts directly replaces the QKV split
 * kernel, a launch per layer at decode. Plain C; the store is CUDA. */
#ifndef CLLM_GEMV_OUT_CUH
#define CLLM_GEMV_OUT_CUH

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    void *y[3];
    const float *bias[3];
    int64_t end[3]; /* end[2] = rows */
    bool f32;       /* fp32 y, else bf16 */
} GemvOut;

/* One [T][rows] output. */
static inline GemvOut gemv_out_one(void *y, bool f32, const float *bias, int64_t rows) {
    GemvOut o = {{y, y, y}, {bias, NULL, NULL}, {rows, rows, rows}, f32};
    return o;
}

#ifdef __CUDACC__
#include <cuda_bf16.h>

static __device__ __forceinline__ void gemv_out_store(const GemvOut &o, int t, int64_t row, float v) {
    const int k = row < o.end[0] ? 0 : row < o.end[1] ? 1 : 2;
    const int64_t r0 = k ? o.end[k - 1] : 0, r = row - r0, n = o.end[k] - r0;
    if (o.bias[k]) v += o.bias[k][r];
    if (o.f32) ((float *)o.y[k])[t * n + r] = v;
    else ((__nv_bfloat16 *)o.y[k])[t * n + r] = __float2bfloat16_rn(v);
}
#endif

#endif
