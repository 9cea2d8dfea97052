/* bf16.cuh — the device element type of activations and weights, and the
 * 4-wide loads and stores the row kernels use. */
#ifndef CLLM_BF16_CUH
#define CLLM_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#ifdef __CUDACC__
/* Four bf16 as floats (8-byte aligned), and back. */
static __device__ __forceinline__ float4 bf16x4_load(const bf16 *p) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.x));
    float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ void bf16x4_store(bf16 *p, float4 v) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u = make_uint2(*reinterpret_cast<uint32_t *>(&a), *reinterpret_cast<uint32_t *>(&b));
    *reinterpret_cast<uint2 *>(p) = u;
}
#endif

#endif
