/* backend_cuda_memory.cu — what the CUDA backend allocates beside the
 * weights: the step buffers, the split-decode scratch and metadata buffers of
 * attention, and the KV cache, which takes what the memory budget
 * (BackendOptions.mem_util of the GPU) leaves: per layer K codes | V codes
 * (| K scales | V scales for fp8), each 256-byte aligned, in one pool. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/gemv.cuh"

/* *buf, pinned, of at least want bytes (*have: its size), grown to twice
 * what it held at least: cudaFreeHost / cudaMallocHost synchronize the
 * device, so a buffer that grows with the step's rows (kept logits rows, a
 * tensor-parallel sum) must do it rarely. The caller makes sure no copy
 * still reads or writes the old buffer. */
int pinned_room(void **buf, size_t *have, size_t want, Err *err) {
    if (*have >= want) return 0;
    size_t grow = 2 * *have > want ? 2 * *have : want;
    if (*buf) CUDA_CHECK(cudaFreeHost(*buf), err);
    *buf = NULL;
    *have = 0;
    CUDA_CHECK(cudaMallocHost(buf, grow), err);
    *have = grow;
    return 0;
}

/* Step buffers sized for max_tokens rows; the rope tables on the device. */
int cuda_alloc_step(CudaBackend *cb, const ModelShape *c, Err *err) {
    int T = cb->max_tokens;
    cb->max_seqs = T < 1024 ? T : 1024;
    int64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->n_experts > 0 ? c->n_experts_used : 1;
    int64_t qkv = (int64_t)c->n_heads * c->head_dim_k + (int64_t)c->n_kv_heads * (c->head_dim_k + c->head_dim_v);
    int64_t wide = qkv > 2 * (int64_t)c->ffn_dim ? qkv : 2 * (int64_t)c->ffn_dim;
    CUDA_CHECK(cudaMalloc(&cb->d_ids, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_pos, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_seq, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_slot, T * sizeof(int64_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_rows, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_ids, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_pos, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_seq, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_slot, T * sizeof(int64_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_rows, T * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->scratch, T * wide * sizeof(bf16)), err);
    CUDA_CHECK(cudaMalloc(&cb->router, T * E * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_router, T * E * sizeof(float)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_idx, (T > GEMV_MAX_T ? T : GEMV_MAX_T) * K * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_idx, T * K * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->moe_w, (T > GEMV_MAX_T ? T : GEMV_MAX_T) * K * sizeof(float)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_w, T * K * sizeof(float)), err);
    if (c->n_experts > 0) {
        int64_t rows = T > GEMV_MAX_T * K ? T : GEMV_MAX_T * K; /* expert rows, or decode (token, choice) pairs */
        CUDA_CHECK(cudaMalloc(&cb->moe_rows, (size_t)T * c->dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_out, (size_t)rows * c->dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_act, (size_t)rows * c->ffn_dim * sizeof(bf16)), err);
        CUDA_CHECK(cudaMalloc(&cb->moe_acc, (size_t)T * c->dim * sizeof(float)), err);
    }
    if (cb->fp8_max_cols > 0 && cb->tune.fp8_gemm && /* x's codes for FP8 weights' GEMMs (fp8.cuh) */
        fp8_gemm_init(&cb->fp8, cb->lt, cb->workspace, cb->workspace_bytes, T, cb->fp8_max_cols, err))
        return -1;
    size_t fbytes = (size_t)c->n_layers * (c->rope_dim / 2) * sizeof(float);
    CUDA_CHECK(cudaMalloc(&cb->d_inv_freq, fbytes > 0 ? fbytes : sizeof(float)), err);
    if (fbytes > 0) CUDA_CHECK(cudaMemcpy(cb->d_inv_freq, c->rope_inv_freq, fbytes, cudaMemcpyHostToDevice), err);
    return 0;
}

/* Bytes the KV cache may take: mem_util of the device's memory, less what
 * is in use now (weights, step buffers, other processes), shared with the
 * backends still to be made on this GPU (gpu_share), less what the
 * caller's buffers will take (bf16 activations, fp32 ones). */
static int64_t kv_budget(const BackendOptions *o, size_t free_b, size_t total, int64_t already_planned) {
    float util = o->mem_util > 0 ? o->mem_util : 0.9f;
    int share = o->gpu_share > 1 ? o->gpu_share : 1;
    double room = ((double)util * total - (double)(total - free_b)) / share;
    double budget = room - already_planned - o->act_elems * 2.0 - o->f32_elems * 4.0 - (double)RESERVE_BYTES;
    return budget > 0 ? (int64_t)budget : 0;
}

/* Bytes of KV cache per token, every layer's K and V (fp8: and their scales). */
static int64_t kv_bytes_per_token(const ModelShape *c, KVDtype t) {
    return (int64_t)c->n_layers * c->n_kv_heads * kv_head_token_bytes(t, c->head_dim_k, c->head_dim_v);
}

/* Bytes of one layer of a cache of n_slots slots, and (when kv is given)
 * its views at base: K | V (| K scales | V scales), each 256-byte aligned. */
static size_t kv_layer_layout(const ModelShape *c, KVDtype t, int64_t n_slots, char *base, KVLayerDev *kv) {
    size_t elem = t == KV_DTYPE_FP8 ? 1 : sizeof(bf16), align = 256;
    size_t part[4] = {(size_t)n_slots * c->n_kv_heads * c->head_dim_k * elem,
                      (size_t)n_slots * c->n_kv_heads * c->head_dim_v * elem, 0, 0};
    if (t == KV_DTYPE_FP8) part[2] = part[3] = (size_t)n_slots * c->n_kv_heads * sizeof(float);
    size_t off[4], at = 0;
    for (int i = 0; i < 4; i++) {
        off[i] = at;
        at += (part[i] + align - 1) / align * align;
    }
    if (kv) {
        bool fp8 = t == KV_DTYPE_FP8;
        *kv = (KVLayerDev){t, base + off[0], base + off[1], fp8 ? (float *)(base + off[2]) : NULL,
                           fp8 ? (float *)(base + off[3]) : NULL, NULL, NULL, NULL};
    }
    return at;
}

/* The static scales of an fp8 cache (--kv-scales): each layer's view points
 * at its checkpoint scales (uploaded with the weights), or at the part of a
 * buffer the layer's first step calibrates. */
static int kv_fix_scales(CudaBackend *cb, const ModelShape *c, KVScales s, Err *err) {
    int L = c->n_layers, KV = c->n_kv_heads;
    if (s == KV_SCALES_DYNAMIC) return 0;
    if (cb->kv_dtype != KV_DTYPE_FP8) return err_set(err, "KV cache: static scales need an fp8 cache (--kv-dtype fp8)");
    if (s == KV_SCALES_CALIBRATE) {
        CUDA_CHECK(cudaMalloc(&cb->d_kv_calib, (size_t)L * 2 * KV * sizeof(float)), err);
        if (!(cb->kv_calib = (bool *)malloc((size_t)L * sizeof(bool)))) return err_set(err, "out of memory");
        for (int l = 0; l < L; l++) {
            cb->kv_calib[l] = true;
            cb->kv[l].k_fixed = cb->d_kv_calib + (size_t)l * 2 * KV;
            cb->kv[l].v_fixed = cb->kv[l].k_fixed + KV;
        }
        cb->kv_calib_left = L;
        return 0;
    }
    for (int l = 0; l < L; l++) {
        const WeightRef *w = &cb->w.layers[l].kv_scales;
        if (!w->data || w->cols != 2 * KV)
            return err_set(err, "--kv-scales checkpoint: layer %d has no KV cache scales (k_scale / v_scale)", l);
        cb->kv[l].k_fixed = (const float *)w->data;
        cb->kv[l].v_fixed = (const float *)w->data + KV;
    }
    return 0;
}

/* The sm_90a prefill's TMA maps of every layer's view, once (kernel
 * parameters by value, so graphs replay them): where that kernel runs this
 * model's bf16 cache (its cp.async producer stays for fp8 caches). */
static int kv_maps(CudaBackend *cb, const ModelShape *c, int block_size, Err *err) {
    if (!cb->fast_attn || cb->kv_dtype != KV_DTYPE_BF16) return 0;
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap, 0, NULL};
    if (!(cb->kv_maps = (AttnKVMaps *)calloc(c->n_layers, sizeof *cb->kv_maps))) return err_set(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        if (cuda_attention_kv_maps(&cb->kv_maps[l], &cb->kv[l], cb->n_slots, block_size, &p, err)) return -1;
        cb->kv[l].maps = cb->kv_maps[l].rows > 0 ? &cb->kv_maps[l] : NULL;
    }
    return 0;
}

int cuda_alloc_kv(CudaBackend *cb, const ModelShape *c, const BackendOptions *o, Err *err) {
    int64_t per_block = (int64_t)o->block_size * kv_bytes_per_token(c, o->kv_dtype);
    int64_t n_blocks = o->n_blocks;
    if (n_blocks <= 0) {
        size_t free_b = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total), err);
        float util = o->mem_util > 0 ? o->mem_util : 0.9f;
        n_blocks = kv_budget(o, free_b, total, 0) / (per_block > 0 ? per_block : 1);
        if (n_blocks > MAX_AUTO_BLOCKS) n_blocks = MAX_AUTO_BLOCKS;
        if (n_blocks < 1)
            return err_set(err, "cuda: --gpu-mem-util %.2f of %.1f GiB leaves no room for the KV cache after the "
                           "weights and activations (%.1f GiB in use)", util, total / 1073741824.0,
                           (total - free_b) / 1073741824.0);
    }
    int64_t seq_tokens = o->max_seq_tokens > 0 ? o->max_seq_tokens : n_blocks * o->block_size;
    int64_t width = (seq_tokens + o->block_size - 1) / o->block_size;
    cb->max_blocks = (int)(width < n_blocks ? width : n_blocks);
    cb->n_slots = n_blocks * o->block_size;
    cb->kv_dtype = o->kv_dtype;
    size_t layer = kv_layer_layout(c, o->kv_dtype, cb->n_slots, NULL, NULL);
    cb->kv_pool_bytes = (size_t)c->n_layers * layer;
    CUDA_CHECK(cudaMalloc(&cb->kv_pool, cb->kv_pool_bytes), err);
    cb->kv = (KVLayerDev *)calloc(c->n_layers, sizeof *cb->kv);
    cb->h_need = (int32_t *)calloc(cb->max_seqs, sizeof(int32_t));
    if (!cb->kv || !cb->h_need) return err_set(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++)
        kv_layer_layout(c, o->kv_dtype, cb->n_slots, (char *)cb->kv_pool + (size_t)l * layer, &cb->kv[l]);
    if (kv_fix_scales(cb, c, o->kv_scales, err) || kv_maps(cb, c, o->block_size, err)) return -1;
    CUDA_CHECK(cudaMallocHost(&cb->h_tables, (size_t)cb->max_seqs * cb->max_blocks * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMalloc(&cb->d_tables, (size_t)cb->max_seqs * cb->max_blocks * sizeof(int32_t)), err);
    return 0;
}

/* The decode grid's splits (default mode) for n_decode rows and contexts up
 * to ctx: rows take their own splits (at most ATTN_MAX_SPLITS), so the
 * grid needs no more. */
int decode_grid_splits(const CudaBackend *cb, int ctx, int n_decode) {
    const ModelShape *c = cb->shape;
    int s = attn_decode_splits(ctx, n_decode, c->n_kv_heads, (c->n_heads / c->n_kv_heads + 15) / 16,
                               cb->decode_resident);
    return s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
}

/* Whether attention.cuh has kernels for this model, and the split-decode
 * scratch for the largest (decode rows x splits) a step can pick (taken
 * before the KV cache is sized; splits only grow with the context). */
int attn_alloc_work(CudaBackend *cb, const ModelShape *c, int block_size, bool generic_attention, Err *err) {
    AttnParams p = {c->n_heads, c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->attn_scale, c->attn_softcap, 0, NULL};
    Err why = {};
    cb->fast_attn = !generic_attention && cuda_attention_check(&p, block_size, &why) == 0;
    if (!cb->fast_attn) return cascade_alloc(cb, err); /* reads CLLM_CASCADE, leaves it off */
    CUDA_CHECK(cudaDeviceGetAttribute(&cb->n_sms, cudaDevAttrMultiProcessorCount, cb->device), err);
    cb->decode_resident = cuda_attention_decode_resident(c->head_dim_k, c->head_dim_v, cb->kv_dtype == KV_DTYPE_FP8, err);
    if (cb->decode_resident < 0) return -1;
    size_t work = 0, slot = attn_decode_work_bytes(1, c->n_heads, c->head_dim_v, 1);
    for (int n = 1; n <= cb->max_tokens; n++) {
        int splits = decode_grid_splits(cb, 1 << 30, n);
        size_t b = attn_decode_work_bytes(n, c->n_heads, c->head_dim_v, splits);
        work = b > work ? b : work;
    }
    /* batch-invariant: room for 64 decode rows at the most splits a row
     * takes; larger steps run their decode rows in groups (attention.cu) */
    size_t bi_work = (size_t)GRAPH_BI_WORK_ROWS * ATTN_MAX_SPLITS * slot;
    if (cb->bi && bi_work > work) work = bi_work;
    CUDA_CHECK(cudaMalloc(&cb->work.part, work), err);
    CUDA_CHECK(cudaMemset(cb->work.part, 0, work), err); /* the split counters start at zero */
    cb->work.cap = (int64_t)(work / slot);
    /* every decode row splits its own key range, ATTN_SPLIT_TILES tiles a
     * split: a short row of a long graph gets one split and no merge */
    cb->work.split_tiles = ATTN_SPLIT_TILES;
    /* the many-rows decode kernel: not in the batch-invariant mode (a row's sums would then depend on
     * how many rows its step has) */
    cb->work.rows_warps = 0;
    if (!cb->bi) {
        cb->work.rows_warps =
            cuda_attention_decode_rows_resident(c->head_dim_k, c->head_dim_v, cb->kv_dtype == KV_DTYPE_FP8, err);
        if (cb->work.rows_warps < 0) return -1;
    }
    return cascade_alloc(cb, err);
}

/* The per-step metadata buffers: max_tokens rows, full-width tables for
 * max_seqs sequences plus a graph's padding ones. The KV pool is zeroed so
 * padding rows read finite keys (fp8: code 0, scale 0). */
int attn_alloc_meta(CudaBackend *cb, Err *err) {
    CUDA_CHECK(cudaMemsetAsync(cb->kv_pool, 0, cb->kv_pool_bytes, cb->stream), err);
    if (!cb->fast_attn) return 0;
    int T = cb->max_tokens, max_pad = GRAPH_MAX_PAD;
    cb->meta_cap = 9LL * T + (int64_t)(cb->max_seqs + max_pad) * cb->max_blocks;
    if (cb->cascade != ATTN_CASCADE_OFF) cb->meta_cap += cascade_meta_len(cb); /* the plans, behind the metadata */
    cb->meta_seq = (int32_t *)calloc(T > max_pad ? T : max_pad, sizeof(int32_t));
    cb->meta_tables = (const int32_t **)calloc(cb->max_seqs + max_pad, sizeof(int32_t *));
    if (!cb->meta_seq || !cb->meta_tables) return err_set(err, "out of memory");
    CUDA_CHECK(cudaMalloc(&cb->d_meta, cb->meta_cap * sizeof(int32_t)), err);
    CUDA_CHECK(cudaMallocHost(&cb->h_meta, cb->meta_cap * sizeof(int32_t)), err);
    return 0;
}

extern "C" int cuda_kv_tokens_that_fit(const ModelShape *c, uint64_t weight_bytes, const BackendOptions *o,
                                       int64_t *tokens, Err *err) {
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaSetDevice(o->device), err);
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total), err);
    int64_t per_block = (int64_t)o->block_size * kv_bytes_per_token(c, o->kv_dtype);
    int64_t budget = kv_budget(o, free_b, total, (int64_t)(weight_bytes + cuda_tp_device_bytes(c, o)));
    int64_t blocks = per_block > 0 ? budget / per_block : 0; /* as cuda_alloc_kv sizes a cache by the budget */
    *tokens = (blocks < MAX_AUTO_BLOCKS ? blocks : MAX_AUTO_BLOCKS) * o->block_size;
    return 0;
}
