/* safetensors.h — reads safetensors checkpoints through mmap: one file, or a
 * sharded checkpoint described by model.safetensors.index.json.
 *
 * A file is: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}, then the data; offsets are relative to the data
 * start. Checked: N within the file, JSON well formed, each tensor's dtype
 * known (F32/F16/BF16/F8_E4M3; F8_E5M2 and others refused, named),
 * shape x dtype size == end - begin without overflow, the range inside the
 * file, names unique across shards, every tensor of the index found in its
 * shard. Errors name the file and the tensor.
 */
#ifndef CLLM_SAFETENSORS_H
#define CLLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "formats/tensor.h"

typedef struct {
    char *path;
    const uint8_t *map;
    size_t map_size;
} SafetensorsShard;

typedef struct {
    char *dir;                  /* folder of the checkpoint (for config.json etc.) */
    int n_shards;
    SafetensorsShard *shards;
    uint64_t n_tensors;
    TensorInfo *tensors;        /* shapes with ne[0] innermost (see tensor.h) */
    int *tensor_shard;          /* shard index of each tensor */
    void *priv;                 /* name index */
} Safetensors;

/* path: a .safetensors file, a model.safetensors.index.json, or a folder
 * holding model.safetensors or model.safetensors.index.json. */
int safetensors_open(Safetensors *st, const char *path, Err *err);
void safetensors_close(Safetensors *st);
const TensorInfo *safetensors_find(const Safetensors *st, const char *name);

#endif
