/* forward.h — the decoder, written once over backend ops. */
#ifndef CLLM_FORWARD_H
#define CLLM_FORWARD_H

#include "attention/attn_batch.h"
#include "kernels/backend.h"
#include "model/config.h"

typedef struct {
    const ModelConfig *cfg;
    Backend *be;
    int max_tokens;          /* rows one step may hold */
    float *inv_freq;         /* [n_layers][rope_dim/2] */
    float *mscale;           /* [n_layers] */
    /* activations, named as in forward_run; [T][width] */
    void *x;                 /* residual stream [T][C] */
    void *xn;                /* normalized input of a sublayer [T][C] */
    void *q, *k, *v;         /* [T][H*D], [T][KV*D], [T][KV*Dv] */
    void *att;               /* attention output [T][H*Dv] */
    void *proj;              /* o-proj or MLP output [T][C] */
    void *gate, *up;         /* [T][F] */
    void *last;              /* rows that need logits [T][C] */
    void *logits;            /* [T][V] */
} Forward;

int forward_init(Forward *fw, const ModelConfig *cfg, Backend *be, int max_tokens, Err *err);
void forward_free(Forward *fw);

/* Runs one step over batch->n_tokens rows (ids[t] at batch->pos[t]). Writes the
 * fp32 logits of rows logit_rows[0..n_logits) to logits_out [n_logits][vocab]. */
int forward_run(Forward *fw, const int32_t *ids, const AttnBatch *batch, const int32_t *logit_rows, int n_logits,
                float *logits_out, Err *err);

#endif
