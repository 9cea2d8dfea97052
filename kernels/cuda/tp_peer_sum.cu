/* tp_peer_sum.cu — the one-shot sum over NVLink peers (tp_peer_sum.cuh).
 *
 * Block b of every rank copies its share of the rank's part into the
 * staging slot of the sum's epoch, then meets block b of every other rank
 * once, then reads every rank's slot over NVLink and sums. A meeting: each
 * of the block's first n_ranks threads writes the epoch into its peer's
 * flag for (block, this rank), with release semantics across the system,
 * and waits for the peer's word in its own area. The epoch counts this
 * block's sums on this rank, kept in device memory, so the kernel replays
 * inside CUDA graphs as it is; its parity picks the slot. Why one meeting
 * is enough: block b of a rank writes slot (e & 1) again at epoch e + 2,
 * after passing the meeting of e + 1, which every peer's block b reaches
 * only in its next kernel, after its sum of epoch e (the only reader of
 * that slot's share) has ended. (An earlier form met twice, before and
 * after reading the parts in place: 6.15 us a sum on two H200s.) A peer
 * that never comes (its rank failed) would hold the block forever: the
 * wait gives up after ~2^34 cycles (seconds), the sum is then garbage and
 * the host's deadline (nccl_link_wait_all) has already failed the step. */
#include "kernels/cuda/tp_peer_sum.cuh"

#include "kernels/cuda/bf16.cuh"

static __device__ __forceinline__ void flag_release(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

static __device__ __forceinline__ unsigned flag_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* After the block's staging writes: every thread's are ordered before the
 * flags its peers read (the fence, then the barrier). */
static __device__ void peers_meet(const TpPeers &p, unsigned epoch) {
    __threadfence_system();
    __syncthreads();
    int t = threadIdx.x;
    if (t < p.n_ranks) {
        int slot = blockIdx.x * TP_PEER_MAX_RANKS;
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

/* The value group i (4 values with n4, else 1) of part k: this rank's own
 * from src, a peer's from its staging slot. */
template <bool N4>
static __device__ __forceinline__ float4 part_load(const TpPeers &p, const void *src, size_t off, int k, bool bf,
                                                   int64_t i) {
    const void *base = k == p.rank ? src : (const void *)((const char *)p.stage[k] + off);
    if (N4) return load4(base, bf, i);
    return make_float4(load1(base, bf, i), 0.0f, 0.0f, 0.0f);
}

template <bool N4>
static __device__ __forceinline__ void stage_copy(void *dst, const void *src, bool bf, int64_t i) {
    if (N4 && bf) ((uint2 *)dst)[i] = ((const uint2 *)src)[i];
    else if (N4) ((float4 *)dst)[i] = ((const float4 *)src)[i];
    else if (bf) ((bf16 *)dst)[i] = ((const bf16 *)src)[i];
    else ((float *)dst)[i] = ((const float *)src)[i];
}

template <bool N4>
__global__ void kernel_tp_peer_sum(void *out, TpPeerOut how, TpPeers p, const void *src, bool parts_bf16,
                                   int64_t n) {
    __shared__ unsigned epoch;
    unsigned *counter = p.flags[p.rank] + TP_PEER_BLOCKS * TP_PEER_MAX_RANKS + blockIdx.x;
    if (threadIdx.x == 0) epoch = *counter + 1;
    __syncthreads();
    unsigned e = epoch;
    size_t off = (size_t)(e & 1) * p.slot_bytes;
    void *mine = (char *)p.stage[p.rank] + off;
    int64_t items = N4 ? n / 4 : n, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = first; i < items; i += stride) stage_copy<N4>(mine, src, parts_bf16, i);
    peers_meet(p, e);
    for (int64_t i = first; i < items; i += stride) {
        float4 s = part_load<N4>(p, src, off, 0, parts_bf16, i);
        for (int k = 1; k < p.n_ranks; k++) {
            float4 v = part_load<N4>(p, src, off, k, parts_bf16, i);
            s = make_float4(__fadd_rn(s.x, v.x), __fadd_rn(s.y, v.y), __fadd_rn(s.z, v.z), __fadd_rn(s.w, v.w));
        }
        if (N4) store4(out, how, i, s);
        else store1(out, how, i, s.x);
    }
    if (threadIdx.x == 0) *counter = e;
}

void cuda_tp_peer_sum(void *out, TpPeerOut how, const TpPeers *p, const void *src, bool parts_bf16, int64_t n,
                      cudaStream_t s) {
    if (n <= 0) return;
    const int threads = 512;
    bool n4 = n % 4 == 0;
    int64_t items = n4 ? n / 4 : n;
    int64_t blocks = (items + threads - 1) / threads;
    if (blocks > TP_PEER_BLOCKS) blocks = TP_PEER_BLOCKS;
    if (n4) kernel_tp_peer_sum<true><<<(int)blocks, threads, 0, s>>>(out, how, *p, src, parts_bf16, n);
    else kernel_tp_peer_sum<false><<<(int)blocks, threads, 0, s>>>(out, how, *p, src, parts_bf16, n);
}
