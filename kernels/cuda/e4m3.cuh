/* e4m3.cuh — e4m3 codes to f16, exactly (e4m3 is a subset of f16): the one
 * conversion the fp8 KV cache's attention kernels and the FP8-weight kernels
 * share. */
#ifndef CLLM_E4M3_CUH
#define CLLM_E4M3_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* Two e4m3 codes (the low 16 bits of w) as f16x2; the higher byte goes to
 * the higher half. One cvt.rn.f16x2.e4m3x2 on sm_89 and later; the sm_80
 * build has no such cvt, and the cuda_fp8 intrinsic emulates it. */
static __device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"((unsigned short)(w & 0xffffu)));
    return r;
#else
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
#endif
}

#endif
