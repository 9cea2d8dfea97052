/* stage_server.c — the loop of a stage in its own process (stage_server.h). */
#include "parallel/stage_server.h"

#include <stdio.h>
#include <stdlib.h>

#include "model/forward.h"
#include "parallel/peer_io.h"
#include "parallel/step_msg.h"

static const char DRIVER[] = "the driving process (the last stage)";

/* x and proj of the step's rows to the next stage: NCCL, or, for CPU
 * stages, the driver's connection (it is the next stage then). */
static int pass_on(Backend *be, Forward *fw, int64_t n, int fd, float *host, Err *err) {
    if (be->send_next) return be->send_next(be, fw->x, n, err) || be->send_next(be, fw->proj, n, err);
    return be->read(be, host, fw->x, n, err) || peer_write(fd, host, (size_t)n * 4, 0, DRIVER, err) ||
           be->read(be, host, fw->proj, n, err) || peer_write(fd, host, (size_t)n * 4, 0, DRIVER, err);
}

/* One step: its input from the stage before, the layers (on every rank of a
 * group), the output on to the next. */
static int run_step(Backend *be, Forward *fw, int stage, const StepMsg *m, int fd, float *host, TpProcess *group,
                    Err *err) {
    int64_t n = (int64_t)m->b.n_tokens * fw->cfg->dim;
    if (stage > 0 && (be->recv_prev(be, fw->x, n, err) || be->recv_prev(be, fw->proj, n, err))) return -1;
    if (group) { /* every rank's sums done: x is whole, then it goes on */
        ForwardStep s = {m->ids, m->b, NULL, 0, NULL};
        return tp_process_run(group, fw, &s, err) || pass_on(be, fw, n, fd, host, err);
    }
    return forward_launch(fw, m->ids, &m->b, NULL, 0, err) || pass_on(be, fw, n, fd, host, err) ||
           forward_wait(fw, 0, NULL, err);
}

static int serve_steps(Backend *be, Forward *fw, int stage, int fd, int max_tokens, float *host, TpProcess *group,
                       Err *err) {
    void *buf = NULL;
    size_t cap = 0, len = 0;
    StepMsg m = {0};
    size_t most = 64 + (size_t)max_tokens * 24 + (size_t)max_tokens * 4 * (1 + (size_t)be->kv_n_blocks);
    int rc = 0;
    for (;;) {
        /* no deadline: an idle chat may send nothing for hours; a dead driver closes the connection */
        rc = peer_recv(fd, &buf, &cap, &len, most, 0, DRIVER, err) ||
             step_msg_decode(&m, buf, len, max_tokens, be->kv_n_blocks, be->kv_block_size, err);
        if (rc || m.kind == STEP_MSG_STOP) break;
        if (m.kind != STEP_MSG_STEP) { rc = err_set(err, "%s sent message kind %d", DRIVER, m.kind); break; }
        if ((rc = run_step(be, fw, stage, &m, fd, host, group, err))) break;
    }
    free(buf);
    step_msg_free(&m);
    return rc ? -1 : 0;
}

int stage_serve(Backend *be, const ModelConfig *cfg, int stage, int n_stages, int fd, int max_tokens, TpProcess *group,
                Err *err) {
    if (stage < 0 || stage >= n_stages - 1) return err_set(err, "stage server: stage %d of %d", stage, n_stages);
    if (!be->send_next && n_stages != 2)
        return err_set(err, "stages in several processes without NCCL (CPU stages): at most 2 processes");
    if (stage > 0 && !be->recv_prev) return err_set(err, "stage %d has no link to stage %d", stage, stage - 1);
    Forward fw;
    if (forward_init(&fw, cfg, be, max_tokens, err)) return -1;
    fw.from_prev = stage > 0;
    fw.to_next = true;
    float *host = be->send_next ? NULL : malloc((size_t)max_tokens * cfg->dim * sizeof *host);
    unsigned char hello[16];
    size_t hl = step_msg_encode_small(STEP_MSG_HELLO, group ? group->kv_blocks : be->kv_n_blocks, be->kv_block_size,
                                      hello);
    int rc = !be->send_next && !host ? err_set(err, "out of memory") : peer_send(fd, hello, hl, 30, DRIVER, err);
    if (rc == 0) rc = serve_steps(be, &fw, stage, fd, max_tokens, host, group, err);
    free(host);
    forward_free(&fw);
    return rc;
}
