/* quantize_fp8.c — `cllm quantize IN OUT --type fp8`: a safetensors model
 * folder in, an FP8 checkpoint folder out, in the compressed-tensors
 * "float-quantized" layout vLLM reads: every matrix --weights fp8 quantizes
 * (model.h MODEL_LOAD_WEIGHTS_FP8: the layers' attention and MLP matrices
 * and an untied LM head) as F8_E4M3 codes with "<name>_scale" F32 [rows, 1]
 * per-channel scales, activations dynamic per token; every other tensor
 * copied byte for byte. config.json gets quantization_config (the rest of
 * its text kept), and the tokenizer and generation files are copied. The
 * codes and scales are the ones --weights fp8 computes, read from the model
 * loaded with it, so the checkpoint runs exactly as --weights fp8 does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app/quantize_cmd.h"
#include "formats/safetensors_write.h"
#include "model/model.h"

typedef enum { OUT_COPY, OUT_CODES, OUT_SCALE } OutKind;

typedef struct {
    OutKind kind;
    const TensorInfo *src;   /* OUT_COPY */
    const WeightRef *w;      /* OUT_CODES, OUT_SCALE */
} OutSource;

static int fill(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err) {
    const OutSource *s = (const OutSource *)ctx + i;
    const void *src = s->kind == OUT_COPY ? s->src->data : s->kind == OUT_CODES ? s->w->data : (const void *)s->w->scale;
    memcpy(dst, src, nbytes);
    return 0;
}

/* The quantized matrix bound to file tensor t, or NULL. */
static const WeightRef *fp8_matrix_of(const Model *m, const TensorInfo *t) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        const WeightRef *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof *mats; i++)
            if (mats[i]->name == t->name && mats[i]->type == DT_F8_E4M3) return mats[i];
    }
    return m->w.output.name == t->name && m->w.output.type == DT_F8_E4M3 ? &m->w.output : NULL;
}

static char *read_text(const char *path, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, "%s: cannot open: %s", path, strerror(errno)), NULL;
    TextBuf b = {0};
    char chunk[65536];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(chunk, 1, sizeof chunk, f)) > 0) rc = textbuf_append(&b, chunk, n);
    fclose(f);
    if (rc || !b.data) { textbuf_free(&b); return err_set(err, "%s: empty or out of memory", path), NULL; }
    return b.data;
}

static int write_text(const char *path, const char *a, size_t na, const char *b, Err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return err_set(err, "%s: cannot create: %s", path, strerror(errno));
    bool ok = fwrite(a, 1, na, f) == na && fputs(b, f) >= 0;
    if (fclose(f) != 0) ok = false;
    return ok ? 0 : err_set(err, "%s: write failed", path);
}

/* config.json with quantization_config added before its closing brace. */
static int write_config(const char *in_dir, const char *out_dir, bool head_quantized, Err *err) {
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/config.json", in_dir);
    snprintf(out, sizeof out, "%s/config.json", out_dir);
    char *text = read_text(in, err);
    if (!text) return -1;
    char *end = strrchr(text, '}');
    if (!end) { free(text); return err_set(err, "%s: no closing brace", in); }
    while (end > text && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\r' || end[-1] == '\t')) end--;
    char tail[1024];
    snprintf(tail, sizeof tail,
             ",\n  \"quantization_config\": {\n    \"quant_method\": \"compressed-tensors\",\n"
             "    \"format\": \"float-quantized\",\n    \"quantization_status\": \"compressed\",\n"
             "    \"config_groups\": {\n      \"group_0\": {\n        \"targets\": [\"Linear\"],\n"
             "        \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\", "
             "\"symmetric\": true, \"dynamic\": false, \"group_size\": null, \"block_structure\": null},\n"
             "        \"input_activations\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"token\", "
             "\"symmetric\": true, \"dynamic\": true},\n        \"output_activations\": null\n      }\n    },\n"
             "    \"ignore\": [%s],\n    \"kv_cache_scheme\": null\n  }\n}\n",
             head_quantized ? "" : "\"lm_head\"");
    int rc = write_text(out, text, (size_t)(end - text), tail, err);
    free(text);
    return rc;
}

/* Copies in_dir/name to out_dir/name when it exists. */
static int copy_side_file(const char *in_dir, const char *out_dir, const char *name, Err *err) {
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/%s", in_dir, name);
    snprintf(out, sizeof out, "%s/%s", out_dir, name);
    struct stat s;
    if (stat(in, &s) != 0) return 0;
    FILE *f = fopen(in, "rb"), *g = f ? fopen(out, "wb") : NULL;
    int rc = f && g ? 0 : err_set(err, "%s: cannot copy to %s", in, out);
    char buf[65536];
    size_t n;
    while (rc == 0 && (n = fread(buf, 1, sizeof buf, f)) > 0)
        if (fwrite(buf, 1, n, g) != n) rc = err_set(err, "%s: write failed", out);
    if (f) fclose(f);
    if (g && fclose(g) != 0 && rc == 0) rc = err_set(err, "%s: write failed", out);
    return rc;
}

/* The output's tensor list: each file tensor, and a scale after each FP8 matrix. */
static int plan_tensors(const Model *m, SafetensorsOutTensor *ot, OutSource *src, char **names, uint64_t *n_out,
                        bool *head_q, Err *err) {
    uint64_t k = 0;
    for (uint64_t i = 0; i < m->st.n_tensors; i++) {
        const TensorInfo *t = &m->st.tensors[i];
        const WeightRef *w = fp8_matrix_of(m, t);
        ot[k] = (SafetensorsOutTensor){t->name, t->type, t->n_dims, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}};
        src[k++] = (OutSource){w ? OUT_CODES : OUT_COPY, t, w};
        if (!w) continue;
        if (w == &m->w.output) *head_q = true;
        ot[k - 1].type = DT_F8_E4M3;
        size_t l = strlen(t->name);
        if (!(names[i] = malloc(l + 7))) return err_set(err, "out of memory");
        snprintf(names[i], l + 7, "%s_scale", t->name);
        ot[k] = (SafetensorsOutTensor){names[i], DT_F32, 2, {1, (uint64_t)w->rows, 1, 1}};
        src[k++] = (OutSource){OUT_SCALE, NULL, w};
    }
    *n_out = k;
    return 0;
}

int quantize_fp8_checkpoint(const char *in_path, const char *out_dir, Err *err) {
    Model m;
    if (model_load(&m, in_path, MODEL_LOAD_WEIGHTS_FP8, err)) return -1;
    int rc = 0;
    if (m.is_gguf)
        rc = err_set(err, "%s: --type fp8 writes a safetensors checkpoint and reads a safetensors model folder "
                     "(config.json, tokenizer.json); this is a GGUF file", in_path);
    else if (m.quant.fp8)
        rc = err_set(err, "%s: already quantized (quantization_config quant_method '%s')", in_path, m.quant.method);
    else if (m.cfg.n_experts > 0)
        rc = err_set(err, "%s: --type fp8 of mixture-of-experts models is not supported yet", in_path);
    if (rc == 0 && mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        rc = err_set(err, "%s: cannot create the folder: %s", out_dir, strerror(errno));
    uint64_t n = m.st.n_tensors, n_out = 0;
    SafetensorsOutTensor *ot = calloc(2 * n + 1, sizeof *ot);
    OutSource *src = calloc(2 * n + 1, sizeof *src);
    char **names = calloc(n + 1, sizeof *names);
    bool head_q = false;
    if (rc == 0 && (!ot || !src || !names)) rc = err_set(err, "out of memory");
    if (rc == 0) rc = plan_tensors(&m, ot, src, names, &n_out, &head_q, err);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (rc == 0) rc = safetensors_write(path, ot, n_out, fill, src, err);
    if (rc == 0) rc = write_config(m.st.dir, out_dir, head_q, err);
    const char *side[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                          "special_tokens_map.json", "chat_template.jinja"};
    for (size_t i = 0; rc == 0 && i < sizeof side / sizeof *side; i++) rc = copy_side_file(m.st.dir, out_dir, side[i], err);
    for (uint64_t i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(ot);
    free(src);
    model_free(&m);
    return rc;
}
