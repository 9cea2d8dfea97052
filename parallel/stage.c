/* stage.c — a pipeline stage's slice of the model (parallel/stage.h). */
#include "parallel/stage.h"

#include <string.h>

int stage_model_make(StageModel *sm, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                     const StagePlan *p, int s, Err *err) {
    memset(sm, 0, sizeof *sm);
    if (s < 0 || s >= p->n_stages) return err_set(err, "stage %d outside the plan's %d stages", s, p->n_stages);
    int first = p->first_layer[s], n = p->n_layers[s];
    if (first < 0 || n < 1 || first + n > c->n_layers)
        return err_set(err, "stage %d: layers %d..%d outside the model's %d", s, first, first + n - 1, c->n_layers);
    sm->cfg = *c;
    sm->cfg.n_layers = n;
    memset(sm->cfg.layer_window, 0, sizeof sm->cfg.layer_window);
    memcpy(sm->cfg.layer_window, c->layer_window + first, (size_t)n * sizeof c->layer_window[0]);
    sm->w = *w;
    sm->w.layers = w->layers + first;
    sm->shape = *shape;
    sm->shape.n_layers = n;
    sm->shape.rope_inv_freq += (size_t)first * (shape->rope_dim / 2);
    sm->shape.rope_mscale += first;
    sm->first = s == 0;
    sm->last = s == p->n_stages - 1;
    sm->first_layer = first;
    /* A tied LM head is the embedding table: the last stage keeps it under
     * that name, so its backend treats it exactly as one holding the whole
     * model does (the same weights, the same kernels). */
    bool tied_head = sm->last && w->output.data == w->tok_embd.data;
    if (!sm->first && !tied_head) memset(&sm->w.tok_embd, 0, sizeof sm->w.tok_embd);
    if (!sm->last) {
        memset(&sm->w.output_norm, 0, sizeof sm->w.output_norm);
        memset(&sm->w.output, 0, sizeof sm->w.output);
    }
    return 0;
}
