/* config.c — fills ModelConfig from GGUF metadata or a Hugging Face
 * config.json.
 *
 * GGUF keys follow llama.cpp's converter: "<arch>.block_count",
 * "<arch>.attention.head_count", ... Facts the converter leaves implicit are
 * filled the way llama.cpp does for that architecture: Gemma 2 and gpt-oss
 * window every even layer, Gemma 3 every layer but each sixth; Gemma norm
 * weights already hold the +1; llama Q/K rows are permuted for interleaved
 * rope. config.json is read in both the classic form (rope_theta,
 * rope_scaling) and transformers 5's (rope_parameters, possibly per layer
 * type).
 */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const ARCH_NAMES[ARCH_COUNT] = {
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt-oss",
};

const char *arch_name(Arch a) { return (unsigned)a < ARCH_COUNT ? ARCH_NAMES[a] : "?"; }

const char *config_supported_archs(void) {
    return "llama (Llama 2/3.x, SmolLM2, TinyLlama), mistral, qwen2, qwen3, gemma2, gemma3, gpt-oss";
}

/* Architecture defaults that neither file states. */
static void config_set_arch_defaults(ModelConfig *c) {
    Arch a = c->arch;
    bool gemma = a == ARCH_GEMMA2 || a == ARCH_GEMMA3;
    c->act = gemma ? ACT_KIND_GELU_TANH : a == ARCH_GPT_OSS ? ACT_KIND_SWIGLU_OAI : ACT_KIND_SILU;
    c->act_limit = a == ARCH_GPT_OSS ? 7.0f : 0.0f;
    c->embed_scale = gemma ? sqrtf((float)c->dim) : 1.0f;
    c->post_norms = gemma;
    c->qk_norm = a == ARCH_QWEN3 || a == ARCH_GEMMA3;
    c->qkv_bias = a == ARCH_QWEN2 || a == ARCH_GPT_OSS;
    c->o_bias = a == ARCH_GPT_OSS;
    c->mlp_bias = a == ARCH_GPT_OSS;
    c->sinks = a == ARCH_GPT_OSS;
    c->rope_neox = true; /* HF layout; GGUF llama/mistral differ (config_from_gguf) */
    c->rope_scaling_local = a != ARCH_GEMMA3;
}

/* Which layers are windowed when a file gives only the window size. */
static bool arch_layer_is_windowed(Arch a, int layer) {
    switch (a) {
    case ARCH_GEMMA2: case ARCH_GPT_OSS: return layer % 2 == 0;
    case ARCH_GEMMA3: return layer % 6 != 5;
    default: return true; /* mistral-style: every layer */
    }
}

static int config_check(ModelConfig *c, const char *src, Err *err) {
#define NEED(cond, what) \
    if (!(cond)) return err_set(err, "%s: %s (got %s)", src, what, #cond)
    if (c->n_layers <= 0 || c->n_layers > CONFIG_MAX_LAYERS)
        return err_set(err, "%s: block count %d is out of range 1..%d", src, c->n_layers, CONFIG_MAX_LAYERS);
    NEED(c->dim > 0 && c->dim <= 1 << 20, "hidden size must be in 1..2^20");
    NEED(c->ffn_dim > 0 && c->ffn_dim <= 1 << 22, "feed-forward size must be in 1..2^22");
    NEED(c->n_heads > 0 && c->n_heads <= 1024, "head count must be in 1..1024");
    NEED(c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0, "KV head count must divide the head count");
    NEED(c->head_dim_k > 0 && c->head_dim_k <= 1024 && c->head_dim_v > 0 && c->head_dim_v <= 1024,
         "head size must be in 1..1024");
    NEED(c->rope_dim >= 0 && c->rope_dim <= c->head_dim_k && c->rope_dim % 2 == 0,
         "rope dimension must be even and at most the head size");
    NEED(c->vocab > 0 && c->vocab <= 1 << 24, "vocabulary size must be in 1..2^24");
    NEED(c->norm_eps > 0 && c->norm_eps < 1, "norm epsilon must be in (0, 1)");
    NEED(c->rope_theta > 0 && c->rope_theta_local > 0, "rope base must be positive");
    NEED(c->n_experts >= 0 && c->n_experts <= 4096 && c->n_experts_used >= 0 && c->n_experts_used <= c->n_experts,
         "expert counts must satisfy 0 <= used <= experts <= 4096");
    NEED(c->n_experts == 0 || c->n_experts_used > 0, "an MoE model must use at least one expert");
    NEED(c->attn_softcap >= 0 && c->final_softcap >= 0, "soft-caps must not be negative");
    if (c->ctx_len <= 0) c->ctx_len = 4096;
#undef NEED
    return 0;
}

/* ---------- GGUF ---------- */

typedef struct { const GGUFFile *f; const char *arch; } GKeys;

static int g_int(GKeys k, const char *suffix, int64_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", k.arch, suffix);
    return gguf_get_i64(k.f, key, out);
}

static int g_num(GKeys k, const char *suffix, double *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", k.arch, suffix);
    return gguf_get_f64(k.f, key, out);
}

static int g_int_req(GKeys k, const char *suffix, int *out, Err *err) {
    int64_t v;
    if (g_int(k, suffix, &v))
        return err_set(err, "%s: key '%s.%s' is missing or not an integer", k.f->path, k.arch, suffix);
    if (v < 0 || v > INT32_MAX)
        return err_set(err, "%s: key '%s.%s' = %lld is out of range", k.f->path, k.arch, suffix, (long long)v);
    *out = (int)v;
    return 0;
}

static int g_int_opt(GKeys k, const char *suffix, int def) {
    int64_t v;
    return g_int(k, suffix, &v) == 0 && v >= 0 && v <= INT32_MAX ? (int)v : def;
}

static float g_num_opt(GKeys k, const char *suffix, float def) {
    double v;
    return g_num(k, suffix, &v) == 0 && isfinite(v) ? (float)v : def;
}

static int arch_from_gguf_name(const char *s, size_t n, Arch *out) {
    static const struct { const char *name; Arch a; } map[] = {
        {"llama", ARCH_LLAMA}, {"mistral", ARCH_MISTRAL}, {"qwen2", ARCH_QWEN2}, {"qwen3", ARCH_QWEN3},
        {"gemma2", ARCH_GEMMA2}, {"gemma3", ARCH_GEMMA3}, {"gpt-oss", ARCH_GPT_OSS},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strlen(map[i].name) == n && !memcmp(map[i].name, s, n)) { *out = map[i].a; return 0; }
    return -1;
}

/* Per-layer windows: an array key "<arch>.attention.sliding_window_pattern"
 * (bools, true = windowed) when present, else the architecture's rule. */
static void gguf_set_windows(ModelConfig *c, GKeys k) {
    if (c->n_layers < 0 || c->n_layers > CONFIG_MAX_LAYERS) return; /* config_check reports it */
    int window = g_int_opt(k, "attention.sliding_window", 0);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", k.arch);
    const GGUFValue *pat = gguf_get_arr(k.f, key, GGUF_BOOL);
    for (int l = 0; l < c->n_layers; l++) {
        bool windowed = pat && pat->v.arr.n > 0 ? pat->v.arr.items[l % pat->v.arr.n].v.u != 0
                                                : arch_layer_is_windowed(c->arch, l);
        c->layer_window[l] = windowed ? window : 0;
    }
}

static void gguf_set_rope_scaling(ModelConfig *c, GKeys k) {
    char key[160];
    GGUFStr type = {0};
    RopeScalingParams *r = &c->rope_scaling;
    snprintf(key, sizeof key, "%s.rope.scaling.type", k.arch);
    if (gguf_get_str(k.f, key, &type)) return;
    float factor = g_num_opt(k, "rope.scaling.factor", 1.0f);
    r->factor = factor > 0 ? factor : 1.0f;
    r->original_ctx = g_int_opt(k, "rope.scaling.original_context_length", c->ctx_len);
    if (type.len == 6 && !memcmp(type.ptr, "linear", 6)) r->type = ROPE_SCALING_LINEAR;
    if (type.len == 4 && !memcmp(type.ptr, "yarn", 4)) {
        r->type = ROPE_SCALING_YARN;
        r->beta_fast = g_num_opt(k, "rope.scaling.yarn_beta_fast", 32.0f);
        r->beta_slow = g_num_opt(k, "rope.scaling.yarn_beta_slow", 1.0f);
        r->attn_factor = g_num_opt(k, "rope.scaling.attn_factor", 0.0f);
        /* gpt-oss (the only yarn model here) keeps the range unrounded, as its
         * reference implementation does; llama.cpp rounds it for others. */
        r->truncate = c->arch != ARCH_GPT_OSS;
    }
}

int config_from_gguf(ModelConfig *c, const GGUFFile *f, Err *err) {
    memset(c, 0, sizeof *c);
    c->source = SRC_GGUF;
    GGUFStr an;
    if (gguf_get_str(f, "general.architecture", &an))
        return err_set(err, "%s: key 'general.architecture' is missing or not a string", f->path);
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(an.len < 63 ? an.len : 63), an.ptr);
    if (arch_from_gguf_name(an.ptr, an.len, &c->arch))
        return err_set(err, "%s: architecture '%s' is not supported (supported: %s)", f->path, arch,
                       config_supported_archs());
    GKeys k = {f, arch};
    GGUFStr name;
    if (gguf_get_str(f, "general.name", &name) == 0)
        snprintf(c->name, sizeof c->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);
    if (g_int_req(k, "block_count", &c->n_layers, err) || g_int_req(k, "embedding_length", &c->dim, err) ||
        g_int_req(k, "attention.head_count", &c->n_heads, err))
        return -1;
    c->ffn_dim = g_int_opt(k, "feed_forward_length", 0);
    c->ffn_dim = g_int_opt(k, "expert_feed_forward_length", c->ffn_dim);
    c->n_kv_heads = g_int_opt(k, "attention.head_count_kv", c->n_heads);
    c->head_dim_k = g_int_opt(k, "attention.key_length", c->n_heads ? c->dim / c->n_heads : 0);
    c->head_dim_v = g_int_opt(k, "attention.value_length", c->head_dim_k);
    c->ctx_len = g_int_opt(k, "context_length", 4096);
    c->norm_eps = g_num_opt(k, "attention.layer_norm_rms_epsilon", 1e-5f);
    c->rope_theta = g_num_opt(k, "rope.freq_base", 10000.0f);
    c->rope_theta_local = g_num_opt(k, "rope.freq_base_swa", c->arch == ARCH_GEMMA3 ? 10000.0f : c->rope_theta);
    c->rope_dim = g_int_opt(k, "rope.dimension_count", c->head_dim_k);
    c->attn_softcap = g_num_opt(k, "attn_logit_softcapping", 0.0f);
    c->final_softcap = g_num_opt(k, "final_logit_softcapping", 0.0f);
    c->n_experts = g_int_opt(k, "expert_count", 0);
    c->n_experts_used = g_int_opt(k, "expert_used_count", 0);
    const GGUFTensor *emb = gguf_find_tensor(f, "token_embd.weight");
    c->vocab = g_int_opt(k, "vocab_size", emb ? (int)emb->ne[1] : 0);
    c->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    config_set_arch_defaults(c);
    c->rope_neox = c->arch != ARCH_LLAMA && c->arch != ARCH_MISTRAL; /* GGUF llama Q/K are permuted */
    /* Gemma 27B scales queries by 1/sqrt(dim/heads), as llama.cpp does. */
    float qscale = (c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3) && c->dim == 4608 && c->n_heads == 32
                       ? (float)c->dim / c->n_heads : (float)c->head_dim_k;
    c->attn_scale = g_num_opt(k, "attention.scale", 1.0f / sqrtf(qscale));
    gguf_set_windows(c, k);
    gguf_set_rope_scaling(c, k);
    return config_check(c, f->path, err);
}

/* ---------- Hugging Face config.json ---------- */

static int arch_from_hf(const char *model_type, Arch *out) {
    static const struct { const char *name; Arch a; } map[] = {
        {"llama", ARCH_LLAMA}, {"mistral", ARCH_MISTRAL}, {"qwen2", ARCH_QWEN2}, {"qwen3", ARCH_QWEN3},
        {"gemma2", ARCH_GEMMA2}, {"gemma3_text", ARCH_GEMMA3}, {"gemma3", ARCH_GEMMA3}, {"gpt_oss", ARCH_GPT_OSS},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, model_type)) { *out = map[i].a; return 0; }
    return -1;
}

static int hf_int(const JsonValue *j, const char *key, int def) {
    int64_t v = json_get_int(j, key, def);
    return v >= INT32_MIN && v <= INT32_MAX ? (int)v : def;
}

/* Reads one rope description: classic {rope_type|type, factor, ...} objects
 * and transformers 5 rope_parameters share these field names. */
static void hf_read_rope(const JsonValue *r, float *theta, RopeScalingParams *s, int ctx_len) {
    if (!r || r->type != JSON_OBJECT) return;
    *theta = (float)json_get_num(r, "rope_theta", *theta);
    const char *type = json_get_str(r, "rope_type", json_get_str(r, "type", "default"));
    s->factor = (float)json_get_num(r, "factor", 1.0);
    s->original_ctx = hf_int(r, "original_max_position_embeddings", ctx_len);
    if (!strcmp(type, "linear")) s->type = ROPE_SCALING_LINEAR;
    if (!strcmp(type, "llama3")) {
        s->type = ROPE_SCALING_LLAMA3;
        s->low_freq_factor = (float)json_get_num(r, "low_freq_factor", 1.0);
        s->high_freq_factor = (float)json_get_num(r, "high_freq_factor", 4.0);
    }
    if (!strcmp(type, "yarn")) {
        s->type = ROPE_SCALING_YARN;
        s->beta_fast = (float)json_get_num(r, "beta_fast", 32.0);
        s->beta_slow = (float)json_get_num(r, "beta_slow", 1.0);
        s->attn_factor = (float)json_get_num(r, "attention_factor", 0.0);
        s->truncate = json_get_bool(r, "truncate", true);
    }
}

static void hf_set_rope(ModelConfig *c, const JsonValue *j) {
    c->rope_theta = (float)json_get_num(j, "rope_theta", 10000.0);
    hf_read_rope(json_get(j, "rope_scaling"), &c->rope_theta, &c->rope_scaling, c->ctx_len);
    c->rope_theta_local = (float)json_get_num(j, "rope_local_base_freq", c->rope_theta);
    const JsonValue *rp = json_get(j, "rope_parameters");
    const JsonValue *full = json_get(rp, "full_attention");
    if (full) { /* per layer type */
        RopeScalingParams local = {0};
        hf_read_rope(full, &c->rope_theta, &c->rope_scaling, c->ctx_len);
        hf_read_rope(json_get(rp, "sliding_attention"), &c->rope_theta_local, &local, c->ctx_len);
        c->rope_scaling_local = local.type != ROPE_SCALING_NONE;
        if (c->rope_scaling_local) c->rope_scaling = local; /* one scaling for all layers then */
    } else if (rp) {
        hf_read_rope(rp, &c->rope_theta, &c->rope_scaling, c->ctx_len);
        c->rope_theta_local = c->arch == ARCH_GEMMA3 ? c->rope_theta_local : c->rope_theta;
    }
}

static int hf_set_windows(ModelConfig *c, const JsonValue *j, const char *src, Err *err) {
    if (c->n_layers < 0 || c->n_layers > CONFIG_MAX_LAYERS) return 0; /* config_check reports it */
    const JsonValue *sw = json_get(j, "sliding_window");
    int window = sw && sw->type == JSON_NUMBER ? (int)sw->u.number.num : 0;
    if (c->arch == ARCH_LLAMA) window = 0;
    /* Qwen configs carry a window they do not use unless use_sliding_window. */
    if ((c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN3) && !json_get_bool(j, "use_sliding_window", false)) window = 0;
    const JsonValue *types = json_get(j, "layer_types");
    if (types && (types->type != JSON_ARRAY || json_len(types) != (size_t)c->n_layers))
        return err_set(err, "%s: field 'layer_types' must be an array of %d strings", src, c->n_layers);
    int pattern = hf_int(j, "sliding_window_pattern", 0);
    for (int l = 0; l < c->n_layers; l++) {
        bool windowed = arch_layer_is_windowed(c->arch, l);
        if (types) {
            const JsonValue *t = json_at(types, l);
            if (t->type != JSON_STRING)
                return err_set(err, "%s: field 'layer_types[%d]' must be a string", src, l);
            windowed = !strcmp(t->u.string.s, "sliding_attention");
        } else if (pattern > 0) {
            windowed = (l + 1) % pattern != 0;
        }
        c->layer_window[l] = windowed ? window : 0;
    }
    return 0;
}

int config_from_hf(ModelConfig *c, const JsonValue *j, const char *src, Err *err) {
    memset(c, 0, sizeof *c);
    c->source = SRC_HF;
    if (!j || j->type != JSON_OBJECT) return err_set(err, "%s: the top level must be a JSON object", src);
    const JsonValue *text = json_get(j, "text_config"); /* multimodal wrappers (Gemma 3 4B+) */
    if (text && text->type == JSON_OBJECT) j = text;
    const char *mt = json_get_str(j, "model_type", NULL);
    if (!mt) return err_set(err, "%s: field 'model_type' is missing or not a string", src);
    if (arch_from_hf(mt, &c->arch))
        return err_set(err, "%s: model_type '%s' is not supported (supported: %s)", src, mt, config_supported_archs());
    c->n_layers = hf_int(j, "num_hidden_layers", 0);
    c->dim = hf_int(j, "hidden_size", 0);
    c->ffn_dim = hf_int(j, "intermediate_size", 0);
    c->n_heads = hf_int(j, "num_attention_heads", 0);
    c->n_kv_heads = hf_int(j, "num_key_value_heads", c->n_heads);
    c->head_dim_k = c->head_dim_v = hf_int(j, "head_dim", c->n_heads > 0 ? c->dim / c->n_heads : 0);
    c->vocab = hf_int(j, "vocab_size", 0);
    c->ctx_len = hf_int(j, "max_position_embeddings", 4096);
    c->norm_eps = (float)json_get_num(j, "rms_norm_eps", 1e-6);
    bool gemma = c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3;
    c->tied_embeddings = json_get_bool(j, "tie_word_embeddings", gemma);
    c->n_experts = hf_int(j, "num_local_experts", hf_int(j, "num_experts", 0));
    c->n_experts_used = hf_int(j, "num_experts_per_tok", 0);
    c->attn_softcap = (float)json_get_num(j, "attn_logit_softcapping", 0.0);
    c->final_softcap = (float)json_get_num(j, "final_logit_softcapping", 0.0);
    if (!(c->attn_softcap >= 0)) c->attn_softcap = 0; /* null → default */
    if (!(c->final_softcap >= 0)) c->final_softcap = 0;
    const char *name = json_get_str(j, "_name_or_path", "");
    snprintf(c->name, sizeof c->name, "%s", name);
    config_set_arch_defaults(c);
    c->norm_offset = gemma ? 1.0f : 0.0f;
    if (c->arch == ARCH_GPT_OSS) c->act_limit = (float)json_get_num(j, "swiglu_limit", 7.0);
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_MISTRAL) {
        c->qkv_bias = c->o_bias = json_get_bool(j, "attention_bias", false);
        c->mlp_bias = json_get_bool(j, "mlp_bias", false);
    }
    c->rope_dim = (int)(c->head_dim_k * json_get_num(j, "partial_rotary_factor", 1.0));
    double qpas = json_get_num(j, "query_pre_attn_scalar", c->head_dim_k);
    c->attn_scale = qpas > 0 ? (float)(1.0 / sqrt(qpas)) : 0;
    hf_set_rope(c, j);
    if (hf_set_windows(c, j, src, err)) return -1;
    return config_check(c, src, err);
}

/* ---------- rope frequencies ---------- */

static float yarn_corr_dim(float rot, int dim, float base, int orig_ctx) {
    return dim * logf(orig_ctx / (rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static void rope_apply_yarn(const RopeScalingParams *r, int dim, float base, float *inv_freq, float *mscale) {
    float lo = yarn_corr_dim(r->beta_fast, dim, base, r->original_ctx);
    float hi = yarn_corr_dim(r->beta_slow, dim, base, r->original_ctx);
    if (r->truncate) { lo = floorf(lo); hi = ceilf(hi); }
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001f;
    for (int i = 0; i < dim / 2; i++) {
        float ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrap = 1 - ramp; /* weight of the unscaled frequency */
        inv_freq[i] = inv_freq[i] / r->factor * (1 - extrap) + inv_freq[i] * extrap;
    }
    *mscale = r->attn_factor > 0 ? r->attn_factor : r->factor > 1 ? 0.1f * logf(r->factor) + 1.0f : 1.0f;
}

static void rope_apply_llama3(const RopeScalingParams *r, int half, float *inv_freq) {
    float lo_wavelen = r->original_ctx / r->low_freq_factor;
    float hi_wavelen = r->original_ctx / r->high_freq_factor;
    for (int i = 0; i < half; i++) {
        float wavelen = 2 * (float)M_PI / inv_freq[i];
        if (wavelen > lo_wavelen) {
            inv_freq[i] /= r->factor;
        } else if (wavelen >= hi_wavelen) {
            float smooth = (r->original_ctx / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
            inv_freq[i] = (1 - smooth) * inv_freq[i] / r->factor + smooth * inv_freq[i];
        }
    }
}

void config_rope_freqs(const ModelConfig *c, int layer, const float *factors, float *inv_freq, float *mscale) {
    bool local = c->layer_window[layer] > 0;
    float base = local ? c->rope_theta_local : c->rope_theta;
    int dim = c->rope_dim, half = dim / 2;
    *mscale = 1.0f;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / dim);
    if (local && !c->rope_scaling_local) return;
    if (factors) { /* GGUF rope_freqs.weight: the converter's precomputed divisors */
        for (int i = 0; i < half; i++) inv_freq[i] /= factors[i];
        return;
    }
    const RopeScalingParams *r = &c->rope_scaling;
    switch (r->type) {
    case ROPE_SCALING_LINEAR: for (int i = 0; i < half; i++) inv_freq[i] /= r->factor; break;
    case ROPE_SCALING_LLAMA3: rope_apply_llama3(r, half, inv_freq); break;
    case ROPE_SCALING_YARN: rope_apply_yarn(r, dim, base, inv_freq, mscale); break;
    default: break;
    }
}

uint64_t config_kv_bytes_per_token(const ModelConfig *c, KVDtype t) {
    return (uint64_t)c->n_layers * c->n_kv_heads * kv_head_token_bytes(t, c->head_dim_k, c->head_dim_v);
}
