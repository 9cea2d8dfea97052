/* step_overlap.h — overlapped steps: the host builds and launches step t+1
 * while the backend still runs step t (its forward pass and its draw).
 *
 * One scheduler over one backend that has sample_launch, sample_result and
 * feed_tokens (kernels/backend.h), no pipeline and no tensor-parallel group
 * (those keep the synchronous loop); on by default, CLLM_ASYNC_STEPS=off or
 * SchedOptions.sync_steps turn it off. A call of scheduler_step then:
 *   1. prepares step t+1: a request whose token of step t is still in flight
 *      (a placeholder at the end of its tokens: n_pending) gets its decode
 *      row as if that token continued the reply, unless it cannot (its
 *      max_tokens or the context reached: known in advance); the row's input
 *      id is fed on the backend from step t's draw (feed_tokens);
 *   2. launches step t+1's forward pass; its rows count as computed at once
 *      (blocks indexed, windows given back): every later step runs after it
 *      on the backend;
 *   3. takes step t's tokens (sample_result) and applies them as the
 *      synchronous loop would (generators, penalty windows, stop conditions,
 *      detokenizer, text); a request that ends here leaves its row of step
 *      t+1 wasted (no draw; its blocks freed now, reused only by later
 *      steps);
 *   4. launches step t+1's draw (sample_launch) from the samplers as they
 *      stand after step t's tokens, so penalty windows hold the previous
 *      token and a seeded generator advances only where a draw used it.
 * A request that wants logprobs has its rows' logits kept by the launched
 * draw (copied before the draw penalizes them) and its entries computed when
 * the tokens are taken. A step whose logits must come to the host (prompt
 * logprobs) or whose draw the backend declines (sample_launch returns 1) is
 * drawn and applied before the call returns, as the synchronous loop does. Outputs
 * are the synchronous loop's token for token; which step a row falls in may
 * differ (a finished request's slot and blocks come back a step later).
 */
#ifndef CLLM_STEP_OVERLAP_H
#define CLLM_STEP_OVERLAP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

struct SchedRequest;

typedef struct {
    bool pending;                 /* a launched draw not yet taken */
    int n;                        /* its rows (the launched step's logits rows) */
    struct SchedRequest **req;    /* [max_seqs] the request each row draws for (NULL: none, or it ended since) */
    int32_t *tokens;              /* [max_seqs] the draw, taken */
    bool *drew;                   /* [max_seqs] whether each row used its uniform */
    bool *keep;                   /* [max_seqs] whether each row's logits come back (its request wants logprobs) */
    bool kept;                    /* some do */
    int32_t *feed_rows, *feed_src; /* [max_seqs] the step being built: its rows fed from the launched draw's rows */
    int n_feed;
} StepOverlap;

int step_overlap_init(StepOverlap *ov, int max_seqs, Err *err);
void step_overlap_free(StepOverlap *ov);

/* CLLM_ASYNC_STEPS: *on false for "off", true when unset, empty or "on";
 * -1 with err naming the value otherwise. */
int step_overlap_knob(const char *value, bool *on, Err *err);

#endif
