/* forward.c — the decoder of every supported architecture, one op per line.
 *
 *   x = embed(ids) * embed_scale
 *   per layer:
 *     xn = rmsnorm(x)                        attention block
 *     q, k, v = xn @ Wq, Wk, Wv (+ biases)
 *     q, k = rmsnorm per head (qk-norm)      Qwen3, Gemma 3
 *     q, k = rope(q, k)                      layer's base and scaling
 *     cache[slot] = k, v
 *     att = attention(q, cache)              window, soft-cap, sinks per layer
 *     proj = att @ Wo (+ bias); rmsnorm      post-norm: Gemma
 *     x += proj
 *     xn = rmsnorm(x)                        MLP block
 *     proj = down(act(gate(xn)) * up(xn))    or the MoE of gpt-oss
 *     proj = rmsnorm(proj)                   post-norm: Gemma
 *     x += proj
 *   logits = rmsnorm(x[rows]) @ Wout; soft-cap  final-logit cap: Gemma 2
 *
 * The config says which optional steps run; nothing here names an
 * architecture.
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

static const Activation ACT_OF[] = {
    [ACT_KIND_SILU] = ACT_SILU, [ACT_KIND_GELU_TANH] = ACT_GELU_TANH, [ACT_KIND_SWIGLU_OAI] = ACT_SWIGLU_OAI,
};

int forward_init(Forward *fw, const ModelConfig *c, Backend *be, int max_tokens, Err *err) {
    memset(fw, 0, sizeof *fw);
    fw->cfg = c;
    fw->be = be;
    fw->max_tokens = max_tokens;
    int half = c->rope_dim / 2;
    fw->inv_freq = malloc((size_t)c->n_layers * (half > 0 ? half : 1) * sizeof(float));
    fw->mscale = malloc(c->n_layers * sizeof(float));
    if (!fw->inv_freq || !fw->mscale) { forward_free(fw); return err_set(err, "out of memory"); }
    const float *factors = be->weights->rope_freqs.data;
    for (int l = 0; l < c->n_layers; l++)
        config_rope_freqs(c, l, factors, fw->inv_freq + (size_t)l * half, &fw->mscale[l]);
    int64_t T = max_tokens, q = (int64_t)c->n_heads * c->head_dim_k, kv = (int64_t)c->n_kv_heads * c->head_dim_k;
    int64_t vv = (int64_t)c->n_kv_heads * c->head_dim_v, att = (int64_t)c->n_heads * c->head_dim_v;
    fw->x = be->alloc(be, T * c->dim);
    fw->xn = be->alloc(be, T * c->dim);
    fw->q = be->alloc(be, T * q);
    fw->k = be->alloc(be, T * kv);
    fw->v = be->alloc(be, T * vv);
    fw->att = be->alloc(be, T * att);
    fw->proj = be->alloc(be, T * c->dim);
    fw->gate = be->alloc(be, T * c->ffn_dim);
    fw->up = be->alloc(be, T * c->ffn_dim);
    fw->last = be->alloc(be, T * c->dim);
    fw->logits = be->alloc(be, T * c->vocab);
    if (!fw->x || !fw->xn || !fw->q || !fw->k || !fw->v || !fw->att || !fw->proj || !fw->gate || !fw->up ||
        !fw->last || !fw->logits) {
        forward_free(fw);
        return err_set(err, "%s: cannot allocate activations for %d tokens", be->name, max_tokens);
    }
    return 0;
}

void forward_free(Forward *fw) {
    Backend *be = fw->be;
    void *bufs[] = {fw->x, fw->xn, fw->q, fw->k, fw->v, fw->att, fw->proj, fw->gate, fw->up, fw->last, fw->logits};
    for (size_t i = 0; be && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->release(be, bufs[i]);
    free(fw->inv_freq);
    free(fw->mscale);
    memset(fw, 0, sizeof *fw);
}

static void forward_attention_block(Forward *fw, int l, const AttnBatch *b) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const LayerWeights *lw = &be->weights->layers[l];
    int T = b->n_tokens, half = c->rope_dim / 2;
    be->rmsnorm(be, fw->xn, fw->x, &lw->attn_norm, T, c->dim, c->norm_eps, c->norm_offset);
    be->matmul(be, fw->q, fw->xn, &lw->wq, 0, &lw->bq, T);
    be->matmul(be, fw->k, fw->xn, &lw->wk, 0, &lw->bk, T);
    be->matmul(be, fw->v, fw->xn, &lw->wv, 0, &lw->bv, T);
    if (lw->q_norm.data) be->rmsnorm(be, fw->q, fw->q, &lw->q_norm, T * c->n_heads, c->head_dim_k, c->norm_eps, c->norm_offset);
    if (lw->k_norm.data) be->rmsnorm(be, fw->k, fw->k, &lw->k_norm, T * c->n_kv_heads, c->head_dim_k, c->norm_eps, c->norm_offset);
    const float *inv_freq = fw->inv_freq + (size_t)l * half;
    be->rope(be, fw->q, b->pos, T, c->n_heads, c->head_dim_k, c->rope_dim, inv_freq, fw->mscale[l], c->rope_neox);
    be->rope(be, fw->k, b->pos, T, c->n_kv_heads, c->head_dim_k, c->rope_dim, inv_freq, fw->mscale[l], c->rope_neox);
    be->kv_write(be, l, b, fw->k, fw->v);
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap,
                    c->layer_window[l], lw->sinks.data};
    be->attention(be, fw->att, fw->q, l, b, &p);
    be->matmul(be, fw->proj, fw->att, &lw->wo, 0, &lw->bo, T);
    if (lw->post_attn_norm.data)
        be->rmsnorm(be, fw->proj, fw->proj, &lw->post_attn_norm, T, c->dim, c->norm_eps, c->norm_offset);
    be->add(be, fw->x, fw->proj, (int64_t)T * c->dim);
}

static void forward_mlp_block(Forward *fw, int l, int T) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const LayerWeights *lw = &be->weights->layers[l];
    be->rmsnorm(be, fw->xn, fw->x, &lw->ffn_norm, T, c->dim, c->norm_eps, c->norm_offset);
    if (c->n_experts > 0) {
        be->moe(be, fw->proj, fw->xn, lw, c, T);
    } else {
        be->matmul(be, fw->gate, fw->xn, &lw->w_gate, 0, &lw->b_gate, T);
        be->matmul(be, fw->up, fw->xn, &lw->w_up, 0, &lw->b_up, T);
        be->glu(be, fw->gate, fw->gate, fw->up, (int64_t)T * c->ffn_dim, ACT_OF[c->act], c->act_limit);
        be->matmul(be, fw->proj, fw->gate, &lw->w_down, 0, &lw->b_down, T);
    }
    if (lw->post_ffn_norm.data)
        be->rmsnorm(be, fw->proj, fw->proj, &lw->post_ffn_norm, T, c->dim, c->norm_eps, c->norm_offset);
    be->add(be, fw->x, fw->proj, (int64_t)T * c->dim);
}

int forward_run(Forward *fw, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                float *logits_out, Err *err) {
    const ModelConfig *c = fw->cfg;
    Backend *be = fw->be;
    const ModelWeights *w = be->weights;
    int T = b->n_tokens;
    if (T <= 0 || T > fw->max_tokens || n_logits < 0 || n_logits > T)
        return err_set(err, "forward: %d tokens / %d logit rows exceed the capacity of %d tokens", T, n_logits,
                       fw->max_tokens);
    for (int i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab) return err_set(err, "forward: token id %d is outside the vocabulary (%d)", ids[i], c->vocab);
    for (int i = 0; i < n_logits; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= T) return err_set(err, "forward: logit row %d out of range", logit_rows[i]);
    if (be->begin_step(be, ids, b, err)) return -1;

    be->embed(be, fw->x, &w->tok_embd, ids, T, c->embed_scale);
    for (int l = 0; l < c->n_layers; l++) {
        forward_attention_block(fw, l, b);
        forward_mlp_block(fw, l, T);
    }
    if (n_logits == 0) return 0;
    be->gather_rows(be, fw->last, fw->x, logit_rows, n_logits, c->dim);
    be->rmsnorm(be, fw->last, fw->last, &w->output_norm, n_logits, c->dim, c->norm_eps, c->norm_offset);
    be->matmul(be, fw->logits, fw->last, &w->output, 0, NULL, n_logits);
    if (c->final_softcap > 0) be->softcap(be, fw->logits, (int64_t)n_logits * c->vocab, c->final_softcap);
    return be->read(be, logits_out, fw->logits, (int64_t)n_logits * c->vocab, err);
}
