/* bench.h — `cllm bench`: load time, prefill and decode speed of a model on
 * random token ids, each figure set against its physical limit.
 *
 * Both run through the scheduler, as chat and generate do: a step's time is
 * its batch, forward pass, draw and stop checks. Prefill: one request, the
 * whole prompt in one step (the engine's chunk is set to the longest
 * prompt); FLOPs = 2 x layer weights x T + the LM head for the one row that
 * gets logits + attention (QK^T and PV over the causal, windowed pairs).
 * Decode: `batch` requests of C prompt tokens; once all decode, steps are
 * timed; bytes per step = every weight the step reads (the LM head, not the
 * untied embedding table; only the used share of MoE experts) + the K/V of
 * each sequence's context as the cache holds them (bf16 on a GPU, fp32 on
 * the CPU, or fp8 codes + scales); a request whose prompt finished a step
 * before another's holds a token more. The limits are those of the GPU it
 * runs on (kernels/gpu_limits.h),
 * each named with its source in the header and the JSON: the memory
 * bandwidth measured at the start (a device-to-device copy of up to 1 GiB,
 * the best of 5, bytes read + written), the dense bf16 and FP8 tensor-core
 * rates from a spec table by the device's name and compute capability; a
 * card not in the table gets no FLOP rate and no prefill %. On the CPU the
 * memory bandwidth is a memcpy's of up to 256 MiB on one thread, best of 5
 * (decode % of it), and there is no FLOP rate (no prefill %). The defaults
 * suit the backend: a GPU runs 512,4096-token prompts and 128,4096 contexts,
 * 64 decode steps, 3 reps; the CPU 128,256 and 128,256, 32 steps, 1 rep
 * (about 20 s for a 135M model on 2 idle cores). (bench/run.sh measures the machine's own
 * matmul rate too, and sets BENCH.md's percentages against it.)
 */
#ifndef CLLM_BENCH_H
#define CLLM_BENCH_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "app/runtime.h"
#include "model/config.h"
#include "kernels/weights.h"

#define BENCH_MAX_LIST 16
#define BENCH_MAX_BATCH 256
#define BENCH_MAX_REPS 100
#define BENCH_UNSET INT_MIN /* decode_tokens, reps: not given, the backend's default */

typedef struct {
    int prompt_lens[BENCH_MAX_LIST];  /* prefill lengths */
    int n_prompt_lens;                /* 0: the backend's default */
    int ctxs[BENCH_MAX_LIST];         /* decode context lengths */
    int n_ctxs;                       /* 0: the backend's default */
    int decode_tokens;                /* timed decode steps per context */
    int batch;                        /* sequences decoded together */
    int reps;                         /* timed prefills per length (the median is reported) */
    uint64_t seed;                    /* of the random token ids */
    const char *json;                 /* write the numbers here, or NULL */
} BenchOptions;

/* Every option not given (the lists, decode_tokens, reps) left for
 * bench_options_for_backend. */
void bench_options_default(BenchOptions *b);

/* Fills what was not given with the defaults of a GPU (gpu) or of the CPU. */
void bench_options_for_backend(BenchOptions *b, bool gpu);

/* 0, or -1 with err naming the option out of range. */
int bench_options_check(const BenchOptions *b, Err *err);

/* Parses "512,4096" into out[0..*n): positive integers, at most cap of them.
 * Returns 0, or -1 with err naming what is wrong. */
int bench_parse_list(const char *s, int *out, int cap, int *n, Err *err);

/* Multiply-add FLOPs x 2 of a prefill of T tokens from position 0. */
double bench_prefill_flops(const ModelConfig *c, const ModelWeights *w, int T);
/* Bytes one decode step of `batch` sequences at contexts ctx[0..batch) must
 * read; kv_head_token: the bytes of one KV head's K and V of a token as the
 * cache holds them. */
double bench_decode_bytes_at(const ModelConfig *c, const ModelWeights *w, const int *ctx, int batch,
                             double kv_head_token);

/* Runs the benchmark and prints the table; 0, or 1 after printing the error. */
int bench_main(const RunOptions *o, const BenchOptions *b);

#endif
