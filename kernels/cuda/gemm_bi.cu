/* gemm_bi.cu — the batch-invariant GEMM of gemm_bi.cuh.
 *
 * One kernel template, several tile shapes. A block owns BM rows of W (the
 * mma's M side) and BN rows of x (its N side); its warps each own a WM x WN
 * sub-tile. K is walked in BK-wide stages through a STAGES-deep cp.async
 * ring in shared memory ([rows][BK + 8] bf16: the 16-byte pad puts the 8
 * rows an ldmatrix phase reads on 8 different bank groups), fragments come
 * from ldmatrix, products from mma.sync m16n8k16 (bf16 in, fp32 accumulate).
 * Each accumulator sees the k16 steps of its element in increasing order and
 * nothing else, and a step past ceil(K/16) is never issued: the sum is the
 * same bits in every shape. The fp32 tile then goes through shared memory so
 * that y is written along its rows (coalesced), + bias, rounded once.
 *
 * Shapes (the configurations gb_pick chooses from): decode (T <= 64)
 * streams W, so BM = 32 (two warps of 16 rows) for many blocks and deep
 * rings of BK = 128 (7 stages of 8 KB of W in flight at T <= 8); prefill
 * uses 128 x 128 (8 warps of 64 x 32) or 64 x 128 tiles of BK = 32, 4
 * stages, as the classic sm_80 GEMMs do. They are latency-bound: two warps
 * issue a decode block's copies, and each ldmatrix is waited on. */
#include "kernels/cuda/gemm_bi.cuh"

#include <stdint.h>
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"

typedef __nv_bfloat16 bf16;

/* ---- PTX helpers ---- */

static __device__ __forceinline__ uint32_t gb_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte global -> shared copy; valid == false writes zeros, reads nothing. */
static __device__ __forceinline__ void gb_cp16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void gb_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void gb_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

static __device__ __forceinline__ void gb_ldsm4(uint32_t a, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
static __device__ __forceinline__ void gb_ldsm2(uint32_t a, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(a));
}

/* c += A(16x16) B(16x8): the one product instruction of every shape. */
static __device__ __forceinline__ void gb_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- kernel ---- */

typedef struct {
    void *y;
    const bf16 *W, *x;
    const float *bias;
    int M, T, K, ldc, y_f32;
} GemmBiArgs;

template <int BM, int BN, int WM, int WN, int BK, int ST> struct GbShape {
    static constexpr int NWM = BM / WM, NWN = BN / WN, NT = 32 * NWM * NWN;
    static constexpr int MI = WM / 16, NI = WN / 8;
    static constexpr int SA = BK + 8;                 /* shared row stride, bf16 */
    static constexpr int STAGE = (BM + BN) * SA;      /* bf16 per stage: W rows then x rows */
    static constexpr int EPS = BM + 4;                /* epilogue row stride, fp32 */
    static constexpr int PIPE = ST * STAGE * 2, EPI = BN * EPS * 4;
    static constexpr int SMEM = PIPE > EPI ? PIPE : EPI;
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0 && BK % 16 == 0, "tile shape");
    static_assert(NI == 1 || NI % 2 == 0, "x fragments are loaded two n8 tiles at a time");
};

/* Starts copying k columns [k0, k0 + BK) of W rows m0.. and x rows n0.. into
 * one ring stage; what lies outside the matrices becomes zeros. */
template <class S, int BM, int BN, int BK, bool VEC>
static __device__ __forceinline__ void gb_load(bf16 *st, const GemmBiArgs &a, int m0, int n0, int k0) {
    constexpr int CH = BK / 8;
    for (int i = threadIdx.x; i < (BM + BN) * CH; i += S::NT) {
        int r = i / CH, c = (i % CH) * 8, k = k0 + c;
        bool w = r < BM;
        int row = w ? m0 + r : n0 + r - BM, lim = w ? a.M : a.T;
        const bf16 *base = w ? a.W : a.x;
        bf16 *dst = st + r * S::SA + c;
        if (VEC) {
            bool ok = row < lim && k < a.K; /* K % 8 == 0: a chunk is all in or all out */
            gb_cp16(gb_smem(dst), ok ? base + (int64_t)row * a.K + k : base, ok);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                dst[e] = row < lim && k + e < a.K ? base[(int64_t)row * a.K + k + e] : __float2bfloat16(0.0f);
        }
    }
}

/* The epilogue: the warps' C fragments (c0, c1 at W row g, x rows 2t, 2t+1;
 * c2, c3 at W row g + 8) go through shared memory ep, then all the block's
 * threads write its outputs (+ bias) to y. */
template <class S, int MI, int NI, int WM, int WN, int BM, int BN>
static __device__ __forceinline__ void gb_epilogue(float *ep, const float (&acc)[MI][NI][4], int wm, int wn, int lane,
                                                   int m0, int n0, const GemmBiArgs &a) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) {
            int m = wm * WM + i * 16 + g, n = wn * WN + j * 8 + 2 * t;
            ep[n * S::EPS + m] = acc[i][j][0];
            ep[(n + 1) * S::EPS + m] = acc[i][j][1];
            ep[n * S::EPS + m + 8] = acc[i][j][2];
            ep[(n + 1) * S::EPS + m + 8] = acc[i][j][3];
        }
    __syncthreads();
    for (int i = threadIdx.x; i < BN * BM; i += S::NT) {
        int n = i / BM, m = i % BM, gm = m0 + m, gn = n0 + n;
        if (gm >= a.M || gn >= a.T) continue;
        float v = ep[n * S::EPS + m];
        if (a.bias) v = __fadd_rn(v, a.bias[gm]);
        if (a.y_f32) ((float *)a.y)[(int64_t)gn * a.ldc + gm] = v;
        else ((bf16 *)a.y)[(int64_t)gn * a.ldc + gm] = __float2bfloat16_rn(v);
    }
}

template <int BM, int BN, int WM, int WN, int BK, int ST, bool VEC>
__global__ void __launch_bounds__(GbShape<BM, BN, WM, WN, BK, ST>::NT) kernel_gemm_bi(const GemmBiArgs a) {
    using S = GbShape<BM, BN, WM, WN, BK, ST>;
    constexpr int MI = S::MI, NI = S::NI, SA = S::SA;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *ring = (bf16 *)smem;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % S::NWM, wn = warp / S::NWM;
    const int n_k16 = (a.K + 15) / 16, n_kt = (a.K + BK - 1) / BK;

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < n_kt) gb_load<S, BM, BN, BK, VEC>(ring + s * S::STAGE, a, m0, n0, s * BK);
        gb_commit(); /* empty groups keep the wait counts uniform */
    }
    /* lane addresses of the ldmatrix phases: A rows lane % 16, k half lane / 16;
     * x rows (lane % 8) + 8 * (lane / 16), k half (lane / 8) % 2 */
    const int a_row = wm * WM + (lane & 15), a_col = (lane >> 4) * 8;
    const int b_row = BM + wn * WN + (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;

    for (int kt = 0; kt < n_kt; kt++) {
        gb_wait<ST - 2>();
        __syncthreads(); /* stage kt landed for everyone; the stage of kt - 1 is free */
        int nxt = kt + ST - 1;
        if (nxt < n_kt) gb_load<S, BM, BN, BK, VEC>(ring + (nxt % ST) * S::STAGE, a, m0, n0, nxt * BK);
        gb_commit();
        const bf16 *st = ring + (kt % ST) * S::STAGE;
        const uint32_t a_base = gb_smem(st + a_row * SA + a_col), b_base = gb_smem(st + b_row * SA + b_col);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            if (kt * (BK / 16) + kk >= n_k16) break; /* no step past the zero-padded tail */
            uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++)
                gb_ldsm4(a_base + (i * 16 * SA + kk * 16) * 2, af[i][0], af[i][1], af[i][2], af[i][3]);
            if (NI == 1) {
                gb_ldsm2(b_base + kk * 16 * 2, bfr[0][0], bfr[0][1]);
            } else {
#pragma unroll
                for (int j = 0; j < NI; j += 2)
                    gb_ldsm4(b_base + (j * 8 * SA + kk * 16) * 2, bfr[j][0], bfr[j][1], bfr[j + 1 < NI ? j + 1 : j][0],
                             bfr[j + 1 < NI ? j + 1 : j][1]);
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) gb_mma(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
        }
    }
    gb_wait<0>();
    __syncthreads(); /* the ring becomes the epilogue tile */

    gb_epilogue<S, MI, NI, WM, WN, BM, BN>((float *)smem, acc, wm, wn, lane, m0, n0, a);
}

/* ---- launchers ---- */

template <int BM, int BN, int WM, int WN, int BK, int ST, bool VEC>
static int gb_launch_v(const GemmBiArgs &a, cudaStream_t s, Err *err) {
    using S = GbShape<BM, BN, WM, WN, BK, ST>;
    if (S::SMEM > 48 * 1024) /* opt in above the default (legal during graph capture) */
        CUDA_CHECK(cudaFuncSetAttribute(kernel_gemm_bi<BM, BN, WM, WN, BK, ST, VEC>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM), err);
    dim3 grid((unsigned)((a.M + BM - 1) / BM), (unsigned)((a.T + BN - 1) / BN));
    if (grid.y > 65535) return err_set(err, "gemm_bi: %d rows of x exceed the grid", a.T);
    kernel_gemm_bi<BM, BN, WM, WN, BK, ST, VEC><<<grid, S::NT, S::SMEM, s>>>(a);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}

template <int BM, int BN, int WM, int WN, int BK, int ST>
static int gb_launch(const GemmBiArgs &a, bool vec, cudaStream_t s, Err *err) {
    if (vec) return gb_launch_v<BM, BN, WM, WN, BK, ST, true>(a, s, err);
    return gb_launch_v<BM, BN, WM, WN, BK, ST, false>(a, s, err);
}

static int current_sms(void) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) ==
                                                  cudaSuccess && v > 0)
        return v;
    return 132;
}

static int gb_n_sms(void) {
    /* every GPU of a machine is the same kind; set once, thread-safely (C++11): ranks launch on threads of their own */
    static const int n = current_sms();
    return n;
}

/* The shape for (M, T): any is correct (same sums), this one the fastest
 * measured. Decode sizes stream W through narrow tiles; prefill takes
 * 128 x 128 unless that leaves SMs idle. */
static int gb_pick(int M, int T) {
    if (T <= 8) return 0;
    if (T <= 16) return 1;
    if (T <= 32) return 2;
    if (T <= 64) return 3;
    int64_t big = (int64_t)((M + 127) / 128) * ((T + 127) / 128);
    return big >= 2 * gb_n_sms() ? 5 : 4;
}

extern "C" int cuda_gemm_bi_config(void *y, bool y_f32, int ldc, const void *W, const void *x, const float *bias,
                                   int M, int T, int K, int config, cudaStream_t s, Err *err) {
    if (M <= 0 || T <= 0 || K <= 0 || ldc < M)
        return err_set(err, "gemm_bi: bad sizes M %d, T %d, K %d, ldc %d", M, T, K, ldc);
    GemmBiArgs a = {y, (const bf16 *)W, (const bf16 *)x, bias, M, T, K, ldc, y_f32 ? 1 : 0};
    bool vec = K % 8 == 0 && (uintptr_t)W % 16 == 0 && (uintptr_t)x % 16 == 0;
    if (config < 0) config = gb_pick(M, T);
    switch (config) {
    case 0: return gb_launch<32, 8, 16, 8, 128, 8>(a, vec, s, err);     /* T <= 8: 7 stages of W in flight */
    case 1: return gb_launch<32, 16, 16, 16, 128, 7>(a, vec, s, err);
    case 2: return gb_launch<32, 32, 16, 32, 128, 6>(a, vec, s, err);
    case 3: return gb_launch<32, 64, 16, 64, 128, 5>(a, vec, s, err);
    case 4: return gb_launch<64, 128, 32, 32, 32, 4>(a, vec, s, err);   /* 8 warps, 2 x 4 */
    case 5: return gb_launch<128, 128, 64, 32, 32, 4>(a, vec, s, err);  /* 8 warps, 2 x 4 */
    default: return err_set(err, "gemm_bi: configuration %d (0..%d)", config, GEMM_BI_CONFIGS - 1);
    }
}

extern "C" int cuda_gemm_bi(void *y, bool y_f32, int ldc, const void *W, const void *x, const float *bias, int M,
                            int T, int K, cudaStream_t s, Err *err) {
    return cuda_gemm_bi_config(y, y_f32, ldc, W, x, bias, M, T, K, -1, s, err);
}
