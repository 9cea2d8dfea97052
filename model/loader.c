/* loader.c — opens a model file or folder, reads its config, binds every
 * weight role to a tensor (name, dtype and shape checked, errors naming the
 * tensor), and loads the tokenizer. See model.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/detect.h"
#include "model/dummy.h"
#include "model/loader_internal.h"
#include "model/tensor_names.h"

int model_own(Model *m, void *p, Err *err) {
    if (!p) return err_set(err, "%s: out of memory converting weights", m->path);
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) { free(p); return err_set(err, "%s: out of memory", m->path); }
        m->owned = o; m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

const TensorInfo *model_find(const Model *m, const char *name) {
    return m->is_gguf ? gguf_find_tensor(&m->gguf, name) : safetensors_find(&m->st, name);
}

void model_mark_used(Model *m, const TensorInfo *t) {
    const TensorInfo *base = m->is_gguf ? m->gguf.tensors : m->st.tensors;
    if (m->tensor_used && t >= base && t < base + model_tensor_count(m)) m->tensor_used[t - base] = true;
}

/* The alignment the ops' typed reads of t need: its block's size up to the
 * largest power of two dividing it (an array of blocks is aligned to no
 * more), capped at 16 (what malloc gives). */
static uint64_t type_alignment(DType t) {
    uint64_t b = (uint64_t)dtype_info((uint32_t)t)->block_bytes, a = b & (~b + 1);
    return a > 16 ? 16 : a;
}

/* GGUF general.alignment 1, 2 or 4, or a safetensors header of odd length,
 * can place a tensor's bytes where the ops' typed reads of them would be
 * misaligned (undefined behaviour): such a tensor is copied to a buffer
 * the model owns. */
static int model_realign(Model *m, WeightRef *w, const TensorInfo *t, Err *err) {
    if ((uintptr_t)t->data % type_alignment(t->type) == 0) return 0;
    void *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (model_own(m, copy, err)) return -1;
    memcpy(copy, t->data, t->nbytes);
    w->data = copy;
    return 0;
}

/* The shared random values of dummy tensors of type t, grown to the
 * largest (dummy_fill: the same values every time). A smaller buffer stays
 * alive: tensors bound earlier point into it. */
static int dummy_reserve(Model *m, DType t, uint64_t bytes, Err *err) {
    if (bytes <= m->dummy_bytes[t]) return 0;
    void *d = malloc(bytes);
    if (!d) return err_set(err, "%s: out of memory for %llu bytes of dummy weights", m->path, (unsigned long long)bytes);
    if (model_own(m, d, err)) return -1;
    dummy_fill(t, d, bytes);
    m->dummy_data[t] = d;
    m->dummy_bytes[t] = bytes;
    return 0;
}

/* A dummy FP8 matrix's row scales: a shared vector of dummy_fp8_scale(),
 * grown to the most rows (as dummy_reserve). */
static int dummy_fp8_bind(Model *m, WeightRef *w, Err *err) {
    if (w->rows > m->dummy_fp8_rows) {
        float *s = malloc((size_t)w->rows * sizeof *s);
        if (model_own(m, s, err)) return -1;
        const float v = dummy_fp8_scale();
        for (int64_t r = 0; r < w->rows; r++) s[r] = v;
        m->dummy_fp8_scales = s;
        m->dummy_fp8_rows = w->rows;
    }
    w->scale = m->dummy_fp8_scales;
    return 0;
}

/* A new entry of the dummy tensor list (model_tensor_at lists it, as a
 * file's tensors are; nothing keeps a pointer to an entry, so the list may
 * move when it grows). */
static TensorInfo *dummy_slot(Model *m, Err *err) {
    if (m->n_dummy == m->cap_dummy) {
        uint64_t cap = m->cap_dummy ? 2 * m->cap_dummy : 256;
        TensorInfo *d = realloc(m->dummy_tensors, cap * sizeof *d);
        if (!d) return err_set(err, "%s: out of memory", m->path), NULL;
        m->dummy_tensors = d;
        m->cap_dummy = cap;
    }
    TensorInfo *t = &m->dummy_tensors[m->n_dummy++];
    memset(t, 0, sizeof *t);
    return t;
}

/* A dummy tensor of shape want ([n_mats][rows][cols] as model_bind asks for
 * it) in type (dummy_tensor_type: bf16 for vectors and partial blocks). */
static const TensorInfo *dummy_tensor(Model *m, const char *name, const uint64_t want[TENSOR_MAX_DIMS], int64_t rows,
                                      DType type, Err *err) {
    char *nm = strdup(name);
    if (model_own(m, nm, err)) return NULL;
    TensorInfo *t = dummy_slot(m, err);
    if (!t) return NULL;
    t->name = nm;
    t->n_dims = want[2] > 1 ? 3 : want[1] > 1 ? 2 : 1;
    memcpy(t->ne, want, sizeof t->ne);
    /* FP8 for single matrices only (a stack of experts stays bf16, as checkpoints keep it) */
    t->type = dummy_tensor_type(type == DT_F8_E4M3 && want[2] > 1 ? DT_BF16 : type, rows, (int64_t)want[0]);
    t->nbytes = dtype_row_bytes(t->type, want[0]) * (tensor_nelems(t) / want[0]);
    if (dummy_reserve(m, t->type, t->nbytes, err)) return NULL;
    t->data = m->dummy_data[t->type];
    return t;
}

uint64_t model_tensor_count(const Model *m) {
    return m->dummy ? m->n_dummy : m->is_gguf ? m->gguf.n_tensors : m->st.n_tensors;
}

const TensorInfo *model_tensor_at(const Model *m, uint64_t i) {
    if (i >= model_tensor_count(m)) return NULL;
    return m->dummy ? &m->dummy_tensors[i] : m->is_gguf ? &m->gguf.tensors[i] : &m->st.tensors[i];
}

/* Converts any-dtype rows to a new fp32 buffer the model owns (FP8 rows
 * times their scales). */
static int model_to_f32(Model *m, WeightRef *w, Err *err) {
    int64_t rows = w->rows * w->n_mats;
    float *f = malloc((size_t)rows * w->cols * sizeof *f);
    if (model_own(m, f, err)) return -1;
    for (int64_t r = 0; r < rows; r++) {
        dequantize_row(w->type, (const char *)w->data + r * w->row_bytes, f + r * w->cols, w->cols);
        if (w->scale)
            for (int64_t c = 0; c < w->cols; c++) f[r * w->cols + c] *= w->scale[r];
    }
    w->scale = NULL;
    w->input_scale = 0;
    w->data = f;
    w->type = DT_F32;
    w->row_bytes = w->cols * sizeof(float);
    return 0;
}

/* Binds name to w after checking its shape against [n_mats][rows][cols]. A
 * vector (rows == 1) is converted to fp32 so every backend can read it
 * directly. With dummy weights a required tensor is made up in the type
 * dummy (the caller's choice for the role; see model/dummy.h). */
static int model_bind(Model *m, WeightRef *w, const char *name, int64_t n_mats, int64_t rows, int64_t cols,
                      bool required, DType dummy, Err *err) {
    uint64_t want[TENSOR_MAX_DIMS] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)n_mats, 1};
    if (rows == 1) { want[1] = n_mats; want[2] = 1; }
    const TensorInfo *t = !m->dummy ? model_find(m, name)
                          : required ? dummy_tensor(m, name, want, rows, dummy, err) : NULL;
    memset(w, 0, sizeof *w);
    if (m->dummy && required && !t) return -1;
    if (!t) {
        if (!required) return 0;
        return err_set(err, "%s: tensor '%s' is missing (needed by the %s architecture)", m->path, name,
                       arch_name(m->cfg.arch));
    }
    if (memcmp(want, t->ne, sizeof want) != 0)
        return err_set(err, "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu] (innermost first), expected "
                       "[%llu, %llu, %llu, 1]", m->path, name, (unsigned long long)t->ne[0],
                       (unsigned long long)t->ne[1], (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                       (unsigned long long)want[0], (unsigned long long)want[1], (unsigned long long)want[2]);
    *w = (WeightRef){t->data, t->type, rows, cols, n_mats, dtype_row_bytes(t->type, cols), t->name, NULL, 0, 0};
    m->n_params += tensor_nelems(t);
    m->weight_bytes += t->nbytes;
    model_mark_used(m, t);
    if (!m->dummy && model_realign(m, w, t, err)) return -1;
    if (t->type == DT_F8_E4M3) {
        if (rows == 1 || n_mats != 1)
            return err_set(err, "%s: tensor '%s' is F8_E4M3: cllm reads FP8 for single weight matrices only "
                           "(not vectors or stacked experts)", m->path, name);
        if (m->dummy ? dummy_fp8_bind(m, w, err) : fp8_bind_scales(m, w, t, err)) return -1;
    }
    return rows == 1 && t->type != DT_F32 ? model_to_f32(m, w, err) : 0;
}

/* [n_mats, rows, cols] of a layer role. */
static void shape_dims(const ModelConfig *c, TensorShape s, bool experts, int64_t d[3]) {
    int64_t C = c->dim, F = c->ffn_dim, E = experts ? c->n_experts : 1;
    int64_t q = (int64_t)c->n_heads * c->head_dim_k, k = (int64_t)c->n_kv_heads * c->head_dim_k;
    int64_t v = (int64_t)c->n_kv_heads * c->head_dim_v, o = (int64_t)c->n_heads * c->head_dim_v;
    int64_t t[][3] = {
        [SHAPE_VEC_C] = {E, 1, C}, [SHAPE_VEC_D] = {1, 1, c->head_dim_k}, [SHAPE_VEC_H] = {1, 1, c->n_heads},
        [SHAPE_Q] = {1, q, C}, [SHAPE_K] = {1, k, C}, [SHAPE_V] = {1, v, C}, [SHAPE_O] = {1, C, o},
        [SHAPE_BQ] = {1, 1, q}, [SHAPE_BK] = {1, 1, k}, [SHAPE_BV] = {1, 1, v},
        [SHAPE_GATE] = {E, F, C}, [SHAPE_DOWN] = {E, C, F}, [SHAPE_BGATE] = {E, 1, F},
        [SHAPE_ROUTER] = {1, c->n_experts, C}, [SHAPE_VEC_E] = {1, 1, c->n_experts},
    };
    memcpy(d, t[s], sizeof t[s]);
}

static bool layer_field_is_expert(size_t off) {
    return off == offsetof(LayerWeights, w_gate) || off == offsetof(LayerWeights, w_up) ||
           off == offsetof(LayerWeights, w_down) || off == offsetof(LayerWeights, b_gate) ||
           off == offsetof(LayerWeights, b_up) || off == offsetof(LayerWeights, b_down);
}

/* HF gpt-oss stores experts as x @ W ([E][in][out]) with gate and up
 * interleaved in the columns (gate = even, up = odd). Rewrites them as
 * Linear-layout fp32 matrices. */
static int model_bind_hf_gpt_oss_experts(Model *m, int l, LayerWeights *lw, Err *err) {
    const ModelConfig *c = &m->cfg;
    int64_t E = c->n_experts, C = c->dim, F = c->ffn_dim;
    char name[256];
    WeightRef gu, gub, dn, dnb;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
    if (model_bind(m, &gu, name, E, C, 2 * F, true, m->dummy_type, err)) return -1;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    if (model_bind(m, &gub, name, 1, E, 2 * F, true, DT_BF16, err)) return -1; /* E biases: vectors */
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
    if (model_bind(m, &dn, name, E, F, C, true, m->dummy_type, err)) return -1;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_bias", l);
    if (model_bind(m, &dnb, name, 1, E, C, true, DT_BF16, err)) return -1;
    if (model_to_f32(m, &gu, err) || model_to_f32(m, &gub, err) || model_to_f32(m, &dn, err) ||
        model_to_f32(m, &dnb, err))
        return -1;
    float *g = malloc(E * F * C * sizeof *g), *u = malloc(E * F * C * sizeof *u), *d = malloc(E * C * F * sizeof *d);
    float *bg = malloc(E * F * sizeof *bg), *bu = malloc(E * F * sizeof *bu);
    if (model_own(m, g, err) || model_own(m, u, err) || model_own(m, d, err) || model_own(m, bg, err) ||
        model_own(m, bu, err))
        return -1;
    const float *GU = gu.data, *GUB = gub.data, *DN = dn.data;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t f = 0; f < F; f++) {
            for (int64_t i = 0; i < C; i++) {
                g[(e * F + f) * C + i] = GU[(e * C + i) * 2 * F + 2 * f];
                u[(e * F + f) * C + i] = GU[(e * C + i) * 2 * F + 2 * f + 1];
                d[(e * C + i) * F + f] = DN[(e * F + f) * C + i];
            }
            bg[e * F + f] = GUB[e * 2 * F + 2 * f];
            bu[e * F + f] = GUB[e * 2 * F + 2 * f + 1];
        }
    }
    WeightRef mat = {NULL, DT_F32, F, C, E, C * sizeof(float), gu.name, NULL, 0, 0};
    lw->w_gate = mat; lw->w_gate.data = g;
    lw->w_up = mat; lw->w_up.data = u;
    lw->w_down = (WeightRef){d, DT_F32, C, F, E, F * sizeof(float), dn.name, NULL, 0, 0};
    lw->b_gate = (WeightRef){bg, DT_F32, 1, F, E, F * sizeof(float), gub.name, NULL, 0, 0};
    lw->b_up = lw->b_gate; lw->b_up.data = bu;
    lw->b_down = (WeightRef){dnb.data, DT_F32, 1, C, E, C * sizeof(float), dnb.name, NULL, 0, 0};
    return 0;
}

static int model_bind_layers(Model *m, Err *err) {
    const ModelConfig *c = &m->cfg;
    m->w.layers = calloc(c->n_layers, sizeof *m->w.layers);
    if (!m->w.layers) return err_set(err, "%s: out of memory", m->path);
    const LayerTensorName *names = tensor_names_layer(c);
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *lw = &m->w.layers[l];
        for (const LayerTensorName *n = names; n->pattern; n++) {
            char name[256];
            int64_t d[3];
            snprintf(name, sizeof name, n->pattern, l);
            shape_dims(c, n->shape, c->n_experts > 0 && layer_field_is_expert(n->offset), d);
            WeightRef *w = (WeightRef *)((char *)lw + n->offset);
            DType dummy = n->shape == SHAPE_ROUTER ? DT_BF16 : m->dummy_type; /* routers stay unquantized */
            if (model_bind(m, w, name, d[0], d[1], d[2], n->required, dummy, err)) return -1;
        }
        if (c->n_experts > 0 && c->source == SRC_HF && model_bind_hf_gpt_oss_experts(m, l, lw, err)) return -1;
        if (c->qk_norm && (!lw->q_norm.data || !lw->k_norm.data))
            return err_set(err, "%s: layer %d lacks the q/k norm weights the %s architecture needs", m->path, l,
                           arch_name(c->arch));
    }
    return 0;
}

/* Dummy tensors of one type share their values, so an untied LM head of the
 * embedding's type (Q8_0, bf16) would point at the embedding's data, which
 * is how the backends and the benchmark tell a tied head (a Q8_0 8B model
 * then decoded with a bf16 head, 1 GB read where the file has 0.56 GB):
 * such a head gets values of its own. */
static int dummy_head_apart(Model *m, Err *err) {
    WeightRef *w = &m->w.output;
    uint64_t bytes = (uint64_t)w->row_bytes * (uint64_t)w->rows * (uint64_t)w->n_mats;
    void *d = malloc(bytes);
    if (!d) return err_set(err, "%s: out of memory for %llu bytes of a dummy LM head", m->path, (unsigned long long)bytes);
    if (model_own(m, d, err)) return -1;
    memcpy(d, w->data, bytes);
    w->data = d;
    for (uint64_t i = 0; i < m->n_dummy; i++) /* its listing (model_tensor_at) too */
        if (m->dummy_tensors[i].name == w->name) m->dummy_tensors[i].data = d;
    return 0;
}

static int model_bind_globals(Model *m, Err *err) {
    const ModelConfig *c = &m->cfg;
    GlobalTensorNames g = tensor_names_global(c->source);
    DType t = m->dummy_type;
    DType embd = t == DT_F8_E4M3 ? DT_BF16 : t; /* the lookup reads rows without scales */
    if (model_bind(m, &m->w.tok_embd, g.tok_embd, 1, c->vocab, c->dim, true, embd, err) ||
        model_bind(m, &m->w.output_norm, g.output_norm, 1, 1, c->dim, true, DT_BF16, err) ||
        model_bind(m, &m->w.output, g.output, 1, c->vocab, c->dim, !c->tied_embeddings, dummy_head_type(t), err))
        return -1;
    if (m->w.tok_embd.type == DT_F8_E4M3) /* the embedding lookup reads rows without scales */
        return err_set(err, "%s: tensor '%s' is F8_E4M3: an FP8 embedding table is not supported", m->path,
                       m->w.tok_embd.name);
    if (!m->w.output.data) m->w.output = m->w.tok_embd;
    else if (m->dummy && m->w.output.data == m->w.tok_embd.data && dummy_head_apart(m, err)) return -1;
    if (g.rope_freqs && model_bind(m, &m->w.rope_freqs, g.rope_freqs, 1, 1, c->rope_dim / 2, false, DT_BF16, err))
        return -1;
    return 0;
}

static bool path_is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static bool path_is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

static int model_open_hf(Model *m, int flags, Err *err) {
    if (m->dummy) {
        if (!path_is_dir(m->path)) return err_set(err, "%s: dummy weights need a folder with config.json", m->path);
        m->st.dir = strdup(m->path);
        if (!m->st.dir) return err_set(err, "out of memory");
    } else if (safetensors_open(&m->st, m->path, err)) {
        return -1;
    }
    char cfg_path[4096], tok_path[4096], tokcfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", m->st.dir);
    Json *cj = json_parse_file(cfg_path, err);
    if (!cj) return -1;
    int rc = config_from_hf(&m->cfg, json_root(cj), cfg_path, err);
    if (rc == 0) rc = quant_config_from_hf(&m->quant, json_root(cj), cfg_path, err);
    json_free(cj);
    if (rc || generation_defaults_from_hf(&m->gen, m->st.dir, err)) return -1;
    if (!m->cfg.name[0]) {
        const char *slash = strrchr(m->st.dir, '/');
        snprintf(m->cfg.name, sizeof m->cfg.name, "%s", slash ? slash + 1 : m->st.dir);
    }
    if (flags & MODEL_LOAD_NO_TOKENIZER) return 0;
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", m->st.dir);
    snprintf(tokcfg_path, sizeof tokcfg_path, "%s/tokenizer_config.json", m->st.dir);
    if (!path_is_file(tok_path))
        return err_set(err, "%s: no tokenizer.json beside the weights (needed for text input)", m->st.dir);
    return tokenizer_load_hf(&m->tok, tok_path, path_is_file(tokcfg_path) ? tokcfg_path : NULL, err);
}

static int model_open_gguf(Model *m, int flags, Err *err) {
    if (gguf_open(&m->gguf, m->path, err) || config_from_gguf(&m->cfg, &m->gguf, err) ||
        generation_defaults_from_gguf(&m->gen, &m->gguf, err))
        return -1;
    if (flags & MODEL_LOAD_NO_TOKENIZER) return 0;
    return tokenizer_load_gguf(&m->tok, &m->gguf, err);
}

/* After binding: the file's tensors no weight role read, kept in m->unused
 * (the commands warn of them: app_warn_unused; `cllm info` lists them): a
 * tensor the file holds and cllm ignores usually means a feature it does not
 * apply. */
static int model_find_unused(Model *m, Err *err) {
    uint64_t n = model_tensor_count(m);
    if (m->quant.fp8) /* scales no FP8 weight reads (dynamic input_scale, KV k_scale / v_scale): nothing ignored */
        for (uint64_t i = 0; i < n; i++) {
            const char *nm = model_tensor_at(m, i)->name;
            size_t l = strlen(nm);
            if (l >= 6 && !strcmp(nm + l - 6, "_scale")) m->tensor_used[i] = true;
        }
    for (uint64_t i = 0; i < n; i++) m->n_unused += !m->tensor_used[i];
    if (!m->n_unused) return 0;
    m->unused = malloc(m->n_unused * sizeof *m->unused);
    if (!m->unused) return err_set(err, "%s: out of memory", m->path);
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        if (!m->tensor_used[i]) m->unused[k++] = model_tensor_at(m, i)->name;
    return 0;
}

/* model_load and model_load_dummy: dummy_type is the matrices' type when
 * flags has MODEL_LOAD_DUMMY_WEIGHTS. */
static int model_load_as(Model *m, const char *path, int flags, DType dummy_type, Err *err) {
    memset(m, 0, sizeof *m);
    m->dummy_type = dummy_type;
    m->path = strdup(path);
    if (!m->path) return err_set(err, "out of memory");
    int rc;
    ModelFileKind kind;
    if (!path_is_dir(path) && !path_is_file(path)) {
        rc = err_set(err, "%s: no such file or folder", path);
    } else if (flags & MODEL_LOAD_DUMMY_WEIGHTS) {
        m->dummy = true;
        rc = model_open_hf(m, flags, err);
    } else if (model_file_detect(path, &kind, err)) { /* by the first bytes: a clear error for what is no model */
        rc = -1;
    } else if (kind == MODEL_FILE_GGUF) {
        m->is_gguf = true;
        rc = model_open_gguf(m, flags, err);
    } else {
        rc = model_open_hf(m, flags, err);
    }
    if (rc == 0 && !m->dummy && !(m->tensor_used = calloc(model_tensor_count(m) + 1, sizeof *m->tensor_used)))
        rc = err_set(err, "%s: out of memory", path);
    if (rc == 0) rc = model_bind_globals(m, err);
    if (rc == 0) rc = model_bind_layers(m, err);
    if (rc == 0) rc = kv_bind_scales(m, err);
    if (rc == 0 && (flags & MODEL_LOAD_WEIGHTS_FP8)) rc = fp8_quantize_weights(m, err);
    if (rc == 0 && !m->dummy) rc = model_find_unused(m, err);
    if (rc == 0) rc = model_shape_build(&m->shape, &m->cfg, &m->w.rope_freqs, err);
    if (rc) model_free(m);
    return rc;
}

int model_load(Model *m, const char *path, int flags, Err *err) {
    return model_load_as(m, path, flags, DT_BF16, err);
}

int model_load_dummy(Model *m, const char *path, int flags, DType type, Err *err) {
    if (!dummy_type_supported(type)) {
        memset(m, 0, sizeof *m);
        const DTypeInfo *info = dtype_info((uint32_t)type);
        return err_set(err, "%s: dummy weights of type %s: cllm makes them in %s", path, info ? info->name : "?",
                       DUMMY_TYPE_NAMES);
    }
    return model_load_as(m, path, flags | MODEL_LOAD_DUMMY_WEIGHTS, type, err);
}

void model_free(Model *m) {
    if (m->tok) tokenizer_free(m->tok);
    if (m->is_gguf) gguf_close(&m->gguf);
    else safetensors_close(&m->st);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->dummy_tensors);
    free(m->tensor_used);
    free(m->unused);
    free(m->w.layers);
    free(m->path);
    model_shape_free(&m->shape);
    memset(m, 0, sizeof *m);
}
