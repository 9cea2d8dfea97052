/* pipeline.c — the stages of a pipeline, a thread each, passing steps on
 * in launch order (parallel/pipeline.h). */
#include "parallel/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/thread_each.h"
#include "parallel/peer_io.h"
#include "parallel/step_msg.h"

int pipeline_slice(Pipeline *p, const Model *m, const StagePlan *plan, Err *err) {
    memset(p, 0, sizeof *p);
    if (plan->n_stages < 2) return err_set(err, "pipeline: %d stage(s); a pipeline needs at least 2", plan->n_stages);
    p->plan = *plan;
    p->dim = m->cfg.dim;
    for (int s = 0; s < plan->n_stages; s++)
        if (stage_model_make(&p->sm[s], &m->cfg, &m->shape, &m->w, plan, s, err)) return -1;
    return 0;
}

/* ---- the queues between stages ---- */

static void queue_push(JobQueue *q, const StageJob *j) {
    pthread_mutex_lock(&q->mu);
    q->job[(q->head + q->n++) % STAGE_MAX] = *j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* false when the pipeline stops before a step comes. */
static bool queue_pop(JobQueue *q, StageJob *j) {
    pthread_mutex_lock(&q->mu);
    while (q->n == 0 && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
    bool got = q->n > 0;
    if (got) {
        *j = q->job[q->head];
        q->head = (q->head + 1) % STAGE_MAX;
        q->n--;
    }
    pthread_mutex_unlock(&q->mu);
    return got;
}

static void record_error(Pipeline *p, int s, const Err *e) {
    pthread_mutex_lock(&p->err_mu);
    if (!p->failed) {
        p->failed = true;
        err_set(&p->err, "pipeline stage %d (%s): %s", s, p->be[s]->name, e->msg);
    }
    pthread_mutex_unlock(&p->err_mu);
}

/* ---- hand-over between neighbours ---- */

/* Stage s's process as the driver names it (with --tp, its group's hub). */
static const char *remote_name(const Pipeline *p, int s, char *buf, size_t cap) {
    if (p->tpp) snprintf(buf, cap, "pipeline stage %d's hub (world rank %d, the stage's tensor-parallel rank 0)", s,
                         s * p->tpp->n);
    else snprintf(buf, cap, "pipeline stage %d's process", s);
    return buf;
}

static bool linked(const Pipeline *p, int s) {
    if (p->remote) return p->be[p->plan.n_stages - 1]->recv_prev != NULL; /* every stage links alike */
    return p->be[s]->send_next && p->be[s + 1]->recv_prev;
}

/* Stage s passes x and proj of the job's rows to stage s + 1. */
static int link_send(Pipeline *p, int s, const StageJob *j, Err *err) {
    Backend *be = p->be[s];
    Forward *fw = &p->fw[s];
    int64_t n = (int64_t)j->step.b.n_tokens * p->dim;
    if (linked(p, s)) return be->send_next(be, fw->x, n, err) || be->send_next(be, fw->proj, n, err);
    return be->read(be, p->x_host[s][j->slot], fw->x, n, err) ||
           be->read(be, p->proj_host[s][j->slot], fw->proj, n, err);
}

/* Stage s (> 0) takes them from stage s - 1 into its Forward to. */
static int link_recv(Pipeline *p, int s, Forward *to, const StageJob *j, Err *err) {
    Backend *be = p->be[s];
    int64_t n = (int64_t)j->step.b.n_tokens * p->dim;
    if (linked(p, s - 1)) return be->recv_prev(be, to->x, n, err) || be->recv_prev(be, to->proj, n, err);
    if (p->remote) { /* CPU stages: the previous stage's process writes x, then proj, to its connection */
        char peer[96];
        remote_name(p, s - 1, peer, sizeof peer);
        float *x = p->x_host[s - 1][0], *proj = p->proj_host[s - 1][0];
        return peer_read(p->peer_fd[s - 1], x, (size_t)n * 4, p->peer_timeout, peer, err) ||
               peer_read(p->peer_fd[s - 1], proj, (size_t)n * 4, p->peer_timeout, peer, err) ||
               be->write(be, to->x, x, n, err) || be->write(be, to->proj, proj, n, err);
    }
    return be->write(be, to->x, p->x_host[s - 1][j->slot], n, err) ||
           be->write(be, to->proj, p->proj_host[s - 1][j->slot], n, err);
}

/* A stage before the last: takes a step, runs its layers, passes it on.
 * Over a device link the next stage hears of the step BEFORE this one
 * sends (NCCL may block a send until the receiver joins it, e.g. while the
 * first transfer sets up the connection), and before this one waits for its
 * GPU; through host memory the data is in place before it hears. */
static void *stage_main(void *arg) {
    StageThread *t = arg;
    Pipeline *p = t->p;
    int s = t->stage;
    bool device_link = linked(p, s);
    StageJob j;
    while (queue_pop(&p->q[s], &j)) {
        Err err = {{0}};
        bool launched = false;
        if (!j.failed) {
            ForwardStep step = {j.step.ids, j.step.b, NULL, 0, NULL};
            j.failed = (s > 0 && link_recv(p, s, &p->fw[s], &j, &err)) ||
                       (p->tp[s] ? tp_ranks_run(p->tp[s], &p->fw[s], &step, &err)
                                 : forward_launch(&p->fw[s], step.ids, &step.b, NULL, 0, &err)) ||
                       (!device_link && link_send(p, s, &j, &err));
            launched = !j.failed;
            if (j.failed) record_error(p, s, &err);
        }
        queue_push(&p->q[s + 1], &j);
        /* a failed send leaves the receiver waiting: its deadline ends that */
        if (launched && device_link && link_send(p, s, &j, &err)) record_error(p, s, &err);
        else if (launched && forward_wait(&p->fw[s], 0, NULL, &err)) record_error(p, s, &err);
    }
    return NULL;
}

/* ---- start, steps, stop ---- */

static int alloc_handover(Pipeline *p, int s, int max_tokens, Err *err) {
    size_t bytes = (size_t)max_tokens * p->dim * sizeof(float);
    for (int k = 0; k < p->plan.n_stages; k++) {
        p->x_host[s][k] = malloc(bytes);
        p->proj_host[s][k] = malloc(bytes);
        if (!p->x_host[s][k] || !p->proj_host[s][k])
            return err_set(err, "pipeline: out of memory for the host hand-over of %d rows", max_tokens);
    }
    return 0;
}

int pipeline_set_remote(Pipeline *p, const int *fds, double timeout_s, Err *err) {
    int n = p->plan.n_stages;
    p->remote = true;
    p->peer_timeout = timeout_s;
    for (int s = 0; s < n - 1; s++) p->peer_fd[s] = fds[s];
    for (int s = 0; s < n - 1; s++) {
        char peer[96];
        unsigned char buf[16];
        uint32_t len;
        StepMsg m = {0};
        remote_name(p, s, peer, sizeof peer);
        if (peer_read(fds[s], &len, 4, timeout_s, peer, err) || len != 16 || peer_read(fds[s], buf, 16, timeout_s, peer, err))
            return err->msg[0] ? -1 : err_set(err, "%s: no hello", peer);
        if (step_msg_decode(&m, buf, 16, 1, 1, 1, err) || m.kind != STEP_MSG_HELLO)
            return err_set(err, "%s: expected a hello (%s)", peer, err->msg);
        int bs = p->be[n - 1]->kv_block_size;
        if (m.hello[1] != bs) return err_set(err, "%s has KV blocks of %d tokens, this one %d", peer, m.hello[1], bs);
        p->remote_kv_blocks[s] = m.hello[0];
    }
    return 0;
}

static int start_remote(Pipeline *p, int max_tokens, Err *err) {
    int n = p->plan.n_stages;
    if (!linked(p, n - 2) && (n != 2 || alloc_handover(p, n - 2, max_tokens, err)))
        return err->msg[0] ? -1 : err_set(err, "pipeline: stages in several processes without NCCL: at most 2 (CPU stages)");
    return 0;
}

int pipeline_start(Pipeline *p, int max_tokens, Err *err) {
    int n = p->plan.n_stages;
    for (int s = p->remote ? n - 1 : 0; s < n; s++)
        if (!p->be[s]) return err_set(err, "pipeline: stage %d has no backend", s);
    p->max_tokens = max_tokens;
    pthread_mutex_init(&p->err_mu, NULL);
    for (int s = 0; s < n; s++) {
        pthread_mutex_init(&p->q[s].mu, NULL);
        pthread_cond_init(&p->q[s].cv, NULL);
    }
    if (p->remote) return start_remote(p, max_tokens, err);
    for (int s = 0; s < n - 1; s++) {
        if (forward_init(&p->fw[s], pipeline_stage_cfg(p, s), p->be[s], max_tokens, err)) return -1;
        p->fw[s].from_prev = s > 0;
        p->fw[s].to_next = true;
        if (!linked(p, s) && alloc_handover(p, s, max_tokens, err)) return -1;
    }
    for (int s = 0; s < n - 1; s++) {
        p->st[s] = (StageThread){p, s};
        if (pthread_create(&p->thread[s], NULL, stage_main, &p->st[s]))
            return err_set(err, "pipeline: cannot start the thread of stage %d", s);
        p->n_threads++;
    }
    return 0;
}

/* Multi-process: every other stage's process gets the step; the last
 * stage's queue holds it until pipeline_finish. */
static int launch_remote(Pipeline *p, const StageJob *j, Err *err) {
    size_t len = step_msg_encode(j->step.ids, &j->step.b, &p->msg, &p->msg_cap, err);
    if (!len) return -1;
    for (int s = 0; s < p->plan.n_stages - 1; s++) {
        char peer[96];
        remote_name(p, s, peer, sizeof peer);
        if (peer_send(p->peer_fd[s], p->msg, len, p->peer_timeout, peer, err)) return -1;
    }
    p->in_flight++;
    queue_push(&p->q[p->plan.n_stages - 1], j);
    return 0;
}

int pipeline_launch(Pipeline *p, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                    float *logits_out, Err *err) {
    if (p->in_flight == p->plan.n_stages)
        return err_set(err, "pipeline: %d steps already in flight (at most one per stage)", p->in_flight);
    if (b->n_tokens > p->max_tokens)
        return err_set(err, "pipeline: a step of %d rows; the stages hold %d", b->n_tokens, p->max_tokens);
    StageJob j = {{ids, *b, logit_rows, n_logits, logits_out}, p->next_slot, false};
    p->next_slot = (p->next_slot + 1) % p->plan.n_stages;
    if (p->remote) return launch_remote(p, &j, err);
    p->in_flight++;
    queue_push(&p->q[0], &j);
    return 0;
}

int pipeline_finish(Pipeline *p, Forward *last, Err *err) {
    int ls = p->plan.n_stages - 1;
    if (p->in_flight == 0) return err_set(err, "pipeline: no step in flight");
    StageJob j;
    if (!queue_pop(&p->q[ls], &j)) return err_set(err, "pipeline: stopped");
    p->in_flight--;
    /* A stage's error is sticky: its GPU state is unknown, so no later step runs. */
    pthread_mutex_lock(&p->err_mu);
    bool failed = p->failed;
    if (failed) *err = p->err;
    pthread_mutex_unlock(&p->err_mu);
    if (failed || j.failed) return failed ? -1 : err_set(err, "pipeline: an earlier stage failed");
    if (link_recv(p, ls, last, &j, err)) return -1;
    const ForwardStep *st = &j.step;
    if (p->tpp) return tp_process_run(p->tpp, last, st, err); /* the last stage's group of processes */
    if (p->tp[ls]) return tp_ranks_run(p->tp[ls], last, st, err);
    return forward_run(last, st->ids, &st->b, st->logit_rows, st->n_logits, st->logits_out, err);
}

const ModelConfig *pipeline_stage_cfg(const Pipeline *p, int s) {
    if (p->tpp && p->tpp->stage == s) return &p->tpp->rm.cfg;
    return p->tp[s] ? tp_ranks_cfg(p->tp[s]) : &p->sm[s].cfg;
}

int pipeline_kv_blocks(const Pipeline *p) {
    int fewest = -1;
    for (int s = 0; s < p->plan.n_stages; s++) {
        int k = p->tpp && p->tpp->stage == s ? p->tpp->kv_blocks /* its group's fewest */
                : p->be[s]                    ? p->be[s]->kv_n_blocks
                : p->remote                   ? p->remote_kv_blocks[s]
                                              : 0;
        if (fewest < 0 || k < fewest) fewest = k;
    }
    return fewest < 0 ? 0 : fewest;
}

static int stages_launch(void *ctx, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                         float *logits_out, Err *err) {
    return pipeline_launch(ctx, ids, b, logit_rows, n_logits, logits_out, err);
}

static int stages_finish(void *ctx, Forward *last, Err *err) { return pipeline_finish(ctx, last, err); }

ForwardStages pipeline_stages(Pipeline *p) {
    return (ForwardStages){p, p->plan.n_stages, stages_launch, stages_finish};
}

/* Stage s after its thread is joined: its group's ranks after 0 (their
 * links closed after their backends), its Forward, then its backend (rank
 * 0's) unless tpp owns it. */
static void stage_free(void *ctx, int s) {
    Pipeline *p = ctx;
    if (p->tp[s]) tp_ranks_free(p->tp[s]);
    free(p->tp[s]);
    if (p->fw[s].cfg) forward_free(&p->fw[s]);
    if (p->be[s] && !(p->tpp && p->tpp->stage == s)) p->be[s]->destroy(p->be[s]);
    for (int k = 0; k < STAGE_MAX; k++) {
        free(p->x_host[s][k]);
        free(p->proj_host[s][k]);
    }
}

void pipeline_free(Pipeline *p) {
    int n = p->plan.n_stages;
    for (int s = 0; p->remote && s < n - 1; s++) { /* the other processes end their loops */
        unsigned char stop[16];
        Err ignore = {{0}};
        if (p->peer_fd[s] < 0) continue;
        peer_send(p->peer_fd[s], stop, step_msg_encode_small(STEP_MSG_STOP, 0, 0, stop), 5.0, "a stage process", &ignore);
        close(p->peer_fd[s]);
    }
    free(p->msg);
    for (int s = 0; s < n; s++) {
        pthread_mutex_lock(&p->q[s].mu);
        p->q[s].stopping = true;
        pthread_cond_broadcast(&p->q[s].cv);
        pthread_mutex_unlock(&p->q[s].mu);
    }
    for (int s = 0; s < p->n_threads; s++) pthread_join(p->thread[s], NULL);
    if (p->concurrent) thread_each(n, stage_free, p); /* GPUs of their own: each frees its memory at once */
    else
        for (int s = 0; s < n; s++) stage_free(p, s);
    if (p->max_tokens) {
        for (int s = 0; s < n; s++) {
            pthread_mutex_destroy(&p->q[s].mu);
            pthread_cond_destroy(&p->q[s].cv);
        }
        pthread_mutex_destroy(&p->err_mu);
    }
    memset(p, 0, sizeof *p);
}
