/* virtual_engines.c — N schedulers over one block pool, one step of each in
 * flight through the pipeline (see virtual_engines.h). */
#include "engine/virtual_engines.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

int vengines_init(VirtualEngines *g, Engine *e, const SchedOptions *o, int n_ve, Err *err) {
    memset(g, 0, sizeof *g);
    g->e = e;
    g->n = n_ve > 0 ? n_ve : e->stages.n_stages > 0 ? e->stages.n_stages : 1;
    if (g->n > FORWARD_MAX_STAGES) return err_set(err, "%d virtual engines; at most %d", g->n, FORWARD_MAX_STAGES);
    /* the limits left to the cache: each engine's share of the one pool */
    SchedOptions so = *o;
    if (so.max_seqs <= 0) so.max_seqs = engine_auto_max_seqs(e->pool.n_blocks / g->n, e->block_size, e->ctx_limit);
    for (int k = 0; k < g->n; k++)
        if (scheduler_init(&g->ve[k], e, &so, err)) {
            g->n = k;
            vengines_free(g);
            return -1;
        }
    if (g->n > 1) {
        for (int k = 0; k < g->n; k++) scheduler_sync_steps(&g->ve[k]); /* one step in flight per engine */
        if (block_manager_init(&g->bm, &e->pool, e->block_size, err)) {
            vengines_free(g);
            return -1;
        }
        for (int k = 0; k < g->n; k++) scheduler_share(&g->ve[k], &g->bm, &g->next_order);
    }
    g->stats = g->ve[0].stats;
    return 0;
}

void vengines_free(VirtualEngines *g) {
    for (int k = 0; k < g->n; k++) scheduler_free(&g->ve[k]); /* returns their blocks to bm */
    if (g->bm.pool) block_manager_free(&g->bm);
    memset(g, 0, sizeof *g);
}

static int pending_of(const Scheduler *s) { return s->n_waiting + s->n_running + s->n_finished; }

SchedRequest *vengines_submit(VirtualEngines *g, const int32_t *prompt, int n, const GenParams *p, void *user,
                              Err *err) {
    int best = 0;
    for (int k = 1; k < g->n; k++)
        if (pending_of(&g->ve[k]) - g->ve[k].n_finished < pending_of(&g->ve[best]) - g->ve[best].n_finished) best = k;
    return scheduler_submit(&g->ve[best], prompt, n, p, user, err);
}

/* The oldest running request of the engines other than k. */
static uint64_t peers_oldest(const VirtualEngines *g, int k) {
    uint64_t o = UINT64_MAX;
    for (int j = 0; j < g->n; j++)
        if (j != k && g->ve[j].n_running > 0 && g->ve[j].running[0]->order < o) o = g->ve[j].running[0]->order;
    return o;
}

/* Prepares and launches a step of every engine without one in flight. */
static int launch_ready(VirtualEngines *g, Err *err) {
    for (int i = 0; i < g->n; i++) {
        int k = (g->next_prepare + i) % g->n;
        Scheduler *s = &g->ve[k];
        if (g->in_flight[k] || (s->n_waiting == 0 && s->n_running == 0)) continue;
        s->peers_oldest = g->n > 1 ? peers_oldest(g, k) : UINT64_MAX;
        SchedBatch *b = &g->batch[k];
        if (scheduler_prepare(s, b) == 0) continue;
        const ForwardStages *st = &g->e->stages;
        if (st->n_stages > 0 && st->launch(st->ctx, b->ids, &b->b, b->logit_rows, b->n_logits, b->logits_out, err))
            return -1;
        g->in_flight[k] = true;
        g->fifo[(g->fifo_head + g->n_fifo++) % FORWARD_MAX_STAGES] = k;
    }
    g->next_prepare = (g->next_prepare + 1) % g->n;
    return 0;
}

/* The step of engine k through the last stage (or the whole model). */
static int finish_step(VirtualEngines *g, int k, Err *err) {
    double t0 = now_seconds();
    const SchedBatch *b = &g->batch[k];
    const ForwardStages *st = &g->e->stages;
    int rc = st->n_stages > 0 ? st->finish(st->ctx, &g->e->fw, err)
                              : engine_forward(g->e, b->ids, &b->b, b->logit_rows, b->n_logits, b->logits_out, err);
    g->ve[k].stats.forward_seconds = now_seconds() - t0;
    return rc;
}

static void gather_stats(VirtualEngines *g) {
    SchedStats st = g->ve[g->last].stats;
    st.n_running = st.n_waiting = st.n_finished = 0;
    st.preemptions = st.prefix_hit_tokens = st.tokens_generated = st.overlapped = 0;
    st.scheduler_seconds = 0;
    for (int k = 0; k < g->n; k++) {
        const SchedStats *v = &g->ve[k].stats;
        st.n_running += g->ve[k].n_running;
        st.n_waiting += g->ve[k].n_waiting;
        st.n_finished += g->ve[k].n_finished;
        st.preemptions += v->preemptions;
        st.prefix_hit_tokens += v->prefix_hit_tokens;
        st.tokens_generated += v->tokens_generated;
        st.overlapped += v->overlapped;
        st.scheduler_seconds += v->scheduler_seconds;
    }
    const BlockManager *bm = g->ve[0].bm;
    st.blocks_used = block_manager_used(bm);
    st.blocks_cached = bm->n_cached;
    st.blocks_total = bm->n_blocks;
    st.busy_seconds = g->busy_seconds;
    g->stats = st;
}

int vengines_step(VirtualEngines *g, Err *err) {
    double t0 = now_seconds();
    int rc = 0;
    if (g->ve[0].async) { /* one engine on one backend: its steps overlap (step_overlap.h) */
        rc = scheduler_step(&g->ve[0], err);
        g->last = 0;
    } else if ((rc = launch_ready(g, err)) == 0 && g->n_fifo > 0) {
        int k = g->fifo[g->fifo_head];
        g->fifo_head = (g->fifo_head + 1) % FORWARD_MAX_STAGES;
        g->n_fifo--;
        g->in_flight[k] = false;
        rc = finish_step(g, k, err) || scheduler_complete(&g->ve[k], err) ? -1 : 0;
        g->last = k;
    } else if (rc == 0) {
        g->ve[g->last].stats.n_tokens = g->ve[g->last].stats.n_seqs = 0; /* idle: no step */
    }
    g->busy_seconds += now_seconds() - t0;
    gather_stats(g);
    return rc;
}

SchedRequest *vengines_pop_finished(VirtualEngines *g) {
    for (int k = 0; k < g->n; k++) {
        SchedRequest *r = scheduler_pop_finished(&g->ve[k]);
        if (r) return r;
    }
    return NULL;
}


int vengines_pending(const VirtualEngines *g) {
    int n = 0;
    for (int k = 0; k < g->n; k++) n += scheduler_pending(&g->ve[k]);
    return n;
}

int vengines_blocks_held(const VirtualEngines *g, int k) {
    int n = 0;
    const Scheduler *s = &g->ve[k];
    for (int i = 0; i < s->n_running; i++) n += s->running[i]->bt.n_blocks - s->running[i]->n_dropped;
    return n;
}
