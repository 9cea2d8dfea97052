/* dequant_ahead.cuh — the bf16 copies of quantized matrices that GEMMs of
 * more than 8 rows read (prefill, large batches), made one matrix ahead.
 *
 * At 512 rows a quantized 8B model spends ~5.6 ms of an 18.8 ms step
 * dequantizing (16 GB of bf16 written, then read by cuBLASLt), and in that
 * time no GEMM runs; while a GEMM of a 4096-row matrix runs (64-96 tiles for
 * 132 SMs) SMs and bandwidth sit idle. So the next matrix is dequantized on
 * a second stream into the other of two buffers while the current GEMM
 * runs:
 *
 *   main: [GEMM W0 reads b0] [GEMM W1 reads b1] [GEMM W2 reads b0] ...
 *   side:     [W1 -> b1        ][W2 -> b0 (after GEMM W0)]
 *
 * Events order it: a GEMM waits for the copy it reads (ready[i]), a copy
 * waits for the last GEMM that read its buffer (read[i]). The side stream
 * has the lowest priority, so where a GEMM and a copy both wait for an SM,
 * the GEMM gets it. Each buffer is tagged with the matrix it holds; a
 * matrix not guessed is dequantized on the main stream as before, into the
 * oldest buffer. Tags are reset at every step (a captured graph must hold
 * the whole chain) and the side stream joins the main one at the step's end
 * (a capture must end joined). With three buffers two matrices are made
 * ahead (the big gate|up copy then starts under q|k|v's GEMM, not only
 * under o's short one): measured no faster than two, so the backend takes
 * two. The values do not depend on any
 * of this: the same kernel writes the same bytes. */
#ifndef CLLM_DEQUANT_AHEAD_CUH
#define CLLM_DEQUANT_AHEAD_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/quant.cuh"
#include "base/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DEQ_AHEAD_MAX 3 /* buffers at most: the matrix a GEMM reads and up to two made ahead */

typedef struct {
    void *buf[DEQ_AHEAD_MAX];   /* bf16 [elems] each */
    int n_bufs;                 /* 1: nothing ahead (no stream, no events) */
    int64_t elems;
    const QuantMatrix *held[DEQ_AHEAD_MAX]; /* the whole matrix each buffer holds this step, or NULL */
    uint64_t stamp[DEQ_AHEAD_MAX];          /* when each was last filled or read: the oldest is overwritten */
    uint64_t clock;
    bool landing[DEQ_AHEAD_MAX];  /* a side-stream copy into buf[i] was issued this step (ready[i]) */
    bool was_read[DEQ_AHEAD_MAX]; /* a GEMM read buf[i] this step (read[i]) */
    bool forked;                  /* the side stream has work of this step */
    cudaStream_t side;
    cudaEvent_t fork, join, ready[DEQ_AHEAD_MAX], read[DEQ_AHEAD_MAX];
} DeqAhead;

/* n_bufs buffers of elems bf16 values (1 .. DEQ_AHEAD_MAX; fewer when the
 * memory is not there: more than one is a speed-up, not a need). */
int deq_ahead_init(DeqAhead *d, int64_t elems, int n_bufs, Err *err);
void deq_ahead_free(DeqAhead *d);

/* A new step: joins any side work still open into s, forgets the tags. */
int deq_ahead_begin_step(DeqAhead *d, cudaStream_t s, Err *err);

/* The bf16 rows [r0, r0 + n) of W, in a buffer a GEMM on s may read next:
 * the copy made ahead (s waits for it), or dequantized now on s into the
 * oldest buffer. */
void *deq_ahead_get(DeqAhead *d, const QuantMatrix *W, int64_t r0, int64_t n, cudaStream_t s, Err *err);

/* After the GEMM on s that reads buf (deq_ahead_get's): records that read,
 * then dequantizes on the side stream the matrices that come next (next[0],
 * next[1], ... in the order the step multiplies them; at most n_bufs - 1
 * are taken), each whole one that fits and is not held yet, into the oldest
 * buffer holding none of them. */
int deq_ahead_after_gemm(DeqAhead *d, const void *buf, const QuantMatrix *const *next, int n_next, cudaStream_t s,
                         Err *err);

/* The step's end: s waits for everything issued on the side stream. */
int deq_ahead_join(DeqAhead *d, cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
