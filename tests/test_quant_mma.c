/* test_quant_mma.c — the fragment mapping of the tensor-core quantized GEMV
 * (kernels/quant_mma.h, used by kernels/cuda/quant_gemv_mma.cu: QGEMV_MMA)
 * on the CPU.
 *
 * One warp's work is replayed lane by lane with the header's own functions:
 * each lane builds its A and B registers from the block bytes and x exactly
 * as the kernel does, an emulated mma.sync m16n8k16 (the PTX ISA fragment
 * layout, in double) multiplies them, and each lane scales its C into the
 * accumulators. The result must match dequantize_row (base/dtype.c, the
 * reference every other quantized path is checked against) times x. A
 * mapping mistake (a wrong pair, a wrong k order between A and B, a wrong
 * scale) gives errors of order 1; a control with B in the wrong order
 * shows the check can fail. The kernel itself (cp.async stages, shared memory, the reduction over warps)
 * is checked on a GPU by tests/gpu/test_quant.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/quant_mma.h"
#include "tests/test.h"

#define ROWS 16

static uint64_t g_rng = 0x853c49e6748fea9bull;
static uint32_t rnd32(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
static float frand(void) { return (float)(rnd32() >> 8) / 8388608.0f * 2.0f - 1.0f; }

static double bf16d(uint32_t pair, int hi) { return bf16_to_fp32((uint16_t)(hi ? pair >> 16 : pair & 0xffff)); }

/* c += A B for a warp's registers, as mma.sync.m16n8k16.row.col.f32.bf16 does. */
static void mma_emulate(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
    double A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L / 4, t = L % 4;
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = bf16d(a[L][0], e), A[g + 8][2 * t + e] = bf16d(a[L][1], e);
            A[g][2 * t + 8 + e] = bf16d(a[L][2], e), A[g + 8][2 * t + 8 + e] = bf16d(a[L][3], e);
            B[2 * t + e][g] = bf16d(b[L][0], e), B[2 * t + 8 + e][g] = bf16d(b[L][1], e);
        }
    }
    for (int L = 0; L < 32; L++) {
        int g = L / 4, t = L % 4;
        for (int r = 0; r < 4; r++) {
            int row = g + 8 * (r / 2), col = 2 * t + r % 2;
            double s = 0;
            for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
            c[L][r] += (float)s;
        }
    }
}

typedef struct {
    DType type;
    int T, n_sb;                 /* x rows, stages of 256 values */
    uint8_t *blocks;             /* native GGUF bytes, [ROWS][n_sb * 256 values] */
    uint16_t *x;                 /* bf16 [T][cols] */
    bool b_natural;              /* control: Q4_K B in plain order (wrong) */
} Problem;

static int cols_of(const Problem *P) { return P->n_sb * QM_SB; }
static size_t row_bytes(const Problem *P) { return dtype_row_bytes(P->type, (uint64_t)cols_of(P)); }

static uint32_t word_at(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* The lane's 8 x values of (sub-)block j of stage sb as 4 bf16 pairs; rows t >= T read as zeros. */
static void lane_x(const Problem *P, int lane, int sb, int j, uint32_t X[4]) {
    int g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; i++) {
        X[i] = 0;
        if (g >= P->T) continue;
        const uint16_t *x = P->x + (size_t)g * cols_of(P) + sb * QM_SB + qm_x_off(j, c) + 2 * i;
        X[i] = (uint32_t)x[0] | (uint32_t)x[1] << 16;
    }
}

/* One Q4_K stage (a block per row) for the whole warp. */
static void warp_stage_q4k(const Problem *P, int sb, float acc[32][4]) {
    for (int j = 0; j < 8; j++) {
        uint32_t a[32][4], b[2][32][2], ones[32][4];
        float C[32][4] = {{0}}, S[32][4] = {{0}};
        for (int L = 0; L < 32; L++) {
            uint32_t X[4];
            lane_x(P, L, sb, j, X);
            for (int s = 0; s < 2; s++) {
                if (P->b_natural) b[s][L][0] = X[2 * s], b[s][L][1] = X[2 * s + 1];
                else qm_q4k_b(X, s, b[s][L]);
            }
            for (int r = 0; r < 4; r++) ones[L][r] = QM_BF16_ONES;
        }
        for (int s = 0; s < 2; s++) {
            for (int L = 0; L < 32; L++) {
                int g = L / 4, c = L % 4;
                const uint8_t *bg = P->blocks + g * row_bytes(P) + (size_t)sb * 144, *bg8 = bg + 8 * row_bytes(P);
                int o = qm_q4k_word_off(j / 2, c);
                uint32_t wg[2] = {word_at(bg + o), word_at(bg + o + 4)}, wg8[2] = {word_at(bg8 + o), word_at(bg8 + o + 4)};
                qm_q4k_a(wg, wg8, s, j % 2, a[L]);
            }
            mma_emulate(C, a, b[s]);
            mma_emulate(S, ones, b[s]);
        }
        for (int L = 0; L < 32; L++) {
            int g = L / 4;
            float mg[4], ag[4], mg8[4], ag8[4];
            uint32_t hg[4], hg8[4];
            for (int i = 0; i < 4; i++) {
                hg[i] = word_at(P->blocks + g * row_bytes(P) + (size_t)sb * 144 + 4 * i);
                hg8[i] = word_at(P->blocks + (g + 8) * row_bytes(P) + (size_t)sb * 144 + 4 * i);
            }
            qm_q4k_scales(hg, j / 4, mg, ag);
            qm_q4k_scales(hg8, j / 4, mg8, ag8);
            qm_acc(acc[L], C[L], S[L], mg[j % 4], ag[j % 4], mg8[j % 4], ag8[j % 4]);
        }
    }
}

/* One Q8_0 stage (8 blocks per row) for the whole warp. */
static void warp_stage_q8(const Problem *P, int sb, float acc[32][4]) {
    for (int j = 0; j < 8; j++) {
        uint32_t a[32][4], b[32][2];
        float C[32][4] = {{0}};
        for (int s = 0; s < 2; s++) {
            for (int L = 0; L < 32; L++) {
                int g = L / 4, c = L % 4;
                /* native block (d, 32 int8) of rows g, g + 8: the word offsets are into the qs part */
                const uint8_t *qg = P->blocks + g * row_bytes(P) + (size_t)(sb * 8 + j) * 34 + 2;
                const uint8_t *qg8 = qg + 8 * row_bytes(P);
                int o = qm_q8_word_off(0, c);
                uint32_t wg[2] = {word_at(qg + o), word_at(qg + o + 4)}, wg8[2] = {word_at(qg8 + o), word_at(qg8 + o + 4)};
                uint32_t X[4];
                lane_x(P, L, sb, j, X);
                qm_q8_a(wg, wg8, s, a[L]);
                qm_q8_b(X, s, b[L]);
            }
            mma_emulate(C, a, b);
        }
        for (int L = 0; L < 32; L++) {
            int g = L / 4;
            const uint8_t *dg = P->blocks + g * row_bytes(P) + (size_t)(sb * 8 + j) * 34, *dg8 = dg + 8 * row_bytes(P);
            float d = qm_half((uint32_t)dg[0] | (uint32_t)dg[1] << 8), d8 = qm_half((uint32_t)dg8[0] | (uint32_t)dg8[1] << 8);
            qm_acc_scaled(acc[L], C[L], d, d8);
        }
    }
}

static void put_half(uint8_t *p, float v) {
    uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Random blocks (every quant bit random; fp16 scales of realistic size) and x. */
static void problem_init(Problem *P, DType t, int T, int n_sb) {
    memset(P, 0, sizeof *P);
    P->type = t, P->T = T, P->n_sb = n_sb;
    size_t n = ROWS * row_bytes(P);
    P->blocks = malloc(n);
    for (size_t i = 0; i < n; i++) P->blocks[i] = (uint8_t)rnd32();
    size_t bb = t == DT_Q4_K ? 144 : 34;
    for (size_t o = 0; o < n; o += bb) {
        put_half(P->blocks + o, 0.001f + 0.02f * (frand() + 1.0f));
        if (t == DT_Q4_K) put_half(P->blocks + o + 2, 0.001f + 0.01f * (frand() + 1.0f));
    }
    P->x = malloc((size_t)T * cols_of(P) * 2);
    for (int i = 0; i < T * cols_of(P); i++) P->x[i] = fp32_to_bf16(frand() * 2.0f);
}

static void problem_free(Problem *P) { free(P->blocks), free(P->x); }

/* ||y - ref|| / ||ref|| of the emulated warp over all T x rows and 16 rows. */
static double run_warp(const Problem *P) {
    float acc[32][4] = {{0}};
    for (int sb = 0; sb < P->n_sb; sb++) {
        if (P->type == DT_Q4_K) warp_stage_q4k(P, sb, acc);
        else warp_stage_q8(P, sb, acc);
    }
    int cols = cols_of(P);
    float *w = malloc(cols * sizeof *w);
    double d2 = 0, r2 = 0;
    for (int row = 0; row < ROWS; row++) {
        dequantize_row(P->type, P->blocks + row * row_bytes(P), w, cols);
        for (int t = 0; t < P->T; t++) {
            double ref = 0;
            for (int k = 0; k < cols; k++) ref += (double)w[k] * bf16_to_fp32(P->x[(size_t)t * cols + k]);
            /* C layout: row g -> lanes 4g + t/2, r = t%2; row g + 8 -> r + 2 */
            int g = row % 8, L = 4 * g + t / 2, r = t % 2 + (row >= 8 ? 2 : 0);
            double got = acc[L][r];
            d2 += (got - ref) * (got - ref), r2 += ref * ref;
        }
    }
    free(w);
    return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

/* Random problems of type t at each T: the emulated warp against dequantize_row. */
static void check_type(DType t, const int *Ts, int n_T, int n_sb) {
    for (int i = 0; i < n_T; i++) {
        Problem P;
        problem_init(&P, t, Ts[i], n_sb);
        double e = run_warp(&P);
        printf("# %s T=%d 16 x %d: rel err %.2e\n", dtype_info(t)->name, Ts[i], cols_of(&P), e);
        CHECK(e <= 1e-5, "%s T=%d: rel err %.3g", dtype_info(t)->name, Ts[i], e);
        problem_free(&P);
    }
}

static void test_q4k(void) { check_type(DT_Q4_K, (const int[]){1, 2, 5, 8}, 4, 3); }
static void test_q8_0(void) { check_type(DT_Q8_0, (const int[]){1, 3, 8}, 3, 2); }

/* The harness can fail: B in plain order against Q4_K's permuted A. */
static void test_control_wrong_order(void) {
    Problem P;
    problem_init(&P, DT_Q4_K, 2, 1);
    P.b_natural = true;
    double e = run_warp(&P);
    printf("# control: Q4_K with B in plain order: rel err %.2e\n", e);
    CHECK(e > 1e-3, "a wrong k order went unnoticed (rel err %.3g)", e); /* the min term, unpermuted, keeps it small */
    problem_free(&P);
}

/* qm_q4k_scales against dtype.c's unpacking through dequantize_row: a block
 * whose codes are all 0 dequantizes to -dmin m, all 1 to d sc - dmin m. */
static void test_q4k_scales(void) {
    int bad = 0;
    for (int it = 0; it < 200; it++) {
        uint8_t blk[144];
        for (int i = 0; i < 144; i++) blk[i] = (uint8_t)rnd32();
        put_half(blk, 0.01f * (frand() + 1.5f));
        put_half(blk + 2, 0.01f * (frand() + 1.5f));
        memset(blk + 16, 0, 128);
        float w0[256], w1[256];
        dequantize_row(DT_Q4_K, blk, w0, 256);
        memset(blk + 16, 0x11, 128);
        dequantize_row(DT_Q4_K, blk, w1, 256);
        uint32_t hdr[4];
        for (int i = 0; i < 4; i++) hdr[i] = word_at(blk + 4 * i);
        for (int half = 0; half < 2; half++) {
            float mul[4], addp[4];
            qm_q4k_scales(hdr, half, mul, addp);
            for (int k = 0; k < 4; k++) { /* w0 = -dmin m exactly, w1 = d sc - dmin m */
                int j = 4 * half + k;
                double want_addp = (double)w0[32 * j] - 128.0 * mul[k];
                bad += mul[k] + w0[32 * j] != w1[32 * j];
                bad += fabs(addp[k] - want_addp) > 0x1p-23 * (fabs(w0[32 * j]) + 128.0 * fabs(mul[k]));
            }
        }
    }
    CHECK(bad == 0, "%d sub-block scales differ from dequantize_row's", bad);
}

/* Every int8 comes out exact in bf16, every nibble as 128 + code. */
static void test_codes_exact(void) {
    int bad = 0;
    for (int q = -128; q < 128; q++) {
        uint32_t w = (uint32_t)(uint8_t)q * 0x01010101u;
        for (int p = 0; p < 4; p++) bad += qm_q8_value(w, p) != (float)q;
        uint32_t pair = qm_bf16_pair_exact(qm_q8_value(w, 0), qm_q8_value(w, 1));
        bad += bf16d(pair, 0) != q || bf16d(pair, 1) != q;
    }
    for (uint32_t n = 0; n < 16; n++) {
        uint32_t pair = qm_q4_pair(n | (15 - n) << 16 | 0xfff0fff0u);
        bad += bf16d(pair, 0) != 128.0 + n || bf16d(pair, 1) != 128.0 + 15 - n;
    }
    CHECK(bad == 0, "%d codes not exact", bad);
}

int main(void) {
    RUN(test_codes_exact);
    RUN(test_q4k_scales);
    RUN(test_q4k);
    RUN(test_q8_0);
    RUN(test_control_wrong_order);
    return test_failed_tests != 0;
}
