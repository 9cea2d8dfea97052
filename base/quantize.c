/* quantize.c — fp32 rows to GGUF blocks; see quantize.h. Written for -std=c11
 * (no floating-point contraction), so the fp32 operations round exactly as
 * numpy's float32 ones in the gguf package. */
#include "base/quantize.h"

#include <math.h>
#include <string.h>

#define QK_K 256

static void wr_fp16(uint8_t *p, float v) {
    uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float rd_fp16(const uint8_t *p) { return fp16_to_fp32((uint16_t)(p[0] | p[1] << 8)); }

static float inv_or_zero(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* float -> small code the way numpy's astype(np.uint8) then clip does for
 * the in-range values these formats produce */
static int code_trunc(float v, int hi) {
    if (!(v >= 0.0f)) return 0;
    return clampi((int)truncf(v), 0, hi);
}

/* ---- the ggml reference formats (bit-exact with gguf.quants) ---- */

static void block_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = inv_or_zero(d);
    wr_fp16(b, d);
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id); /* half away from zero */
}

/* the value of largest magnitude (the first one on ties), sign kept */
static float signed_absmax(const float *x, int n) {
    float m = 0.0f, am = -1.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > am) { am = fabsf(x[i]); m = x[i]; }
    return m;
}

static void pack_nibbles(const int *q, uint8_t *qs) {
    for (int l = 0; l < 16; l++) qs[l] = (uint8_t)((q[l] & 0xf) | (q[l + 16] & 0xf) << 4);
}

static void pack_qh(const int *q, uint8_t *qh) {
    uint32_t h = 0;
    for (int i = 0; i < 32; i++) h |= (uint32_t)(q[i] >> 4 & 1) << i;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> 8 * k);
}

/* Q4_0 / Q5_0: d = -absmax / 2^(bits-1), codes trunc(x/d + 2^(bits-1) + 0.5) */
static void block_qx_0(const float *x, uint8_t *b, int bits) {
    float half = (float)(1 << (bits - 1));
    float d = signed_absmax(x, 32) / -half, id = inv_or_zero(d);
    int q[32];
    for (int i = 0; i < 32; i++) q[i] = code_trunc(x[i] * id + (half + 0.5f), (1 << bits) - 1);
    wr_fp16(b, d);
    if (bits == 5) pack_qh(q, b + 2);
    pack_nibbles(q, b + (bits == 5 ? 6 : 2));
}

/* Q4_1 / Q5_1: d = (max - min) / (2^bits - 1), m = min, codes trunc((x-m)/d + 0.5) */
static void block_qx_1(const float *x, uint8_t *b, int bits) {
    float mx = x[0], mn = x[0];
    for (int i = 1; i < 32; i++) { mx = fmaxf(mx, x[i]); mn = fminf(mn, x[i]); }
    float d = (mx - mn) / (float)((1 << bits) - 1), id = inv_or_zero(d);
    int q[32];
    for (int i = 0; i < 32; i++) q[i] = code_trunc((x[i] - mn) * id + 0.5f, (1 << bits) - 1);
    wr_fp16(b, d);
    wr_fp16(b + 2, mn);
    if (bits == 5) pack_qh(q, b + 4);
    pack_nibbles(q, b + (bits == 5 ? 8 : 4));
}

/* ---- K-quants ---- */

void quantize_pack_k_scales(const int sc[8], const int mn[8], uint8_t s12[12]) {
    for (int j = 0; j < 4; j++) {
        s12[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        s12[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
        s12[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

/* Q4_K/Q5_K: 8 sub-blocks of 32 with value = d*sc*q - dmin*m, q < 2^bits.
 * Each sub-block's range [min(0, lo), hi] gives its ideal scale and min; those
 * are quantized to 6 bits against the fp16 super-scales, then the codes are
 * chosen against the scales as they will be decoded. */
static void block_q45_k(const float *x, uint8_t *b, int bits) {
    int qmax = (1 << bits) - 1;
    float scale[8], minv[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = x[32 * j];
        for (int l = 0; l < 32; l++) { lo = fminf(lo, x[32 * j + l]); hi = fmaxf(hi, x[32 * j + l]); }
        scale[j] = (hi - lo) / (float)qmax;
        minv[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, minv[j]);
    }
    wr_fp16(b, smax / 63.0f);
    wr_fp16(b + 2, mmax / 63.0f);
    float d = rd_fp16(b), dmin = rd_fp16(b + 2), id = inv_or_zero(d), idmin = inv_or_zero(dmin);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = clampi((int)lrintf(scale[j] * id), 0, 63);
        mn[j] = clampi((int)lrintf(minv[j] * idmin), 0, 63);
        if (sc[j] == 0 && scale[j] > 0.0f && d > 0.0f) sc[j] = 1; /* keep a nonzero range representable */
    }
    quantize_pack_k_scales(sc, mn, b + 4);
    uint8_t *qh = bits == 5 ? b + 16 : NULL, *qs = bits == 5 ? b + 48 : b + 16;
    if (qh) memset(qh, 0, 32);
    memset(qs, 0, 128);
    for (int j = 0; j < 8; j++) {
        float dl = d * (float)sc[j], ml = dmin * (float)mn[j], idl = inv_or_zero(dl);
        for (int l = 0; l < 32; l++) {
            int q = clampi((int)lrintf((x[32 * j + l] + ml) * idl), 0, qmax);
            qs[(j / 2) * 32 + l] |= (uint8_t)((q & 15) << 4 * (j % 2));
            if (qh) qh[l] |= (uint8_t)((q >> 4) << j);
        }
    }
}

/* Q6_K: 16 sub-blocks of 16 with value = d*sc*(q - 32), sc int8. */
static void block_q6_k(const float *x, uint8_t *b) {
    float scale[16], amax = 0.0f;
    for (int j = 0; j < 16; j++) {
        float m = signed_absmax(x + 16 * j, 16);
        scale[j] = m / -32.0f; /* the extreme value maps to code -32 exactly */
        amax = fmaxf(amax, fabsf(scale[j]));
    }
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    wr_fp16(b + 208, amax / 127.0f);
    float d = rd_fp16(b + 208), id = inv_or_zero(d);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)clampi((int)lrintf(scale[j] * id), -127, 127);
    memset(ql, 0, 192);
    for (int i = 0; i < QK_K; i++) {
        float dl = d * (float)sc[i / 16];
        int q = clampi((int)lrintf(x[i] * inv_or_zero(dl)), -32, 31) + 32;
        int h = i / 128, j = (i / 32) % 4, l = i % 32;
        ql[h * 64 + (j % 2) * 32 + l] |= (uint8_t)((q & 15) << 4 * (j / 2));
        qh[h * 32 + l] |= (uint8_t)((q >> 4) << 2 * j);
    }
}

/* ---- rows ---- */

bool quantize_type_supported(DType t) {
    switch (t) {
    case DT_F32: case DT_F16: case DT_BF16: case DT_Q8_0: case DT_Q4_0: case DT_Q4_1: case DT_Q5_0:
    case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: return true;
    default: return false;
    }
}

static void quantize_block(DType t, const float *x, uint8_t *b) {
    switch (t) {
    case DT_Q8_0: block_q8_0(x, b); break;
    case DT_Q4_0: block_qx_0(x, b, 4); break;
    case DT_Q5_0: block_qx_0(x, b, 5); break;
    case DT_Q4_1: block_qx_1(x, b, 4); break;
    case DT_Q5_1: block_qx_1(x, b, 5); break;
    case DT_Q4_K: block_q45_k(x, b, 4); break;
    case DT_Q5_K: block_q45_k(x, b, 5); break;
    case DT_Q6_K: block_q6_k(x, b); break;
    default: break;
    }
}

int quantize_row(DType t, const float *src, void *dst, int64_t n) {
    const DTypeInfo *info = dtype_info((uint32_t)t);
    if (!quantize_type_supported(t) || !info || n < 0 || n % info->block_elems) return -1;
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t) {
        case DT_F32: memcpy(p + 4 * i, src + i, 4); continue;
        case DT_F16: h = fp32_to_fp16(src[i]); break;
        case DT_BF16: h = fp32_to_bf16(src[i]); break;
        default: i = n; continue; /* block types below */
        }
        p[2 * i] = (uint8_t)h;
        p[2 * i + 1] = (uint8_t)(h >> 8);
    }
    if (info->block_elems == 1) return 0;
    for (int64_t k = 0; k < n / info->block_elems; k++)
        quantize_block(t, src + k * info->block_elems, p + k * info->block_bytes);
    return 0;
}
