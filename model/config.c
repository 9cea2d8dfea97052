/* config.c — fills ModelConfig from GGUF metadata, and what both readers
 * share (architecture defaults, the checks, the rotary frequencies);
 * config_hf.c reads a Hugging Face config.json.
 *
 * GGUF keys follow llama.cpp's converter: "<arch>.block_count",
 * "<arch>.attention.head_count", ... Facts the converter leaves implicit are
 * filled the way llama.cpp does for that architecture: Gemma 2 and gpt-oss
 * window every even layer, Gemma 3 every layer but each sixth; Gemma norm
 * weights already hold the +1; llama Q/K rows are permuted for interleaved
 * rope. A key that is present but of the wrong type or out of range is an
 * error, never read as absent; so is a rope scaling type cllm does not
 * implement (it implements none, linear and yarn; llama3 comes as the
 * rope_freqs.weight tensor).
 */
#include "model/config_internal.h"

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

void config_set_arch_defaults(ModelConfig *c) {
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

bool config_layer_is_windowed(Arch a, int layer) {
    switch (a) {
    case ARCH_GEMMA2: case ARCH_GPT_OSS: return layer % 2 == 0;
    case ARCH_GEMMA3: return layer % 6 != 5;
    default: return true; /* mistral-style: every layer */
    }
}

static int out_of_range(Err *err, const char *src, const char *key, long long v, long long lo, long long hi) {
    return err_set(err, "%s: %s = %lld (must be %lld..%lld)", src, key, v, lo, hi);
}

int config_check(ModelConfig *c, const char *src, const ConfigKeyNames *k, Err *err) {
#define KEY(i) k->name[i]
#define RANGE(field, key, lo, hi) \
    if (c->field < (lo) || c->field > (hi)) return out_of_range(err, src, KEY(key), c->field, lo, hi)
    RANGE(n_layers, CK_LAYERS, 1, CONFIG_MAX_LAYERS);
    RANGE(dim, CK_DIM, 1, 1 << 20);
    RANGE(ffn_dim, CK_FFN, 1, 1 << 22);
    RANGE(n_heads, CK_HEADS, 1, 1024);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return err_set(err, "%s: %s = %d (must divide %s = %d)", src, KEY(CK_KV_HEADS), c->n_kv_heads, KEY(CK_HEADS),
                       c->n_heads);
    RANGE(head_dim_k, CK_HEAD_DIM_K, 1, 1024);
    RANGE(head_dim_v, CK_HEAD_DIM_V, 1, 1024);
    if (c->rope_dim < 0 || c->rope_dim > c->head_dim_k || c->rope_dim % 2)
        return err_set(err, "%s: %s gives a rope dimension of %d (must be even and at most the head size, %s = %d)",
                       src, KEY(CK_ROPE_DIM), c->rope_dim, KEY(CK_HEAD_DIM_K), c->head_dim_k);
    RANGE(vocab, CK_VOCAB, 1, 1 << 24);
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return err_set(err, "%s: %s = %g (must be in (0, 1))", src, KEY(CK_EPS), c->norm_eps);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta)))
        return err_set(err, "%s: %s = %g (must be positive)", src, KEY(CK_THETA), c->rope_theta);
    if (!(c->rope_theta_local > 0 && isfinite(c->rope_theta_local)))
        return err_set(err, "%s: %s = %g (must be positive)", src, KEY(CK_THETA_LOCAL), c->rope_theta_local);
    RANGE(n_experts, CK_EXPERTS, 0, 4096);
    RANGE(n_experts_used, CK_EXPERTS_USED, c->n_experts ? 1 : 0, c->n_experts);
    if (!(c->attn_softcap >= 0 && isfinite(c->attn_softcap)))
        return err_set(err, "%s: %s = %g (must not be negative)", src, KEY(CK_ATTN_SOFTCAP), c->attn_softcap);
    if (!(c->final_softcap >= 0 && isfinite(c->final_softcap)))
        return err_set(err, "%s: %s = %g (must not be negative)", src, KEY(CK_FINAL_SOFTCAP), c->final_softcap);
    if (c->ctx_len <= 0) c->ctx_len = 4096;
#undef RANGE
#undef KEY
    return 0;
}

/* ---------- GGUF ---------- */

/* The file and its architecture prefix; the first error of an optional key
 * is kept in err and sets failed, so reading goes on and fails once. */
typedef struct {
    const GGUFFile *f;
    const char *arch;
    Err *err;
    bool failed;
} GKeys;

static const char *gkey(const GKeys *k, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", k->arch, suffix);
    return buf;
}

static void g_fail_type(GKeys *k, const char *key, const char *want) {
    const GGUFValue *v = gguf_get(k->f, key);
    if (!k->failed)
        err_set(k->err, "%s: key '%s' must be %s (it is %s)", k->f->path, key, want, gguf_type_name(v->type));
    k->failed = true;
}

/* An optional integer key in 0..INT32_MAX; def when absent. */
static int g_int_opt(GKeys *k, const char *suffix, int def) {
    char key[160];
    int64_t v;
    gkey(k, suffix, key, sizeof key);
    if (!gguf_get(k->f, key)) return def;
    if (gguf_get_i64(k->f, key, &v)) {
        g_fail_type(k, key, "an integer");
        return def;
    }
    if (v < 0 || v > INT32_MAX) {
        if (!k->failed) err_set(k->err, "%s: key '%s' = %lld is out of range", k->f->path, key, (long long)v);
        k->failed = true;
        return def;
    }
    return (int)v;
}

static int g_int_req(GKeys *k, const char *suffix, int *out) {
    char key[160];
    if (!gguf_get(k->f, gkey(k, suffix, key, sizeof key)))
        return err_set(k->err, "%s: key '%s' is missing", k->f->path, key);
    *out = g_int_opt(k, suffix, 0);
    return k->failed ? -1 : 0;
}

/* An optional finite number; def when absent. */
static float g_num_opt(GKeys *k, const char *suffix, float def) {
    char key[160];
    double v;
    gkey(k, suffix, key, sizeof key);
    if (!gguf_get(k->f, key)) return def;
    if (gguf_get_f64(k->f, key, &v)) {
        g_fail_type(k, key, "a number");
        return def;
    }
    if (!isfinite(v) || fabs(v) > 3e38) {
        if (!k->failed) err_set(k->err, "%s: key '%s' = %g is not a finite float", k->f->path, key, v);
        k->failed = true;
        return def;
    }
    return (float)v;
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

/* Per-layer windows: "<arch>.attention.sliding_window_pattern" when present
 * — an array of bools (true = windowed) or, as llama.cpp once wrote it, an
 * integer n (each n-th layer global) — else the architecture's rule. */
static void gguf_set_windows(ModelConfig *c, GKeys *k) {
    if (c->n_layers < 0 || c->n_layers > CONFIG_MAX_LAYERS) return; /* config_check reports it */
    int window = g_int_opt(k, "attention.sliding_window", 0);
    char key[160];
    gkey(k, "attention.sliding_window_pattern", key, sizeof key);
    const GGUFValue *pat = gguf_get_arr(k->f, key, GGUF_BOOL);
    int64_t every = 0;
    if (!pat && gguf_get(k->f, key) && (gguf_get_i64(k->f, key, &every) || every < 0 || every > INT32_MAX)) {
        g_fail_type(k, key, "an array of bools or a layer count");
        return;
    }
    for (int l = 0; l < c->n_layers; l++) {
        bool windowed = pat && pat->v.arr.n > 0 ? pat->v.arr.items[l % pat->v.arr.n].v.u != 0
                        : every > 0         ? (l + 1) % every != 0
                                            : config_layer_is_windowed(c->arch, l);
        c->layer_window[l] = windowed ? window : 0;
    }
}

static bool gstr_is(GGUFStr s, const char *lit) { return s.len == strlen(lit) && !memcmp(s.ptr, lit, s.len); }

static int gguf_set_rope_scaling(ModelConfig *c, GKeys *k) {
    char key[160];
    GGUFStr type = {0};
    RopeScalingParams *r = &c->rope_scaling;
    gkey(k, "rope.scaling.type", key, sizeof key);
    if (!gguf_get(k->f, key)) return 0;
    if (gguf_get_str(k->f, key, &type)) {
        g_fail_type(k, key, "a string");
        return -1;
    }
    if (gstr_is(type, "none")) return 0;
    if (!gstr_is(type, "linear") && !gstr_is(type, "yarn"))
        return err_set(k->err, "%s: key '%s' = '%.*s' is not supported (supported: none, linear, yarn)", k->f->path,
                       key, type.len > 40 ? 40 : (int)type.len, type.ptr);
    /* llama.cpp reads a factor of 0 as 1 (no scaling). */
    float factor = g_num_opt(k, "rope.scaling.factor", 1.0f);
    if (factor < 0)
        return err_set(k->err, "%s: key '%s.rope.scaling.factor' = %g (must be positive)", k->f->path, k->arch, factor);
    r->factor = factor > 0 ? factor : 1.0f;
    r->original_ctx = g_int_opt(k, "rope.scaling.original_context_length", c->ctx_len);
    if (gstr_is(type, "linear")) {
        r->type = ROPE_SCALING_LINEAR;
        return 0;
    }
    r->type = ROPE_SCALING_YARN;
    r->beta_fast = g_num_opt(k, "rope.scaling.yarn_beta_fast", 32.0f);
    r->beta_slow = g_num_opt(k, "rope.scaling.yarn_beta_slow", 1.0f);
    r->attn_factor = g_num_opt(k, "rope.scaling.attn_factor", 0.0f);
    /* DeepSeek's mscale: changes the attention factor in a way cllm does not do. */
    float log_mul = g_num_opt(k, "rope.scaling.yarn_log_multiplier", 0.0f);
    if (log_mul != 0)
        return err_set(k->err, "%s: key '%s.rope.scaling.yarn_log_multiplier' = %g is not supported (only 0)",
                       k->f->path, k->arch, log_mul);
    if (!(r->beta_fast > 0 && r->beta_slow > 0 && r->original_ctx > 0 && r->attn_factor >= 0))
        return err_set(k->err, "%s: yarn keys '%s.rope.scaling.*': beta_fast %g, beta_slow %g, original context %d and "
                               "attn_factor %g must be positive", k->f->path, k->arch, r->beta_fast, r->beta_slow,
                       r->original_ctx, r->attn_factor);
    /* gpt-oss (the only yarn model here) keeps the range unrounded, as its
     * reference implementation does; llama.cpp rounds it for others. */
    r->truncate = c->arch != ARCH_GPT_OSS;
    return 0;
}

static void gguf_key_names(ConfigKeyNames *n, const GKeys *k) {
    static const char *const suffix[CK_COUNT] = {
        [CK_LAYERS] = "block_count", [CK_DIM] = "embedding_length", [CK_FFN] = "feed_forward_length",
        [CK_HEADS] = "attention.head_count", [CK_KV_HEADS] = "attention.head_count_kv",
        [CK_HEAD_DIM_K] = "attention.key_length", [CK_HEAD_DIM_V] = "attention.value_length",
        [CK_ROPE_DIM] = "rope.dimension_count", [CK_VOCAB] = "vocab_size",
        [CK_EPS] = "attention.layer_norm_rms_epsilon", [CK_THETA] = "rope.freq_base",
        [CK_THETA_LOCAL] = "rope.freq_base_swa", [CK_EXPERTS] = "expert_count",
        [CK_EXPERTS_USED] = "expert_used_count", [CK_ATTN_SOFTCAP] = "attn_logit_softcapping",
        [CK_FINAL_SOFTCAP] = "final_logit_softcapping",
    };
    for (int i = 0; i < CK_COUNT; i++) gkey(k, suffix[i], n->name[i], sizeof n->name[i]);
    char key[160];
    if (gguf_get(k->f, gkey(k, "expert_feed_forward_length", key, sizeof key)))
        snprintf(n->name[CK_FFN], sizeof n->name[CK_FFN], "%s", key);
    if (!gguf_get(k->f, n->name[CK_VOCAB]))
        snprintf(n->name[CK_VOCAB], sizeof n->name[CK_VOCAB], "token_embd.weight's row count");
    if (!gguf_get(k->f, n->name[CK_HEAD_DIM_K])) /* derived */
        snprintf(n->name[CK_HEAD_DIM_K], sizeof n->name[CK_HEAD_DIM_K], "%s.embedding_length / %s.attention.head_count",
                 k->arch, k->arch);
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
    GKeys k = {f, arch, err, false};
    GGUFStr name;
    if (gguf_get_str(f, "general.name", &name) == 0)
        snprintf(c->name, sizeof c->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);
    if (g_int_req(&k, "block_count", &c->n_layers) || g_int_req(&k, "embedding_length", &c->dim) ||
        g_int_req(&k, "attention.head_count", &c->n_heads))
        return -1;
    c->ffn_dim = g_int_opt(&k, "feed_forward_length", 0);
    c->ffn_dim = g_int_opt(&k, "expert_feed_forward_length", c->ffn_dim);
    c->n_kv_heads = g_int_opt(&k, "attention.head_count_kv", c->n_heads);
    c->head_dim_k = g_int_opt(&k, "attention.key_length", c->n_heads ? c->dim / c->n_heads : 0);
    c->head_dim_v = g_int_opt(&k, "attention.value_length", c->head_dim_k);
    c->ctx_len = g_int_opt(&k, "context_length", 4096);
    c->norm_eps = g_num_opt(&k, "attention.layer_norm_rms_epsilon", 1e-5f);
    c->rope_theta = g_num_opt(&k, "rope.freq_base", 10000.0f);
    c->rope_theta_local = g_num_opt(&k, "rope.freq_base_swa", c->arch == ARCH_GEMMA3 ? 10000.0f : c->rope_theta);
    c->rope_dim = g_int_opt(&k, "rope.dimension_count", c->head_dim_k);
    c->attn_softcap = g_num_opt(&k, "attn_logit_softcapping", 0.0f);
    c->final_softcap = g_num_opt(&k, "final_logit_softcapping", 0.0f);
    c->n_experts = g_int_opt(&k, "expert_count", 0);
    c->n_experts_used = g_int_opt(&k, "expert_used_count", 0);
    const GGUFTensor *emb = gguf_find_tensor(f, "token_embd.weight");
    c->vocab = g_int_opt(&k, "vocab_size", emb && emb->ne[1] <= INT32_MAX ? (int)emb->ne[1] : 0);
    c->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    config_set_arch_defaults(c);
    c->rope_neox = c->arch != ARCH_LLAMA && c->arch != ARCH_MISTRAL; /* GGUF llama Q/K are permuted */
    /* Gemma 27B scales queries by 1/sqrt(dim/heads), as llama.cpp does. */
    float qscale = (c->arch == ARCH_GEMMA2 || c->arch == ARCH_GEMMA3) && c->dim == 4608 && c->n_heads == 32
                       ? (float)c->dim / c->n_heads : (float)c->head_dim_k;
    c->attn_scale = g_num_opt(&k, "attention.scale", qscale > 0 ? 1.0f / sqrtf(qscale) : 1.0f);
    if (!k.failed && !(c->attn_scale > 0))
        return err_set(err, "%s: key '%s.attention.scale' = %g (must be positive)", f->path, arch, c->attn_scale);
    gguf_set_windows(c, &k);
    if (k.failed || gguf_set_rope_scaling(c, &k) || k.failed) return -1;
    ConfigKeyNames names;
    gguf_key_names(&names, &k);
    return config_check(c, f->path, &names, err);
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
