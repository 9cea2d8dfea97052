/* stage.h — the slice of a model that one pipeline stage runs.
 *
 * Stage s of a StagePlan holds layers [first, first + n) of the model,
 * renumbered from 0 (its config's per-layer settings shifted to match), the
 * token embedding when it is the first stage, the final norm and LM head
 * when it is the last (a tied head as the embedding table it is). A backend made from the slice allocates weights and
 * KV cache for those layers alone; its Forward sets from_prev / to_next so
 * the residual stream and the pending sublayer output pass between stages.
 */
#ifndef CLLM_STAGE_H
#define CLLM_STAGE_H

#include <stdbool.h>

#include "kernels/weights.h"
#include "model/config.h"
#include "model/shape.h"
#include "parallel/stage_plan.h"

typedef struct {
    ModelConfig cfg;          /* n_layers = the stage's; layer_window shifted */
    ModelWeights w;           /* layers point into the model's; absent parts have data NULL */
    ModelShape shape;         /* the model's, for these layers (rope tables point into the model's) */
    bool first, last;
    int first_layer;          /* in the whole model */
} StageModel;

/* The slice of stage s (0 <= s < p->n_stages); views of c, shape and w,
 * which must outlive it. */
int stage_model_make(StageModel *sm, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                     const StagePlan *p, int s, Err *err);

#endif
