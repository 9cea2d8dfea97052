/* wgmma.cuh — the Hopper (sm_90a) warpgroup instructions the kernels share:
 * wgmma fences and waits, shared-memory matrix descriptors, mbarriers, and
 * the m64nNk16 bf16 products of the attention (attention_prefill_sm90.cu).
 * quant_gemm_mainloop.cuh has its own products (A from registers, its shapes).
 * Everything that issues wgmma is device code of the sm_90a target only
 * (WG_SM90A); other targets compile the callers' bodies away. */
#ifndef CLLM_WGMMA_CUH
#define CLLM_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_SM90A 1 /* wgmma exists only in the arch-specific sm_90a target */
#else
#define WG_SM90A 0
#endif

#if WG_SM90A
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

/* mbarriers (PTX ISA 7.8, sm_90) */
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
/* Shared-memory matrix descriptor, 128-byte swizzle (the tile's base
 * 1024-byte aligned; rows of 128 bytes): K-major operands use sbo = 1024
 * (8-row groups) and no lbo; an N-major B uses lbo = the offset between its
 * 64-column chunks and sbo = 1024 between 8-row groups of K. */
static __device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fff) << 32 | (uint64_t)1 << 62;
}

#define W_ACC8(d, i)                                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]),         \
        "+f"(d[i + 7])

/* d (m64n64, fp32) = A (smem, K-major) x B (smem, K-major), + d when acc; bf16 */
static __device__ __forceinline__ void wg_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24)
                 : "l"(da), "l"(db), "r"(acc));
}
/* d (m64n128, fp32) = A (smem, K-major) x B (smem, K-major), + d when acc; bf16 */
static __device__ __forceinline__ void wg_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24), W_ACC8(d, 32), W_ACC8(d, 40), W_ACC8(d, 48), W_ACC8(d, 56)
                 : "l"(da), "l"(db), "r"(acc));
}
/* d (m64n64, fp32) = A (smem, K-major) x B (smem, K-major), + d when acc; f16 */
static __device__ __forceinline__ void wg_ss_f16_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24)
                 : "l"(da), "l"(db), "r"(acc));
}
/* d (m64n64, fp32) += A (registers) x B (smem, N-major: imm-trans-b 1); bf16 */
static __device__ __forceinline__ void wg_rs_t_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d (m64n128, fp32) += A (registers) x B (smem, N-major: imm-trans-b 1); bf16 */
static __device__ __forceinline__ void wg_rs_t_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24), W_ACC8(d, 32), W_ACC8(d, 40), W_ACC8(d, 48), W_ACC8(d, 56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d (m64n256, fp32) += A (registers) x B (smem, N-major: imm-trans-b 1); bf16 */
static __device__ __forceinline__ void wg_rs_t_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24), W_ACC8(d, 32), W_ACC8(d, 40), W_ACC8(d, 48), W_ACC8(d, 56), W_ACC8(d, 64), W_ACC8(d, 72), W_ACC8(d, 80), W_ACC8(d, 88), W_ACC8(d, 96), W_ACC8(d, 104), W_ACC8(d, 112), W_ACC8(d, 120)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d (m64n64, fp32) += A (registers) x B (smem, N-major: imm-trans-b 1); f16 */
static __device__ __forceinline__ void wg_rs_t_f16_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* d (m64n128, fp32) += A (registers) x B (smem, N-major: imm-trans-b 1); f16 */
static __device__ __forceinline__ void wg_rs_t_f16_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : W_ACC8(d, 0), W_ACC8(d, 8), W_ACC8(d, 16), W_ACC8(d, 24), W_ACC8(d, 32), W_ACC8(d, 40), W_ACC8(d, 48), W_ACC8(d, 56)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

#endif /* WG_SM90A */

#endif
