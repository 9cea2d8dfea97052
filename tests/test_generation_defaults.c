/* test_generation_defaults.c — a model's recommended sampling settings:
 * generation_config.json beside config.json (Hugging Face; do_sample false
 * means greedy) and GGUF general.sampling.* (llama.cpp's gguf-py keys), the
 * way the commands apply them under the user's options, and hostile files
 * (wrong types, out-of-range values) refused with the file, field and value
 * named. The expected values are the ones the test writes into the files. */
#include <sys/stat.h>
#include <unistd.h>

#include "app/models.h"
#include "model/generation_defaults.h"
#include "tests/gguf_kv.h"
#include "tests/test.h"

/* A folder holding config.json and, when json is not NULL, generation_config.json. */
static void make_dir(char *dir, const char *json) {
    strcpy(dir, "/tmp/cllm_gen_XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\"}", f);
    fclose(f);
    if (!json) return;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
}

static void remove_dir(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    remove(path);
    rmdir(dir);
}

static int read_hf(const char *json, GenerationDefaults *g, Err *err) {
    char dir[64];
    make_dir(dir, json);
    int rc = generation_defaults_from_hf(g, dir, err);
    remove_dir(dir);
    return rc;
}

static void test_hf_absent(void) {
    GenerationDefaults g;
    Err err = {{0}};
    CHECK(read_hf(NULL, &g, &err) == 0, "%s", err.msg);
    CHECK(!g.has_temperature && !g.has_top_k && !g.has_top_p && !g.has_min_p && !g.has_repetition_penalty,
          "a folder without generation_config.json recommends nothing");
    CHECK(g.source[0] == 0, "source '%s'", g.source);
    /* Only token ids: nothing to recommend either. */
    CHECK(read_hf("{\"bos_token_id\": 1, \"eos_token_id\": 2}", &g, &err) == 0, "%s", err.msg);
    CHECK(!g.has_temperature && g.source[0] == 0, "token ids only: no sampling settings");
}

/* All five settings read, with these values. */
static void check_five(const GenerationDefaults *g, double temp, int top_k, double top_p, double min_p, double rep) {
    CHECK(g->has_temperature && g->has_top_k && g->has_top_p && g->has_min_p && g->has_repetition_penalty,
          "all five read");
    CHECK_NEAR(g->temperature, temp, 1e-6);
    CHECK(g->top_k == top_k, "top_k %d, want %d", g->top_k, top_k);
    CHECK_NEAR(g->top_p, top_p, 1e-6);
    CHECK_NEAR(g->min_p, min_p, 1e-6);
    CHECK_NEAR(g->repetition_penalty, rep, 1e-6);
}

static void test_hf_sampling(void) {
    GenerationDefaults g;
    Err err = {{0}};
    CHECK(read_hf("{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, \"min_p\": 0.0,"
                  " \"repetition_penalty\": 1.05, \"eos_token_id\": [1, 2]}", &g, &err) == 0, "%s", err.msg);
    check_five(&g, 0.6, 20, 0.95, 0.0, 1.05);
    CHECK(!strcmp(g.source, "generation_config.json"), "source '%s'", g.source);

    /* Applied under the user's options: given ones stay, the others take the model's. */
    SamplerParams s = sampler_params_default();
    s.temperature = 1.5f;
    int n = app_sampling_from_model(&s, SAMPLING_GIVEN_TEMP, &g);
    CHECK(n == 4, "the model set %d fields, want 4", n);
    CHECK_NEAR(s.temperature, 1.5, 1e-6);
    CHECK(s.top_k == 20, "top_k %d", s.top_k);
    CHECK_NEAR(s.top_p, 0.95, 1e-6);
    CHECK_NEAR(s.repetition_penalty, 1.05, 1e-6);
}

static void test_hf_greedy(void) {
    GenerationDefaults g;
    Err err = {{0}};
    /* Transformers ignores temperature when do_sample is false: greedy. */
    CHECK(read_hf("{\"do_sample\": false, \"temperature\": 0.6}", &g, &err) == 0, "%s", err.msg);
    CHECK(g.has_temperature && g.temperature == 0.0f, "do_sample false: temperature %g, want 0", g.temperature);
    SamplerParams s = sampler_params_default();
    app_sampling_from_model(&s, 0, &g);
    CHECK(s.temperature == 0.0f, "applied: temperature %g, want 0 (greedy)", s.temperature);
}

static void expect_hf_error(const char *json, const char *needle1, const char *needle2) {
    GenerationDefaults g;
    Err err = {{0}};
    int rc = read_hf(json, &g, &err);
    CHECK(rc == -1, "'%s' accepted", json);
    CHECK(strstr(err.msg, "generation_config.json") && strstr(err.msg, needle1) &&
              (!needle2 || strstr(err.msg, needle2)),
          "'%s': message '%s' should name the file, '%s' and '%s'", json, err.msg, needle1, needle2 ? needle2 : "");
    CHECK(!g.has_temperature && !g.has_top_k && !g.has_top_p, "'%s': a refused file sets nothing", json);
}

static void test_hf_hostile(void) {
    expect_hf_error("{\"temperature\": \"hot\"}", "temperature", "number");
    expect_hf_error("{\"temperature\": -1}", "temperature", "-1");
    expect_hf_error("{\"temperature\": 1e300}", "temperature", NULL);
    expect_hf_error("{\"top_p\": 2}", "top_p", "2");
    expect_hf_error("{\"top_k\": 1.5}", "top_k", "integer");
    expect_hf_error("{\"top_k\": -3}", "top_k", "-3");
    expect_hf_error("{\"top_k\": 99999999999999}", "top_k", NULL);
    expect_hf_error("{\"min_p\": [0.1]}", "min_p", NULL);
    expect_hf_error("{\"repetition_penalty\": 0}", "repetition_penalty", "0");
    expect_hf_error("{\"do_sample\": \"yes\"}", "do_sample", NULL);
    expect_hf_error("[1, 2]", "object", NULL);
    expect_hf_error("{\"temperature\": ", "generation_config.json", NULL); /* truncated JSON */
}

static int read_gguf(const GGUFKV *kv, size_t n, GenerationDefaults *g, Err *err) {
    char path[64];
    GGUFFile f;
    if (test_gguf_open_kv(kv, n, path, &f, err)) return -1;
    int rc = generation_defaults_from_gguf(g, &f, err);
    gguf_close(&f);
    remove(path);
    return rc;
}

static void test_gguf(void) {
    GenerationDefaults g;
    Err err = {{0}};
    GGUFKV none[] = {KV_STR("general.name", "x")};
    CHECK(read_gguf(none, 1, &g, &err) == 0, "%s", err.msg);
    CHECK(!g.has_temperature && !g.has_top_k && g.source[0] == 0, "no general.sampling keys: nothing");
    GGUFKV kv[] = {KV_F32("general.sampling.temp", 0.7), KV_U32("general.sampling.top_k", 20),
                   KV_F32("general.sampling.top_p", 0.8), KV_F32("general.sampling.min_p", 0.1),
                   KV_F32("general.sampling.penalty_repeat", 1.1)};
    CHECK(read_gguf(kv, 5, &g, &err) == 0, "%s", err.msg);
    check_five(&g, 0.7, 20, 0.8, 0.1, 1.1);
    CHECK(strstr(g.source, "general.sampling") != NULL, "source '%s'", g.source);
}

static void expect_gguf_error(GGUFKV kv, const char *needle) {
    GenerationDefaults g;
    Err err = {{0}};
    CHECK(read_gguf(&kv, 1, &g, &err) == -1, "%s accepted", kv.key);
    CHECK(strstr(err.msg, kv.key) && strstr(err.msg, needle), "message '%s' should name %s and '%s'", err.msg, kv.key,
          needle);
}

static void test_gguf_hostile(void) {
    expect_gguf_error((GGUFKV)KV_STR("general.sampling.temp", "hot"), "string");
    expect_gguf_error((GGUFKV)KV_F32("general.sampling.temp", -2), "-2");
    expect_gguf_error((GGUFKV)KV_F32("general.sampling.top_p", 1.5), "1.5");
    expect_gguf_error((GGUFKV)KV_I32("general.sampling.top_k", -1), "-1");
    expect_gguf_error((GGUFKV)KV_F32("general.sampling.top_k", 2.5), "2.5");
    expect_gguf_error((GGUFKV)KV_F32("general.sampling.penalty_repeat", 0), "0");
}

/* models.txt's sampling column: the model card's recommendation. */
static void test_list(void) {
    GenerationDefaults g;
    Err err = {{0}};
    CHECK(generation_defaults_from_list(&g, "temperature=0.2,top_p=0.9", "card", &err) == 0, "%s", err.msg);
    CHECK(g.has_temperature && g.has_top_p && !g.has_top_k && !g.has_min_p && !g.has_repetition_penalty,
          "only the two keys given are set");
    CHECK_NEAR(g.temperature, 0.2, 1e-6);
    CHECK_NEAR(g.top_p, 0.9, 1e-6);
    CHECK(!strcmp(g.source, "card"), "source '%s'", g.source);
    CHECK(generation_defaults_from_list(&g, "top_k=64,min_p=0.01,repetition_penalty=1.1", "card", &err) == 0, "%s",
          err.msg);
    CHECK(g.has_top_k && g.top_k == 64 && g.has_min_p && g.has_repetition_penalty, "top_k %d", g.top_k);
    CHECK_NEAR(g.repetition_penalty, 1.1, 1e-6);
    CHECK(generation_defaults_from_list(&g, "-", "card", &err) == 0 && !g.source[0] && !g.has_temperature,
          "'-' is none");
    static const char *const bad[][2] = {
        {"temperature=hot", "temperature 'hot'"}, {"temp=0.2", "'temp=0.2' is not KEY=VALUE"},
        {"temperature=0.2,,top_p=0.9", "'' is not KEY=VALUE"}, {"top_p=1.5", "top_p is 1.5"},
        {"top_k=2.5", "top_k '2.5'"}, {"temperature=", "temperature ''"}, {"temperature=-1", "temperature is -1"},
        {"temperature=0.2,top_p", "'top_p' is not KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECK(generation_defaults_from_list(&g, bad[i][0], "card", &err) == -1, "'%s' accepted", bad[i][0]);
        CHECK(strstr(err.msg, "card: ") && strstr(err.msg, bad[i][1]), "'%s': message '%s' lacks '%s'", bad[i][0],
              err.msg, bad[i][1]);
        CHECK(!g.has_temperature && !g.has_top_p && !g.source[0], "'%s': a refused list sets nothing", bad[i][0]);
    }
}

int main(void) {
    RUN(test_hf_absent);
    RUN(test_hf_sampling);
    RUN(test_hf_greedy);
    RUN(test_hf_hostile);
    RUN(test_gguf);
    RUN(test_gguf_hostile);
    RUN(test_list);
    TEST_EXIT();
}
