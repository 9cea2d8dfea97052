/* forward.h — the decoder, written once over backend ops. */
#ifndef CLLM_FORWARD_H
#define CLLM_FORWARD_H

#include "kernels/attn_batch.h"
#include "kernels/backend.h"
#include "model/config.h"

/* Logits rows one step may ask for: a scheduler asks for one per sequence,
 * and [rows][vocab] fp32 is the largest activation (1 GB at 1024 x 262k). */
#define FORWARD_MAX_LOGITS 1024

/* Pipeline stages a model may be split into (ForwardStages below). */
#define FORWARD_MAX_STAGES 64

typedef struct {
    const ModelConfig *cfg;
    Backend *be;
    int max_tokens;          /* rows one step may hold */
    int max_logits;          /* rows of those that may get logits: min(max_tokens, FORWARD_MAX_LOGITS) */
    /* activations, named as in forward_run; [T][width] */
    void *x;                 /* residual stream [T][C] (fp32) */
    void *xn;                /* normalized input of a sublayer [T][C] */
    void *q, *k, *v;         /* [T][H*D], [T][KV*D], [T][KV*Dv] */
    void *att;               /* attention output [T][H*Dv] */
    void *proj;              /* o-proj or MLP output [T][C], not yet added to x */
    void *act;               /* act(gate) * up [T][F] */
    void *last;              /* rows that need logits [T][C] */
    void *logits;            /* [T][V] (fp32) */
    void *logits_part;       /* a tensor-parallel rank: its vocabulary range's logits [T][its V] (fp32), else NULL */
    /* A pipeline stage (parallel/stage.h) runs a slice of the layers: with
     * from_prev, x and proj arrive from the previous stage (no embedding;
     * the first layer adds proj to x); with to_next, the step stops after
     * the last layer, leaving x and proj for the next stage. */
    bool from_prev, to_next;
} Forward;

/* Elements of the activations forward_init allocates for max_tokens rows,
 * by kind (a backend sizing its memory budget counts them). */
void forward_buffer_elems(const ModelConfig *c, int max_tokens, int64_t *act_elems, int64_t *f32_elems);

int forward_init(Forward *fw, const ModelConfig *cfg, Backend *be, int max_tokens, Err *err);
void forward_free(Forward *fw);

/* Runs one step over batch->n_tokens rows (ids[t] at batch->pos[t]). Writes the
 * fp32 logits of rows logit_rows[0..n_logits) to logits_out [n_logits][vocab];
 * with logits_out NULL they stay in fw->logits (the backend's memory) for
 * be->sample or a later be->read. */
int forward_run(Forward *fw, const int32_t *ids, const AttnBatch *batch, const int32_t *logit_rows, int n_logits,
                float *logits_out, Err *err);
/* forward_run in two halves, for a pipeline stage that passes its output on
 * between them: launch checks the step and issues its ops (on a GPU they
 * run on after it returns); wait waits for them, copies the logits as
 * forward_run does and reports the first error of the ops. */
int forward_launch(Forward *fw, const int32_t *ids, const AttnBatch *batch, const int32_t *logit_rows, int n_logits,
                   Err *err);
/* Rows of a step whose input token is one a launched draw left in the
 * backend's memory (Backend.feed_tokens): row rows[i] takes the token of
 * draw row src[i]; their ids[] entries are placeholders. */
typedef struct {
    const int32_t *rows, *src;
    int n;
} StepFeed;
/* forward_launch with those rows fed (feed NULL or empty: none). */
int forward_launch_fed(Forward *fw, const int32_t *ids, const AttnBatch *batch, const int32_t *logit_rows,
                       int n_logits, const StepFeed *feed, Err *err);
int forward_wait(Forward *fw, int n_logits, float *logits_out, Err *err);

/* forward_run's arguments as one value: a step handed to another thread
 * (a pipeline stage's, a tensor-parallel rank's), kept by pointer until it
 * is finished. */
typedef struct {
    const int32_t *ids;
    AttnBatch b;
    const int32_t *logit_rows;
    int n_logits;
    float *logits_out;
} ForwardStep;

/* The stages a step passes before the last one's Forward when the model
 * runs as a pipeline (parallel/pipeline.h makes one): launch sends a step in
 * (forward_run's arguments, kept by pointer until finish; up to n_stages
 * steps in flight), finish waits for the oldest step launched and runs it on
 * `last`, the last stage's Forward. */
typedef struct {
    void *ctx;
    int n_stages;
    int (*launch)(void *ctx, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                  float *logits_out, Err *err);
    int (*finish)(void *ctx, Forward *last, Err *err);
} ForwardStages;

#endif
