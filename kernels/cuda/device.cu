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
