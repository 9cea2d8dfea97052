/* safetensors_write.h — writes one safetensors file (the layout
 * safetensors.h reads): the JSON header (padded with spaces to a multiple
 * of 8 bytes, so every tensor of 4-byte elements stays aligned), then each
 * tensor's bytes in order, produced one tensor at a time by a callback so a
 * model never has to sit in memory whole. */
#ifndef CLLM_SAFETENSORS_WRITE_H
#define CLLM_SAFETENSORS_WRITE_H

#include <stdint.h>

#include "base/err.h"
#include "formats/tensor.h"

typedef struct {
    const char *name;
    DType type;                          /* F32, F16, BF16 or F8_E4M3 */
    int n_dims;                          /* 0 (a scalar) .. TENSOR_MAX_DIMS */
    uint64_t ne[TENSOR_MAX_DIMS];        /* ne[0] innermost, as TensorInfo */
} SafetensorsOutTensor;

/* Fills dst (nbytes = the tensor's size) with tensor i's bytes. */
typedef int (*SafetensorsFillFn)(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err);

/* "F32", "BF16", ... as safetensors spells t; NULL for a type it cannot hold. */
const char *safetensors_dtype_name(DType t);

int safetensors_write(const char *path, const SafetensorsOutTensor *t, uint64_t n_t, SafetensorsFillFn fill,
                      void *ctx, Err *err);

#endif
