/* pdl.cuh — programmatic dependent launch (compute capability 9.0+).
 *
 * Why: a decode step is ~330 kernels, most of them a few microseconds, and
 * each one normally starts only after the previous one has finished and
 * flushed: the launch, the block start-up and the first trip to memory
 * (for a GEMV, the first weight bytes) sit on the critical path every time.
 * Launched with launch_pdl, a kernel's blocks may start while the previous
 * kernel still runs; each such kernel calls pdl_wait() before it touches
 * anything the previous kernels write (its inputs) or read (its outputs),
 * and may only do work on constant data (the weights, written at load
 * before a device sync) ahead of it. pdl_launch_dependents() lets the next
 * kernel of the stream start; every kernel here calls it after its own
 * pdl_wait(), so at most two kernels of a stream are in flight (the decode
 * attention does not call it at all: the next GEMV's whole-SM blocks, let
 * in early, slowed the step by about a fifth: kernels/README.md).
 *
 * A kernel launched with launch_pdl MUST call pdl_wait() (else it runs
 * concurrently with its predecessor). On older GPUs launch_pdl is an
 * ordinary launch and the two calls are no-ops. */
#ifndef CLLM_PDL_CUH
#define CLLM_PDL_CUH

#include <cuda_runtime.h>

static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The wait, then the go-ahead for the next kernel: the prologue of a kernel
 * with nothing to do before its inputs are ready. */
static __device__ __forceinline__ void pdl_enter(void) {
    pdl_wait();
    pdl_launch_dependents();
}

/* Starts bringing the first bytes of [p, p + bytes) into L2 (up to max_bytes; a
 * 128-byte line per lane per round): what a GEMV does with its weights before pdl_wait(). */
static __device__ __forceinline__ void prefetch_l2_span(const void *p, int64_t bytes, int64_t max_bytes, int lane) {
#if defined(__CUDA_ARCH__)
    int64_t n = bytes < max_bytes ? bytes : max_bytes;
    for (int64_t off = (int64_t)lane * 128; off < n; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + off));
#endif
}

/* Whether the current device takes the attribute (queried per launch: a
 * cached answer would be process state, and the runtime caches it anyway). */
static inline bool pdl_supported(void) {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

/* kernel<<<grid, block, smem, s>>>(args...), allowed to overlap the previous
 * kernel of s (see above). The error is also the runtime's last error, as
 * for <<<>>>. */
template <typename... P, typename... A>
static cudaError_t launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_supported() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

#endif
