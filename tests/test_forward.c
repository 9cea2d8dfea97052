/* test_forward.c — the CPU forward pass of every architecture against
 * Hugging Face transformers' fp32 logits (tests/fixtures/tiny, made by
 * make_tiny_models.py), from the GGUF and from the safetensors copy of each
 * tiny model.
 *
 * Three paths per prompt: the whole prompt in one step (logits of every row),
 * chunked prefill (chunks of 5 with a deliberately scattered block table),
 * and token-by-token decode. Each must match the reference within 1e-4
 * relative error (max |diff| over max |ref| of the row's logits). The greedy
 * continuation must equal the reference's wherever its top-2 margin is not a
 * near tie. The GGUFs again with an fp8 KV cache (test_fp8_kv). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/info.h"
#include "app/models.h"
#include "engine/engine.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/backend_cpu.h"
#include "model/dummy.h"
#include "model/model.h"
#include "tests/ref/ref_engine.h"
#include "tests/b64_floats.h"
#include "tests/test.h"

#define TOL 1e-4
/* fp8 KV against the fp32 reference: a guard against a broken cache (a
 * wrong scale or code is an error of order 1), not an accuracy figure: these
 * random-weight models amplify rounding (transformers' own bf16 run is 6.45e-2
 * of max |logit| from its fp32 one on tiny llama: tests/gpu/test_cuda_forward.c),
 * and fp8 moves them 0.04-0.30. The accuracy checks are the op's error bound
 * derived from the e4m3 step (test_cpu_ops test_attention_fp8) and the real
 * models (test_real_models). */
#define FP8_TOL 0.5

static const char *ARCHS[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt-oss", "llama-mlp-bias"};

typedef struct {
    Model m;
    Backend *be;
    Engine e;
} Rig;

/* The backend and engine over the rig's loaded model. */
static int rig_start(Rig *r, int block_size, KVDtype kv) {
    Err err = {{0}};
    r->be = backend_cpu_create(&r->m.shape, &r->m.w, 2, block_size, 64, kv, KV_SCALES_DYNAMIC, &err);
    if (!r->be || engine_init(&r->e, &r->m, r->be, 64 * block_size, 64, &err)) { printf("  %s\n", err.msg); return -1; }
    return 0;
}

static int rig_open(Rig *r, const char *path, int block_size, KVDtype kv) {
    Err err = {{0}};
    memset(r, 0, sizeof *r);
    if (model_load(&r->m, path, MODEL_LOAD_NO_TOKENIZER, &err)) { printf("  %s\n", err.msg); return -1; }
    return rig_start(r, block_size, kv);
}

static void rig_close(Rig *r) {
    engine_free(&r->e);
    if (r->be) r->be->destroy(r->be);
    model_free(&r->m);
}

/* Holds a third of the pool's blocks and returns the rest in a shuffled
 * order, so a sequence's blocks are scattered and out of order. */
static void scatter_pool(Rig *r, int *held, int *n_held) {
    int ids[64], free_ids[64], n = 0, n_free = 0;
    *n_held = 0;
    while (n < 64 && (ids[n] = block_pool_alloc(&r->e.pool)) >= 0) n++;
    for (int i = 0; i < n; i++) {
        if (i % 3 == 1) held[(*n_held)++] = ids[i];
        else free_ids[n_free++] = ids[i];
    }
    uint32_t state = 12345;
    for (int i = n_free - 1; i > 0; i--) {
        state = state * 1664525u + 1013904223u;
        int j = (int)(state % (uint32_t)(i + 1)), t = free_ids[i];
        free_ids[i] = free_ids[j];
        free_ids[j] = t;
    }
    for (int i = 0; i < n_free; i++) block_pool_release(&r->e.pool, free_ids[i]);
}

/* Whole prompt in one step: every row's logits (copied to keep, when given). */
static double check_full(Rig *r, const int32_t *ids, int T, const float *ref, float *keep) {
    int V = r->m.cfg.vocab;
    Err err = {{0}};
    float *logits = malloc((size_t)T * V * sizeof *logits);
    double worst = INFINITY;
    for (int i = 0; i < T * V; i++) logits[i] = NAN; /* poisoned */
    if (engine_prompt_logits(&r->e, ids, T, logits, &err) == 0) {
        worst = 0;
        if (keep) memcpy(keep, logits, (size_t)T * V * sizeof *logits);
        for (int t = 0; t < T; t++) {
            double e = test_row_err(logits + (size_t)t * V, ref + (size_t)t * V, V);
            if (!(e <= worst)) worst = e;
        }
    } else {
        printf("  %s\n", err.msg);
    }
    free(logits);
    return worst;
}

/* Chunked prefill through the engine (chunk tokens per step), then the
 * last row's logits; and decode one token at a time comparing each step. */
static double check_engine(Rig *r, const int32_t *ids, int T, const float *ref, int chunk) {
    int V = r->m.cfg.vocab;
    Sequence s = {0};
    Err err = {{0}};
    double worst = 0;
    for (int done = 0; done < T;) {
        int n = T - done < chunk ? T - done : chunk;
        if (engine_feed(&r->e, &s, ids + done, n, &err)) { printf("  %s\n", err.msg); worst = INFINITY; break; }
        done += n;
        double e = test_row_err(s.logits, ref + (size_t)(done - 1) * V, V);
        if (!(e <= worst)) worst = e;
    }
    sequence_release(&r->e, &s);
    return worst;
}

static void check_greedy(Rig *r, const JsonValue *ref, const int32_t *ids, int T) {
    const JsonValue *g = json_get(ref, "greedy"), *want = json_get(g, "ids"), *margins = json_get(g, "margins");
    Sequence s = {0};
    Err err = {{0}};
    int V = r->m.cfg.vocab;
    CHECK(engine_feed(&r->e, &s, ids, T, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < json_len(want); i++) {
        int best = 0;
        for (int v = 1; v < V; v++) if (s.logits[v] > s.logits[best]) best = v;
        int w = (int)json_at(want, i)->u.number.num;
        double margin = json_at(margins, i)->u.number.num;
        CHECK(best == w || margin < 1e-3, "greedy token %zu: got %d, want %d (margin %g)", i, best, w, margin);
        if (best != w) break; /* the continuations differ from here on */
        int32_t id = best;
        if (engine_feed(&r->e, &s, &id, 1, &err)) { CHECK(0, "%s", err.msg); break; }
    }
    sequence_release(&r->e, &s);
}

static void check_model_kv(const char *arch, bool gguf, KVDtype kv) {
    char ref_path[1024], model_path[1024];
    Err err = {{0}};
    snprintf(ref_path, sizeof ref_path, "%s/tiny/%s.ref.json", test_fixture_dir(), arch);
    Json *doc = json_parse_file(ref_path, &err);
    CHECK(doc != NULL, "%s", err.msg);
    if (!doc) return;
    const JsonValue *ref = json_root(doc);
    snprintf(model_path, sizeof model_path, "%s/tiny/%s", test_fixture_dir(),
             gguf ? json_get_str(ref, "gguf", "") : json_get_str(ref, "hf_dir", ""));
    Rig r;
    int block_size = gguf ? 4 : 16;
    if (rig_open(&r, model_path, block_size, kv)) { CHECK(0, "cannot open %s", model_path); rig_close(&r); json_free(doc); return; }
    int V = r.m.cfg.vocab;
    CHECK(V == json_get_int(ref, "vocab", -1), "vocab %d", V);
    int held[64], n_held;
    scatter_pool(&r, held, &n_held);
    const JsonValue *prompts = json_get(ref, "prompts");
    for (size_t p = 0; p < json_len(prompts); p++) {
        const JsonValue *pr = json_at(prompts, p), *jids = json_get(pr, "ids");
        int T = (int)json_len(jids);
        int32_t *ids = malloc(T * sizeof *ids);
        float *want = malloc((size_t)T * V * sizeof *want);
        for (int i = 0; i < T; i++) ids[i] = (int32_t)json_at(jids, i)->u.number.num;
        const JsonValue *b64 = json_get(pr, "logits_f32_b64");
        size_t n = b64_floats(b64->u.string.s, b64->u.string.len, want, (size_t)T * V);
        CHECK(n == (size_t)T * V, "reference holds %zu floats, want %d", n, T * V);
        float *full8 = kv == KV_DTYPE_FP8 ? malloc((size_t)T * V * sizeof *full8) : NULL;
        double full = check_full(&r, ids, T, want, full8);
        double chunked = check_engine(&r, ids, T, want, 5);
        double decode = check_engine(&r, ids, T, want, 1);
        double tol = kv == KV_DTYPE_FP8 ? FP8_TOL : TOL;
        if (full8) { /* the cache's bytes do not depend on how the prompt was split: the same logits */
            double c8 = check_engine(&r, ids, T, full8, 5), d8 = check_engine(&r, ids, T, full8, 1);
            printf("# %-8s fp8 KV prompt %zu: chunked %.2e, decode %.2e from the one-step fp8 logits\n", arch, p, c8, d8);
            CHECK(c8 == 0 && d8 == 0, "%s fp8 KV prompt %zu: chunked %.3g / decode %.3g from one step", arch, p, c8, d8);
            free(full8);
        }
        CHECK(full <= tol && chunked <= tol && decode <= tol, "%s %s%s prompt %zu (T=%d): rel err full %.3g chunked %.3g decode %.3g",
              arch, gguf ? "gguf" : "safetensors", kv == KV_DTYPE_FP8 ? " fp8 KV" : "", p, T, full, chunked, decode);
        printf("# %-8s %-11s%s prompt %zu T=%2d  rel err full %.2e chunked %.2e decode %.2e\n", arch,
               gguf ? "gguf" : "safetensors", kv == KV_DTYPE_FP8 ? " fp8 KV" : "", p, T, full, chunked, decode);
        if (kv == KV_DTYPE_FP8) /* the fp8 cache is in use: its rounding shows, far above fp32's */
            CHECK(full > 100 * TOL || T < 2, "%s fp8 KV: error %.3g as small as fp32's", arch, full);
        if (p == 0 && kv != KV_DTYPE_FP8) check_greedy(&r, ref, ids, T);
        free(ids);
        free(want);
    }
    for (int i = 0; i < n_held; i++) block_pool_release(&r.e.pool, held[i]);
    CHECK(r.e.pool.n_free == r.e.pool.n_blocks, "blocks leaked: %d free of %d", r.e.pool.n_free, r.e.pool.n_blocks);
    rig_close(&r);
    json_free(doc);
}

static void check_model(const char *arch, bool gguf) { check_model_kv(arch, gguf, KV_DTYPE_BF16); }

#define ARCH_TESTS(name, idx)                                              \
    static void test_##name##_gguf(void) { check_model(ARCHS[idx], true); }  \
    static void test_##name##_safetensors(void) { check_model(ARCHS[idx], false); }
ARCH_TESTS(llama, 0)
ARCH_TESTS(mistral, 1)
ARCH_TESTS(qwen2, 2)
ARCH_TESTS(qwen3, 3)
ARCH_TESTS(gemma2, 4)
ARCH_TESTS(gemma3, 5)
ARCH_TESTS(gpt_oss, 6)
ARCH_TESTS(llama_mlp_bias, 7) /* blk.N.ffn_{gate,up,down}.bias: optional in llama.cpp's llama */

/* ---- tensors the file places misaligned for their type ---- */

/* The logits of every row of a 16-token prompt through model path (one
 * step); false when it does not load or run. */
static bool prompt_logits(const char *path, float *out, int *vocab) {
    Rig r;
    bool ok = rig_open(&r, path, 4, KV_DTYPE_BF16) == 0;
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (i * 37 + 5) % 200;
    if (ok) {
        *vocab = r.m.cfg.vocab;
        float *zero = calloc((size_t)16 * *vocab, sizeof *zero);
        ok = check_full(&r, ids, 16, zero, out) < INFINITY;
        free(zero);
        const ModelWeights *w = &r.m.w; /* what the ops read is aligned for its type */
        for (int l = 0; ok && l < r.m.cfg.n_layers; l++) {
            const WeightRef *refs[] = {&w->layers[l].wq, &w->layers[l].w_down, &w->layers[l].attn_norm};
            for (int k = 0; k < 3; k++)
                CHECK((uintptr_t)refs[k]->data % 4 == 0, "%s: %s read at %p (F32: 4-byte aligned)", path,
                      refs[k]->name, refs[k]->data);
        }
    }
    rig_close(&r);
    return ok;
}

/* src's tensors, then zeros for the extra ones */
static int fill_from_gguf(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err) {
    const GGUFFile *f = ctx;
    if (i < f->n_tensors) memcpy(dst, f->tensors[i].data, nbytes);
    else memset(dst, 0, nbytes);
    return 0;
}

/* src rewritten at dst with general.alignment a, a padding key of pad
 * bytes (it moves the data section) and n_extra more tensors
 * "extra.K.weight" that no role reads; true when some F32 tensor's bytes
 * then start off a 4-byte boundary. */
static bool write_gguf_copy(const char *src, const char *dst, uint32_t a, int pad, int n_extra) {
    GGUFFile f, g;
    Err err = {{0}};
    if (gguf_open(&f, src, &err)) { printf("  %s\n", err.msg); return false; }
    GGUFKV *kv = calloc(f.n_kv + 2, sizeof *kv);
    uint64_t n = f.n_tensors + n_extra;
    GGUFOutTensor *t = calloc(n, sizeof *t);
    char (*names)[32] = calloc(n_extra + 1, sizeof *names);
    memcpy(kv, f.kv, f.n_kv * sizeof *kv);
    kv[f.n_kv] = (GGUFKV){(char *)"general.alignment", {GGUF_UINT32, {.u = a}}};
    kv[f.n_kv + 1] = (GGUFKV){(char *)"test.padding", {GGUF_STRING, {.str = {"pppppppp", (uint64_t)pad}}}};
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const GGUFTensor *x = &f.tensors[i];
        t[i] = (GGUFOutTensor){x->name, x->n_dims, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, x->type};
    }
    for (int k = 0; k < n_extra; k++) {
        snprintf(names[k], sizeof names[k], "extra.%d.weight", k);
        t[f.n_tensors + k] = (GGUFOutTensor){names[k], 1, {4, 1, 1, 1}, DT_F32};
    }
    bool misaligned = false;
    if (gguf_write(dst, kv, f.n_kv + 2, t, n, a, fill_from_gguf, &f, &err) == 0 && gguf_open(&g, dst, &err) == 0) {
        for (uint64_t i = 0; i < g.n_tensors; i++) misaligned |= (uintptr_t)g.tensors[i].data % 4 != 0;
        gguf_close(&g);
    } else {
        printf("  %s\n", err.msg);
    }
    free(kv);
    free(t);
    free(names);
    gguf_close(&f);
    return misaligned;
}

/* GGUF general.alignment 1, 2 and 4: the same logits as the file laid out
 * at 32 (the ops read copies where the file's bytes are misaligned: under
 * UBSan a misaligned read aborts). */
static void test_misaligned_gguf(void) {
    char src[1024], dst[] = "/tmp/cllm_test_align_XXXXXX";
    snprintf(src, sizeof src, "%s/tiny/llama.gguf", test_fixture_dir());
    int fd = mkstemp(dst), V = 0;
    if (fd >= 0) close(fd);
    float *want = malloc((size_t)16 * 512 * sizeof *want), *got = malloc((size_t)16 * 512 * sizeof *got);
    CHECK(prompt_logits(src, want, &V) && V <= 512, "%s does not run", src);
    const uint32_t aligns[] = {1, 2, 4};
    for (int k = 0; k < 3 && V; k++) {
        bool moved = false;
        for (int pad = 0; pad < 4 && !moved; pad++) moved = write_gguf_copy(src, dst, aligns[k], pad, 0);
        CHECK(moved == (aligns[k] < 4), "alignment %u: tensors misaligned: %d", aligns[k], moved);
        int v2 = 0;
        bool ran = prompt_logits(dst, got, &v2);
        CHECK(ran && v2 == V && !memcmp(got, want, (size_t)16 * V * sizeof *got),
              "alignment %u: the logits differ from the 32-aligned file's", aligns[k]);
    }
    unlink(dst);
    free(want);
    free(got);
}

/* A safetensors header of odd length (padded with a space, as the format
 * allows): every tensor's bytes start off a 4-byte boundary; the same
 * logits as the original. */
static void test_misaligned_safetensors(void) {
    char src[1024], dir[] = "/tmp/cllm_test_st_XXXXXX", path[1100], cfg_src[1100], cfg_dst[1100];
    snprintf(src, sizeof src, "%s/tiny/llama/model.safetensors", test_fixture_dir());
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(cfg_src, sizeof cfg_src, "%s/tiny/llama/config.json", test_fixture_dir());
    snprintf(cfg_dst, sizeof cfg_dst, "%s/config.json", dir);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb"), *ci = fopen(cfg_src, "rb"), *co = fopen(cfg_dst, "wb");
    CHECK(in && out && ci && co, "cannot copy %s to %s", src, dir);
    if (in && out && ci && co) {
        int c;
        while ((c = fgetc(ci)) != EOF) fputc(c, co);
        uint8_t len8[8];
        uint64_t n = 0;
        CHECK(fread(len8, 1, 8, in) == 8, "%s: short", src);
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
        uint64_t m = n + ((8 + n) % 2 == 0 ? 1 : 2); /* 8 + m odd */
        for (int i = 0; i < 8; i++) fputc((int)(m >> (8 * i) & 0xff), out);
        for (uint64_t i = 0; i < n && (c = fgetc(in)) != EOF; i++) fputc(c, out);
        for (uint64_t i = n; i < m; i++) fputc(' ', out);
        while ((c = fgetc(in)) != EOF) fputc(c, out);
    }
    if (in) fclose(in);
    if (out) fclose(out);
    if (ci) fclose(ci);
    if (co) fclose(co);
    Safetensors st;
    Err err = {{0}};
    CHECK(safetensors_open(&st, path, &err) == 0 && (uintptr_t)st.tensors[0].data % 4 != 0,
          "%s: not opened or not misaligned: %s", path, err.msg);
    if (!err.msg[0]) safetensors_close(&st);
    float *want = malloc((size_t)16 * 512 * sizeof *want), *got = malloc((size_t)16 * 512 * sizeof *got);
    int V = 0, v2 = 0;
    snprintf(src, sizeof src, "%s/tiny/llama", test_fixture_dir());
    CHECK(prompt_logits(src, want, &V) && V <= 512, "%s does not run", src);
    bool ran = prompt_logits(path, got, &v2);
    CHECK(ran && v2 == V && !memcmp(got, want, (size_t)16 * V * sizeof *got),
          "odd header: the logits differ from the original's");
    remove(path);
    remove(cfg_dst);
    remove(dir);
    free(want);
    free(got);
}

/* A file tensor that no weight role reads: named on stderr by the commands
 * (app_warn_unused: the first 16, then a count), kept in m.unused, listed by `cllm info`. */
static void test_unused_tensors(void) {
    char src[1024], dst[] = "/tmp/cllm_test_unused_XXXXXX", errf[] = "/tmp/cllm_test_stderr_XXXXXX";
    snprintf(src, sizeof src, "%s/tiny/llama.gguf", test_fixture_dir());
    int fd = mkstemp(dst);
    if (fd >= 0) close(fd);
    int efd = mkstemp(errf);
    write_gguf_copy(src, dst, 32, 0, 20);
    fflush(stderr);
    int saved = dup(2);
    dup2(efd, 2);
    Model m;
    Err err = {{0}};
    int rc = model_load(&m, dst, MODEL_LOAD_NO_TOKENIZER, &err);
    if (rc == 0) app_warn_unused(&m);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK(rc == 0, "%s", err.msg);
    char *text = calloc(1, 1 << 16);
    FILE *e = fdopen(efd, "r");
    rewind(e);
    size_t n = fread(text, 1, (1 << 16) - 1, e);
    fclose(e);
    text[n] = 0;
    if (rc == 0) {
        CHECK(m.n_unused == 20 && !strcmp(m.unused[0], "extra.0.weight") && !strcmp(m.unused[19], "extra.19.weight"),
              "unused: %llu", (unsigned long long)m.n_unused);
        CHECK(strstr(text, "'extra.0.weight'") && strstr(text, "'extra.15.weight'") && !strstr(text, "'extra.16.weight'")
              && strstr(text, "4 more tensors") && strstr(text, dst), "the warnings: %s", text);
        char *listing = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&listing, &len);
        model_print_info(out, &m, 16, KV_DTYPE_BF16, "none");
        fclose(out);
        CHECK(strstr(listing, "unused tensors         20") && strstr(listing, "extra.19.weight"), "info: %s", listing);
        free(listing);
        model_free(&m);
    }
    free(text);
    unlink(dst);
    unlink(errf);
}

/* Every architecture's GGUF with an fp8 KV cache: against the same fp32
 * reference logits (FP8_TOL), and chunked prefill and decode give exactly
 * the one-step logits (the cache holds the same bytes however the prompt
 * was split). */
static void test_fp8_kv(void) {
    for (size_t a = 0; a < sizeof ARCHS / sizeof ARCHS[0]; a++) check_model_kv(ARCHS[a], true, KV_DTYPE_FP8);
}

/* ---- --dummy-weights=TYPE (model/dummy.c) ---- */

/* A Llama config whose matrices have whole blocks of every type but one:
 * C = 256, 4 heads / 2 KV heads of 64, V = 320, untied (the LM head gets
 * its own type), F = 384 (whole 32-blocks, not whole 256-blocks: under a K
 * type w_down, [C][F], stays bf16). */
static const char DUMMY_CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 256, "
    "\"intermediate_size\": 384, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"head_dim\": 64, \"vocab_size\": 320, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, "
    "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}";

/* GGUF's block table (ggml.c type_traits), written out here rather than read
 * from base/dtype.c, so the sizes are checked against an independent copy */
static const struct { DType t; int elems, bytes, scale_at[2]; } GGUF_BLOCKS[] = {
    {DT_Q8_0, 32, 34, {0, -1}},   {DT_Q4_0, 32, 18, {0, -1}},   {DT_Q4_1, 32, 20, {0, 2}},
    {DT_Q5_0, 32, 22, {0, -1}},   {DT_Q5_1, 32, 24, {0, 2}},    {DT_Q4_K, 256, 144, {0, 2}},
    {DT_Q5_K, 256, 176, {0, 2}},  {DT_Q6_K, 256, 210, {208, -1}},
};
#define N_GGUF_BLOCKS (int)(sizeof GGUF_BLOCKS / sizeof GGUF_BLOCKS[0])

static int gguf_block(DType t) {
    for (int i = 0; i < N_GGUF_BLOCKS; i++)
        if (GGUF_BLOCKS[i].t == t) return i;
    return -1;
}

/* The type a [rows][cols] matrix should get when the model asks for want,
 * and its bytes in that type. */
static DType expect_type(DType want, int64_t cols) {
    if (want == DT_F8_E4M3) return want; /* a byte a value: any cols */
    int b = gguf_block(want);
    return b >= 0 && cols % GGUF_BLOCKS[b].elems == 0 ? want : DT_BF16;
}

static uint64_t expect_bytes(DType t, int64_t rows, int64_t cols) {
    if (t == DT_F8_E4M3) return (uint64_t)(rows * cols);
    int b = gguf_block(t);
    return b < 0 ? (uint64_t)(rows * cols * 2) : (uint64_t)(rows * (cols / GGUF_BLOCKS[b].elems) * GGUF_BLOCKS[b].bytes);
}

/* A dummy FP8 matrix: a finite scale a row, no NaN code (0x7f, 0xff), values
 * code x scale with mean ~0 and sd ~0.02 (decoded by the e4m3 table that
 * test_fp8 checks against torch). */
static void check_dummy_fp8(const WeightRef *w) {
    CHECK(w->scale && w->row_bytes == (uint64_t)w->cols, "%s: no row scales, or %llu bytes a row", w->name,
          (unsigned long long)w->row_bytes);
    if (!w->scale) return;
    const uint8_t *p = w->data;
    int64_t nan_codes = 0, bad_scales = 0;
    double sum = 0, sq = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        bad_scales += !(w->scale[r] > 0.0f && isfinite(w->scale[r]));
        for (int64_t c = 0; c < w->cols; c++) {
            uint8_t code = p[r * w->cols + c];
            nan_codes += (code & 0x7f) == 0x7f;
            double v = (double)e4m3_to_fp32(code) * w->scale[r];
            sum += v, sq += v * v;
        }
    }
    double n = (double)w->rows * w->cols, mean = sum / n, sd = sqrt(sq / n - mean * mean);
    CHECK(nan_codes == 0 && bad_scales == 0, "%s: %lld NaN codes, %lld bad scales", w->name, (long long)nan_codes,
          (long long)bad_scales);
    CHECK(fabs(mean) < 0.002 && sd > 0.017 && sd < 0.023, "%s (F8_E4M3): mean %.5f sd %.5f, want ~0 and ~0.02",
          w->name, mean, sd);
}

/* Checks w's type and, for a block type, every block's fp16 scales (finite,
 * non-zero) and the dequantized values (mean ~0, sd ~0.02); returns its
 * expected bytes. */
static uint64_t check_dummy_matrix(const WeightRef *w, DType want, int64_t rows, int64_t cols) {
    DType t = expect_type(want, cols);
    CHECK(w->type == t && w->rows == rows && w->cols == cols, "%s: type %d [%lld][%lld], want type %d [%lld][%lld]",
          w->name, (int)w->type, (long long)w->rows, (long long)w->cols, (int)t, (long long)rows, (long long)cols);
    if (w->type == t && t == DT_F8_E4M3) check_dummy_fp8(w);
    int b = gguf_block(w->type);
    if (w->type != t || b < 0) return expect_bytes(t, rows, cols);
    const uint8_t *p = w->data;
    int64_t blocks = rows * cols / GGUF_BLOCKS[b].elems, bad = 0;
    for (int64_t k = 0; k < blocks; k++)
        for (int j = 0; j < 2 && GGUF_BLOCKS[b].scale_at[j] >= 0; j++) {
            const uint8_t *h = p + k * GGUF_BLOCKS[b].bytes + GGUF_BLOCKS[b].scale_at[j];
            float v = fp16_to_fp32((uint16_t)(h[0] | h[1] << 8));
            bad += !isfinite(v) || v == 0.0f;
        }
    CHECK(bad == 0, "%s: %lld fp16 scales not finite or zero", w->name, (long long)bad);
    float *row = malloc((size_t)cols * sizeof *row);
    double sum = 0, sq = 0;
    for (int64_t r = 0; r < rows; r++) {
        dequantize_row(w->type, p + r * w->row_bytes, row, cols);
        for (int64_t c = 0; c < cols; c++) sum += row[c], sq += (double)row[c] * row[c];
    }
    free(row);
    double n = (double)rows * cols, mean = sum / n, sd = sqrt(sq / n - mean * mean);
    CHECK(fabs(mean) < 0.002 && sd > 0.017 && sd < 0.023, "%s (%s): mean %.5f sd %.5f, want ~0 and ~0.02", w->name,
          dtype_info(w->type)->name, mean, sd);
    return expect_bytes(t, rows, cols);
}

/* Every matrix of the dummy model checked; weight_bytes against the sum of
 * the shapes' bytes (vectors: bf16 as made, though bound as fp32). */
static void check_dummy_weights(const Model *m, DType want) {
    const ModelConfig *c = &m->cfg;
    int64_t C = 256, F = 384, V = 320, Q = 4 * 64, KV = 2 * 64;
    /* llama.cpp: output.weight Q6_K unless the model is Q8_0 (and bf16 stays bf16) */
    DType head = want == DT_Q8_0 || want == DT_BF16 ? want : DT_Q6_K;
    DType embd = want;
    if (want == DT_F8_E4M3) head = embd = DT_BF16; /* as FP8 checkpoints keep them */
    uint64_t bytes = check_dummy_matrix(&m->w.tok_embd, embd, V, C) + check_dummy_matrix(&m->w.output, head, V, C) + 2 * C;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        bytes += check_dummy_matrix(&lw->wq, want, Q, C) + check_dummy_matrix(&lw->wk, want, KV, C) +
                 check_dummy_matrix(&lw->wv, want, KV, C) + check_dummy_matrix(&lw->wo, want, C, Q) +
                 check_dummy_matrix(&lw->w_gate, want, F, C) + check_dummy_matrix(&lw->w_up, want, F, C) +
                 check_dummy_matrix(&lw->w_down, want, C, F) + 2 * 2 * C;
        CHECK(lw->attn_norm.type == DT_F32 && lw->ffn_norm.type == DT_F32, "layer %d: norms not fp32", l);
    }
    CHECK(m->weight_bytes == bytes, "%s: weight_bytes %llu, the shapes give %llu", dtype_info(want)->name,
          (unsigned long long)m->weight_bytes, (unsigned long long)bytes);
    /* the config's head is untied: the backends tell a tied head by its data being the embedding's, so a
     * head of the embedding's type (Q8_0, bf16) must not share the dummy values' buffer with it */
    CHECK(!c->tied_embeddings && m->w.output.data != m->w.tok_embd.data, "%s: the untied LM head reads as tied",
          dtype_info(want)->name);
}

/* A few tokens through the CPU forward: every logit finite, not all equal. */
static void check_dummy_forward(Rig *r, DType want) {
    Sequence s = {0};
    Err err = {{0}};
    int32_t ids[6] = {3, 141, 59, 26, 5, 319};
    int V = r->m.cfg.vocab, bad = 0;
    CHECK(engine_feed(&r->e, &s, ids, 6, &err) == 0, "%s", err.msg);
    float lo = INFINITY, hi = -INFINITY;
    for (int v = 0; v < V; v++) {
        bad += !isfinite(s.logits[v]);
        lo = fminf(lo, s.logits[v]), hi = fmaxf(hi, s.logits[v]);
    }
    CHECK(bad == 0 && hi > lo, "%s: %d of %d logits not finite, range [%g, %g]", dtype_info(want)->name, bad, V, lo, hi);
    sequence_release(&r->e, &s);
}

static int write_dummy_dir(char *dir) {
    char path[256];
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(DUMMY_CONFIG, f);
    return fclose(f);
}

static void remove_dummy_dir(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    remove(dir);
}

static void test_dummy_weights_quantized(void) {
    static const DType TYPES[] = {DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                                  DT_F8_E4M3};
    char dir[] = "/tmp/cllm-dummy-XXXXXX";
    CHECK(write_dummy_dir(dir) == 0, "cannot write a config to %s", dir);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        Rig r;
        Err err = {{0}};
        memset(&r, 0, sizeof r);
        if (model_load_dummy(&r.m, dir, MODEL_LOAD_NO_TOKENIZER, TYPES[i], &err)) {
            CHECK(0, "%s: %s", dtype_info(TYPES[i])->name, err.msg);
            continue;
        }
        check_dummy_weights(&r.m, TYPES[i]);
        if (rig_start(&r, 16, KV_DTYPE_BF16) == 0) check_dummy_forward(&r, TYPES[i]);
        else CHECK(0, "%s: no engine", dtype_info(TYPES[i])->name);
        rig_close(&r);
    }
    remove_dummy_dir(dir);
}

/* dummy_fill writes the same bytes over any number of threads (each a range
 * of whole blocks; block sizes 34, 18, 22, 210 cut 4-byte words between them),
 * and a shorter fill the same first bytes; bf16 with an odd count too. */
static void test_dummy_fill_threads(void) {
    static const DType TYPES[] = {DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                                  DT_F8_E4M3};
    static const int THREADS[] = {2, 3, 7, 32, 0};
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        uint64_t bb = (uint64_t)dtype_info(TYPES[i])->block_bytes, bytes = ((6u << 20) / bb + 1) * bb;
        uint8_t *one = malloc(bytes), *many = malloc(bytes);
        if (!one || !many) { CHECK(0, "out of memory"); free(one), free(many); return; }
        dummy_fill_threads(TYPES[i], one, bytes, 1);
        for (size_t k = 0; k < sizeof THREADS / sizeof THREADS[0]; k++) {
            memset(many, 0, bytes);
            dummy_fill_threads(TYPES[i], many, bytes, THREADS[k]);
            CHECK(!memcmp(one, many, bytes), "%s: %d threads fill other bytes than 1", dtype_info(TYPES[i])->name,
                  THREADS[k]);
        }
        uint64_t part = bytes / bb / 3 * bb + (TYPES[i] == DT_BF16 ? 2 : 0); /* bf16: an odd number of values */
        memset(many, 0, bytes);
        dummy_fill_threads(TYPES[i], many, part, 3);
        CHECK(!memcmp(one, many, part), "%s: a shorter fill begins otherwise", dtype_info(TYPES[i])->name);
        free(one), free(many);
    }
}

/* Names and types cllm does not make dummy weights in are refused, naming
 * the option and the value (main.c prints the message as it is). */
static void test_dummy_weights_refused(void) {
    Err err = {{0}};
    DType t = DT_F32;
    CHECK(dummy_type_parse("Q4_K", &t, &err) == 0 && t == DT_Q4_K, "Q4_K: %s", err.msg);
    CHECK(dummy_type_parse("q6_k", &t, &err) == 0 && t == DT_Q6_K, "q6_k: %s", err.msg);
    CHECK(dummy_type_parse("fp8", &t, &err) == 0 && t == DT_F8_E4M3, "fp8: %s", err.msg);
    const char *bad[] = {"q3_k", "f32", "q4_k_m", "", "bf16x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        char want[64];
        snprintf(want, sizeof want, "--dummy-weights=%s:", bad[i]);
        CHECK(dummy_type_parse(bad[i], &t, &err) == -1 && strstr(err.msg, want), "'%s' accepted or unnamed: %s", bad[i],
              err.msg);
    }
    char dir[] = "/tmp/cllm-dummy-XXXXXX";
    CHECK(write_dummy_dir(dir) == 0, "cannot write a config to %s", dir);
    Model m;
    err.msg[0] = 0;
    CHECK(model_load_dummy(&m, dir, MODEL_LOAD_NO_TOKENIZER, DT_Q2_K, &err) == -1 && strstr(err.msg, "Q2_K") &&
              strstr(err.msg, dir), "Q2_K dummy weights: %s", err.msg);
    remove_dummy_dir(dir);
}

int main(void) {
    RUN(test_llama_gguf); RUN(test_llama_safetensors);
    RUN(test_mistral_gguf); RUN(test_mistral_safetensors);
    RUN(test_qwen2_gguf); RUN(test_qwen2_safetensors);
    RUN(test_qwen3_gguf); RUN(test_qwen3_safetensors);
    RUN(test_gemma2_gguf); RUN(test_gemma2_safetensors);
    RUN(test_gemma3_gguf); RUN(test_gemma3_safetensors);
    RUN(test_gpt_oss_gguf); RUN(test_gpt_oss_safetensors);
    RUN(test_llama_mlp_bias_gguf); RUN(test_llama_mlp_bias_safetensors);
    RUN(test_fp8_kv);
    RUN(test_misaligned_gguf);
    RUN(test_misaligned_safetensors);
    RUN(test_unused_tensors);
    RUN(test_dummy_weights_quantized);
    RUN(test_dummy_weights_refused);
    RUN(test_dummy_fill_threads);
    TEST_EXIT();
}
