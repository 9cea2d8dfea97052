/* cuda_check.h — CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK: every CUDA call is
 * checked; a failure fills the caller's Err with the statement, file:line and
 * device, and the caller returns -1 (nothing here exits). */
#ifndef CLLM_CUDA_CHECK_H
#define CLLM_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "base/err.h"

#define CUDA_CHECK(stmt, err)                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (stmt);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            int dev_ = -1;                                                                          \
            cudaGetDevice(&dev_);                                                                   \
            return err_set((err), "CUDA error '%s' in %s at %s:%d (device %d)", cudaGetErrorString(e_), \
                           #stmt, __FILE__, __LINE__, dev_);                                        \
        }                                                                                           \
    } while (0)

#endif
