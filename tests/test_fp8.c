/* test_fp8.c — FP8 (e4m3) weights: the e4m3 conversions against torch, FP8
 * checkpoints (vLLM "fp8" per tensor, dynamic and static; compressed-tensors
 * per channel) and --weights fp8 through the CPU forward against goldens
 * computed in torch (tests/fixtures/make_fp8_models.py), the load errors of
 * broken scales and refused quantization layouts, and `cllm quantize --type
 * fp8`'s checkpoint against --weights fp8; the FP8 KV cache's static scales
 * (--kv-scales: checkpoint k_scale / v_scale per tensor and per head, and
 * the first step's calibration) against goldens of the same torch
 * arithmetic (tests/fixtures/make_fp8_kv_models.py), their binding and the
 * load errors of broken ones.
 *
 * How the logits are compared (errors are max |diff| / max |ref| of a row).
 * The golden and cllm do the same roundings (e4m3 of the weights and of the
 * activations), and most rows agree to fp32 rounding (~3e-7; EXACT = 1e-5).
 * But the activations reaching each rounding differ by fp32 summation order
 * (~1e-7 relative), and now and then one lands within that of an e4m3
 * midpoint and rounds the other way: one code one step (2^-4 relative)
 * apart, which these random-weight models amplify to 1e-2..6e-2 of the
 * logits in the rows that see it (the sliding window of 6 bounds how many).
 * So a model passes when at least MIN_EXACT of its rows are EXACT and no row
 * is off by more than FLIP_TOL. Breaking the math moves every row: the
 * goldens' "sensitivity" entries give the logit change when the activations
 * are not quantized (0.24..0.41 of the logits, in nearly every row) or the
 * scales are ignored (2..640). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/quantize_cmd.h"
#include "engine/engine.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "model/quant_config.h"
#include "tests/ref/ref_engine.h"
#include "tests/b64_floats.h"
#include "tests/test.h"

#define EXACT 1e-5
#define MIN_EXACT 0.75
#define FLIP_TOL 0.1

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static char *fixture(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", test_fixture_dir(), rel);
    return buf;
}

/* A fixture's JSON (NULL, after a failed CHECK, when it does not parse). */
static Json *fixture_json(const char *rel) {
    char path[1024];
    Err err = {{0}};
    Json *doc = json_parse_file(fixture(path, sizeof path, rel), &err);
    CHECK(doc != NULL, "%s", err.msg);
    return doc;
}

/* ---- e4m3 against torch's float8_e4m3fn ---- */

static void test_e4m3_against_torch(void) {
    Json *doc = fixture_json("fp8/e4m3_torch.json");
    if (!doc) return;
    const JsonValue *dec = json_get(json_root(doc), "decode"), *enc = json_get(json_root(doc), "encode");
    CHECK(json_len(dec) == 256, "decode has %zu codes", json_len(dec));
    int bad = 0;
    for (size_t c = 0; c < json_len(dec); c++) {
        float want = f32_of_bits((uint32_t)json_at(dec, c)->u.number.num), got = e4m3_to_fp32((uint8_t)c);
        bool same = isnan(want) ? isnan(got) : bits_of_f32(got) == bits_of_f32(want);
        if (!same && bad++ < 5) CHECK(0, "decode 0x%02zx: %g, torch %g", c, got, want);
    }
    CHECK(bad == 0, "%d of 256 codes decode differently from torch", bad);
    bad = 0;
    size_t ties = 0, sat = 0;
    for (size_t i = 0; i < json_len(enc); i++) {
        const JsonValue *e = json_at(enc, i);
        float x = f32_of_bits((uint32_t)json_at(e, 0)->u.number.num);
        int want = (int)json_at(e, 1)->u.number.num, got = fp32_to_e4m3(x);
        if (got != want && bad++ < 5) CHECK(0, "encode %a: 0x%02x, torch 0x%02x", x, got, want);
        float ax = fabsf(x);
        sat += ax >= 448.0f;
        if (ax < 448.0f && fp32_to_e4m3(ax) < 0x7e) { /* a midpoint of two codes: a tie */
            float lo = e4m3_to_fp32(fp32_to_e4m3(ax) & 0x7f);
            float hi = e4m3_to_fp32((uint8_t)((fp32_to_e4m3(ax) & 0x7f) + 1)), lo2 = e4m3_to_fp32((uint8_t)((fp32_to_e4m3(ax) & 0x7f) - 1));
            ties += ax == (lo + hi) / 2 || ax == (lo + lo2) / 2;
        }
    }
    CHECK(bad == 0, "%d of %zu values encode differently from torch", bad, json_len(enc));
    CHECK(ties >= 200 && sat >= 20, "the table has %zu ties and %zu saturating values", ties, sat);
    printf("# e4m3: 256 codes, %zu encodes (%zu ties, %zu saturating) as torch\n", json_len(enc), ties, sat);
    json_free(doc);
}

/* --weights fp8's row quantizer: scale amax/448, an all-zero row scale 1. */
static void test_weight_row_quantizer(void) {
    float row[5] = {0.5f, -2.0f, 1.0f, 0.0f, 0.25f}, zeros[3] = {0};
    uint8_t codes[5];
    float s = fp8_quantize_weight_row(row, 5, codes);
    CHECK(s == 2.0f / 448.0f, "scale %g", s);
    CHECK(codes[1] == (0x80 | 0x7e), "the largest |value| is -448: 0x%02x", codes[1]);
    for (int i = 0; i < 5; i++) CHECK(codes[i] == fp32_to_e4m3(row[i] / s), "code %d", i);
    CHECK(fp8_quantize_weight_row(zeros, 3, codes) == 1.0f && codes[0] == 0, "a zero row: scale 1, codes 0");
}

/* ---- logits through the CPU forward ---- */

typedef struct {
    Model m;
    Backend *be;
    Engine e;
} Rig;

/* The KV cache a rig runs with: fp32, or fp8 with its scales' source. */
typedef struct {
    KVDtype dtype;
    KVScales scales;
} RigKV;
static const RigKV KV_FP32 = {KV_DTYPE_BF16, KV_SCALES_DYNAMIC};

static int rig_open(Rig *r, const char *path, int flags, RigKV kv, Err *err) {
    memset(r, 0, sizeof *r);
    if (model_load(&r->m, path, flags | MODEL_LOAD_NO_TOKENIZER, err)) return -1;
    r->be = backend_cpu_create(&r->m.shape, &r->m.w, 2, 16, 64, kv.dtype, kv.scales, err);
    if (!r->be || engine_init(&r->e, &r->m, r->be, 64 * 16, 64, err)) return -1;
    return 0;
}

static void rig_close(Rig *r) {
    engine_free(&r->e);
    if (r->be) r->be->destroy(r->be);
    model_free(&r->m);
    memset(r, 0, sizeof *r); /* closing twice is harmless */
}

/* The logits of every row of ids in one step (NULL on failure). */
static float *prompt_logits(Rig *r, const int32_t *ids, int T) {
    Err err = {{0}};
    float *logits = malloc((size_t)T * r->m.cfg.vocab * sizeof *logits);
    if (logits && engine_prompt_logits(&r->e, ids, T, logits, &err) == 0) return logits;
    printf("  %s\n", err.msg);
    free(logits);
    return NULL;
}

/* How the logits of a model compare with a golden, row by row. */
typedef struct {
    double worst;      /* the largest row error */
    int rows, exact;   /* rows compared; rows within EXACT */
} Agreement;

/* The model at path loaded with flags, with a KV cache kv, against the
 * prompts of ref (fp8/<name>.ref.json); out_logits (when given) gets
 * prompt 0's. --kv-scales calibrate: each prompt on a fresh backend (its
 * scales from its own step, as the golden's). */
static Agreement check_against_kv(const char *ref_name, const char *path, int flags, RigKV kv, float **out_logits) {
    char rp[1024];
    Err err = {{0}};
    Agreement a = {INFINITY, 0, 0};
    Json *doc = json_parse_file(fixture(rp, sizeof rp, ref_name), &err);
    CHECK(doc != NULL, "%s", err.msg);
    if (!doc) return a;
    Rig r;
    if (rig_open(&r, path, flags, kv, &err)) {
        CHECK(0, "%s: %s", path, err.msg);
    } else {
        a.worst = 0;
        const JsonValue *prompts = json_get(json_root(doc), "prompts");
        int V = r.m.cfg.vocab;
        for (size_t p = 0; p < json_len(prompts); p++) {
            if (p > 0 && kv.scales == KV_SCALES_CALIBRATE) {
                rig_close(&r);
                if (rig_open(&r, path, flags, kv, &err)) {
                    CHECK(0, "%s: %s", path, err.msg);
                    a.worst = INFINITY;
                    break;
                }
            }
            const JsonValue *jids = json_get(json_at(prompts, p), "ids"), *b64 = json_get(json_at(prompts, p), "logits_f32_b64");
            int T = (int)json_len(jids);
            int32_t *ids = malloc(T * sizeof *ids);
            float *want = malloc((size_t)T * V * sizeof *want);
            for (int i = 0; i < T; i++) ids[i] = (int32_t)json_at(jids, i)->u.number.num;
            size_t n = b64_floats(b64->u.string.s, b64->u.string.len, want, (size_t)T * V);
            CHECK(n == (size_t)T * V, "%s: %zu floats, want %d", ref_name, n, T * V);
            float *got = prompt_logits(&r, ids, T);
            for (int t = 0; got && t < T; t++) {
                double e = test_row_err(got + (size_t)t * V, want + (size_t)t * V, V);
                if (!(e <= a.worst)) a.worst = e;
                a.rows++;
                a.exact += e <= EXACT;
            }
            if (!got) a.worst = INFINITY;
            if (p == 0 && out_logits) *out_logits = got;
            else free(got);
            free(ids);
            free(want);
        }
    }
    rig_close(&r);
    json_free(doc);
    return a;
}

static Agreement check_against(const char *ref_name, const char *path, int flags, float **out_logits) {
    return check_against_kv(ref_name, path, flags, KV_FP32, out_logits);
}

/* Most rows equal to fp32 rounding, none beyond a flipped code's reach. */
static void check_agreement(const char *what, Agreement a) {
    printf("# %-14s %d of %d rows within %.0e, worst %.2e (limits: %.0f%%, %.2f)\n", what, a.exact, a.rows, EXACT,
           a.worst, 100 * MIN_EXACT, FLIP_TOL);
    CHECK(a.rows > 0 && a.exact >= MIN_EXACT * a.rows && a.worst <= FLIP_TOL,
          "%s: %d of %d rows within %g of the golden, worst %.3g", what, a.exact, a.rows, EXACT, a.worst);
}

static void check_checkpoint(const char *name) {
    char path[1024], ref[256];
    snprintf(ref, sizeof ref, "fp8/%s.ref.json", name);
    snprintf(path, sizeof path, "%s/fp8/%s", test_fixture_dir(), name);
    check_agreement(name, check_against(ref, path, 0, NULL));
}

static void test_fp8_per_tensor_dynamic(void) { check_checkpoint("fp8-tensor"); }
static void test_fp8_per_tensor_static(void) { check_checkpoint("fp8-static"); }
static void test_compressed_tensors_per_channel(void) { check_checkpoint("ct-channel"); }

/* The checkpoints bind what they hold: FP8 matrices with scales, the
 * ignored LM head unquantized, a static input scale, no unused tensors. */
static void test_checkpoint_binding(void) {
    char path[1024];
    Model m;
    Err err = {{0}};
    if (model_load(&m, fixture(path, sizeof path, "fp8/ct-channel"), MODEL_LOAD_NO_TOKENIZER, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const WeightRef *wq = &m.w.layers[0].wq;
    CHECK(wq->type == DT_F8_E4M3 && wq->scale && wq->input_scale == 0, "wq: type %d", (int)wq->type);
    CHECK(wq->scale[0] != wq->scale[1], "per-channel scales differ by row");
    CHECK(m.w.output.type == DT_F32 && !m.w.output.scale, "the ignored lm_head stays fp32");
    CHECK(m.quant.fp8 && !strcmp(m.quant.method, "compressed-tensors") && !m.quant.static_input, "quant config");
    CHECK(m.n_unused == 0, "%llu unused tensors", (unsigned long long)m.n_unused);
    model_free(&m);
    if (model_load(&m, fixture(path, sizeof path, "fp8/fp8-static"), MODEL_LOAD_NO_TOKENIZER, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    wq = &m.w.layers[1].w_down;
    CHECK(wq->type == DT_F8_E4M3 && wq->input_scale > 0 && wq->scale[0] == wq->scale[wq->rows - 1], "static, per tensor");
    CHECK(m.n_unused == 0, "%llu unused tensors", (unsigned long long)m.n_unused);
    model_free(&m);
}

static void test_weights_fp8(void) {
    char path[1024];
    check_agreement("--weights fp8", check_against("fp8/weights-fp8.ref.json", fixture(path, sizeof path, "tiny/mistral"),
                                                   MODEL_LOAD_WEIGHTS_FP8, NULL));
    Model m;
    Err err = {{0}};
    if (model_load(&m, path, MODEL_LOAD_NO_TOKENIZER | MODEL_LOAD_WEIGHTS_FP8, &err)) { CHECK(0, "%s", err.msg); return; }
    const LayerWeights *l = &m.w.layers[1];
    CHECK(l->wq.type == DT_F8_E4M3 && l->w_down.type == DT_F8_E4M3 && m.w.output.type == DT_F8_E4M3,
          "the matrices and the untied head are FP8");
    CHECK(m.w.tok_embd.type == DT_F32 && l->attn_norm.type == DT_F32, "embedding and norms stay");
    model_free(&m);
    /* a tied head stays the embedding's */
    if (model_load(&m, fixture(path, sizeof path, "tiny/llama"), MODEL_LOAD_NO_TOKENIZER | MODEL_LOAD_WEIGHTS_FP8, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(m.w.output.type == DT_F32 && m.w.output.data == m.w.tok_embd.data, "tied head untouched");
    model_free(&m);
    /* GGUF block types are refused, naming the tensor */
    char q8[1024];
    snprintf(q8, sizeof q8, "%s/cllm_test_fp8_q8_%d.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    int rc = quantize_model(fixture(path, sizeof path, "tiny/llama.gguf"), q8, DT_Q8_0, NULL, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
        rc = model_load(&m, q8, MODEL_LOAD_NO_TOKENIZER | MODEL_LOAD_WEIGHTS_FP8, &err);
        if (rc == 0) model_free(&m);
        CHECK(rc != 0 && strstr(err.msg, "--weights fp8: tensor 'blk.0.attn_q.weight' is already quantized (Q8_0)"),
              "a Q8_0 GGUF: %s", err.msg);
        remove(q8);
    }
}

/* ---- load errors ---- */

/* A checkpoint under tests/fixtures/<root>/<dir> whose load fails with an
 * error holding both want strings. */
typedef struct {
    const char *dir, *want[2];
} LoadCase;

/* fixtures <root>/zero, negative, nan, inf: the scale tensor t (quoted)
 * holds 0, -0.5, NaN, inf (fp8_check_scale_values' errors). */
#define BAD_VALUE_CASES(t)                                                                  \
    {"zero", {t, "value 0 is 0; a scale must be a positive finite number"}},               \
    {"negative", {t, "value 0 is -0.5; a scale must be a positive finite number"}},        \
    {"nan", {t, "is nan; a scale must be a positive finite number"}},                      \
    {"inf", {t, "is inf; a scale must be a positive finite number"}}

static void check_load_errors(const char *root, const LoadCase *cases, size_t n) {
    char path[1024], rel[256];
    for (size_t i = 0; i < n; i++) {
        Model m;
        Err err = {{0}};
        snprintf(rel, sizeof rel, "%s/%s", root, cases[i].dir);
        int rc = model_load(&m, fixture(path, sizeof path, rel), MODEL_LOAD_NO_TOKENIZER, &err);
        if (rc == 0) model_free(&m);
        CHECK(rc != 0 && strstr(err.msg, cases[i].want[0]) && strstr(err.msg, cases[i].want[1]), "%s: rc %d, '%s'",
              cases[i].dir, rc, err.msg);
    }
}

static void test_bad_scales(void) {
    const char *q = "'model.layers.0.self_attn.q_proj.weight_scale'";
    const char *qi = "'model.layers.0.self_attn.q_proj.input_scale'";
    const LoadCase cases[] = {
        BAD_VALUE_CASES(q),
        {"missing", {"tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but its scale", q}},
        {"shape", {q, "must have shape [] or [1] (per tensor), or [16, 1] or [16] (per channel)"}},
        {"dtype", {q, "is F8_E4M3: a scale must be F32, BF16 or F16"}},
        {"input-missing", {qi, "is missing: quantization_config (quant_method 'fp8') has static activation scales"}},
        {"input-zero", {qi, "a scale must be a positive finite number"}},
    };
    char path[1024];
    Model m;
    Err err = {{0}};
    int rc = model_load(&m, fixture(path, sizeof path, "fp8/bad/good"), MODEL_LOAD_NO_TOKENIZER, &err);
    CHECK(rc == 0, "the unbroken micro checkpoint: %s", err.msg);
    if (rc == 0) model_free(&m);
    check_load_errors("fp8/bad", cases, sizeof cases / sizeof *cases);
}

static void test_quant_configs(void) {
    const struct { const char *json, *want[2]; } cases[] = {
        {"{\"quant_method\": \"awq\", \"bits\": 4}", {"quant_method 'awq' is not supported", "compressed-tensors"}},
        {"{\"quant_method\": \"gptq\"}", {"quant_method 'gptq'", "not supported"}},
        {"{\"quant_method\": \"bitsandbytes\"}", {"quant_method 'bitsandbytes'", "not supported"}},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}",
         {"quant_method 'fp8'", "weight_block_size = an array: block-wise FP8 is not supported"}},
        {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"weird\"}", {"quant_method 'fp8'", "activation_scheme"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\": {}}",
         {"quant_method 'compressed-tensors'", "format = 'pack-quantized'"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"int-quantized\", \"config_groups\": {}}",
         {"quant_method 'compressed-tensors'", "format = 'int-quantized'"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"naive-quantized\", \"config_groups\": {\"g\": "
         "{\"weights\": {\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"channel\"}}}}",
         {"quant_method 'compressed-tensors'", "config_groups.g.weights.type = 'int'"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\": "
         "{\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"group\", \"group_size\": 128}}}}",
         {"quant_method 'compressed-tensors'", "config_groups.g.weights.strategy = 'group'"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\": "
         "{\"weights\": {\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"tensor\"}}}}",
         {"quant_method 'compressed-tensors'", "config_groups.g.weights.num_bits = 4"}},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\": "
         "{\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}, \"input_activations\": "
         "{\"num_bits\": 8, \"type\": \"float\", \"dynamic\": true, \"strategy\": \"tensor\"}}}}",
         {"quant_method 'compressed-tensors'", "input_activations.strategy = 'tensor': dynamic activations"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text, "{\"quantization_config\": %s}", cases[i].json);
        Err err = {{0}};
        Json *doc = json_parse(text, strlen(text), "cfg", &err);
        CHECK(doc != NULL, "%s", err.msg);
        if (!doc) continue;
        QuantConfig q;
        int rc = quant_config_from_hf(&q, json_root(doc), "config.json", &err);
        CHECK(rc != 0 && strstr(err.msg, cases[i].want[0]) && strstr(err.msg, cases[i].want[1]) &&
              strstr(err.msg, "config.json"), "case %zu: rc %d, '%s'", i, rc, err.msg);
        json_free(doc);
    }
    const char *good = "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
                       "\"float-quantized\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, \"type\": "
                       "\"float\", \"strategy\": \"tensor\"}, \"input_activations\": {\"num_bits\": 8, \"type\": "
                       "\"float\", \"dynamic\": false, \"strategy\": \"tensor\"}}}}}";
    Err err = {{0}};
    Json *doc = json_parse(good, strlen(good), "cfg", &err);
    QuantConfig q;
    CHECK(doc && quant_config_from_hf(&q, json_root(doc), "c", &err) == 0 && q.fp8 && q.static_input, "%s", err.msg);
    json_free(doc);
    /* kv_cache_scheme: static per tensor or per head wants tensors; dynamic, none */
    const struct { const char *scheme; int kv_static; } kv[] = {
        {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"attn_head\", \"dynamic\": false}", 1},
        {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}", 1},
        {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": true}", 0},
        {"null", 0},
        {"{\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"tensor\"}", -1},
        {"\"fp8\"", -1},
    };
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"quantization_config\": {\"quant_method\": \"fp8\", \"kv_cache_scheme\": %s}}",
                 kv[i].scheme);
        doc = json_parse(text, strlen(text), "cfg", &err);
        int rc = doc ? quant_config_from_hf(&q, json_root(doc), "config.json", &err) : -1;
        if (kv[i].kv_static < 0)
            CHECK(rc != 0 && strstr(err.msg, "config.json") && strstr(err.msg, "kv_cache_scheme"), "kv %zu: %s", i,
                  err.msg);
        else
            CHECK(rc == 0 && q.kv_static == (kv[i].kv_static == 1), "kv %zu: rc %d, kv_static %d: %s", i, rc,
                  (int)q.kv_static, err.msg);
        json_free(doc);
    }
}

/* ---- cllm quantize --type fp8 ---- */

static void test_quantize_fp8(void) {
    char in[1024], out[1024];
    snprintf(out, sizeof out, "%s/cllm_test_fp8_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    Err err = {{0}};
    int rc = quantize_fp8_checkpoint(fixture(in, sizeof in, "tiny/mistral"), out, &err);
    CHECK(rc == 0, "quantize: %s", err.msg);
    if (rc) return;
    float *a = NULL, *b = NULL;
    check_agreement("quantized", check_against("fp8/weights-fp8.ref.json", out, 0, &a));
    check_against("fp8/weights-fp8.ref.json", in, MODEL_LOAD_WEIGHTS_FP8, &b);
    CHECK(a && b && memcmp(a, b, 12 * 304 * sizeof *a) == 0, "the checkpoint's logits equal --weights fp8's");
    Model m;
    if (model_load(&m, out, 0, &err) == 0) { /* with its tokenizer and config */
        CHECK(m.quant.fp8 && !strcmp(m.quant.method, "compressed-tensors") && m.n_unused == 0 && m.tok,
              "the written checkpoint: %s, %llu unused", m.quant.method, (unsigned long long)m.n_unused);
        CHECK(m.w.layers[0].wk.scale && m.w.layers[0].wk.scale[0] != m.w.layers[0].wk.scale[1], "per channel");
        model_free(&m);
    } else {
        CHECK(0, "%s", err.msg);
    }
    free(a);
    free(b);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    CHECK(system(cmd) == 0, "cleanup");
}

/* ---- FP8 KV cache with static scales (--kv-scales) ---- */

/* The static encode against torch's codes (fp8kv/codes.json), through
 * fp8_quantize_row_fixed and through an fp8 cache given fixed scales. */
static void test_kv_fixed_codes(void) {
    Err err = {{0}};
    Json *doc = fixture_json("fp8kv/codes.json");
    if (!doc) return;
    const JsonValue *rows = json_get(json_root(doc), "rows");
    CHECK(json_len(rows) >= 4, "%zu rows", json_len(rows));
    int bad = 0, saturated = 0;
    for (size_t r = 0; r < json_len(rows); r++) {
        const JsonValue *row = json_at(rows, r), *x = json_get(row, "x"), *codes = json_get(row, "codes");
        float scale = (float)json_get(row, "scale")->u.number.num, xs[64];
        int n = (int)json_len(x);
        if (n != 64 || json_len(codes) != 64) { CHECK(0, "row %zu: %d values", r, n); continue; }
        for (int i = 0; i < n; i++) xs[i] = (float)json_at(x, i)->u.number.num;
        uint8_t got[64], cached[64];
        fp8_quantize_row_fixed(xs, n, scale, got);
        /* the same row through a one-layer, one-head cache with a fixed scale */
        KVCacheHost c;
        CHECK(kv_cache_host_alloc(&c, 1, 1, 64, 64, 1, 2, KV_DTYPE_FP8, &err) == 0 &&
              kv_cache_host_fix_scales(&c, &err) == 0, "%s", err.msg);
        c.k_fixed[0] = c.v_fixed[0] = scale;
        kv_cache_store(&c, 0, 1, xs, xs);
        memcpy(cached, c.k8[0] + 64, 64);
        CHECK(c.ks[0][1] == scale && c.vs[0][1] == scale && !memcmp(c.v8[0] + 64, cached, 64),
              "row %zu: the slot keeps the fixed scale", r);
        kv_cache_host_free(&c);
        for (int i = 0; i < n; i++) {
            int want = (int)json_at(codes, i)->u.number.num;
            saturated += (want & 0x7f) == 0x7e;
            if ((got[i] != want || cached[i] != want) && bad++ < 5)
                CHECK(0, "row %zu value %d (%a / %g): 0x%02x (cache 0x%02x), torch 0x%02x", r, i, xs[i], scale, got[i],
                      cached[i], want);
        }
    }
    CHECK(bad == 0 && saturated >= 20, "%d codes differ from torch; %d saturated", bad, saturated);
    json_free(doc);
}

/* cpu_kv_calibrate: per head amax over the rows written (a padding row's
 * huge values ignored) / 448; an all-zero head gets 1. */
static void test_kv_calibrate_cpu(void) {
    KVCacheHost c;
    Err err = {{0}};
    CHECK(kv_cache_host_alloc(&c, 2, 2, 4, 2, 4, 2, KV_DTYPE_FP8, &err) == 0 && kv_cache_host_fix_scales(&c, &err) == 0,
          "%s", err.msg);
    /* 3 rows of 2 KV heads: k [3][2][4], v [3][2][2]; row 1 is padding */
    float k[24] = {1, -7, 2, 0, 0, 0, 0, 0, /* row 0 */ 900, 900, 900, 900, 900, 900, 900, 900, /* padding */
                   3, 5, -2, 1, 0, 0, 0, 0};
    float v[12] = {0.5f, -0.25f, 2, 1, -1e9f, 1e9f, 1e9f, 1e9f, 0.75f, 0.1f, -4, 0};
    int32_t pos[3] = {0, 0, 1}, seq[3] = {0, 0, 0}, table[2] = {0, 1};
    int64_t slot[3] = {0, -1, 1};
    const int32_t *tables[1] = {table};
    AttnBatch b = {3, pos, seq, slot, 1, tables, 4};
    CHECK(cpu_kv_calibrate(&c, 1, &b, k, v), "rows were written");
    CHECK(c.k_fixed[2] == 7.0f / 448.0f && c.k_fixed[3] == 1.0f, "K scales %g %g", c.k_fixed[2], c.k_fixed[3]);
    CHECK(c.v_fixed[2] == 0.75f / 448.0f && c.v_fixed[3] == 4.0f / 448.0f, "V scales %g %g", c.v_fixed[2], c.v_fixed[3]);
    CHECK(c.k_fixed[0] == 1.0f && c.v_fixed[1] == 1.0f, "layer 0 untouched");
    int64_t none[3] = {-1, -1, 99};
    AttnBatch pad = {3, pos, seq, none, 1, tables, 4};
    CHECK(!cpu_kv_calibrate(&c, 0, &pad, k, v) && c.k_fixed[0] == 1.0f, "a step writing no row sets nothing");
    kv_cache_host_free(&c);
}

static void check_kv_golden(const char *what, const char *ref, const char *model, KVScales scales) {
    char path[1024];
    RigKV kv = {KV_DTYPE_FP8, scales};
    check_agreement(what, check_against_kv(ref, fixture(path, sizeof path, model), 0, kv, NULL));
}

static void test_kv_scales_per_tensor(void) {
    check_kv_golden("kv per tensor", "fp8kv/tensor.ref.json", "fp8kv/tensor", KV_SCALES_CHECKPOINT);
}

static void test_kv_scales_per_head(void) {
    check_kv_golden("kv per head", "fp8kv/head.ref.json", "fp8kv/head", KV_SCALES_CHECKPOINT);
}

static void test_kv_scales_calibrate(void) {
    check_kv_golden("kv calibrate", "fp8kv/calibrate.ref.json", "tiny/mistral", KV_SCALES_CALIBRATE);
}

/* The dynamic form ignores the checkpoint's scales: its logits are not the
 * static golden's (the goldens' sensitivity entries say by how much). */
static void test_kv_scales_dynamic_differs(void) {
    char path[1024];
    RigKV kv = {KV_DTYPE_FP8, KV_SCALES_DYNAMIC};
    Agreement a = check_against_kv("fp8kv/tensor.ref.json", fixture(path, sizeof path, "fp8kv/tensor"), 0, kv, NULL);
    printf("# dynamic vs the static golden: %d of %d rows within %.0e, worst %.2e\n", a.exact, a.rows, EXACT, a.worst);
    CHECK(a.rows > 0 && a.exact < a.rows / 2, "dynamic scales match the static golden in %d of %d rows", a.exact, a.rows);
}

/* Every name form binds, per tensor or per head, marked used. */
static void test_kv_scales_binding(void) {
    const struct { const char *dir; float k0[2], v1[2]; } cases[] = {
        {"tensor", {0.02f, 0.02f}, {1.03f, 1.03f}},
        {"head", {0.5f, 0.25f}, {0.125f, 2.0f}},
        {"legacy", {0.04f, 0.04f}, {0.04f, 0.04f}},
        {"output", {0.05f, 0.05f}, {0.06f, 0.06f}},
    };
    char path[1024], rel[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Model m;
        Err err = {{0}};
        snprintf(rel, sizeof rel, "fp8kv/bad/%s", cases[i].dir);
        if (model_load(&m, fixture(path, sizeof path, rel), MODEL_LOAD_NO_TOKENIZER, &err)) {
            CHECK(0, "%s: %s", cases[i].dir, err.msg);
            continue;
        }
        const float *s0 = m.w.layers[0].kv_scales.data, *s1 = m.w.layers[1].kv_scales.data;
        CHECK(s0 && s1 && m.w.layers[0].kv_scales.cols == 4, "%s: bound", cases[i].dir);
        if (s0 && s1)
            CHECK(s0[0] == cases[i].k0[0] && s0[1] == cases[i].k0[1] && s1[2] == cases[i].v1[0] &&
                  s1[3] == cases[i].v1[1], "%s: k0 %g %g, v1 %g %g", cases[i].dir, s0[0], s0[1], s1[2], s1[3]);
        CHECK(m.n_unused == 0, "%s: %llu unused tensors", cases[i].dir, (unsigned long long)m.n_unused);
        model_free(&m);
    }
    Model m;
    Err err = {{0}};
    int rc = model_load(&m, fixture(path, sizeof path, "fp8kv/bad/none"), MODEL_LOAD_NO_TOKENIZER, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(!m.w.layers[0].kv_scales.data, "a checkpoint without KV scales has none");
    Backend *be = backend_cpu_create(&m.shape, &m.w, 1, 16, 4, KV_DTYPE_FP8, KV_SCALES_CHECKPOINT, &err);
    CHECK(!be && strstr(err.msg, "--kv-scales checkpoint: layer 0 has no KV cache scales"), "%s", err.msg);
    if (be) be->destroy(be);
    be = backend_cpu_create(&m.shape, &m.w, 1, 16, 4, KV_DTYPE_BF16, KV_SCALES_CALIBRATE, &err);
    CHECK(!be && strstr(err.msg, "static scales need an fp8 cache"), "%s", err.msg);
    if (be) be->destroy(be);
    model_free(&m);
}

static void test_kv_scales_bad(void) {
    const char *k0 = "'model.layers.0.self_attn.k_scale'";
    const LoadCase cases[] = {
        BAD_VALUE_CASES(k0),
        {"head-zero", {"'model.layers.1.self_attn.v_proj.v_scale'", "value 1 is 0"}},
        {"shape", {k0, "a KV cache scale is one value (per tensor) or 2 (one per KV head)"}},
        {"shape2", {k0, "has shape [2, 2, 1, 1]"}},
        {"dtype", {k0, "is F8_E4M3: a scale must be F32, BF16 or F16"}},
        {"layer-missing", {"tensor 'model.layers.1.self_attn.k_scale' is missing", "every layer must (layer 1"}},
        {"v-missing", {"tensor 'model.layers.0.self_attn.v_scale' is missing", "K and V pair"}},
        {"scheme-missing", {"tensor 'model.layers.0.self_attn.k_scale' is missing", "static kv_cache_scheme"}},
        {"scheme-bits", {"kv_cache_scheme.num_bits = 4", "only 8 is supported"}},
        {"scheme-strategy", {"kv_cache_scheme.strategy = 'channel'", "attn_head"}},
    };
    check_load_errors("fp8kv/bad", cases, sizeof cases / sizeof *cases);
}

int main(void) {
    RUN(test_e4m3_against_torch);
    RUN(test_weight_row_quantizer);
    RUN(test_fp8_per_tensor_dynamic);
    RUN(test_fp8_per_tensor_static);
    RUN(test_compressed_tensors_per_channel);
    RUN(test_checkpoint_binding);
    RUN(test_weights_fp8);
    RUN(test_bad_scales);
    RUN(test_quant_configs);
    RUN(test_quantize_fp8);
    RUN(test_kv_fixed_codes);
    RUN(test_kv_calibrate_cpu);
    RUN(test_kv_scales_per_tensor);
    RUN(test_kv_scales_per_head);
    RUN(test_kv_scales_calibrate);
    RUN(test_kv_scales_dynamic_differs);
    RUN(test_kv_scales_binding);
    RUN(test_kv_scales_bad);
    TEST_EXIT();
}
