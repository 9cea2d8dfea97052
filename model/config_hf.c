/* config_hf.c — fills ModelConfig from a Hugging Face config.json, the
 * way transformers reads it for the architecture.
 *
 * config.json is read in both the classic form (rope_theta, rope_scaling)
 * and transformers 5's (rope_parameters, possibly per layer type). A field
 * of the wrong type is an error naming it, never read as absent; null is
 * transformers' None (the default). Fields that change the math are
 * implemented as transformers does or refused: rope types default, linear,
 * llama3 and yarn (not dynamic, longrope, ...), yarn's mscale /
 * mscale_all_dim, Qwen's max_window_layers, gpt-oss's swiglu_alpha (only its
 * 1.702) and swiglu_limit, the activation (hidden_act, Gemma's
 * hidden_activation).
 */
#include "model/config_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The file, and the first error: readers go on after it and fail once. */
typedef struct {
    const char *src;
    Err *err;
    bool failed;
} HfRead;

static void key_name(char *buf, size_t cap, const char *path, const char *key) {
    snprintf(buf, cap, "%s%s%s", path, *path ? "." : "", key);
}

static void value_text(const JsonValue *v, char *buf, size_t cap) {
    if (!v) {
        snprintf(buf, cap, "(missing)");
        return;
    }
    switch (v->type) {
    case JSON_NULL: snprintf(buf, cap, "null"); break;
    case JSON_BOOL: snprintf(buf, cap, "%s", v->u.boolean ? "true" : "false"); break;
    case JSON_NUMBER:
        if (v->u.number.is_int) snprintf(buf, cap, "%lld", (long long)v->u.number.i);
        else snprintf(buf, cap, "%.9g", v->u.number.num);
        break;
    case JSON_STRING: snprintf(buf, cap, "'%.40s'", v->u.string.s); break;
    case JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    }
}

/* "<src>: <path.key> = <value> (<why>)"; only the first error is kept. */
static void hf_fail(HfRead *h, const char *path, const char *key, const JsonValue *v, const char *why) {
    if (h->failed) return;
    char name[160], val[64];
    key_name(name, sizeof name, path, key);
    value_text(v, val, sizeof val);
    err_set(h->err, "%s: %s = %s (%s)", h->src, name, val, why);
    h->failed = true;
}

/* A member, NULL when absent or null. */
static const JsonValue *member(const JsonValue *o, const char *key) {
    const JsonValue *v = json_get(o, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static double hf_num(HfRead *h, const JsonValue *o, const char *path, const char *key, double def) {
    const JsonValue *v = member(o, key);
    if (!v) return def;
    if (v->type == JSON_NUMBER) return v->u.number.num;
    hf_fail(h, path, key, v, "must be a number");
    return def;
}

static int hf_int(HfRead *h, const JsonValue *o, const char *path, const char *key, int def) {
    const JsonValue *v = member(o, key);
    if (!v) return def;
    double x = v->type == JSON_NUMBER ? v->u.number.num : NAN;
    if (x == floor(x) && x >= INT32_MIN && x <= INT32_MAX) return (int)x;
    hf_fail(h, path, key, v, "must be an integer in the int32 range");
    return def;
}

static bool hf_bool(HfRead *h, const JsonValue *o, const char *path, const char *key, bool def) {
    const JsonValue *v = member(o, key);
    if (!v) return def;
    if (v->type == JSON_BOOL) return v->u.boolean;
    hf_fail(h, path, key, v, "must be true or false");
    return def;
}

static const char *hf_str(HfRead *h, const JsonValue *o, const char *path, const char *key, const char *def) {
    const JsonValue *v = member(o, key);
    if (!v) return def;
    if (v->type == JSON_STRING) return v->u.string.s;
    hf_fail(h, path, key, v, "must be a string");
    return def;
}

/* A member that must be an object when present; NULL when absent or null. */
static const JsonValue *hf_obj(HfRead *h, const JsonValue *o, const char *path, const char *key) {
    const JsonValue *v = member(o, key);
    if (!v || v->type == JSON_OBJECT) return v;
    hf_fail(h, path, key, v, "must be an object");
    return NULL;
}

static int arch_from_hf(const char *model_type, Arch *out) {
    static const struct { const char *name; Arch a; } map[] = {
        {"llama", ARCH_LLAMA}, {"mistral", ARCH_MISTRAL}, {"qwen2", ARCH_QWEN2}, {"qwen3", ARCH_QWEN3},
        {"gemma2", ARCH_GEMMA2}, {"gemma3_text", ARCH_GEMMA3}, {"gemma3", ARCH_GEMMA3}, {"gpt_oss", ARCH_GPT_OSS},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, model_type)) { *out = map[i].a; return 0; }
    return -1;
}

/* ---------- rope ---------- */

/* transformers' yarn get_mscale. */
static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

static void read_yarn(HfRead *h, const JsonValue *r, const char *path, RopeScalingParams *s) {
    s->type = ROPE_SCALING_YARN;
    /* transformers: `get("beta_fast") or 32`, so 0 is the default too */
    s->beta_fast = (float)hf_num(h, r, path, "beta_fast", 0);
    s->beta_slow = (float)hf_num(h, r, path, "beta_slow", 0);
    if (s->beta_fast == 0) s->beta_fast = 32;
    if (s->beta_slow == 0) s->beta_slow = 1;
    if (!(s->beta_fast > 0)) hf_fail(h, path, "beta_fast", json_get(r, "beta_fast"), "must be positive");
    if (!(s->beta_slow > 0)) hf_fail(h, path, "beta_slow", json_get(r, "beta_slow"), "must be positive");
    s->truncate = hf_bool(h, r, path, "truncate", true);
    if (member(r, "attention_factor")) {
        s->attn_factor = (float)hf_num(h, r, path, "attention_factor", 0);
        if (!(s->attn_factor > 0))
            hf_fail(h, path, "attention_factor", json_get(r, "attention_factor"), "must be positive");
        return;
    }
    /* DeepSeek-style: the attention factor is a ratio of two mscales when both are set. */
    double m = hf_num(h, r, path, "mscale", 0), m_all = hf_num(h, r, path, "mscale_all_dim", 0);
    if (m != 0 && m_all != 0) s->attn_factor = (float)(yarn_mscale(s->factor, m) / yarn_mscale(s->factor, m_all));
}

/* One rope description: classic rope_scaling {rope_type|type, factor, ...}
 * and transformers 5's rope_parameters share these field names. theta_key
 * records where rope_theta came from, for messages. */
static void read_rope(HfRead *h, const JsonValue *r, const char *path, float *theta, char *theta_key,
                      RopeScalingParams *s, int ctx_len) {
    if (!r) return;
    if (member(r, "rope_theta")) {
        *theta = (float)hf_num(h, r, path, "rope_theta", *theta);
        key_name(theta_key, 160, path, "rope_theta");
    }
    const char *key = member(r, "rope_type") ? "rope_type" : "type";
    const char *type = hf_str(h, r, path, key, "default");
    if (!strcmp(type, "default")) return;
    if (strcmp(type, "linear") && strcmp(type, "llama3") && strcmp(type, "yarn")) {
        hf_fail(h, path, key, json_get(r, key), "not supported; cllm implements default, linear, llama3 and yarn");
        return;
    }
    const JsonValue *f = member(r, "factor");
    s->factor = (float)hf_num(h, r, path, "factor", 0);
    if (!f && !h->failed) {
        err_set(h->err, "%s: %s.factor is missing (rope type '%s' needs it)", h->src, path, type);
        h->failed = true;
    } else if (f && !(s->factor > 0 && isfinite(s->factor))) {
        hf_fail(h, path, "factor", f, "must be a positive number");
    }
    s->original_ctx = hf_int(h, r, path, "original_max_position_embeddings", ctx_len);
    if (s->original_ctx <= 0)
        hf_fail(h, path, "original_max_position_embeddings", json_get(r, "original_max_position_embeddings"),
                "must be positive");
    if (!strcmp(type, "linear")) s->type = ROPE_SCALING_LINEAR;
    if (!strcmp(type, "yarn")) read_yarn(h, r, path, s);
    if (!strcmp(type, "llama3")) {
        s->type = ROPE_SCALING_LLAMA3;
        s->low_freq_factor = (float)hf_num(h, r, path, "low_freq_factor", 1.0);
        s->high_freq_factor = (float)hf_num(h, r, path, "high_freq_factor", 4.0);
        if (!(s->low_freq_factor > 0 && s->high_freq_factor > s->low_freq_factor) && !h->failed) {
            err_set(h->err, "%s: %s.low_freq_factor = %g, high_freq_factor = %g (must be 0 < low < high)", h->src, path,
                    s->low_freq_factor, s->high_freq_factor);
            h->failed = true;
        }
    }
}

static void set_rope(HfRead *h, ModelConfig *c, const JsonValue *j, const char *top, ConfigKeyNames *k) {
    char path[192];
    c->rope_theta = (float)hf_num(h, j, top, "rope_theta", 10000.0);
    key_name(path, sizeof path, top, "rope_scaling");
    read_rope(h, hf_obj(h, j, top, "rope_scaling"), path, &c->rope_theta, k->name[CK_THETA], &c->rope_scaling,
              c->ctx_len);
    c->rope_theta_local = (float)hf_num(h, j, top, "rope_local_base_freq", c->rope_theta);
    const JsonValue *rp = hf_obj(h, j, top, "rope_parameters");
    key_name(path, sizeof path, top, "rope_parameters");
    const JsonValue *full = hf_obj(h, rp, path, "full_attention");
    if (full) { /* per layer type */
        RopeScalingParams local = {0};
        char sub[224];
        key_name(sub, sizeof sub, path, "full_attention");
        read_rope(h, full, sub, &c->rope_theta, k->name[CK_THETA], &c->rope_scaling, c->ctx_len);
        key_name(sub, sizeof sub, path, "sliding_attention");
        read_rope(h, hf_obj(h, rp, path, "sliding_attention"), sub, &c->rope_theta_local, k->name[CK_THETA_LOCAL],
                  &local, c->ctx_len);
        c->rope_scaling_local = local.type != ROPE_SCALING_NONE;
        if (c->rope_scaling_local) c->rope_scaling = local; /* one scaling for all layers then */
    } else if (rp) {
        read_rope(h, rp, path, &c->rope_theta, k->name[CK_THETA], &c->rope_scaling, c->ctx_len);
        c->rope_theta_local = c->arch == ARCH_GEMMA3 ? c->rope_theta_local : c->rope_theta;
    }
}

/* ---------- windows ---------- */

static void set_windows(HfRead *h, ModelConfig *c, const JsonValue *j, const char *top) {
    if (c->n_layers < 0 || c->n_layers > CONFIG_MAX_LAYERS) return; /* config_check reports it */
    int window = hf_int(h, j, top, "sliding_window", 0);
    if (c->arch == ARCH_LLAMA) window = 0;
    bool qwen = c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3;
    int full_layers = 0;
    if (qwen) {
        /* Qwen: a window only with use_sliding_window (absent: transformers'
         * 4096), on the layers from max_window_layers (default 28) on. */
        if (!hf_bool(h, j, top, "use_sliding_window", false)) window = 0;
        else if (!json_get(j, "sliding_window")) window = 4096;
        full_layers = hf_int(h, j, top, "max_window_layers", 28);
    }
    if (window < 0) hf_fail(h, top, "sliding_window", json_get(j, "sliding_window"), "must not be negative");
    const JsonValue *types = member(j, "layer_types");
    char name[192];
    key_name(name, sizeof name, top, "layer_types");
    if (types && (types->type != JSON_ARRAY || json_len(types) != (size_t)c->n_layers)) {
        if (!h->failed) err_set(h->err, "%s: field '%s' must be an array of %d strings", h->src, name, c->n_layers);
        h->failed = true;
        return;
    }
    int pattern = hf_int(h, j, top, "sliding_window_pattern", 0);
    for (int l = 0; l < c->n_layers; l++) {
        bool windowed = qwen ? l >= full_layers : config_layer_is_windowed(c->arch, l);
        if (types) {
            const JsonValue *t = json_at(types, l);
            if (t->type != JSON_STRING) {
                if (!h->failed) err_set(h->err, "%s: field '%s[%d]' must be a string", h->src, name, l);
                h->failed = true;
                return;
            }
            windowed = !strcmp(t->u.string.s, "sliding_attention");
        } else if (pattern > 0) {
            windowed = (l + 1) % pattern != 0;
        }
        c->layer_window[l] = windowed ? window : 0;
    }
}

/* ---------- fields that change the math ---------- */

static void check_math(HfRead *h, ModelConfig *c, const JsonValue *j, const char *top) {
    bool gemma = c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3;
    if (gemma) { /* Gemma's MLP reads hidden_activation */
        const char *act = hf_str(h, j, top, "hidden_activation", "gelu_pytorch_tanh");
        if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_new"))
            hf_fail(h, top, "hidden_activation", json_get(j, "hidden_activation"),
                    "not supported; cllm implements the tanh GELU, gelu_pytorch_tanh");
        if (hf_bool(h, j, top, "attention_bias", false))
            hf_fail(h, top, "attention_bias", json_get(j, "attention_bias"), "not supported for Gemma");
    } else if (c->arch != ARCH_GPT_OSS) { /* gpt-oss's experts ignore hidden_act */
        const char *act = hf_str(h, j, top, "hidden_act", "silu");
        if (strcmp(act, "silu") && strcmp(act, "swish"))
            hf_fail(h, top, "hidden_act", json_get(j, "hidden_act"), "not supported; cllm implements silu here");
    }
    if (c->arch == ARCH_GPT_OSS) {
        double alpha = hf_num(h, j, top, "swiglu_alpha", CONFIG_SWIGLU_OAI_ALPHA);
        if (fabs(alpha - CONFIG_SWIGLU_OAI_ALPHA) > 1e-6)
            hf_fail(h, top, "swiglu_alpha", json_get(j, "swiglu_alpha"), "not supported; cllm implements 1.702");
        c->act_limit = (float)hf_num(h, j, top, "swiglu_limit", 7.0);
        if (!(c->act_limit > 0 && isfinite(c->act_limit)))
            hf_fail(h, top, "swiglu_limit", json_get(j, "swiglu_limit"), "must be a positive number");
    }
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_MISTRAL || c->arch == ARCH_QWEN3) {
        c->qkv_bias = c->o_bias = hf_bool(h, j, top, "attention_bias", false);
        if (c->arch != ARCH_QWEN3) c->mlp_bias = hf_bool(h, j, top, "mlp_bias", false);
    }
    double qpas = hf_num(h, j, top, "query_pre_attn_scalar", c->head_dim_k);
    if (!(qpas > 0) && member(j, "query_pre_attn_scalar"))
        hf_fail(h, top, "query_pre_attn_scalar", json_get(j, "query_pre_attn_scalar"), "must be positive");
    c->attn_scale = qpas > 0 ? (float)(1.0 / sqrt(qpas)) : 1.0f;
    double prf = hf_num(h, j, top, "partial_rotary_factor", 1.0);
    if (!(prf > 0 && prf <= 1))
        hf_fail(h, top, "partial_rotary_factor", json_get(j, "partial_rotary_factor"), "must be in (0, 1]");
    c->rope_dim = prf > 0 && prf <= 1 ? (int)(c->head_dim_k * prf) : c->head_dim_k;
}

static void key_names(ConfigKeyNames *k, const char *top, const JsonValue *j) {
    static const char *const names[CK_COUNT] = {
        [CK_LAYERS] = "num_hidden_layers", [CK_DIM] = "hidden_size", [CK_FFN] = "intermediate_size",
        [CK_HEADS] = "num_attention_heads", [CK_KV_HEADS] = "num_key_value_heads", [CK_HEAD_DIM_K] = "head_dim",
        [CK_HEAD_DIM_V] = "head_dim", [CK_ROPE_DIM] = "partial_rotary_factor", [CK_VOCAB] = "vocab_size",
        [CK_EPS] = "rms_norm_eps", [CK_THETA] = "rope_theta", [CK_THETA_LOCAL] = "rope_local_base_freq",
        [CK_EXPERTS] = "num_local_experts", [CK_EXPERTS_USED] = "num_experts_per_tok",
        [CK_ATTN_SOFTCAP] = "attn_logit_softcapping", [CK_FINAL_SOFTCAP] = "final_logit_softcapping",
    };
    for (int i = 0; i < CK_COUNT; i++) key_name(k->name[i], sizeof k->name[i], top, names[i]);
    if (!member(j, "head_dim")) {
        snprintf(k->name[CK_HEAD_DIM_K], sizeof k->name[CK_HEAD_DIM_K], "hidden_size / num_attention_heads");
        snprintf(k->name[CK_HEAD_DIM_V], sizeof k->name[CK_HEAD_DIM_V], "hidden_size / num_attention_heads");
    }
    if (!member(j, "num_local_experts") && member(j, "num_experts"))
        key_name(k->name[CK_EXPERTS], sizeof k->name[CK_EXPERTS], top, "num_experts");
}

int config_from_hf(ModelConfig *c, const JsonValue *j, const char *src, Err *err) {
    memset(c, 0, sizeof *c);
    c->source = SRC_HF;
    if (!j || j->type != JSON_OBJECT) return err_set(err, "%s: the top level must be a JSON object", src);
    const char *top = "";
    const JsonValue *text = json_get(j, "text_config"); /* multimodal wrappers (Gemma 3 4B+) */
    if (text && text->type == JSON_OBJECT) {
        j = text;
        top = "text_config";
    }
    HfRead h = {src, err, false};
    const char *mt = json_get_str(j, "model_type", NULL);
    if (!mt) return err_set(err, "%s: field 'model_type' is missing or not a string", src);
    if (arch_from_hf(mt, &c->arch))
        return err_set(err, "%s: model_type '%s' is not supported (supported: %s)", src, mt, config_supported_archs());
    ConfigKeyNames names;
    key_names(&names, top, j);
    c->n_layers = hf_int(&h, j, top, "num_hidden_layers", 0);
    c->dim = hf_int(&h, j, top, "hidden_size", 0);
    c->ffn_dim = hf_int(&h, j, top, "intermediate_size", 0);
    c->n_heads = hf_int(&h, j, top, "num_attention_heads", 0);
    c->n_kv_heads = hf_int(&h, j, top, "num_key_value_heads", c->n_heads);
    c->head_dim_k = c->head_dim_v = hf_int(&h, j, top, "head_dim", c->n_heads > 0 ? c->dim / c->n_heads : 0);
    c->vocab = hf_int(&h, j, top, "vocab_size", 0);
    c->ctx_len = hf_int(&h, j, top, "max_position_embeddings", 4096);
    c->norm_eps = (float)hf_num(&h, j, top, "rms_norm_eps", 1e-6);
    bool gemma = c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3;
    c->tied_embeddings = hf_bool(&h, j, top, "tie_word_embeddings", gemma);
    c->n_experts = hf_int(&h, j, top, "num_local_experts", hf_int(&h, j, top, "num_experts", 0));
    c->n_experts_used = hf_int(&h, j, top, "num_experts_per_tok", 0);
    c->attn_softcap = (float)hf_num(&h, j, top, "attn_logit_softcapping", 0.0);
    c->final_softcap = (float)hf_num(&h, j, top, "final_logit_softcapping", 0.0);
    snprintf(c->name, sizeof c->name, "%s", json_get_str(j, "_name_or_path", ""));
    config_set_arch_defaults(c);
    c->norm_offset = gemma ? 1.0f : 0.0f;
    check_math(&h, c, j, top);
    set_rope(&h, c, j, top, &names);
    set_windows(&h, c, j, top);
    if (h.failed) return -1;
    return config_check(c, src, &names, err);
}
