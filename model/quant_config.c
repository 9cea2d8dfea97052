/* quant_config.c — config.json's quantization_config (see quant_config.h). */
#include "model/quant_config.h"

#include <stdio.h>
#include <string.h>

/* "field 'x' = <value>: why" as one error, the value as JSON text. */
static int qc_fail(Err *err, const char *src, const char *method, const char *field, const JsonValue *v,
                   const char *why) {
    char val[96] = "missing";
    if (v) json_describe(v, val, sizeof val);
    return err_set(err, "%s: quantization_config (quant_method '%s'): %s = %s: %s", src, method, field, val, why);
}

/* vLLM / HF "fp8": per-tensor scales, e4m3; block-wise (DeepSeek) refused. */
static int read_fp8(QuantConfig *q, const JsonValue *qc, const char *src, Err *err) {
    const JsonValue *bs = json_get(qc, "weight_block_size");
    if (bs && bs->type != JSON_NULL)
        return qc_fail(err, src, "fp8", "weight_block_size", bs,
                       "block-wise FP8 is not supported (cllm reads per-tensor and per-channel scales)");
    const JsonValue *fmt = json_get(qc, "fmt");
    if (fmt && !(fmt->type == JSON_STRING && !strcmp(fmt->u.string.s, "e4m3")))
        return qc_fail(err, src, "fp8", "fmt", fmt, "only e4m3 is supported");
    const JsonValue *as = json_get(qc, "activation_scheme");
    const char *scheme = as && as->type == JSON_STRING ? as->u.string.s : as ? "" : "dynamic";
    if (strcmp(scheme, "dynamic") && strcmp(scheme, "static"))
        return qc_fail(err, src, "fp8", "activation_scheme", as, "expected \"dynamic\" or \"static\"");
    q->static_input = !strcmp(scheme, "static");
    return 0;
}

/* Whether v is the number n. */
static bool is_int(const JsonValue *v, int64_t n) {
    int64_t x;
    return v && json_as_int64(v, &x) && x == n;
}

static bool is_str(const JsonValue *v, const char *s) {
    return v && v->type == JSON_STRING && !strcmp(v->u.string.s, s);
}

static bool is_true(const JsonValue *v) { return v && v->type == JSON_BOOL && v->u.boolean; }

/* One config group of compressed-tensors: float 8-bit weights per tensor or
 * per channel; activations none, dynamic per token, or static per tensor. */
static int read_ct_group(QuantConfig *q, const char *gname, const JsonValue *g, const char *src, Err *err) {
    const char *M = "compressed-tensors";
    char f[160];
    if (g->type != JSON_OBJECT) {
        snprintf(f, sizeof f, "config_groups.%s", gname);
        return qc_fail(err, src, M, f, g, "expected an object");
    }
    const JsonValue *w = json_get(g, "weights"), *a = json_get(g, "input_activations");
    snprintf(f, sizeof f, "config_groups.%s.weights", gname);
    if (!w || w->type != JSON_OBJECT) return qc_fail(err, src, M, f, w, "expected an object");
    snprintf(f, sizeof f, "config_groups.%s.weights.num_bits", gname);
    if (!is_int(json_get(w, "num_bits"), 8)) return qc_fail(err, src, M, f, json_get(w, "num_bits"), "only 8 is supported");
    snprintf(f, sizeof f, "config_groups.%s.weights.type", gname);
    if (!is_str(json_get(w, "type"), "float"))
        return qc_fail(err, src, M, f, json_get(w, "type"), "only \"float\" (FP8 e4m3) is supported");
    snprintf(f, sizeof f, "config_groups.%s.weights.strategy", gname);
    const JsonValue *st = json_get(w, "strategy");
    if (!is_str(st, "tensor") && !is_str(st, "channel"))
        return qc_fail(err, src, M, f, st, "only \"tensor\" and \"channel\" are supported");
    snprintf(f, sizeof f, "config_groups.%s.weights.dynamic", gname);
    if (is_true(json_get(w, "dynamic"))) return qc_fail(err, src, M, f, json_get(w, "dynamic"), "weights need stored scales");
    if (!a || a->type == JSON_NULL) return 0;
    snprintf(f, sizeof f, "config_groups.%s.input_activations", gname);
    if (a->type != JSON_OBJECT) return qc_fail(err, src, M, f, a, "expected an object or null");
    snprintf(f, sizeof f, "config_groups.%s.input_activations.num_bits", gname);
    if (!is_int(json_get(a, "num_bits"), 8)) return qc_fail(err, src, M, f, json_get(a, "num_bits"), "only 8 is supported");
    snprintf(f, sizeof f, "config_groups.%s.input_activations.type", gname);
    if (!is_str(json_get(a, "type"), "float")) return qc_fail(err, src, M, f, json_get(a, "type"), "only \"float\" is supported");
    const JsonValue *as = json_get(a, "strategy");
    snprintf(f, sizeof f, "config_groups.%s.input_activations.strategy", gname);
    if (is_true(json_get(a, "dynamic"))) {
        if (!is_str(as, "token")) return qc_fail(err, src, M, f, as, "dynamic activations must be per \"token\"");
        return 0;
    }
    if (!is_str(as, "tensor")) return qc_fail(err, src, M, f, as, "static activations must be per \"tensor\"");
    q->static_input = true;
    return 0;
}

static int read_compressed_tensors(QuantConfig *q, const JsonValue *qc, const char *src, Err *err) {
    const char *M = "compressed-tensors";
    const JsonValue *fmt = json_get(qc, "format");
    if (!is_str(fmt, "float-quantized") && !is_str(fmt, "naive-quantized"))
        return qc_fail(err, src, M, "format", fmt,
                       "cllm reads \"float-quantized\" (and \"naive-quantized\" with float 8-bit weights)");
    const JsonValue *groups = json_get(qc, "config_groups");
    if (!groups || groups->type != JSON_OBJECT || groups->u.object.n == 0)
        return qc_fail(err, src, M, "config_groups", groups, "expected an object of one or more groups");
    for (size_t i = 0; i < groups->u.object.n; i++)
        if (read_ct_group(q, groups->u.object.keys[i], &groups->u.object.values[i], src, err)) return -1;
    return 0;
}

/* kv_cache_scheme: null, or static (or dynamic) float 8-bit per tensor or per head. */
static int read_kv_scheme(QuantConfig *q, const JsonValue *qc, const char *src, const char *method, Err *err) {
    const JsonValue *k = json_get(qc, "kv_cache_scheme");
    if (!k || k->type == JSON_NULL) return 0;
    if (k->type != JSON_OBJECT) return qc_fail(err, src, method, "kv_cache_scheme", k, "expected an object or null");
    if (!is_int(json_get(k, "num_bits"), 8))
        return qc_fail(err, src, method, "kv_cache_scheme.num_bits", json_get(k, "num_bits"), "only 8 is supported");
    if (!is_str(json_get(k, "type"), "float"))
        return qc_fail(err, src, method, "kv_cache_scheme.type", json_get(k, "type"),
                       "only \"float\" (FP8 e4m3) is supported");
    const JsonValue *st = json_get(k, "strategy");
    if (st && !is_str(st, "tensor") && !is_str(st, "attn_head"))
        return qc_fail(err, src, method, "kv_cache_scheme.strategy", st,
                       "only \"tensor\" and \"attn_head\" (one scale per KV head) are supported");
    q->kv_static = !is_true(json_get(k, "dynamic"));
    return 0;
}

int quant_config_from_hf(QuantConfig *q, const JsonValue *root, const char *src, Err *err) {
    memset(q, 0, sizeof *q);
    const JsonValue *qc = root ? json_get(root, "quantization_config") : NULL;
    if (!qc || qc->type == JSON_NULL) return 0;
    if (qc->type != JSON_OBJECT) return err_set(err, "%s: quantization_config: expected an object", src);
    const JsonValue *m = json_get(qc, "quant_method");
    if (!m || m->type != JSON_STRING)
        return err_set(err, "%s: quantization_config.quant_method is missing or not a string", src);
    snprintf(q->method, sizeof q->method, "%s", m->u.string.s);
    int rc;
    if (!strcmp(m->u.string.s, "fp8")) rc = read_fp8(q, qc, src, err);
    else if (!strcmp(m->u.string.s, "compressed-tensors")) rc = read_compressed_tensors(q, qc, src, err);
    else
        return err_set(err, "%s: quantization_config.quant_method '%.40s' is not supported (cllm reads FP8 "
                       "checkpoints: \"fp8\" and \"compressed-tensors\" float-quantized)", src, m->u.string.s);
    if (rc == 0) rc = read_kv_scheme(q, qc, src, q->method, err);
    q->fp8 = rc == 0;
    return rc;
}
