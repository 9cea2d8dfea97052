/* tp_process.c — a tensor-parallel group with a process per rank
 * (parallel/tp_process.h). */
#include "parallel/tp_process.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/peer_io.h"
#include "parallel/rendezvous.h"
#include "parallel/step_msg.h"
#include "parallel/tp.h"

/* Rank r of the group as the others name it ("stage 1's tensor-parallel rank 1's process"). */
static const char *rank_name(const TpProcess *t, char *buf, size_t cap, int r) {
    if (t->n_stages > 1) snprintf(buf, cap, "stage %d's tensor-parallel rank %d's process", t->stage, r);
    else snprintf(buf, cap, "tensor-parallel rank %d's process", r);
    return buf;
}

static void name_hub(TpProcess *t) {
    if (t->n_stages <= 1) snprintf(t->hub, sizeof t->hub, "the driving process (tensor-parallel rank 0)");
    else if (t->stage == t->n_stages - 1)
        snprintf(t->hub, sizeof t->hub, "the driving process (stage %d's tensor-parallel rank 0)", t->stage);
    else snprintf(t->hub, sizeof t->hub, "stage %d's hub (its tensor-parallel rank 0)", t->stage);
}

/* The driver: every server's hello; the fewest KV blocks of all (block sizes must agree). */
static int read_hellos(TpProcess *t, Err *err) {
    t->kv_blocks = t->be->kv_n_blocks;
    for (int r = 1; r < t->n; r++) {
        char peer[80];
        size_t len = 0;
        StepMsg m = {0};
        rank_name(t, peer, sizeof peer, r);
        int rc = peer_recv(t->fds[r], &t->msg, &t->cap, &len, 16, t->timeout_s, peer, err) ||
                 step_msg_decode(&m, t->msg, len, 1, 1, 1, err);
        int kind = m.kind, blocks = m.hello[0], block_size = m.hello[1];
        step_msg_free(&m);
        if (rc || kind != STEP_MSG_HELLO) return err_set(err, "%s: expected a hello (%s)", peer, err->msg);
        if (block_size != t->be->kv_block_size)
            return err_set(err, "%s has KV blocks of %d tokens, rank 0 %d", peer, block_size, t->be->kv_block_size);
        if (blocks < t->kv_blocks) t->kv_blocks = blocks;
    }
    return 0;
}

int tp_process_open(TpProcess *t, const ModelConfig *c, const ModelShape *shape, const ModelWeights *w,
                    const TpProcessAt *at, const BackendOptions *o, Err *err) {
    int n = at->n, rank = at->rank;
    memset(t, 0, sizeof *t);
    t->rank = rank, t->n = n, t->timeout_s = at->timeout_s;
    t->stage = at->n_stages > 1 ? at->stage : 0, t->n_stages = at->n_stages > 1 ? at->n_stages : 1;
    name_hub(t);
    for (int r = 0; r < TP_MAX; r++) t->fds[r] = -1;
    if (n < 2 || n > TP_MAX || rank < 0 || rank >= n)
        return err_set(err, "--tp %d: rank %d (2..%d processes)", n, rank, TP_MAX);
    /* a GPU rank uploads views of the model's rows; a CPU rank computes from copies */
    if (tp_plan_make(&t->plan, c, w, n, err) || tp_rank_make(&t->rm, c, shape, w, &t->plan, rank, o->device < 0, err))
        return -1;
    /* rank 0's choice for every rank: nccl[0] set, an NCCL id follows (GPU ranks only) */
    unsigned char blob[1 + BACKEND_LINK_ID_BYTES] = {0};
    Err why = {{0}};
    bool shared = at->where && !at->where->nccl; /* the placement's choice, as one process's group makes it */
    if (shared) snprintf(why.msg, sizeof why.msg, "%s", at->where->why);
    if (rank == 0 && o->device >= 0 && !shared && !backend_link_available(&why) && !backend_link_id(blob + 1, &why))
        blob[0] = 1;
    char group[48] = "";
    if (t->n_stages > 1) snprintf(group, sizeof group, " of stage %d", t->stage);
    if (rendezvous_open(at->master, rank, n, blob, sizeof blob, (int)(at->timeout_s * 1000), t->fds, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return err_set(err, "tensor-parallel rank %d of %d%s: the start-up rendezvous failed (rank 0 listens at %s): %s",
                       rank, n, group, t->n_stages > 1 ? at->master : "--master", why);
    }
    if (!(t->link = tp_link_open(rank, n, t->fds, at->timeout_s, err))) return -1;
    if (t->n_stages > 1) tp_link_name_stage(t->link, t->stage);
    TpGroupLink ops = tp_link_ops(t->link);
    if (!(t->group = tp_group_create_linked(n, &ops, err))) return -1;
    if (blob[0] && o->device < 0)
        return err_set(err, "tensor-parallel rank %d%s runs on the CPU, rank 0 on a GPU over NCCL: run every rank on "
                       "GPUs, or every one with --cpu", rank, group);
    if (blob[0] && !(t->nccl = backend_tp_link_join(o->device, blob + 1, rank, n, at->timeout_s, err))) return -1;
    if (o->device >= 0 && shared)
        snprintf(t->note, sizeof t->note, "%.200s%s (as processes, through the rendezvous' connections)", why.msg, group);
    else if (o->device >= 0 && !blob[0])
        snprintf(t->note, sizeof t->note, "--tp %d as processes%s: %s%.160s%s: the ranks exchange through host memory "
                 "and the rendezvous' connections (slower)", n, group, rank == 0 ? "no NCCL (" : "rank 0 uses no NCCL",
                 rank == 0 ? why.msg : "", rank == 0 ? ")" : "");
    BackendOptions bo = *o;
    bo.tp_group = t->group;
    bo.tp_rank = rank;
    bo.tp_links = t->nccl;
    bo.tp_nccl_sum = o->tp_nccl_sum && t->nccl;
    if (!(t->be = backend_create(&t->rm.shape, &t->rm.w, &bo, err))) return -1;
    if (rank == 0) return read_hellos(t, err);
    unsigned char hello[16];
    size_t hl = step_msg_encode_small(STEP_MSG_HELLO, t->be->kv_n_blocks, t->be->kv_block_size, hello);
    return peer_send(t->fds[0], hello, hl, at->timeout_s, t->hub, err);
}

static int grow_hidden(TpProcess *t, size_t bytes, Err *err) {
    if (bytes <= t->hidden_cap) return 0;
    void *h = realloc(t->hidden, bytes);
    if (!h) return err_set(err, "tensor parallel: out of memory for a %zu-byte hidden state", bytes);
    t->hidden = h, t->hidden_cap = bytes;
    return 0;
}

/* A stage after the first: rank 0's x, then proj (from the stage before), to every rank. */
static int send_hidden(TpProcess *t, Forward *fw, int n_tokens, Err *err) {
    int64_t n = (int64_t)n_tokens * fw->cfg->dim;
    size_t bytes = (size_t)n * sizeof(float);
    float *src[2] = {fw->x, fw->proj};
    if (grow_hidden(t, bytes, err)) return -1;
    for (int k = 0; k < 2; k++) {
        if (fw->be->read(fw->be, t->hidden, src[k], n, err)) return -1;
        for (int r = 1; r < t->n; r++) {
            char peer[80];
            if (peer_send(t->fds[r], t->hidden, bytes, t->timeout_s, rank_name(t, peer, sizeof peer, r), err)) return -1;
        }
    }
    return 0;
}

/* The step to every server: the step message, then its logit rows. */
static int send_step(TpProcess *t, const ForwardStep *s, Err *err) {
    size_t len = step_msg_encode(s->ids, &s->b, &t->msg, &t->cap, err);
    if (!len) return -1;
    for (int r = 1; r < t->n; r++) {
        char peer[80];
        rank_name(t, peer, sizeof peer, r);
        if (peer_send(t->fds[r], t->msg, len, t->timeout_s, peer, err) ||
            peer_send(t->fds[r], s->logit_rows, (size_t)s->n_logits * sizeof(int32_t), t->timeout_s, peer, err))
            return -1;
    }
    return 0;
}

/* A broken group: the link's error (which rank, why) says more than the step's. */
static int group_failed(TpProcess *t, Err *err) {
    tp_group_abort(t->group);
    t->broken = true;
    if (tp_link_error(t->link)[0]) err_set(err, "%s", tp_link_error(t->link));
    return -1;
}

static int stages_launch(void *ctx, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                         float *logits_out, Err *err) {
    TpProcess *t = ctx;
    return tp_hold_step(&t->pending, &t->has_pending, ids, b, logit_rows, n_logits, logits_out, err);
}

int tp_process_run(TpProcess *t, Forward *fw, const ForwardStep *s, Err *err) {
    if (t->rank != 0) return err_set(err, "tensor-parallel rank %d runs the steps rank 0 sends", t->rank);
    if (t->broken) return err_set(err, "tensor parallel: a rank failed earlier; its state is unknown");
    /* a stage's input: over the sockets, or broadcast by forward_ops where the group has NCCL */
    if (send_step(t, s, err) || (fw->from_prev && !fw->be->broadcast && send_hidden(t, fw, s->b.n_tokens, err)))
        return group_failed(t, err);
    int rc = forward_run(fw, s->ids, &s->b, s->logit_rows, s->n_logits, s->logits_out, err);
    if (rc || tp_group_broken(t->group)) return group_failed(t, err);
    return 0;
}

/* The engine's Forward is rank 0's; it embeds (the engine made it for a last stage, from_prev). */
static int stages_finish(void *ctx, Forward *last, Err *err) {
    TpProcess *t = ctx;
    const ForwardStep *s = tp_take_step(&t->pending, &t->has_pending, err);
    if (!s) return -1;
    last->from_prev = false;
    return tp_process_run(t, last, s, err);
}

ForwardStages tp_process_stages(TpProcess *t) { return (ForwardStages){t, 1, stages_launch, stages_finish}; }

/* A stage after the first: x, then proj, of the step's rows from rank 0. */
static int recv_hidden(TpProcess *t, Forward *fw, int n_tokens, Err *err) {
    int64_t n = (int64_t)n_tokens * fw->cfg->dim;
    size_t want = (size_t)n * sizeof(float), len = 0;
    float *dst[2] = {fw->x, fw->proj};
    for (int k = 0; k < 2; k++) {
        if (peer_recv(t->fds[0], &t->hidden, &t->hidden_cap, &len, want, t->timeout_s, t->hub, err)) return -1;
        if (len != want) return err_set(err, "%s: a hidden state of %zu bytes for %d rows of %d", t->hub, len, n_tokens,
                                        fw->cfg->dim);
        if (fw->be->write(fw->be, dst[k], t->hidden, n, err)) return -1;
    }
    return 0;
}

/* A server's step: the step message (no deadline: an idle chat sends
 * nothing for hours; a dead driver closes the connection), its logit rows,
 * in a stage after the first the hidden state (over NCCL: forward_ops's
 * broadcast instead). */
static int serve_one(TpProcess *t, Forward *fw, StepMsg *m, void **rows, size_t *rows_cap, int max_tokens, Err *err) {
    Backend *be = t->be;
    size_t len = 0, most = 64 + (size_t)max_tokens * 24 + (size_t)max_tokens * 4 * (1 + (size_t)be->kv_n_blocks);
    if (peer_recv(t->fds[0], &t->msg, &t->cap, &len, most, 0, t->hub, err) ||
        step_msg_decode(m, t->msg, len, max_tokens, be->kv_n_blocks, be->kv_block_size, err))
        return -1;
    if (m->kind == STEP_MSG_STOP) return 1;
    if (m->kind != STEP_MSG_STEP) return err_set(err, "%s sent message kind %d", t->hub, m->kind);
    if (peer_recv(t->fds[0], rows, rows_cap, &len, (size_t)max_tokens * 4, t->timeout_s, t->hub, err)) return -1;
    const int32_t *lr = *rows;
    int n_logits = (int)(len / sizeof(int32_t));
    if (n_logits > fw->max_logits) return err_set(err, "%s: %d logit rows (at most %d)", t->hub, n_logits, fw->max_logits);
    for (int i = 0; i < n_logits; i++)
        if (lr[i] < 0 || lr[i] >= m->b.n_tokens)
            return err_set(err, "%s: logit row %d of a %d-row step", t->hub, lr[i], m->b.n_tokens);
    if (fw->from_prev && !fw->be->broadcast && recv_hidden(t, fw, m->b.n_tokens, err)) return -1;
    int rc = forward_run(fw, m->ids, &m->b, lr, n_logits, NULL, err);
    if (tp_group_broken(t->group) && tp_link_error(t->link)[0]) /* which rank, why: more than "a rank failed" */
        return err_set(err, "%s", tp_link_error(t->link));
    return rc;
}

int tp_process_serve(TpProcess *t, int max_tokens, Err *err) {
    Forward fw;
    if (t->rank == 0) return err_set(err, "tensor-parallel rank 0 drives; it serves no steps");
    if (forward_init(&fw, &t->rm.cfg, t->be, max_tokens, err)) return -1;
    fw.from_prev = t->stage > 0; /* as its stage's rank 0 runs */
    fw.to_next = t->stage < t->n_stages - 1;
    StepMsg m = {0};
    void *rows = NULL;
    size_t rows_cap = 0;
    int rc;
    while ((rc = serve_one(t, &fw, &m, &rows, &rows_cap, max_tokens, err)) == 0) {}
    if (rc < 0) tp_group_abort(t->group); /* the driver learns at once */
    free(rows);
    step_msg_free(&m);
    forward_free(&fw);
    return rc < 0 ? -1 : 0;
}

void tp_process_close(TpProcess *t) {
    for (int r = 1; t->rank == 0 && r < t->n; r++) {
        unsigned char stop[16];
        char peer[80];
        Err ignore = {{0}};
        if (t->fds[r] >= 0)
            peer_send(t->fds[r], stop, step_msg_encode_small(STEP_MSG_STOP, 0, 0, stop), 5.0,
                      rank_name(t, peer, sizeof peer, r), &ignore);
    }
    if (t->be) t->be->destroy(t->be);
    backend_link_close(t->nccl); /* after the backend that used it */
    tp_group_free(t->group);
    tp_link_free(t->link);
    for (int r = 0; r < TP_MAX; r++)
        if (t->fds[r] >= 0) close(t->fds[r]);
    tp_rank_free(&t->rm);
    free(t->msg);
    free(t->hidden);
    memset(t, 0, sizeof *t);
}
