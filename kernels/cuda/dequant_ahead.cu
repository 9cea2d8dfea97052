/* dequant_ahead.cu — dequantization buffers, the next matrices made on a
 * second stream under the current GEMM (the why: dequant_ahead.cuh). */
#include "kernels/cuda/dequant_ahead.cuh"

#include <string.h>

#include "kernels/cuda/cuda_check.h"

static int make_side(DeqAhead *d, Err *err) {
    /* the lowest priority: where a GEMM and a copy made ahead both wait for an SM, the GEMM gets it */
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), err);
    CUDA_CHECK(cudaStreamCreateWithPriority(&d->side, cudaStreamNonBlocking, least), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&d->fork, cudaEventDisableTiming), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&d->join, cudaEventDisableTiming), err);
    for (int i = 0; i < d->n_bufs; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&d->ready[i], cudaEventDisableTiming), err);
        CUDA_CHECK(cudaEventCreateWithFlags(&d->read[i], cudaEventDisableTiming), err);
    }
    return 0;
}

int deq_ahead_init(DeqAhead *d, int64_t elems, int n_bufs, Err *err) {
    memset(d, 0, sizeof *d);
    d->elems = elems;
    if (elems <= 0) return 0;
    if (n_bufs < 1 || n_bufs > DEQ_AHEAD_MAX)
        return err_set(err, "cuda: %d dequantization buffers (1 to %d)", n_bufs, DEQ_AHEAD_MAX);
    CUDA_CHECK(cudaMalloc(&d->buf[0], (size_t)elems * 2), err);
    d->n_bufs = 1;
    while (d->n_bufs < n_bufs && cudaMalloc(&d->buf[d->n_bufs], (size_t)elems * 2) == cudaSuccess) d->n_bufs++;
    cudaGetLastError(); /* a refused extra buffer is not an error */
    return d->n_bufs > 1 ? make_side(d, err) : 0;
}

void deq_ahead_free(DeqAhead *d) {
    if (d->side) cudaStreamSynchronize(d->side);
    for (int i = 0; i < DEQ_AHEAD_MAX; i++) {
        if (d->buf[i]) cudaFree(d->buf[i]);
        if (d->ready[i]) cudaEventDestroy(d->ready[i]);
        if (d->read[i]) cudaEventDestroy(d->read[i]);
    }
    if (d->fork) cudaEventDestroy(d->fork);
    if (d->join) cudaEventDestroy(d->join);
    if (d->side) cudaStreamDestroy(d->side);
    memset(d, 0, sizeof *d);
}

int deq_ahead_join(DeqAhead *d, cudaStream_t s, Err *err) {
    if (!d->forked) return 0;
    d->forked = false;
    CUDA_CHECK(cudaEventRecord(d->join, d->side), err);
    CUDA_CHECK(cudaStreamWaitEvent(s, d->join, 0), err);
    return 0;
}

int deq_ahead_begin_step(DeqAhead *d, cudaStream_t s, Err *err) {
    if (deq_ahead_join(d, s, err)) return -1;
    for (int i = 0; i < DEQ_AHEAD_MAX; i++) d->held[i] = NULL, d->stamp[i] = 0, d->landing[i] = d->was_read[i] = false;
    d->clock = 0;
    return 0;
}

/* s may write or read buf[i] once the side stream's copy into it has landed. */
static int wait_landed(DeqAhead *d, int i, cudaStream_t s, Err *err) {
    if (!d->landing[i]) return 0;
    d->landing[i] = false;
    CUDA_CHECK(cudaStreamWaitEvent(s, d->ready[i], 0), err);
    return 0;
}

static int held_at(const DeqAhead *d, const QuantMatrix *W) {
    for (int i = 0; i < d->n_bufs; i++)
        if (d->held[i] == W) return i;
    return -1;
}

/* The buffer to overwrite: the oldest that holds none of keep[0..n_keep). */
static int oldest(const DeqAhead *d, const QuantMatrix *const *keep, int n_keep) {
    int best = -1;
    for (int i = 0; i < d->n_bufs; i++) {
        bool kept = false;
        for (int k = 0; k < n_keep; k++) kept |= d->held[i] && d->held[i] == keep[k];
        if (!kept && (best < 0 || d->stamp[i] < d->stamp[best])) best = i;
    }
    return best;
}

void *deq_ahead_get(DeqAhead *d, const QuantMatrix *W, int64_t r0, int64_t n, cudaStream_t s, Err *err) {
    bool whole = r0 == 0 && n == W->rows;
    if (n * W->cols > d->elems) {
        err_set(err, "cuda: %lld rows of a %lld-wide matrix exceed the dequantization buffer (%lld values)",
                (long long)n, (long long)W->cols, (long long)d->elems);
        return NULL;
    }
    int i = whole ? held_at(d, W) : -1;
    if (i < 0) {
        i = oldest(d, NULL, 0);
        if (wait_landed(d, i, s, err) || quant_dequant_bf16(W, r0, n, d->buf[i], s, err)) return NULL;
        d->held[i] = whole ? W : NULL;
    } else if (wait_landed(d, i, s, err)) {
        return NULL;
    }
    d->stamp[i] = ++d->clock;
    return d->buf[i];
}

/* One copy made ahead: W into buf[j] on the side stream, after the last GEMM that read buf[j]. */
static int copy_ahead(DeqAhead *d, const QuantMatrix *W, int j, cudaStream_t s, Err *err) {
    if (!d->forked) { /* the side stream starts after everything issued on s so far (earlier steps too) */
        CUDA_CHECK(cudaEventRecord(d->fork, s), err);
        CUDA_CHECK(cudaStreamWaitEvent(d->side, d->fork, 0), err);
        d->forked = true;
    }
    if (d->was_read[j]) CUDA_CHECK(cudaStreamWaitEvent(d->side, d->read[j], 0), err);
    if (quant_dequant_bf16(W, 0, W->rows, d->buf[j], d->side, err)) return -1;
    CUDA_CHECK(cudaEventRecord(d->ready[j], d->side), err);
    d->held[j] = W;
    d->landing[j] = true;
    d->stamp[j] = ++d->clock;
    return 0;
}

int deq_ahead_after_gemm(DeqAhead *d, const void *buf, const QuantMatrix *const *next, int n_next, cudaStream_t s,
                         Err *err) {
    if (d->n_bufs < 2) return 0;
    int i = 0;
    while (i < d->n_bufs - 1 && d->buf[i] != buf) i++;
    CUDA_CHECK(cudaEventRecord(d->read[i], s), err);
    d->was_read[i] = true;
    if (n_next > d->n_bufs - 1) n_next = d->n_bufs - 1;
    for (int k = 0; k < n_next; k++) {
        const QuantMatrix *W = next[k];
        if (!W || W->rows * W->cols > d->elems) break; /* the chain stops at a matrix that is not made ahead */
        if (held_at(d, W) >= 0) continue;
        if (copy_ahead(d, W, oldest(d, next, n_next), s, err)) return -1;
    }
    return 0;
}
