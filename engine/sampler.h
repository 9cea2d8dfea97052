/* sampler.h — picks the next token from logits.
 *
 * Order, as Hugging Face's logits processors apply it: repetition penalty
 * (HF: a seen token's logit divided by p when positive, multiplied when
 * negative), presence and frequency penalties (OpenAI: logit -= presence *
 * [count > 0] + frequency * count), then temperature, top-k, top-p (the
 * smallest set whose probability reaches p, at least one token), min-p (drop
 * tokens below min_p x the top probability), renormalize, draw. Temperature
 * 0 is greedy: the argmax after penalties, lowest id on ties. Penalties count
 * the last penalty_last_n accepted tokens (0 = all), prompt included. */
#ifndef CLLM_SAMPLER_H
#define CLLM_SAMPLER_H

#include <stdint.h>

#include "model/err.h"

typedef struct {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty, frequency_penalty; /* 0 = off */
    int penalty_last_n;       /* 0 = every accepted token */
    uint64_t seed;
} SamplerParams;

SamplerParams sampler_params_default(void); /* temperature 0.7, top-p 0.95, seed 0 */

typedef struct {
    SamplerParams p;
    int n_vocab;
    uint64_t rng[4];          /* xoshiro256** state */
    int32_t *history;         /* ring of the last penalty_last_n tokens (or all) */
    int n_history, cap_history, head;
    int32_t *counts;          /* [n_vocab] occurrences in the window */
    int32_t *cand_ids;        /* [n_vocab] scratch */
    float *cand_p;            /* [n_vocab] scratch */
} Sampler;

int sampler_init(Sampler *s, const SamplerParams *p, int n_vocab, Err *err);
void sampler_free(Sampler *s);
void sampler_accept(Sampler *s, int32_t token);
/* Draws a token; may modify logits. */
int32_t sampler_sample(Sampler *s, float *logits, int n_vocab);
/* The final candidates and their probabilities (what sampling draws from);
 * returns their count. ids/probs need n_vocab room. May modify logits. */
int sampler_probs(Sampler *s, float *logits, int n_vocab, int32_t *ids, float *probs);

#endif
