/* engine.c — the forward pass over one backend or a pipeline (see engine.h). */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* cfg: the model's, or its last stage's; n_blocks: the KV pool. */
static int engine_init_with(Engine *e, const Model *m, const ModelConfig *cfg, Backend *be, int n_blocks,
                            int ctx_limit, int max_chunk, Err *err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->be = be;
    e->block_size = be->kv_block_size;
    e->max_chunk = max_chunk;
    e->ctx_limit = ctx_limit;
    if (block_pool_init(&e->pool, n_blocks, err)) return -1;
    if (forward_init(&e->fw, cfg, be, max_chunk, err)) { engine_free(e); return -1; }
    return 0;
}

int engine_init(Engine *e, const Model *m, Backend *be, int ctx_limit, int max_chunk, Err *err) {
    return engine_init_with(e, m, &m->cfg, be, be->kv_n_blocks, ctx_limit, max_chunk, err);
}

int engine_init_stages(Engine *e, const Model *m, const ModelConfig *last_cfg, Backend *be, int n_blocks,
                       const ForwardStages *stages, int ctx_limit, int max_chunk, Err *err) {
    if (engine_init_with(e, m, last_cfg, be, n_blocks, ctx_limit, max_chunk, err)) return -1;
    e->fw.from_prev = true;
    e->stages = *stages;
    return 0;
}

int engine_forward(Engine *e, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                   float *logits_out, Err *err) {
    if (e->stages.n_stages == 0) return forward_run(&e->fw, ids, b, logit_rows, n_logits, logits_out, err);
    if (e->stages.launch(e->stages.ctx, ids, b, logit_rows, n_logits, logits_out, err)) return -1;
    return e->stages.finish(e->stages.ctx, &e->fw, err);
}

void engine_free(Engine *e) {
    if (e->fw.be) forward_free(&e->fw);
    block_pool_free(&e->pool);
    memset(e, 0, sizeof *e);
}

int engine_prompt_chunk(int need, int budget, int full_budget) {
    int chunk = need < budget ? need : budget;
    if (need < 2 || full_budget < 4 || chunk <= 0) return chunk;
    if (need - chunk == 1) chunk--;
    return chunk >= 2 ? chunk : 0;
}

int engine_auto_max_seqs(int64_t kv_blocks, int block_size, int ctx_limit) {
    int seq_tokens = ctx_limit > 0 && ctx_limit < ENGINE_AUTO_SEQ_TOKENS ? ctx_limit : ENGINE_AUTO_SEQ_TOKENS;
    int64_t seq_blocks = block_size > 0 ? (seq_tokens + block_size - 1) / block_size : 1;
    int64_t fit = kv_blocks / seq_blocks;
    if (fit < ENGINE_AUTO_MIN_SEQS) fit = ENGINE_AUTO_MIN_SEQS;
    if (fit > ENGINE_AUTO_MAX_SEQS) fit = ENGINE_AUTO_MAX_SEQS;
    int n = 1;
    while (2 * n <= fit) n *= 2;
    return n;
}

int engine_auto_max_batched_tokens(int64_t kv_blocks, int block_size) {
    int64_t tokens = kv_blocks * block_size;
    if (tokens < 1) return 1;
    return tokens < ENGINE_AUTO_BATCHED_TOKENS ? (int)tokens : ENGINE_AUTO_BATCHED_TOKENS;
}
