/* kv_cache_host.h — the CPU backend's paged KV cache: fixed-size blocks
 * addressed through block tables (engine/kv_blocks.h hands out the blocks).
 *
 * A sequence's token at position p lives in block block_table[p / block_size]
 * at offset p % block_size; its "slot" is block * block_size + offset. The
 * forward pass writes K/V by slot (slot mapping) and attention reads them back
 * through the block table, so a sequence's blocks need not be contiguous.
 *
 * Host layout, per layer:  K [n_blocks][block_size][n_kv_heads][head_dim_k]
 *                          V [n_blocks][block_size][n_kv_heads][head_dim_v]
 * as fp32 (KV_DTYPE_BF16: the CPU backend computes in fp32), or as e4m3
 * codes (KV_DTYPE_FP8) with the scale of each (slot, KV head) beside them,
 * Ks / Vs [n_blocks][block_size][n_kv_heads] fp32 (kernels/dtype.h
 * fp8_quantize_row). Block ids are shared by all layers (block b of every
 * layer belongs to the same sequence).
 */
#ifndef CLLM_KV_CACHE_HOST_H
#define CLLM_KV_CACHE_HOST_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"

typedef struct {
    int n_layers, n_kv_heads, head_dim_k, head_dim_v;
    int block_size;          /* tokens per block */
    int n_blocks;
    KVDtype dtype;
    float **k, **v;          /* fp32 cache: [n_layers] pointers to the per-layer arrays above; else NULL */
    uint8_t **k8, **v8;      /* fp8 cache: [n_layers] e4m3 codes, same layout; else NULL */
    float **ks, **vs;        /* fp8 cache: [n_layers] scales [n_blocks][block_size][n_kv_heads] */
    float *k_fixed, *v_fixed; /* fp8 cache with static scales: [n_layers][n_kv_heads], the scale each head's
                                 vectors are written with (into ks / vs too); NULL: dynamic, amax / 448 */
} KVCacheHost;

int kv_cache_host_alloc(KVCacheHost *c, int n_layers, int n_kv_heads, int head_dim_k, int head_dim_v,
                        int block_size, int n_blocks, KVDtype dtype, Err *err);
void kv_cache_host_free(KVCacheHost *c);
/* Gives an fp8 cache static scales: k_fixed / v_fixed allocated, all 1, for
 * the caller to fill (a checkpoint's scales, or a calibration's). */
int kv_cache_host_fix_scales(KVCacheHost *c, Err *err);

/* Stores the K and V head vectors of one token, k [n_kv_heads][head_dim_k]
 * and v [n_kv_heads][head_dim_v], at a slot of a layer (fp8: each head
 * vector quantized with its own scale, or with its layer and head's static
 * one, saturating, when the cache has them). */
void kv_cache_store(KVCacheHost *c, int layer, int64_t slot, const float *k, const float *v);

/* The K / V vector of one kv head at a slot as fp32: a pointer into an fp32
 * cache, or buf (head_dim floats) holding the dequantized fp8 values. */
const float *kv_key(const KVCacheHost *c, int layer, int64_t slot, int kv_head, float *buf);
const float *kv_value(const KVCacheHost *c, int layer, int64_t slot, int kv_head, float *buf);

/* Pointers to the K / V vectors of one kv head at a slot (fp32 cache only). */
static inline float *kv_k_at(const KVCacheHost *c, int layer, int64_t slot, int kv_head) {
    return c->k[layer] + (slot * c->n_kv_heads + kv_head) * c->head_dim_k;
}
static inline float *kv_v_at(const KVCacheHost *c, int layer, int64_t slot, int kv_head) {
    return c->v[layer] + (slot * c->n_kv_heads + kv_head) * c->head_dim_v;
}

#endif
