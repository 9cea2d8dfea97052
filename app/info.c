/* info.c — `cllm info`: what a model file holds and what running it costs. */
#include "app/info.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/models.h"
#include "model/forward.h"
#include "parallel/placement.h"
#include "parallel/stage.h"
#include "parallel/stage_plan.h"
#include "parallel/tp_plan.h"
#include "tokenizer/chat_template.h"

/* GPU 0's plan for m at the defaults of chat/generate (--gpu-mem-util 0.9,
 * 256-token steps, blocks of 16): the weights as it holds them (quantized
 * matrices stay quantized) and the tokens of KV cache that fit, bf16 and fp8;
 * false without a GPU. */
static bool gpu_plan(const Model *m, uint64_t *wbytes, int64_t tokens[2]) {
    if (backend_gpu_count(NULL) == 0) return false;
    BackendOptions o = {.device = 0, .block_size = 16, .max_tokens = 256, .mem_util = 0.9f};
    forward_buffer_elems(&m->cfg, o.max_tokens, &o.act_elems, &o.f32_elems);
    Err err = {{0}};
    for (int i = 0; i < 2; i++) {
        o.kv_dtype = i ? KV_DTYPE_FP8 : KV_DTYPE_BF16;
        if (backend_gpu_plan(&m->shape, &m->w, &o, wbytes, &tokens[i], &err)) return false;
    }
    return true;
}

static void print_kv_fit(FILE *out, const int64_t tokens[2]) {
    fprintf(out, "%-22s %lld tokens on GPU 0 (%lld blocks of 16; --gpu-mem-util 0.9)\n", "KV cache fits (bf16)",
            (long long)tokens[0], (long long)tokens[0] / 16);
    fprintf(out, "%-22s %lld tokens on GPU 0 (%lld blocks of 16; %.2fx bf16)\n", "KV cache fits (fp8)",
            (long long)tokens[1], (long long)tokens[1] / 16, tokens[0] > 0 ? (double)tokens[1] / tokens[0] : 0.0);
}

static void print_size(FILE *out, const char *label, double bytes) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) { bytes /= 1024; u++; }
    fprintf(out, "%-22s %.2f %s\n", label, bytes, unit[u]);
}

static void print_windows(FILE *out, const ModelConfig *c) {
    int n_win = 0;
    for (int l = 0; l < c->n_layers; l++) n_win += c->layer_window[l] > 0;
    if (n_win == 0) { fprintf(out, "%-22s none (all layers global)\n", "sliding window"); return; }
    fprintf(out, "%-22s %d of %d layers windowed:", "sliding window", n_win, c->n_layers);
    for (int l = 0; l < c->n_layers && l < 48; l++) fprintf(out, " %d", c->layer_window[l]);
    fprintf(out, c->n_layers > 48 ? " ...\n" : "\n");
}

static void print_rope(FILE *out, const ModelConfig *c) {
    static const char *scaling[] = {"none", "linear", "llama3", "yarn"};
    fprintf(out, "%-22s %s layout, %d dims, base %g", "rope", c->rope_neox ? "neox" : "interleaved", c->rope_dim,
            c->rope_theta);
    if (c->rope_theta_local != c->rope_theta) fprintf(out, " (windowed layers %g)", c->rope_theta_local);
    fprintf(out, ", scaling %s", scaling[c->rope_scaling.type]);
    if (c->rope_scaling.type != ROPE_SCALING_NONE) fprintf(out, " x%g", c->rope_scaling.factor);
    fprintf(out, "\n");
}

/* The biases the forward pass adds, as the loader bound them (any layer). */
static void print_biases(FILE *out, const Model *m) {
    static const struct { size_t off; const char *name; } B[] = {
        {offsetof(LayerWeights, bq), "q"}, {offsetof(LayerWeights, bk), "k"}, {offsetof(LayerWeights, bv), "v"},
        {offsetof(LayerWeights, bo), "o"}, {offsetof(LayerWeights, b_gate), "gate"},
        {offsetof(LayerWeights, b_up), "up"}, {offsetof(LayerWeights, b_down), "down"},
    };
    int n = 0;
    fprintf(out, "%-22s", "biases");
    for (size_t i = 0; i < sizeof B / sizeof B[0]; i++) {
        int layers = 0;
        for (int l = 0; l < m->cfg.n_layers; l++)
            layers += ((const WeightRef *)((const char *)&m->w.layers[l] + B[i].off))->data != NULL;
        if (!layers) continue;
        fprintf(out, "%s %s", n++ ? "," : "", B[i].name);
        if (layers < m->cfg.n_layers) fprintf(out, " (%d of %d layers)", layers, m->cfg.n_layers);
    }
    fprintf(out, n ? "\n" : " none\n");
}

static void print_unused(FILE *out, const Model *m) {
    fprintf(out, "%-22s %llu%s\n", "unused tensors", (unsigned long long)m->n_unused,
            m->n_unused ? " (in the file, read by nothing: ignored)" : "");
    for (uint64_t i = 0; i < m->n_unused; i++) fprintf(out, "%-22s %s\n", "", m->unused[i]);
}

/* An FP8 matrix's scale as the file has it: "per-tensor" (one value),
 * "per-channel" (one per row), or "per-row, made at load" for a matrix
 * --weights fp8 quantized (no scale tensor in the file). */
static const char *fp8_scale_kind(const Model *m, const char *name) {
    char sn[512];
    size_t l = strlen(name), k = l >= 6 && !strcmp(name + l - 6, "weight") ? l - 6 : l;
    snprintf(sn, sizeof sn, "%.*sweight_scale", (int)k, name);
    const TensorInfo *s = m->is_gguf || m->dummy ? NULL : safetensors_find(&m->st, sn);
    if (!s) return "per-row, made at load";
    return tensor_nelems(s) == 1 ? "per-tensor" : "per-channel";
}

/* The FP8 matrices bound, by scale kind, and how activations are scaled. */
static void print_fp8(FILE *out, const Model *m) {
    int n_tensor = 0, n_channel = 0, n_load = 0;
    for (int l = 0; l <= m->cfg.n_layers; l++) {
        const LayerWeights *lw = l < m->cfg.n_layers ? &m->w.layers[l] : NULL;
        const WeightRef *mats[7] = {&m->w.output};
        int n = 1;
        if (lw) {
            const WeightRef *lm[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
            memcpy(mats, lm, sizeof lm);
            n = 7;
        }
        for (int i = 0; i < n; i++) {
            if (mats[i]->type != DT_F8_E4M3 || !mats[i]->data) continue;
            const char *k = fp8_scale_kind(m, mats[i]->name);
            if (!strcmp(k, "per-tensor")) n_tensor++;
            else if (!strcmp(k, "per-channel")) n_channel++;
            else n_load++;
        }
    }
    if (!n_tensor && !n_channel && !n_load) return;
    fprintf(out, "%-22s %d matrices in e4m3:", "fp8 weights", n_tensor + n_channel + n_load);
    if (n_tensor) fprintf(out, " %d with a per-tensor scale,", n_tensor);
    if (n_channel) fprintf(out, " %d with per-channel scales,", n_channel);
    if (n_load) fprintf(out, " %d with per-row scales made at load,", n_load);
    fprintf(out, " activations %s", m->quant.static_input ? "static (input_scale)" : "dynamic per token");
    if (m->quant.fp8) fprintf(out, " (quantization_config '%s')", m->quant.method);
    fprintf(out, "\n");
}

void model_print_info(FILE *out, const Model *m, int kv_tokens, KVDtype kv_dtype, const char *chat_family) {
    const ModelConfig *c = &m->cfg;
    static const char *act[] = {"SwiGLU (silu)", "GeGLU (gelu tanh)", "SwiGLU (gpt-oss, clamped)"};
    fprintf(out, "%-22s %s\n", "file", m->path);
    fprintf(out, "%-22s %s (%s)\n", "format", m->is_gguf ? "GGUF" : "safetensors",
            m->is_gguf ? (m->gguf.version == 2 ? "v2" : "v3") : (m->st.n_shards > 1 ? "sharded" : "single file"));
    fprintf(out, "%-22s %s\n", "name", c->name[0] ? c->name : "-");
    fprintf(out, "%-22s %s\n", "architecture", arch_name(c->arch));
    fprintf(out, "%-22s %d\n", "layers", c->n_layers);
    fprintf(out, "%-22s %d\n", "hidden size", c->dim);
    fprintf(out, "%-22s %d%s\n", "ffn size", c->ffn_dim, c->n_experts ? " (per expert)" : "");
    fprintf(out, "%-22s %d query, %d KV (head size K %d, V %d)\n", "heads", c->n_heads, c->n_kv_heads, c->head_dim_k,
            c->head_dim_v);
    fprintf(out, "%-22s %d\n", "vocabulary", c->vocab);
    fprintf(out, "%-22s %d\n", "context length", c->ctx_len);
    print_rope(out, c);
    print_windows(out, c);
    fprintf(out, "%-22s eps %g%s\n", "rms norm", c->norm_eps, c->norm_offset ? ", weight + 1" : "");
    fprintf(out, "%-22s %s\n", "activation", act[c->act]);
    fprintf(out, "%-22s attention %g, final %g\n", "soft-caps", c->attn_softcap, c->final_softcap);
    fprintf(out, "%-22s qk-norm %s, sinks %s, post-norms %s, tied embeddings %s\n", "features",
            c->qk_norm ? "yes" : "no", c->sinks ? "yes" : "no", c->post_norms ? "yes" : "no",
            c->tied_embeddings ? "yes" : "no");
    print_biases(out, m);
    if (c->n_experts) fprintf(out, "%-22s %d experts, %d per token\n", "mixture of experts", c->n_experts, c->n_experts_used);
    if (m->tok)
        fprintf(out, "%-22s %s, %d tokens, bos %d, eos %d\n", "tokenizer",
                tokenizer_kind(m->tok) == TOK_SPM ? "SentencePiece-style" : "byte-level BPE",
                tokenizer_n_vocab(m->tok), tokenizer_bos(m->tok), tokenizer_eos(m->tok));
    fprintf(out, "%-22s %s\n", "chat template", chat_family ? chat_family : "none");

    uint64_t count[DT_COUNT] = {0}, n = model_tensor_count(m);
    for (uint64_t i = 0; i < n; i++) count[model_tensor_at(m, i)->type]++;
    fprintf(out, "%-22s %llu:", "tensors", (unsigned long long)n);
    for (int t = 0; t < DT_COUNT; t++)
        if (count[t]) fprintf(out, " %s x%llu", dtype_info(t)->name, (unsigned long long)count[t]);
    fprintf(out, "\n");
    print_unused(out, m);
    print_fp8(out, m);
    fprintf(out, "%-22s %.3f B (%llu)\n", "parameters", m->n_params / 1e9, (unsigned long long)m->n_params);
    print_size(out, "weights as stored", (double)m->weight_bytes);
    print_size(out, "weights in bf16", (double)m->n_params * 2);
    uint64_t gpu_bytes = 0;
    int64_t kv_fit[2] = {0, 0};
    bool gpu = gpu_plan(m, &gpu_bytes, kv_fit);
    if (gpu) print_size(out, "weights on the GPU", (double)gpu_bytes);
    char label[64];
    snprintf(label, sizeof label, "KV cache, %d tokens%s", kv_tokens, kv_dtype == KV_DTYPE_FP8 ? ", fp8" : "");
    print_size(out, label, (double)config_kv_bytes_per_token(c, kv_dtype) * kv_tokens);
    fprintf(out, "%-22s %llu bytes per token (bf16), %llu (fp8: e4m3 + a scale per KV head)\n", "",
            (unsigned long long)config_kv_bytes_per_token(c, KV_DTYPE_BF16),
            (unsigned long long)config_kv_bytes_per_token(c, KV_DTYPE_FP8));
    if (c->n_layers > 0 && m->w.layers && m->w.layers[0].kv_scales.data)
        fprintf(out, "%-22s static fp8 scales in the checkpoint ('%s' ...): --kv-dtype fp8 uses them\n", "",
                m->w.layers[0].kv_scales.name);
    if (gpu) print_kv_fit(out, kv_fit);
}

void model_print_tensors(FILE *out, const Model *m) {
    uint64_t n = model_tensor_count(m);
    for (uint64_t i = 0; i < n; i++) {
        const TensorInfo *t = model_tensor_at(m, i);
        const char *kind = t->type == DT_F8_E4M3 ? fp8_scale_kind(m, t->name) : NULL;
        fprintf(out, "%-48s %-6s [", t->name, dtype_info(t->type)->name);
        for (int d = 0; d < t->n_dims; d++) fprintf(out, d ? ", %llu" : "%llu", (unsigned long long)t->ne[d]);
        fprintf(out, "] %llu bytes%s%s\n", (unsigned long long)t->nbytes, kind ? ", scale " : "", kind ? kind : "");
    }
}

/* ---------- `cllm info` ---------- */

/* `info --pp N [--pp-split S]`: the stage split (checked before anything
 * is printed), then the memory per GPU. */
static int plan_pipeline(const Model *m, int pp, const char *split, StagePlan *plan) {
    Err err = {{0}};
    if (pp <= 0 && split) { /* the stage count from the split itself */
        pp = 1;
        for (const char *c = split; *c; c++) pp += *c == ',';
    }
    if (pp > STAGE_MAX) err_set(&err, "--pp %d: at most %d stages", pp, STAGE_MAX);
    else if (pp > m->cfg.n_layers) err_set(&err, "--pp %d: the model has only %d layers", pp, m->cfg.n_layers);
    int rc = err.msg[0] ? -1
             : split ? stage_plan_parse(plan, &m->cfg, &m->w, pp, split, &err)
                     : stage_plan_balanced(plan, &m->cfg, &m->w, pp, &err);
    if (rc) { fprintf(stderr, "cllm info: %s\n", err.msg); return 2; }
    return 0;
}

/* `info --tp N`: every stage's split over the ranks (the model as one
 * stage without --pp), checked before anything is printed. */
static int plan_tensor_parallel(const Model *m, const StagePlan *plan, int tp, TpPlan *tps) {
    Err err = {{0}};
    int n = plan ? plan->n_stages : 1;
    for (int s = 0; s < n; s++) {
        StageModel sm;
        if (plan && stage_model_make(&sm, &m->cfg, &m->shape, &m->w, plan, s, &err)) break;
        if (tp_plan_make(&tps[s], plan ? &sm.cfg : &m->cfg, plan ? &sm.w : &m->w, tp, &err)) break;
    }
    if (err.msg[0]) { fprintf(stderr, "cllm info: %s\n", err.msg); return 2; }
    return 0;
}

static void print_tensor_parallel(const Model *m, const StagePlan *plan, const TpPlan *tps, int64_t kv_tokens,
                                  KVDtype kv_dtype) {
    if (!plan) {
        tp_plan_print(stdout, &tps[0], &m->cfg, kv_tokens, kv_dtype, -1);
        return;
    }
    printf("tensor parallel        %d ranks per stage (%d backends)\n", tps[0].n_ranks, tps[0].n_ranks * plan->n_stages);
    for (int s = 0; s < plan->n_stages; s++) {
        StageModel sm;
        Err ignore = {{0}};
        stage_model_make(&sm, &m->cfg, &m->shape, &m->w, plan, s, &ignore); /* made once already */
        printf("  stage %d\n", s);
        tp_plan_print(stdout, &tps[s], &sm.cfg, kv_tokens, kv_dtype, s);
    }
}

/* ---------- where the backends run: `info --tp N [--pp P] [--gpus LIST]` ---------- */

/* Every backend's GPU, stage by stage, rank by rank, by placement.h's rule
 * (the one the runtime follows), and what this machine says about it. */
typedef struct {
    int stages, tp, n;
    int dev[PLACEMENT_MAX];
    int n_gpus;            /* usable GPUs here; 0: planned as if the GPUs named existed */
    char note[1200];       /* what this machine cannot tell, or what a run here would refuse ("": nothing) */
} InfoPlacement;

/* Checked before anything is printed: a bad --gpus list (its form, or a GPU
 * this machine lacks) exits 2 naming it. With too few GPUs and no list the
 * plan is 0, 1, ... as if they existed, and the note gives the refusal. */
static int place_backends(InfoPlacement *pl, const char *gpus, int stages, int tp) {
    Err why = {{0}}, err = {{0}};
    memset(pl, 0, sizeof *pl);
    pl->stages = stages, pl->tp = tp, pl->n = stages * tp;
    if (gpus && stages * tp == 1) {
        fprintf(stderr, "cllm info: --gpus '%s': places the backends of --tp or --pp; give one of them\n", gpus);
        return 2;
    }
    if ((pl->n_gpus = backend_gpu_count(&why)) == 0)
        snprintf(pl->note, sizeof pl->note, "no usable GPU here (%s): planned as if the GPUs named existed; "
                 "NCCL and the GPUs' memory are not checked", why.msg[0] ? why.msg : "a build without CUDA");
    if (!placement_devices(gpus, stages, tp, pl->n_gpus, pl->dev, &err)) return 0;
    if (gpus || pl->n_gpus == 0) { fprintf(stderr, "cllm info: %s\n", err.msg); return 2; }
    snprintf(pl->note, sizeof pl->note, "planned as if GPUs 0..%d existed; a run here refuses: %.1000s", pl->n - 1,
             err.msg);
    return placement_devices(NULL, stages, tp, 0, pl->dev, &err) ? 2 : 0; /* 0, 1, ...: the form only */
}

/* "stage 1 rank 0", "rank 1", "stage 1": backend b as the plan names it */
static void backend_label(char *buf, size_t cap, const InfoPlacement *pl, int b) {
    if (pl->stages > 1 && pl->tp > 1) snprintf(buf, cap, "stage %d rank %d", b / pl->tp, b % pl->tp);
    else if (pl->tp > 1) snprintf(buf, cap, "rank %d", b);
    else snprintf(buf, cap, "stage %d", b);
}

/* How stage s's group of ranks sums its partial results (tp.c's choice). */
static void print_transport(const InfoPlacement *pl, int s) {
    TpPlacement g;
    placement_group(pl->dev, pl->n, s * pl->tp, pl->tp, &g);
    char label[32], gpus[4 * TP_MAX + 1] = "";
    snprintf(label, sizeof label, pl->stages > 1 ? "  stage %d transport" : "  transport", s);
    for (int r = 0; r < pl->tp; r++)
        snprintf(gpus + strlen(gpus), sizeof gpus - strlen(gpus), r ? ",%d" : "%d", g.devices[r]);
    Err e = {{0}};
    if (!g.nccl) printf("%-22s host memory; %s\n", label, g.why);
    else if (pl->n_gpus == 0)
        printf("%-22s NCCL between GPUs %s where NCCL loads, else host memory (not checked: no GPU here)\n", label,
               gpus);
    else if (backend_link_available(&e))
        printf("%-22s host memory; NCCL does not load here (%s)\n", label, e.msg);
    else printf("%-22s NCCL between GPUs %s (one rank each)\n", label, gpus);
}

/* Each GPU: the backends on it (shared where more than one) and the memory
 * they take together, weights[b] + kv[b]; then each group's transport. */
static void print_placement(const InfoPlacement *pl, const char *gpus, const uint64_t *weights, const uint64_t *kv) {
    printf("%-22s %s%s\n", "placement", gpus ? "--gpus " : "GPUs 0, 1, ... (no --gpus)", gpus ? gpus : "");
    if (pl->note[0]) printf("%-22s %s\n", "", pl->note);
    bool done[PLACEMENT_MAX] = {false};
    for (int b = 0; b < pl->n; b++) {
        if (done[b]) continue;
        char who[PLACEMENT_MAX * 20] = "", label[48];
        int count = 0;
        uint64_t w = 0, k = 0;
        for (int j = b; j < pl->n; j++) {
            if (pl->dev[j] != pl->dev[b]) continue;
            done[j] = true;
            w += weights[j], k += kv[j];
            backend_label(label, sizeof label, pl, j);
            snprintf(who + strlen(who), sizeof who - strlen(who), "%s%s", count++ ? ", " : "", label);
        }
        snprintf(label, sizeof label, "  GPU %d", pl->dev[b]);
        printf("%-22s %s", label, who);
        if (count > 1) printf(" (%d backends share it)", count);
        printf(": ");
        plan_print_memory(stdout, w, k);
    }
    for (int s = 0; pl->tp > 1 && s < pl->stages; s++) print_transport(pl, s);
}

/* Every backend's weights and KV cache (kv_tokens each), by the plans. */
static void backend_bytes(const Model *m, const StagePlan *plan, const TpPlan *tps, const InfoPlacement *pl,
                          int64_t kv_tokens, KVDtype kv_dtype, uint64_t *weights, uint64_t *kv) {
    for (int s = 0; s < pl->stages; s++) {
        StageModel sm;
        Err ignore = {{0}};
        if (plan) stage_model_make(&sm, &m->cfg, &m->shape, &m->w, plan, s, &ignore); /* made once already */
        for (int r = 0; r < pl->tp; r++) {
            int b = s * pl->tp + r;
            weights[b] = tps ? tps[s].bytes[r] : plan->bytes[s];
            kv[b] = tps ? tp_plan_kv_bytes(&tps[s], plan ? &sm.cfg : &m->cfg, r, kv_tokens, kv_dtype)
                        : stage_plan_kv_bytes(plan, &m->cfg, s, kv_tokens, kv_dtype);
        }
    }
}

int info_main(const InfoOptions *o) {
    int rc, pp = o->pp, kv_tokens = o->kv_tokens;
    const char *pp_split = o->pp_split;
    bool tensors = o->tensors;
    KVDtype kv_dtype = o->kv_dtype;
    Model m;
    if ((rc = app_load_model("info", o->model, o->dummy ? MODEL_LOAD_DUMMY_WEIGHTS : 0, o->dummy_type, &m))) return rc;
    const char *tmpl = tokenizer_chat_template(m.tok);
    char family[96];
    snprintf(family, sizeof family, "%s%s", chat_family_name(tmpl ? chat_template_detect(tmpl) : chat_template_guess(m.tok)),
             tmpl ? "" : " (guessed from the special tokens: the file has no template)");
    StagePlan plan;
    bool piped = pp > 0 || pp_split;
    if (piped && (rc = plan_pipeline(&m, pp, pp_split, &plan))) { model_free(&m); return rc; }
    TpPlan *tps = o->tp > 1 ? calloc(piped ? (size_t)plan.n_stages : 1, sizeof *tps) : NULL;
    if (o->tp > 1 && (rc = tps ? plan_tensor_parallel(&m, piped ? &plan : NULL, o->tp, tps) : 1)) {
        free(tps);
        model_free(&m);
        return rc;
    }
    InfoPlacement pl;
    bool placed = tps || o->gpus;
    if (placed && (rc = place_backends(&pl, o->gpus, piped ? plan.n_stages : 1, o->tp > 1 ? o->tp : 1))) {
        free(tps);
        model_free(&m);
        return rc;
    }
    int64_t kv = kv_tokens > 0 ? kv_tokens : m.cfg.ctx_len;
    model_print_info(stdout, &m, (int)kv, kv_dtype, family);
    if (piped) stage_plan_print(stdout, &plan, &m.cfg, kv, kv_dtype);
    if (tps) print_tensor_parallel(&m, piped ? &plan : NULL, tps, kv, kv_dtype);
    if (placed) {
        uint64_t weights[PLACEMENT_MAX], kv_bytes[PLACEMENT_MAX];
        backend_bytes(&m, piped ? &plan : NULL, tps, &pl, kv, kv_dtype, weights, kv_bytes);
        print_placement(&pl, o->gpus, weights, kv_bytes);
    }
    if (tensors) model_print_tensors(stdout, &m);
    free(tps);
    model_free(&m);
    return rc;
}
