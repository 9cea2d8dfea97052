/* kv_scales.c — a checkpoint's static FP8 KV-cache scales, bound per layer
 * (loader_internal.h kv_bind_scales).
 *
 * The names are those vLLM loads (weight_utils.py maybe_remap_kv_scale_name)
 * beside the layer's attention, "<p>" being the k_proj weight's name minus
 * "k_proj.weight" ("model.layers.N.self_attn."):
 *   <p>k_scale, <p>v_scale                  llm-compressor, vLLM FP8 (current)
 *   <p>k_proj.k_scale, <p>v_proj.v_scale    NVIDIA ModelOpt
 *   <p>k_proj.output_scale, ...v_proj...    compressed-tensors' older form
 *   <p>kv_scale                             AutoFP8's deprecated one for both
 * Each holds one value (per tensor) or one per KV head (kv_cache_scheme
 * strategy attn_head: shape [KV], [KV, 1] or [KV, 1, 1]); F32, BF16 or F16.
 * dequantized = code x scale, as for weights. A scale that is zero,
 * negative, NaN or infinite, of another shape, a K without its V, or scales
 * on some layers only, is a load error naming the tensor: any of them would
 * silently give a cache of zeros, NaNs or saturated values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/loader_internal.h"

#define KV_NAME_FORMS 4
static const char *const K_NAMES[KV_NAME_FORMS] = {"k_scale", "k_proj.k_scale", "k_proj.output_scale", "kv_scale"};
static const char *const V_NAMES[KV_NAME_FORMS] = {"v_scale", "v_proj.v_scale", "v_proj.output_scale", "kv_scale"};

/* Layer l's attention prefix, from its k_proj's name where it has one. */
static void attn_prefix(const Model *m, int l, char *out, size_t cap) {
    const char *wk = m->w.layers[l].wk.name, *tail = "k_proj.weight";
    size_t n = wk ? strlen(wk) : 0, t = strlen(tail);
    if (n > t && !strcmp(wk + n - t, tail)) snprintf(out, cap, "%.*s", (int)(n - t), wk);
    else snprintf(out, cap, "model.layers.%d.self_attn.", l);
}

/* The first of the name forms the file holds (its full name in name), or NULL. */
static const TensorInfo *find_form(const Model *m, const char *prefix, const char *const *forms, char *name,
                                   size_t cap) {
    for (int i = 0; i < KV_NAME_FORMS; i++) {
        snprintf(name, cap, "%s%s", prefix, forms[i]);
        const TensorInfo *t = model_find(m, name);
        if (t) return t;
    }
    snprintf(name, cap, "%s%s", prefix, forms[0]); /* the canonical name, for messages */
    return NULL;
}

/* KV fp32 scales of t into out (one value repeated, or one per head). */
static int bind_one(Model *m, const TensorInfo *t, float *out, Err *err) {
    int kv = m->cfg.n_kv_heads, at = -1;
    uint64_t n = tensor_nelems(t);
    for (int d = 0; d < TENSOR_MAX_DIMS; d++)
        if (t->ne[d] != 1) at = at < 0 ? d : TENSOR_MAX_DIMS; /* the one dimension that is not 1 */
    bool per_head = n == (uint64_t)kv && at < TENSOR_MAX_DIMS;
    if (n != 1 && !per_head)
        return err_set(err, "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu] (innermost first): a KV cache scale "
                       "is one value (per tensor) or %d (one per KV head)", m->path, t->name,
                       (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                       (unsigned long long)t->ne[3], kv);
    if (fp8_check_scale_values(m, t, err)) return -1;
    for (int h = 0; h < kv; h++) out[h] = fp8_scale_at(t, n == 1 ? 0 : (uint64_t)h);
    model_mark_used(m, t);
    return 0;
}

int kv_bind_scales(Model *m, Err *err) {
    if (m->dummy || m->is_gguf) return 0;
    char prefix[400], kname[512], vname[512], first[512] = "", missing[512] = "";
    int with = 0, missing_at = -1;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        LayerWeights *lw = &m->w.layers[l];
        attn_prefix(m, l, prefix, sizeof prefix);
        const TensorInfo *k = find_form(m, prefix, K_NAMES, kname, sizeof kname);
        const TensorInfo *v = find_form(m, prefix, V_NAMES, vname, sizeof vname);
        if (!k != !v)
            return err_set(err, "%s: tensor '%s' is missing: '%s' is there, and a KV cache scale comes as a K and "
                           "V pair", m->path, k ? vname : kname, k ? kname : vname);
        if (!k) {
            if (missing_at < 0) missing_at = l, snprintf(missing, sizeof missing, "%s", kname);
            continue;
        }
        if (!with++) snprintf(first, sizeof first, "%s", kname);
        int KV = m->cfg.n_kv_heads;
        float *s = malloc(2 * (size_t)KV * sizeof *s);
        if (model_own(m, s, err) || bind_one(m, k, s, err) || bind_one(m, v, s + KV, err)) return -1;
        lw->kv_scales = (WeightRef){s, DT_F32, 1, 2 * KV, 1, 2 * (uint64_t)KV * sizeof *s, k->name, NULL, 0, 0};
    }
    if (with > 0 && missing_at >= 0)
        return err_set(err, "%s: tensor '%s' is missing: the checkpoint has KV cache scales ('%s'), so every layer "
                       "must (layer %d has none)", m->path, missing, first, missing_at);
    if (with == 0 && m->quant.kv_static && m->cfg.n_layers > 0)
        return err_set(err, "%s: tensor '%s' is missing: quantization_config (quant_method '%s') has a static "
                       "kv_cache_scheme", m->path, missing, m->quant.method);
    return 0;
}
