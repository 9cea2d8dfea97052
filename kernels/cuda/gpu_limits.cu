/* gpu_limits.cu — the device's name, compute capability and measured copy
 * bandwidth (see kernels/gpu_limits.h): one buffer copied to another with
 * cudaMemcpy, timed with events, the best of a few copies after a warm-up;
 * each copy reads and writes its bytes, so both count. */
#include "kernels/gpu_limits.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"

#define COPY_REPS 5

/* Times COPY_REPS copies of `bytes` from src to dst; the best in *best_ms. */
static int time_copies(void *dst, const void *src, size_t bytes, float *best_ms, Err *err) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start), err);
    if (cudaEventCreate(&stop) != cudaSuccess) {
        cudaEventDestroy(start);
        return err_set(err, "gpu limits: cudaEventCreate failed");
    }
    int rc = 0;
    *best_ms = 0;
    for (int i = -1; i < COPY_REPS && rc == 0; i++) { /* i = -1: the warm-up */
        float ms = 0;
        if (cudaEventRecord(start) != cudaSuccess || cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess ||
            cudaEventRecord(stop) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
            cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
            rc = err_set(err, "gpu limits: timing a %zu-byte device copy failed: %s", bytes,
                         cudaGetErrorString(cudaGetLastError()));
        } else if (i >= 0 && (*best_ms == 0 || ms < *best_ms)) {
            *best_ms = ms;
        }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return rc;
}

extern "C" int gpu_limits_cuda_measure(int device, GpuLimits *lim, Err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) return err_set(err, "no GPU: %s", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    if (device < 0 || device >= n) return err_set(err, "GPU %d: the machine has %d", device, n);
    CUDA_CHECK(cudaSetDevice(device), err);
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device), err);
    snprintf(lim->name, sizeof lim->name, "%s", p.name);
    lim->cc_major = p.major;
    lim->cc_minor = p.minor;
    /* 1 GiB each way, halved while memory is short (down to 64 MiB, still far
     * beyond any cache) */
    void *src = NULL, *dst = NULL;
    size_t bytes = (size_t)1 << 30;
    for (; bytes >= ((size_t)64 << 20); bytes /= 2) {
        if (cudaMalloc(&src, bytes) != cudaSuccess) src = NULL;
        else if (cudaMalloc(&dst, bytes) != cudaSuccess) dst = NULL;
        if (dst) break;
        if (src) cudaFree(src);
        src = NULL;
        cudaGetLastError(); /* clear the allocation failure */
    }
    if (!dst) return err_set(err, "gpu limits: GPU %d (%s) has no 2 x 64 MiB free for the copy test", device, p.name);
    float ms = 0;
    int rc = cudaMemset(src, 0, bytes) == cudaSuccess ? time_copies(dst, src, bytes, &ms, err)
                                                     : err_set(err, "gpu limits: cudaMemset of %zu bytes failed", bytes);
    cudaFree(src);
    cudaFree(dst);
    if (rc) return -1;
    if (ms <= 0) return err_set(err, "gpu limits: a %zu-byte copy timed at %g ms", bytes, ms);
    lim->copy_tbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e12;
    lim->copy_gib = (double)bytes / (double)(1 << 30);
    lim->copy_reps = COPY_REPS;
    return 0;
}
