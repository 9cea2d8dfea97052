/* gpu_limits.h — the physical limits of the GPU a benchmark runs on, each
 * with where it came from: the memory bandwidth measured on the device (a
 * device-to-device copy), the dense tensor-core rates from a spec table keyed
 * by the device's name and compute capability. A card not in the table gets
 * no FLOP rate ("unknown for NAME"), never another card's. The CPU gets its
 * memory bandwidth measured the same way (a memcpy larger than the caches)
 * and no FLOP rate. */
#ifndef CLLM_GPU_LIMITS_H
#define CLLM_GPU_LIMITS_H

#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[256];           /* the device's name (cudaDeviceProp.name holds 256) */
    int cc_major, cc_minor;   /* compute capability */
    double copy_tbps;         /* measured: (bytes read + written) / s / 1e12 of the best copy */
    double copy_gib;          /* the size of one copy */
    int copy_reps;            /* timed copies (the best is kept) */
    double bf16_tflops;       /* dense bf16 tensor-core rate (spec table); 0: unknown */
    double fp8_tflops;        /* dense FP8 rate (spec table); 0: unknown or none */
    char flops_source[320];   /* "spec table: H200 (dense)", "unknown for NAME", ... */
} GpuLimits;

/* Queries device `device` (properties, then the copy bandwidth: it allocates
 * two buffers of up to 1 GiB, fewer where memory is short, and frees them).
 * Returns 0, or -1 with err set (the CPU build: no GPU). */
int gpu_limits_query(int device, GpuLimits *lim, Err *err);

/* The CPU's answer: copy_tbps, copy_gib, copy_reps from a memcpy on one
 * thread of a buffer of up to 256 MiB (larger than the caches; fewer where
 * memory is short), best of 5; name "CPU", no FLOP rate. Returns 0, or -1
 * with err set (no memory for even a small buffer). */
int gpu_limits_cpu_measure(GpuLimits *lim, Err *err);

/* Fills bf16_tflops, fp8_tflops and flops_source of lim from its name and
 * compute capability. Returns 1 when the table knows the card, else 0. */
int gpu_limits_from_spec(GpuLimits *lim);

/* The CUDA build's query (kernels/cuda/gpu_limits.cu): the name, compute
 * capability and measured copy bandwidth. */
int gpu_limits_cuda_measure(int device, GpuLimits *lim, Err *err);

#ifdef __cplusplus
}
#endif

#endif
