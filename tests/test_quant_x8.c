/* test_quant_x8.c — the rounding of x and the lane arithmetic of the dp4a
 * quantized GEMV (kernels/quant_x8.h, used by kernels/cuda/quant_gemv_x8.cu:
 * QGEMV_X8) on the CPU.
 *
 * x is rounded group by group with qx_round_group (what qx_round_block
 * stores) and laid out in the tiled order (qx_x_offset: each value lands
 * once, inside the padded plane), then each row's product is replayed lane by lane as the kernel
 * walks it (Q4_K, Q5_K: lane 4 s + j takes chunk j of blocks s, s + 8, ...;
 * Q6_K likewise quarter j; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: lane L takes blocks L, L + 32, ...), through
 * emulated dp4a, and the 32 lane sums added. The reference is dequantize_row (base/dtype.c) times
 * the rounded x in double: the error must be fp32 rounding only (1e-5).
 * Against the unrounded x the error is what the two int8 terms cost
 * (bounded by 2e-4). Controls that must fail: the high-nibble x words taken
 * from the low half, the scales of the neighbouring chunk, and (Q5_0 /
 * Q5_1) the fifth bits of values j and j + 16 exchanged. The kernel
 * itself (loads, PDL, the warp reduction, the stores) is checked on a GPU by
 * tests/gpu/test_quant.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/quant_x8.h"
#include "tests/test.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
static float frand(void) { return (float)(rnd32() >> 8) / 8388608.0f * 2.0f - 1.0f; }

static void put_half(uint8_t *p, float v) {
    uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}
static uint32_t word_at(const void *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* x rounded: the planes the kernel reads, the int8 terms in the tiled order
 * of weight type t (qx_x_offset) */
typedef struct {
    int64_t cols;
    int8_t *q1, *q2;
    float *dxs, *sx;
    float *xr; /* the rounded values, for the reference */
} RoundedX;

static void round_x(const float *x, int64_t cols, DType t, RoundedX *r) {
    int64_t padded = (cols + QX_TILE_VALUES - 1) / QX_TILE_VALUES * QX_TILE_VALUES;
    r->cols = cols;
    r->q1 = calloc(padded, 1), r->q2 = calloc(padded, 1);
    r->dxs = malloc(cols / 32 * sizeof(float)), r->sx = malloc(cols / 32 * sizeof(float));
    r->xr = malloc(cols * sizeof(float));
    for (int64_t g = 0; g < cols / 32; g++) {
        int8_t q1[32], q2[32];
        qx_round_group(x + 32 * g, q1, q2, &r->dxs[g], &r->sx[g]);
        for (int i = 0; i < 32; i++) {
            r->xr[32 * g + i] = qx_value(q1[i], q2[i], 128.f * r->dxs[g]);
            int64_t o = qx_x_offset(t, 32 * g + i);
            CHECK(o >= 0 && o < padded && r->q1[o] == 0 && r->q2[o] == 0, "value %lld: offset %lld taken twice or outside",
                  (long long)(32 * g + i), (long long)o);
            r->q1[o] = q1[i], r->q2[o] = q2[i];
        }
    }
}
static void round_x_free(RoundedX *r) { free(r->q1); free(r->q2); free(r->dxs); free(r->sx); free(r->xr); }

/* Rounding: the terms in range, the value within half a step of the second
 * term (dx / 256) of x, sx the group's sum of rounded values. */
static void test_rounding(void) {
    float x[32];
    double worst = 0;
    for (int rep = 0; rep < 200; rep++) {
        float scale = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.f : 300.f;
        for (int i = 0; i < 32; i++) x[i] = scale * frand();
        if (rep % 7 == 0) x[rep % 32] = 50 * scale; /* an outlier */
        if (rep == 5) memset(x, 0, sizeof x);        /* all zero: dx = 0 */
        int8_t q1[32], q2[32];
        float dxs, sx, amax = 0;
        qx_round_group(x, q1, q2, &dxs, &sx);
        double sum = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int i = 0; i < 32; i++) {
            CHECK(q1[i] >= -127 && q1[i] <= 127 && q2[i] >= -64 && q2[i] <= 64, "terms %d %d", q1[i], q2[i]);
            double v = (double)dxs * (128.0 * q1[i] + q2[i]);
            sum += v;
            double e = fabs(v - x[i]) / (amax > 0 ? amax : 1);
            if (e > worst) worst = e;
        }
        CHECK(fabs(sum - sx) <= 1e-6 * (fabs(sum) + 32 * amax), "sx %g vs %g", sx, sum);
    }
    CHECK(worst <= 1.0 / (127 * 256) * 1.01, "rounding error %.3g of amax > dx / 256", worst);
    printf("# rounding: worst |x~ - x| = %.3g of the group's max (bound %.3g)\n", worst, 1.0 / (127 * 256));
}

typedef struct { bool hi_from_lo, wrong_scales, swap_qh; } Faults;

/* one Q4_K row (nsb blocks at blk) times the rounded x, as the kernel's lanes do it */
static double q4k_row(const uint8_t *blk, int nsb, const RoundedX *x, Faults f) {
    float lane_acc[32] = {0};
    for (int L = 0; L < 32; L++) {
        int j = L & 3, sl = L >> 2;
        for (int b = sl; b < nsb; b += 8) {
            const uint8_t *p = blk + (size_t)b * 144;
            uint32_t hdr[4], q[8], x1[16], x2[16];
            for (int i = 0; i < 4; i++) hdr[i] = word_at(p + 4 * i);
            for (int i = 0; i < 8; i++) q[i] = word_at(p + 16 + 32 * j + 4 * i);
            int64_t c = (int64_t)b * 256 + 64 * j, tile = (int64_t)(b / 8) * QX_TILE_VALUES; /* the kernel's loads */
            for (int i = 0; i < 16; i++) {
                int k = f.hi_from_lo && i >= 8 ? i - 8 : i;
                int64_t o = tile + 16 * (32 * (k / 4) + L) + 4 * (k % 4);
                x1[i] = word_at(x->q1 + o), x2[i] = word_at(x->q2 + o);
            }
            float dxs[2] = {x->dxs[c / 32], x->dxs[c / 32 + 1]}, sx[2] = {x->sx[c / 32], x->sx[c / 32 + 1]};
            lane_acc[L] += qx_q4k_chunk(q, hdr, f.wrong_scales ? j ^ 1 : j, x1, x2, dxs, sx);
        }
    }
    double s = 0;
    for (int L = 0; L < 32; L++) s += lane_acc[L];
    return s;
}

/* one Q5_K row (blocks of 176 bytes: header, qh[32], qs[128]), lanes as q4k_row */
static double q5k_row(const uint8_t *blk, int nsb, const RoundedX *x, Faults f) {
    float lane_acc[32] = {0};
    for (int L = 0; L < 32; L++) {
        int j = L & 3, sl = L >> 2;
        for (int b = sl; b < nsb; b += 8) {
            const uint8_t *p = blk + (size_t)b * 176;
            uint32_t hdr[4], q[8], hb[8], x1[16], x2[16];
            for (int i = 0; i < 4; i++) hdr[i] = word_at(p + 4 * i);
            for (int i = 0; i < 8; i++) q[i] = word_at(p + 48 + 32 * j + 4 * i), hb[i] = word_at(p + 16 + 4 * i);
            int64_t c = (int64_t)b * 256 + 64 * j, tile = (int64_t)(b / 8) * QX_TILE_VALUES;
            for (int i = 0; i < 16; i++) {
                int k = f.hi_from_lo && i >= 8 ? i - 8 : i;
                int64_t o = tile + 16 * (32 * (k / 4) + L) + 4 * (k % 4);
                x1[i] = word_at(x->q1 + o), x2[i] = word_at(x->q2 + o);
            }
            float dxs[2] = {x->dxs[c / 32], x->dxs[c / 32 + 1]}, sx[2] = {x->sx[c / 32], x->sx[c / 32 + 1]};
            lane_acc[L] += qx_q5k_chunk(q, hb, hdr, f.wrong_scales ? j ^ 1 : j, x1, x2, dxs, sx);
        }
    }
    double s = 0;
    for (int L = 0; L < 32; L++) s += lane_acc[L];
    return s;
}

static double q8_row(const uint8_t *blk, int nb, const RoundedX *x) {
    float lane_acc[32] = {0};
    for (int L = 0; L < 32; L++)
        for (int b = L; b < nb; b += 32) {
            const uint8_t *p = blk + (size_t)b * 34;
            uint32_t q[8], x1[8], x2[8];
            for (int i = 0; i < 8; i++) {
                int64_t o = (int64_t)(b / 32) * 1024 + 16 * (32 * (i / 4) + L) + 4 * (i % 4); /* the kernel's loads */
                q[i] = word_at(p + 2 + 4 * i), x1[i] = word_at(x->q1 + o), x2[i] = word_at(x->q2 + o);
            }
            lane_acc[L] += qx_q8_block(q, fp16_to_fp32((uint16_t)(p[0] | p[1] << 8)), x1, x2, x->dxs[b]);
        }
    double s = 0;
    for (int L = 0; L < 32; L++) s += lane_acc[L];
    return s;
}

/* one Q6_K row (native blocks of 210 bytes: ql, qh, scales, d): lane 4 s + j
 * takes quarter j (h = j / 2, c = j % 2) of blocks s, s + 8, ...; its x
 * pieces k at position 32 k + L of the block's tile (the kernel's loads) */
static double q6k_row(const uint8_t *blk, int nsb, const RoundedX *x, Faults f) {
    float lane_acc[32] = {0};
    for (int L = 0; L < 32; L++) {
        int j = L & 3, h = j >> 1, c = j & 1, sl = L >> 2;
        for (int b = sl; b < nsb; b += 8) {
            const uint8_t *p = blk + (size_t)b * 210;
            uint32_t a[4], bq[4], hb[4], sc8[2], x1[16], x2[16];
            for (int i = 0; i < 4; i++) {
                a[i] = word_at(p + 64 * h + 16 * c + 4 * i), bq[i] = word_at(p + 64 * h + 32 + 16 * c + 4 * i);
                hb[i] = word_at(p + 128 + 32 * h + 16 * c + 4 * i);
            }
            sc8[0] = word_at(p + 192 + 8 * h), sc8[1] = word_at(p + 196 + 8 * h);
            int64_t tile = (int64_t)(b / 8) * QX_TILE_VALUES;
            for (int i = 0; i < 16; i++) {
                int k = f.hi_from_lo && i >= 8 ? i - 8 : i;
                int64_t o = tile + 16 * (32 * (k / 4) + L) + 4 * (k % 4);
                x1[i] = word_at(x->q1 + o), x2[i] = word_at(x->q2 + o);
            }
            float dxs[4];
            for (int k = 0; k < 4; k++) dxs[k] = x->dxs[8 * b + 4 * h + k];
            float d = fp16_to_fp32((uint16_t)(p[208] | p[209] << 8));
            lane_acc[L] += qx_q6k_quarter(a, bq, hb, sc8, f.wrong_scales ? c ^ 1 : c, d, x1, x2, dxs);
        }
    }
    double s = 0;
    for (int L = 0; L < 32; L++) s += lane_acc[L];
    return s;
}

/* one Q4_0 / Q4_1 / Q5_0 / Q5_1 row (native blocks of 18 / 20 / 22 / 24
 * bytes: d (, m) (, qh), 16 code bytes), lanes as q8_row */
static double q4_row(DType t, const uint8_t *blk, int nb, const RoundedX *x, Faults f) {
    const bool q5 = t == DT_Q5_0 || t == DT_Q5_1, min = t == DT_Q4_1 || t == DT_Q5_1;
    const int bb = dtype_info(t)->block_bytes, h = bb - 16;
    float lane_acc[32] = {0};
    for (int L = 0; L < 32; L++)
        for (int b = L; b < nb; b += 32) {
            const uint8_t *p = blk + (size_t)b * bb;
            uint32_t q[4], x1[8], x2[8];
            for (int i = 0; i < 8; i++) {
                int k = f.hi_from_lo && i >= 4 ? i - 4 : i;
                int64_t o = (int64_t)(b / 32) * 1024 + 16 * (32 * (k / 4) + L) + 4 * (k % 4); /* the kernel's loads */
                x1[i] = word_at(x->q1 + o), x2[i] = word_at(x->q2 + o);
            }
            for (int i = 0; i < 4; i++) q[i] = word_at(p + h + 4 * i);
            uint32_t qh = q5 ? word_at(p + h - 4) : 0;
            if (f.swap_qh) qh = qh << 16 | qh >> 16;
            float d = fp16_to_fp32((uint16_t)(p[0] | p[1] << 8));
            float m = min ? fp16_to_fp32((uint16_t)(p[2] | p[3] << 8)) : (q5 ? -16.f : -8.f) * d;
            lane_acc[L] += qx_q4_block(q, qh, d, m, x1, x2, x->dxs[b], x->sx[b]);
        }
    double s = 0;
    for (int L = 0; L < 32; L++) s += lane_acc[L];
    return s;
}

/* Relative errors over `rows` random rows of type t: against dequantize_row
 * times the rounded x (*e_round) and times x itself (*e_exact). */
static void run_case(DType t, int rows, int64_t cols, Faults f, double *e_round, double *e_exact) {
    const DTypeInfo *info = dtype_info(t);
    size_t rb = dtype_row_bytes(t, cols);
    uint8_t *w = malloc(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)rnd32();
    int64_t nb = cols / info->block_elems;
    for (int64_t b = 0; b < nb * rows; b++) {
        uint8_t *p = w + b * info->block_bytes;
        if (t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q5_0) put_half(p, 0.001f * frand());
        else if (t == DT_Q6_K) put_half(p + 208, 0.0002f * frand());
        else put_half(p, 0.0005f * (1.1f + frand())), put_half(p + 2, 0.001f * (1.1f + frand()));
    }
    float *x = malloc(cols * sizeof *x), *wr = malloc(cols * sizeof *wr);
    for (int64_t c = 0; c < cols; c++) x[c] = bf16_to_fp32(fp32_to_bf16(frand() * (c % 97 == 0 ? 20.f : 1.f)));
    RoundedX xr;
    round_x(x, cols, t, &xr);
    double n1 = 0, n2 = 0, den = 0;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + rb * r;
        dequantize_row(t, row, wr, cols);
        double ref = 0, ref_x = 0;
        for (int64_t c = 0; c < cols; c++) ref += (double)wr[c] * xr.xr[c], ref_x += (double)wr[c] * x[c];
        double v = t == DT_Q4_K ? q4k_row(row, (int)nb, &xr, f)
                   : t == DT_Q5_K ? q5k_row(row, (int)nb, &xr, f)
                   : t == DT_Q6_K ? q6k_row(row, (int)nb, &xr, f)
                   : t == DT_Q8_0 ? q8_row(row, (int)nb, &xr) : q4_row(t, row, (int)nb, &xr, f);
        n1 += (v - ref) * (v - ref), n2 += (v - ref_x) * (v - ref_x), den += ref * ref;
    }
    *e_round = sqrt(n1 / den), *e_exact = sqrt(n2 / den);
    round_x_free(&xr);
    free(w); free(x); free(wr);
}

static void test_products(void) {
    const int64_t widths[] = {256, 2304, 4096, 14336};
    const Faults ok = {false, false, false};
    const DType types[8] = {DT_Q4_K, DT_Q8_0, DT_Q6_K, DT_Q5_K, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1};
    for (int k = 0; k < 8; k++) {
        DType t = types[k];
        for (int i = 0; i < 4; i++) {
            double er, ex;
            run_case(t, 12, widths[i], ok, &er, &ex);
            CHECK(er <= 1e-5, "%s cols %lld: rel err %.3g vs the rounded x", dtype_info(t)->name, (long long)widths[i], er);
            CHECK(ex <= 2e-4, "%s cols %lld: rel err %.3g vs x", dtype_info(t)->name, (long long)widths[i], ex);
            printf("# %s cols %5lld: rel err %.2e (rounded x), %.2e (x)\n", dtype_info(t)->name, (long long)widths[i], er, ex);
        }
    }
}

/* The check can fail: a wrong x half or wrong scales give errors of order 1. */
static void test_controls(void) {
    double er, ex;
    run_case(DT_Q4_K, 8, 2304, (Faults){true, false, false}, &er, &ex);
    CHECK(er > 1e-2, "high nibbles with the low half's x: rel err only %.3g", er);
    run_case(DT_Q4_K, 8, 2304, (Faults){false, true, false}, &er, &ex);
    CHECK(er > 1e-2, "the neighbouring chunk's scales: rel err only %.3g", er);
    run_case(DT_Q5_K, 8, 2304, (Faults){false, true, false}, &er, &ex);
    CHECK(er > 1e-2, "Q5_K with the neighbouring chunk's scales and qh bits: rel err only %.3g", er);
    run_case(DT_Q6_K, 8, 2304, (Faults){true, false, false}, &er, &ex);
    CHECK(er > 1e-2, "Q6_K pieces 2, 3 with pieces 0, 1's x: rel err only %.3g", er);
    run_case(DT_Q6_K, 8, 2304, (Faults){false, true, false}, &er, &ex);
    CHECK(er > 1e-2, "Q6_K with the other quarter's scales: rel err only %.3g", er);
    run_case(DT_Q5_1, 8, 2304, (Faults){true, false, false}, &er, &ex);
    CHECK(er > 1e-2, "Q5_1 high nibbles with the low half's x: rel err only %.3g", er);
    for (int k = 0; k < 2; k++) {
        DType t = k ? DT_Q5_1 : DT_Q5_0;
        run_case(t, 8, 2304, (Faults){false, false, true}, &er, &ex);
        CHECK(er > 1e-2, "%s with the fifth bits of values j and j + 16 exchanged: rel err only %.3g",
              dtype_info(t)->name, er);
    }
}

int main(void) {
    RUN(test_rounding);
    RUN(test_products);
    RUN(test_controls);
    TEST_EXIT();
}
