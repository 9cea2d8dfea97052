/* sampler.h — turns a row of logits into the next token.
 *
 * A Sampler holds all of its state explicitly: the parameters, a seeded
 * xoshiro256** generator, the recent-token window the penalties count, and
 * scratch buffers sized for the vocabulary. The exact order of operations
 * (penalties, temperature, top-k, top-p, min-p, draw) is written out at the
 * top of kernels/sample_row.c, which every sampler draws through.
 *
 * Usage: sampler_init once per reply (or sequence); sampler_accept every token
 * that should count for the penalties (the prompt's too, as Hugging Face's
 * repetition penalty does); sampler_sample once per step on fresh logits.
 */
#ifndef CLLM_SAMPLER_H
#define CLLM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/backend.h"
#include "kernels/sample_row.h"

typedef struct {
    float temperature;        /* 0 = greedy (argmax after penalties) */
    int top_k;                /* keep the k most likely tokens; 0 = off */
    float top_p;              /* keep the smallest set with cumulative prob >= p; 1 = off */
    float min_p;              /* drop tokens with prob < min_p * max prob; 0 = off */
    float repetition_penalty; /* Hugging Face style, per distinct recent token; 1 = off */
    float presence_penalty;   /* OpenAI style: logit -= presence * (count > 0); 0 = off */
    float frequency_penalty;  /* OpenAI style: logit -= frequency * count; 0 = off */
    int penalty_last_n;       /* how many recent accepted tokens the penalties count; 0 = all */
    uint64_t seed;            /* the generator's seed: same seed, same draws */
} SamplerParams;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off,
 * penalty_last_n 64, seed 0 (a fixed seed: runs repeat unless told otherwise). */
SamplerParams sampler_params_default(void);

typedef SampleCand SamplerCand;

typedef struct {
    SamplerParams p;
    int n_vocab;              /* the vocabulary the scratch buffers hold */
    uint64_t rng[4];          /* xoshiro256** state, seeded through splitmix64 */
    bool penalize;            /* any penalty active: the window below is kept */
    int32_t *distinct;        /* [n_vocab] the tokens in the window, in no order */
    int32_t *distinct_count;  /* [n_vocab] occurrences of distinct[i] in the window */
    int32_t *distinct_pos;    /* [n_vocab] index of a token in distinct, or -1 */
    int n_distinct;
    int32_t *ring;            /* [penalty_last_n] the window, oldest at ring_head */
    int ring_len, ring_head;
    SamplerCand *cand;        /* [n_vocab] scratch: the candidate list */
    float *prob;              /* [n_vocab] scratch: candidate probabilities */
} Sampler;

/* Checks the parameters (a bad value is an error naming the field) and
 * allocates the buffers for n_vocab tokens. Returns 0 or -1. */
int sampler_init(Sampler *s, const SamplerParams *p, int n_vocab, Err *err);
void sampler_free(Sampler *s);

/* Forgets the token history and restarts the generator from the seed. */
void sampler_reset(Sampler *s);

/* Records a token for the penalties (ids outside the vocabulary are ignored). */
void sampler_accept(Sampler *s, int32_t token);

/* Draws the next token. Applies the penalties to logits in place, so pass a
 * fresh row each call. Never fails: a row with no finite logit gives token 0. */
int32_t sampler_sample(Sampler *s, float *logits, int n_vocab);

/* A request's own sampling fields over p: a NaN float or a negative top_k
 * leaves p's value (the field was not given). */
typedef struct {
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
} SamplerOverrides;
void sampler_params_override(SamplerParams *p, const SamplerOverrides *o);

/* The candidate list sampling would draw from for these logits, without
 * drawing: writes up to n_vocab ids and probabilities (summing to 1), most
 * likely first (ties: lower id first), and returns how many. Modifies logits
 * in place like sampler_sample and does not advance the generator. */
int sampler_probs(Sampler *s, float *logits, int n_vocab, int32_t *ids, float *probs);

/* For a sampler that runs elsewhere on this sampler's state (the GPU sampler,
 * kernels/cuda/sampling.cuh), so that seeds and draws stay this sampler's:
 * sampler_uniform_peek returns the uniform the next draw would use without
 * advancing the generator; sampler_uniform_skip advances it past that draw
 * (call it exactly when the other sampler drew, i.e. when more than one
 * candidate survived, as sampler_sample draws only then). */
double sampler_uniform_peek(const Sampler *s);
void sampler_uniform_skip(Sampler *s);

/* The penalty window as distinct tokens and their counts, in no order:
 * writes min(n, cap) pairs and returns n, the number of distinct tokens
 * (0 when no penalty is active). */
int sampler_penalty_window(const Sampler *s, int32_t *ids, int32_t *counts, int cap);

/* The next draw of s as a backend's batched sampler takes it (kernels/
 * backend.h SampleRow): its parameters, its penalty window written to
 * ids / counts (cap entries there) and the uniform it would use. Returns
 * the window's entries; more than cap: the row does not fit (nothing
 * usable was written). After the backend drew, sampler_uniform_skip where
 * it says the draw used the uniform, then sampler_accept the token. */
int sampler_row(const Sampler *s, SampleRow *row, int32_t *ids, int32_t *counts, int cap);

#endif
