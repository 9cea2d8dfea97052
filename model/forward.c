/* forward.c — the decoder of every supported architecture, one op per line.
 *
 *   x = embed(ids) * embed_scale
 *   per layer:
 *     x += proj; xn = rmsnorm(x)             attention block (proj: the last
 *                                            sublayer's output, none at layer 0)
 *     q, k, v = xn @ Wq, Wk, Wv (+ biases)
 *     q, k = rope(rmsnorm per head(q, k))    qk-norm: Qwen3, Gemma 3; rope:
 *     cache[slot] = k, v                     layer's base and scaling
 *     att = attention(q, cache)              window, soft-cap, sinks per layer
 *     proj = att @ Wo (+ bias); rmsnorm      post-norm: Gemma
 *     x += proj; xn = rmsnorm(x)             MLP block
 *     proj = down(act(xn @ Wgate) * (xn @ Wup))   or the MoE of gpt-oss
 *     proj = rmsnorm(proj)                   post-norm: Gemma
 *   x += proj; logits = rmsnorm(x)[rows] @ Wout; soft-cap   final-logit cap: Gemma 2
 *
 * A rank of a tensor-parallel group (the backend has all_reduce) holds some
 * heads, some MLP columns and a vocabulary range: its o-proj and down
 * products are partial sums, all-reduced over the group before they join x
 * (and before a post-norm; in one op where the backend keeps the partial
 * products in fp32 until the sum: matmul_all_reduce); its logits are its
 * range's, gathered into the whole row. The biases of Wo and Wdown live on
 * rank 0 only.
 *
 * The residual add is fused with the norm that follows it, so the residual
 * stream x is read and written once per sublayer. The config says which
 * optional steps run; nothing here names an architecture.
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "model/shape.h"

void forward_buffer_elems(const ModelConfig *c, int max_tokens, int64_t *act_elems, int64_t *f32_elems) {
    int64_t T = max_tokens, q = (int64_t)c->n_heads * c->head_dim_k, kv = (int64_t)c->n_kv_heads * c->head_dim_k;
    int64_t vv = (int64_t)c->n_kv_heads * c->head_dim_v, att = (int64_t)c->n_heads * c->head_dim_v;
    *act_elems = T * (3 * (int64_t)c->dim + q + kv + vv + att + c->ffn_dim);  /* xn proj last | q k v att | act */
    int64_t L = T < FORWARD_MAX_LOGITS ? T : FORWARD_MAX_LOGITS;
    *f32_elems = T * (int64_t)c->dim + L * c->vocab;                          /* x | logits */
}

int forward_init(Forward *fw, const ModelConfig *c, Backend *be, int max_tokens, Err *err) {
    memset(fw, 0, sizeof *fw);
    fw->cfg = c;
    fw->be = be;
    fw->max_tokens = max_tokens;
    fw->max_logits = max_tokens < FORWARD_MAX_LOGITS ? max_tokens : FORWARD_MAX_LOGITS;
    int64_t T = max_tokens, q = (int64_t)c->n_heads * c->head_dim_k, kv = (int64_t)c->n_kv_heads * c->head_dim_k;
    int64_t vv = (int64_t)c->n_kv_heads * c->head_dim_v, att = (int64_t)c->n_heads * c->head_dim_v;
    fw->x = be->alloc(be, T * c->dim, BUF_F32);
    fw->xn = be->alloc(be, T * c->dim, BUF_ACT);
    fw->q = be->alloc(be, T * q, BUF_ACT);
    fw->k = be->alloc(be, T * kv, BUF_ACT);
    fw->v = be->alloc(be, T * vv, BUF_ACT);
    fw->att = be->alloc(be, T * att, BUF_ACT);
    fw->proj = be->alloc(be, T * c->dim, BUF_ACT);
    fw->act = be->alloc(be, T * c->ffn_dim, BUF_ACT);
    fw->last = be->alloc(be, T * c->dim, BUF_ACT);
    fw->logits = be->alloc(be, (int64_t)fw->max_logits * c->vocab, BUF_F32);
    const WeightRef *head = &be->weights->output;
    bool part = be->all_gather && head->data;
    if (part) fw->logits_part = be->alloc(be, (int64_t)fw->max_logits * head->rows, BUF_F32);
    if ((part && !fw->logits_part) || !fw->x || !fw->xn || !fw->q || !fw->k || !fw->v || !fw->att || !fw->proj || !fw->act || !fw->last ||
        !fw->logits) {
        forward_free(fw);
        return err_set(err, "%s: cannot allocate activations for %d tokens", be->name, max_tokens);
    }
    return 0;
}

void forward_free(Forward *fw) {
    Backend *be = fw->be;
    void *bufs[] = {fw->x, fw->xn, fw->q, fw->k, fw->v, fw->att, fw->proj, fw->act, fw->last, fw->logits,
                    fw->logits_part};
    for (size_t i = 0; be && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->release(be, bufs[i]);
    memset(fw, 0, sizeof *fw);
}

/* x += pending (the previous sublayer's output not yet added; NULL: none),
 * then rmsnorm with w into xn, read by qkv / gate_up: through norm_qkv /
 * norm_gate_up where the backend has them (it may fold the norm into the
 * product). */
static AddNorm forward_add_norm(Forward *fw, const void *pending, const WeightRef *w) {
    AddNorm n = {fw->x, pending, fw->xn, w, fw->cfg->dim, fw->cfg->norm_eps, fw->cfg->norm_offset};
    return n;
}

static void forward_run_add_norm(Forward *fw, const AddNorm *n, int T) {
    fw->be->add_rmsnorm(fw->be, n->x, n->delta, n->out, n->w, T, n->C, n->eps, n->offset);
}

/* A sublayer's output projection: added to x by the product itself where
 * the backend can (matmul_add; on a tensor-parallel rank, whose product is a
 * partial sum, matmul_all_reduce_add; not with a post-norm, nor when may_add
 * is false),
 * else into proj (all-reduced over a tensor-parallel group, then post-normed
 * if the layer says so). Returns what is still to be added to x: NULL or
 * proj. */
static const void *forward_out_proj(Forward *fw, const void *in, const WeightRef *w, const WeightRef *b,
                                    const WeightRef *post_norm, bool may_add, int T) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    bool tp = be->all_reduce != NULL;
    if (may_add && !post_norm->data) { /* added into x by the product (tp: by its group's sum) */
        if (!tp && be->matmul_add && be->matmul_add(be, fw->x, in, w, 0, b, T)) return NULL;
        if (tp && be->matmul_all_reduce_add && be->matmul_all_reduce_add(be, fw->x, in, w, 0, b, T)) return NULL;
    }
    if (tp && be->matmul_all_reduce) {
        be->matmul_all_reduce(be, fw->proj, in, w, 0, b, T);
    } else {
        be->matmul(be, fw->proj, in, w, 0, b, T);
        if (tp) be->all_reduce(be, fw->proj, (int64_t)T * c->dim, BUF_ACT);
    }
    if (post_norm->data) be->rmsnorm(be, fw->proj, fw->proj, post_norm, T, c->dim, c->norm_eps, c->norm_offset);
    return fw->proj;
}

/* pending: what is still to be added to x (NULL: nothing). Returns the
 * same for the next sublayer. */
static const void *forward_attention_block(Forward *fw, int l, int T, const void *pending) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const LayerWeights *lw = &be->weights->layers[l];
    AddNorm n = forward_add_norm(fw, pending, &lw->attn_norm);
    if (be->norm_qkv) {
        be->norm_qkv(be, &n, fw->q, fw->k, fw->v, lw, T);
    } else {
        forward_run_add_norm(fw, &n, T);
        be->qkv(be, fw->q, fw->k, fw->v, fw->xn, lw, T);
    }
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap,
                    c->layer_window[l], lw->sinks.data};
    if (!be->rope_attention || !be->rope_attention(be, l, fw->att, fw->q, fw->k, fw->v, &p, T)) {
        be->rope_kv_write(be, l, fw->q, fw->k, fw->v, T);   /* qk-norm (if any), rope, cache write */
        be->attention(be, fw->att, fw->q, l, &p, T);
    }
    return forward_out_proj(fw, fw->att, &lw->wo, &lw->bo, &lw->post_attn_norm, true, T);
}

/* may_add false: the output stays in proj (a pipeline stage's last layer
 * hands x and proj to the next stage). */
static const void *forward_mlp_block(Forward *fw, int l, int T, const void *pending, bool may_add) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const LayerWeights *lw = &be->weights->layers[l];
    AddNorm n = forward_add_norm(fw, pending, &lw->ffn_norm);
    if (c->n_experts > 0) {
        forward_run_add_norm(fw, &n, T);
        be->moe(be, fw->proj, fw->xn, lw, T);
        if (lw->post_ffn_norm.data)
            be->rmsnorm(be, fw->proj, fw->proj, &lw->post_ffn_norm, T, c->dim, c->norm_eps, c->norm_offset);
        return fw->proj;
    }
    if (be->norm_gate_up) {
        be->norm_gate_up(be, &n, fw->act, lw, T, config_activation(c), c->act_limit);
    } else {
        forward_run_add_norm(fw, &n, T);
        be->gate_up(be, fw->act, fw->xn, lw, 0, T, config_activation(c), c->act_limit);
    }
    return forward_out_proj(fw, fw->act, &lw->w_down, &lw->b_down, &lw->post_ffn_norm, may_add, T);
}

/* The ops of one step over T rows, n_logits of them to the LM head. */
static void forward_ops(Forward *fw, int T, int n_logits) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const ModelWeights *w = be->weights;
    if (!fw->from_prev) be->embed(be, fw->x, &w->tok_embd, T, c->embed_scale);
    if (fw->from_prev && be->broadcast) { /* a tensor-parallel stage's input reached its rank 0 only */
        be->broadcast(be, fw->x, (int64_t)T * c->dim, BUF_F32);
        be->broadcast(be, fw->proj, (int64_t)T * c->dim, BUF_ACT);
    }
    const void *pending = fw->from_prev ? fw->proj : NULL;
    for (int l = 0; l < c->n_layers; l++) {
        pending = forward_attention_block(fw, l, T, pending);
        pending = forward_mlp_block(fw, l, T, pending, !(fw->to_next && l == c->n_layers - 1));
    }
    if (n_logits == 0 || fw->to_next) return;
    be->add_rmsnorm(be, fw->x, pending, fw->xn, &w->output_norm, T, c->dim, c->norm_eps, c->norm_offset);
    be->gather_rows(be, fw->last, fw->xn, n_logits, c->dim);
    if (!fw->logits_part) {
        be->logits(be, fw->logits, fw->last, &w->output, n_logits, c->final_softcap);
        return;
    }
    be->logits(be, fw->logits_part, fw->last, &w->output, n_logits, c->final_softcap);
    be->all_gather(be, fw->logits, fw->logits_part, n_logits, (int)w->output.rows);
}

int forward_launch(Forward *fw, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                   Err *err) {
    return forward_launch_fed(fw, ids, b, logit_rows, n_logits, NULL, err);
}

int forward_launch_fed(Forward *fw, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                       const StepFeed *feed, Err *err) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    int T = b->n_tokens;
    if (T <= 0 || T > fw->max_tokens || n_logits < 0 || n_logits > T || n_logits > fw->max_logits)
        return err_set(err, "forward: %d tokens / %d logit rows exceed the capacity of %d tokens / %d logit rows", T,
                       n_logits, fw->max_tokens, fw->max_logits);
    for (int i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab) return err_set(err, "forward: token id %d is outside the vocabulary (%d)", ids[i], c->vocab);
    for (int i = 0; i < n_logits; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= T) return err_set(err, "forward: logit row %d out of range", logit_rows[i]);
    StepRows rows;
    if (be->begin_step(be, ids, b, logit_rows, n_logits, &rows, err)) return -1;
    if (feed && feed->n > 0) {
        if (!be->feed_tokens) return err_set(err, "forward: %s cannot feed drawn tokens to a step", be->name);
        if (be->feed_tokens(be, feed->rows, feed->src, feed->n, err)) return -1;
    }
    if (!be->graph_replay(be)) {
        be->graph_capture(be, true);
        forward_ops(fw, rows.T, rows.n_logits);
        be->graph_capture(be, false);
    }
    return 0;
}

int forward_wait(Forward *fw, int n_logits, float *logits_out, Err *err) {
    Backend *be = fw->be;
    return be->read(be, logits_out, fw->logits, logits_out ? (int64_t)n_logits * fw->cfg->vocab : 0, err);
}

int forward_run(Forward *fw, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                float *logits_out, Err *err) {
    if (forward_launch(fw, ids, b, logit_rows, n_logits, err)) return -1;
    return forward_wait(fw, n_logits, logits_out, err);
}
