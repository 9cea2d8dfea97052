/* backend_cuda_step.cu — a step's start on the CUDA backend: its inputs
 * copied into fixed device buffers, its attention metadata built and
 * uploaded once for all layers, and the CUDA graphs of decode steps.
 *
 * Decode-shaped steps (every row wants logits; MoE: at most 8 rows) run as
 * CUDA graphs, one per bucket of rows (BUCKET_ROWS): begin_step pads the
 * step to its bucket (padding rows: token 0 at position 0 of a sequence of
 * their own reading block 0, slot -1 so they write no KV, their logits never
 * read, so the step stays all decode rows); the first step of a bucket is
 * captured, later ones replayed. Captured graphs hold buffer addresses:
 * releasing a buffer drops them.
 *
 * The buckets: powers of two to 64, then every 64 rows up to 1024 (the most
 * a step's logits hold). Below 64 rows a step is a handful of GEMVs and the
 * launches are what a graph saves, so fine buckets; above, the GEMMs stream
 * the weights once whatever the rows until a few hundred rows (8B bf16:
 * ~300), so up to 63 padding rows cost their attention over one block and a
 * share of the product only where it is compute-bound (<= 63 / 192 there,
 * none at the default limit, a power of two: a full bucket). A power-of-two ladder
 * above 64 would pad up to half a step (129 -> 256) in the compute-bound
 * range. 22 buckets, each captured at its first use: an 8B graph is ~300
 * kernel nodes (tens of ms to capture and instantiate, ~1 MB of graph
 * memory), so at most ~22 captures a process and a few tens of MB, inside
 * RESERVE_BYTES.
 *
 * A decode-shaped step is padded to its bucket also with graphs off
 * (CudaChecks.no_graphs): the knob then changes how the kernels are
 * launched, not which, and a replayed step equals the issued one bit for
 * bit (tests/gpu/test_cuda_batch.c). Steps with prefill rows stay eager:
 * their shape (rows per sequence, prefill tiles, cascade of chunks) changes
 * every step, so a graph per shape would be captured once and rarely
 * replayed. */
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/gemv.cuh"

const int BUCKET_ROWS[N_BUCKETS] = {1,   2,   4,   8,   16,  32,  64,  128, 192, 256,  320,
                                    384, 448, 512, 576, 640, 704, 768, 832, 896, 960, 1024};

void graphs_drop(CudaBackend *cb) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (cb->graph[i]) { cudaGraphExecDestroy(cb->graph[i]); cb->graph[i] = NULL; }
}

/* The bucket of a step of T rows (-1: issue its kernels as they are):
 * decode-shaped steps only, since a graph computes logits for every row,
 * and for MoE only buckets whose routing stays on the device. */
static int step_bucket(CudaBackend *cb, const AttnBatch *b, int n_logits) {
    int T = b->n_tokens;
    if (n_logits != T) return -1;
    for (int i = 1; i < T; i++) /* two rows in a run make a prefill tile: not a decode step */
        if (b->seq[i] == b->seq[i - 1] && b->pos[i] == b->pos[i - 1] + 1) return -1;
    for (int i = 0; i < N_BUCKETS; i++)
        if (T <= BUCKET_ROWS[i]) {
            /* MoE routed on the host: above 8 rows, and always in the batch-invariant mode */
            bool host_sync = cb->shape->n_experts > 0 && (BUCKET_ROWS[i] > GEMV_MAX_T || cb->bi);
            /* max_seqs: the logits buffer's rows and the padding sequences' tables */
            return BUCKET_ROWS[i] <= cb->max_seqs && !host_sync ? i : -1;
        }
    return -1;
}

/* Whether this step's bucket is replayed (or captured): a bucket, and graphs on. */
static bool step_graphed(const CudaBackend *cb) { return cb->tune.graphs && cb->bucket >= 0; }

/* Batch-invariant mode: the decode grid's splits for this graphed step.
 * Rows take splits from their own length, so the grid only has to have
 * enough: a bucket's graph keeps the splits it was captured with until a
 * row needs more, then is captured again with the next power of two (a
 * handful of captures as contexts grow, and no grid of mostly idle blocks
 * sized for the longest possible context). */
static int bi_graph_splits(CudaBackend *cb, int need) {
    int b = cb->bucket;
    if (cb->graph[b] && cb->graph_splits[b] >= need) return cb->graph_splits[b];
    if (cb->graph[b]) { cudaGraphExecDestroy(cb->graph[b]); cb->graph[b] = NULL; }
    int s = 1;
    while (s < need) s *= 2;
    return cb->graph_splits[b] = s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
}

/* Default mode, a step of decode rows alone: the grid's splits. At most
 * cap (the split rule's for the longest context a sequence may reach), at
 * least the power of two above every row's own (attn_row_splits): a row
 * takes min(grid, its own) splits, so its sums are those of the cap's grid
 * whatever the grid. A bucket's graph keeps the splits it was captured with
 * until a row needs more, then is captured again (as bi_graph_splits). So
 * steps of short rows run a grid of one split, which the short decode
 * kernel takes (attention_decode_short.cu), instead of a grid sized for the
 * longest context with most of its blocks leaving at once. */
static int step_grid_splits(CudaBackend *cb, int cap, int split_tiles) {
    int need = 1;
    for (int d = 0; d < cb->meta.n_decode; d++) {
        int64_t pos = cb->meta.buf[cb->meta.off_decode + 3 * d + 2];
        int own = attn_row_splits((int)((pos + ATTN_DECODE_TILE_N) / ATTN_DECODE_TILE_N), split_tiles);
        need = own > need ? own : need;
    }
    int s = 1;
    while (s < need) s *= 2;
    s = s < cap ? s : cap;
    int b = cb->bucket;
    if (!step_graphed(cb)) return s;
    if (cb->graph[b] && cb->graph_splits[b] >= s) return cb->graph_splits[b];
    if (cb->graph[b]) { cudaGraphExecDestroy(cb->graph[b]); cb->graph[b] = NULL; }
    return cb->graph_splits[b] = s;
}

/* The attention metadata of a step of Tp rows (h_pos already holds their
 * positions), uploaded to d_meta, and the decode split count: for a step of
 * decode rows alone, from the longest context a sequence may reach, so one
 * graph capture serves every later step and a step computes the same sums
 * whether it is replayed or issued (graphs on or off). */
static int attn_step_meta(CudaBackend *cb, const AttnBatch *b, int Tp, Err *err) {
    static const int32_t block0 = 0;
    for (int s = 0; s < b->n_seqs; s++) cb->meta_tables[s] = b->block_tables[s];
    for (int i = 0; i < Tp; i++) {
        bool real = i < b->n_tokens;
        cb->meta_seq[i] = real ? b->seq[i] : b->n_seqs + (i - b->n_tokens);
        if (!real) cb->meta_tables[cb->meta_seq[i]] = &block0;
    }
    int n_seqs = b->n_seqs + (Tp - b->n_tokens);
    AttnBatch mb = {Tp, cb->h_pos, cb->meta_seq, NULL, n_seqs, cb->meta_tables, b->block_size};
    AttnMetaOpts o = {(int)(cb->n_slots / b->block_size), cb->bucket >= 0 ? cb->max_blocks : 0};
    attn_meta_free(&cb->meta);
    if (attn_meta_build(&cb->meta, &mb, &o, err)) return -1;
    if (cb->meta.buf_len > cb->meta_cap)
        return err_set(err, "cuda: attention metadata of %d values exceeds its buffer (%lld)", cb->meta.buf_len,
                       (long long)cb->meta_cap);
    memcpy(cb->h_meta, cb->meta.buf, cb->meta.buf_len * sizeof(int32_t));
    int n_casc = cascade_pack_step(cb, cb->meta.buf_len); /* the cascade plan rides in the same upload */
    CUDA_CHECK(cudaMemcpyAsync(cb->d_meta, cb->h_meta, (cb->meta.buf_len + n_casc) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, cb->stream), err);
    attn_dev_meta(&cb->dmeta, &cb->meta, cb->d_meta);
    int ctx = cb->meta.n_tiles == 0 ? cb->max_blocks * b->block_size : cb->meta.max_kv_len;
    cb->work.max_decode = cb->meta.n_decode;
    if (cb->bi) {
        int need = attn_decode_row_splits_max(&cb->meta);
        /* a bucket takes the graph's splits with graphs off too: the same grid either way */
        cb->work.n_splits = cb->bucket >= 0 ? bi_graph_splits(cb, need) : need;
    } else {
        /* one decode row: half-size splits (more blocks for its long rows); with more rows the grid is
         * full already and the extra merges cost (kernels/README.md "attention") */
        cb->work.split_tiles = cb->meta.n_decode == 1 ? ATTN_SPLIT_TILES_ONE_ROW : ATTN_SPLIT_TILES;
        int cap = decode_grid_splits(cb, ctx, cb->meta.n_decode);
        cb->work.n_splits = cb->meta.n_tiles == 0 ? step_grid_splits(cb, cap, cb->work.split_tiles) : cap;
    }
    return 0;
}

int cuda_be_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows,
                              int n_logits, StepRows *rows, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    int T = b->n_tokens;
    if (T > cb->max_tokens || b->n_seqs > cb->max_seqs || b->n_seqs < 1)
        return err_set(err, "cuda: step of %d tokens / %d sequences exceeds %d / %d", T, b->n_seqs, cb->max_tokens,
                       cb->max_seqs);
    if (cuda_overlap_staged_wait(cb, err)) return -1; /* the last step's copies from the staging have run */
    const CudaTuning *tu = &cb->tune;
    if (tu->prof_count > 0 && cb->steps == tu->prof_first) op_fail(cb, cudaProfilerStart(), "profiler start");
    if (tu->prof_count > 0 && cb->steps == (int64_t)tu->prof_first + tu->prof_count)
        op_fail(cb, cudaProfilerStop(), "profiler stop");
    cb->steps++;
    /* a step that calibrates KV scales runs once: never captured (a replay would calibrate again); nor a
     * step with a cascade group (backend_cuda_cascade.cu: the shared pass's grid follows the plan) */
    bool cascade = cb->fast_attn && cascade_begin_step(cb, b);
    cb->bucket = cb->kv_calib_left > 0 || cascade ? -1 : step_bucket(cb, b, n_logits);
    if (deq_ahead_begin_step(&cb->deq, cb->stream, err)) return -1;
    int Tp = cb->bucket >= 0 ? BUCKET_ROWS[cb->bucket] : T, np = cb->bucket >= 0 ? Tp : n_logits;
    /* Block tables: each sequence's blocks up to its furthest position. */
    for (int s = 0; s < b->n_seqs; s++) cb->h_need[s] = 0;
    for (int i = 0; i < T; i++) {
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs || b->pos[i] < 0)
            return err_set(err, "cuda: row %d has sequence %d / position %d", i, b->seq[i], b->pos[i]);
        int nb = b->pos[i] / b->block_size + 1;
        if (nb > cb->h_need[b->seq[i]]) cb->h_need[b->seq[i]] = nb;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        if (cb->h_need[s] > cb->max_blocks)
            return err_set(err, "cuda: sequence %d needs %d blocks (> %d)", s, cb->h_need[s], cb->max_blocks);
        memcpy(cb->h_tables + (int64_t)s * cb->max_blocks, b->block_tables[s], cb->h_need[s] * sizeof(int32_t));
    }
    for (int i = 0; i < Tp; i++) {
        bool real = i < T;
        cb->h_ids[i] = real ? ids[i] : 0;
        cb->h_pos[i] = real ? b->pos[i] : 0;
        cb->h_seq[i] = real ? b->seq[i] : 0;
        cb->h_slot[i] = real ? b->slot[i] : -1;
        cb->h_rows[i] = i < n_logits ? logit_rows[i] : 0;
    }
    cudaStream_t st = cb->stream;
    CUDA_CHECK(cudaMemcpyAsync(cb->d_ids, cb->h_ids, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_pos, cb->h_pos, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_seq, cb->h_seq, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_slot, cb->h_slot, Tp * sizeof(int64_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_rows, cb->h_rows, Tp * sizeof(int32_t), cudaMemcpyHostToDevice, st), err);
    CUDA_CHECK(cudaMemcpyAsync(cb->d_tables, cb->h_tables, (size_t)b->n_seqs * cb->max_blocks * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st), err);
    cb->batch = (DevAttnBatch){Tp, cb->d_pos, cb->d_seq, cb->d_slot, cb->d_tables, cb->max_blocks, b->block_size};
    *rows = (StepRows){Tp, np};
    int rc = cb->fast_attn ? attn_step_meta(cb, b, Tp, err) : 0;
    if (rc == 0) cuda_overlap_staged(cb);
    return rc;
}

bool cuda_be_graph_replay(Backend *be) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed || !step_graphed(cb) || !cb->graph[cb->bucket]) return false;
    op_fail(cb, cudaGraphLaunch(cb->graph[cb->bucket], cb->stream), "graph replay");
    return true;
}

/* Capture of this bucket's first step; the graph is then launched once to
 * do the step's work (capturing runs nothing). */
void cuda_be_graph_capture(Backend *be, bool begin) {
    CudaBackend *cb = cb_of(be);
    if (!step_graphed(cb) || (begin && cb->failed)) return;
    if (begin) {
        op_fail(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), "graph capture");
        return;
    }
    Err je = {};
    if (deq_ahead_join(&cb->deq, cb->stream, &je)) cb_fail(cb, &je);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
    cudaGraphExec_t ex = NULL;
    if (e == cudaSuccess && !cb->failed) e = cudaGraphInstantiate(&ex, g, 0);
    if (g) cudaGraphDestroy(g);
    op_fail(cb, e, "graph instantiate");
    if (cb->failed) { if (ex) cudaGraphExecDestroy(ex); return; }
    cb->graph[cb->bucket] = ex;
    op_fail(cb, cudaGraphLaunch(ex, cb->stream), "graph launch");
}

