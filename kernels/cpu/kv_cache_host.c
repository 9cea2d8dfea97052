/* kv_cache_host.c — the CPU backend's paged KV cache (layout in kv_cache_host.h).
 *
 * One K and one V allocation per layer (and, for fp8, one of each's scales),
 * zero-filled (calloc: the pages of a large, mostly unused cache are not
 * touched until written).
 */
#include "kernels/cpu/kv_cache_host.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of one layer's array of n_blocks * block_size * n_kv_heads * width
 * elements of elem bytes, or 0 when the product overflows size_t. */
static size_t layer_bytes(size_t elem, int n_blocks, int block_size, int n_kv_heads, int width) {
    size_t r = elem;
    int f[4] = {n_blocks, block_size, n_kv_heads, width};
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(r, (size_t)f[i], &r)) return 0;
    return r;
}

/* [n_layers] pointers, each to its own zeroed array of bytes. */
static void **alloc_layers(int n_layers, size_t bytes) {
    void **p = calloc((size_t)n_layers, sizeof *p);
    for (int l = 0; p && l < n_layers; l++)
        if (!(p[l] = calloc(1, bytes))) {
            while (l-- > 0) free(p[l]);
            free(p);
            return NULL;
        }
    return p;
}

static void free_layers(void **p, int n_layers) {
    for (int l = 0; p && l < n_layers; l++) free(p[l]);
    free(p);
}

int kv_cache_host_alloc(KVCacheHost *c, int n_layers, int n_kv_heads, int head_dim_k, int head_dim_v,
                        int block_size, int n_blocks, KVDtype dtype, Err *err) {
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim_k <= 0 || head_dim_v <= 0 || block_size <= 0 || n_blocks <= 0)
        return err_set(err, "KV cache: invalid shape: %d layers, %d kv heads, head sizes %d (K) / %d (V), "
                       "%d blocks of %d tokens (all must be > 0)",
                       n_layers, n_kv_heads, head_dim_k, head_dim_v, n_blocks, block_size);
    bool fp8 = dtype == KV_DTYPE_FP8;
    size_t elem = fp8 ? 1 : sizeof(float);
    size_t kb = layer_bytes(elem, n_blocks, block_size, n_kv_heads, head_dim_k);
    size_t vb = layer_bytes(elem, n_blocks, block_size, n_kv_heads, head_dim_v);
    size_t sb = layer_bytes(sizeof(float), n_blocks, block_size, n_kv_heads, 1);
    if (!kb || !vb || !sb)
        return err_set(err, "KV cache: %d blocks x %d tokens x %d kv heads x head size %d/%d overflows a size",
                       n_blocks, block_size, n_kv_heads, head_dim_k, head_dim_v);
    *c = (KVCacheHost){.n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim_k = head_dim_k,
                       .head_dim_v = head_dim_v, .block_size = block_size, .n_blocks = n_blocks, .dtype = dtype};
    bool ok;
    if (fp8) {
        c->k8 = (uint8_t **)alloc_layers(n_layers, kb);
        c->v8 = (uint8_t **)alloc_layers(n_layers, vb);
        c->ks = (float **)alloc_layers(n_layers, sb);
        c->vs = (float **)alloc_layers(n_layers, sb);
        ok = c->k8 && c->v8 && c->ks && c->vs;
    } else {
        c->k = (float **)alloc_layers(n_layers, kb);
        c->v = (float **)alloc_layers(n_layers, vb);
        ok = c->k && c->v;
    }
    if (!ok) {
        kv_cache_host_free(c);
        return err_set(err,
                       "KV cache: cannot allocate %d layers of K %zu + V %zu bytes (%d blocks x %d tokens x %d kv "
                       "heads x head size %d/%d, %s); use fewer blocks or a shorter context",
                       n_layers, kb, vb, n_blocks, block_size, n_kv_heads, head_dim_k, head_dim_v,
                       fp8 ? "fp8 + scales" : "fp32");
    }
    return 0;
}

void kv_cache_host_free(KVCacheHost *c) {
    void **all[6] = {(void **)c->k, (void **)c->v, (void **)c->k8, (void **)c->v8, (void **)c->ks, (void **)c->vs};
    for (int i = 0; i < 6; i++) free_layers(all[i], c->n_layers);
    free(c->k_fixed);
    free(c->v_fixed);
    memset(c, 0, sizeof *c);
}

int kv_cache_host_fix_scales(KVCacheHost *c, Err *err) {
    if (c->dtype != KV_DTYPE_FP8) return err_set(err, "KV cache: static scales need an fp8 cache (--kv-dtype fp8)");
    size_t n = (size_t)c->n_layers * c->n_kv_heads;
    free(c->k_fixed);
    free(c->v_fixed);
    c->k_fixed = malloc(n * sizeof *c->k_fixed);
    c->v_fixed = malloc(n * sizeof *c->v_fixed);
    if (!c->k_fixed || !c->v_fixed) return err_set(err, "KV cache: out of memory for %zu static scales", 2 * n);
    for (size_t i = 0; i < n; i++) c->k_fixed[i] = c->v_fixed[i] = 1.0f;
    return 0;
}

/* One head vector to codes: with the static scale where the cache has one. */
static void store_head(const float *x, int n, const float *fixed, uint8_t *codes, float *scale) {
    if (!fixed) {
        fp8_quantize_row(x, n, codes, scale);
        return;
    }
    fp8_quantize_row_fixed(x, n, *fixed, codes);
    *scale = *fixed;
}

void kv_cache_store(KVCacheHost *c, int layer, int64_t slot, const float *k, const float *v) {
    int64_t kr = (int64_t)c->n_kv_heads * c->head_dim_k, vr = (int64_t)c->n_kv_heads * c->head_dim_v;
    if (c->dtype != KV_DTYPE_FP8) {
        memcpy(c->k[layer] + slot * kr, k, (size_t)kr * sizeof *k);
        memcpy(c->v[layer] + slot * vr, v, (size_t)vr * sizeof *v);
        return;
    }
    const float *kf = c->k_fixed ? c->k_fixed + (int64_t)layer * c->n_kv_heads : NULL;
    const float *vf = c->v_fixed ? c->v_fixed + (int64_t)layer * c->n_kv_heads : NULL;
    for (int h = 0; h < c->n_kv_heads; h++) {
        int64_t at = slot * c->n_kv_heads + h;
        store_head(k + h * c->head_dim_k, c->head_dim_k, kf ? kf + h : NULL, c->k8[layer] + at * c->head_dim_k,
                   &c->ks[layer][at]);
        store_head(v + h * c->head_dim_v, c->head_dim_v, vf ? vf + h : NULL, c->v8[layer] + at * c->head_dim_v,
                   &c->vs[layer][at]);
    }
}

const float *kv_key(const KVCacheHost *c, int layer, int64_t slot, int kv_head, float *buf) {
    if (c->dtype != KV_DTYPE_FP8) return kv_k_at(c, layer, slot, kv_head);
    int64_t at = slot * c->n_kv_heads + kv_head;
    fp8_dequantize_row(c->k8[layer] + at * c->head_dim_k, c->head_dim_k, c->ks[layer][at], buf);
    return buf;
}

const float *kv_value(const KVCacheHost *c, int layer, int64_t slot, int kv_head, float *buf) {
    if (c->dtype != KV_DTYPE_FP8) return kv_v_at(c, layer, slot, kv_head);
    int64_t at = slot * c->n_kv_heads + kv_head;
    fp8_dequantize_row(c->v8[layer] + at * c->head_dim_v, c->head_dim_v, c->vs[layer][at], buf);
    return buf;
}
