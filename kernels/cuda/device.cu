/* device.cu — which CUDA devices this process sees (for `cllm info` and the
 * choice of backend). */
#include "kernels/cuda/device.h"

#include <stdio.h>

#include "kernels/cuda/cuda_check.h"

extern "C" int cuda_device_count(int *n, Err *err) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) { *n = 0; return 0; }
    CUDA_CHECK(e, err);
    return 0;
}

extern "C" int cuda_device_describe(int dev, char *out, size_t cap, Err *err) {
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev), err);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(dev), err);
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), err);
    snprintf(out, cap, "cuda:%d %s (sm_%d%d, %d SMs, %.1f GiB free of %.1f GiB)", dev, p.name, p.major, p.minor,
             p.multiProcessorCount, free_b / 1073741824.0, total_b / 1073741824.0);
    return 0;
}
