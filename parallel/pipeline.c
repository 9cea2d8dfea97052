/* pipeline.c — the stages of a pipeline, run one after another with the
 * hidden state handed over through host memory (parallel/pipeline.h). */
#include "parallel/pipeline.h"

#include <stdlib.h>
#include <string.h>

int pipeline_slice(Pipeline *p, const Model *m, const StagePlan *plan, Err *err) {
    memset(p, 0, sizeof *p);
    if (plan->n_stages < 2) return err_set(err, "pipeline: %d stage(s); a pipeline needs at least 2", plan->n_stages);
    p->plan = *plan;
    p->dim = m->cfg.dim;
    for (int s = 0; s < plan->n_stages; s++)
        if (stage_model_make(&p->sm[s], &m->cfg, &m->w, plan, s, err)) return -1;
    return 0;
}

int pipeline_start(Pipeline *p, int max_tokens, Err *err) {
    int n = p->plan.n_stages;
    for (int s = 0; s < n; s++)
        if (!p->be[s]) return err_set(err, "pipeline: stage %d has no backend", s);
    for (int s = 0; s < n - 1; s++) {
        if (forward_init(&p->fw[s], &p->sm[s].cfg, p->be[s], max_tokens, err)) return -1;
        p->fw[s].from_prev = s > 0;
        p->fw[s].to_next = true;
    }
    p->x_host = malloc((size_t)max_tokens * p->dim * sizeof *p->x_host);
    p->proj_host = malloc((size_t)max_tokens * p->dim * sizeof *p->proj_host);
    if (!p->x_host || !p->proj_host) return err_set(err, "pipeline: out of memory for %d rows of handoff", max_tokens);
    return 0;
}

/* x and proj of the step's rows from one stage's Forward to the next's. */
static int hand_over(Pipeline *p, Forward *from, Forward *to, int64_t T, Err *err) {
    int64_t n = T * p->dim;
    if (from->be->read(from->be, p->x_host, from->x, n, err) || from->be->read(from->be, p->proj_host, from->proj, n, err))
        return -1;
    return to->be->write(to->be, to->x, p->x_host, n, err) || to->be->write(to->be, to->proj, p->proj_host, n, err);
}

int pipeline_run(Pipeline *p, Forward *last, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows,
                 int n_logits, float *logits_out, Err *err) {
    int n = p->plan.n_stages;
    for (int s = 0; s < n - 1; s++) {
        if (forward_run(&p->fw[s], ids, b, logit_rows, 0, NULL, err)) return -1;
        if (hand_over(p, &p->fw[s], s + 1 < n - 1 ? &p->fw[s + 1] : last, b->n_tokens, err)) return -1;
    }
    return forward_run(last, ids, b, logit_rows, n_logits, logits_out, err);
}

int pipeline_kv_blocks(const Pipeline *p) {
    int fewest = p->be[0] ? p->be[0]->kv_n_blocks : 0;
    for (int s = 1; s < p->plan.n_stages; s++)
        if (p->be[s] && p->be[s]->kv_n_blocks < fewest) fewest = p->be[s]->kv_n_blocks;
    return fewest;
}

void pipeline_free(Pipeline *p) {
    for (int s = 0; s < p->plan.n_stages - 1; s++) {
        if (p->fw[s].cfg) forward_free(&p->fw[s]);
        if (p->be[s]) p->be[s]->destroy(p->be[s]);
    }
    free(p->x_host);
    free(p->proj_host);
    memset(p, 0, sizeof *p);
}
