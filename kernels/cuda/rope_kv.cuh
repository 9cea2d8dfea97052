/* rope_kv.cuh — qk-norm, rotary embedding and the KV-cache write of a
 * step's new keys and values (kernels/cuda/rope_kv.cu), as
 * kernels/cpu/rope.c and the CPU cache write do them. */
#ifndef CLLM_ROPE_KV_CUH
#define CLLM_ROPE_KV_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/bf16.cuh"

/* qk-norm weights [D] of q and k heads (NULL: none), as in cuda_rmsnorm. */
typedef struct {
    const float *q, *k;
    float eps, offset;
} QkNorm;
/* qk-norm (per qk), then rope on q [T][H][D] and k [T][KV][D] in place
 * (first rot_dim channels of each head, inv_freq [rot_dim/2]), then k, v
 * rows to the cache at slot[t] (skipped when slot < 0 or >= n_slots); an
 * fp8 cache gets each head vector quantized as fp8_quantize_row does it. */
void cuda_rope_kv_write(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, const DevAttnBatch *b, int n_heads,
                        int n_kv_heads, int head_dim_k, int head_dim_v, int rot_dim, const float *inv_freq,
                        float mscale, bool neox, int64_t n_slots, const QkNorm *qk, cudaStream_t s);
/* --kv-scales calibrate, a layer's first step: cuda_rope_kv_write's qk-norm
 * and rope, then scales [2][n_kv_heads] (K's, then V's) = per KV head
 * fp8_scale_of_amax of max |x| over the rows with a slot (the host's
 * cpu_kv_calibrate), then the rows stored with them (fp8 cache only). The
 * caller points kv's k_fixed / v_fixed at scales for the later steps. */
void cuda_rope_kv_calibrate(bf16 *q, bf16 *k, const bf16 *v, const KVLayerDev *kv, float *scales,
                            const DevAttnBatch *b, int n_heads, int n_kv_heads, int head_dim_k, int head_dim_v,
                            int rot_dim, const float *inv_freq, float mscale, bool neox, int64_t n_slots,
                            const QkNorm *qk, cudaStream_t s);

#endif
