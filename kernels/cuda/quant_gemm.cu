/* quant_gemm.cu — the prefill GEMM on quantized weights, for Hopper (sm_90a):
 * y[T][rows] = x[T][cols] @ W^T with W kept in its GGUF blocks (quant.cuh's
 * split layout), Q4_K and Q8_0.
 *
 * Why: the other prefill route dequantizes each matrix to a bf16 scratch and
 * runs cuBLASLt on it: 16 GB of bf16 written and read back per 512-token step
 * of an 8B model, ~5 ms of a ~17.5 ms step (kernels/NOTES.md). Here each block
 * dequantizes its W tile in registers, where wgmma reads its A operand, so the
 * quantized bytes are the only weight traffic.
 *
 * Block: 256 threads = two warpgroups, 128 rows of W (64 a warpgroup) by BN =
 * 128 x NH tokens of x. A stage is 64 values of k: x's [BN][64] bf16 tile in
 * the 128-byte-swizzled layout wgmma's B descriptor reads, and each W row's
 * bytes of those 64 values (Q4_K: 32 bytes of codes + the block's 16-byte
 * header; Q8_0: 64 codes + two fp16 scales), copied by cp.async S stages
 * ahead. A warp's A fragment (m64k16, 4 registers: rows g, g+8 of its 16,
 * k 2t..2t+1 and 2t+8..2t+9) is made from the staged codes while the previous
 * k16 step's wgmma runs. The values are quant_dequant_bf16's exactly (the same
 * correctly rounded fp32 operations, then bf16), so this GEMM differs from
 * dequantize + cuBLASLt only in the order of the fp32 sums. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/cuda/tensor_core.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QM_WGMMA 1 /* wgmma exists only in the arch-specific sm_90a target */
#else
#define QM_WGMMA 0
#endif

#define QM_BM 128     /* W rows a block */
#define QM_THREADS 256
/* 128-token tiles run two blocks an SM (their phases interleave: one block's
 * dequantization under the other's wgmmas), 256-token tiles one */
#define QM_BLOCKS_PER_SM(NH) ((NH) == 1 ? 2 : 1)
#define QM_SMEM_MAX(NH) ((NH) == 1 ? 110 * 1024 : 200 * 1024)

template <int Q> static __host__ __device__ constexpr int qm_row_bytes() { return Q == DT_Q4_K ? 48 : 80; }
/* a stage: x tile (BN rows of 128 bytes, a multiple of the 1024-byte swizzle
 * atom) then the W rows; 48- and 80-byte rows keep the lanes' 2-byte code
 * reads free of bank conflicts (row strides of 12 and 20 words) */
template <int Q, int NH> static __host__ __device__ constexpr int qm_stage_bytes() {
    return 128 * NH * 128 + QM_BM * qm_row_bytes<Q>();
}
template <int Q, int NH> static __host__ __device__ constexpr int qm_stages() {
    return QM_SMEM_MAX(NH) / qm_stage_bytes<Q, NH>() > 8 ? 8 : QM_SMEM_MAX(NH) / qm_stage_bytes<Q, NH>();
}
template <int Q, int NH> static __host__ __device__ constexpr int qm_smem_bytes() {
    return qm_stages<Q, NH>() * qm_stage_bytes<Q, NH>() + 1024; /* + alignment of the base to 1024 */
}

/* ---- wgmma (PTX ISA 8.0, sm_90a); everything down to the kernel is device
 * code of the sm_90a target only ---- */
#if QM_WGMMA

/* Shared-memory matrix descriptor of a K-major bf16 tile with rows of 128
 * bytes, 128-byte swizzle: start address, stride between 8-row groups 1024. */
static __device__ __forceinline__ uint64_t qm_desc(uint32_t saddr) {
    return (uint64_t)((saddr >> 4) & 0x3fff) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accumulator reads above the last wait (only
 * after it: an asm "writing" them while a wgmma is in flight serializes) */
static __device__ __forceinline__ void wg_hold(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* d[64 x 128] = A[64 x 16] (registers) B[16 x 128] (shared, K-major) + (add ? d : 0);
 * the first product writes d without a zeroing pass (instructions that write
 * the accumulators between wgmmas make ptxas serialize them) */
static __device__ __forceinline__ void wg_mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int add) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(add));
}

/* 4-byte global -> shared copy (the Q8_0 scale pair of a stage row) */
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
/* cp.async writes go through the generic proxy, wgmma reads through the async one */
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* ---- one stage's copies ----
 * Each thread's copies are the same every stage but for a k offset, so their
 * addresses are worked out once (QmCopies) and a stage costs a few
 * instructions a copy. x: row n's 16-byte chunk c goes to chunk c ^ (n % 8)
 * of its 128-byte row (the swizzle); a thread takes chunk tid % 8 of rows
 * tid / 8 + 32 r. W: Q4_K rows take 32 code bytes (chunk kt % 4 of block
 * kt / 4) then the block's header; Q8_0 rows the codes of blocks 2kt, 2kt+1,
 * then their two fp16 scales. */
template <int NH> struct QmCopies {
    const __nv_bfloat16 *x;   /* row tid / 8, chunk tid % 8 */
    uint32_t x_valid;         /* bit r: row tid / 8 + 32 r is a token */
    const uint8_t *w[2], *sc; /* W copies i = tid, tid + 256; Q8_0's scale pair (tid < 128) */
    int w_dst[2], w_part[2];  /* Q4_K: part 0, 1 codes, 2 header; -1: no copy */
};

template <int Q, int NH>
static __device__ __forceinline__ QmCopies<NH> qm_copies(const __nv_bfloat16 *x, int T, int K, int n0, const uint8_t *qs,
                                                         const uint8_t *sc, int m0, int nb) {
    QmCopies<NH> c;
    const int tid = threadIdx.x, n = tid >> 3;
    c.x = x + (size_t)(n0 + n < T ? n0 + n : 0) * K + (tid & 7) * 8;
    c.x_valid = 0;
#pragma unroll
    for (int r = 0; r < 4 * NH; r++) c.x_valid |= (uint32_t)(n0 + n + 32 * r < T) << r;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int i = tid + QM_THREADS * k;
        if (Q == DT_Q4_K) {
            int r = i / 3, part = i % 3;
            c.w_part[k] = i < QM_BM * 3 ? part : -1;
            c.w[k] = qs + (size_t)(m0 + (r < QM_BM ? r : 0)) * nb * 144 + (part < 2 ? 16 + 16 * part : 0);
            c.w_dst[k] = r * 48 + part * 16;
        } else {
            int r = i >> 2;
            c.w_part[k] = 0;
            c.w[k] = qs + (size_t)(m0 + r) * nb * 32 + (i & 3) * 16;
            c.w_dst[k] = r * 80 + (i & 3) * 16;
        }
    }
    c.sc = Q == DT_Q8_0 ? sc + (size_t)(m0 + (tid < QM_BM ? tid : 0)) * nb * 2 : NULL;
    return c;
}

template <int Q, int NH>
static __device__ __forceinline__ void qm_load_stage(uint8_t *st, const QmCopies<NH> &c, int K, int kt) {
    const uint32_t xs = smem_u32(st) + (threadIdx.x >> 3) * 128 + ((((threadIdx.x & 7) ^ ((threadIdx.x >> 3) & 7))) << 4);
#pragma unroll
    for (int r = 0; r < 4 * NH; r++) /* row + 32 r keeps the row's swizzle (32 % 8 == 0) */
        cp_async16(xs + r * 32 * 128, c.x + (size_t)r * 32 * K + kt * 64, (c.x_valid >> r) & 1);
    const uint32_t ws = smem_u32(st) + 128 * NH * 128;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (c.w_part[k] < 0) continue;
        int off = Q == DT_Q4_K ? (kt >> 2) * 144 + (c.w_part[k] < 2 ? (kt & 3) * 32 : 0) : kt * 64;
        cp_async16(ws + c.w_dst[k], c.w[k] + off, true);
    }
    if (Q == DT_Q8_0 && threadIdx.x < QM_BM) cp_async4(ws + threadIdx.x * 80 + 64, c.sc + kt * 4);
}

/* ---- codes to bf16 pairs: quant_dequant_bf16's arithmetic ---- */

#define QM_MAGIC 8388608.0f /* 2^23: a small integer q in the low mantissa bits reads as 2^23 + q */
static __device__ __forceinline__ float qm_code(uint32_t q) { return __fsub_rn(__uint_as_float(q | 0x4b000000u), QM_MAGIC); }

/* Q4_K: the nibbles at bit `shift` of the two bytes of w16. dl * q is exact
 * in fp32 (d: 11 significant bits, scale 6, q 4), so one fused multiply-add
 * rounds as quant_dequant_bf16's multiply-then-add does. */
static __device__ __forceinline__ uint32_t q4k_pair(uint32_t w16, int shift, float dl, float nml) {
    float e0 = __fmaf_rn(dl, qm_code((w16 >> shift) & 0xf), nml);
    float e1 = __fmaf_rn(dl, qm_code((w16 >> (shift + 8)) & 0xf), nml);
    __nv_bfloat162 p = __floats2bfloat162_rn(e0, e1);
    return *(uint32_t *)&p;
}
/* Q8_0: the two int8 codes of w16 */
static __device__ __forceinline__ uint32_t q8_pair(uint32_t w16, float d) {
    float e0 = __fmul_rn(d, __fsub_rn(__uint_as_float(((w16 & 0xff) ^ 0x80) | 0x4b000000u), QM_MAGIC + 128.0f));
    float e1 = __fmul_rn(d, __fsub_rn(__uint_as_float((((w16 >> 8) & 0xff) ^ 0x80) | 0x4b000000u), QM_MAGIC + 128.0f));
    __nv_bfloat162 p = __floats2bfloat162_rn(e0, e1);
    return *(uint32_t *)&p;
}
static __device__ __forceinline__ uint32_t lds16(const uint8_t *p) { return *(const unsigned short *)p; }

/* A stage row's scales: Q4_K sub-blocks 2c, 2c+1 (c = kt % 4) as dl = d*scale
 * and -dmin*min (kernels/dtype.c k_scale_min); Q8_0 the two blocks' d. */
typedef struct {
    float mul[2], add[2];
} QmScales;

/* byte i (0..11) of the packed scales: header bytes 4..15 */
static __device__ __forceinline__ uint32_t sc_byte(uint4 h, int i) {
    uint32_t w = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (w >> (8 * (i & 3))) & 0xff;
}

template <int Q>
static __device__ __forceinline__ QmScales qm_scales(const uint8_t *row, int kt) {
    QmScales s;
    if (Q == DT_Q4_K) {
        uint4 h = *(const uint4 *)(row + 32);
        float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff)));
        float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int j = 2 * (kt % 4) + u;
            int lo = j < 4 ? j : j + 4, hi = j < 4 ? j + 4 : j; /* bytes: scale's low bits, min's low bits */
            uint32_t blo = sc_byte(h, lo), bhi = sc_byte(h, hi);
            int scale, min;
            if (j < 4) {
                scale = blo & 63;
                min = bhi & 63;
            } else {
                uint32_t bm4 = sc_byte(h, j - 4);
                scale = (blo & 0xf) | (bm4 >> 6) << 4;
                min = (blo >> 4) | (bhi >> 6) << 4;
            }
            s.mul[u] = __fmul_rn(d, qm_code(scale));
            s.add[u] = -__fmul_rn(dmin, qm_code(min));
        }
    } else {
        uint32_t dd = *(const uint32_t *)(row + 64);
        s.mul[0] = __half2float(__ushort_as_half((unsigned short)(dd & 0xffff)));
        s.mul[1] = __half2float(__ushort_as_half((unsigned short)(dd >> 16)));
        s.add[0] = s.add[1] = 0.0f;
    }
    return s;
}

/* The stage's four A fragments (k16 steps j = 0..3) for rows ra, rb of the
 * stage's W rows: a[j][0] (ra, k 16j + 2t, +1), a[j][1] (rb, same k),
 * a[j][2] (ra, k 16j + 2t + 8, +9), a[j][3] (rb, same). Made together, so
 * the loads and conversions of four steps overlap. Q4_K: values 0..31 of the
 * stage are the low nibbles of its 32 code bytes, 32..63 the high ones
 * (sub-blocks 2c and 2c+1): steps j and j+2 read the same bytes. */
template <int Q>
static __device__ __forceinline__ void qm_frags(uint32_t (&a)[4][4], const uint8_t *ra, const uint8_t *rb,
                                                const QmScales &sa, const QmScales &sb, int t) {
    if (Q == DT_Q4_K) {
        uint32_t wa[4], wb[4]; /* bytes 2t + 8o, +1 of each row */
#pragma unroll
        for (int o = 0; o < 4; o++) wa[o] = lds16(ra + 2 * t + 8 * o), wb[o] = lds16(rb + 2 * t + 8 * o);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int o = 2 * (j % 2), shift = 4 * (j / 2), u = j / 2;
            a[j][0] = q4k_pair(wa[o], shift, sa.mul[u], sa.add[u]);
            a[j][1] = q4k_pair(wb[o], shift, sb.mul[u], sb.add[u]);
            a[j][2] = q4k_pair(wa[o + 1], shift, sa.mul[u], sa.add[u]);
            a[j][3] = q4k_pair(wb[o + 1], shift, sb.mul[u], sb.add[u]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int off = 16 * j + 2 * t, u = j / 2;
            a[j][0] = q8_pair(lds16(ra + off), sa.mul[u]);
            a[j][1] = q8_pair(lds16(rb + off), sb.mul[u]);
            a[j][2] = q8_pair(lds16(ra + off + 8), sa.mul[u]);
            a[j][3] = q8_pair(lds16(rb + off + 8), sb.mul[u]);
        }
    }
}

/* ---- the kernel ---- */

/* tells the compiler the registers are in use up to here: a wgmma reads its
 * A registers after it is issued, until a wait says it is done */
static __device__ __forceinline__ void wg_hold_a(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" ::"r"(a[j][i]) : "memory"); /* a use, not a write */
}

/* One stage: wait for its copies, start those of stage kt + P (into the
 * buffer of stage kt - 2, whose wgmmas are done), make its A fragments in
 * cur while the previous stage's wgmmas run, issue its wgmmas, wait for the
 * previous stage's, whose fragments (prev) are then free. */
template <int Q, int NH>
static __device__ __forceinline__ void qm_step(float (&acc)[NH][64], uint32_t (&cur)[4][4], uint32_t (&prev)[4][4],
                                               uint8_t *smem, const QmCopies<NH> &cp, int K, int KT, int kt, int wrow,
                                               int t) {
    constexpr int S = qm_stages<Q, NH>(), P = S - 2, SB = qm_stage_bytes<Q, NH>();
    cp_async_wait<P - 1>();
    fence_proxy_async();
    __syncthreads();
    if (kt + P < KT) qm_load_stage<Q, NH>(smem + ((kt + P) % S) * SB, cp, K, kt + P);
    cp_async_commit();
    const uint8_t *st = smem + (kt % S) * SB, *w = st + 128 * NH * 128;
    const uint8_t *ra = w + wrow * qm_row_bytes<Q>(), *rb = ra + 8 * qm_row_bytes<Q>();
    QmScales sa = qm_scales<Q>(ra, kt), sb = qm_scales<Q>(rb, kt);
    qm_frags<Q>(cur, ra, rb, sa, sb, t);
    const uint32_t xs = smem_u32(st);
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < NH; h++) wg_mma_rs(acc[h], cur[j], qm_desc(xs + h * 128 * 128 + 32 * j), kt | j);
    wg_commit();
    wg_wait<1>();
    wg_hold_a(prev);
}
#endif

template <int Q, int NH>
__global__ void __launch_bounds__(QM_THREADS, QM_BLOCKS_PER_SM(NH))
kernel_quant_gemm(void *y, bool y_f32, const __nv_bfloat16 *x, const uint8_t *qs, const uint8_t *sc, int T, int M,
                  int K) {
#if QM_WGMMA
    constexpr int S = qm_stages<Q, NH>(), P = S - 2, SB = qm_stage_bytes<Q, NH>();
    extern __shared__ uint8_t qm_smem_raw[];
    uint8_t *smem = qm_smem_raw + ((1024 - (smem_u32(qm_smem_raw) & 1023)) & 1023);
    const int n0 = blockIdx.x * 128 * NH, m0 = blockIdx.y * QM_BM, KT = K / 64;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = 64 * (warp >> 2) + 16 * (warp & 3) + g; /* this lane's first W row in the tile */
    const QmCopies<NH> cp = qm_copies<Q, NH>(x, T, K, n0, qs, sc, m0, K / quant_block_elems(Q));

    float acc[NH][64]; /* written first by the wgmma of kt = 0, j = 0 (add = 0) */
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (p < KT) qm_load_stage<Q, NH>(smem + p * SB, cp, K, p);
        cp_async_commit();
    }
    /* the A fragments of two stages, named apart so each keeps its registers
     * while its wgmmas may read them */
    uint32_t a0[4][4], a1[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) a1[j][i] = 0;
    int kt = 0;
    for (; kt + 1 < KT; kt += 2) { /* no branch between the two: phi moves would rewrite A registers in use */
        qm_step<Q, NH>(acc, a0, a1, smem, cp, K, KT, kt, wrow, t);
        qm_step<Q, NH>(acc, a1, a0, smem, cp, K, KT, kt + 1, wrow, t);
    }
    if (kt < KT) qm_step<Q, NH>(acc, a0, a1, smem, cp, K, KT, kt, wrow, t);
    wg_wait<0>();
    wg_hold_a(a0);
    wg_hold_a(a1);
#pragma unroll
    for (int h = 0; h < NH; h++) wg_hold(acc[h]);

    /* acc[h][4c + e]: W row wrow (e < 2) or wrow + 8, token n0 + 128h + 8c + 2t + e % 2 */
    const int mA = m0 + wrow;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int c = 0; c < 16; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int n = n0 + 128 * h + 8 * c + 2 * t + (e & 1), m = mA + (e >> 1) * 8;
                if (n >= T) continue;
                size_t o = (size_t)n * M + m;
                if (y_f32) ((float *)y)[o] = acc[h][4 * c + e];
                else ((__nv_bfloat16 *)y)[o] = __float2bfloat16_rn(acc[h][4 * c + e]);
            }
#endif
}

/* ---- host side ---- */

bool quant_gemm_available(void) {
    /* the kernel has a body only in an sm_90a build, and only that build's code runs on the device */
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel_quant_gemm<DT_Q4_K, 1>) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.binaryVersion == 90 && fa.ptxVersion >= 90;
}

bool quant_gemm_supported(DType t, int64_t rows, int64_t cols) {
    if (t != DT_Q4_K && t != DT_Q8_0) return false;
    return rows > 0 && cols > 0 && rows % QM_BM == 0 && rows <= 65535LL * QM_BM && cols % (t == DT_Q4_K ? 256 : 64) == 0 && cols <= (1 << 30);
}

template <int Q, int NH>
static int qm_launch(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, cudaStream_t s, Err *err) {
    const int smem = qm_smem_bytes<Q, NH>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemm<Q, NH>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err);
    dim3 grid((unsigned)((T + 128 * NH - 1) / (128 * NH)), (unsigned)(W->rows / QM_BM));
    kernel_quant_gemm<Q, NH><<<grid, QM_THREADS, smem, s>>>(y, y_f32, (const __nv_bfloat16 *)x,
                                                            (const uint8_t *)W->qs, (const uint8_t *)W->sc, T,
                                                            (int)W->rows, (int)W->cols);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* tokens per block: 256 where that still makes two tiles per SM */
static int qm_pick_bn(const QuantMatrix *W, int T, Err *err) {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    int64_t tiles256 = (int64_t)((T + 255) / 256) * (W->rows / QM_BM);
    return tiles256 >= 2 * sms ? 256 : 128;
}

int quant_gemm_variant(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, cudaStream_t s,
                       Err *err) {
    if (!quant_gemm_supported(W->type, W->rows, W->cols))
        return err_set(err, "quant_gemm: %s [%lld][%lld] not supported (Q4_K or Q8_0, rows a multiple of 128)",
                       dtype_info(W->type)->name, (long long)W->rows, (long long)W->cols);
    if (!quant_gemm_available()) return err_set(err, "quant_gemm: needs an sm_90a build on a compute-capability 9.0 GPU");
    if (T <= 0) return T == 0 ? 0 : err_set(err, "quant_gemm: T = %d", T);
    if ((uintptr_t)x % 16 || (W->cols * 2) % 16) return err_set(err, "quant_gemm: x must be 16-byte aligned");
    if (bn == 0 && (bn = qm_pick_bn(W, T, err)) < 0) return -1;
    if (bn != 128 && bn != 256) return err_set(err, "quant_gemm: tokens per block %d (128 or 256)", bn);
    if (W->type == DT_Q4_K)
        return bn == 128 ? qm_launch<DT_Q4_K, 1>(W, x, T, y, y_f32, s, err) : qm_launch<DT_Q4_K, 2>(W, x, T, y, y_f32, s, err);
    return bn == 128 ? qm_launch<DT_Q8_0, 1>(W, x, T, y, y_f32, s, err) : qm_launch<DT_Q8_0, 2>(W, x, T, y, y_f32, s, err);
}

int quant_gemm(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, cudaStream_t s, Err *err) {
    return quant_gemm_variant(W, x, T, y, y_f32, 0, s, err);
}
