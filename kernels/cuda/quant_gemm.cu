/* quant_gemm.cu — the prefill GEMM on quantized weights, for Hopper (sm_90a):
 * y[T][rows] = x[T][cols] @ W^T with W kept in its GGUF blocks (quant.cuh's
 * split layout), Q4_K and Q8_0 (v3, v4, v5), Q5_K and Q6_K (v5).
 *
 * Why: the other prefill route dequantizes each matrix to a bf16 scratch and
 * runs cuBLASLt on it: 16 GB of bf16 written and read back per 512-token step
 * of an 8B model, ~5 ms of a ~17.5 ms step (kernels/NOTES.md), and up to two
 * 256 MiB scratch buffers. Here each block dequantizes its W tiles on chip,
 * where wgmma reads them, so the quantized bytes are the only weight traffic
 * and no scratch exists.
 *
 * Two kernels. v4 / v5 (v5 the default; below the v3 code): each multiplying
 * thread dequantizes its own wgmma A fragment in registers (v4 with v3's
 * exact fp32 operations, v5 with bf16x2 ones), the stages come by TMA, and K
 * may be split over blocks for GEMMs of few tiles; see its section. v3
 * (Q8_0 with cols % 256 != 0, and by version):
 * Block: 384 threads, 128 rows of W by BN = 128 x NH tokens of x, in stages
 * of 64 values of k, both tiles in the 128-byte-swizzled K-major layout of
 * wgmma's descriptors. Warpgroup 0, the "maker", dequantizes W's [128][64]
 * tile of each stage to bf16 (a thread a row, its raw bytes loaded a stage
 * ahead). Warpgroups 1 and 2, the "multipliers", copy x's [BN][64] tiles by
 * cp.async S - 1 stages ahead and multiply 64 W rows each (wgmma m64n128k16,
 * both operands from shared memory, fp32 accumulators in registers). Named
 * barriers hand stages over (full / empty). v3's and v4's W values
 * are quant_dequant_bf16's exactly (the same correctly rounded fp32
 * operations, then bf16), so they differ from dequantize + cuBLASLt only in
 * the order of the fp32 sums; v5's are within ~2^-8 of them. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.cuh" /* act_glu */
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_layout.cuh"
#include "kernels/cuda/tensor_core.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QM_WGMMA 1 /* wgmma exists only in the arch-specific sm_90a target */
#else
#define QM_WGMMA 0
#endif

#define QM_BM 128 /* W rows a block */
#define QM_THREADS 384 /* warpgroup 0 dequantizes W, 1 and 2 copy x and multiply (64 W rows each) */
#define QM_SMEM_MAX (200 * 1024)

/* a stage: x's tile (128 NH tokens x 64 values) and W's (128 rows x 64
 * values) as bf16, both in the 128-byte-swizzled K-major layout of wgmma's
 * descriptors; multiples of the 1024-byte swizzle atom */
template <int NH> static __host__ __device__ constexpr int qm_stage_bytes() { return 128 * NH * 128 + QM_BM * 128; }
template <int NH> static __host__ __device__ constexpr int qm_stages() {
    return QM_SMEM_MAX / qm_stage_bytes<NH>() > 6 ? 6 : QM_SMEM_MAX / qm_stage_bytes<NH>();
}
template <int NH> static __host__ __device__ constexpr int qm_smem_bytes() {
    return qm_stages<NH>() * qm_stage_bytes<NH>() + 1024; /* + alignment of the base to 1024 */
}

/* v4 (below): a stage is x's tile and W's raw bytes, 128 rows of 32 codes +
 * 16 header bytes (Q4_K) or 64 codes + 16 scale bytes (Q8_0); v5 Q6_K: 64
 * ql bytes, then 32 qh bytes, then the block's 16 scales (d by plain loads);
 * v5 Q5_K: Q4_K's 32 codes, the block's 32 qh bytes, then its header */
#define QR_THREADS 256 /* two warpgroups; thread 0 also issues the loads */
template <int Q> static __host__ __device__ constexpr int qr_codes_bytes() {
    return Q == DT_Q4_K ? QM_BM * 32 : Q == DT_Q6_K ? QM_BM * 96 : QM_BM * 64; /* Q5_K: 32 codes + 32 qh */
}
template <int Q> static __host__ __device__ constexpr int qr_w_bytes() { return qr_codes_bytes<Q>() + QM_BM * 16; }
/* BN tokens a block: 16, 32, 64, 128 (one wgmma of n = BN a k16 step) or
 * 256 (two of n = 128); x's tile is BN rows of 128 bytes */
template <int BN> static __host__ __device__ constexpr int qr_halves() { return BN > 128 ? 2 : 1; }
template <int BN> static __host__ __device__ constexpr int qr_wn() { return BN > 128 ? 128 : BN; }
template <int Q, int BN> static __host__ __device__ constexpr int qr_stage_bytes() {
    return BN * 128 + ((qr_w_bytes<Q>() + 1023) & ~1023); /* x's tile first: keeps the 1024-byte atoms */
}
#define QR_SMEM_MAX (227 * 1024 - 1024 - 256) /* less the alignment and the mbarriers */
/* a multiple of 4 (the multipliers' loop takes S stages a turn, so buffers,
 * descriptors and kt % 4 are constants), at most 8 */
/* MB blocks an SM: 1, or 2 (64- and 128-token tiles of Q4_K and Q8_0: half the shared memory each, 128
 * registers; quant_gemm takes it for launches of more tiles than SMs and no split of K) */
#define QR_SMEM_MAX2 (112 * 1024 - 1024 - 256)
template <int Q, int BN, int MB = 1> static __host__ __device__ constexpr int qr_stages() {
    constexpr int fit = (MB == 2 ? QR_SMEM_MAX2 : QR_SMEM_MAX) / qr_stage_bytes<Q, BN>();
    return fit >= 8 ? 8 : fit / 4 * 4;
}
/* the rows of x's box: BN, or T where a launch's one token tile is shorter (the tensor map's box and
 * each stage's expected bytes must agree) */
template <int BN> static __host__ __device__ int qr_x_rows(int T) { return T < BN ? T : BN; }

/* v4 / v5's epilogue beyond plain y (quant_gemm_epi): with parts, y's rows in GemvOut's three parts with
 * biases (end[2] = rows); with glu_f > 0, W = Wgate|Wup of 2 glu_f rows, whose tile i multiplies gate rows
 * 64 i .. (warpgroup 0) and up rows glu_f + 64 i .. (warpgroup 1), and out = y[0] [T][glu_f] gets act(gate +
 * bg, up + bu). Replaces the QKV split and GLU kernels (a read and a write of y each) at prefill. */
typedef struct {
    void *y[3];
    const float *bias[3];
    int end[3];
    int parts, glu_f, act;
    const float *bg, *bu;
    float limit;
} QrEpi;

template <int Q, int BN, int MB = 1> static __host__ __device__ constexpr int qr_smem_bytes() {
    return qr_stages<Q, BN, MB>() * qr_stage_bytes<Q, BN>() + 16 * qr_stages<Q, BN, MB>() + 1024;
}

/* ---- wgmma (PTX ISA 8.0, sm_90a); everything down to the kernel is device
 * code of the sm_90a target only ---- */
#if QM_WGMMA

/* Shared-memory matrix descriptor of a K-major bf16 tile with rows of 128
 * bytes, 128-byte swizzle: start address, stride between 8-row groups 1024. */
static __device__ __forceinline__ uint64_t qm_desc(uint32_t saddr) {
    return (uint64_t)((saddr >> 4) & 0x3fff) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
/* the descriptor of base + off from base's: the address field (bits 0-13)
 * takes off / 16 without a carry while base + off stays in shared memory's
 * 228 KB, so one 32-bit add instead of the shifts and masks per wgmma */
static __device__ __forceinline__ uint64_t qm_desc_at(uint64_t base, uint32_t off) { return base + (off >> 4); }
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accumulator reads above the last wait */
template <int NA> static __device__ __forceinline__ void wg_hold(float (&d)[NA]) {
#pragma unroll
    for (int i = 0; i < NA; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* the 64 fp32 accumulators of an m64n128 wgmma: operands %0-%63 of the asm */
#define QM_ACC_OPERANDS                                                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"  \
    "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,"    \
    "%57,%58,%59,%60,%61,%62,%63},"
#define QM_ACC8(d, i)                                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]),         \
        "+f"(d[i + 7])
#define QM_ACC_CONSTRAINTS(d)                                                                                          \
    QM_ACC8(d, 0), QM_ACC8(d, 8), QM_ACC8(d, 16), QM_ACC8(d, 24), QM_ACC8(d, 32), QM_ACC8(d, 40), QM_ACC8(d, 48),      \
        QM_ACC8(d, 56)

/* d[64 x 128] = A[64 x 16] B[16 x 128] + (add ? d : 0), both from shared
 * memory (K-major); the first product writes d without a zeroing pass */
static __device__ __forceinline__ void wg_mma_ss(float (&d)[64], uint64_t da, uint64_t db, int add) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        QM_ACC_OPERANDS
        " %64, %65, p, 1, 1, 0, 0;\n}\n"
        : QM_ACC_CONSTRAINTS(d)
        : "l"(da), "l"(db), "r"(add));
}

/* Named barriers of N threads: stage s is full (barrier 1 + s, all threads:
 * the maker and the multipliers' copies are done) or empty again (1 + S + s:
 * the multipliers arrive, the maker waits); 1 + 2S is the multipliers' own.
 * 0 is __syncthreads'. */
template <int N> static __device__ __forceinline__ void bar_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(N) : "memory");
}
template <int N> static __device__ __forceinline__ void bar_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(N) : "memory");
}

/* shared-memory writes of threads (generic proxy: the maker's stores, the
 * multipliers' cp.async) before wgmma reads them (async proxy) */
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* ---- the stage's tiles: x by cp.async (the multipliers), W dequantized by one thread a row (the maker) ---- */

/* x's tile of stage kt: chunk c of token row n goes to chunk c ^ (n % 8) of
 * its 128-byte row (the swizzle); thread i of the MT copying threads takes
 * chunk i % 8 of rows i / 8 + (MT / 8) r */
template <int NH, int MT>
static __device__ __forceinline__ void qm_copy_x(uint8_t *st, const __nv_bfloat16 *x, int T, int K, int n0, int kt,
                                                 int i) {
    constexpr int RS = MT / 8; /* a multiple of 8 rows: keeps the row's swizzle */
    const int n = i >> 3, c = i & 7;
    const uint32_t dst = smem_u32(st) + n * 128 + ((c ^ (n & 7)) << 4);
#pragma unroll
    for (int r = 0; r < 128 * NH / RS; r++) {
        bool ok = n0 + n + RS * r < T;
        cp_async16(dst + r * RS * 128, x + (size_t)(ok ? n0 + n + RS * r : 0) * K + kt * 64 + c * 8, ok);
    }
}

/* A W row's bytes of one stage (64 values), loaded a stage ahead. */
typedef struct {
    uint4 q[4]; /* Q4_K: q[0..1] the 32 code bytes (chunk kt % 4 of block kt / 4), q[2] the header; Q8_0: 64 codes */
    uint32_t d; /* Q8_0: the two blocks' fp16 scales */
} QmRaw;

template <int Q>
static __device__ __forceinline__ QmRaw qm_load_raw(const uint8_t *qs, const uint8_t *sc, int64_t row, int nb, int kt) {
    QmRaw r;
    r.q[3] = make_uint4(0, 0, 0, 0);
    if (Q == DT_Q4_K) {
        const uint8_t *blk = qs + ((size_t)row * nb + (kt >> 2)) * 144;
        r.q[0] = __ldg((const uint4 *)(blk + 16 + (kt & 3) * 32));
        r.q[1] = __ldg((const uint4 *)(blk + 16 + (kt & 3) * 32) + 1);
        r.q[2] = __ldg((const uint4 *)blk);
        r.d = 0;
    } else {
        const size_t b = (size_t)row * nb + 2 * kt;
        const uint4 *p = (const uint4 *)(qs + b * 32);
#pragma unroll
        for (int k = 0; k < 4; k++) r.q[k] = __ldg(p + k);
        r.d = __ldg((const uint32_t *)(sc + b * 2));
    }
    return r;
}

#define QM_MAGIC 8388608.0f /* 2^23: a small integer q in the low mantissa bits reads as 2^23 + q */
static __device__ __forceinline__ float qm_code(uint32_t q) { return __fsub_rn(__uint_as_float(q | 0x4b000000u), QM_MAGIC); }
static __device__ __forceinline__ float qm_half(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
static __device__ __forceinline__ uint32_t qm_word(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
/* byte i (0..11) of the packed Q4_K scales: header bytes 4..15 */
static __device__ __forceinline__ uint32_t sc_byte(uint4 h, int i) { return (qm_word(h, 1 + i / 4) >> (8 * (i & 3))) & 0xff; }

/* Q4_K sub-block j's dl = d * scale and -dmin * min (kernels/dtype.c k_scale_min) */
static __device__ __forceinline__ void q4k_scale(uint4 h, int j, float *dl, float *nml) {
    int scale, min;
    if (j < 4) {
        scale = sc_byte(h, j) & 63;
        min = sc_byte(h, j + 4) & 63;
    } else {
        scale = (sc_byte(h, j + 4) & 0xf) | (sc_byte(h, j - 4) >> 6) << 4;
        min = (sc_byte(h, j + 4) >> 4) | (sc_byte(h, j) >> 6) << 4;
    }
    *dl = __fmul_rn(qm_half(h.x & 0xffff), qm_code(scale));
    *nml = -__fmul_rn(qm_half(h.x >> 16), qm_code(min));
}

/* (a & k) | m in one LOP3 (the compiler splits two immediates into two) */
static __device__ __forceinline__ uint32_t qm_and_or(uint32_t a, uint32_t k, uint32_t m) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(k), "r"(m));
    return d;
}

static __device__ __forceinline__ uint32_t bf16_pair(float a, float b) {
    __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&p;
}

/* Row `row` of the stage's W tile, in halves h = 0, 1 (32 values, chunks
 * 4h .. 4h + 3): quant_dequant_bf16's values (Q4_K: dl * q is
 * exact in fp32, so one fused multiply-add rounds as its multiply-then-add
 * does; Q8_0: d * q), 8 to a 16-byte chunk, chunk c at c ^ (row % 8). Q4_K
 * half h is nibble h of the 32 code bytes (sub-block 2 (kt % 4) + h of the
 * block); Q8_0 half h is block 2 kt + h. */
template <int Q>
static __device__ __forceinline__ void qm_dequant_row(uint8_t *wt, int row, const QmRaw &r, int kt) {
    uint8_t *dst = wt + row * 128;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mul, add = 0.0f;
        if (Q == DT_Q4_K) q4k_scale(r.q[2], 2 * (kt & 3) + h, &mul, &add);
        else mul = qm_half(h ? r.d >> 16 : r.d & 0xffff);
        /* a code at bits s.. of a word becomes the float 2^23 + q 2^s with one
         * masked OR (then 2^23 is subtracted exactly), and the scale times
         * 2^-s takes it back: (mul 2^-s)(q 2^s) is the exact product mul q, so
         * every value is rounded as before, with no shift per code (bytes 2-3
         * of a word shifted once, since q 2^s must stay under 2^23) */
        float m_lo, m_hi;
        uint32_t k_lo, k_hi, flip;
        if (Q == DT_Q4_K) { /* nibble h of bytes 0 and 1 */
            k_lo = 0xfu << 4 * h, k_hi = 0xf00u << 4 * h, flip = 0;
            m_lo = __fmul_rn(mul, h ? 0.0625f : 1.0f), m_hi = __fmul_rn(mul, h ? 1.0f / 4096 : 1.0f / 256);
        } else { /* bytes 0 and 1, offset to unsigned (the 128 comes off with 2^23) */
            k_lo = 0xffu, k_hi = 0xff00u, flip = 0x80808080u;
            m_lo = mul, m_hi = __fmul_rn(mul, 1.0f / 256);
        }
        const float sub_lo = Q == DT_Q4_K ? QM_MAGIC : QM_MAGIC + 128.0f, sub_hi = Q == DT_Q4_K ? QM_MAGIC : QM_MAGIC + 32768.0f;
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            uint32_t v[4];
            uint32_t w[2];
            if (Q == DT_Q4_K) { /* values 8 cc .. +7 of the half: bytes 8 cc .. +7, nibble h */
                w[0] = qm_word(r.q[cc >> 1], 2 * (cc & 1)), w[1] = qm_word(r.q[cc >> 1], 2 * (cc & 1) + 1);
            } else { /* values 8 cc .. +7 of block h: its code bytes 8 cc .. +7 */
                const uint4 q = r.q[2 * h + (cc >> 1)];
                w[0] = qm_word(q, 2 * (cc & 1)) ^ flip, w[1] = qm_word(q, 2 * (cc & 1) + 1) ^ flip;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) { /* bytes 2 (k % 2) and 2 (k % 2) + 1 of word k / 2 */
                const uint32_t t = k & 1 ? w[k >> 1] >> 16 : w[k >> 1];
                const float lo = __fsub_rn(__uint_as_float(qm_and_or(t, k_lo, 0x4b000000u)), sub_lo);
                const float hi = __fsub_rn(__uint_as_float(qm_and_or(t, k_hi, 0x4b000000u)), sub_hi);
                v[k] = Q == DT_Q4_K ? bf16_pair(__fmaf_rn(m_lo, lo, add), __fmaf_rn(m_hi, hi, add))
                                    : bf16_pair(__fmul_rn(m_lo, lo), __fmul_rn(m_hi, hi));
            }
            *(uint4 *)(dst + (((4 * h + cc) ^ (row & 7)) << 4)) = make_uint4(v[0], v[1], v[2], v[3]);
        }
    }
}

/* The maker (warpgroup 0, thread i): W's raw bytes one stage ahead in
 * registers, each stage's W tile dequantized (row i) into its buffer once the
 * multipliers have released it, then "full". x is not its work: the
 * multipliers copy it, so the maker's loop is the dequantization alone and
 * runs up to S - 1 stages ahead of the tensor cores. */
template <int Q, int NH>
static __device__ __forceinline__ void qm_make(uint8_t *smem, const uint8_t *qs, const uint8_t *sc, int K, int m0, int KT) {
    constexpr int S = qm_stages<NH>(), SB = qm_stage_bytes<NH>();
    const int i = threadIdx.x, nb = K / quant_block_elems(Q);
    QmRaw next = qm_load_raw<Q>(qs, sc, m0 + i, nb, 0);
    for (int kt = 0; kt < KT; kt++) {
        if (kt >= S) bar_sync<QM_THREADS>(1 + S + kt % S); /* the multipliers are done with stage kt - S */
        QmRaw r = next;
        if (kt + 1 < KT) next = qm_load_raw<Q>(qs, sc, m0 + i, nb, kt + 1);
        qm_dequant_row<Q>(smem + (kt % S) * SB + 128 * NH * 128, i, r, kt);
        fence_proxy_async();
        bar_arrive<QM_THREADS>(1 + kt % S);
    }
}

/* The multipliers (thread j of 256): 64 W rows each (wg = 0, 1) times the
 * stage's x tile, which they copy themselves by cp.async into each buffer
 * as soon as both warpgroups' products of its last stage are done (barrier
 * 1 + 2S between the two), S - 1 stages ahead. */
template <int NH>
static __device__ __forceinline__ void qm_multiply(float (&acc)[NH][64], uint8_t *smem, const __nv_bfloat16 *x, int T,
                                                   int K, int n0, int wg, int KT) {
    constexpr int S = qm_stages<NH>(), SB = qm_stage_bytes<NH>(), N = QM_THREADS;
    const int j = threadIdx.x - 128;
    const uint64_t d0 = qm_desc(smem_u32(smem));
#pragma unroll
    for (int d = 0; d < S; d++) {
        if (d < KT) qm_copy_x<NH, 256>(smem + d * SB, x, T, K, n0, d, j);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<S - 2>(); /* this thread's copies of stage kt (the newest group is stage kt + S - 2) */
        fence_proxy_async();
        bar_sync<N>(1 + kt % S); /* every copy of x and the maker's W tile of stage kt */
        const uint32_t xs = (kt % S) * SB, ws = xs + 128 * NH * 128 + wg * 64 * 128;
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int h = 0; h < NH; h++)
                wg_mma_ss(acc[h], qm_desc_at(d0, ws + 32 * k), qm_desc_at(d0, xs + h * 128 * 128 + 32 * k), kt | k);
        wg_commit();
        wg_wait<1>(); /* this warpgroup's products of stage kt - 1 are done */
        if (kt >= 1) {
            const int s = kt - 1 + S; /* the stage that reuses kt - 1's buffer */
            if (s < KT) {
                bar_sync<256>(1 + 2 * S); /* and the other warpgroup's */
                bar_arrive<N>(1 + S + s % S);
                qm_copy_x<NH, 256>(smem + (s % S) * SB, x, T, K, n0, s, j);
            }
            cp_async_commit();
        }
    }
    wg_wait<0>();
#pragma unroll
    for (int h = 0; h < NH; h++) wg_hold(acc[h]);
}

/* ---- v4: W's fragments dequantized in the multiplying threads' registers ----
 *
 * 256 threads: two warpgroups of 64 W rows each. Thread 0 also loads each
 * stage by TMA (x's tile in wgmma's 128-byte
 * swizzle; Q4_K: the stage's 32 code bytes a row and the block's 16-byte
 * header; Q8_0: 64 codes a row, 16-byte chunks swizzled by (row / 2) % 4 so
 * the fragment reads below do not conflict, and 16 scale bytes a row of which
 * the stage's are 4 (kt % 4) ..), S - 1 stages ahead, on mbarriers (full:
 * the bytes landed; empty: all 256 threads are done with it).
 * Each multiplying thread reads the bytes of its fragment of A (wgmma
 * m64nNk16, A from registers: rows g and g + 8 of its warp's 16, k = 2t,
 * 2t + 1, 2t + 8, 2t + 9 of each k16 step), dequantizes them with the same
 * exact fp32 operations as v3's maker and quant_dequant_bf16, and issues the
 * wgmma. No bf16 W tile in shared memory, no copy instructions and no block
 * barrier in the multipliers' loop. */

/* B's descriptor from its low word (qm_desc's, + offset / 16): the high
 * word is a constant, so the per-wgmma additions stay 32-bit; m64nNk16 with
 * N = 2 NA (NA accumulators a thread) */
template <int NA>
static __device__ __forceinline__ void wg_mma_rs(float (&d)[NA], const uint32_t (&a)[4], uint32_t db_lo, int add) {
    const uint32_t hi = (uint32_t)(qm_desc(0) >> 32);
    if constexpr (NA == 64) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %69, 0;\nmov.b64 db, {%68, %70};\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            QM_ACC_OPERANDS
            " {%64,%65,%66,%67}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC_CONSTRAINTS(d)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else if constexpr (NA == 32) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %37, 0;\nmov.b64 db, {%36, %38};\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0), QM_ACC8(d, 8), QM_ACC8(d, 16), QM_ACC8(d, 24)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else if constexpr (NA == 16) {
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %21, 0;\nmov.b64 db, {%20, %22};\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0), QM_ACC8(d, 8)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    } else {
        static_assert(NA == 8, "m64n16, n32, n64 or n128");
        asm volatile(
            "{\n.reg .pred p;\n.reg .b64 db;\nsetp.ne.b32 p, %13, 0;\nmov.b64 db, {%12, %14};\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, db, p, 1, 1, 0;\n}\n"
            : QM_ACC8(d, 0)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(db_lo), "r"(add), "r"(hi));
    }
}

/* ((a ^ c) & b) | (c & ~b) in one LOP3: with b the byte's mask and c the
 * magic exponent plus the byte's sign bit, a Q8_0 code's float 2^23 + q + 128 */
static __device__ __forceinline__ uint32_t qm_flip_or(uint32_t a, uint32_t k, uint32_t m) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(k), "r"(m));
    return d;
}

/* mbarriers (PTX ISA 7.8, sm_90) and the TMA tile load */
static __device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* until completion number n of the barrier (counted from 0) has happened: parity n % 2 */
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
static __device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Stage kt's loads into buffer b (thread 0), its byte count announced on
 * b's full barrier. x: box {64 values, xrows tokens} at (64 kt, n0) (xrows = BN,
 * or T where a launch's one token tile is shorter: rows past T stay stale and
 * feed only tokens that are not stored); Q4_K
 * codes {32, 128} at block kt / 4's bytes 16 + 32 (kt % 4), headers {16, 128}
 * at its byte 0; Q8_0 codes {64, 128} at 64 kt, scales {16, 128} at byte
 * 16 (kt / 4) of the row's (4 stages' scales: a box's inner start must be
 * 16-byte aligned, and one at 4 kt faulted; past the row: zeros); Q6_K (v5)
 * ql {64, 128} (64-byte swizzle), qh {32, 128} (32-byte swizzle), scales
 * {16, 128} of half kt / 2 % 2 of block kt / 4. */
/* A plane of W's stage: one box of 128 rows at m0, or with two (a gated pair:
 * the tensor maps' boxes are 64 rows) 64 rows at m0 and 64 at m1 */
static __device__ __forceinline__ void qr_load_w(uint32_t dst, const CUtensorMap *map, int c0, int m0, int m1, bool two,
                                                 int row_bytes, uint32_t bar) {
    tma_load_2d(dst, map, c0, m0, bar);
    if (two) tma_load_2d(dst + 64 * row_bytes, map, c0, m1, bar);
}

template <int Q, int BN, int MB>
static __device__ __forceinline__ void qr_load(uint8_t *smem, const CUtensorMap *tx, const CUtensorMap *tw,
                                               const CUtensorMap *tw2, const CUtensorMap *tw3, int n0, int xrows, int m0,
                                               int m1, bool two, int kt, int b) {
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>();
    const uint32_t full = smem_u32(smem) + S * SB + 8 * b, st = smem_u32(smem) + b * SB, w = st + BN * 128;
    mbar_expect_tx(full, xrows * 128 + qr_w_bytes<Q>());
    tma_load_2d(st, tx, kt * 64, n0, full);
    if (Q == DT_Q4_K) {
        qr_load_w(w, tw, (kt >> 2) * 144 + 16 + (kt & 3) * 32, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 144, m0, m1, two, 16, full);
    } else if (Q == DT_Q5_K) {
        qr_load_w(w, tw, (kt >> 2) * 176 + 48 + (kt & 3) * 32, m0, m1, two, 32, full);
        qr_load_w(w + QM_BM * 32, tw3, (kt >> 2) * 176 + 16, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 176, m0, m1, two, 16, full);
    } else if (Q == DT_Q6_K) { /* half h = kt / 2 % 2 of block kt / 4: ql[64h ..], qh[32h ..], all 16 scales */
        const int blk = (kt >> 2) * 208, h = (kt >> 1) & 1;
        qr_load_w(w, tw, blk + 64 * h, m0, m1, two, 64, full);
        qr_load_w(w + QM_BM * 64, tw3, blk + 128 + 32 * h, m0, m1, two, 32, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, blk + 192, m0, m1, two, 16, full);
    } else {
        qr_load_w(w, tw, kt * 64, m0, m1, two, 64, full);
        qr_load_w(w + qr_codes_bytes<Q>(), tw2, (kt >> 2) * 16, m0, m1, two, 16, full); /* starts 16-byte aligned */
    }
}

/* bf16x2 arithmetic (sm_90), round to nearest even */
static __device__ __forceinline__ uint32_t bf2_sub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t bf2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#define QR_BF16_128 0x43004300u /* bf16 128.0 twice: OR a 7-bit q into the mantissa and it reads 128 + q */

/* Q4_K sub-block j's 6-bit scale and min (kernels/dtype.c kquant_scale_min)
 * as the bf16 pair (128 + scale, 128 + min): header bytes gathered into the
 * two halves by PRMTs, masked and OR-ed onto 128.0 by LOP3s (j is a
 * compile-time constant) */
static __device__ __forceinline__ uint32_t q4k_scale_min_bf16x2(uint4 h, int j) {
    if (j < 4) /* scale = sc[j] & 63 (h.y byte j), min = sc[j + 4] & 63 (h.z byte j) */
        return qm_and_or(__byte_perm(h.y, h.z, 0x1100 * (4 + j) + 0x11 * j), 0x003f003fu, QR_BF16_128);
    const int i = j - 4; /* sc[j + 4] = h.w byte i, sc[j - 4] = h.y byte i, sc[j] = h.z byte i */
    const uint32_t b = __byte_perm(h.w, 0, 0x1111 * i), hi = __byte_perm(h.y, h.z, 0x1100 * (4 + i) + 0x11 * i);
    /* scale = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4, min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4 */
    return qm_and_or(hi >> 2, 0x00300030u, qm_and_or(b >> 4, 0x000f0000u, qm_and_or(b, 0xfu, QR_BF16_128)));
}

/* v5's fragments of row `row` (r = 0: g, 1: g + 8): the codes' byte pair
 * (k = 2t, 2t + 1) spread to the two halves by one PRMT, 128 + q made by one
 * LOP3 and q by an exact bf16x2 subtraction; then Q4_K fma(q, s, c) with s =
 * bf16(scale bf16(d)), c = bf16(min bf16(-dmin)) (the scale and min of both
 * sub-blocks made the same way, as pairs), Q8_0 q bf16(d); rounded once
 * each (2 and 2.5 instructions a value instead of v4's 3.5; values within
 * ~2^-8 of v4's, which are quant_dequant_bf16's). A Q8_0 code is L - 128 s
 * (L its low 7 bits, s its sign bit): (128 + L) - (128 + 128 s), exact. */
#define QR_BF16_160 0x43204320u /* bf16 160.0 twice: (128 + q) - 160 = q - 32, a Q6_K code */

/* Q6_K (v5 only): stage kt is half h = kt / 2 % 2 of its block, nibble n =
 * kt % 2 of ql[64h ..] (k16 step p: bytes 16p + 8e + 2t, +1, in the 64-byte
 * swizzle), the qh bits 2(2n + p / 2), + 1 of qh[32h + 16 (p % 2) ..] (32-byte
 * swizzle), scale sc[8h + 4n + p]; 128 + q made by two LOP3s, q - 32 by an
 * exact bf16x2 subtraction, times s = bf16(sc bf16(d)) (sc exact in bf16 as
 * Q8_0's codes are), rounded once. */
static __device__ __forceinline__ void q6k_frags_bf16x2(uint32_t (&a)[4][4], const uint8_t *w, int row, int r, int t,
                                                        int kt, float d) {
    const int n = kt & 1, h = (kt >> 1) & 1;
    const uint32_t sw = *(const uint32_t *)(w + qr_codes_bytes<DT_Q6_K>() + row * 16 + 8 * h + 4 * n);
    const uint32_t d2 = bf16_pair(d, d);
    uint32_t s2[2]; /* steps (0, 1), (2, 3): (sc, sc') * bf16(d) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t v = __byte_perm(sw, 0, i ? 0x4342 : 0x4140);
        s2[i] = bf2_mul(bf2_sub(qm_and_or(v, 0x007f007fu, QR_BF16_128), qm_and_or(v, 0x00800080u, QR_BF16_128)), d2);
    }
    const uint8_t *ql = w + row * 64, *qh = w + QM_BM * 64 + row * 32;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const uint32_t s = __byte_perm(s2[p >> 1], 0, p & 1 ? 0x3232 : 0x1010);
        const int k = 2 * n + (p >> 1); /* qh bits 2k, 2k + 1 */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            uint32_t v = __byte_perm(*(const uint16_t *)(ql + ((p ^ ((row >> 1) & 3)) << 4) + 8 * e + 2 * t), 0, 0x4140);
            uint32_t hv = __byte_perm(*(const uint16_t *)(qh + (((p & 1) ^ ((row >> 2) & 1)) << 4) + 8 * e + 2 * t), 0, 0x4140);
            if (n) v >>= 4;
            hv = k < 2 ? hv << (4 - 2 * k) : hv >> (2 * k - 4);
            const uint32_t code = qm_and_or(v, 0x000f000fu, qm_and_or(hv, 0x00300030u, QR_BF16_128));
            a[p][r + 2 * e] = bf2_mul(bf2_sub(code, QR_BF16_160), s);
        }
    }
}

template <int Q>
static __device__ __forceinline__ void qr_frags_bf16x2(uint32_t (&a)[4][4], const uint8_t *w, int row, int r, int t,
                                                       int kt) {
    if (Q == DT_Q4_K || Q == DT_Q5_K) {
        const uint8_t *rw = w + row * 32;
        const uint4 h = *(const uint4 *)(w + qr_codes_bytes<Q>() + row * 16);
        const float2 d_dmin = __half22float2(*(const __half2 *)&h.x);
        const uint32_t dm = bf16_pair(d_dmin.x, -d_dmin.y);
        uint32_t s2[2], c2[2];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const uint32_t sm = bf2_mul(bf2_sub(q4k_scale_min_bf16x2(h, 2 * (kt & 3) + n), QR_BF16_128), dm);
            s2[n] = __byte_perm(sm, 0, 0x1010), c2[n] = __byte_perm(sm, 0, 0x3232);
        }
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t v = __byte_perm(*(const uint16_t *)(rw + 16 * p + 8 * e + 2 * t), 0, 0x4140), vh = v >> 4;
                uint32_t lo = QR_BF16_128, hi = QR_BF16_128;
                if (Q == DT_Q5_K) { /* the fifth bits: qh[l] bits 2j (low nibbles), 2j + 1 (high), j = kt % 4 */
                    const int j = kt & 3, off = ((p ^ ((row >> 2) & 1)) << 4) + 8 * e + 2 * t; /* 32-byte swizzle */
                    const uint32_t b = __byte_perm(*(const uint16_t *)(w + QM_BM * 32 + row * 32 + off), 0, 0x4140);
                    lo = qm_and_or(2 * j <= 4 ? b << (4 - 2 * j) : b >> (2 * j - 4), 0x00100010u, lo);
                    hi = qm_and_or(2 * j + 1 <= 4 ? b << (3 - 2 * j) : b >> (2 * j - 3), 0x00100010u, hi);
                }
                a[p][r + 2 * e] = bf2_fma(bf2_sub(qm_and_or(v, 0x000f000fu, lo), QR_BF16_128), s2[0], c2[0]);
                a[p + 2][r + 2 * e] = bf2_fma(bf2_sub(qm_and_or(vh, 0x000f000fu, hi), QR_BF16_128), s2[1], c2[1]);
            }
    } else {
        const uint8_t *rw = w + row * 64;
        const uint32_t dd = *(const uint32_t *)(w + qr_codes_bytes<Q>() + row * 16 + 4 * (kt & 3));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float d = qm_half(k & 2 ? dd >> 16 : dd & 0xffff);
            const uint32_t d2 = bf16_pair(d, d);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t u = *(const uint16_t *)(rw + ((k ^ ((row >> 1) & 3)) << 4) + 8 * e + 2 * t);
                const uint32_t v = __byte_perm(u, 0, 0x4140);
                a[k][r + 2 * e] = bf2_mul(bf2_sub(qm_and_or(v, 0x007f007fu, QR_BF16_128), qm_and_or(v, 0x00800080u, QR_BF16_128)), d2);
            }
        }
    }
}

/* This thread's A fragments of the stage, a[k] for k16 step k: registers 0, 1
 * rows g, g + 8 at k = 2t, 2t + 1; 2, 3 the same rows at 2t + 8, 2t + 9
 * (wgmma's A layout, each warp 16 rows). w: the stage's raw bytes, row0:
 * the block row of g. Q4_K: the stage's 64 values are the low nibbles of its
 * 32 code bytes (sub-block 2 (kt % 4)), then the high ones (+ 1), so bytes
 * 16p + 8e + 2t, +1 give step p's (low) and p + 2's (high) pair e. Q8_0:
 * step k is chunk k of the row (block k / 2), pair e its bytes 8e + 2t, +1. */
template <int Q, bool PK>
static __device__ __forceinline__ void qr_frags(uint32_t (&a)[4][4], const uint8_t *w, int row0, int t, int kt,
                                                const float (&d6)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if constexpr (Q == DT_Q6_K) {
            q6k_frags_bf16x2(a, w, row, r, t, kt, d6[r]);
        } else if (PK) {
            qr_frags_bf16x2<Q>(a, w, row, r, t, kt);
        } else if (Q == DT_Q4_K) {
            const uint8_t *rw = w + row * 32;
            const uint4 h = *(const uint4 *)(w + qr_codes_bytes<Q>() + row * 16);
            float dl[2], nml[2], m_lo[2], m_hi[2];
#pragma unroll
            for (int n = 0; n < 2; n++) { /* nibble n: code q at bit 4n (byte 0) and 8 + 4n (byte 1) */
                q4k_scale(h, 2 * (kt & 3) + n, &dl[n], &nml[n]);
                m_lo[n] = __fmul_rn(dl[n], n ? 0.0625f : 1.0f), m_hi[n] = __fmul_rn(dl[n], n ? 1.0f / 4096 : 1.0f / 256);
            }
#pragma unroll
            for (int p = 0; p < 2; p++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t u = *(const uint16_t *)(rw + 16 * p + 8 * e + 2 * t);
#pragma unroll
                    for (int n = 0; n < 2; n++) {
                        const float lo = __fsub_rn(__uint_as_float(qm_and_or(u, 0xfu << 4 * n, 0x4b000000u)), QM_MAGIC);
                        const float hi = __fsub_rn(__uint_as_float(qm_and_or(u, 0xf00u << 4 * n, 0x4b000000u)), QM_MAGIC);
                        a[p + 2 * n][r + 2 * e] = bf16_pair(__fmaf_rn(m_lo[n], lo, nml[n]), __fmaf_rn(m_hi[n], hi, nml[n]));
                    }
                }
        } else {
            const uint8_t *rw = w + row * 64;
            const uint32_t dd = *(const uint32_t *)(w + qr_codes_bytes<Q>() + row * 16 + 4 * (kt & 3));
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float d = qm_half(k & 2 ? dd >> 16 : dd & 0xffff), d_hi = __fmul_rn(d, 1.0f / 256);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const uint32_t u = *(const uint16_t *)(rw + ((k ^ ((row >> 1) & 3)) << 4) + 8 * e + 2 * t);
                    const float lo = __fsub_rn(__uint_as_float(qm_flip_or(u, 0xffu, 0x4b000080u)), QM_MAGIC + 128.0f);
                    const float hi = __fsub_rn(__uint_as_float(qm_flip_or(u, 0xff00u, 0x4b008000u)), QM_MAGIC + 32768.0f);
                    a[k][r + 2 * e] = bf16_pair(__fmul_rn(d, lo), __fmul_rn(d_hi, hi));
                }
            }
        }
    }
}

/* keeps A registers live (unchanged) up to here */
static __device__ __forceinline__ void qr_hold(uint32_t (&a)[4][4]) {
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" ::"r"(a[k][i]) : "memory");
}

/* Q6_K's d of rows row, row + 8 (of the block's) in block b, as floats */
static __device__ __forceinline__ void q6k_d(float (&d)[2], const unsigned short *dq, int nb, int row, int b) {
#pragma unroll
    for (int r = 0; r < 2; r++) d[r] = qm_half(__ldg(dq + (int64_t)(row + 8 * r) * nb + b));
}

/* Thread j of 256: wait for stage kt's bytes, multiply, and release kt - 1's
 * buffer once the wait for its products is over; thread 0 then refills it
 * with stage kt - 1 + S when all 256 have (S - 1 stages ahead). Stages kt0
 * .. kt1 - 1 (the block's split of K). A turn of the loop is 4 stages (kt0
 * and kt1 are multiples of 4: cols % 256 == 0) in buffers
 * q .. q + 3, q = 4 (turn % (S / 4)): kt % 4 and the offsets of every
 * descriptor and barrier from q's are constants. */
template <int Q, int BN, bool PK, int MB>
static __device__ __forceinline__ void qr_multiply(float (&acc)[qr_halves<BN>()][qr_wn<BN>() / 2], uint8_t *smem,
                                                   const CUtensorMap *tx, const CUtensorMap *tw, const CUtensorMap *tw2,
                                                   const CUtensorMap *tw3, const unsigned short *dq, int nb, int n0,
                                                   int xrows, int m0, int m1, bool two, int kt0, int kt1) {
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>(), NH = qr_halves<BN>(), WN = qr_wn<BN>();
    const int j = threadIdx.x, wg = j >> 7, warp = (j >> 5) & 3, lane = j & 31;
    const int row0 = 64 * wg + 16 * warp + (lane >> 2), t = lane & 3;
    const int wrow = (wg ? m1 - 64 : m0) + row0; /* the thread's row of W (Q6_K's d) */
    const uint32_t bars = smem_u32(smem) + S * SB;
    const uint32_t d0 = (uint32_t)qm_desc(smem_u32(smem));
    /* a[kt % 2]: wgmma reads its A registers after issue, until its group is
     * waited for, and ptxas does not know it (a Q8_0 loop that reused one set
     * failed test_quant_gemm): two sets, each held live until the wait that
     * covers its stage. */
    uint32_t a[2][4][4];
    constexpr int G = S / 4; /* turns a buffer's use count advances by one */
    static_assert(S % 4 == 0, "buffers in fours");
    float d6[2] = {0.f, 0.f}, d6_next[2] = {0.f, 0.f}; /* Q6_K: the turn's block's d, the next turn's (a turn ahead) */
    if (Q == DT_Q6_K) q6k_d(d6, dq, nb, wrow, kt0 >> 2);
    for (int k0 = kt0, turn = 0; k0 < kt1; k0 += 4, turn++) {
        const int q = 4 * (turn % G), n = turn / G;                 /* buffers q + u, their use count */
        const int qp = q ? q - 4 : S - 4, np = q ? n : n - 1;        /* the turn before's */
        if (Q == DT_Q6_K && k0 + 4 < kt1) q6k_d(d6_next, dq, nb, wrow, (k0 >> 2) + 1);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int kt = k0 + u;
            mbar_wait(bars + 8 * (q + u), n & 1);
            qr_frags<Q, PK>(a[u & 1], smem + (q + u) * SB + BN * 128, row0, t, u, d6);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int h = 0; h < NH; h++)
                    wg_mma_rs(acc[h], a[u & 1][k], d0 + (((q + u) * SB + h * WN * 128 + 32 * k) >> 4), (kt - kt0) | k);
            wg_commit();
            wg_wait<1>();
            qr_hold(a[(u + 1) & 1]); /* stage kt - 1's registers: free only from here */
            if (kt > kt0) {
                const int prev = u ? q + u - 1 : qp + 3, pn = u ? n : np; /* kt - 1's buffer and use count */
                mbar_arrive(bars + 8 * (S + prev));
                if (j == 0 && kt - 1 + S < kt1) {
                    mbar_wait(bars + 8 * (S + prev), pn & 1);
                    qr_load<Q, BN, MB>(smem, tx, tw, tw2, tw3, n0, xrows, m0, m1, two, kt - 1 + S, prev);
                }
            }
        }
        d6[0] = d6_next[0], d6[1] = d6_next[1];
    }
    wg_wait<0>();
    qr_hold(a[0]);
    qr_hold(a[1]);
#pragma unroll
    for (int h = 0; h < NH; h++) wg_hold(acc[h]);
}

/* A warpgroup's accumulators to y: acc[h][4c + e] is W row m0 + 16 warp + g
 * (e < 2) or + 8, token n0 + 2 NA h + 8c + 2t + e % 2 (NA accumulators a
 * wgmma: n = 2 NA tokens); only tokens in [lo, T) stored */
template <int NH, int NA>
static __device__ __forceinline__ void qm_store(void *y, bool y_f32, const float (&acc)[NH][NA], int T, int M, int n0,
                                                int lo, int m0) {
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mA = m0 + 16 * warp + g;
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int c = 0; c < NA / 4; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int n = n0 + 2 * NA * h + 8 * c + 2 * t + (e & 1), m = mA + (e >> 1) * 8;
                if (n < lo || n >= T) continue;
                size_t o = (size_t)n * M + m;
                if (y_f32) ((float *)y)[o] = acc[h][4 * c + e];
                else ((__nv_bfloat16 *)y)[o] = __float2bfloat16_rn(acc[h][4 * c + e]);
            }
}

/* v4 / v5's bf16 y: the block's [2 NA NH tokens][128 rows] tile through
 * shared memory (the stage buffers, free once every thread is past the
 * loop), so y's rows go out in 16-byte stores (qm_store's 2-byte ones
 * scatter over half-used sectors). stmatrix .trans takes each 8 x 8
 * accumulator block (rows g, tokens 2t, 2t + 1) and stores it as 8 token rows
 * of 8 W rows; token rows are QR_Y_STRIDE bytes apart (16 of padding: the 8
 * rows of one stmatrix phase fall on distinct banks). */
#define QR_Y_STRIDE (128 * 2 + 16)
template <int NH, int NA>
static __device__ __forceinline__ void qr_stage_y(const float (&acc)[NH][NA], uint8_t *smem) {
    const int j = threadIdx.x, lane = j & 31, i = lane >> 3, r = lane & 7;
    const int m = 64 * (j >> 7) + 16 * ((j >> 5) & 3) + 8 * (i & 1); /* lane's matrix: W rows m .. m + 7 */
    static_assert(NA % 8 == 0, "stmatrix x4 takes two 8-token groups");
    __syncthreads(); /* every warpgroup's wgmma done with the stages */
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int c = 0; c < NA / 4; c += 2) {
            const int tok = 2 * NA * h + 8 * (c + (i >> 1)) + r;
            const uint32_t addr = smem_u32(smem + tok * QR_Y_STRIDE + 2 * m);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                         "r"(bf16_pair(acc[h][4 * c], acc[h][4 * c + 1])), "r"(bf16_pair(acc[h][4 * c + 2], acc[h][4 * c + 3])),
                         "r"(bf16_pair(acc[h][4 * c + 4], acc[h][4 * c + 5])), "r"(bf16_pair(acc[h][4 * c + 6], acc[h][4 * c + 7]))
                         : "memory");
        }
    __syncthreads();
}

template <int NH, int NA>
static __device__ __forceinline__ void qr_store_bf16(__nv_bfloat16 *y, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                     int M, int n0, int lo, int m0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 4
    for (int k = threadIdx.x; k < 2 * NA * NH * 16; k += QR_THREADS) { /* 16 chunks of 16 bytes a token row */
        const int tok = k >> 4, ch = k & 15;
        if (n0 + tok >= lo && n0 + tok < T)
            *(uint4 *)(y + (size_t)(n0 + tok) * M + m0 + 8 * ch) = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
    }
}

/* y's rows in parts (Wq|Wk|Wv: q, k, v, each with its bias; the split kernel's values): a 16-byte chunk is
 * 8 rows of one part (the parts' ends are multiples of 8, quant_gemm_epi checks) */
template <int NH, int NA>
static __device__ __forceinline__ void qr_store_parts(const QrEpi &e, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                      int n0, int lo, int m0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 2
    for (int k = threadIdx.x; k < 2 * NA * NH * 16; k += QR_THREADS) {
        const int tok = k >> 4, ch = k & 15, row = m0 + 8 * ch;
        if (n0 + tok < lo || n0 + tok >= T) continue;
        const GemvPart<int> p = gemv_part(e.y, e.bias, e.end, row);
        uint4 v = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
        if (p.bias) {
            __nv_bfloat16 *ve = (__nv_bfloat16 *)&v;
#pragma unroll
            for (int c = 0; c < 8; c++) ve[c] = __float2bfloat16(__bfloat162float(ve[c]) + p.bias[p.r + c]);
        }
        *(uint4 *)((__nv_bfloat16 *)p.y + (size_t)(n0 + tok) * p.n + p.r) = v;
    }
}

/* A gated pair's tile (warpgroup 0: gate rows f0 .., 1: up rows glu_f + f0 ..): out[t][f0 ..] =
 * act(gate + bg, up + bu) of the bf16 products, as the GLU kernel computes it */
template <int NH, int NA>
static __device__ __forceinline__ void qr_store_glu(const QrEpi &e, const float (&acc)[NH][NA], uint8_t *smem, int T,
                                                    int n0, int lo, int f0) {
    qr_stage_y<NH, NA>(acc, smem);
#pragma unroll 2
    for (int k = threadIdx.x; k < 2 * NA * NH * 8; k += QR_THREADS) { /* 8 chunks of 8 gate and 8 up values a token */
        const int tok = k >> 3, ch = k & 7, f = f0 + 8 * ch;
        if (n0 + tok < lo || n0 + tok >= T) continue;
        const uint4 gv = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 16 * ch);
        const uint4 uv = *(const uint4 *)(smem + tok * QR_Y_STRIDE + 128 + 16 * ch);
        const __nv_bfloat16 *ge = (const __nv_bfloat16 *)&gv, *ue = (const __nv_bfloat16 *)&uv;
        uint4 o;
        __nv_bfloat16 *oe = (__nv_bfloat16 *)&o;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            float g = __bfloat162float(ge[c]), u = __bfloat162float(ue[c]);
            if (e.bg) g += e.bg[f + c];
            if (e.bu) u += e.bu[f + c];
            oe[c] = __float2bfloat16(act_glu(g, u, (Activation)e.act, e.limit));
        }
        *(uint4 *)((__nv_bfloat16 *)e.y[0] + (size_t)(n0 + tok) * e.glu_f + f) = o;
    }
}
#endif

/* Split K (`split` of `splits`; `tile`: the tile among the split ones): the block's fp32
 * accumulators to its place in `part` (at (tile splits + split) 256 PF float4s,
 * PF = NH NA / 4 a thread, thread j's float4 i at i 256 + j: coalesced), then
 * the last split of the tile to count itself in (a counter per tile, back to
 * 0 after it) adds every split's partial in split order: the same sums
 * whichever arrives last (tokens past T too: skipping them cost the loop 70
 * registers). Returns whether this block holds the tile's sums. */
template <int NH, int NA>
static __device__ bool qr_split_reduce(float (&acc)[NH][NA], float *part, unsigned *count, int tile, int split,
                                       int splits) {
    constexpr int PF = NH * NA / 4, C = NA / 4;
    const int j = threadIdx.x;
    float4 *mine = (float4 *)part + ((size_t)tile * splits + split) * (PF * QR_THREADS);
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < C; i++)
            __stcg(mine + (C * h + i) * QR_THREADS + j,
                       make_float4(acc[h][4 * i], acc[h][4 * i + 1], acc[h][4 * i + 2], acc[h][4 * i + 3]));
    __threadfence();
    /* every thread's partial stored and fenced before thread 0 counts the block in: counting inside the
     * __syncthreads_or (as before) let it do so before the other threads had stored, so a last split
     * could read stale partials (the tail-split branch's 16-token tiles hit it; kernels/NOTES.md) */
    __syncthreads();
    const bool last = j == 0 && atomicAdd(count + tile, 1u) == (unsigned)splits - 1;
    if (!__syncthreads_or(last)) return false;
    __threadfence(); /* the other splits' partials, visible once their counts are */
    const float4 *all = (const float4 *)part + (size_t)tile * splits * (PF * QR_THREADS);
    /* a split's loads issued together, then added in split order: about one
     * L2 round trip a split, not one a float4 */
#pragma unroll
    for (int h = 0; h < NH; h++)
        for (int z = 0; z < splits; z++) {
            float4 w[C];
#pragma unroll
            for (int i = 0; i < C; i++)
                w[i] = __ldcg(all + (size_t)z * (PF * QR_THREADS) + (C * h + i) * QR_THREADS + j);
#pragma unroll
            for (int i = 0; i < C; i++) {
                float *a = &acc[h][4 * i];
                if (z == 0) a[0] = w[i].x, a[1] = w[i].y, a[2] = w[i].z, a[3] = w[i].w;
                else a[0] += w[i].x, a[1] += w[i].y, a[2] += w[i].z, a[3] += w[i].w;
            }
        }
    if (j == 0) count[tile] = 0;
    return true;
}

/* ---- the kernel ---- */

template <int Q, int NH>
__global__ void __launch_bounds__(QM_THREADS, 1)
kernel_quant_gemm(void *y, bool y_f32, const __nv_bfloat16 *x, const uint8_t *qs, const uint8_t *sc, int T, int M,
                  int K) {
#if QM_WGMMA
    extern __shared__ uint8_t qm_smem_raw[];
    uint8_t *smem = qm_smem_raw + ((1024 - (smem_u32(qm_smem_raw) & 1023)) & 1023);
    const int n0 = blockIdx.x * 128 * NH, m0 = blockIdx.y * QM_BM, KT = K / 64;
    const int wg = threadIdx.x / 128 - 1; /* < 0: the maker */
    if (wg < 0) {
        qm_make<Q, NH>(smem, qs, sc, K, m0, KT);
        return;
    }
    float acc[NH][64]; /* written first by the wgmma of kt = 0, j = 0 (add = 0) */
    qm_multiply<NH>(acc, smem, x, T, K, n0, wg, KT);
    qm_store<NH, 64>(y, y_f32, acc, T, M, n0, n0, m0 + 64 * wg);
#endif
}

template <int Q, int BN, bool PK, int MB>
__global__ void __launch_bounds__(QR_THREADS, MB)
kernel_quant_gemm_rs(void *y, bool y_f32, const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                     const __grid_constant__ CUtensorMap tw2, const __grid_constant__ CUtensorMap tw3,
                     const unsigned short *dq, int T, int M, int K, float *part, unsigned *count, int n_whole,
                     int z, const QrEpi epi) {
#if QM_WGMMA
    constexpr int S = qr_stages<Q, BN, MB>(), SB = qr_stage_bytes<Q, BN>(), NH = qr_halves<BN>(), NA = qr_wn<BN>() / 2;
    extern __shared__ uint8_t qm_smem_raw[];
    uint8_t *smem = qm_smem_raw + ((1024 - (smem_u32(qm_smem_raw) & 1023)) & 1023);
    /* blocks [0, n_whole): tiles whole; then z blocks a tile, each a split of K (QrSplit) */
    const int b = blockIdx.x, whole = b < n_whole, gx = (T + BN - 1) / BN;
    const int tile = whole ? b : n_whole + (b - n_whole) / z, split = whole ? 0 : (b - n_whole) % z, splits = whole ? 1 : z;
    const int n0 = tile % gx * BN, turns = K / 256; /* turns of 4 stages */
    const bool two = epi.glu_f > 0; /* a gated pair: 64 gate rows from m0, the 64 up rows from m1 */
    const int m0 = two ? tile / gx * 64 : tile / gx * QM_BM, m1 = two ? epi.glu_f + m0 : m0 + 64;
    /* x's box: the last token tile's ends at T where T >= BN, over tokens of the tile before it (computed
     * again, not stored): a box past T is filled out of bounds by the TMA unit, and that is slow (gate+up
     * at T = 257 in 256-token tiles 304 us, with the rows past T in bounds 176: kernels/NOTES.md) */
    const int nx = n0 + BN > T && T >= BN ? T - BN : n0, xrows = qr_x_rows<BN>(T);
    const int kt0 = 4 * (split * turns / splits), kt1 = 4 * ((split + 1) * turns / splits);
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) {
            mbar_init(smem_u32(smem) + S * SB + 8 * i, 1);         /* full: thread 0's expect_tx */
            mbar_init(smem_u32(smem) + S * SB + 8 * (S + i), 256); /* empty: every thread */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int kt = kt0; kt < kt0 + S && kt < kt1; kt++) qr_load<Q, BN, MB>(smem, &tx, &tw, &tw2, &tw3, nx, xrows, m0, m1, two, kt, kt - kt0);
    }
    __syncthreads();
    float acc[NH][NA]; /* written first by the wgmma of kt = kt0, k = 0 (add = 0) */
    qr_multiply<Q, BN, PK, MB>(acc, smem, &tx, &tw, &tw2, &tw3, dq, K / 256, nx, xrows, m0, m1, two, kt0, kt1);
    if (splits > 1 && !qr_split_reduce<NH, NA>(acc, part, count, tile - n_whole, split, splits)) return;
    static_assert(BN * QR_Y_STRIDE <= S * SB, "y's tile in the stage buffers");
    if (two) qr_store_glu<NH, NA>(epi, acc, smem, T, nx, n0, m0);
    else if (epi.parts) qr_store_parts<NH, NA>(epi, acc, smem, T, nx, n0, m0);
    else if (y_f32 || (uintptr_t)y % 16) qm_store<NH, NA>(y, y_f32, acc, T, M, nx, n0, m0 + 64 * (threadIdx.x >> 7));
    else qr_store_bf16<NH, NA>((__nv_bfloat16 *)y, acc, smem, T, M, nx, n0, m0);
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

/* v4 / v5 load W by TMA: a Q8_0 scale plane's rows (cols / 16 bytes) must be 16-byte multiples */
bool quant_gemm_tma_takes(DType t, int64_t cols) { return t != DT_Q8_0 || cols % 256 == 0; }

bool quant_gemm_supported(DType t, int64_t rows, int64_t cols) {
    if (t != DT_Q4_K && t != DT_Q8_0 && t != DT_Q5_K && t != DT_Q6_K) return false;
    return rows > 0 && cols > 0 && rows % QM_BM == 0 && rows <= 65535LL * QM_BM && cols % (t == DT_Q8_0 ? 64 : 256) == 0 &&
           cols <= (1 << 30);
}

bool quant_gemm_version_takes(DType t, int ver) {
    return ver == 0 || ver == 5 || ((t == DT_Q4_K || t == DT_Q8_0) && ver >= 3 && ver <= 4);
}

template <int Q, int NH>
static int qm_launch_v3(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, cudaStream_t s, Err *err) {
    const int smem = qm_smem_bytes<NH>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemm<Q, NH>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err);
    dim3 grid((unsigned)((T + 128 * NH - 1) / (128 * NH)), (unsigned)(W->rows / QM_BM));
    kernel_quant_gemm<Q, NH><<<grid, QM_THREADS, smem, s>>>(y, y_f32, (const __nv_bfloat16 *)x, (const uint8_t *)W->qs,
                                                            (const uint8_t *)W->sc, T, (int)W->rows, (int)W->cols);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* A 2D tensor map: dims {inner, outer} of dt, rows `stride` bytes apart, box {bi, bo}. */
static int qr_map(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, CUtensorMapDataType dt, const void *base,
                  uint64_t inner, uint64_t outer, uint64_t stride, uint32_t bi, uint32_t bo, CUtensorMapSwizzle sw,
                  const char *what, Err *err) {
    cuuint64_t dims[2] = {inner, outer}, strides[1] = {stride};
    cuuint32_t box[2] = {bi, bo}, es[2] = {1, 1};
    CUresult r = enc(m, dt, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return err_set(err, "quant_gemm: tensor map of %s: CUresult %d", what, (int)r);
    return 0;
}

/* A launch of v4 / v5: the first n_whole tiles whole, every later one in
 * `splits` splits of K; their partials and tile counters (split K only) */
typedef struct {
    int splits;
    int64_t n_whole;
    float *part;
    unsigned *count;
    int mb; /* blocks an SM: 2 for quant_gemm's pick below, else 1 */
} QrSplit;

template <int Q, int BN, bool PK, int MB>
static int qm_launch_v4(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QrSplit *sp,
                        const QrEpi *epi, cudaStream_t s, Err *err) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q), err);
    if (!fn || q != cudaDriverEntryPointSuccess) return err_set(err, "quant_gemm: the driver has no cuTensorMapEncodeTiled");
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    const uint64_t K = (uint64_t)W->cols, rows = (uint64_t)W->rows, nb = K / quant_block_elems(Q);
    const uint32_t bm = epi->glu_f ? 64 : QM_BM; /* a gated pair's W rows come in two boxes of 64 */
    CUtensorMap tx, tw, tw2, tw3;
    /* a token tile shorter than BN (T < BN): a box of T rows, not one past the end of x (slow: kernel_quant_gemm_rs) */
    if (qr_map(enc, &tx, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, K, (uint64_t)T, K * 2, 64, (uint32_t)qr_x_rows<BN>(T),
               CU_TENSOR_MAP_SWIZZLE_128B, "x", err))
        return -1;
    if (Q == DT_Q5_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W codes", err) ||
            qr_map(enc, &tw3, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_32B, "W qh", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 176, rows, nb * 176, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W headers", err))
            return -1;
    } else if (Q == DT_Q6_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 64, bm,
                   CU_TENSOR_MAP_SWIZZLE_64B, "W ql", err) ||
            qr_map(enc, &tw3, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_32B, "W qh", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 208, rows, nb * 208, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W scales", err))
            return -1;
    } else if (Q == DT_Q4_K) {
        if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 144, rows, nb * 144, 32, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W codes", err) ||
            qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 144, rows, nb * 144, 16, bm,
                   CU_TENSOR_MAP_SWIZZLE_NONE, "W headers", err))
            return -1;
    } else if (qr_map(enc, &tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->qs, nb * 32, rows, nb * 32, 64, bm,
                      CU_TENSOR_MAP_SWIZZLE_64B, "W codes", err) ||
               qr_map(enc, &tw2, CU_TENSOR_MAP_DATA_TYPE_UINT8, W->sc, nb * 2, rows, nb * 2, 16, bm,
                      CU_TENSOR_MAP_SWIZZLE_NONE, "W scales", err))
        return -1;
    if (Q != DT_Q5_K && Q != DT_Q6_K) tw3 = tw2; /* unused */
    const int smem = qr_smem_bytes<Q, BN, MB>();
    CUDA_CHECK(cudaFuncSetAttribute(kernel_quant_gemm_rs<Q, BN, PK, MB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err);
    const int64_t tiles = (int64_t)((T + BN - 1) / BN) * (W->rows / QM_BM);
    const int64_t blocks = sp->n_whole + (tiles - sp->n_whole) * sp->splits;
    kernel_quant_gemm_rs<Q, BN, PK, MB><<<(unsigned)blocks, QR_THREADS, smem, s>>>(
        y, y_f32, tx, tw, tw2, tw3, (const unsigned short *)W->sc, T, (int)W->rows, (int)W->cols, sp->part, sp->count,
        (int)sp->n_whole, sp->splits, *epi);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

/* v3 takes 128 or 256 tokens a block, v4 / v5 16 to 256 */
template <int Q, int BN>
static int qm_launch(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int ver, const QrSplit *sp,
                     const QrEpi *epi, cudaStream_t s, Err *err) {
    if constexpr (Q == DT_Q5_K || Q == DT_Q6_K) { /* v5 only (quant_gemm_variant checks) */
        return qm_launch_v4<Q, BN, true, 1>(W, x, T, y, y_f32, sp, epi, s, err);
    } else {
        if (ver == 3) {
            if constexpr (BN >= 128) return qm_launch_v3<Q, BN / 128>(W, x, T, y, y_f32, s, err);
            return err_set(err, "quant_gemm: version 3 takes 128 or 256 tokens a block, not %d", BN);
        }
        if constexpr (BN == 64 || BN == 128)
            if (sp->mb == 2)
                return ver == 4 ? qm_launch_v4<Q, BN, false, 2>(W, x, T, y, y_f32, sp, epi, s, err)
                                : qm_launch_v4<Q, BN, true, 2>(W, x, T, y, y_f32, sp, epi, s, err);
        return ver == 4 ? qm_launch_v4<Q, BN, false, 1>(W, x, T, y, y_f32, sp, epi, s, err)
                        : qm_launch_v4<Q, BN, true, 1>(W, x, T, y, y_f32, sp, epi, s, err);
    }
}

template <int Q>
static int qm_launch_bn(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int ver,
                        const QrSplit *sp, const QrEpi *epi, cudaStream_t s, Err *err) {
    switch (bn) {
    case 16: return qm_launch<Q, 16>(W, x, T, y, y_f32, ver, sp, epi, s, err);
    case 32: return qm_launch<Q, 32>(W, x, T, y, y_f32, ver, sp, epi, s, err);
    case 64: return qm_launch<Q, 64>(W, x, T, y, y_f32, ver, sp, epi, s, err);
    case 128: return qm_launch<Q, 128>(W, x, T, y, y_f32, ver, sp, epi, s, err);
    default: return qm_launch<Q, 256>(W, x, T, y, y_f32, ver, sp, epi, s, err);
    }
}

static int qm_sm_count(Err *err) {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    return sms;
}

/* tokens per block: up to 128 tokens the least of 16, 32, 64, 128 that
 * holds them (v4 / v5: a W tile is dequantized once whatever the block's
 * tokens, and wider blocks only add multiplications of padding); above, 256
 * from about two thirds of a tile per SM (measured at 512 tokens: qkv's 96
 * tiles of 256 beat 192 of 128, 306 vs 207 TFLOP/s), and 256 where K can be
 * split (v4 / v5 with a work space) into at least two blocks a tile and 256-token
 * tiles hold no more padding than 128-token ones: a tile of 256 dequantizes W once
 * for twice the tokens (H200, Q4_K, us, 128 vs 256 split sms / tiles ways: down
 * 4096 x 14336 at 192 / 256 / 512 tokens 64.8 / 64.5 / 117.0 vs 51.5 / 51.6 / 86.4;
 * o 4096 x 4096 24.2 / 24.1 / 37.3 vs 25.6 / 24.1 / 33.7; at 320 tokens, 384 slots
 * against 512, o 36.4 vs 46.2); with K of 8192 or more also at up to 4/3 the slots
 * (down at 384 tokens 116.8 vs 99.6, at 320 a tie). Else 128. */
static int qm_pick_bn(const QuantMatrix *W, int T, int sms, int ver, bool can_split) {
    if (T <= 128) return ver == 3 || T > 64 ? 128 : T > 32 ? 64 : T > 16 ? 32 : 16;
    int64_t tiles256 = (int64_t)((T + 255) / 256) * (W->rows / QM_BM);
    if (3 * tiles256 >= 2 * sms) return 256;
    const int slots256 = (T + 255) / 256 * 256, slots128 = (T + 127) / 128 * 128;
    const bool padding_ok = slots256 == slots128 || (W->cols >= 8192 && 3 * slots256 <= 4 * slots128);
    return can_split && ver >= 4 && padding_ok && 2 * tiles256 <= sms ? 256 : 128;
}

/* The work space: a counter for each of up to 4 sms tiles (quant_gemm's own
 * splits take at most sms / 2; asked-for ones are checked), then the
 * partials. A fixed counter region: one sized by each launch's tiles let a
 * larger launch count on the partials a smaller one left. */
static size_t qm_count_bytes(int sms) { return (size_t)(4 * sms * 4 + 255) / 256 * 256; }

/* partials: at most sms split blocks a launch (a wave), of up to 128 x 256 values */
size_t quant_gemm_work_bytes(int sms) { return qm_count_bytes(sms) + (size_t)sms * 128 * 256 * sizeof(float); }

/* Splits of K: as many as fit beside the tiles in one wave of blocks (one a
 * SM), so a GEMM of few tiles (a small batch) still streams W on every SM;
 * at most one a turn of 4 stages, and 16. (A wave of all the blocks an SM
 * holds at once, three of 16 tokens, was no faster: kernels/NOTES.md.) */
static int qm_pick_splits(int64_t tiles, int turns, int sms) {
    int64_t z = sms / tiles;
    return (int)(z < 1 ? 1 : z > 16 ? (turns < 16 ? turns : 16) : z > turns ? turns : z);
}

static int qm_run(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int ver, int splits,
                  const QrEpi *epi, const QuantGemmWork *work, cudaStream_t s, Err *err) {
    if (!quant_gemm_supported(W->type, W->rows, W->cols))
        return err_set(err, "quant_gemm: %s [%lld][%lld] not supported (Q4_K, Q5_K, Q6_K or Q8_0, rows a multiple of 128)",
                       dtype_info(W->type)->name, (long long)W->rows, (long long)W->cols);
    if (!quant_gemm_available()) return err_set(err, "quant_gemm: needs an sm_90a build on a compute-capability 9.0 GPU");
    if (T <= 0) return T == 0 ? 0 : err_set(err, "quant_gemm: T = %d", T);
    if ((uintptr_t)x % 16 || (W->cols * 2) % 16) return err_set(err, "quant_gemm: x must be 16-byte aligned");
    const int sms = qm_sm_count(err);
    if (sms <= 0) return -1;
    const bool tma = quant_gemm_tma_takes(W->type, W->cols);
    if (ver == 0) ver = tma ? 5 : 3;
    if (ver < 3 || ver > 5) return err_set(err, "quant_gemm: version %d (3, 4 or 5)", ver);
    if (!quant_gemm_version_takes(W->type, ver))
        return err_set(err, "quant_gemm: version %d does not take %s (5 only)", ver, dtype_info(W->type)->name);
    if (ver >= 4 && !tma)
        return err_set(err, "quant_gemm: version %d takes Q8_0 with cols a multiple of 256, not %lld", ver,
                       (long long)W->cols);
    if ((epi->parts || epi->glu_f) && ver < 4)
        return err_set(err, "quant_gemm: the parts and GLU epilogues are version 4 and 5's, not %d's", ver);
    if (bn == 0) bn = qm_pick_bn(W, T, sms, ver, work && work->buf);
    if (ver == 3 ? bn != 128 && bn != 256 : bn != 16 && bn != 32 && bn != 64 && bn != 128 && bn != 256)
        return err_set(err, "quant_gemm: tokens per block %d (v3: 128 or 256; v4, v5: 16, 32, 64, 128 or 256)", bn);
    const int64_t tiles = (int64_t)((T + bn - 1) / bn) * (W->rows / QM_BM);
    const int turns = (int)(W->cols / 256);
    /* Split K where a wave of blocks is not full: a GEMM of fewer tiles than SMs (up to 128 tokens a
     * block, or 256 where two splits a tile fit in a wave) splits every tile; one of more tiles splits
     * the last, partial wave's (tiles % sms) so that its blocks fill the SMs (gate+up at 512 tokens: 448 tiles of 256, 3 waves and 52 tiles
     * that left 60% of the SMs idle for a whole tile's time, now 104 blocks of half a tile). At most a
     * wave of split blocks, tiles x splits <= sms: the work space holds their partials. */
    int64_t n_whole = 0;
    if (splits == 0) {
        const bool few = tiles < sms && (bn <= 128 || 2 * tiles <= sms), tail = tiles > sms && tiles % sms;
        splits = work && ver >= 4 && (few || tail) ? qm_pick_splits(few ? tiles : tiles % sms, turns, sms) : 1;
        n_whole = splits > 1 && tail ? tiles - tiles % sms : n_whole;
    }
    if (splits == 1) n_whole = tiles;
    /* Two blocks an SM (4 stages, 128 registers) for 64- and 128-token tiles of Q4_K and Q8_0 where more
     * tiles than SMs go unsplit: 4 warps a scheduler hide the fragment chains that bound one block (ncu:
     * 0.31 issued a cycle, 0.39 of 2 warps eligible). H200, Q4_K, us, 1 vs 2 blocks: gate+up 28672 x 4096
     * at 128 tokens 74.9 vs 64.7, at 512 in 128-token tiles 254 vs 228; with few tiles split over the SMs
     * it lost (o at 128 tokens 17.2 vs 18.5, qkv at 384 52.9 vs 59.4), hence only here. */
    const int mb = (bn == 64 || bn == 128) && ver >= 4 && (W->type == DT_Q4_K || W->type == DT_Q8_0) &&
                           splits == 1 && tiles > sms ? 2 : 1;
    QrSplit sp = {splits, n_whole, NULL, NULL, mb};
    if (splits < 1 || (splits > 1 && n_whole == 0 && (ver < 4 || splits > turns)))
        return err_set(err, "quant_gemm: %d splits of K (v4 / v5, at most cols / 256 = %d)", splits, turns);
    if (splits > 1 && tiles - n_whole > 4 * sms)
        return err_set(err, "quant_gemm: %d splits of %lld tiles (at most %d tiles split)", splits,
                       (long long)(tiles - n_whole), 4 * sms);
    if (splits > 1) {
        size_t need = qm_count_bytes(sms) + (size_t)((tiles - n_whole) * splits) * 128 * bn * sizeof(float);
        if (!work || !work->buf || work->bytes < need)
            return err_set(err, "quant_gemm: %d splits of %lld tiles need %zu bytes of work space, not %zu", splits,
                           (long long)(tiles - n_whole), need, work ? work->bytes : 0);
        sp.count = (unsigned *)work->buf;
        sp.part = (float *)((char *)work->buf + qm_count_bytes(sms));
    }
    if (W->type == DT_Q4_K) return qm_launch_bn<DT_Q4_K>(W, x, T, y, y_f32, bn, ver, &sp, epi, s, err);
    if (W->type == DT_Q5_K) return qm_launch_bn<DT_Q5_K>(W, x, T, y, y_f32, bn, ver, &sp, epi, s, err);
    if (W->type == DT_Q6_K) return qm_launch_bn<DT_Q6_K>(W, x, T, y, y_f32, bn, ver, &sp, epi, s, err);
    return qm_launch_bn<DT_Q8_0>(W, x, T, y, y_f32, bn, ver, &sp, epi, s, err);
}

/* qm_run with tokens per block and splits its own (bn = splits = 0). Where that takes 256-token tiles and
 * the last T % 256 tokens are at most 128, those go in a launch of their own after the 256-token head (64-
 * or 128-token tiles), instead of a whole 256-token tile of padding per row tile: y, the parts and the GLU
 * output continue at token h. */
static int qm_run_auto(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int ver, const QrEpi *epi,
                       const QuantGemmWork *work, cudaStream_t s, Err *err) {
    const int r = T % 256, h = T - r;
    const bool v45 = (ver == 0 || ver >= 4) && quant_gemm_tma_takes(W->type, W->cols);
    int sms = 0;
    if (!v45 || T < 256 || r == 0 || r > 128 || !quant_gemm_supported(W->type, W->rows, W->cols) ||
        (sms = qm_sm_count(err)) <= 0 || qm_pick_bn(W, T, sms, ver ? ver : 5, work && work->buf) != 256)
        return sms < 0 ? -1 : qm_run(W, x, T, y, y_f32, 0, ver, 0, epi, work, s, err);
    if (qm_run(W, x, h, y, y_f32, 0, ver, 0, epi, work, s, err)) return -1;
    QrEpi tail = *epi;
    const int64_t width[3] = {epi->end[0], epi->end[1] - epi->end[0], epi->end[2] - epi->end[1]};
    for (int i = 0; i < 3 && epi->parts; i++) tail.y[i] = (__nv_bfloat16 *)epi->y[i] + (int64_t)h * width[i];
    if (epi->glu_f) tail.y[0] = (__nv_bfloat16 *)epi->y[0] + (int64_t)h * epi->glu_f;
    void *yt = epi->parts || epi->glu_f ? tail.y[0] : (char *)y + (int64_t)h * W->rows * (y_f32 ? 4 : 2);
    return qm_run(W, (const __nv_bfloat16 *)x + (int64_t)h * W->cols, r, yt, y_f32, 0, ver, 0, &tail, work, s, err);
}

int quant_gemm_variant(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, int bn, int ver, int splits,
                       const QuantGemmWork *work, cudaStream_t s, Err *err) {
    const QrEpi none = {};
    if (bn == 0 && splits == 0) return qm_run_auto(W, x, T, y, y_f32, ver, &none, work, s, err);
    return qm_run(W, x, T, y, y_f32, bn, ver, splits, &none, work, s, err);
}

/* The kernel's epilogue from the caller's: checked (16-byte stores of 8 rows of one part, or of a gated
 * pair's 64 rows) */
static int qm_epi_make(const QuantMatrix *W, const QuantGemmEpi *e, QrEpi *q, Err *err) {
    *q = QrEpi{};
    if (e->glu == (e->parts != NULL)) return err_set(err, "quant_gemm_epi: one of parts and glu");
    if (e->glu) {
        if (!e->out || (uintptr_t)e->out % 16 || W->rows % 128)
            return err_set(err, "quant_gemm_epi: glu needs a 16-byte aligned out and rows a multiple of 128, not %lld",
                           (long long)W->rows);
        q->y[0] = e->out, q->glu_f = (int)(W->rows / 2), q->bg = e->bg, q->bu = e->bu, q->act = (int)e->act;
        q->limit = e->limit;
        return 0;
    }
    const GemvOut *o = e->parts;
    int64_t r0 = 0;
    for (int i = 0; i < 3; i++) {
        if (o->end[i] < r0 || o->end[i] % 8 || (uintptr_t)o->y[i] % 16)
            return err_set(err, "quant_gemm_epi: part %d ends at row %lld (a multiple of 8 from the last, y 16-byte "
                                "aligned)", i, (long long)o->end[i]);
        q->y[i] = o->y[i], q->bias[i] = o->bias[i], q->end[i] = (int)o->end[i], r0 = o->end[i];
    }
    if (o->end[2] != W->rows || o->f32 || o->add)
        return err_set(err, "quant_gemm_epi: parts end at row %lld of %lld, bf16, not added", (long long)o->end[2],
                       (long long)W->rows);
    q->parts = 1;
    return 0;
}

bool quant_gemm_epi_takes(const QuantMatrix *W, const QuantGemmEpi *e) {
    Err err = {};
    QrEpi q;
    return quant_gemm_supported(W->type, W->rows, W->cols) && quant_gemm_tma_takes(W->type, W->cols) &&
           qm_epi_make(W, e, &q, &err) == 0;
}

int quant_gemm_epi(const QuantMatrix *W, const void *x, int T, const QuantGemmEpi *e, int bn, int ver, int splits,
                   const QuantGemmWork *work, cudaStream_t s, Err *err) {
    QrEpi q;
    if (qm_epi_make(W, e, &q, err)) return -1;
    if (ver == 0 && !quant_gemm_tma_takes(W->type, W->cols))
        return err_set(err, "quant_gemm_epi: Q8_0 with cols %lld (v3's, which has no epilogue)", (long long)W->cols);
    if (bn == 0 && splits == 0) return qm_run_auto(W, x, T, q.y[0], false, ver, &q, work, s, err);
    return qm_run(W, x, T, q.y[0], false, bn, ver, splits, &q, work, s, err);
}

int quant_gemm(const QuantMatrix *W, const void *x, int T, void *y, bool y_f32, const QuantGemmWork *work,
               cudaStream_t s, Err *err) {
    return quant_gemm_variant(W, x, T, y, y_f32, 0, 0, 0, work, s, err);
}
