/* attention.cuh — the CUDA attention kernels (prefill and decode) over the
 * paged KV cache (bf16, or fp8 e4m3 with scales); C-callable. DESIGN.md
 * "Attention" defines the math; kernels/cpu/attention.c is the reference.
 *
 * Layouts (all bf16 unless said):
 *   q      [T][n_heads][head_dim_k]
 *   out    [T][n_heads][head_dim_v]
 *   K      [n_blocks][block_size][n_kv_heads][head_dim_k]  (one layer; fp8: e4m3 bytes)
 *   V      [n_blocks][block_size][n_kv_heads][head_dim_v]
 *   Ks, Vs fp8 only: fp32 [n_blocks][block_size][n_kv_heads], the scale of
 *          each head vector (value = e4m3 code x scale: fp8_quantize_row)
 *   sinks  fp32 [n_heads] on the device, or NULL
 * block_size: a power of two (16, 32, 64, ...).
 *
 * Use per step:
 *   AttnMeta m;  attn_meta_build(&m, batch, &opts, err);        host, once per step
 *   cudaMemcpyAsync(d_buf, m.buf, m.buf_len * 4, H2D, stream);  one upload, all layers
 *   AttnDevMeta dm;  attn_dev_meta(&dm, &m, d_buf);
 *   per layer: cuda_attention(out, q, &kv, &dm, &params, d_sinks, &work, stream, err);
 * cuda_attention runs the prefill kernel over every prefill tile and the
 * decode kernel over every decode row: a mixed batch is one call.
 *
 * CUDA graphs: cuda_attention_decode's grid depends only on dm.n_decode and
 * work.n_splits; everything else (rows, positions, tables) is read from d_buf,
 * so a captured decode step replays after d_buf is rewritten in place (keep
 * table_width and n_decode fixed for the graph; pick n_splits with
 * attn_decode_splits from the largest context the graph will see and
 * cuda_attention_decode_resident).
 */
#ifndef CLLM_ATTENTION_CUH
#define CLLM_ATTENTION_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "kernels/attn_batch.h"
#include "kernels/attn_cascade.h"
#include "kernels/attn_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sm_90a prefill's TMA view of one layer's bf16 cache (cuda_attention_kv_maps): a CUtensorMap each for K
 * and V, {head_dim, n_kv_heads, rows, n_slots / rows} with boxes of 64 values x rows keys in the 128-byte
 * swizzle, built once per layer (kernel parameters by value: valid in graphs while the cache stays put). */
typedef struct {
    uint64_t k[16], v[16];       /* the two CUtensorMaps' bytes (opaque here; copied into the launch) */
    const void *k_base, *v_base; /* the cache they were built for (the launch checks it) */
    int rows;                    /* keys a box: min(block size, the kernel's key tile); 0: no maps */
    int block_size;
} AttnKVMaps;

/* One layer of the paged cache on the device (the layouts above). */
typedef struct {
    KVDtype dtype;
    void *k, *v;               /* bf16, or e4m3 codes (KV_DTYPE_FP8) */
    float *k_scale, *v_scale;  /* KV_DTYPE_FP8: the scales; else NULL */
    const float *k_fixed, *v_fixed; /* fp8 with static scales (--kv-scales checkpoint / calibrate): [n_kv_heads]
                                       the scale every written head vector gets; NULL: dynamic (amax / 448) */
    const AttnKVMaps *maps;    /* bf16: the sm_90a prefill's TMA maps of this layer, or NULL (it gathers every
                                  key by cp.async) */
} KVLayerDev;

/* Fills *m for the layer kv (n_slots slots, blocks of block_size) where the
 * sm_90a prefill would load its whole cache blocks by TMA: a bf16 cache, head
 * sizes it has, an sm_90a build on a 9.0 GPU; else m->rows = 0 (not an
 * error). -1 with err when the driver refuses a map. Once per layer, not per
 * launch. */
int cuda_attention_kv_maps(AttnKVMaps *m, const KVLayerDev *kv, int64_t n_slots, int block_size, const AttnParams *p,
                           Err *err);

/* Attention metadata on the device for the simple kernel and the rope /
 * cache write: tables flattened to [n_seqs][max_blocks]. */
typedef struct {
    int n_tokens;
    const int32_t *pos, *seq;
    const int64_t *slot;            /* < 0: a padding row, nothing written */
    const int32_t *tables;
    int max_blocks, block_size;
} DevAttnBatch;

/* out [T][H][Dv] (bf16) = attention of q [T][H][Dk] (bf16) over the paged
 * cache by the simple kernel (attention_generic.cu), for any head size and
 * block size: where the kernels below have no variant. */
void cuda_attention_generic(void *out, const void *q, const KVLayerDev *kv, const DevAttnBatch *b,
                            const AttnParams *p, cudaStream_t s);

/* (head_dim_k, head_dim_v) pairs with compiled kernels; each has 8 variants
 * (soft-cap on/off x window on/off x bf16/fp8 cache); sinks and GQA ratio
 * are run-time. */
#define ATTN_HEAD_DIMS(X) X(64, 64) X(80, 80) X(96, 96) X(128, 128) X(256, 256) X(128, 64) X(192, 128)
#define ATTN_HEAD_DIMS_TEXT "64/64, 80/80, 96/96, 128/128, 256/256, 128/64, 192/128"

/* The device side of an AttnMeta: its counts and offsets, and where its
 * buffer was copied. */
typedef struct {
    const int32_t *buf;
    int n_tiles, n_decode;
    int off_prefill, off_tiles, off_decode, off_tables, table_width, block_size;
} AttnDevMeta;

void attn_dev_meta(AttnDevMeta *d, const AttnMeta *m, const int32_t *d_buf);

/* Scratch of the split decode: partial outputs of every split, and a
 * counter per (row, KV head, head group) by which the last split to finish
 * merges them (no combine kernel). Size it for the most decode rows a step
 * can hold; zero it once after allocating it (the counters are back at zero
 * after every launch). */
typedef struct {
    float *part;                 /* attn_decode_work_bytes() bytes of device memory, zeroed once */
    int max_decode, n_splits;
    int split_tiles;             /* 0: every row n_splits splits; > 0: per-row splits (AttnKParams) */
    int64_t cap;                 /* > 0: part holds cap (row, split) slots and the decode rows run in
                                    groups that fit (max_decode unused), the split counters past all of
                                    them; 0: max_decode rows at once */
    int rows_warps;              /* > 0: the many-rows kernel may run (cuda_attention_decode_rows_takes), and
                                    the GPU holds this many of its warps (cuda_attention_decode_rows_resident);
                                    0: every launch on the split kernel (the batch-invariant mode) */
    bool no_short;               /* launches of one split run the general decode kernel, not
                                    attention_decode_short.cu's: false in the backend; test_attention sets it to
                                    check the two kernels' bits against each other */
} AttnDecodeWork;

size_t attn_decode_work_bytes(int max_decode, int n_heads, int head_dim_v, int n_splits);

/* The decode rows' own keys and values, for cuda_attention_decode_rope:
 * what rope_kv_write would do (rope_kv.cuh cuda_rope_kv_write: qk-norm,
 * rope, the cache write of each row's new key and value) done by the decode
 * kernel itself, one launch instead of two, with the same bits. */
typedef struct {
    const void *k, *v;            /* bf16 [T][n_kv_heads][head_dim] as the qkv product left them */
    const float *q_norm, *k_norm; /* qk-norm weights [head_dim_k], or NULL */
    float eps, offset;            /* of the qk-norm */
    const float *inv_freq;        /* [rot_dim / 2] */
    float mscale;
    int rot_dim;                  /* rotated channels of a head (even, <= head_dim_k) */
    bool neox;
    const int64_t *slot;          /* [T] each row's cache slot; < 0 or >= n_slots: not stored (padding) */
    int64_t n_slots;
} AttnRope;

/* 0 when the variant has a kernel, else -1 with err saying what is missing. */
int cuda_attention_check(const AttnParams *p, int block_size, Err *err);

/* How many blocks of the decode kernel for these head sizes and cache type
 * the current GPU holds at once (multiprocessors x blocks each, as its
 * shared memory and registers allow): attn_decode_splits' resident. -1 with
 * err for head sizes without a kernel. */
int cuda_attention_decode_resident(int head_dim_k, int head_dim_v, bool fp8, Err *err);

/* The many-rows decode kernel (attention_decode_rows.cu: a warp per (row,
 * KV head, head group) item, a persistent grid): how many of its warps the
 * current GPU holds at once for these head sizes and cache type (0: head
 * sizes it does not serve, above 128; -1 with err if asking the GPU fails).
 * The backend puts it in AttnDecodeWork.rows_warps once. */
int cuda_attention_decode_rows_resident(int head_dim_k, int head_dim_v, bool fp8, Err *err);

/* Whether a decode launch of n_decode rows (not rope mode; cascade rows too) runs
 * on the many-rows kernel: w->rows_warps > 0, one split (w->n_splits == 1:
 * attn_decode_splits gives that once the items fill a wave of the split
 * kernel's blocks), head sizes it serves (k and v <= 128: 256/256 and
 * 192/128 stay on the split kernel), and at least half as many items
 * (rows x KV heads x ATTN_ROWS_GROUPS) as its resident warps: 4 (bf16) or
 * 6 (fp8) busy warps an SM at head 128 keep ~60 KB or more in flight, past what the
 * copy rate needs, while the split kernel at one split has ~10 tiles a block
 * there. Depends only on values a captured graph fixes. */
bool cuda_attention_decode_rows_takes(const AttnDecodeWork *w, const AttnParams *p, int n_decode);

/* Query heads a many-rows item takes at most (the n8 of its S^T = K Q^T
 * tiles), and the items of a KV head of g query heads. */
#define ATTN_ROWS_HEADS 8
#define ATTN_ROWS_GROUPS(g) (((g) + ATTN_ROWS_HEADS - 1) / ATTN_ROWS_HEADS)

/* Prefill tiles and decode rows of one step, one layer. The stream is last
 * but one; err names a bad argument or the failed CUDA call. */
int cuda_attention(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                   const float *d_sinks, const AttnDecodeWork *w, cudaStream_t s, Err *err);

/* Cascade attention (DESIGN.md "Cascade attention"): a step's plan packed
 * (attn_cascade_pack, unit_pairs ATTN_TILE_M, key_tile ATTN_DECODE_TILE_N)
 * and uploaded with the step's metadata, and the scratch of the shared
 * pass's partial results. */
typedef struct {
    const int32_t *buf;          /* the packed plan on the device */
    AttnCascadeMeta m;
    float *part;                 /* attn_cascade_work_bytes(cap_slots, head_dim_v) bytes of device memory */
    int64_t cap_slots;           /* (member, head, split) partial results part holds */
} AttnCascadeDev;

/* Most splits the shared pass takes (its partial results stay few). */
#define ATTN_CASCADE_MAX_SPLITS 32

size_t attn_cascade_work_bytes(int64_t cap_slots, int head_dim_v);

/* cuda_attention with cascade: the prefill tiles as there; the shared pass
 * (every group's member rows x query heads against its prefix, read once per
 * block of ATTN_TILE_M pairs and split; attention_prefill.cu); then the
 * decode kernel over every decode row, members attending only to their own
 * keys and merging the shared partial results into their output, the sink
 * once (attention_decode.cu). The plan's members must be decode rows (runs
 * of one row) and its windows must cover its prefixes (the plan's rule), so
 * the shared pass runs unwindowed. Not for the rope-in-decode path. */
int cuda_attention_cascade(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                           const float *d_sinks, const AttnDecodeWork *w, const AttnCascadeDev *cd, cudaStream_t s,
                           Err *err);

/* Which prefill kernel runs for these head sizes and cache type on this
 * device: "sm90a" (attention_prefill_sm90.cu) or "fa2" (attention_prefill.cu). */
const char *cuda_attention_prefill_kernel(int head_dim_k, int head_dim_v, bool fp8);

/* The two halves alone (benchmarks, graph capture of decode steps). */
int cuda_attention_prefill(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                           const float *d_sinks, cudaStream_t s, Err *err);
int cuda_attention_decode(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                          const float *d_sinks, const AttnDecodeWork *w, cudaStream_t s, Err *err);
/* A step of decode rows alone (m->n_tiles == 0) with q, r->k, r->v straight
 * from the qkv product: qk-norm, rope and the cache write of every row's new
 * key and value, then its attention, in the decode kernel (q is not written
 * back). Same results as cuda_rope_kv_write + cuda_attention_decode. */
int cuda_attention_decode_rope(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m,
                               const AttnParams *p, const float *d_sinks, const AttnDecodeWork *w, const AttnRope *r,
                               cudaStream_t s, Err *err);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* Internal: the per-kernel launchers (attention.cu fills AttnKParams). */
#include "kernels/cuda/attention_common.cuh"
extern "C" int attn_prefill_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_tiles, cudaStream_t s,
                                   Err *err);
/* attention_prefill_sm90.cu: 1 ran, 0 no sm_90a kernel for the case, -1 error */
extern "C" bool attn_prefill_sm90_has(int head_dim_k, int head_dim_v, bool fp8);
extern "C" int attn_prefill_sm90_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_tiles,
                                        cudaStream_t s, Err *err);
extern "C" int attn_cascade_shared_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_units,
                                          int n_splits, cudaStream_t s, Err *err);
extern "C" int attn_decode_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode, cudaStream_t s,
                                  Err *err);
extern "C" bool attn_decode_rows_serves(int head_dim_k, int head_dim_v);
extern "C" int attn_decode_rows_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode,
                                       int resident_warps, cudaStream_t s, Err *err);
/* attention_decode_short.cu: a launch of one split (kp->n_splits == 1) and no cascade plan */
extern "C" int attn_decode_short_launch(const AttnKParams *kp, int head_dim_k, int head_dim_v, int n_decode,
                                        cudaStream_t s, Err *err);
#endif

#endif
