/* gemv_out.cuh — where the matrix-vector kernels (gemv.cu, quant_gemv.cu,
 * quant_gemv_mma.cu) store y[t][row] (+ bias): one [T][rows] array, or, for
 * a fused Q|K|V matrix, three: rows [0, end[0]) to y[0] as [T][end[0]],
 * [end[0], end[1]) to y[1], [end[1], end[2]) to y[2], each part with its own
 * bias (NULL: none). Why: storing the parts directly replaces the QKV split
 * kernel, a launch per layer at decode. With add, the one output is the fp32
 * residual stream and each value is added to it (one thread per element: the
 * atomic only spares the load's round trip), which replaces add_rmsnorm's
 * add. Plain C; the store is CUDA. */
#ifndef CLLM_GEMV_OUT_CUH
#define CLLM_GEMV_OUT_CUH

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    void *y[3];
    const float *bias[3];
    int64_t end[3]; /* end[2] = rows */
    bool f32;       /* fp32 y, else bf16 */
    bool add;       /* y fp32 (a residual stream): y += the value rounded to bf16 (as a bf16 output later added) */
} GemvOut;

/* One [T][rows] output. */
static inline GemvOut gemv_out_one(void *y, bool f32, const float *bias, int64_t rows) {
    GemvOut o = {{y, y, y}, {bias, NULL, NULL}, {rows, rows, rows}, f32, false};
    return o;
}

#ifdef __CUDACC__
#include <cuda_bf16.h>

/* Constant indices only: an index computed at run time would make the
 * compiler copy the kernel's whole argument block to local memory (120
 * bytes of stack per thread, read in the hot loops: measured 10-30% slower). */
static __device__ __forceinline__ void gemv_out_store(const GemvOut &o, int t, int64_t row, float v) {
    const bool in0 = row < o.end[0], in1 = !in0 && row < o.end[1];
    void *y = in0 ? o.y[0] : in1 ? o.y[1] : o.y[2];
    const float *b = in0 ? o.bias[0] : in1 ? o.bias[1] : o.bias[2];
    const int64_t r0 = in0 ? 0 : in1 ? o.end[0] : o.end[1], r = row - r0;
    const int64_t n = (in0 ? o.end[0] : in1 ? o.end[1] : o.end[2]) - r0;
    if (b) v += b[r];
    if (o.add) atomicAdd((float *)y + t * n + r, __bfloat162float(__float2bfloat16_rn(v))); /* no return: a store */
    else if (o.f32) ((float *)y)[t * n + r] = v;
    else ((__nv_bfloat16 *)y)[t * n + r] = __float2bfloat16_rn(v);
}
#endif

#endif
