/* backend_cpu.h — the CPU backend (kernels/cpu/backend_cpu.c): every op in
 * plain fp32 C over the host weights as the file stores them; the oracle of
 * the GPU kernels. */
#ifndef CLLM_BACKEND_CPU_H
#define CLLM_BACKEND_CPU_H

#include "kernels/backend.h"

/* A thread pool (n_threads <= 0: one per core) and a host KV cache of
 * n_blocks blocks of block_size tokens, fp32 (KV_DTYPE_BF16) or e4m3 with
 * scales (KV_DTYPE_FP8) whose scales kv_scales says how to make
 * (KV_SCALES_CHECKPOINT: every layer of w must have kv_scales;
 * anything but KV_SCALES_DYNAMIC needs KV_DTYPE_FP8). shape and w are
 * borrowed for the backend's life. */
Backend *backend_cpu_create(const ModelShape *shape, const ModelWeights *w, int n_threads, int block_size,
                            int n_blocks, KVDtype kv_dtype, KVScales kv_scales, Err *err);
/* Makes be rank `rank` of group g (kernels/tp_group.h): gives it the
 * all_reduce and all_gather ops over host buffers. */
void backend_cpu_join_tp(Backend *be, TpGroup *g, int rank);

/* Rows x layers attended through a cascade group, ever (0 for a backend
 * that is not the CPU's): tests see the cascade path ran. */
int64_t backend_cpu_cascade_rows(const Backend *be);

#endif
