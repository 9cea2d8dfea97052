/* gguf_write.h — writes a GGUF v3 file (the layout gguf.h reads): the kv
 * pairs, the tensor infos with offsets aligned to `alignment`, then each
 * tensor's bytes, produced one tensor at a time by a callback so a model
 * never has to sit in memory whole. */
#ifndef CLLM_GGUF_WRITE_H
#define CLLM_GGUF_WRITE_H

#include "formats/gguf.h"

typedef struct {
    const char *name;
    int n_dims;
    uint64_t ne[TENSOR_MAX_DIMS];
    DType type;
} GGUFOutTensor;

/* Fills dst (nbytes = the tensor's size) with tensor i's bytes. */
typedef int (*GGUFFillFn)(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err);

/* kv: values as gguf_open parses them (strings and arrays may point into
 * another file's mapping). alignment: a power of two; the caller keeps
 * general.alignment in kv consistent with it. */
int gguf_write(const char *path, const GGUFKV *kv, uint64_t n_kv, const GGUFOutTensor *t, uint64_t n_t,
               uint64_t alignment, GGUFFillFn fill, void *ctx, Err *err);

#endif
