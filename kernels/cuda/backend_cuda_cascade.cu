/* backend_cuda_cascade.cu — cascade attention on the CUDA backend: a step's
 * plans (kernels/attn_cascade.h) built on the host, packed behind the step's
 * attention metadata in the same upload, and handed to the layers
 * (attention.cuh cuda_attention_cascade).
 *
 * The plan covers the step's decode rows only: a prefill run's tile already
 * reads each key once for 128 query rows, and its rows would need the
 * prefill kernels to start past the prefix and merge (the flat path serves
 * them). A layer's plan depends on its window (a windowed layer groups a row
 * only where its window covers the prefix): begin_step builds the unwindowed
 * one and uploads it with the metadata; a windowed layer's is built at its
 * first use in the step and copied on the stream then (pinned staging, no
 * host sync), at most CASCADE_PLANS a step.
 *
 * Steps with a group run without CUDA graphs: the shared pass's grid (units
 * x splits) follows the plan, and a graph would have to be sized for the
 * largest plan with most blocks idle. Such steps have many sequences, where
 * the launches a graph saves are a small part of the step. The batch-
 * invariant mode never cascades (the merge changes a row's sum order with
 * its batch). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.cuh"

/* Partial results of the shared pass the scratch holds, per (decode row, query head). */
#define CASCADE_SLOTS_PER_PAIR 4

int cascade_alloc(CudaBackend *cb, Err *err) {
    if (attn_cascade_mode(getenv("CLLM_CASCADE"), &cb->cascade, err)) return -1;
    if (cb->bi || !cb->fast_attn) cb->cascade = ATTN_CASCADE_OFF;
    if (cb->cascade == ATTN_CASCADE_OFF) return 0;
    const ModelShape *c = cb->shape;
    cb->casc_cap_slots = (int64_t)cb->max_seqs * c->n_heads * CASCADE_SLOTS_PER_PAIR;
    CUDA_CHECK(cudaMalloc(&cb->casc_part, attn_cascade_work_bytes(cb->casc_cap_slots, c->head_dim_v)), err);
    size_t T = (size_t)cb->max_tokens;
    cb->casc_pos = (int32_t *)malloc(T * sizeof(int32_t));
    cb->casc_seq = (int32_t *)malloc(T * sizeof(int32_t));
    cb->casc_row_of = (int32_t *)malloc(T * sizeof(int32_t));
    if (!cb->casc_pos || !cb->casc_seq || !cb->casc_row_of) return err_set(err, "out of memory");
    return 0;
}

void cascade_free(CudaBackend *cb) {
    for (int i = 0; i < CASCADE_PLANS; i++) attn_cascade_free(&cb->casc[i].plan);
    free(cb->casc_pos);
    free(cb->casc_seq);
    free(cb->casc_row_of);
    cudaFree(cb->casc_part);
}

/* int32 values of h_meta / d_meta the plans may take behind the metadata */
int64_t cascade_meta_len(const CudaBackend *cb) {
    const ModelShape *c = cb->shape;
    AttnCascadePackOpts o = {c->n_heads / c->n_kv_heads, c->n_kv_heads, ATTN_TILE_M, ATTN_DECODE_TILE_N, 1, 1};
    return CASCADE_PLANS * attn_cascade_pack_len(cb->max_tokens, &o);
}

/* The plan of the step's decode rows for a layer of this window into
 * cb->casc[i]; true when it has a group. */
static bool cascade_plan_window(CudaBackend *cb, int i, int window) {
    const ModelShape *c = cb->shape;
    CascadeStepPlan *sp = &cb->casc[i];
    attn_cascade_free(&sp->plan);
    sp->window = window, sp->used = true, sp->dev.m.n_units = 0;
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap, window,
                    NULL};
    AttnCascadeOpts o = {cb->cascade == ATTN_CASCADE_ALWAYS, cb->n_sms, ATTN_TILE_M, ATTN_DECODE_TILE_N};
    Err e = {};
    if (attn_cascade_plan(&sp->plan, &cb->casc_batch, &p, &o, &e)) return false; /* the flat path: same result */
    return sp->plan.n_groups > 0;
}

/* Packs cb->casc[i]'s plan at h_meta + at (room for room values); the
 * values written, 0 when it has no group or does not fit its scratch. */
static int cascade_pack(CudaBackend *cb, int i, int64_t at, int64_t room) {
    const ModelShape *c = cb->shape;
    CascadeStepPlan *sp = &cb->casc[i];
    if (sp->plan.n_groups == 0) return 0;
    const AttnCascadePlan *pl = &sp->plan;
    int64_t members = pl->groups[pl->n_groups - 1].row0 + pl->groups[pl->n_groups - 1].n_rows;
    int64_t fit = cb->casc_cap_slots / (members * c->n_heads);
    AttnCascadePackOpts o = {c->n_heads / c->n_kv_heads, c->n_kv_heads, ATTN_TILE_M, ATTN_DECODE_TILE_N,
                             2 * cb->n_sms, (int)(fit < ATTN_CASCADE_MAX_SPLITS ? fit : ATTN_CASCADE_MAX_SPLITS)};
    Err e = {};
    if (fit < 1 || attn_cascade_pack(cb->h_meta + at, room, &sp->dev.m, pl, &cb->casc_batch, cb->casc_row_of,
                                     cb->casc_batch_rows, &o, &e)) {
        sp->dev.m.n_units = 0;
        return 0;
    }
    sp->dev.buf = cb->d_meta + at;
    sp->dev.part = cb->casc_part;
    sp->dev.cap_slots = cb->casc_cap_slots;
    cb->casc_rows_total += members;
    return sp->dev.m.len;
}

bool cascade_begin_step(CudaBackend *cb, const AttnBatch *b) {
    for (int i = 0; i < CASCADE_PLANS; i++) cb->casc[i].used = false, cb->casc[i].dev.m.n_units = 0;
    if (cb->cascade == ATTN_CASCADE_OFF || b->n_tokens < 2) return false;
    /* the decode rows: runs of one row (attn_meta.h) */
    int n = 0, T = b->n_tokens;
    for (int t = 0; t < T; t++) {
        bool after = t > 0 && b->seq[t - 1] == b->seq[t] && b->pos[t - 1] + 1 == b->pos[t];
        bool before = t + 1 < T && b->seq[t + 1] == b->seq[t] && b->pos[t] + 1 == b->pos[t + 1];
        if (after || before) continue;
        cb->casc_pos[n] = b->pos[t], cb->casc_seq[n] = b->seq[t], cb->casc_row_of[n] = t;
        n++;
    }
    cb->casc_batch = (AttnBatch){n, cb->casc_pos, cb->casc_seq, NULL, b->n_seqs, b->block_tables, b->block_size};
    cb->casc_batch_rows = T;
    return n >= 2 && cascade_plan_window(cb, 0, 0);
}

int cascade_pack_step(CudaBackend *cb, int64_t at) {
    cb->casc_meta_end = at;
    if (!cb->casc[0].used) return 0;
    int n = cascade_pack(cb, 0, at, cb->meta_cap - at);
    cb->casc_meta_end += n;
    return n;
}

const AttnCascadeDev *cascade_of_layer(CudaBackend *cb, int window) {
    if (cb->cascade == ATTN_CASCADE_OFF || !cb->casc[0].used || cb->casc[0].dev.m.n_units == 0) return NULL;
    int i = 0;
    while (i < CASCADE_PLANS && cb->casc[i].used && cb->casc[i].window != window) i++;
    if (i == CASCADE_PLANS) return NULL; /* more windows than plans: the flat path */
    if (!cb->casc[i].used && cascade_plan_window(cb, i, window)) { /* first use of this window in the step */
        int64_t at = cb->casc_meta_end;
        int n = cascade_pack(cb, i, at, cb->meta_cap - at);
        if (n > 0) {
            op_fail(cb, cudaMemcpyAsync(cb->d_meta + at, cb->h_meta + at, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        cb->stream), "cascade plan upload");
            cuda_overlap_staged(cb); /* the next begin_step writes h_meta after this copy ran */
            cb->casc_meta_end += n;
        }
    }
    return cb->casc[i].dev.m.n_units > 0 ? &cb->casc[i].dev : NULL;
}

int64_t backend_cuda_cascade_rows(const Backend *be) {
    return be && be->begin_step == cuda_be_begin_step ? ((CudaBackend *)be->ctx)->casc_rows_total : 0;
}
