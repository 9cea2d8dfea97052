/* sample_row.h — one draw from a row of logits as a SampleRow (backend.h)
 * describes it, on the host: the semantics every sampler of cllm shares
 * (written out at the top of sample_row.c). engine/sampler.c draws through
 * it with its own penalty window and generator; the CPU backend's batched
 * draw (Backend.sample_launch) runs it row by row; the GPU sampler
 * (kernels/cuda/sampling.cu) follows it step for step. */
#ifndef CLLM_SAMPLE_ROW_H
#define CLLM_SAMPLE_ROW_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"

typedef struct {
    int32_t id;
    float x;                  /* the token's logit after penalties and temperature */
    float w;                  /* exp(x - max x): its probability relative to the top token */
} SampleCand;

/* Applies row's penalties to logits [n] in place, then fills cand[0..return)
 * with the candidates that survive its filters and prob with their
 * normalized probabilities (scratch of n each). *sorted tells whether cand is
 * in rank order (x desc, id asc). n >= 1. */
int sample_row_candidates(const SampleRow *row, float *logits, int n, SampleCand *cand, float *prob, bool *sorted);

/* The token row draws from logits [n] (penalized in place) with its uniform;
 * *drew: whether the uniform was used (more than one candidate survived: the
 * generator that gave it advances). cand, prob: scratch of n each. */
int32_t sample_row_draw(const SampleRow *row, float *logits, int n, SampleCand *cand, float *prob, bool *drew);

/* Puts candidates and their probabilities in rank order (x desc, id asc). */
void sample_cands_rank(SampleCand *cand, float *prob, int n);

#endif
