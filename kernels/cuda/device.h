/* device.h — CUDA device discovery (C interface of kernels/cuda/device.cu). */
#ifndef CLLM_CUDA_DEVICE_H
#define CLLM_CUDA_DEVICE_H

#include <stddef.h>

#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif
int cuda_device_count(int *n, Err *err);       /* 0 devices (no driver) is not an error */
#ifdef __cplusplus
}
#endif

#endif
