/* logits_file.h — the file `cllm perplexity --save-logits` writes and
 * `--kl-divergence` reads: a run's next-token distributions at every scored
 * position, so another model or setting can be compared with it later.
 *
 * Layout (little-endian; docs in README "Perplexity and KL divergence"):
 *   header  8 bytes magic "CLLMLOGP", u32 version (1), u32 vocab, u32 ctx,
 *           u32 stride, u64 n_tokens, u64 n_scored          (48 bytes)
 *   ids     i32 [n_tokens]: the tokenized text, BOS included
 *   rows    n_scored of them, in the order the positions are scored
 *           (ascending): f32 lo, f32 scale, f32 target_logp, i32 top1,
 *           u16 q[vocab]: log p(v) = lo + scale * q[v]
 * lo is the row's smallest log-probability and scale = -lo / 65535, so every
 * log-probability is kept to within scale/2 (about 2e-4 for a row whose least
 * likely token has log p = -30); the exact log p of the target and the argmax
 * are kept beside it for the reference's perplexity and top-1. Full vocabulary
 * (not top-K) so the KL divergence is exact up to that rounding: 2 bytes a
 * token of the vocabulary, as llama.cpp's per-row scaled uint16 logits.
 *
 * The file is untrusted: every field is checked, a refusal names the file,
 * the field and the value. */
#ifndef CLLM_LOGITS_FILE_H
#define CLLM_LOGITS_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

#define LOGITS_FILE_MAGIC "CLLMLOGP"
#define LOGITS_FILE_VERSION 1
#define LOGITS_FILE_HEADER_BYTES 48
#define LOGITS_FILE_MAX_VOCAB (1 << 24)
#define LOGITS_FILE_MAX_TOKENS (1 << 28)

typedef struct {
    int vocab, ctx, stride;
    int64_t n_tokens, n_scored;
    int32_t *ids;            /* [n_tokens], owned (logits_header_free) */
} LogitsHeader;

typedef struct {
    float lo, scale;         /* log p(v) = lo + scale * q[v] */
    float target_logp;       /* exact log p of the scored token */
    int32_t top1;            /* argmax */
    uint16_t *q;             /* [vocab], the caller's */
} LogitsRow;

/* Bytes of one row for a vocabulary. */
static inline int64_t logits_row_bytes(int vocab) { return 16 + 2 * (int64_t)vocab; }

int logits_file_write_header(FILE *f, const char *path, const LogitsHeader *h, Err *err);
/* Quantizes a row of log-probabilities logp[vocab] (finite, <= 0) and writes it. */
int logits_file_write_row(FILE *f, const char *path, const double *logp, int vocab, int32_t target, uint16_t *scratch,
                          Err *err);

/* Reads and checks the header and ids; file_bytes (the file's size, or -1
 * when unknown) must be exactly what they announce. expect_scored(n_tokens,
 * ctx, stride) gives the positions the windows score (the ids must be the
 * windows' tokens); NULL skips that check. */
int logits_file_read_header(FILE *f, const char *path, int64_t file_bytes,
                            int64_t (*expect_scored)(int64_t, int, int), LogitsHeader *h, Err *err);
/* Reads row `index` (for messages) into r (r->q must hold vocab entries) and checks it. */
int logits_file_read_row(FILE *f, const char *path, int64_t index, int vocab, LogitsRow *r, Err *err);
/* The row's log-probabilities, renormalized (the rounding leaves sum p != 1 by ~1e-4). */
void logits_row_logp(const LogitsRow *r, int vocab, double *logp);
void logits_header_free(LogitsHeader *h);

#endif
