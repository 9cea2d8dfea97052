/* weight_rows.h — reading a weight's rows where they lie apart.
 *
 * A WeightRef's row i starts at data + i * stride, stride its src_stride
 * (or row_bytes where that is 0: packed rows). A tensor-parallel rank's
 * columns of Wo and Wdown are such a view of the model's wider rows
 * (parallel/tp_plan.h): the GPU uploader reads it row by row, and the CPU
 * backend, which computes from packed rows, gets a packed copy made here.
 * Quantized rows are whole blocks (the slice never cuts one), so every
 * row's bytes are copied as they are.
 */
#ifndef CLLM_WEIGHT_ROWS_H
#define CLLM_WEIGHT_ROWS_H

#include <stdint.h>

#include "base/thread_pool.h"
#include "kernels/weights.h"

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend's upload */
#endif

static inline uint64_t weight_row_stride(const WeightRef *w) { return w->src_stride ? w->src_stride : w->row_bytes; }

/* Row i's row_bytes bytes (i counts the rows of every stacked matrix). */
static inline const void *weight_row(const WeightRef *w, int64_t i) {
    return (const char *)w->data + (uint64_t)i * weight_row_stride(w);
}

/* Rows [r0, r0 + n) of w into dst, back to back (row_bytes each). */
void weight_rows_gather(const WeightRef *w, int64_t r0, int64_t n, void *dst);

/* Every row of w (rows x n_mats) into dst, back to back, the rows split
 * over pool's threads (NULL: on this thread). */
void weight_rows_pack(ThreadPool *pool, const WeightRef *w, void *dst);

/* The name of the first of w's matrices (every layer's, the embedding, the
 * LM head) whose rows are not packed, or NULL: what a backend that computes
 * from host memory refuses. */
const char *weights_strided(const ModelWeights *w, int n_layers);

#ifdef __cplusplus
}
#endif

#endif
