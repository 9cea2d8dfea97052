/* dtype.c — element types, their block sizes, fp16/bf16 conversions and the
 * CPU reference dequantizer of every quantized GGUF block format cllm reads.
 *
 * Block layouts (QK_K = 256; "d" fields are little-endian fp16 unless noted;
 * "element i" is the i-th value of the block's output):
 *   Q4_0  18 B: d, qs[16]            e_i = d*(nib_i - 8); nib_i = low nibble of
 *                                    qs[i] for i < 16, high nibble of qs[i-16]
 *   Q4_1  20 B: d, m, qs[16]         e_i = d*nib_i + m
 *   Q5_0  22 B: d, qh(u32), qs[16]   e_i = d*((nib_i | bit_i(qh) << 4) - 16)
 *   Q5_1  24 B: d, m, qh, qs[16]     e_i = d*(nib_i | bit_i(qh) << 4) + m
 *   Q8_0  34 B: d, int8 qs[32]       e_i = d*qs[i]
 *   Q2_K  84 B: scales[16], qs[64], d, dmin
 *   Q3_K 110 B: hmask[32], qs[64], scales[12] (6-bit, packed), d
 *   Q4_K 144 B: d, dmin, scales[12] (6-bit scale/min pairs, packed), qs[128]
 *   Q5_K 176 B: d, dmin, scales[12], qh[32], qs[128]
 *   Q6_K 210 B: ql[128], qh[64], int8 scales[16], d
 *   MXFP4 17 B: e (E8M0 scale), qs[16] 4-bit e2m1 codes, nibbles ordered as Q4_0
 * The K-type details are documented beside each function.
 */
#include "base/dtype.h"

#include <math.h>
#include <string.h>

#define QK_K 256

/* Indexed by GGUF ggml_type id; entries with a NULL name are unsupported. */
static const DTypeInfo dtype_table[DT_COUNT] = {
    [DT_F32] = {"F32", 1, 4},
    [DT_F16] = {"F16", 1, 2},
    [DT_Q4_0] = {"Q4_0", 32, 18},
    [DT_Q4_1] = {"Q4_1", 32, 20},
    [DT_Q5_0] = {"Q5_0", 32, 22},
    [DT_Q5_1] = {"Q5_1", 32, 24},
    [DT_Q8_0] = {"Q8_0", 32, 34},
    [DT_Q2_K] = {"Q2_K", QK_K, 84},
    [DT_Q3_K] = {"Q3_K", QK_K, 110},
    [DT_Q4_K] = {"Q4_K", QK_K, 144},
    [DT_Q5_K] = {"Q5_K", QK_K, 176},
    [DT_Q6_K] = {"Q6_K", QK_K, 210},
    [DT_BF16] = {"BF16", 1, 2},
    [DT_MXFP4] = {"MXFP4", 32, 17},
    [DT_F8_E4M3] = {"F8_E4M3", 1, 1},
};

const DTypeInfo *dtype_info(uint32_t id) {
    if (id >= DT_COUNT || !dtype_table[id].name) return NULL;
    return &dtype_table[id];
}

bool dtype_is_ggml(uint32_t id) {
    return id != DT_F8_E4M3 && dtype_info(id) != NULL;
}

uint64_t dtype_row_bytes(DType t, uint64_t n) {
    const DTypeInfo *info = dtype_info((uint32_t)t);
    if (!info || n % (uint64_t)info->block_elems) return 0;
    uint64_t blocks = n / (uint64_t)info->block_elems;
    if (blocks > UINT64_MAX / (uint64_t)info->block_bytes) return 0;
    return blocks * (uint64_t)info->block_bytes;
}

bool dtype_gpu_keeps_blocks(DType t) {
    return t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q4_K ||
           t == DT_Q5_K || t == DT_Q6_K || t == DT_F8_E4M3;
}

/* ---- scalar conversions ---- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf / nan */
    return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Rounds the integer m / 2^shift to nearest, ties to even (1 <= shift <= 31). */
static uint32_t shift_round_even(uint32_t m, int shift) {
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* nan: keep it a (quiet) nan, keep the payload's top bits */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) /* normal half: rebias exponent by 127-15, round 13 bits off */
        return (uint16_t)(sign | shift_round_even(a - 0x38000000u, 13));
    if (a <= 0x33000000u) return sign; /* <= 2^-25: ties to even gives 0 */
    /* subnormal half: value * 2^24 rounded; m * 2^(e-150) * 2^24 = m >> (126-e) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_round_even(m, (int)(126 - e)));
}

float bf16_to_fp32(uint16_t b) {
    return f32_from_bits((uint32_t)b << 16);
}

uint16_t fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* E4M3: the fp32 exponent e (bias 127) becomes e - 120 (bias 7); normal
 * values keep 3 of the 23 mantissa bits (shift 20, rounded: a carry into the
 * exponent is the right answer); below 2^-6 the code is the value in units
 * of 2^-9, rounded (8 units = 2^-6 is code 0x08, the smallest normal, so
 * that carry is right too). */
uint8_t fp32_to_e4m3(float f) {
    uint32_t u = f32_bits(f), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (a > 0x7f800000u) return 0x7f;                  /* nan */
    if (a >= 0x43e00000u) return sign | 0x7e;          /* >= 448, inf: saturate */
    if (a >= 0x3c800000u) return sign | (uint8_t)shift_round_even(a - (120u << 23), 20); /* >= 2^-6 */
    if (a <= 0x3a800000u) return sign;                 /* <= 2^-10: ties to even gives 0 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u; /* m * 2^(e-150) / 2^-9 = m >> (141 - e) */
    return sign | (uint8_t)shift_round_even(m, (int)(141 - e));
}

float e4m3_to_fp32(uint8_t c) {
    int e = (c >> 3) & 0xf, m = c & 7;
    float v;
    if (e == 0xf && m == 7) return NAN;
    if (e == 0) v = (float)m * 0x1p-9f;
    else v = f32_from_bits((uint32_t)(e + 120) << 23 | (uint32_t)m << 20);
    return c & 0x80 ? -v : v;
}

void fp8_quantize_row(const float *x, int n, uint8_t *codes, float *scale) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a; /* false for a nan: ignored */
    }
    float s = amax / E4M3_MAX;
    *scale = s;
    /* an all-zero row: x * 0 keeps each zero's sign and a nan a nan */
    for (int i = 0; i < n; i++) codes[i] = fp32_to_e4m3(s > 0.0f ? x[i] / s : x[i] * 0.0f);
}

void fp8_dequantize_row(const uint8_t *codes, int n, float scale, float *y) {
    for (int i = 0; i < n; i++) y[i] = e4m3_to_fp32(codes[i]) * scale;
}

void fp8_quantize_row_fixed(const float *x, int n, float scale, uint8_t *codes) {
    for (int i = 0; i < n; i++) codes[i] = fp32_to_e4m3(x[i] / scale);
}

float fp8_scale_of_amax(float amax) {
    return amax > 0.0f && amax <= 3.4028235e38f ? amax / E4M3_MAX : 1.0f;
}

float fp8_quantize_weight_row(const float *x, int64_t n, uint8_t *codes) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a; /* false for a nan: ignored */
    }
    float s = amax > 0.0f && amax <= 3.4028235e38f ? amax / E4M3_MAX : 1.0f; /* an inf amax: scale 1, codes saturate */
    for (int64_t i = 0; i < n; i++) codes[i] = fp32_to_e4m3(x[i] / s);
    return s;
}

const char *kv_dtype_name(KVDtype t) { return t == KV_DTYPE_FP8 ? "fp8" : "bf16"; }

int kv_dtype_from_name(const char *s, KVDtype *t) {
    if (s && !strcmp(s, "bf16")) *t = KV_DTYPE_BF16;
    else if (s && !strcmp(s, "fp8")) *t = KV_DTYPE_FP8;
    else return -1;
    return 0;
}

const char *kv_scales_name(KVScales s) {
    return s == KV_SCALES_CHECKPOINT ? "checkpoint" : s == KV_SCALES_CALIBRATE ? "calibrate" : "dynamic";
}

int kv_scales_from_name(const char *s, KVScales *out) {
    if (s && !strcmp(s, "dynamic")) *out = KV_SCALES_DYNAMIC;
    else if (s && !strcmp(s, "checkpoint")) *out = KV_SCALES_CHECKPOINT;
    else if (s && !strcmp(s, "calibrate")) *out = KV_SCALES_CALIBRATE;
    else return -1;
    return 0;
}

uint64_t kv_head_token_bytes(KVDtype t, int head_dim_k, int head_dim_v) {
    uint64_t d = (uint64_t)head_dim_k + (uint64_t)head_dim_v;
    return t == KV_DTYPE_FP8 ? d + 2 * sizeof(float) : 2 * d;
}

/* ---- block decoders: one block in, block_elems floats out ---- */

static float rd_fp16(const uint8_t *p) {
    return fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8)));
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The 4-bit code of element i (0..31) of a 32-value block: low nibbles hold
 * elements 0..15, high nibbles 16..31. */
static int nibble32(const uint8_t *qs, int i) {
    return i < 16 ? qs[i] & 0xf : qs[i - 16] >> 4;
}

static void block_q4_0(const uint8_t *b, float *y) {
    float d = rd_fp16(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(nibble32(b + 2, i) - 8);
}

static void block_q4_1(const uint8_t *b, float *y) {
    float d = rd_fp16(b), m = rd_fp16(b + 2);
    for (int i = 0; i < 32; i++) y[i] = d * (float)nibble32(b + 4, i) + m;
}

static void block_q5_0(const uint8_t *b, float *y) {
    float d = rd_fp16(b);
    uint32_t qh = rd_u32(b + 2);
    for (int i = 0; i < 32; i++) {
        int q = nibble32(b + 6, i) | (int)((qh >> i) & 1) << 4;
        y[i] = d * (float)(q - 16);
    }
}

static void block_q5_1(const uint8_t *b, float *y) {
    float d = rd_fp16(b), m = rd_fp16(b + 2);
    uint32_t qh = rd_u32(b + 4);
    for (int i = 0; i < 32; i++) {
        int q = nibble32(b + 8, i) | (int)((qh >> i) & 1) << 4;
        y[i] = d * (float)q + m;
    }
}

static void block_q8_0(const uint8_t *b, float *y) {
    float d = rd_fp16(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(int8_t)b[2 + i];
}

/* Q2_K: element i = h*128 + j*32 + l (h < 2, j < 4, l < 32) has the 2-bit code
 * (qs[h*32 + l] >> 2j) & 3; each run of 16 elements s = i/16 has scale byte
 * scales[s]: low nibble times d is the scale, high nibble times dmin the min. */
static void block_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *qs = b + 16;
    float d = rd_fp16(b + 80), dmin = rd_fp16(b + 82);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, j = (i / 32) % 4, l = i % 32, s = i / 16;
        float dl = d * (float)(scales[s] & 0xf), ml = dmin * (float)(scales[s] >> 4);
        y[i] = dl * (float)((qs[h * 32 + l] >> (2 * j)) & 3) - ml;
    }
}

/* Q3_K: 16 signed 6-bit scales: scale s has its low 4 bits in scales[s % 8]
 * (low nibble for s < 8, high for s >= 8) and its high 2 bits in
 * scales[8 + s % 4] at bit 2*(s / 4); minus 32. Element i = h*128 + j*32 + l
 * has low 2 bits (qs[h*32 + l] >> 2j) & 3 and, when bit i/32 of hmask[l] is
 * CLEAR, 4 subtracted. */
static void block_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    float d = rd_fp16(b + 108);
    float dl[16];
    for (int s = 0; s < 16; s++) {
        int lo = (sc[s % 8] >> (s < 8 ? 0 : 4)) & 0xf;
        int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        dl[s] = d * (float)((lo | hi << 4) - 32);
    }
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, j = (i / 32) % 4, l = i % 32;
        int q = (qs[h * 32 + l] >> (2 * j)) & 3;
        if (!((hmask[l] >> (i / 32)) & 1)) q -= 4;
        y[i] = dl[i / 16] * (float)q;
    }
}

/* Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min in
 * 12 bytes: for k < 4, scale = sc[k] & 63, min = sc[k+4] & 63; for k >= 4,
 * scale = (sc[k+4] & 15) | (sc[k-4] >> 6) << 4, min = (sc[k+4] >> 4) | (sc[k] >> 6) << 4. */
void kquant_scale_min(const uint8_t *sc, int k, int *scale, int *min) {
    if (k < 4) {
        *scale = sc[k] & 63;
        *min = sc[k + 4] & 63;
    } else {
        *scale = (sc[k + 4] & 0xf) | (sc[k - 4] >> 6) << 4;
        *min = (sc[k + 4] >> 4) | (sc[k] >> 6) << 4;
    }
}

/* Q4_K: element i = c*64 + n*32 + l has the nibble (qs[c*32 + l] >> 4n) & 15
 * (low nibbles first); sub-block i/32. Q5_K adds bit i/32 of qh[l] as bit 4. */
static void block_q45_k(const uint8_t *b, float *y, const uint8_t *qh) {
    float d = rd_fp16(b), dmin = rd_fp16(b + 2);
    const uint8_t *sc = b + 4, *qs = qh ? b + 48 : b + 16;
    for (int k = 0; k < 8; k++) {
        int scale, min;
        kquant_scale_min(sc, k, &scale, &min);
        float dl = d * (float)scale, ml = dmin * (float)min;
        for (int l = 0; l < 32; l++) {
            int i = k * 32 + l;
            int q = (qs[(k / 2) * 32 + l] >> (4 * (k % 2))) & 0xf;
            if (qh) q |= ((qh[l] >> k) & 1) << 4;
            y[i] = dl * (float)q - ml;
        }
    }
}

/* Q6_K: element i = h*128 + j*32 + l: low 4 bits from ql[h*64 + (j%2)*32 + l]
 * (low nibble for j < 2, high for j >= 2), high 2 bits (qh[h*32 + l] >> 2j) & 3;
 * minus 32; times d * scales[i/16]. */
static void block_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = rd_fp16(b + 208);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, j = (i / 32) % 4, l = i % 32;
        int lo = (ql[h * 64 + (j % 2) * 32 + l] >> (4 * (j / 2))) & 0xf;
        int hi = (qh[h * 32 + l] >> (2 * j)) & 3;
        y[i] = d * (float)scales[i / 16] * (float)((lo | hi << 4) - 32);
    }
}

/* MXFP4: e2m1 codes (sign, 2 exponent bits, 1 mantissa bit) stored doubled so
 * they are integers; the E8M0 scale 2^(e-127) is halved to compensate. */
static const int8_t e2m1_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float e8m0_half(uint8_t e) {
    /* 2^(e-128): for e < 2 that is a subnormal fp32 */
    return f32_from_bits(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

static void block_mxfp4(const uint8_t *b, float *y) {
    float d = e8m0_half(b[0]);
    for (int i = 0; i < 32; i++) y[i] = d * (float)e2m1_doubled[nibble32(b + 1, i)];
}

typedef void (*BlockFn)(const uint8_t *b, float *y);

static void block_q4_k(const uint8_t *b, float *y) { block_q45_k(b, y, NULL); }
static void block_q5_k(const uint8_t *b, float *y) { block_q45_k(b, y, b + 16); }

static BlockFn block_fn(DType t) {
    switch (t) {
    case DT_Q4_0: return block_q4_0;
    case DT_Q4_1: return block_q4_1;
    case DT_Q5_0: return block_q5_0;
    case DT_Q5_1: return block_q5_1;
    case DT_Q8_0: return block_q8_0;
    case DT_Q2_K: return block_q2_k;
    case DT_Q3_K: return block_q3_k;
    case DT_Q4_K: return block_q4_k;
    case DT_Q5_K: return block_q5_k;
    case DT_Q6_K: return block_q6_k;
    case DT_MXFP4: return block_mxfp4;
    default: return NULL;
    }
}

void dequantize_row(DType t, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    if (n <= 0) return;
    switch (t) {
    case DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = rd_fp16(p + 2 * i);
        return;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return;
    case DT_F8_E4M3: /* the codes' values; the row's scale is the caller's (WeightRef.scale) */
        for (int64_t i = 0; i < n; i++) dst[i] = e4m3_to_fp32(p[i]);
        return;
    default: break;
    }
    const DTypeInfo *info = dtype_info((uint32_t)t);
    BlockFn fn = block_fn(t);
    if (!info || !fn) { /* a caller bug: make it visible rather than silent zeros */
        for (int64_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
    int64_t be = info->block_elems, nb = n / be;
    for (int64_t k = 0; k < nb; k++) fn(p + k * info->block_bytes, dst + k * be);
    for (int64_t i = nb * be; i < n; i++) dst[i] = NAN; /* a partial block: precondition broken */
}
