/* sampling.cuh — the batched GPU sampler (kernels/cuda/sampling.cu), C-callable.
 *
 * Samples one token per row of fp32 logits [n_rows][n_vocab] already on the
 * device, with the semantics of the CPU sampler (kernels/sample_row.c: penalties,
 * temperature, top-k, top-p, min-p, the draw, NaN/inf rules, tie order and
 * the order candidates are drawn in). Each row comes as the CPU sampler
 * describes its next draw (a SampleRow: parameters, penalty window, the
 * uniform its generator would draw next), so seeds and reproducibility stay
 * the CPU sampler's. A step:
 *
 *   for r in rows: gpu_sampler_set_row(g, r, &rows[r], err)      (r = 0, 1, ...)
 *   gpu_sampler_run(g, d_logits, n_rows, stream, err)            (async)
 *   cudaStreamSynchronize(stream)
 *   token of row r: g->h_out[r]; whether it used its uniform: g->h_out[max_rows + r]
 *
 * Like sampler_sample, the penalties are applied to the logits in place.
 * Limits: top_k up to GPU_SAMPLE_MAX_TOP_K unless top_k >= n_vocab (a larger
 * top_k below the vocabulary is refused: sample that row on the CPU). */
#ifndef CLLM_CUDA_SAMPLING_CUH
#define CLLM_CUDA_SAMPLING_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/backend.h"

#define GPU_SAMPLE_MAX_TOP_K 1024

/* One row's parameters, as the kernel reads them. */
typedef struct {
    float inv_temp;          /* 1.0f / temperature as the CPU computes it (inf: greedy) */
    float top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int pen_start, pen_len;  /* this row's slice of the penalty-window arrays */
    double uniform;          /* the row's next uniform */
} GpuSampleRow;

typedef struct {
    int max_rows, n_vocab, max_pen;
    GpuSampleRow *h_rows, *d_rows; /* [max_rows] pinned staging / device */
    int32_t *h_pen, *d_pen;        /* [2][max_pen] window ids then counts, pinned / device */
    int n_pen;                     /* window entries staged this step */
    int32_t *h_out, *d_out;        /* [2][max_rows] tokens then "drew" flags, pinned / device */
} GpuSampler;

#ifdef __cplusplus
extern "C" {
#endif
/* max_pen: the window entries (distinct tokens) all rows of one step may
 * stage together. Returns 0 or -1. */
int gpu_sampler_build(GpuSampler *g, int max_rows, int n_vocab, int max_pen, Err *err);
void gpu_sampler_free(GpuSampler *g);
/* Stages row r (rows in order from 0; row 0 starts a new step). */
int gpu_sampler_set_row(GpuSampler *g, int r, const SampleRow *row, Err *err);
/* Uploads the staged rows, samples logits [n_rows][n_vocab] (penalized in
 * place) and copies tokens and flags to g->h_out, all on stream. */
int gpu_sampler_run(GpuSampler *g, float *logits, int n_rows, cudaStream_t stream, Err *err);
#ifdef __cplusplus
}
#endif

#endif
