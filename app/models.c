/* models.c — which model a command runs when -m is not given (the first of
 * models.txt, in models/cache or $CLLM_MODELS), and loading it with the
 * error printed (models.h). */
#include "app/models.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Folder of the running executable (for models.txt and models/cache). */
static void exe_dir(char *out, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) { snprintf(out, cap, "."); return; }
    out[n] = 0;
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
}

/* Where models/fetch.sh puts model NAME.FMT: models/cache beside the
 * executable, or $CLLM_MODELS. -1 when the path does not fit. */
static int model_cache_path(const char *dir, const char *name, const char *fmt, char *out, size_t cap) {
    const char *cache = getenv("CLLM_MODELS");
    int n = cache ? snprintf(out, cap, "%s/%s.%s", cache, name, fmt)
                  : snprintf(out, cap, "%s/models/cache/%s.%s", dir, name, fmt);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Path of the first model of models.txt in models/cache (or $CLLM_MODELS). */
int app_default_model(char *out, size_t cap) {
    char dir[PATH_MAX], list[PATH_MAX + 16], line[1024], name[256] = "", fmt[32] = "", kind[32] = "";
    exe_dir(dir, sizeof dir);
    snprintf(list, sizeof list, "%s/models.txt", dir);
    FILE *f = fopen(list, "r");
    while (f && fgets(line, sizeof line, f))
        if (line[0] != '#' && sscanf(line, "%255s %*s %31s %*s %*s %*s %31s", name, fmt, kind) >= 2) break;
    if (f) fclose(f);
    /* The default is what `./cllm` chats with: a base model there would ramble. */
    if (name[0] && strcmp(kind, "instruct"))
        fprintf(stderr, "cllm: note: the default model %s is marked '%s' in %s, not 'instruct': "
                        "its chat replies are text completions\n", name, kind[0] ? kind : "(no kind)", list);
    if (!name[0]) {
        fprintf(stderr, "cllm: no -m MODEL given and no default model listed in %s\n", list);
        return 2;
    }
    if (model_cache_path(dir, name, fmt, out, cap)) {
        fprintf(stderr, "cllm: the default model's path is too long\n");
        return 2;
    }
    if (access(out, R_OK) != 0) {
        fprintf(stderr, "cllm: the default model %s is not downloaded yet (%s).\n"
                        "Get it with:  %s/models/fetch.sh default   (or pass -m MODEL)\n", name, out, dir);
        return 2;
    }
    return 0;
}

/* model_load, or model_load_dummy in dummy_type with MODEL_LOAD_DUMMY_WEIGHTS */
int app_load_model(const char *cmd, const char *path, int flags, DType dummy_type, Model *m) {
    char def[PATH_MAX];
    if (!path) {
        int rc = app_default_model(def, sizeof def);
        if (rc) return rc;
        path = def;
    }
    Err err = {{0}};
    if ((flags & MODEL_LOAD_DUMMY_WEIGHTS ? model_load_dummy(m, path, flags, dummy_type, &err)
                                          : model_load(m, path, flags, &err))) {
        fprintf(stderr, "cllm %s: %s\n", cmd, err.msg);
        return 2;
    }
    app_warn_unused(m);
    return 0;
}

#define UNUSED_WARN_MAX 16

void app_warn_unused(const Model *m) {
    for (uint64_t i = 0; i < m->n_unused && i < UNUSED_WARN_MAX; i++)
        fprintf(stderr, "cllm: warning: %s: tensor '%s' is not used by the %s architecture (ignored)\n", m->path,
                m->unused[i], arch_name(m->cfg.arch));
    if (m->n_unused > UNUSED_WARN_MAX)
        fprintf(stderr, "cllm: warning: %s: %llu more tensors are not used (cllm info --tensors lists them)\n",
                m->path, (unsigned long long)(m->n_unused - UNUSED_WARN_MAX));
}


/* The sampling models.txt lists for m when m is one of its models (the file
 * models/fetch.sh put in the cache): its 8th column. */
static int models_txt_sampling(const Model *m, GenerationDefaults *g, Err *err) {
    char dir[PATH_MAX], list[PATH_MAX + 16], line[1024], name[256], fmt[32], samp[256], path[PATH_MAX];
    char want[PATH_MAX], have[PATH_MAX];
    memset(g, 0, sizeof *g);
    exe_dir(dir, sizeof dir);
    snprintf(list, sizeof list, "%s/models.txt", dir);
    if (!realpath(m->path, want)) return 0;
    FILE *f = fopen(list, "r");
    int rc = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%255s %*s %31s %*s %*s %*s %*s %255s", name, fmt, samp) != 3) continue;
        if (model_cache_path(dir, name, fmt, path, sizeof path) || !realpath(path, have) || strcmp(have, want))
            continue;
        char src[sizeof list + sizeof name + 32];
        snprintf(src, sizeof src, "%s (%s's sampling column)", list, name);
        if (generation_defaults_from_list(g, samp, src, err)) rc = -1;
        else if (g->source[0]) snprintf(g->source, sizeof g->source, "models.txt entry");
        break;
    }
    if (f) fclose(f);
    return rc;
}

/* m->gen, else (none) the models.txt entry's. */
static int app_generation_defaults(const Model *m, GenerationDefaults *g, Err *err) {
    *g = m->gen;
    return g->source[0] ? 0 : models_txt_sampling(m, g, err);
}

int app_model_sampling(const char *cmd, const Model *m, unsigned given, SamplerParams *s, Err *err) {
    GenerationDefaults gen;
    if (app_generation_defaults(m, &gen, err)) return -1;
    if (app_sampling_from_model(s, given, &gen))
        fprintf(stderr, "cllm %s: sampling as the model's %s recommends (options given override it): "
                        "temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g\n",
                cmd, gen.source, s->temperature, s->top_k, s->top_p, s->min_p, s->repetition_penalty);
    return 0;
}

int app_sampling_from_model(SamplerParams *s, unsigned given, const GenerationDefaults *g) {
    int n = 0;
    if (g->has_temperature && !(given & SAMPLING_GIVEN_TEMP)) s->temperature = g->temperature, n++;
    if (g->has_top_k && !(given & SAMPLING_GIVEN_TOP_K)) s->top_k = g->top_k, n++;
    if (g->has_top_p && !(given & SAMPLING_GIVEN_TOP_P)) s->top_p = g->top_p, n++;
    if (g->has_min_p && !(given & SAMPLING_GIVEN_MIN_P)) s->min_p = g->min_p, n++;
    if (g->has_repetition_penalty && !(given & SAMPLING_GIVEN_REPEAT)) s->repetition_penalty = g->repetition_penalty, n++;
    return n;
}
