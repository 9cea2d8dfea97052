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
 * waits for the last GEMM that read its buffer (read[i]). Each buffer is
 * tagged with the matrix it holds; a matrix not guessed is dequantized on
 * the main stream as before. Tags are reset at every step (a captured graph
 * must hold the whole chain) and the side stream joins the main one at the
 * step's end (a capture must end joined). The values do not depend on any
 * of this: the same kernel writes the same bytes. */
#ifndef CLLM_DEQUANT_AHEAD_CUH
#define CLLM_DEQUANT_AHEAD_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/quant.cuh"
#include "model/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *buf[2];               /* bf16 [elems]; buf[1] NULL: one buffer, nothing ahead */
    int64_t elems;
    const QuantMatrix *held[2]; /* the whole matrix each buffer holds this step, or NULL */
    bool landing[2];            /* a side-stream copy into buf[i] was issued this step (ready[i]) */
    bool was_read[2];           /* a GEMM read buf[i] this step (read[i]) */
    int ahead;                  /* the buffer of the last copy made ahead */
    bool forked;                /* the side stream has work of this step */
    cudaStream_t side;
    cudaEvent_t fork, join, ready[2], read[2];
} DeqAhead;

/* Buffers of elems bf16 values: two when lookahead (else one, and no
 * stream or events). */
int deq_ahead_init(DeqAhead *d, int64_t elems, bool lookahead, Err *err);
void deq_ahead_free(DeqAhead *d);

/* A new step: joins any side work still open into s, forgets the tags. */
int deq_ahead_begin_step(DeqAhead *d, cudaStream_t s, Err *err);

/* The bf16 rows [r0, r0 + n) of W, in a buffer a GEMM on s may read next:
 * the copy made ahead (s waits for it), or dequantized now on s. */
void *deq_ahead_get(DeqAhead *d, const QuantMatrix *W, int64_t r0, int64_t n, cudaStream_t s, Err *err);

/* After the GEMM on s that reads buf (deq_ahead_get's): records that read,
 * then, when next is a whole matrix that fits, dequantizes it into the
 * other buffer on the side stream. */
int deq_ahead_after_gemm(DeqAhead *d, const void *buf, const QuantMatrix *next, cudaStream_t s, Err *err);

/* The step's end: s waits for everything issued on the side stream. */
int deq_ahead_join(DeqAhead *d, cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#endif
