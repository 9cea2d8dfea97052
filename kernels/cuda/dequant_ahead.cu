/* dequant_ahead.cu — two dequantization buffers, the next matrix made on a
 * second stream under the current GEMM (the why: dequant_ahead.cuh). */
#include "kernels/cuda/dequant_ahead.cuh"

#include <string.h>

#include "kernels/cuda/cuda_check.h"

int deq_ahead_init(DeqAhead *d, int64_t elems, bool lookahead, Err *err) {
    memset(d, 0, sizeof *d);
    d->elems = elems;
    if (elems <= 0) return 0;
    CUDA_CHECK(cudaMalloc(&d->buf[0], (size_t)elems * 2), err);
    if (!lookahead) return 0;
    /* the second buffer is a speed-up, not a need: without the memory, go on with one */
    if (cudaMalloc(&d->buf[1], (size_t)elems * 2) != cudaSuccess) {
        cudaGetLastError();
        d->buf[1] = NULL;
        return 0;
    }
    /* the lowest priority: where a GEMM and a copy made ahead both wait for an SM, the GEMM gets it */
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), err);
    CUDA_CHECK(cudaStreamCreateWithPriority(&d->side, cudaStreamNonBlocking, least), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&d->fork, cudaEventDisableTiming), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&d->join, cudaEventDisableTiming), err);
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&d->ready[i], cudaEventDisableTiming), err);
        CUDA_CHECK(cudaEventCreateWithFlags(&d->read[i], cudaEventDisableTiming), err);
    }
    return 0;
}

void deq_ahead_free(DeqAhead *d) {
    if (d->side) cudaStreamSynchronize(d->side);
    for (int i = 0; i < 2; i++) {
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
    for (int i = 0; i < 2; i++) d->held[i] = NULL, d->landing[i] = d->was_read[i] = false;
    d->ahead = 1;
    return 0;
}

/* s may write or read buf[i] once the side stream's copy into it has landed. */
static int wait_landed(DeqAhead *d, int i, cudaStream_t s, Err *err) {
    if (!d->landing[i]) return 0;
    d->landing[i] = false;
    CUDA_CHECK(cudaStreamWaitEvent(s, d->ready[i], 0), err);
    return 0;
}

void *deq_ahead_get(DeqAhead *d, const QuantMatrix *W, int64_t r0, int64_t n, cudaStream_t s, Err *err) {
    bool whole = r0 == 0 && n == W->rows;
    if (n * W->cols > d->elems) { err_set(err, "cuda: %lld rows of a %lld-wide matrix exceed the dequantization "
                                          "buffer (%lld values)", (long long)n, (long long)W->cols, (long long)d->elems);
                                  return NULL; }
    for (int i = 0; whole && i < 2; i++)
        if (d->buf[i] && d->held[i] == W) return wait_landed(d, i, s, err) ? NULL : d->buf[i];
    int b = d->buf[1] ? 1 - d->ahead : 0; /* not the buffer of the last guess, which may still be right */
    if (wait_landed(d, b, s, err) || quant_dequant_bf16(W, r0, n, d->buf[b], s, err)) return NULL;
    d->held[b] = whole ? W : NULL;
    return d->buf[b];
}

int deq_ahead_after_gemm(DeqAhead *d, const void *buf, const QuantMatrix *next, cudaStream_t s, Err *err) {
    if (!d->buf[1]) return 0;
    int i = buf == d->buf[1];
    CUDA_CHECK(cudaEventRecord(d->read[i], s), err);
    d->was_read[i] = true;
    int j = 1 - i;
    if (!next || next->rows * next->cols > d->elems || d->held[j] == next) return 0;
    if (!d->forked) { /* the side stream starts after everything issued on s so far (earlier steps too) */
        CUDA_CHECK(cudaEventRecord(d->fork, s), err);
        CUDA_CHECK(cudaStreamWaitEvent(d->side, d->fork, 0), err);
        d->forked = true;
    }
    if (d->was_read[j]) CUDA_CHECK(cudaStreamWaitEvent(d->side, d->read[j], 0), err);
    if (quant_dequant_bf16(next, 0, next->rows, d->buf[j], d->side, err)) return -1;
    CUDA_CHECK(cudaEventRecord(d->ready[j], d->side), err);
    d->held[j] = next;
    d->landing[j] = true;
    d->ahead = j;
    return 0;
}
