/* tiny_rig.h — a tiny fixture model (tests/fixtures/tiny/ARCH.gguf) on the
 * fp32 CPU backend with an engine over it, KV blocks of TINY_RIG_BLOCK
 * tokens; and the LCG the scheduler tests draw their streams from. */
#ifndef CLLM_TESTS_TINY_RIG_H
#define CLLM_TESTS_TINY_RIG_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/model.h"
#include "tests/test.h"

#define TINY_RIG_BLOCK 4

typedef struct {
    Model m;
    Backend *be;
    Engine e;
} Rig;

/* n_blocks of KV cache, ctx tokens per sequence, max_chunk rows per step. */
static inline int rig_open(Rig *r, const char *arch, int n_blocks, int ctx, int max_chunk) {
    char path[1024];
    Err err = {{0}};
    memset(r, 0, sizeof *r);
    snprintf(path, sizeof path, "%s/tiny/%s.gguf", test_fixture_dir(), arch);
    if (model_load(&r->m, path, 0, &err)) { printf("  %s\n", err.msg); return -1; }
    r->be = backend_cpu_create(&r->m.shape, &r->m.w, 2, TINY_RIG_BLOCK, n_blocks, KV_DTYPE_BF16, KV_SCALES_DYNAMIC,
                               &err);
    if (!r->be || engine_init(&r->e, &r->m, r->be, ctx, max_chunk, &err)) { printf("  %s\n", err.msg); return -1; }
    return 0;
}

static inline void rig_close(Rig *r) {
    engine_free(&r->e);
    if (r->be) r->be->destroy(r->be);
    model_free(&r->m);
}

static inline uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

#endif
