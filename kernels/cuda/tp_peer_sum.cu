/* tp_peer_sum.cu — the one-shot sum over NVLink peers (tp_peer_sum.cuh).
 *
 * Block b of every rank meets block b of every other rank twice: before the
 * sum (every part is written: the product that made it is an earlier kernel
 * of each rank's stream) and after it (no rank has read a part yet to be
 * overwritten). A meeting: each of the block's first n_ranks threads writes
 * the epoch into its peer's flag for (block, this rank), with release
 * semantics across the system, and waits for the peer's word in its own
 * area. The epoch counts this block's sums on this rank, kept in device
 * memory, so the kernel replays inside CUDA graphs as it is. A peer that
 * never comes (its rank failed) would hold the block forever: the wait
 * gives up after ~2^34 cycles (seconds), the sum is then garbage and the
 * host's deadline (nccl_link_wait_all) has already failed the step. */
#include "kernels/cuda/tp_peer_sum.cuh"

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/pdl.cuh"

static __device__ __forceinline__ void flag_release(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

static __device__ __forceinline__ unsigned flag_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

static __device__ void peers_meet(const TpPeers &p, int barrier, unsigned epoch) {
    int t = threadIdx.x;
    if (t < p.n_ranks) {
        int slot = (barrier * TP_PEER_BLOCKS + blockIdx.x) * TP_PEER_MAX_RANKS;
        flag_release(p.flags[t] + slot + p.rank, epoch);
        const unsigned *mine = p.flags[p.rank] + slot + t;
        long long t0 = clock64();
        while ((int)(flag_acquire(mine) - epoch) < 0 && clock64() - t0 < (1LL << 34)) {}
    }
    __syncthreads();
}

static __device__ __forceinline__ float4 load4(const void *base, bool is_bf16, int64_t i) {
    if (!is_bf16) return __ldcg((const float4 *)base + i);
    uint2 u = __ldcg((const uint2 *)base + i);
    __nv_bfloat162 a = *(__nv_bfloat162 *)&u.x, b = *(__nv_bfloat162 *)&u.y;
    return make_float4(__low2float(a), __high2float(a), __low2float(b), __high2float(b));
}

static __device__ __forceinline__ float load1(const void *base, bool is_bf16, int64_t i) {
    return is_bf16 ? __bfloat162float(((const bf16 *)base)[i]) : __ldcg((const float *)base + i);
}

static __device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16(v)); }

static __device__ __forceinline__ void store4(void *out, TpPeerOut how, int64_t i, float4 s) {
    if (how == TP_PEER_OUT_F32) {
        ((float4 *)out)[i] = s;
    } else if (how == TP_PEER_OUT_BF16) {
        __nv_bfloat162 a = __floats2bfloat162_rn(s.x, s.y), b = __floats2bfloat162_rn(s.z, s.w);
        uint2 u = {*(unsigned *)&a, *(unsigned *)&b};
        ((uint2 *)out)[i] = u;
    } else {
        float4 x = ((const float4 *)out)[i];
        ((float4 *)out)[i] = make_float4(__fadd_rn(x.x, bf16_round(s.x)), __fadd_rn(x.y, bf16_round(s.y)),
                                         __fadd_rn(x.z, bf16_round(s.z)), __fadd_rn(x.w, bf16_round(s.w)));
    }
}

static __device__ __forceinline__ void store1(void *out, TpPeerOut how, int64_t i, float s) {
    if (how == TP_PEER_OUT_F32) ((float *)out)[i] = s;
    else if (how == TP_PEER_OUT_BF16) ((bf16 *)out)[i] = __float2bfloat16(s);
    else ((float *)out)[i] = __fadd_rn(((const float *)out)[i], bf16_round(s));
}

/* n4: values in groups of 4 (n % 4 == 0), else one at a time */
__global__ void kernel_tp_peer_sum(void *out, TpPeerOut how, TpPeers p, bool parts_bf16, int64_t n, bool n4) {
    /* Launched early (pdl.cuh): the launch is off the chain. The next kernel may start at once: it only reads
     * constant weights before its own pdl_wait, which waits for this sum (and so for the second meeting). */
    pdl_enter();
    __shared__ unsigned epoch;
    unsigned *counter = p.flags[p.rank] + 2 * TP_PEER_BLOCKS * TP_PEER_MAX_RANKS + blockIdx.x;
    if (threadIdx.x == 0) epoch = *counter + 1;
    __syncthreads();
    unsigned e = epoch;
    peers_meet(p, 0, e);
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (n4) {
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            float4 s = load4(p.part[0], parts_bf16, i);
            for (int k = 1; k < p.n_ranks; k++) {
                float4 v = load4(p.part[k], parts_bf16, i);
                s = make_float4(__fadd_rn(s.x, v.x), __fadd_rn(s.y, v.y), __fadd_rn(s.z, v.z), __fadd_rn(s.w, v.w));
            }
            store4(out, how, i, s);
        }
    } else {
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
            float s = load1(p.part[0], parts_bf16, i);
            for (int k = 1; k < p.n_ranks; k++) s = __fadd_rn(s, load1(p.part[k], parts_bf16, i));
            store1(out, how, i, s);
        }
    }
    __syncthreads();
    peers_meet(p, 1, e);
    if (threadIdx.x == 0) *counter = e;
}

cudaError_t cuda_tp_peer_sum(void *out, TpPeerOut how, const TpPeers *p, bool parts_bf16, int64_t n,
                             cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    const int threads = 512;
    bool n4 = n % 4 == 0;
    int64_t items = n4 ? n / 4 : n;
    int64_t blocks = (items + threads - 1) / threads;
    if (blocks > TP_PEER_BLOCKS) blocks = TP_PEER_BLOCKS;
    return launch_pdl(kernel_tp_peer_sum, dim3((unsigned)blocks), dim3(threads), 0, s, out, how, *p, parts_bf16, n, n4);
}
