/* attn_meta.h — the kernel metadata of one attention step, built on the host
 * from an AttnBatch (kernels/attn_batch.h) and uploaded to the GPU as one
 * int32 buffer.
 *
 * The rows of a step are grouped into *runs*: consecutive rows of one
 * sequence at consecutive positions. A run longer than one row is a prefill
 * chunk (it may start mid-sequence: chunked prefill); a run of one row is a
 * decode row. The prefill kernel works on tiles of ATTN_TILE_M query rows of
 * one run; the decode kernel on single rows, its KV length split over
 * several blocks of threads and combined.
 *
 * Packed buffer (int32), sections at the offsets below:
 *   prefill runs [n_prefill][4]  q_start, q_len, pos0 (position of the first
 *                                row), seq (row of the block table)
 *   tiles        [n_tiles][2]    prefill run index, first row m0 within the run
 *   decode rows  [n_decode][3]   row, seq, pos
 *   tables       [n_seqs][table_width]  block ids; columns past a sequence's
 *                                need are 0 (never read)
 * A row attends to keys 0..pos of its sequence (pos - window + 1 .. pos on a
 * windowed layer), so a run's KV length is pos0 + q_len.
 *
 * CUDA graphs: for a decode-only step the offsets depend only on n_decode
 * and table_width (pass a fixed table_width), so a captured decode launch
 * replays with the buffer re-uploaded at the same address.
 */
#ifndef CLLM_ATTN_META_H
#define CLLM_ATTN_META_H

#include <stdint.h>

#include "base/err.h"
#include "kernels/attn_batch.h"

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend */
#endif

#define ATTN_TILE_M 128         /* query rows per prefill tile (the prefill kernel's BLOCK_M) */
#define ATTN_DECODE_TILE_N 64   /* keys per decode tile (the decode kernel's BLOCK_N) */

typedef struct {
    int32_t q_start, q_len, pos0, seq;
} AttnRun;

typedef struct {
    int n_cache_blocks;         /* blocks in the cache: every block id used must be below */
    int table_width;            /* columns of the flattened table; 0 = just enough for this step */
} AttnMetaOpts;

typedef struct {
    int n_tokens, n_seqs, block_size, table_width;
    int n_runs;                 /* all runs in row order (host view) */
    AttnRun *runs;
    int n_prefill, n_tiles, n_decode;
    int max_kv_len;             /* longest key range of any row (pos + 1) */
    int off_prefill, off_tiles, off_decode, off_tables;
    int32_t *buf;               /* packed metadata, buf_len int32 values */
    int buf_len;
} AttnMeta;

/* Builds m from b (m is overwritten; free with attn_meta_free). Checks that
 * positions are non-negative, a sequence's rows never repeat a position in
 * one step, seq indices are in range and every block id a row needs lies in
 * [0, n_cache_blocks). Returns 0, or -1 with err naming the row and value. */
int attn_meta_build(AttnMeta *m, const AttnBatch *b, const AttnMetaOpts *o, Err *err);
void attn_meta_free(AttnMeta *m);

/* Number of KV splits for the decode kernel: one wave of its blocks
 * (resident: how many the GPU holds at once, multiprocessors x the kernel's
 * blocks per multiprocessor, cuda_attention_decode_residency), rounded
 * down, no split shorter than four tiles of max_ctx, at most 256. The
 * decode grid is fixed by (n_decode, splits), so a graph captured with
 * splits from the largest context replays for any shorter one.
 * n_head_groups = ceil(group size / 16) per KV head. */
int attn_decode_splits(int max_ctx, int n_decode, int n_kv_heads, int n_head_groups, int resident);

/* The many-rows decode kernel's grid, in warps, for `items` items on a GPU
 * that holds resident_warps of them: every item a warp of its own where they
 * fit, else the fewest rounds of items (ceil(items / resident_warps)) spread
 * evenly, so that no last round runs a few items on an otherwise idle GPU. */
int64_t attn_rows_grid_warps(int64_t items, int resident_warps);

/* A decode row's KV splits come from its own key range alone (never from the
 * step's other rows or the longest context a graph is sized for, so its sums
 * are the same in any batch, which the batch-invariant mode relies on):
 * ATTN_SPLIT_TILES key tiles per split (the default mode at a step of one
 * decode row: ATTN_SPLIT_TILES_ONE_ROW), at most ATTN_MAX_SPLITS splits
 * (longer rows get longer splits). The decode grid caps them: it has
 * attn_decode_row_splits_max(m) splits or more in the batch-invariant mode;
 * blocks past a row's own count do nothing. */
#define ATTN_SPLIT_TILES 4
#define ATTN_SPLIT_TILES_ONE_ROW 2 /* the default mode's split size at a step of one decode row */
#define ATTN_MAX_SPLITS 64

#ifdef __CUDACC__
#define ATTN_META_FN __host__ __device__ static inline
#else
#define ATTN_META_FN static inline
#endif

/* Splits of a row whose key range covers n_tiles decode tiles: one up to
 * ATTN_SPLIT_TILES tiles (a merge costs more than it saves there), else
 * split_tiles tiles a split. */
ATTN_META_FN int attn_row_splits(int n_tiles, int split_tiles) {
    int s = split_tiles > 0 && n_tiles > ATTN_SPLIT_TILES ? (n_tiles + split_tiles - 1) / split_tiles : 1;
    return s < 1 ? 1 : s > ATTN_MAX_SPLITS ? ATTN_MAX_SPLITS : s;
}

/* The most splits attn_row_splits gives any decode row of m (its full key
 * range, 0..pos: a windowed layer's rows need no more); 1 without decode rows. */
int attn_decode_row_splits_max(const AttnMeta *m);

#ifdef __cplusplus
}
#endif

#endif
