/* tensor.h — what a model file says about one tensor, whatever the format.
 *
 * Shapes follow GGUF's convention in both formats: ne[0] is the innermost,
 * contiguous dimension. A PyTorch/safetensors weight of shape [out, in] has
 * ne[0] = in, ne[1] = out. Unused dimensions are 1.
 */
#ifndef CLLM_TENSOR_H
#define CLLM_TENSOR_H

#include <stdint.h>

#include "base/dtype.h"

#define TENSOR_MAX_DIMS 4

typedef struct {
    char *name;             /* NUL-terminated, the file's own name for it */
    int n_dims;             /* 1..TENSOR_MAX_DIMS */
    uint64_t ne[TENSOR_MAX_DIMS];
    DType type;
    uint64_t offset;        /* from the start of the file's data section */
    uint64_t nbytes;
    const void *data;       /* inside the file mapping */
} TensorInfo;

static inline uint64_t tensor_nelems(const TensorInfo *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

#endif
