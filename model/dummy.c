/* dummy.c — random weights of any shape for --dummy-weights; see dummy.h.
 *
 * A block type is filled in two passes: random bytes everywhere (the codes),
 * then each block's scale fields are overwritten with values that make the
 * block valid and give the dequantized values the standard deviation
 * DUMMY_STD. The random bits a scale field held before it is overwritten
 * pick that block's sub-block scales and signs, so no second generator is
 * needed. For uniform codes over lo..hi the scales follow from
 *   rms(lo..hi) = sqrt(((hi-lo+1)^2 - 1)/12 + ((lo+hi)/2)^2)
 * (sd: the same without the mean term, for types whose min cancels it). */
#include "model/dummy.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/quantize.h"

static const DType SUPPORTED[] = {DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_F8_E4M3};
#define N_SUPPORTED (sizeof SUPPORTED / sizeof SUPPORTED[0])

bool dummy_type_supported(DType t) {
    for (size_t i = 0; i < N_SUPPORTED; i++)
        if (SUPPORTED[i] == t) return true;
    return false;
}

int dummy_type_parse(const char *name, DType *t, Err *err) {
    if (name && !strcasecmp(name, "fp8")) { *t = DT_F8_E4M3; return 0; } /* --weights fp8's spelling */
    for (size_t i = 0; name && i < N_SUPPORTED; i++)
        if (!strcasecmp(name, dtype_info(SUPPORTED[i])->name)) { *t = SUPPORTED[i]; return 0; }
    return err_set(err, "--dummy-weights=%s: not a type cllm makes dummy weights in (one of %s)", name ? name : "",
                   DUMMY_TYPE_NAMES);
}

DType dummy_tensor_type(DType t, int64_t rows, int64_t cols) {
    if (rows <= 1 || !dummy_type_supported(t)) return DT_BF16;
    /* rows of partial blocks cannot be stored in t: such a matrix stays bf16 */
    return cols % dtype_info(t)->block_elems ? DT_BF16 : t;
}

DType dummy_head_type(DType t) {
    if (t == DT_F8_E4M3) return DT_BF16; /* FP8 checkpoints keep lm_head in bf16 */
    return t == DT_BF16 || t == DT_Q8_0 ? t : DT_Q6_K;
}

float dummy_fp8_scale(void) {
    double sum = 0;
    int n = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) { /* the two NaN codes: never stored (fix_f8_e4m3) */
            double v = e4m3_to_fp32((uint8_t)c);
            sum += v * v;
            n++;
        }
    return (float)(DUMMY_STD / sqrt(sum / n));
}

/* ---- random sources ---- */

static uint64_t xorshift(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* bf16 values uniform in [-a, a] with a = 0.0346 (std 0.02, a Llama init) */
static void fill_bf16(uint16_t *d, uint64_t n) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < n; i++) {
        float f = ((float)(xorshift(&x) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * 0.0346f; /* std 0.02 */
        uint32_t u;
        memcpy(&u, &f, 4);
        d[i] = (uint16_t)(u >> 16);
    }
}

static void fill_bytes(uint8_t *p, uint64_t n) {
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (uint64_t i = 0; i < n; i += 8) {
        uint64_t r = xorshift(&x);
        memcpy(p + i, &r, n - i < 8 ? n - i : 8);
    }
}

/* ---- scales that make a block of random codes valid ---- */

static double uniform_sd(int lo, int hi) {
    double n = hi - lo + 1;
    return sqrt((n * n - 1) / 12);
}

static double uniform_rms(int lo, int hi) {
    double mean = (lo + hi) / 2.0;
    return sqrt(uniform_sd(lo, hi) * uniform_sd(lo, hi) + mean * mean);
}

/* writes v as fp16 and returns the value stored (what a reader decodes) */
static float put_fp16(uint8_t *p, double v) {
    uint16_t h = fp32_to_fp16((float)v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
    return fp16_to_fp32(h);
}

/* Q8_0: d, int8 codes -128..127 (mean -0.5: 0.7% of their rms, left as is) */
static void fix_q8_0(uint8_t *b) {
    put_fp16(b, DUMMY_STD / uniform_rms(-128, 127));
}

/* Q4_0: d * (q - 8), q - 8 in -8..7 leans negative by half a step; a random
 * sign of d (as ggml's own d = absmax / -8 has) makes the mean 0 */
static void fix_q4_0(uint8_t *b) {
    double d = DUMMY_STD / uniform_rms(-8, 7);
    put_fp16(b, b[0] & 1 ? -d : d);
}

/* Q4_1: d * q + m, q in 0..15; m = -7.5 d centres it */
static void fix_q4_1(uint8_t *b) {
    float d = put_fp16(b, DUMMY_STD / uniform_sd(0, 15));
    put_fp16(b + 2, -7.5 * d);
}

/* Q4_K / Q5_K: d * sc_k * q - dmin * m_k, q in 0..2^bits-1, sub-block scales
 * sc_k random in 16..31 (an fp16 d stays a normal number), dmin = 2^(bits-1) d
 * so that the 6-bit m_k = round(sc_k * d * qmax/2 / dmin) (at most 31)
 * centres each sub-block to within dmin / 2 (at most an 18th of its sd). */
static void fix_q45_k(uint8_t *b, int bits) {
    int qmax = (1 << bits) - 1, sc[8], mn[8];
    float d = put_fp16(b, DUMMY_STD / (uniform_rms(16, 31) * uniform_sd(0, qmax)));
    float dmin = put_fp16(b + 2, (double)d * (1 << (bits - 1)));
    for (int k = 0; k < 8; k++) {
        sc[k] = 16 + (b[4 + k] & 15);
        mn[k] = (int)lrint(sc[k] * (double)d * qmax / 2 / dmin);
    }
    quantize_pack_k_scales(sc, mn, b + 4);
}

static void fix_q4_k(uint8_t *b) { fix_q45_k(b, 4); }
static void fix_q5_k(uint8_t *b) { fix_q45_k(b, 5); }

/* Q6_K: d * sc_j * (q - 32), q - 32 in -32..31; int8 sub-block scales of
 * random sign (as ggml's are: the mean is 0) and size 8..15 (d normal) */
static void fix_q6_k(uint8_t *b) {
    int8_t *sc = (int8_t *)(b + 192);
    for (int j = 0; j < 16; j++) {
        uint8_t r = (uint8_t)sc[j];
        int s = 8 + (r & 7);
        sc[j] = (int8_t)(r & 0x80 ? -s : s);
    }
    put_fp16(b + 208, DUMMY_STD / (uniform_rms(8, 15) * uniform_rms(-32, 31)));
}

/* F8_E4M3: a code a byte, uniform over the 254 finite ones (0x7f and 0xff
 * are NaN in e4m3fn); the row scale is dummy_fp8_scale() */
static void fix_f8_e4m3(uint8_t *b) {
    if ((*b & 0x7f) == 0x7f) *b ^= 1;
}

typedef void (*BlockFix)(uint8_t *b);

static BlockFix block_fix(DType t) {
    switch (t) {
    case DT_Q8_0: return fix_q8_0;
    case DT_Q4_0: return fix_q4_0;
    case DT_Q4_1: return fix_q4_1;
    case DT_Q4_K: return fix_q4_k;
    case DT_Q5_K: return fix_q5_k;
    case DT_Q6_K: return fix_q6_k;
    case DT_F8_E4M3: return fix_f8_e4m3;
    default: return NULL;
    }
}

void dummy_fill(DType t, void *buf, uint64_t bytes) {
    if (t == DT_BF16) { fill_bf16(buf, bytes / 2); return; }
    BlockFix fix = block_fix(t);
    if (!fix) return; /* a caller bug: dummy_type_supported said no */
    uint64_t bb = (uint64_t)dtype_info(t)->block_bytes;
    fill_bytes(buf, bytes);
    for (uint64_t off = 0; off + bb <= bytes; off += bb) fix((uint8_t *)buf + off);
}
