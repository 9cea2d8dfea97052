/* test_dtype.c — dtype table, row sizes, fp16/bf16/e4m3 conversions, the
 * fp8 row quantizer of the KV cache, and every dequantizer against gguf-py's
 * dequantization (fixtures written by tests/fixtures/make_gguf_fixtures.py:
 * synthetic blocks and rows of the real model files).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"
#include "test.h"

/* Bit-level views of a float, through a union (well defined in C11). */
typedef union {
    float f;
    uint32_t u;
} F32Bits;

static float f_bits(uint32_t u) { return (F32Bits){.u = u}.f; }
static uint32_t bits_f(float f) { return (F32Bits){.f = f}.u; }

/* Halves (fp16 or bf16) that do not survive to-fp32-and-back; NaNs skipped. */
static int roundtrip_failures(float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = to_f32((uint16_t)h);
        if (!isnan(f)) bad += from_f32(f) != h;
    }
    return bad;
}

/* gpu: dtype_gpu_keeps_blocks, the types the CUDA backend reads in their
 * blocks (kernels/cuda/quant.cuh); the rest become bf16 there */
static void test_dtype_info_table(void) {
    static const struct { uint32_t id; const char *name; int elems, bytes; bool gpu; } known[] = {
        {0, "F32", 1, 4, false},       {1, "F16", 1, 2, false},       {2, "Q4_0", 32, 18, true},
        {3, "Q4_1", 32, 20, true},     {6, "Q5_0", 32, 22, true},     {7, "Q5_1", 32, 24, true},
        {8, "Q8_0", 32, 34, true},     {10, "Q2_K", 256, 84, false},  {11, "Q3_K", 256, 110, false},
        {12, "Q4_K", 256, 144, true},  {13, "Q5_K", 256, 176, true},  {14, "Q6_K", 256, 210, true},
        {30, "BF16", 1, 2, false},     {39, "MXFP4", 32, 17, false},  {40, "F8_E4M3", 1, 1, true},
    };
    int n_known = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const DTypeInfo *d = dtype_info(known[i].id);
        CHECK(d != NULL, "id %u", known[i].id);
        if (!d) continue;
        CHECK(strcmp(d->name, known[i].name) == 0, "id %u: %s", known[i].id, d->name);
        CHECK(d->block_elems == known[i].elems && d->block_bytes == known[i].bytes, "%s", d->name);
        CHECK(dtype_gpu_keeps_blocks((DType)known[i].id) == known[i].gpu, "%s: kept in blocks on the GPU: %d, want %d",
              d->name, dtype_gpu_keeps_blocks((DType)known[i].id), known[i].gpu);
    }
    for (uint32_t id = 0; id < 64; id++) n_known += dtype_info(id) != NULL;
    CHECK(n_known == 15, "%d ids known", n_known);
    CHECK(dtype_info(4) == NULL && dtype_info(5) == NULL && dtype_info(9) == NULL, "unsupported ids");
    CHECK(dtype_info(41) == NULL && dtype_info(1000) == NULL && dtype_info(UINT32_MAX) == NULL,
          "out of range ids");
    /* F8_E4M3 (40) is cllm's own: one byte a value, and no ggml type */
    const DTypeInfo *f8 = dtype_info(DT_F8_E4M3);
    CHECK(f8 && !strcmp(f8->name, "F8_E4M3") && f8->block_elems == 1 && f8->block_bytes == 1, "F8_E4M3");
    CHECK(!dtype_is_ggml(DT_F8_E4M3) && dtype_is_ggml(DT_Q4_K) && dtype_is_ggml(DT_F32) && !dtype_is_ggml(4),
          "dtype_is_ggml");
    uint8_t codes[3] = {0x38, 0xfe, 0x7f};
    float v[3];
    dequantize_row(DT_F8_E4M3, codes, v, 3);
    CHECK(v[0] == 1.0f && v[1] == -448.0f && isnan(v[2]), "F8_E4M3 rows decode to the codes' values");
}

static void test_dtype_row_bytes(void) {
    CHECK(dtype_row_bytes(DT_F32, 10) == 40, "f32");
    CHECK(dtype_row_bytes(DT_BF16, 3) == 6, "bf16");
    CHECK(dtype_row_bytes(DT_Q4_0, 64) == 36, "q4_0");
    CHECK(dtype_row_bytes(DT_Q6_K, 512) == 420, "q6_k");
    CHECK(dtype_row_bytes(DT_MXFP4, 96) == 51, "mxfp4");
    CHECK(dtype_row_bytes(DT_Q4_0, 33) == 0, "partial block");
    CHECK(dtype_row_bytes(DT_Q4_K, 128) == 0, "half a K block");
    CHECK(dtype_row_bytes((DType)5, 32) == 0, "unsupported type");
    CHECK(dtype_row_bytes((DType)99, 32) == 0, "out of range type");
    CHECK(dtype_row_bytes(DT_F32, UINT64_MAX / 4) == UINT64_MAX / 4 * 4, "largest f32 row");
    CHECK(dtype_row_bytes(DT_F32, UINT64_MAX / 4 + 1) == 0, "f32 overflow");
    CHECK(dtype_row_bytes(DT_F16, UINT64_MAX) == 0, "f16 overflow");
    /* only types with more bytes than values per block can overflow */
    CHECK(dtype_row_bytes(DT_Q8_0, (UINT64_MAX / 34 + 1) * 32) == 0, "q8_0 overflow");
    CHECK(dtype_row_bytes(DT_Q8_0, UINT64_MAX / 34 * 32) == UINT64_MAX / 34 * 34, "largest q8_0");
}

static void test_fp16_to_fp32(void) {
    CHECK(fp16_to_fp32(0x0000) == 0.0f && !signbit(fp16_to_fp32(0x0000)), "+0");
    CHECK(fp16_to_fp32(0x8000) == 0.0f && signbit(fp16_to_fp32(0x8000)), "-0");
    CHECK(fp16_to_fp32(0x3c00) == 1.0f, "1");
    CHECK(fp16_to_fp32(0xc000) == -2.0f, "-2");
    CHECK(fp16_to_fp32(0x7bff) == 65504.0f, "max");
    CHECK(fp16_to_fp32(0x0400) == 0x1p-14f, "min normal");
    CHECK(fp16_to_fp32(0x0001) == 0x1p-24f, "min subnormal");
    CHECK(fp16_to_fp32(0x83ff) == -1023 * 0x1p-24f, "max subnormal, negative");
    CHECK(fp16_to_fp32(0x3555) == 0.333251953125f, "1/3");
    CHECK(isinf(fp16_to_fp32(0x7c00)) && fp16_to_fp32(0x7c00) > 0, "+inf");
    CHECK(isinf(fp16_to_fp32(0xfc00)) && fp16_to_fp32(0xfc00) < 0, "-inf");
    CHECK(isnan(fp16_to_fp32(0x7e00)) && isnan(fp16_to_fp32(0x7c01)) && isnan(fp16_to_fp32(0xfe00)),
          "nan");
}

static void test_fp32_to_fp16(void) {
    static const struct { float f; uint16_t h; } cases[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000},
        {65504.0f, 0x7bff}, {65519.99f, 0x7bff}, {65520.0f, 0x7c00}, {1e6f, 0x7c00},
        {-1e6f, 0xfc00}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, /* tie: to even 0 */
        {3 * 0x1p-25f, 0x0002},                                     /* 1.5 units: to even 2 */
        {0x1p-14f - 0x1p-25f, 0x0400},                              /* 1023.5 units: to 1024 */
        {1.0f + 0x1p-11f, 0x3c00},                                  /* tie: to even */
        {1.0f + 3 * 0x1p-11f, 0x3c02},                              /* tie: to even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},                       /* above the tie */
        {0.1f, 0x2e66}, {1e-10f, 0x0000}, {-1e-10f, 0x8000}, {FLT_MAX, 0x7c00},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = fp32_to_fp16(cases[i].f);
        CHECK(h == cases[i].h, "fp32_to_fp16(%a) = 0x%04x, want 0x%04x", cases[i].f, h, cases[i].h);
    }
    CHECK(fp32_to_fp16(f_bits(0x33000001)) == 0x0001, "just above 2^-25 rounds up");
    uint16_t n = fp32_to_fp16(NAN), sn = fp32_to_fp16(f_bits(0x7f800001));
    CHECK((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0, "nan -> 0x%04x", n);
    CHECK((sn & 0x7c00) == 0x7c00 && (sn & 0x3ff) != 0, "signalling nan with a low payload -> 0x%04x", sn);
    int bad = roundtrip_failures(fp16_to_fp32, fp32_to_fp16);
    CHECK(bad == 0, "%d halves did not round-trip", bad);
}

static void test_bf16(void) {
    CHECK(bf16_to_fp32(0x3f80) == 1.0f, "1");
    CHECK(bf16_to_fp32(0x4049) == 3.140625f, "pi-ish");
    CHECK(bf16_to_fp32(0xc2f7) == -123.5f, "-123.5");
    CHECK(isinf(bf16_to_fp32(0xff80)) && bf16_to_fp32(0xff80) < 0, "-inf");
    CHECK(bf16_to_fp32(0x0001) == f_bits(0x00010000), "subnormal");
    static const struct { uint32_t f; uint16_t b; } cases[] = {
        {0x3f800000, 0x3f80},                 /* 1 */
        {0x3f808000, 0x3f80},                 /* 1 + 2^-8: tie, to even */
        {0x3f818000, 0x3f82},                 /* 1 + 3*2^-8: tie, to even */
        {0x3f808001, 0x3f81},                 /* above the tie */
        {0x3f807fff, 0x3f80},                 /* below the tie */
        {0x7f7fffff, 0x7f80},                 /* FLT_MAX rounds to inf */
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80}, /* +-inf */
        {0x00008000, 0x0000}, {0x00018000, 0x0002}, /* subnormal ties */
        {0x80000000, 0x8000},                 /* -0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t b = fp32_to_bf16(f_bits(cases[i].f));
        CHECK(b == cases[i].b, "fp32_to_bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].f, b, cases[i].b);
    }
    CHECK(fp32_to_bf16(f_bits(0x7f800001)) == 0x7fc0, "signalling nan becomes quiet, not inf");
    CHECK(fp32_to_bf16(f_bits(0xffc00000)) == 0xffc0, "-nan");
    CHECK(fp32_to_bf16(f_bits(0x7fffffff)) == 0x7fff, "nan with a full payload stays nan");
    int bad = roundtrip_failures(bf16_to_fp32, fp32_to_bf16);
    CHECK(bad == 0, "%d bf16 values did not round-trip", bad);
}

/* ---- dequantizers vs gguf-py ---- */

/* Reads a fixture file that must hold exactly n bytes; NULL otherwise. */
static void *load_exact(const char *path, size_t n) {
    FILE *fp = fopen(path, "rb");
    uint8_t *buf = fp ? malloc(n + 1) : NULL;
    size_t got = buf ? fread(buf, 1, n + 1, fp) : 0; /* n + 1: a longer file shows */
    if (fp) fclose(fp);
    if (got != n) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Compares got with want: NaN where NaN is expected, otherwise within 1e-6
 * relative (fp32 rounding only). Returns the number of mismatches and counts
 * bit-exact values in *exact. */
static int compare_floats(const char *name, const float *got, const float *want, int64_t n,
                          int64_t *exact) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        if (isnan(want[i])) ok = isnan(got[i]);
        else ok = got[i] == want[i] || fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]);
        *exact += bits_f(got[i]) == bits_f(want[i]) || (isnan(got[i]) && isnan(want[i]));
        if (!ok && bad++ < 5)
            printf("  %s[%lld]: got %.9g (0x%08x), want %.9g (0x%08x)\n", name, (long long)i,
                   got[i], bits_f(got[i]), want[i], bits_f(want[i]));
    }
    return bad;
}

/* Dequantizes the whole row, then its second half alone (from a block
 * boundary), and compares both with gguf-py's values. */
static void dequantize_and_compare(const char *name, DType type, const uint8_t *raw,
                                   const float *want, int64_t n, int64_t *exact) {
    const DTypeInfo *info = dtype_info(type);
    float *got = malloc((size_t)n * sizeof *got);
    dequantize_row(type, raw, got, n);
    int bad = compare_floats(name, got, want, n, exact);
    CHECK(bad == 0, "%s (%s): %d of %lld values differ", name, info->name, bad, (long long)n);
    int64_t half = n / 2 / info->block_elems * info->block_elems;
    if (half > 0) {
        memset(got, 0, (size_t)n * sizeof *got);
        dequantize_row(type, raw + half / info->block_elems * info->block_bytes, got, n - half);
        int64_t ignored = 0;
        CHECK(compare_floats(name, got, want + half, n - half, &ignored) == 0, "%s: second half", name);
    }
    free(got);
}

/* One fixture case: NAME.raw and NAME.f32 under gguf/dequant. */
static void check_case(const char *dir, const char *name, uint32_t type, int64_t n, int64_t *exact,
                       int64_t *total) {
    char path[1024];
    uint8_t *raw = NULL;
    float *want = NULL;
    const DTypeInfo *info = dtype_info(type);
    uint64_t raw_len = dtype_row_bytes((DType)type, (uint64_t)n);
    CHECK(info != NULL && raw_len > 0, "%s: type %u with %lld values", name, type, (long long)n);
    if (!info || raw_len == 0) return;
    snprintf(path, sizeof path, "%s/gguf/dequant/%s.raw", dir, name);
    raw = load_exact(path, raw_len);
    snprintf(path, sizeof path, "%s/gguf/dequant/%s.f32", dir, name);
    want = load_exact(path, (size_t)n * sizeof(float));
    CHECK(raw && want, "%s: fixture files missing or of the wrong size", name);
    if (raw && want) {
        dequantize_and_compare(name, (DType)type, raw, want, n, exact);
        *total += n;
    }
    free(raw);
    free(want);
}

static void test_dequantize_fixtures(void) {
    const char *dir = test_fixture_dir();
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/gguf/dequant.txt", dir);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL, "%s missing: run tests/fixtures/make_gguf_fixtures.py", path);
    if (!fp) return;
    bool seen[DT_COUNT] = {0};
    bool real_seen[DT_COUNT] = {0};
    int cases = 0;
    int64_t exact = 0, total = 0;
    while (fgets(line, sizeof line, fp)) {
        char name[400];
        unsigned type;
        long long n;
        if (line[0] == '#' || sscanf(line, "%399s %u %lld", name, &type, &n) != 3) continue;
        check_case(dir, name, type, n, &exact, &total);
        if (type < DT_COUNT) {
            seen[type] = true;
            if (strncmp(name, "real-", 5) == 0) real_seen[type] = true;
        }
        cases++;
    }
    fclose(fp);
    static const DType all[] = {DT_F32, DT_F16, DT_BF16, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1,
                                DT_Q8_0, DT_Q2_K, DT_Q3_K, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_MXFP4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK(seen[all[i]], "no fixture for %s", dtype_info(all[i])->name);
    static const DType real[] = {DT_F32, DT_Q4_1, DT_Q5_0, DT_Q8_0, DT_Q4_K, DT_Q6_K};
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++)
        CHECK(real_seen[real[i]], "no real-model fixture for %s", dtype_info(real[i])->name);
    CHECK(cases >= 30, "only %d cases", cases);
    printf("  %d cases, %lld values, %lld bit-exact\n", cases, (long long)total, (long long)exact);
}

/* Hand-built blocks whose values are easy to derive on paper. */
static void test_dequantize_hand_blocks(void) {
    uint8_t q4[18] = {0x00, 0x3c}; /* d = 1 */
    for (int i = 0; i < 16; i++) q4[2 + i] = (uint8_t)(i | (15 - i) << 4);
    float y[32];
    dequantize_row(DT_Q4_0, q4, y, 32);
    CHECK(y[0] == -8 && y[15] == 7 && y[16] == 7 && y[31] == -8, "q4_0 %g %g %g %g", y[0], y[15], y[16], y[31]);
    uint8_t q8[34] = {0x00, 0xc0}; /* d = -2 */
    for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i - 16);
    dequantize_row(DT_Q8_0, q8, y, 32);
    CHECK(y[0] == 32 && y[16] == 0 && y[31] == -30, "q8_0 %g %g %g", y[0], y[16], y[31]);
    uint8_t mx[17] = {128}; /* scale 2^(128-127) = 2; codes doubled, so value = code value */
    for (int i = 0; i < 16; i++) mx[1 + i] = (uint8_t)(i | i << 4);
    dequantize_row(DT_MXFP4, mx, y, 32);
    CHECK(y[1] == 1.0f && y[5] == 6.0f && y[7] == 12.0f && y[15] == -12.0f && y[16 + 9] == -1.0f,
          "mxfp4 %g %g %g %g %g", y[1], y[5], y[7], y[15], y[25]);
}

/* ---- e4m3 ---- */

/* The e4m3 value of code c (c & 0x7f < 0x7f) from its definition, in double. */
static double e4m3_by_definition(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1 + m / 8.0) * ldexp(1.0, e - 7);
    return c & 0x80 ? -v : v;
}

/* The code nearest to x (finite), ties to the even code, saturating at 448:
 * a search over all 127 magnitudes, independent of fp32_to_e4m3's bit
 * arithmetic. */
static uint8_t e4m3_by_search(float x) {
    double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        double d = fabs(e4m3_by_definition(c) - a), db = fabs(e4m3_by_definition(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

static void test_e4m3_codes(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float f = e4m3_to_fp32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            CHECK(isnan(f) && fp32_to_e4m3(f) == 0x7f, "code 0x%02x: nan, and back to 0x7f", c);
            continue;
        }
        bad += (double)f != e4m3_by_definition(c) || fp32_to_e4m3(f) != c;
    }
    CHECK(bad == 0, "%d of the 254 finite codes differ from the definition or do not round-trip", bad);
    CHECK(e4m3_to_fp32(0x01) == 0x1p-9f && e4m3_to_fp32(0x08) == 0x1p-6f && e4m3_to_fp32(0x07) == 7 * 0x1p-9f,
          "subnormals and the smallest normal");
    CHECK(e4m3_to_fp32(0x38) == 1.0f && e4m3_to_fp32(0x7e) == 448.0f && e4m3_to_fp32(0xfe) == -448.0f, "1, +-448");
    CHECK(e4m3_to_fp32(0x80) == 0.0f && signbit(e4m3_to_fp32(0x80)), "-0");
    for (int c = 1; c < 0x7e; c++) bad += !(e4m3_to_fp32((uint8_t)c) < e4m3_to_fp32((uint8_t)(c + 1)));
    CHECK(bad == 0, "codes 0..0x7e increase");
}

/* Every midpoint between neighbouring codes (exact in fp32) goes to the even
 * one, one ulp either side to the nearer; both signs. */
static void test_e4m3_ties(void) {
    int bad = 0;
    for (int c = 0; c < 0x7e; c++)
        for (int sign = 0; sign < 2; sign++) {
            float lo = e4m3_to_fp32((uint8_t)c), hi = e4m3_to_fp32((uint8_t)(c + 1)), mid = (lo + hi) / 2;
            uint8_t s = sign ? 0x80 : 0, even = (uint8_t)(c & 1 ? c + 1 : c);
            float sm = sign ? -mid : mid;
            bad += fp32_to_e4m3(sm) != (s | even);
            bad += fp32_to_e4m3(nextafterf(sm, sign ? -INFINITY : INFINITY)) != (s | (c + 1));
            bad += fp32_to_e4m3(nextafterf(sm, 0)) != (s | c);
        }
    CHECK(bad == 0, "%d tie / near-tie roundings wrong", bad);
    CHECK(fp32_to_e4m3(0x1p-10f) == 0x00 && fp32_to_e4m3(-0x1p-10f) == 0x80, "half the smallest subnormal: to 0");
    CHECK(fp32_to_e4m3(nextafterf(0x1p-10f, 1)) == 0x01, "above it: the smallest subnormal");
    CHECK(fp32_to_e4m3(3 * 0x1p-10f) == 0x02, "1.5 subnormal steps: to the even 2");
    CHECK(fp32_to_e4m3(1e-30f) == 0x00 && fp32_to_e4m3(-1e-30f) == 0x80 && fp32_to_e4m3(-0.0f) == 0x80, "tiny, -0");
}

static void test_e4m3_saturation_nan(void) {
    float big[] = {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(fp32_to_e4m3(big[i]) == 0x7e, "%g saturates to 448: 0x%02x", big[i], fp32_to_e4m3(big[i]));
        CHECK(fp32_to_e4m3(-big[i]) == 0xfe, "-%g saturates to -448", big[i]);
    }
    CHECK(fp32_to_e4m3(nextafterf(448.0f, 0)) == 0x7e && fp32_to_e4m3(432.0f) == 0x7e, "just below 448; 432 ties to even 448");
    CHECK(fp32_to_e4m3(NAN) == 0x7f && fp32_to_e4m3(-NAN) == 0x7f && fp32_to_e4m3(f_bits(0x7f800001)) == 0x7f,
          "every nan to 0x7f");
}

/* All 65536 bf16 patterns and 200000 random fp32 bit patterns against the
 * nearest-code search. */
static void test_e4m3_against_search(void) {
    int bad = 0, first = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_fp32((uint16_t)h);
        if (isnan(f)) continue;
        uint8_t want = fabsf(f) >= 448 ? (uint8_t)(signbit(f) ? 0xfe : 0x7e) : e4m3_by_search(f);
        if (fp32_to_e4m3(f) != want) { bad++; if (first < 0) first = (int)h; }
    }
    CHECK(bad == 0, "%d bf16 values convert wrongly (first 0x%04x)", bad, first);
    uint32_t x = 2463534242u;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        uint32_t u = (x & 0x807fffffu) | ((110u + x % 26u) << 23); /* exponents 2^-17 .. 2^8: the interesting range */
        float f = f_bits(u);
        uint8_t want = fabsf(f) >= 448 ? (uint8_t)(signbit(f) ? 0xfe : 0x7e) : e4m3_by_search(f);
        bad += fp32_to_e4m3(f) != want;
    }
    CHECK(bad == 0, "%d random values convert wrongly", bad);
}

/* fp8_quantize_row: the largest magnitude becomes +-448 exactly (scale =
 * amax / 448), every value comes back within half an e4m3 step: 2^-4
 * relative at or above 2^-6 x scale, 2^-10 x scale absolute below (plus
 * the two fp32 roundings of x / scale and code x scale), and reads back as
 * code x scale exactly (the value both backends attend over). */
static void test_fp8_row(void) {
    enum { N = 96 };
    float x[N], y[N], s;
    uint8_t q[N];
    uint32_t r = 88172645u;
    int bad = 0;
    for (int row = 0; row < 200; row++) {
        float mag = ldexpf(1.0f, row % 40 - 20);
        for (int i = 0; i < N; i++) {
            r ^= r << 13, r ^= r >> 17, r ^= r << 5;
            x[i] = mag * ((float)(r % 2000001) / 1000000.0f - 1.0f) * (i % 7 == 0 ? 1e-4f : 1.0f);
        }
        fp8_quantize_row(x, N, q, &s);
        fp8_dequantize_row(q, N, s, y);
        float amax = 0;
        for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
        CHECK(s == amax / 448.0f, "row %d: scale %g, amax %g", row, s, amax);
        for (int i = 0; i < N; i++) {
            double err = fabs((double)y[i] - x[i]), ax = fabs(x[i]);
            double bound = (ax >= 0x1p-6 * s ? 0x1p-4 * ax : 0x1p-10 * s) + 0x1p-21 * ax;
            bad += !(err <= bound);
            bad += y[i] != e4m3_to_fp32(q[i]) * s; /* exactly the rule */
            if (fabsf(x[i]) == amax) bad += (q[i] & 0x7f) != 0x7e;
        }
    }
    CHECK(bad == 0, "%d values outside half an e4m3 step, or a maximum not at 448", bad);
    float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    fp8_quantize_row(zeros, 4, q, &s);
    CHECK(s == 0.0f && q[0] == 0x00 && q[1] == 0x80 && q[2] == 0, "a zero row: scale 0, zero codes");
    float withnan[3] = {1.0f, NAN, -2.0f};
    fp8_quantize_row(withnan, 3, q, &s);
    CHECK(s == 2.0f / 448.0f && q[1] == 0x7f && q[2] == 0xfe && q[0] == fp32_to_e4m3(1.0f / s), "a nan stays a nan");
}

static void test_kv_dtype_names(void) {
    KVDtype t = KV_DTYPE_FP8;
    CHECK(kv_dtype_from_name("bf16", &t) == 0 && t == KV_DTYPE_BF16, "bf16");
    CHECK(kv_dtype_from_name("fp8", &t) == 0 && t == KV_DTYPE_FP8, "fp8");
    CHECK(kv_dtype_from_name("FP8", &t) == -1 && kv_dtype_from_name("e4m3", &t) == -1 &&
              kv_dtype_from_name("", &t) == -1 && kv_dtype_from_name(NULL, &t) == -1 && t == KV_DTYPE_FP8,
          "unknown names refused, nothing changed");
    CHECK(!strcmp(kv_dtype_name(KV_DTYPE_FP8), "fp8") && !strcmp(kv_dtype_name(KV_DTYPE_BF16), "bf16"), "names");
    CHECK(kv_head_token_bytes(KV_DTYPE_BF16, 64, 64) == 256 && kv_head_token_bytes(KV_DTYPE_FP8, 64, 64) == 136 &&
              kv_head_token_bytes(KV_DTYPE_FP8, 256, 256) == 520,
          "bytes per token and head");
}

int main(void) {
    RUN(test_e4m3_codes);
    RUN(test_e4m3_ties);
    RUN(test_e4m3_saturation_nan);
    RUN(test_e4m3_against_search);
    RUN(test_fp8_row);
    RUN(test_kv_dtype_names);
    RUN(test_dtype_info_table);
    RUN(test_dtype_row_bytes);
    RUN(test_fp16_to_fp32);
    RUN(test_fp32_to_fp16);
    RUN(test_bf16);
    RUN(test_dequantize_fixtures);
    RUN(test_dequantize_hand_blocks);
    TEST_EXIT();
}
