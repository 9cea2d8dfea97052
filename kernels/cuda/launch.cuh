/* launch.cuh — the host-side sizes of the element-wise and per-row kernels. */
#ifndef CLLM_LAUNCH_CUH
#define CLLM_LAUNCH_CUH

#include <stdbool.h>
#include <stdint.h>

/* Blocks of `block` threads for n elements, a grid-stride loop past 4096 blocks. */
static inline int grid_for(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    return (int)(g > 65535 ? 65535 : g < 1 ? 1 : g);
}

static inline bool aligned16(const void *a, const void *b, const void *c, const void *d) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

/* Threads for a per-row kernel: C rounded up to warps, at most 256. */
static inline int row_threads(int C) { return C >= 256 ? 256 : (C + 31) / 32 * 32; }

#endif
