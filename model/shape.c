/* shape.c — a model's ModelShape from its config (see shape.h). */
#include "model/shape.h"

#include <stdlib.h>
#include <string.h>

Activation config_activation(const ModelConfig *c) {
    static const Activation of[] = {
        [ACT_KIND_SILU] = ACT_SILU, [ACT_KIND_GELU_TANH] = ACT_GELU_TANH, [ACT_KIND_SWIGLU_OAI] = ACT_SWIGLU_OAI,
    };
    return of[c->act];
}

int model_shape_build(ModelShape *s, const ModelConfig *c, const WeightRef *rope_freqs, Err *err) {
    memset(s, 0, sizeof *s);
    int half = c->rope_dim / 2, layers = c->n_layers > 0 ? c->n_layers : 1;
    float *inv_freq = malloc((size_t)layers * (half > 0 ? half : 1) * sizeof(float));
    float *mscale = malloc((size_t)layers * sizeof(float));
    if (!inv_freq || !mscale) {
        free(inv_freq);
        free(mscale);
        return err_set(err, "out of memory");
    }
    for (int l = 0; l < c->n_layers; l++)
        config_rope_freqs(c, l, rope_freqs ? rope_freqs->data : NULL, inv_freq + (size_t)l * half, &mscale[l]);
    *s = (ModelShape){
        .n_layers = c->n_layers, .dim = c->dim, .ffn_dim = c->ffn_dim, .vocab = c->vocab,
        .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim_k = c->head_dim_k, .head_dim_v = c->head_dim_v,
        .n_experts = c->n_experts, .n_experts_used = c->n_experts_used,
        .norm_eps = c->norm_eps, .norm_offset = c->norm_offset,
        .rope_dim = c->rope_dim, .rope_neox = c->rope_neox, .rope_inv_freq = inv_freq, .rope_mscale = mscale,
        .attn_scale = c->attn_scale, .attn_softcap = c->attn_softcap,
        .act = config_activation(c), .act_limit = c->act_limit,
    };
    return 0;
}

void model_shape_free(ModelShape *s) {
    free((void *)s->rope_inv_freq);
    free((void *)s->rope_mscale);
    memset(s, 0, sizeof *s);
}
