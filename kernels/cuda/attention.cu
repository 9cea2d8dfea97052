/* attention.cu — the entry points of the CUDA attention (attention.cuh):
 * argument checks, the kernel parameter block, and the dispatch of one
 * step's prefill tiles and decode rows to attention_prefill.cu and
 * attention_decode.cu (or, for steps of many decode rows,
 * attention_decode_rows.cu). */
#include "kernels/cuda/attention.cuh"

#include <string.h>

#include "kernels/cuda/cuda_check.h"

void attn_dev_meta(AttnDevMeta *d, const AttnMeta *m, const int32_t *d_buf) {
    *d = (AttnDevMeta){d_buf,         m->n_tiles,    m->n_decode,     m->off_prefill, m->off_tiles,
                       m->off_decode, m->off_tables, m->table_width, m->block_size};
}

/* partial outputs, running max and sum of every (row, head, split), then a
 * counter per (row, head) (the kernel uses one per KV head and group) */
size_t attn_decode_work_bytes(int max_decode, int n_heads, int head_dim_v, int n_splits) {
    return (size_t)max_decode * n_heads * ((size_t)n_splits * (head_dim_v + 2) + 1) * sizeof(float);
}

static bool have_head_dims(int k, int v) {
#define ATTN_HD(K, V) if (k == K && v == V) return true;
    ATTN_HEAD_DIMS(ATTN_HD)
#undef ATTN_HD
    return false;
}

int cuda_attention_check(const AttnParams *p, int block_size, Err *err) {
    if (!have_head_dims(p->head_dim_k, p->head_dim_v))
        return err_set(err, "attention: head sizes k=%d v=%d have no CUDA kernel (supported k/v: %s)", p->head_dim_k,
                       p->head_dim_v, ATTN_HEAD_DIMS_TEXT);
    if (p->n_kv_heads <= 0 || p->n_heads <= 0 || p->n_heads % p->n_kv_heads)
        return err_set(err, "attention: n_heads %d is not a multiple of n_kv_heads %d", p->n_heads, p->n_kv_heads);
    if (block_size < 8 || (block_size & (block_size - 1)))
        return err_set(err, "attention: KV block_size %d must be a power of two >= 8 for the CUDA kernels", block_size);
    if (p->window < 0) return err_set(err, "attention: window %d is negative", p->window);
    if (!(p->softcap >= 0)) return err_set(err, "attention: soft-cap %g must be >= 0", p->softcap);
    return 0;
}

static AttnKParams kparams(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                           const float *d_sinks) {
    AttnKParams kp;
    memset(&kp, 0, sizeof kp);
    kp.q = (const bf16 *)q, kp.out = (bf16 *)out, kp.k = kv->k, kp.v = kv->v;
    kp.fp8 = kv->dtype == KV_DTYPE_FP8;
    kp.k_scale = kv->k_scale, kp.v_scale = kv->v_scale;
    kp.k_fixed = kv->k_fixed, kp.v_fixed = kv->v_fixed;
    kp.maps = kv->maps;
    kp.meta = m->buf;
    kp.off_prefill = m->off_prefill, kp.off_tiles = m->off_tiles, kp.off_decode = m->off_decode;
    kp.off_tables = m->off_tables, kp.table_width = m->table_width;
    while ((1 << kp.block_shift) < m->block_size) kp.block_shift++;
    kp.n_heads = p->n_heads, kp.n_kv_heads = p->n_kv_heads, kp.group = p->n_heads / p->n_kv_heads;
    kp.scale_log2 = p->scale * ATTN_LOG2E;
    if (p->softcap > 0) kp.cap_in = p->scale / p->softcap, kp.cap_out = p->softcap * ATTN_LOG2E;
    kp.window = p->window;
    kp.sinks = d_sinks;
    kp.n_groups = (kp.group + 15) / 16;
    return kp;
}

/* The cache's dtype and scales are consistent (a caller bug otherwise). */
static int check_kv(const KVLayerDev *kv, Err *err) {
    if (!kv || !kv->k || !kv->v) return err_set(err, "attention: no KV cache given");
    if (kv->dtype == KV_DTYPE_FP8 && (!kv->k_scale || !kv->v_scale))
        return err_set(err, "attention: an fp8 KV cache without its scales");
    return 0;
}

int cuda_attention_prefill(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                           const float *d_sinks, cudaStream_t s, Err *err) {
    if (cuda_attention_check(p, m->block_size, err) || check_kv(kv, err)) return -1;
    AttnKParams kp = kparams(out, q, kv, m, p, d_sinks);
    return attn_prefill_launch(&kp, p->head_dim_k, p->head_dim_v, m->n_tiles, s, err);
}

bool cuda_attention_decode_rows_takes(const AttnDecodeWork *w, const AttnParams *p, int n_decode) {
    if (!w || w->rows_warps <= 0 || w->n_splits != 1 || !attn_decode_rows_serves(p->head_dim_k, p->head_dim_v) ||
        p->n_kv_heads <= 0)
        return false;
    int64_t items = (int64_t)n_decode * p->n_kv_heads * ATTN_ROWS_GROUPS(p->n_heads / p->n_kv_heads);
    return 2 * items >= w->rows_warps;
}

/* The decode rows of kp's step, in groups whose partials fit the work area;
 * or all at once on the many-rows kernel where it takes them (one split: no
 * partials; its item counter is the work area's first split counter). */
static int decode_rows(AttnKParams *kp, const AttnDevMeta *m, const AttnParams *p, const AttnDecodeWork *w,
                       cudaStream_t s, Err *err) {
    int64_t group = w && w->cap > 0 && w->n_splits > 0 ? w->cap / w->n_splits : w ? w->max_decode : 0;
    if (!w || !w->part || w->n_splits < 1 || group < 1 || (w->cap == 0 && m->n_decode > w->max_decode))
        return err_set(err, "attention: decode work area missing or too small (%d decode rows x %d splits, room "
                       "for %lld rows)", m->n_decode, w ? w->n_splits : 0, (long long)group);
    if (group > m->n_decode) group = m->n_decode;
    kp->n_splits = w->n_splits;
    kp->split_tiles = w->split_tiles;
    kp->part_o = w->part;
    kp->part_ml = w->part + (size_t)group * p->n_heads * w->n_splits * p->head_dim_v;
    /* the split counters: in a capped area (the backend's) at one place past the room of any step's partials;
     * right behind this step's partials they would sit, for a step of fewer rows x splits, where an earlier
     * step left partial values (counters must start at zero: the last split to count zeroes its own) */
    kp->done = w->cap > 0 ? (int *)(w->part + (size_t)w->cap * p->n_heads * (p->head_dim_v + 2))
                          : (int *)(kp->part_ml + (size_t)group * p->n_heads * w->n_splits * 2);
    if (!kp->rope && cuda_attention_decode_rows_takes(w, p, m->n_decode))
        return attn_decode_rows_launch(kp, p->head_dim_k, p->head_dim_v, m->n_decode, w->rows_warps, s, err);
    /* rows in groups whose partials fit (the same group count for a given
     * n_decode and n_splits, so a captured step replays): each row's sums
     * depend on its own splits alone, never on its group */
    /* one split and no cascade: every row's keys in one block, the short kernel (the grid is the same, so
     * the choice depends only on what the graph key covers) */
    const bool short_rows = kp->n_splits == 1 && !kp->casc && !w->no_short;
    for (int d0 = 0; d0 < m->n_decode; d0 += (int)group) {
        int n = m->n_decode - d0 < group ? m->n_decode - d0 : (int)group;
        kp->off_decode = m->off_decode + 3 * d0;
        if (short_rows ? attn_decode_short_launch(kp, p->head_dim_k, p->head_dim_v, n, s, err)
                       : attn_decode_launch(kp, p->head_dim_k, p->head_dim_v, n, s, err))
            return -1;
    }
    return 0;
}

int cuda_attention_decode(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                          const float *d_sinks, const AttnDecodeWork *w, cudaStream_t s, Err *err) {
    if (m->n_decode == 0) return 0;
    if (cuda_attention_check(p, m->block_size, err) || check_kv(kv, err)) return -1;
    AttnKParams kp = kparams(out, q, kv, m, p, d_sinks);
    return decode_rows(&kp, m, p, w, s, err);
}

int cuda_attention_decode_rope(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m,
                               const AttnParams *p, const float *d_sinks, const AttnDecodeWork *w, const AttnRope *r,
                               cudaStream_t s, Err *err) {
    if (m->n_decode == 0) return 0;
    if (cuda_attention_check(p, m->block_size, err) || check_kv(kv, err)) return -1;
    if (m->n_tiles > 0) return err_set(err, "attention: rope in the decode kernel needs a step of decode rows alone");
    if (!r || !r->k || !r->v || !r->slot || r->rot_dim < 0 || r->rot_dim % 2 || r->rot_dim > p->head_dim_k ||
        (r->rot_dim > 0 && !r->inv_freq))
        return err_set(err, "attention: bad rope arguments (rotated channels %d of %d)", r ? r->rot_dim : -1,
                       p->head_dim_k);
    AttnKParams kp = kparams(out, q, kv, m, p, d_sinks);
    kp.rope = true;
    kp.k_new = (const bf16 *)r->k, kp.v_new = (const bf16 *)r->v;
    kp.q_norm = r->q_norm, kp.k_norm = r->k_norm, kp.qk_eps = r->eps, kp.qk_offset = r->offset;
    kp.freqs = (RopeFreqs){r->inv_freq, r->mscale, r->rot_dim / 2, r->neox};
    kp.slot = r->slot, kp.n_slots = r->n_slots;
    return decode_rows(&kp, m, p, w, s, err);
}

int cuda_attention(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                   const float *d_sinks, const AttnDecodeWork *w, cudaStream_t s, Err *err) {
    if (cuda_attention_prefill(out, q, kv, m, p, d_sinks, s, err)) return -1;
    return cuda_attention_decode(out, q, kv, m, p, d_sinks, w, s, err);
}

size_t attn_cascade_work_bytes(int64_t cap_slots, int head_dim_v) {
    return (size_t)cap_slots * (head_dim_v + 2) * sizeof(float);
}

int cuda_attention_cascade(void *out, const void *q, const KVLayerDev *kv, const AttnDevMeta *m, const AttnParams *p,
                           const float *d_sinks, const AttnDecodeWork *w, const AttnCascadeDev *cd, cudaStream_t s,
                           Err *err) {
    if (!cd || cd->m.n_units == 0) return cuda_attention(out, q, kv, m, p, d_sinks, w, s, err);
    if (cuda_attention_prefill(out, q, kv, m, p, d_sinks, s, err)) return -1;
    const int64_t slots = (int64_t)cd->m.n_members * p->n_heads * cd->m.n_splits;
    if (!cd->buf || !cd->part || slots > cd->cap_slots || cd->m.n_splits < 1)
        return err_set(err, "attention: cascade scratch missing or too small (%lld partial results, room for %lld)",
                       (long long)slots, (long long)cd->cap_slots);
    AttnKParams kp = kparams(out, q, kv, m, p, d_sinks);
    kp.casc = cd->buf;
    kp.casc_units = cd->m.off_units, kp.casc_groups = cd->m.off_groups;
    kp.casc_members = cd->m.off_members, kp.casc_rows = cd->m.off_rows;
    kp.casc_splits = cd->m.n_splits;
    kp.casc_o = cd->part, kp.casc_ml = cd->part + slots * p->head_dim_v;
    AttnKParams shared = kp;
    shared.casc_shared = true;
    shared.window = 0; /* the plan groups a windowed layer's rows only where every window covers the prefix */
    shared.sinks = NULL;
    if (attn_cascade_shared_launch(&shared, p->head_dim_k, p->head_dim_v, cd->m.n_units, cd->m.n_splits, s, err))
        return -1;
    if (m->n_decode == 0) return 0;
    return decode_rows(&kp, m, p, w, s, err);
}
