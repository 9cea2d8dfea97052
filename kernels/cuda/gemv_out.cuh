/* gemv_out.cuh — where the matrix-vector kernels (gemv.cu, quant_gemv.cu,
 * quant_gemv_mma.cu, quant_gemv_x8.cu) and the fused GEMM's parts epilogue
 * store y[t][row] (+ bias): one [T][rows] array, or, for a fused Q|K|V matrix, three: rows [0, end[0]) to y[0] as [T][end[0]],
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

/* The part row falls in: its y and bias, the row's index in it and its
 * width. Selects, not an index: a run-time index into the kernel's
 * arguments would make the compiler copy the whole argument block to local
 * memory (120 bytes of stack per thread, read in the hot loops: measured
 * 10-30% slower). E: the type of the part ends (GemvOut's int64_t, the
 * fused GEMM's int). */
template <typename E> struct GemvPart {
    void *y;
    const float *bias;
    E r, n;
};

template <typename E>
static __device__ __forceinline__ GemvPart<E> gemv_part(void *const (&y)[3], const float *const (&bias)[3],
                                                        const E (&end)[3], E row) {
    const bool in0 = row < end[0], in1 = !in0 && row < end[1];
    GemvPart<E> p;
    p.y = in0 ? y[0] : in1 ? y[1] : y[2];
    p.bias = in0 ? bias[0] : in1 ? bias[1] : bias[2];
    const E r0 = in0 ? 0 : in1 ? end[0] : end[1];
    p.r = row - r0;
    p.n = (in0 ? end[0] : in1 ? end[1] : end[2]) - r0;
    return p;
}

static __device__ __forceinline__ void gemv_out_store(const GemvOut &o, int t, int64_t row, float v) {
    const GemvPart<int64_t> p = gemv_part(o.y, o.bias, o.end, row);
    const int64_t r = p.r, n = p.n;
    if (p.bias) v += p.bias[r];
    if (o.add) atomicAdd((float *)p.y + t * n + r, __bfloat162float(__float2bfloat16_rn(v))); /* no return: a store */
    else if (o.f32) ((float *)p.y)[t * n + r] = v;
    else ((__nv_bfloat16 *)p.y)[t * n + r] = __float2bfloat16_rn(v);
}
#endif

#endif
