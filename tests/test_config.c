/* test_config.c — ModelConfig from config.json and GGUF metadata, and the
 * rotary frequencies against transformers (tests/fixtures/rope/rope.json, made
 * by make_rope_fixtures.py). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "tests/gguf_kv.h"
#include "tests/test.h"

static Json *load_fixture(const char *rel) {
    char path[1024];
    Err err = {{0}};
    snprintf(path, sizeof path, "%s/%s", test_fixture_dir(), rel);
    Json *j = json_parse_file(path, &err);
    if (!j) printf("  cannot read %s: %s\n", path, err.msg);
    return j;
}

static void test_rope_matches_transformers(void) {
    Json *doc = load_fixture("rope/rope.json");
    CHECK(doc != NULL, "fixture missing");
    if (!doc) return;
    const JsonValue *cases = json_root(doc);
    CHECK(json_len(cases) >= 7, "expected at least 7 cases, got %zu", json_len(cases));
    for (size_t i = 0; i < json_len(cases); i++) {
        const JsonValue *cs = json_at(cases, i);
        const char *name = json_get_str(cs, "name", "?");
        ModelConfig c;
        Err err = {{0}};
        int rc = config_from_hf(&c, json_get(cs, "config"), name, &err);
        CHECK(rc == 0, "%s: %s", name, err.msg);
        if (rc) continue;
        const char *lt = json_get_str(cs, "layer_type", NULL);
        int layer = 0;
        for (int l = 0; lt && l < c.n_layers; l++)
            if ((c.layer_window[l] > 0) == !strcmp(lt, "sliding_attention")) { layer = l; break; }
        const JsonValue *want = json_get(cs, "inv_freq");
        CHECK((int)json_len(want) == c.rope_dim / 2, "%s: %zu frequencies vs rope_dim %d", name, json_len(want), c.rope_dim);
        float inv[512], mscale;
        config_rope_freqs(&c, layer, NULL, inv, &mscale);
        double worst = 0;
        for (size_t k = 0; k < json_len(want) && k < 512; k++) {
            double w = json_at(want, k)->u.number.num, e = fabs(inv[k] - w) / fabs(w);
            if (e > worst) worst = e;
        }
        CHECK(worst < 2e-6, "%s: inv_freq relative error %.3g", name, worst);
        CHECK_NEAR(mscale, json_get_num(cs, "attention_factor", -1), 1e-6);
    }
    json_free(doc);
}

static int parse_config(const char *text, ModelConfig *c, Err *err) {
    Json *j = json_parse(text, strlen(text), "config.json", err);
    if (!j) return -1;
    int rc = config_from_hf(c, json_root(j), "config.json", err);
    json_free(j);
    return rc;
}

static void test_hf_gemma2_fields(void) {
    ModelConfig c;
    Err err = {{0}};
    const char *js = "{\"model_type\":\"gemma2\",\"num_hidden_layers\":4,\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":300,"
                     "\"rms_norm_eps\":1e-6,\"sliding_window\":8,\"query_pre_attn_scalar\":16,"
                     "\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0}";
    CHECK(parse_config(js, &c, &err) == 0, "%s", err.msg);
    CHECK(c.arch == ARCH_GEMMA2, "arch %d", c.arch);
    CHECK(c.head_dim_k == 32 && c.head_dim_v == 32, "head dims %d %d", c.head_dim_k, c.head_dim_v);
    CHECK(c.layer_window[0] == 8 && c.layer_window[1] == 0 && c.layer_window[2] == 8 && c.layer_window[3] == 0,
          "windows %d %d %d %d", c.layer_window[0], c.layer_window[1], c.layer_window[2], c.layer_window[3]);
    CHECK_NEAR(c.attn_scale, 0.25, 1e-7);
    CHECK_NEAR(c.embed_scale, 8.0, 1e-6);
    CHECK_NEAR(c.norm_offset, 1.0, 0);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f, "caps %g %g", c.attn_softcap, c.final_softcap);
    CHECK(c.tied_embeddings && c.post_norms && c.act == ACT_KIND_GELU_TANH, "gemma defaults");
}

/* A small valid config of model_type mt with extra fields spliced in. */
static int parse_with(const char *mt, const char *extra, ModelConfig *c, Err *err) {
    char js[2048];
    snprintf(js, sizeof js,
             "{\"model_type\":\"%s\",\"num_hidden_layers\":4,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":300,\"max_position_embeddings\":4096%s%s}",
             mt, *extra ? "," : "", extra);
    return parse_config(js, c, err);
}

/* Every error names config.json and the key with its value. */
static void test_hf_bad_configs(void) {
    static const struct { const char *json, *needle; } bad[] = {
        {"[1,2]", "JSON object"},
        {"{\"num_hidden_layers\":2}", "model_type"},
        {"{\"model_type\":\"bert\"}", "not supported"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":0,\"hidden_size\":64}", "num_hidden_layers = 0 (must be 1..1024)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"vocab_size\":10}",
         "num_key_value_heads = 3 (must divide num_attention_heads = 4)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":0,\"vocab_size\":10}",
         "num_key_value_heads = 0 (must divide num_attention_heads = 4)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2000000,\"hidden_size\":64}",
         "num_hidden_layers = 2000000 (must be 1..1024)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":\"4\",\"hidden_size\":64}",
         "num_hidden_layers = '4' (must be an integer in the int32 range)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":1e12,\"hidden_size\":64}",
         "num_hidden_layers = 1e+12 (must be an integer in the int32 range)"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"rms_norm_eps\":0}", "rms_norm_eps = 0 (must be in (0, 1))"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"head_dim\":2000}", "head_dim = 2000 (must be 1..1024)"},
        {"{\"model_type\":\"gemma2\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"layer_types\":[\"full_attention\"]}", "layer_types"},
        {"{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"gemma3_text\",\"num_hidden_layers\":2,"
         "\"hidden_size\":64,\"intermediate_size\":8,\"num_attention_heads\":4,\"num_key_value_heads\":3,"
         "\"vocab_size\":10}}", "text_config.num_key_value_heads = 3 (must divide text_config.num_attention_heads = 4)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        Err err = {{0}};
        CHECK(parse_config(bad[i].json, &c, &err) == -1, "case %zu accepted", i);
        CHECK(strstr(err.msg, bad[i].needle) && strstr(err.msg, "config.json"), "case %zu: message '%s'", i, err.msg);
    }
}

/* Fields that change the math and that cllm does not implement are refused,
 * naming the field and its value. */
static void test_hf_unimplemented_refused(void) {
    static const struct { const char *mt, *extra, *needle; } bad[] = {
        {"llama", "\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2.0}",
         "rope_scaling.rope_type = 'dynamic' (not supported; cllm implements default, linear, llama3 and yarn)"},
        {"llama", "\"rope_scaling\":{\"type\":\"longrope\",\"factor\":2.0}", "rope_scaling.type = 'longrope'"},
        {"llama", "\"rope_scaling\":{\"rope_type\":\"ntk\",\"factor\":2.0}", "rope_scaling.rope_type = 'ntk'"},
        {"llama", "\"rope_parameters\":{\"rope_type\":\"dynamic\",\"rope_theta\":10000.0,\"factor\":2.0}",
         "rope_parameters.rope_type = 'dynamic'"},
        {"gemma3_text", "\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"dynamic\",\"factor\":8.0},"
         "\"sliding_attention\":{\"rope_type\":\"default\"}}", "rope_parameters.full_attention.rope_type = 'dynamic'"},
        {"llama", "\"rope_scaling\":{\"rope_type\":\"yarn\"}", "rope_scaling.factor is missing (rope type 'yarn' needs it)"},
        {"llama", "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}", "rope_scaling.factor = 0 (must be a positive number)"},
        {"llama", "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":4.0,\"high_freq_factor\":4.0}",
         "rope_scaling.low_freq_factor = 4, high_freq_factor = 4 (must be 0 < low < high)"},
        {"llama", "\"rope_scaling\":\"yarn\"", "rope_scaling = 'yarn' (must be an object)"},
        {"gpt_oss", "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"swiglu_alpha\":1.5",
         "swiglu_alpha = 1.5 (not supported; cllm implements 1.702)"},
        {"gpt_oss", "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"swiglu_limit\":0", "swiglu_limit = 0 (must be a positive number)"},
        {"llama", "\"hidden_act\":\"gelu\"", "hidden_act = 'gelu' (not supported; cllm implements silu here)"},
        {"gemma2", "\"hidden_activation\":\"relu\"", "hidden_activation = 'relu'"},
        {"gemma2", "\"attention_bias\":true", "attention_bias = true (not supported for Gemma)"},
        {"qwen2", "\"use_sliding_window\":\"yes\"", "use_sliding_window = 'yes' (must be true or false)"},
        {"gemma2", "\"query_pre_attn_scalar\":0", "query_pre_attn_scalar = 0 (must be positive)"},
        {"llama", "\"partial_rotary_factor\":1.5", "partial_rotary_factor = 1.5 (must be in (0, 1])"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        Err err = {{0}};
        CHECK(parse_with(bad[i].mt, bad[i].extra, &c, &err) == -1, "case %zu (%s) accepted", i, bad[i].extra);
        CHECK(strstr(err.msg, bad[i].needle) && strstr(err.msg, "config.json: "), "case %zu: message '%s'", i, err.msg);
    }
}

/* What transformers does with the fields cllm implements. */
static void test_hf_implemented(void) {
    ModelConfig c;
    Err err = {{0}};
    /* Qwen2Config: layer_types[i] = "sliding_attention" if sliding_window is
     * not None and i >= max_window_layers; sliding_window = None unless
     * use_sliding_window (configuration_qwen2.py). */
    CHECK(parse_with("qwen2", "\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":2", &c, &err) == 0,
          "%s", err.msg);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 0 && c.layer_window[2] == 8 && c.layer_window[3] == 8,
          "qwen2 max_window_layers 2: windows %d %d %d %d", c.layer_window[0], c.layer_window[1], c.layer_window[2],
          c.layer_window[3]);
    CHECK(parse_with("qwen3", "\"use_sliding_window\":true,\"sliding_window\":8", &c, &err) == 0, "%s", err.msg);
    CHECK(c.layer_window[3] == 0, "qwen3: default max_window_layers 28 leaves 4 layers global (%d)", c.layer_window[3]);
    CHECK(parse_with("qwen2", "\"use_sliding_window\":true,\"max_window_layers\":0", &c, &err) == 0, "%s", err.msg);
    CHECK(c.layer_window[0] == 4096, "qwen2: absent sliding_window is 4096 (%d)", c.layer_window[0]);
    CHECK(parse_with("qwen2", "\"use_sliding_window\":false,\"sliding_window\":8,\"max_window_layers\":0", &c, &err) == 0,
          "%s", err.msg);
    CHECK(c.layer_window[3] == 0, "qwen2: no window without use_sliding_window (%d)", c.layer_window[3]);
    /* gpt-oss: the alpha cllm implements, and swiglu_limit. */
    CHECK(parse_with("gpt_oss", "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"swiglu_alpha\":1.702,"
                                "\"swiglu_limit\":5.0", &c, &err) == 0, "%s", err.msg);
    CHECK(c.act_limit == 5.0f, "swiglu_limit 5 read as %g", c.act_limit);
    /* yarn with mscale and mscale_all_dim: transformers' attention_factor =
     * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim),
     * get_mscale(s, m) = 0.1 m ln(s) + 1. */
    CHECK(parse_with("mistral", "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"mscale\":1.0,"
                                "\"mscale_all_dim\":0.5,\"original_max_position_embeddings\":1024}", &c, &err) == 0,
          "%s", err.msg);
    float inv[64], mscale;
    config_rope_freqs(&c, 0, NULL, inv, &mscale);
    CHECK_NEAR(mscale, (0.1 * log(4.0) + 1) / (0.05 * log(4.0) + 1), 1e-6);
    CHECK(parse_with("mistral", "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"mscale\":1.0,"
                                "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":1024}", &c, &err) == 0,
          "%s", err.msg);
    config_rope_freqs(&c, 0, NULL, inv, &mscale);
    CHECK_NEAR(mscale, 1.0, 1e-6);
}

/* ---- GGUF metadata written here: a small llama plus extra keys ---- */

static int gguf_config(const char *arch, const GGUFKV *extra, size_t n_extra, ModelConfig *c, char *path, Err *err) {
    char key[5][64];
    const char *suffix[5] = {"block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                             "vocab_size"};
    const uint64_t val[5] = {6, 64, 4, 128, 300};
    GGUFKV kv[16];
    size_t n = 0;
    kv[n++] = (GGUFKV){(char *)"general.architecture", {GGUF_STRING, {.str = {arch, strlen(arch)}}}};
    for (int i = 0; i < 5; i++) {
        snprintf(key[i], sizeof key[i], "%s.%s", arch, suffix[i]);
        kv[n++] = (GGUFKV){key[i], {GGUF_UINT32, {.u = val[i]}}};
    }
    for (size_t i = 0; i < n_extra && n < 16; i++) kv[n++] = extra[i];
    GGUFFile f;
    if (test_gguf_open_kv(kv, n, path, &f, err)) return -1;
    int rc = config_from_gguf(c, &f, err);
    gguf_close(&f);
    remove(path);
    return rc;
}

static void expect_gguf_error(const GGUFKV *extra, size_t n, const char *needle) {
    ModelConfig c;
    Err err = {{0}};
    char path[64];
    CHECK(gguf_config("llama", extra, n, &c, path, &err) == -1, "'%s': accepted", needle);
    CHECK(strstr(err.msg, needle) && strstr(err.msg, path), "want '%s' and the file, got '%s'", needle, err.msg);
}

/* Every GGUF error names the file and the key with its value; keys cllm
 * does not implement are refused, not read as absent. */
static void test_gguf_bad_metadata(void) {
    GGUFKV kv0[] = {KV_U32("llama.attention.head_count_kv", 0)};
    expect_gguf_error(kv0, 1, "llama.attention.head_count_kv = 0 (must divide llama.attention.head_count = 4)");
    GGUFKV kv1[] = {KV_U32("llama.attention.head_count_kv", 3)};
    expect_gguf_error(kv1, 1, "llama.attention.head_count_kv = 3 (must divide llama.attention.head_count = 4)");
    GGUFKV kv2[] = {KV_I32("llama.attention.head_count_kv", -1)};
    expect_gguf_error(kv2, 1, "key 'llama.attention.head_count_kv' = -1 is out of range");
    GGUFKV kv3[] = {KV_STR("llama.attention.head_count_kv", "2")};
    expect_gguf_error(kv3, 1, "key 'llama.attention.head_count_kv' must be an integer (it is string)");
    GGUFKV kv5[] = {KV_F32("llama.attention.layer_norm_rms_epsilon", 0)};
    expect_gguf_error(kv5, 1, "llama.attention.layer_norm_rms_epsilon = 0 (must be in (0, 1))");
    GGUFKV kv6[] = {KV_STR("llama.rope.scaling.type", "longrope")};
    expect_gguf_error(kv6, 1, "key 'llama.rope.scaling.type' = 'longrope' is not supported (supported: none, linear, yarn)");
    GGUFKV kv7[] = {KV_STR("llama.rope.scaling.type", "linear"), KV_F32("llama.rope.scaling.factor", -2)};
    expect_gguf_error(kv7, 2, "key 'llama.rope.scaling.factor' = -2 (must be positive)");
    GGUFKV kv8[] = {KV_STR("llama.rope.scaling.type", "yarn"), KV_F32("llama.rope.scaling.factor", 4),
                    KV_F32("llama.rope.scaling.yarn_log_multiplier", 0.1f)};
    expect_gguf_error(kv8, 3, "key 'llama.rope.scaling.yarn_log_multiplier' = 0.1 is not supported");
    GGUFKV kv9[] = {KV_U32("llama.rope.scaling.type", 2)};
    expect_gguf_error(kv9, 1, "key 'llama.rope.scaling.type' must be a string (it is uint32)");
    GGUFKV kv10[] = {KV_U32("llama.attention.key_length", 2000)};
    expect_gguf_error(kv10, 1, "llama.attention.key_length = 2000 (must be 1..1024)");
}

/* What the keys cllm implements give. */
static void test_gguf_metadata(void) {
    ModelConfig c;
    Err err = {{0}};
    char path[64];
    GGUFKV none[] = {KV_STR("llama.rope.scaling.type", "none"), KV_F32("llama.rope.scaling.factor", 8)};
    CHECK(gguf_config("llama", none, 2, &c, path, &err) == 0, "%s", err.msg);
    CHECK(c.rope_scaling.type == ROPE_SCALING_NONE, "type none: %d", c.rope_scaling.type);
    GGUFKV lin[] = {KV_STR("llama.rope.scaling.type", "linear"), KV_F32("llama.rope.scaling.factor", 0)};
    CHECK(gguf_config("llama", lin, 2, &c, path, &err) == 0, "%s", err.msg);
    CHECK(c.rope_scaling.type == ROPE_SCALING_LINEAR && c.rope_scaling.factor == 1.0f,
          "linear, factor 0 is llama.cpp's 1: %d %g", c.rope_scaling.type, c.rope_scaling.factor);
    /* llama.cpp's integer sliding_window_pattern n: layer il is windowed when il % n < n - 1. */
    GGUFKV pat[] = {KV_U32("gemma3.attention.sliding_window", 16), KV_U32("gemma3.attention.sliding_window_pattern", 3)};
    CHECK(gguf_config("gemma3", pat, 2, &c, path, &err) == 0, "%s", err.msg);
    CHECK(c.layer_window[0] == 16 && c.layer_window[1] == 16 && c.layer_window[2] == 0 && c.layer_window[3] == 16 &&
              c.layer_window[5] == 0,
          "pattern 3: %d %d %d %d %d %d", c.layer_window[0], c.layer_window[1], c.layer_window[2], c.layer_window[3],
          c.layer_window[4], c.layer_window[5]);
}

static void test_gguf_real_models(void) {
    const char *dir = getenv("CLLM_MODELS") ? getenv("CLLM_MODELS") : "models/cache";
    char path[1024];
    static const struct { const char *file; Arch arch; int layers, dim, heads, kv_heads, vocab; } want[] = {
        /* hyperparameters as published for these models */
        {"smollm2-135m-instruct.gguf", ARCH_LLAMA, 30, 576, 9, 3, 49152},
        {"gemma3-270m.gguf", ARCH_GEMMA3, 18, 640, 4, 1, 262144},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, want[i].file);
        GGUFFile f;
        ModelConfig c;
        Err err = {{0}};
        int rc = gguf_open(&f, path, &err);
        CHECK(rc == 0, "%s (fetch with models/fetch.sh)", err.msg);
        if (rc) continue;
        CHECK(config_from_gguf(&c, &f, &err) == 0, "%s", err.msg);
        CHECK(c.arch == want[i].arch && c.n_layers == want[i].layers && c.dim == want[i].dim &&
              c.n_heads == want[i].heads && c.n_kv_heads == want[i].kv_heads && c.vocab == want[i].vocab,
              "%s: arch %d layers %d dim %d heads %d/%d vocab %d", want[i].file, c.arch, c.n_layers, c.dim,
              c.n_heads, c.n_kv_heads, c.vocab);
        if (c.arch == ARCH_GEMMA3) {
            CHECK(c.layer_window[0] > 0 && c.layer_window[5] == 0 && c.layer_window[11] == 0 && c.layer_window[6] > 0,
                  "gemma3 5:1 pattern");
            CHECK(c.rope_theta_local == 10000.0f && c.qk_norm && c.norm_offset == 0, "gemma3 gguf facts");
        }
        gguf_close(&f);
    }
}

int main(void) {
    RUN(test_rope_matches_transformers);
    RUN(test_hf_gemma2_fields);
    RUN(test_hf_bad_configs);
    RUN(test_hf_unimplemented_refused);
    RUN(test_hf_implemented);
    RUN(test_gguf_bad_metadata);
    RUN(test_gguf_metadata);
    RUN(test_gguf_real_models);
    TEST_EXIT();
}
