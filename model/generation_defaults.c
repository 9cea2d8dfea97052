/* generation_defaults.c — a model's recommended sampling settings
 * (generation_defaults.h). */
#include "model/generation_defaults.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"

/* The ranges the samplers accept (engine/sampler.c checks the same). */
static int check_range(const char *src, const char *field, double v, double lo, double hi, Err *err) {
    if (!isfinite(v) || v < lo || v > hi)
        return err_set(err, "%s: %s is %g: must be a number in [%g, %g]", src, field, v, lo, hi);
    return 0;
}

static int check_all(const GenerationDefaults *g, const char *src, const char *const names[5], Err *err) {
    if (g->has_temperature && check_range(src, names[0], g->temperature, 0, 100, err)) return -1;
    if (g->has_top_k && (g->top_k < 0))
        return err_set(err, "%s: %s is %d: must be an integer >= 0 (0 = off)", src, names[1], g->top_k);
    if (g->has_top_p && check_range(src, names[2], g->top_p, 0, 1, err)) return -1;
    if (g->has_min_p && check_range(src, names[3], g->min_p, 0, 1, err)) return -1;
    if (g->has_repetition_penalty && check_range(src, names[4], g->repetition_penalty, 1e-6, 100, err)) return -1;
    return 0;
}

/* A number field of obj: absent or null leaves *has false; another type is an error. */
static int json_field(const JsonValue *obj, const char *src, const char *key, bool integer, double *out, bool *has,
                      Err *err) {
    const JsonValue *v = json_get(obj, key);
    *has = false;
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER || (integer && !v->u.number.is_int))
        return err_set(err, "%s: field '%s' must be %s", src, key, integer ? "an integer" : "a number");
    *out = v->u.number.num;
    *has = true;
    return 0;
}

int generation_defaults_from_hf(GenerationDefaults *g, const char *dir, Err *err) {
    memset(g, 0, sizeof *g);
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    Json *doc = json_parse_file(path, err);
    if (!doc) return -1;
    const JsonValue *root = json_root(doc);
    int rc = 0;
    if (root->type != JSON_OBJECT) rc = err_set(err, "%s: must be a JSON object", path);
    double v[5];
    static const char *const keys[5] = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty"};
    bool *has[5] = {&g->has_temperature, &g->has_top_k, &g->has_top_p, &g->has_min_p, &g->has_repetition_penalty};
    for (int i = 0; i < 5 && !rc; i++) rc = json_field(root, path, keys[i], i == 1, &v[i], has[i], err);
    const JsonValue *ds = rc ? NULL : json_get(root, "do_sample");
    if (ds && ds->type != JSON_BOOL && ds->type != JSON_NULL)
        rc = err_set(err, "%s: field 'do_sample' must be true or false", path);
    if (!rc) {
        if (g->has_top_k && (v[1] < 0 || v[1] > 1e9))
            rc = err_set(err, "%s: field 'top_k' is %g: must be an integer in [0, 1000000000]", path, v[1]);
        g->temperature = (float)v[0];
        g->top_k = g->has_top_k && !rc ? (int)v[1] : 0;
        g->top_p = (float)v[2];
        g->min_p = (float)v[3];
        g->repetition_penalty = (float)v[4];
    }
    if (!rc) rc = check_all(g, path, keys, err);
    /* Transformers draws only with do_sample true; false means greedy
     * whatever temperature says. */
    if (!rc && ds && ds->type == JSON_BOOL && !ds->u.boolean) {
        g->has_temperature = true;
        g->temperature = 0;
    }
    bool any = g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p || g->has_repetition_penalty;
    if (!rc && any) snprintf(g->source, sizeof g->source, "generation_config.json");
    json_free(doc);
    if (rc) memset(g, 0, sizeof *g);
    return rc ? -1 : 0;
}

int generation_defaults_from_gguf(GenerationDefaults *g, const GGUFFile *f, Err *err) {
    memset(g, 0, sizeof *g);
    static const char *const keys[5] = {"general.sampling.temp", "general.sampling.top_k", "general.sampling.top_p",
                                        "general.sampling.min_p", "general.sampling.penalty_repeat"};
    bool *has[5] = {&g->has_temperature, &g->has_top_k, &g->has_top_p, &g->has_min_p, &g->has_repetition_penalty};
    double v[5] = {0};
    for (int i = 0; i < 5; i++) {
        if (!gguf_get(f, keys[i])) continue;
        if (gguf_get_f64(f, keys[i], &v[i]))
            return err_set(err, "%s: key '%s' must be a number (it is %s)", f->path, keys[i],
                           gguf_type_name(gguf_get(f, keys[i])->type));
        *has[i] = true;
    }
    if (g->has_top_k && (v[1] < 0 || v[1] > 1e9 || v[1] != floor(v[1])))
        return err_set(err, "%s: key '%s' is %g: must be an integer in [0, 1000000000]", f->path, keys[1], v[1]);
    g->temperature = (float)v[0];
    g->top_k = (int)v[1];
    g->top_p = (float)v[2];
    g->min_p = (float)v[3];
    g->repetition_penalty = (float)v[4];
    if (check_all(g, f->path, keys, err)) { memset(g, 0, sizeof *g); return -1; }
    if (g->has_temperature || g->has_top_k || g->has_top_p || g->has_min_p || g->has_repetition_penalty)
        snprintf(g->source, sizeof g->source, "GGUF general.sampling.*");
    return 0;
}

int generation_defaults_from_list(GenerationDefaults *g, const char *list, const char *src, Err *err) {
    memset(g, 0, sizeof *g);
    static const char *const keys[5] = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty"};
    bool *has[5] = {&g->has_temperature, &g->has_top_k, &g->has_top_p, &g->has_min_p, &g->has_repetition_penalty};
    double v[5] = {0};
    if (strcmp(list, "-") == 0) return 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        const char *eq = memchr(p, '=', n);
        int i = 0;
        while (eq && i < 5 && !(strlen(keys[i]) == (size_t)(eq - p) && !memcmp(p, keys[i], (size_t)(eq - p)))) i++;
        if (!eq || i == 5) {
            memset(g, 0, sizeof *g);
            return err_set(err, "%s: '%.*s' is not KEY=VALUE with KEY temperature, top_k, top_p, min_p or "
                                "repetition_penalty", src, (int)n, p);
        }
        char num[32], *end;
        size_t len = n - (size_t)(eq + 1 - p);
        snprintf(num, sizeof num, "%.*s", (int)(len < sizeof num ? len : sizeof num - 1), eq + 1);
        v[i] = strtod(num, &end);
        if (len == 0 || len >= sizeof num || *end || (i == 1 && (v[i] != floor(v[i]) || v[i] < 0 || v[i] > 1e9))) {
            memset(g, 0, sizeof *g);
            return err_set(err, "%s: %s '%.*s' must be %s", src, keys[i], (int)len, eq + 1,
                           i == 1 ? "an integer in [0, 1000000000]" : "a number");
        }
        *has[i] = true;
        p += n + (p[n] == ',');
    }
    g->temperature = (float)v[0];
    g->top_k = (int)v[1];
    g->top_p = (float)v[2];
    g->min_p = (float)v[3];
    g->repetition_penalty = (float)v[4];
    if (check_all(g, src, keys, err)) { memset(g, 0, sizeof *g); return -1; }
    snprintf(g->source, sizeof g->source, "%s", src);
    return 0;
}
