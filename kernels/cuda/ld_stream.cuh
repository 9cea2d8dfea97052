/* ld_stream.cuh — the weight stream's load: 16 bytes that bypass L1 (each
 * weight byte of a decode GEMV is read once a step, so caching it there only
 * evicts what is reused: x, the scales). */
#ifndef CLLM_LD_STREAM_CUH
#define CLLM_LD_STREAM_CUH

static __device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

#endif
