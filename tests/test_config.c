/* test_config.c — ModelConfig from config.json and GGUF metadata, and the
 * rotary frequencies against transformers (tests/fixtures/rope/rope.json, made
 * by make_rope_fixtures.py). */
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
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

static void test_hf_bad_configs(void) {
    static const struct { const char *json, *needle; } bad[] = {
        {"[1,2]", "JSON object"},
        {"{\"num_hidden_layers\":2}", "model_type"},
        {"{\"model_type\":\"bert\"}", "not supported"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":0,\"hidden_size\":64}", "block count"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":3,\"vocab_size\":10}", "KV head"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2000000,\"hidden_size\":64}", "block count"},
        {"{\"model_type\":\"gemma2\",\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":8,"
         "\"num_attention_heads\":4,\"vocab_size\":10,\"layer_types\":[\"full_attention\"]}", "layer_types"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ModelConfig c;
        Err err = {{0}};
        CHECK(parse_config(bad[i].json, &c, &err) == -1, "case %zu accepted", i);
        CHECK(strstr(err.msg, bad[i].needle) && strstr(err.msg, "config.json"), "case %zu: message '%s'", i, err.msg);
    }
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
    RUN(test_gguf_real_models);
    TEST_EXIT();
}
