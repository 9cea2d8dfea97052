/* test_quantize.c — the CPU quantizer (base/quantize.c), the GGUF writer
 * (formats/gguf_write.c) and `cllm quantize` (app/quantize_cmd.c).
 *
 *   - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: the same bytes as the gguf Python
 *     package's gguf.quants.quantize on tests/fixtures/quant (made by
 *     make_quant_fixtures.py: scales, ties, zeros, rounding boundaries);
 *   - Q4_K, Q5_K, Q6_K (the package has no quantizer for them): round trip
 *     through dequantize_row (base/dtype.c) within error bounds that
 *     shrink with the bits and beat the 4/5-bit reference formats; zeros stay
 *     zeros, no NaN;
 *   - quantize_model on the tiny Llama GGUF and on a written GGUF with
 *     256-wide rows: metadata copied, general.file_type set, matrices of the
 *     asked type (llama.cpp's fallback for rows that are not 256-blocks:
 *     Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), vectors
 *     byte-identical, values close to the originals, and the result loads
 *     as a model (tokenizer included);
 *   - refusals: unsupported type, partial block, IN == OUT, non-GGUF input,
 *     and inputs the loader refuses (missing tensor, wrong shape, token id
 *     out of range, head counts): nothing written. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/quantize_cmd.h"
#include "base/quantize.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "model/model.h"
#include "tests/test.h"

#define ROWS 8
#define COLS 512

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double gauss(void) { /* Box-Muller on a xorshift */
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        u[i] = ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static void *read_fixture(const char *name, size_t want) {
    char path[1024];
    snprintf(path, sizeof path, "%s/quant/%s", test_fixture_dir(), name);
    FILE *f = fopen(path, "rb");
    void *buf = malloc(want + 1);
    size_t n = f ? fread(buf, 1, want + 1, f) : 0;
    if (f) fclose(f);
    CHECK(n == want, "%s: %zu bytes, expected %zu", path, n, want);
    if (n != want) { free(buf); return NULL; }
    return buf;
}

static void test_matches_gguf_package(void) {
    float *x = read_fixture("input_f32.bin", ROWS * COLS * sizeof(float));
    const DType types[] = {DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1};
    const char *files[] = {"q8_0.bin", "q4_0.bin", "q4_1.bin", "q5_0.bin", "q5_1.bin"};
    for (int k = 0; x && k < 5; k++) {
        const DTypeInfo *info = dtype_info(types[k]);
        size_t row_bytes = dtype_row_bytes(types[k], COLS);
        uint8_t *want = read_fixture(files[k], ROWS * row_bytes), *got = malloc(ROWS * row_bytes);
        if (!want) { free(got); continue; }
        int bad = 0, first = -1;
        for (int r = 0; r < ROWS; r++) {
            CHECK(quantize_row(types[k], x + r * COLS, got + r * row_bytes, COLS) == 0, "%s row %d", info->name, r);
            for (int b = 0; b < COLS / info->block_elems; b++) {
                size_t off = r * row_bytes + (size_t)b * info->block_bytes;
                if (memcmp(got + off, want + off, info->block_bytes)) {
                    if (first < 0) first = r * 1000 + b;
                    bad++;
                }
            }
        }
        CHECK(bad == 0, "%s: %d of %d blocks differ from gguf.quants (first: row %d block %d)", info->name, bad,
              ROWS * COLS / info->block_elems, first / 1000, first % 1000);
        free(want);
        free(got);
    }
    free(x);
}

/* ||dequant(quant(x)) - x|| / ||x|| over n values */
static double roundtrip_err(DType t, const float *x, int64_t n) {
    uint8_t *q = malloc(dtype_row_bytes(t, n));
    float *y = malloc(n * sizeof *y);
    double num = 0, den = 0;
    if (quantize_row(t, x, q, n)) num = NAN;
    dequantize_row(t, q, y, n);
    for (int64_t i = 0; i < n; i++) {
        num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        den += (double)x[i] * x[i];
    }
    free(q);
    free(y);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_k_quants_round_trip(void) {
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)(0.02 * gauss() * (1.0 + (i / 256) % 4)); /* scales vary by block */
    for (int i = 0; i < N; i += 97) x[i] *= 8.0f;                                         /* outliers */
    double e40 = roundtrip_err(DT_Q4_0, x, N), e50 = roundtrip_err(DT_Q5_0, x, N);
    double e4 = roundtrip_err(DT_Q4_K, x, N), e5 = roundtrip_err(DT_Q5_K, x, N), e6 = roundtrip_err(DT_Q6_K, x, N);
    double e8 = roundtrip_err(DT_Q8_0, x, N);
    printf("# round-trip rel err: Q4_0 %.4f Q4_K %.4f | Q5_0 %.4f Q5_K %.4f | Q6_K %.4f | Q8_0 %.4f\n", e40, e4, e50,
           e5, e6, e8);
    CHECK(e4 < 0.12 && e4 < 1.05 * e40, "Q4_K error %.4f (Q4_0 %.4f)", e4, e40);
    CHECK(e5 < 0.06 && e5 < 1.05 * e50 && e5 < 0.6 * e4, "Q5_K error %.4f (Q5_0 %.4f, Q4_K %.4f)", e5, e50, e4);
    CHECK(e6 < 0.035 && e6 < 0.7 * e5, "Q6_K error %.4f (Q5_K %.4f)", e6, e5);
    CHECK(e8 < 0.01, "Q8_0 error %.4f", e8);
    /* zeros and a constant block: exact or close, never NaN */
    float z[512] = {0};
    for (int i = 256; i < 512; i++) z[i] = -1.5f;
    const DType ks[] = {DT_Q4_K, DT_Q5_K, DT_Q6_K};
    for (int k = 0; k < 3; k++) {
        uint8_t q[512];
        float y[512];
        quantize_row(ks[k], z, q, 512);
        dequantize_row(ks[k], q, y, 512);
        int bad = 0;
        for (int i = 0; i < 512; i++) bad += !(fabsf(y[i] - z[i]) <= 0.01f);
        CHECK(bad == 0, "%s: %d of 512 zero/constant values off", dtype_info(ks[k])->name, bad);
    }
    free(x);
}

/* Compares the tensors of a quantized copy with the original. */
static void check_copy(const char *in_path, const char *out_path, DType want, DType fallback) {
    GGUFFile a, b;
    Err err = {{0}};
    if (gguf_open(&a, in_path, &err)) { CHECK(0, "%s", err.msg); return; }
    if (gguf_open(&b, out_path, &err)) { CHECK(0, "%s", err.msg); gguf_close(&a); return; }
    uint64_t ft = 0;
    CHECK(gguf_get_u64(&b, "general.file_type", &ft) == 0 && ft > 0, "general.file_type %llu", (unsigned long long)ft);
    CHECK(b.n_kv == a.n_kv + (gguf_get(&a, "general.file_type") ? 0 : 1), "kv count %llu vs %llu",
          (unsigned long long)b.n_kv, (unsigned long long)a.n_kv);
    for (uint64_t i = 0; i < a.n_kv; i++) {
        const GGUFValue *v = gguf_get(&b, a.kv[i].key);
        CHECK(v && v->type == a.kv[i].value.type, "key %s lost or retyped", a.kv[i].key);
        if (v && v->type == GGUF_ARRAY) CHECK(v->v.arr.n == a.kv[i].value.v.arr.n, "array %s length", a.kv[i].key);
    }
    CHECK(a.n_tensors == b.n_tensors, "tensor count");
    int n_quant = 0;
    for (uint64_t i = 0; i < a.n_tensors && a.n_tensors == b.n_tensors; i++) {
        const GGUFTensor *ta = &a.tensors[i], *tb = gguf_find_tensor(&b, ta->name);
        CHECK(tb && !memcmp(ta->ne, tb->ne, sizeof ta->ne), "tensor %s missing or reshaped", ta->name);
        if (!tb) continue;
        bool matrix = ta->n_dims >= 2 && ta->ne[1] > 1;
        if (!matrix) {
            CHECK(tb->type == ta->type && !memcmp(ta->data, tb->data, ta->nbytes), "vector %s changed", ta->name);
            continue;
        }
        DType exp = ta->ne[0] % (uint64_t)dtype_info(want)->block_elems == 0 ? want : fallback;
        CHECK(tb->type == exp, "%s is %s, expected %s", ta->name, dtype_info(tb->type)->name, dtype_info(exp)->name);
        n_quant++;
        int64_t n = (int64_t)tensor_nelems(ta);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        dequantize_row(ta->type, ta->data, x, n);
        dequantize_row(tb->type, tb->data, y, n);
        double num = 0, den = 0;
        for (int64_t k = 0; k < n; k++) {
            num += ((double)y[k] - x[k]) * ((double)y[k] - x[k]);
            den += (double)x[k] * x[k];
        }
        double e = sqrt(num / den), tol = tb->type == DT_Q8_0 ? 0.01 : 0.12;
        CHECK(e < tol, "%s: rel err %.4f after %s", ta->name, e, dtype_info(tb->type)->name);
        free(x);
        free(y);
    }
    CHECK(n_quant > 0, "no matrix quantized");
    gguf_close(&a);
    gguf_close(&b);
}

static void test_quantize_tiny_llama(void) {
    char in[1024], out[] = "/tmp/cllm_test_quantize_XXXXXX";
    snprintf(in, sizeof in, "%s/tiny/llama.gguf", test_fixture_dir());
    int fd = mkstemp(out);
    if (fd >= 0) close(fd);
    Err err = {{0}};
    const DType types[] = {DT_Q8_0, DT_Q4_K}, fallbacks[] = {DT_Q8_0, DT_Q5_0}; /* its rows: 64 wide */
    for (int k = 0; k < 2; k++) {
        int rc = quantize_model(in, out, types[k], NULL, &err);
        CHECK(rc == 0, "quantize %s: %s", dtype_info(types[k])->name, err.msg);
        if (rc) continue;
        check_copy(in, out, types[k], fallbacks[k]);
        Model m;
        rc = model_load(&m, out, 0, &err);
        CHECK(rc == 0 && m.tok, "the %s copy does not load: %s", dtype_info(types[k])->name, err.msg);
        if (rc == 0) model_free(&m);
    }
    unlink(out);
}

static int fill_random(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err) {
    float *f = dst;
    for (uint64_t k = 0; k < nbytes / 4; k++) f[k] = (float)(0.05 * gauss());
    return 0;
}

/* Two fresh temporary file names (the files made empty). */
static void temp_pair(char *in, char *out) {
    int fd = mkstemp(in);
    if (fd >= 0) close(fd);
    fd = mkstemp(out);
    if (fd >= 0) close(fd);
}

/* A llama GGUF as the loader takes it: the tiny llama's metadata and
 * tokenizer with these sizes, random F32 weights, head size C / heads. The
 * fields after `untied` break it one way each (for the refusals). */
typedef struct {
    int n_layers, dim, ffn, heads, kv_heads;
    bool untied;
    const GGUFOutTensor *extra;  /* tensors no role reads, added at the end */
    int n_extra;
    const char *drop;            /* a tensor left out */
    const char *reshape;         /* a tensor given one row more */
    const char *key;             /* a uint32 key set to value */
    uint64_t value;
} LlamaSpec;

static void set_u32(GGUFKV *kv, uint64_t n, const char *key, uint64_t v) {
    for (uint64_t i = 0; i < n; i++)
        if (!strcmp(kv[i].key, key)) kv[i].value = (GGUFValue){GGUF_UINT32, {.u = v}};
}

static int write_llama(const char *path, const LlamaSpec *s) {
    char tiny[1024];
    snprintf(tiny, sizeof tiny, "%s/tiny/llama.gguf", test_fixture_dir());
    GGUFFile f;
    Err err = {{0}};
    if (gguf_open(&f, tiny, &err)) { printf("  %s\n", err.msg); return -1; }
    GGUFKV *kv = malloc(f.n_kv * sizeof *kv);
    memcpy(kv, f.kv, f.n_kv * sizeof *kv);
    uint64_t C = s->dim, F = s->ffn, hd = C / s->heads, kvd = hd * s->kv_heads, V = 320;
    set_u32(kv, f.n_kv, "llama.block_count", s->n_layers);
    set_u32(kv, f.n_kv, "llama.embedding_length", C);
    set_u32(kv, f.n_kv, "llama.feed_forward_length", F);
    set_u32(kv, f.n_kv, "llama.attention.head_count", s->heads);
    set_u32(kv, f.n_kv, "llama.attention.head_count_kv", s->kv_heads);
    set_u32(kv, f.n_kv, "llama.attention.key_length", hd);
    set_u32(kv, f.n_kv, "llama.attention.value_length", hd);
    set_u32(kv, f.n_kv, "llama.rope.dimension_count", hd);
    if (s->key) set_u32(kv, f.n_kv, s->key, s->value);
    int cap = 3 + 9 * s->n_layers + s->n_extra, n = 0;
    GGUFOutTensor *t = calloc(cap, sizeof *t);
    char (*names)[64] = calloc(cap, sizeof *names);
    static const char *layer[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                                  "ffn_up", "ffn_down"};
    uint64_t rows[] = {1, C, kvd, kvd, C, 1, F, F, C}, cols[] = {C, C, C, C, C, C, C, C, F};
#define ADD(nm, c, r) do { snprintf(names[n], 64, "%s", nm); \
        t[n] = (GGUFOutTensor){names[n], (r) > 1 ? 2 : 1, {(c), (r), 1, 1}, DT_F32}; n++; } while (0)
    ADD("token_embd.weight", C, V);
    ADD("output_norm.weight", C, 1);
    if (s->untied) ADD("output.weight", C, V);
    for (int l = 0; l < s->n_layers; l++)
        for (int k = 0; k < 9; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, layer[k]);
            ADD(nm, cols[k], rows[k]);
        }
#undef ADD
    for (int k = 0; k < n; k++)
        if (s->reshape && !strcmp(t[k].name, s->reshape)) { t[k].ne[1]++; t[k].n_dims = 2; }
    for (int k = 0; k < n; k++)
        if (s->drop && !strcmp(t[k].name, s->drop)) t[k--] = t[--n];
    for (int k = 0; k < s->n_extra; k++) t[n++] = s->extra[k];
    int rc = gguf_write(path, kv, f.n_kv, t, n, 32, fill_random, NULL, &err);
    if (rc) printf("  %s\n", err.msg);
    free(t);
    free(names);
    free(kv);
    gguf_close(&f);
    return rc;
}

/* 256-wide rows (a K type applies), 96-wide ones (ffn_down: falls back as
 * llama.cpp's quantizer does, written out by hand: Q4_K -> Q5_0, Q5_K ->
 * Q5_1, Q6_K -> Q8_0), and a 3-D tensor no role reads (kept, quantized) */
static void test_quantize_k_rows(void) {
    char in[] = "/tmp/cllm_test_qin_XXXXXX", out[] = "/tmp/cllm_test_qout_XXXXXX";
    temp_pair(in, out);
    GGUFOutTensor extra[] = {{"c.weight", 3, {256, 3, 2, 1}, DT_F32}};
    LlamaSpec spec = {1, 256, 96, 4, 2, false, extra, 1, NULL, NULL, NULL, 0};
    int rc = write_llama(in, &spec);
    CHECK(rc == 0, "cannot write %s", in);
    Err err = {{0}};
    const DType types[] = {DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_Q4_0}, fallbacks[] = {DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q4_0};
    for (int k = 0; rc == 0 && k < 4; k++) {
        int r = quantize_model(in, out, types[k], NULL, &err);
        CHECK(r == 0, "quantize %s: %s", dtype_info(types[k])->name, err.msg);
        if (r == 0) check_copy(in, out, types[k], fallbacks[k]);
    }
    unlink(in);
    unlink(out);
}

/* The _M mix over 8 layers: more_bits takes layers 0, 3, 6, 7 (first and last
 * eighth, every third between), so attn_v / ffn_down there and the LM head
 * are Q6_K, everything else the base type; file_type 15 / 17. The expected
 * layers are llama.cpp's use_more_bits, written out by hand. */
static void test_quantize_k_m(void) {
    char in[] = "/tmp/cllm_test_qmin_XXXXXX", out[] = "/tmp/cllm_test_qmout_XXXXXX";
    temp_pair(in, out);
    const char *names[] = {"blk.0.attn_v.weight", "blk.0.attn_q.weight", "blk.3.ffn_down.weight",
                           "blk.5.ffn_down.weight", "blk.5.attn_v.weight", "blk.6.attn_v.weight",
                           "blk.7.ffn_down.weight", "blk.7.attn_k.weight", "output.weight", "blk.1.attn_norm.weight"};
    const bool q6[] = {true, false, true, false, false, true, true, false, true, false};
    enum { N = 10 };
    LlamaSpec spec = {8, 256, 256, 4, 2, true, NULL, 0, NULL, NULL, NULL, 0};
    Err err = {{0}};
    int rc = write_llama(in, &spec);
    CHECK(rc == 0, "cannot write %s", in);
    const DType bases[] = {DT_Q4_K, DT_Q5_K};
    for (int k = 0; rc == 0 && k < 2; k++) {
        int r = quantize_model_mix(in, out, bases[k], true, NULL, &err);
        CHECK(r == 0, "quantize %s_M: %s", dtype_info(bases[k])->name, err.msg);
        GGUFFile f;
        if (r || gguf_open(&f, out, &err)) continue;
        for (int i = 0; i < N; i++) {
            const GGUFTensor *g = gguf_find_tensor(&f, names[i]);
            DType want = i == N - 1 ? DT_F32 : q6[i] ? DT_Q6_K : bases[k];
            CHECK(g && g->type == want, "%s_M: %s is %s, not %s", dtype_info(bases[k])->name, names[i],
                  g ? dtype_info(g->type)->name : "missing", dtype_info(want)->name);
        }
        uint64_t ft = 0;
        CHECK(gguf_get_u64(&f, "general.file_type", &ft) == 0 && ft == (k ? 17u : 15u), "file_type %llu",
              (unsigned long long)ft);
        gguf_close(&f);
    }
    DType ty;
    bool k_m;
    CHECK(quantize_parse_recipe("Q4_K_M", &ty, &k_m) == 0 && ty == DT_Q4_K && k_m, "q4_k_m");
    CHECK(quantize_parse_recipe("q5_k_m", &ty, &k_m) == 0 && ty == DT_Q5_K && k_m, "q5_k_m");
    CHECK(quantize_parse_recipe("q6_k", &ty, &k_m) == 0 && ty == DT_Q6_K && !k_m, "q6_k");
    CHECK(quantize_parse_recipe("q8_0_m", &ty, &k_m) == -1 && quantize_parse_recipe("q4_k_mm", &ty, &k_m) == -1,
          "bad mixes accepted");
    CHECK(quantize_model_mix(in, out, DT_Q8_0, true, NULL, &err) == -1 && strstr(err.msg, "_M"), "Q8_0_M: %s",
          err.msg);
    unlink(in);
    unlink(out);
}

static void test_refusals(void) {
    float x[64] = {0};
    uint8_t buf[256];
    Err err = {{0}};
    CHECK(quantize_row(DT_Q2_K, x, buf, 256) == -1, "Q2_K accepted");
    CHECK(quantize_row(DT_Q8_0, x, buf, 48) == -1, "a partial Q8_0 block accepted");
    CHECK(quantize_parse_type("q4_k") == DT_Q4_K && quantize_parse_type("Q8_0") == DT_Q8_0, "type names");
    CHECK(quantize_parse_type("q3_k") == -1 && quantize_parse_type("") == -1, "bad type names accepted");
    char in[1024];
    snprintf(in, sizeof in, "%s/tiny/llama.gguf", test_fixture_dir());
    CHECK(quantize_model(in, in, DT_Q8_0, NULL, &err) == -1 && strstr(err.msg, "differ"), "IN == OUT: %s", err.msg);
    snprintf(in, sizeof in, "%s/quant/input_f32.bin", test_fixture_dir());
    CHECK(quantize_model(in, "/tmp/cllm_never_written.gguf", DT_Q8_0, NULL, &err) == -1 && strstr(err.msg, "GGUF"),
          "non-GGUF input: %s", err.msg);
    CHECK(quantize_model("/nonexistent/x.gguf", "/tmp/cllm_never_written.gguf", DT_Q8_0, NULL, &err) == -1,
          "missing input accepted");
    CHECK(access("/tmp/cllm_never_written.gguf", F_OK) != 0, "output written on a failure");
}

/* Inputs that `cllm info` refuses are refused before anything is written:
 * a missing tensor, a wrong shape, a token id past the vocabulary, a KV
 * head count that does not divide the head count. */
static void test_refuses_unloadable(void) {
    static const struct { LlamaSpec spec; const char *names[2]; } cases[] = {
        {{1, 64, 96, 4, 2, false, NULL, 0, "blk.0.ffn_up.weight", NULL, NULL, 0}, {"blk.0.ffn_up.weight", "missing"}},
        {{1, 64, 96, 4, 2, false, NULL, 0, NULL, "blk.0.attn_k.weight", NULL, 0}, {"blk.0.attn_k.weight", "shape"}},
        {{1, 64, 96, 4, 2, false, NULL, 0, NULL, NULL, "tokenizer.ggml.bos_token_id", 5000},
         {"tokenizer.ggml.bos_token_id", "5000"}},
        {{1, 64, 96, 4, 2, false, NULL, 0, NULL, NULL, "llama.attention.head_count_kv", 3},
         {"head_count_kv = 3", "must divide"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char in[] = "/tmp/cllm_test_qbad_XXXXXX", out[] = "/tmp/cllm_test_qbadout_XXXXXX";
        temp_pair(in, out);
        unlink(out);
        if (write_llama(in, &cases[k].spec)) { CHECK(0, "case %zu: cannot write %s", k, in); unlink(in); continue; }
        Err err = {{0}};
        Model m;
        int loads = model_load(&m, in, 0, &err) == 0;
        if (loads) model_free(&m);
        CHECK(!loads, "case %zu: the input loads", k);
        err.msg[0] = 0;
        CHECK(quantize_model(in, out, DT_Q8_0, NULL, &err) == -1, "case %zu (%s): quantized", k, cases[k].names[0]);
        CHECK(strstr(err.msg, in) && strstr(err.msg, cases[k].names[0]) && strstr(err.msg, cases[k].names[1]),
              "case %zu: the message does not name the file and '%s': %s", k, cases[k].names[0], err.msg);
        CHECK(access(out, F_OK) != 0, "case %zu: %s written", k, out);
        unlink(in);
        unlink(out);
    }
}

int main(void) {
    RUN(test_matches_gguf_package);
    RUN(test_quantize_k_m);
    RUN(test_k_quants_round_trip);
    RUN(test_quantize_tiny_llama);
    RUN(test_quantize_k_rows);
    RUN(test_refusals);
    RUN(test_refuses_unloadable);
    TEST_EXIT();
}
