/* backend_cuda_async.cu — overlapped steps on the CUDA backend
 * (kernels/backend.h sample_launch, sample_result, feed_tokens; the engine's
 * side: engine/step_overlap.h).
 *
 * sample_launch queues the GPU sampler (sampling.cu) on the stream behind
 * the step's forward pass: the tokens land in the sampler's device buffer and
 * are copied to its pinned buffer, and an event (`drawn`) marks when they are
 * there; it returns at once. The engine then builds the next step and
 * launches it: begin_step uploads placeholder ids, and feed_tokens has
 * kernel_feed_tokens copy the drawn tokens into the step's device ids for the
 * rows that continue a reply, on the stream, before the step's kernels (or
 * its CUDA graph, which reads the same d_ids) run. sample_result waits for
 * the event only when the engine needs the tokens, by which time the next
 * step is already queued behind them. Rows whose request wants logprobs
 * have their logits copied to pinned memory before the sampler penalizes
 * them in place, and come back with the tokens.
 *
 * The pinned staging of a step's inputs (h_ids .. h_tables, h_meta, h_feed)
 * is written by the host and copied on the stream; with steps overlapped,
 * step t's copies may not have run when the host writes step t+1's. So
 * every copy from it is followed by recording `staged`, and begin_step waits
 * for that event before writing. The wait is normally over already: step
 * t's copies run right behind step t-1's draw, which the host took before
 * it built step t+1. A cascade plan of a windowed layer is copied mid-step
 * (backend_cuda_cascade.cu): after such a step the next begin_step waits
 * until the GPU has reached that layer. */
#include "kernels/cuda/backend_cuda.cuh"

#include <stdlib.h>
#include <string.h>

/* ids[rows[i]] = drawn[src[i]] for i < n; feed holds rows, then src. */
__global__ void kernel_feed_tokens(int32_t *ids, const int32_t *feed, int n, const int32_t *drawn) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ids[feed[i]] = drawn[feed[n + i]];
}

int cuda_overlap_staged_wait(CudaBackend *cb, Err *err) {
    CUDA_CHECK(cudaEventSynchronize(cb->ovl.staged), err);
    return 0;
}

void cuda_overlap_staged(CudaBackend *cb) { op_fail(cb, cudaEventRecord(cb->ovl.staged, cb->stream), "staging event"); }

/* The GPU sampler, built at its first use (by this or by sample()). */
static int sampler_ready(CudaBackend *cb, Err *err) {
    if (cb->sampler_built) return 0;
    if (gpu_sampler_build(&cb->sampler, cb->max_seqs, cb->shape->vocab, 256 * cb->max_seqs, err)) return -1;
    cb->sampler_built = true;
    return 0;
}

/* Queues the copies of the kept rows' logits into h_kept (grown to hold k rows). */
static int keep_rows(CudaBackend *cb, const float *logits, int n, const bool *keep, Err *err) {
    CudaOverlap *o = &cb->ovl;
    size_t V = (size_t)cb->shape->vocab;
    int k = 0;
    for (int i = 0; keep && i < n; i++) k += keep[i];
    o->n_kept = 0;
    /* no copy into it is pending: the last draw was taken */
    if (pinned_room((void **)&o->h_kept, &o->kept_bytes, (size_t)k * V * sizeof(float), err)) return -1;
    for (int i = 0; keep && i < n; i++)
        if (keep[i]) {
            CUDA_CHECK(cudaMemcpyAsync(o->h_kept + (size_t)o->n_kept * V, logits + (size_t)i * V, V * sizeof(float),
                                       cudaMemcpyDeviceToHost, cb->stream), err);
            o->kept_row[o->n_kept++] = i;
        }
    return 0;
}

static int cuda_be_sample_launch(Backend *be, void *logits, int n, const SampleRow *rows, const bool *keep, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    if (cb->ovl.n_drawn) return err_set(err, "cuda: a draw of %d rows launched and not taken", cb->ovl.n_drawn);
    if (n <= 0) return 0;
    if (sampler_ready(cb, err)) return -1;
    if (n > cb->sampler.max_rows) return 1;
    /* the last draw's pinned rows, windows and results are free once it is done (taken before this) */
    CUDA_CHECK(cudaEventSynchronize(cb->ovl.drawn), err);
    Err why = {};
    for (int r = 0; r < n; r++)
        if (gpu_sampler_set_row(&cb->sampler, r, &rows[r], &why)) return 1; /* e.g. top_k above the GPU limit */
    op_fail(cb, cudaGetLastError(), "kernel launch");
    Err je = {};
    if (!cb->failed && deq_ahead_join(&cb->deq, cb->stream, &je)) cb_fail(cb, &je);
    if (cb->failed) { *err = cb->err; return -1; }
    if (keep_rows(cb, (const float *)logits, n, keep, err)) return -1; /* before the draw penalizes them */
    if (gpu_sampler_run(&cb->sampler, (float *)logits, n, cb->stream, err)) return -1;
    CUDA_CHECK(cudaEventRecord(cb->ovl.drawn, cb->stream), err);
    cb->ovl.n_drawn = n;
    return 0;
}

static int cuda_be_sample_result(Backend *be, int32_t *tokens, bool *drew, float *kept, int n, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (n != cb->ovl.n_drawn) return err_set(err, "cuda: %d drawn rows taken, %d launched", n, cb->ovl.n_drawn);
    cb->ovl.n_drawn = 0;
    op_fail(cb, cudaGetLastError(), "kernel launch");
    if (!cb->failed) op_fail(cb, cudaEventSynchronize(cb->ovl.drawn), "step");
    if (cb->failed) { *err = cb->err; return -1; }
    memcpy(tokens, cb->sampler.h_out, n * sizeof(int32_t));
    for (int r = 0; r < n; r++) drew[r] = cb->sampler.h_out[cb->sampler.max_rows + r] != 0;
    size_t V = (size_t)cb->shape->vocab;
    for (int j = 0; kept && j < cb->ovl.n_kept; j++)
        memcpy(kept + cb->ovl.kept_row[j] * V, cb->ovl.h_kept + j * V, V * sizeof(float));
    return 0;
}

static int cuda_be_feed_tokens(Backend *be, const int32_t *rows, const int32_t *src, int n, Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    if (n <= 0) return 0;
    if (n > cb->max_seqs) return err_set(err, "cuda: %d fed rows, at most %d", n, cb->max_seqs);
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= cb->batch.n_tokens || src[i] < 0 || src[i] >= cb->ovl.n_drawn)
            return err_set(err, "cuda: feed of row %d from drawn row %d (step of %d rows, %d drawn)", rows[i], src[i],
                           cb->batch.n_tokens, cb->ovl.n_drawn);
        cb->ovl.h_feed[i] = rows[i];
        cb->ovl.h_feed[n + i] = src[i];
    }
    /* begin_step waited for `staged` just before: h_feed's last copy has run */
    CUDA_CHECK(cudaMemcpyAsync(cb->ovl.d_feed, cb->ovl.h_feed, 2 * (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice,
                               cb->stream), err);
    cuda_overlap_staged(cb);
    kernel_feed_tokens<<<(n + 255) / 256, 256, 0, cb->stream>>>(cb->d_ids, cb->ovl.d_feed, n, cb->sampler.d_out);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

int cuda_overlap_init(Backend *be, Err *err) {
    CudaBackend *cb = cb_of(be);
    CUDA_CHECK(cudaEventCreateWithFlags(&cb->ovl.staged, cudaEventDisableTiming), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&cb->ovl.drawn, cudaEventDisableTiming), err);
    size_t bytes = 2 * (size_t)cb->max_seqs * sizeof(int32_t);
    CUDA_CHECK(cudaMallocHost(&cb->ovl.h_feed, bytes), err);
    CUDA_CHECK(cudaMalloc(&cb->ovl.d_feed, bytes), err);
    cb->ovl.kept_row = (int32_t *)malloc((size_t)cb->max_seqs * sizeof(int32_t));
    if (!cb->ovl.kept_row) return err_set(err, "out of memory");
    be->sample_launch = cuda_be_sample_launch;
    be->sample_result = cuda_be_sample_result;
    be->feed_tokens = cuda_be_feed_tokens;
    return 0;
}

void cuda_overlap_free(CudaBackend *cb) {
    if (cb->ovl.staged) cudaEventDestroy(cb->ovl.staged);
    if (cb->ovl.drawn) cudaEventDestroy(cb->ovl.drawn);
    cudaFreeHost(cb->ovl.h_feed);
    cudaFree(cb->ovl.d_feed);
    cudaFreeHost(cb->ovl.h_kept);
    free(cb->ovl.kept_row);
    memset(&cb->ovl, 0, sizeof cb->ovl);
}
