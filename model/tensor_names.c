/* tensor_names.c — which tensor of the file fills which weight role.
 *
 * GGUF uses llama.cpp's names (blk.N.attn_q.weight ...). Hugging Face uses
 * model.layers.N.self_attn.q_proj.weight ...; its "post_attention_layernorm"
 * is the MLP's input norm everywhere except Gemma, where it normalizes the
 * attention output and "pre_feedforward_layernorm" feeds the MLP. llama.cpp's
 * gpt-oss names the MLP input norm "post_attention_norm".
 */
#include "model/tensor_names.h"

#include <stddef.h>

#define L(field) offsetof(LayerWeights, field)

static const LayerTensorName GGUF_DENSE[] = {
    {L(attn_norm), "blk.%d.attn_norm.weight", SHAPE_VEC_C, 1},
    {L(wq), "blk.%d.attn_q.weight", SHAPE_Q, 1},
    {L(wk), "blk.%d.attn_k.weight", SHAPE_K, 1},
    {L(wv), "blk.%d.attn_v.weight", SHAPE_V, 1},
    {L(wo), "blk.%d.attn_output.weight", SHAPE_O, 1},
    {L(bq), "blk.%d.attn_q.bias", SHAPE_BQ, 0},
    {L(bk), "blk.%d.attn_k.bias", SHAPE_BK, 0},
    {L(bv), "blk.%d.attn_v.bias", SHAPE_BV, 0},
    {L(bo), "blk.%d.attn_output.bias", SHAPE_VEC_C, 0},
    {L(q_norm), "blk.%d.attn_q_norm.weight", SHAPE_VEC_D, 0},
    {L(k_norm), "blk.%d.attn_k_norm.weight", SHAPE_VEC_D, 0},
    {L(ffn_norm), "blk.%d.ffn_norm.weight", SHAPE_VEC_C, 1},
    {L(w_gate), "blk.%d.ffn_gate.weight", SHAPE_GATE, 1},
    {L(w_up), "blk.%d.ffn_up.weight", SHAPE_GATE, 1},
    {L(w_down), "blk.%d.ffn_down.weight", SHAPE_DOWN, 1},
    {L(b_gate), "blk.%d.ffn_gate.bias", SHAPE_BGATE, 0},
    {L(b_up), "blk.%d.ffn_up.bias", SHAPE_BGATE, 0},
    {L(b_down), "blk.%d.ffn_down.bias", SHAPE_VEC_C, 0},
    {0, NULL, 0, 0},
};

static const LayerTensorName GGUF_GEMMA[] = {
    {L(attn_norm), "blk.%d.attn_norm.weight", SHAPE_VEC_C, 1},
    {L(wq), "blk.%d.attn_q.weight", SHAPE_Q, 1},
    {L(wk), "blk.%d.attn_k.weight", SHAPE_K, 1},
    {L(wv), "blk.%d.attn_v.weight", SHAPE_V, 1},
    {L(wo), "blk.%d.attn_output.weight", SHAPE_O, 1},
    {L(q_norm), "blk.%d.attn_q_norm.weight", SHAPE_VEC_D, 0},
    {L(k_norm), "blk.%d.attn_k_norm.weight", SHAPE_VEC_D, 0},
    {L(post_attn_norm), "blk.%d.post_attention_norm.weight", SHAPE_VEC_C, 1},
    {L(ffn_norm), "blk.%d.ffn_norm.weight", SHAPE_VEC_C, 1},
    {L(w_gate), "blk.%d.ffn_gate.weight", SHAPE_GATE, 1},
    {L(w_up), "blk.%d.ffn_up.weight", SHAPE_GATE, 1},
    {L(w_down), "blk.%d.ffn_down.weight", SHAPE_DOWN, 1},
    {L(post_ffn_norm), "blk.%d.post_ffw_norm.weight", SHAPE_VEC_C, 1},
    {0, NULL, 0, 0},
};

static const LayerTensorName GGUF_GPT_OSS[] = {
    {L(attn_norm), "blk.%d.attn_norm.weight", SHAPE_VEC_C, 1},
    {L(wq), "blk.%d.attn_q.weight", SHAPE_Q, 1},
    {L(wk), "blk.%d.attn_k.weight", SHAPE_K, 1},
    {L(wv), "blk.%d.attn_v.weight", SHAPE_V, 1},
    {L(wo), "blk.%d.attn_output.weight", SHAPE_O, 1},
    {L(bq), "blk.%d.attn_q.bias", SHAPE_BQ, 1},
    {L(bk), "blk.%d.attn_k.bias", SHAPE_BK, 1},
    {L(bv), "blk.%d.attn_v.bias", SHAPE_BV, 1},
    {L(bo), "blk.%d.attn_output.bias", SHAPE_VEC_C, 1},
    {L(sinks), "blk.%d.attn_sinks.weight", SHAPE_VEC_H, 1},
    {L(ffn_norm), "blk.%d.post_attention_norm.weight", SHAPE_VEC_C, 1},
    {L(router), "blk.%d.ffn_gate_inp.weight", SHAPE_ROUTER, 1},
    {L(router_bias), "blk.%d.ffn_gate_inp.bias", SHAPE_VEC_E, 1},
    {L(w_gate), "blk.%d.ffn_gate_exps.weight", SHAPE_GATE, 1},
    {L(w_up), "blk.%d.ffn_up_exps.weight", SHAPE_GATE, 1},
    {L(w_down), "blk.%d.ffn_down_exps.weight", SHAPE_DOWN, 1},
    {L(b_gate), "blk.%d.ffn_gate_exps.bias", SHAPE_BGATE, 1},
    {L(b_up), "blk.%d.ffn_up_exps.bias", SHAPE_BGATE, 1},
    {L(b_down), "blk.%d.ffn_down_exps.bias", SHAPE_VEC_C, 1},
    {0, NULL, 0, 0},
};

#define HF "model.layers.%d."
static const LayerTensorName HF_DENSE[] = {
    {L(attn_norm), HF "input_layernorm.weight", SHAPE_VEC_C, 1},
    {L(wq), HF "self_attn.q_proj.weight", SHAPE_Q, 1},
    {L(wk), HF "self_attn.k_proj.weight", SHAPE_K, 1},
    {L(wv), HF "self_attn.v_proj.weight", SHAPE_V, 1},
    {L(wo), HF "self_attn.o_proj.weight", SHAPE_O, 1},
    {L(bq), HF "self_attn.q_proj.bias", SHAPE_BQ, 0},
    {L(bk), HF "self_attn.k_proj.bias", SHAPE_BK, 0},
    {L(bv), HF "self_attn.v_proj.bias", SHAPE_BV, 0},
    {L(bo), HF "self_attn.o_proj.bias", SHAPE_VEC_C, 0},
    {L(q_norm), HF "self_attn.q_norm.weight", SHAPE_VEC_D, 0},
    {L(k_norm), HF "self_attn.k_norm.weight", SHAPE_VEC_D, 0},
    {L(ffn_norm), HF "post_attention_layernorm.weight", SHAPE_VEC_C, 1},
    {L(w_gate), HF "mlp.gate_proj.weight", SHAPE_GATE, 1},
    {L(w_up), HF "mlp.up_proj.weight", SHAPE_GATE, 1},
    {L(w_down), HF "mlp.down_proj.weight", SHAPE_DOWN, 1},
    {L(b_gate), HF "mlp.gate_proj.bias", SHAPE_BGATE, 0},
    {L(b_up), HF "mlp.up_proj.bias", SHAPE_BGATE, 0},
    {L(b_down), HF "mlp.down_proj.bias", SHAPE_VEC_C, 0},
    {0, NULL, 0, 0},
};

static const LayerTensorName HF_GEMMA[] = {
    {L(attn_norm), HF "input_layernorm.weight", SHAPE_VEC_C, 1},
    {L(wq), HF "self_attn.q_proj.weight", SHAPE_Q, 1},
    {L(wk), HF "self_attn.k_proj.weight", SHAPE_K, 1},
    {L(wv), HF "self_attn.v_proj.weight", SHAPE_V, 1},
    {L(wo), HF "self_attn.o_proj.weight", SHAPE_O, 1},
    {L(q_norm), HF "self_attn.q_norm.weight", SHAPE_VEC_D, 0},
    {L(k_norm), HF "self_attn.k_norm.weight", SHAPE_VEC_D, 0},
    {L(post_attn_norm), HF "post_attention_layernorm.weight", SHAPE_VEC_C, 1},
    {L(ffn_norm), HF "pre_feedforward_layernorm.weight", SHAPE_VEC_C, 1},
    {L(w_gate), HF "mlp.gate_proj.weight", SHAPE_GATE, 1},
    {L(w_up), HF "mlp.up_proj.weight", SHAPE_GATE, 1},
    {L(w_down), HF "mlp.down_proj.weight", SHAPE_DOWN, 1},
    {L(post_ffn_norm), HF "post_feedforward_layernorm.weight", SHAPE_VEC_C, 1},
    {0, NULL, 0, 0},
};

static const LayerTensorName HF_GPT_OSS[] = {
    {L(attn_norm), HF "input_layernorm.weight", SHAPE_VEC_C, 1},
    {L(wq), HF "self_attn.q_proj.weight", SHAPE_Q, 1},
    {L(wk), HF "self_attn.k_proj.weight", SHAPE_K, 1},
    {L(wv), HF "self_attn.v_proj.weight", SHAPE_V, 1},
    {L(wo), HF "self_attn.o_proj.weight", SHAPE_O, 1},
    {L(bq), HF "self_attn.q_proj.bias", SHAPE_BQ, 1},
    {L(bk), HF "self_attn.k_proj.bias", SHAPE_BK, 1},
    {L(bv), HF "self_attn.v_proj.bias", SHAPE_BV, 1},
    {L(bo), HF "self_attn.o_proj.bias", SHAPE_VEC_C, 1},
    {L(sinks), HF "self_attn.sinks", SHAPE_VEC_H, 1},
    {L(ffn_norm), HF "post_attention_layernorm.weight", SHAPE_VEC_C, 1},
    {L(router), HF "mlp.router.weight", SHAPE_ROUTER, 1},
    {L(router_bias), HF "mlp.router.bias", SHAPE_VEC_E, 1},
    {0, NULL, 0, 0},
};
#undef HF
#undef L

const LayerTensorName *tensor_names_layer(const ModelConfig *c) {
    bool gemma = c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3;
    if (c->source == SRC_GGUF)
        return gemma ? GGUF_GEMMA : c->arch == ARCH_GPT_OSS ? GGUF_GPT_OSS : GGUF_DENSE;
    return gemma ? HF_GEMMA : c->arch == ARCH_GPT_OSS ? HF_GPT_OSS : HF_DENSE;
}

GlobalTensorNames tensor_names_global(ModelSource src) {
    if (src == SRC_GGUF)
        return (GlobalTensorNames){"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"};
    return (GlobalTensorNames){"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", NULL};
}
