/* backend_cuda_layer.cu — the ops of a layer on the CUDA backend (the
 * Backend ops of kernels/backend.h that forward.c calls between begin_step
 * and read): each runs the kernels of its family, its matrix products by the
 * route table (backend_cuda_matmul.cu). Where a step allows, ops fold into
 * one launch: the norm into the GEMV that reads its output (dp4a at one
 * row; FP8 and bf16 at their decode rows), the
 * activation into the gate|up GEMV (dp4a or FP8) or the fused GEMM's epilogue, the q|k|v
 * split into the GEMV's or GEMM's store, the rope and cache write into the
 * decode attention kernel, the residual add into the down / o GEMV. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rope_kv.cuh"

static void cuda_be_embed(Backend *be, void *out, const WeightRef *table, int T, float scale) {
    CudaBackend *cb = cb_of(be);
    cuda_embed((float *)out, (const bf16 *)table->data, cb->d_ids, T, (int)table->cols, scale, cb->stream);
}

static void cuda_be_add_rmsnorm(Backend *be, void *x, const void *delta, void *out, const WeightRef *w, int T, int C,
                                float eps, float offset) {
    cuda_add_rmsnorm((float *)x, (const bf16 *)delta, (bf16 *)out, (const float *)w->data, T, C, eps, offset,
                     cb_of(be)->stream);
}

static void cuda_be_rmsnorm(Backend *be, void *out, const void *x, const WeightRef *w, int rows, int C, float eps,
                            float offset) {
    cuda_rmsnorm((bf16 *)out, (const bf16 *)x, (const float *)w->data, rows, C, eps, offset, cb_of(be)->stream);
}

static void cuda_be_matmul(Backend *be, void *y, const void *x, const WeightRef *w, int mat, const WeightRef *bias,
                           int T) {
    wgemm(cb_of(be), y, false, (const bf16 *)x, w, mat, vec_of(bias, mat), T);
}

/* Where the matrix-vector kernels store q, k, v (+ biases) of Wq|Wk|Wv. */
static GemvOut qkv_out(void *q, void *k, void *v, const LayerWeights *lw) {
    const int64_t nq = lw->wq.rows, nk = lw->wk.rows, nv = lw->wv.rows;
    GemvOut out = {{q, k, v}, {vec_of(&lw->bq, 0), vec_of(&lw->bk, 0), vec_of(&lw->bv, 0)}, {nq, nq + nk, nq + nk + nv},
                   false, false};
    return out;
}

/* Wq|Wk|Wv as one bf16 matrix (back to back), or NULL. */
static const bf16 *qkv_bf16_matrix(const LayerWeights *lw) {
    const int64_t K = lw->wq.cols;
    const bf16 *Wq = mat_of(&lw->wq, 0), *Wk = mat_of(&lw->wk, 0), *Wv = mat_of(&lw->wv, 0);
    bool cat = !is_quant(&lw->wq) && !is_quant(&lw->wk) && !is_quant(&lw->wv) && Wk == Wq + lw->wq.rows * K &&
               Wv == Wk + lw->wk.rows * K;
    return cat ? Wq : NULL;
}

/* Wq|Wk|Wv as one quantized matrix, or NULL. */
static const QuantMatrix *qkv_quant_matrix(const LayerWeights *lw) {
    bool cat = is_quant(&lw->wq) && lw->wk.data == lw->wq.data && lw->wv.data == lw->wq.data;
    return cat ? qm_of(&lw->wq) : NULL;
}

/* One GEMM over the concatenated Wq|Wk|Wv, split (and biased) after; the
 * matrix-vector kernels store q, k, v (+ biases) themselves, and so does
 * the fused GEMM's parts epilogue. */
static void cuda_be_qkv(Backend *be, void *q, void *k, void *v, const void *x, const LayerWeights *lw, int T) {
    CudaBackend *cb = cb_of(be);
    int nq = (int)lw->wq.rows, nk = (int)lw->wk.rows, nv = (int)lw->wv.rows, K = (int)lw->wq.cols;
    const bf16 *Wq = mat_of(&lw->wq, 0);
    bool qcat = qkv_quant_matrix(lw) != NULL, bcat = qkv_bf16_matrix(lw) != NULL;
    if (cb->failed || T <= 0) return;
    if (!qcat && !bcat) {
        cuda_be_matmul(be, q, x, &lw->wq, 0, &lw->bq, T);
        cuda_be_matmul(be, k, x, &lw->wk, 0, &lw->bk, T);
        cuda_be_matmul(be, v, x, &lw->wv, 0, &lw->bv, T);
        return;
    }
    MatmulRoute r = matmul_route(cb, &lw->wq, T);
    GemvOut out = qkv_out(q, k, v, lw);
    if (route_is_qgemv(r)) return qgemv(cb, r, (const bf16 *)x, qm_of(&lw->wq), &out, T);
    if (r == MM_GEMV) return cuda_gemv_parts(&out, Wq, (const bf16 *)x, nq + nk + nv, K, T, cb->stream);
    QuantGemmEpi epi = {&out, false, NULL, NULL, NULL, ACT_SILU, 0.0f};
    if (qcat && qgemm_epi(cb, (const bf16 *)x, qm_of(&lw->wq), &epi, T)) return;
    if (qcat) wgemm(cb, cb->scratch, false, (const bf16 *)x, &lw->wq, 0, NULL, T);
    else gemm(cb, cb->scratch, false, (const bf16 *)x, Wq, NULL, nq + nk + nv, T, K);
    cuda_split_qkv((bf16 *)q, (bf16 *)k, (bf16 *)v, cb->scratch, vec_of(&lw->bq, 0), vec_of(&lw->bk, 0),
                   vec_of(&lw->bv, 0), T, nq, nk, nv, cb->stream);
}

static void cuda_be_rope_kv_write(Backend *be, int layer, void *q, void *k, const void *v, int T) {
    CudaBackend *cb = cb_of(be);
    const ModelShape *c = cb->shape;
    DevAttnBatch b = cb->batch;
    b.n_tokens = T;
    const LayerWeights *lw = &cb->w.layers[layer];
    QkNorm qk = {(const float *)lw->q_norm.data, (const float *)lw->k_norm.data, c->norm_eps, c->norm_offset};
    if (cb->kv_calib && cb->kv_calib[layer]) { /* --kv-scales calibrate: this step sets the layer's scales */
        cuda_rope_kv_calibrate((bf16 *)q, (bf16 *)k, (const bf16 *)v, &cb->kv[layer],
                               cb->d_kv_calib + (size_t)layer * 2 * c->n_kv_heads, &b, c->n_heads, c->n_kv_heads,
                               c->head_dim_k, c->head_dim_v, c->rope_dim,
                               cb->d_inv_freq + (size_t)layer * (c->rope_dim / 2), c->rope_mscale[layer],
                               c->rope_neox, cb->n_slots, &qk, cb->stream);
        cb->kv_calib[layer] = false;
        cb->kv_calib_left--;
        return;
    }
    cuda_rope_kv_write((bf16 *)q, (bf16 *)k, (const bf16 *)v, &cb->kv[layer], &b, c->n_heads,
                       c->n_kv_heads, c->head_dim_k, c->head_dim_v, c->rope_dim,
                       cb->d_inv_freq + (size_t)layer * (c->rope_dim / 2), c->rope_mscale[layer], c->rope_neox,
                       cb->n_slots, &qk, cb->stream);
}

static void cuda_be_attention(Backend *be, void *out, const void *q, int layer, const AttnParams *p, int T) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) return;
    if (!cb->fast_attn) {
        DevAttnBatch b = cb->batch;
        b.n_tokens = T;
        cuda_attention_generic(out, q, &cb->kv[layer], &b, p, cb->stream);
        return;
    }
    Err e = {};
    const AttnCascadeDev *cd = cascade_of_layer(cb, p->window); /* NULL: every row the flat path */
    if (cuda_attention_cascade(out, q, &cb->kv[layer], &cb->dmeta, p, p->sinks, &cb->work, cd, cb->stream, &e))
        cb_fail(cb, &e);
}

/* A step of decode rows alone: rope, cache write and attention in the decode
 * kernel (one launch instead of two; attention.cuh cuda_attention_decode_rope). */
static bool cuda_be_rope_attention(Backend *be, int layer, void *out, void *q, void *k, const void *v,
                                   const AttnParams *p, int T) {
    CudaBackend *cb = cb_of(be);
    /* a cascade layer ropes apart: its shared pass reads the roped queries; so does a step that the many-rows
     * decode kernel takes (no rope mode there; at many rows the rope kernel is cheap) */
    if (cb->failed || !cb->tune.rope_in_decode || !cb->fast_attn || cb->meta.n_tiles > 0 || cb->meta.n_decode != T ||
        (cb->kv_calib && cb->kv_calib[layer]) || cascade_of_layer(cb, p->window) ||
        cuda_attention_decode_rows_takes(&cb->work, p, cb->meta.n_decode))
        return false;
    const ModelShape *c = cb->shape;
    const LayerWeights *lw = &cb->w.layers[layer];
    AttnRope r = {k, v, (const float *)lw->q_norm.data, (const float *)lw->k_norm.data, c->norm_eps,
                  c->norm_offset, cb->d_inv_freq + (size_t)layer * (c->rope_dim / 2), c->rope_mscale[layer],
                  c->rope_dim, c->rope_neox, cb->batch.slot, cb->n_slots};
    Err e = {};
    if (cuda_attention_decode_rope(out, q, &cb->kv[layer], &cb->dmeta, p, p->sinks, &cb->work, &r, cb->stream, &e))
        cb_fail(cb, &e);
    return true;
}

/* Wgate|Wup as the one quantized matrix that the dp4a GEMV with the
 * activation fused takes at T rows (one), or NULL. */
static const QuantMatrix *glu_x8_matrix(const CudaBackend *cb, const LayerWeights *lw, int T) {
    const QuantMatrix *W = is_quant(&lw->w_gate) && lw->w_up.data == lw->w_gate.data ? qm_of(&lw->w_gate) : NULL;
    return W && T == 1 && !cb->bi && quant_gemv_takes(QGEMV_X8, W, 1, false) ? W : NULL;
}

/* Decode: one matrix-vector pass over Wgate|Wup with the activation fused;
 * else one GEMM (two when not concatenated) and the GLU kernel. */
static void cuda_be_gate_up(Backend *be, void *out, const void *x, const LayerWeights *lw, int mat, int T,
                            Activation act, float limit) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed) return;
    int F = (int)lw->w_gate.rows, K = (int)lw->w_gate.cols;
    const bf16 *Wg = mat_of(&lw->w_gate, mat), *Wu = mat_of(&lw->w_up, mat);
    const float *bg = vec_of(&lw->b_gate, mat), *bu = vec_of(&lw->b_up, mat);
    bool anyq = is_quant(&lw->w_gate) || is_quant(&lw->w_up);
    const QuantMatrix *qgu = anyq && lw->w_up.data == lw->w_gate.data ? qm_of(&lw->w_gate) : NULL;
    if (glu_x8_matrix(cb, lw, T)) {
        Err e = {}; /* one row: the dp4a GEMV with the activation fused (no GLU kernel) */
        if (quant_gemv_x8_glu(qgu, x, NULL, out, bg, bu, act, limit, cb->stream, &e)) cb_fail(cb, &e);
    } else if (qgu && matmul_route(cb, &lw->w_gate, T) == MM_FP8_GEMV) {
        Err e = {}; /* FP8 Wgate|Wup at decode: the GEMV with the activation fused */
        if (fp8_gemv_glu(qgu, x, NULL, out, bg, bu, act, limit, T, cb->stream, &e)) cb_fail(cb, &e);
    } else if (qgu) { /* one repacked Wgate|Wup: the GLU in the fused GEMM's epilogue, or its kernel after */
        QuantGemmEpi epi = {NULL, true, out, bg, bu, act, limit};
        if (qgemm_epi(cb, (const bf16 *)x, qgu, &epi, T)) return;
        wgemm(cb, cb->scratch, false, (const bf16 *)x, &lw->w_gate, 0, NULL, T);
        cuda_glu((bf16 *)out, cb->scratch, cb->scratch + F, 2 * F, bg, bu, T, F, act, limit, cb->stream);
    } else if (anyq) {
        bf16 *g = cb->scratch, *u = cb->scratch + (int64_t)T * F;
        wgemm(cb, g, false, (const bf16 *)x, &lw->w_gate, mat, NULL, T);
        wgemm(cb, u, false, (const bf16 *)x, &lw->w_up, mat, NULL, T);
        cuda_glu((bf16 *)out, g, u, F, bg, bu, T, F, act, limit, cb->stream);
    } else if (Wu == Wg + (int64_t)F * K && matmul_route(cb, &lw->w_gate, T) == MM_GEMV) {
        cuda_gemv_glu((bf16 *)out, Wg, (const bf16 *)x, bg, bu, F, K, T, act, limit, cb->stream);
    } else if (Wu == Wg + (int64_t)F * K) {
        gemm(cb, cb->scratch, false, (const bf16 *)x, Wg, NULL, 2 * F, T, K);
        cuda_glu((bf16 *)out, cb->scratch, cb->scratch + F, 2 * F, bg, bu, T, F, act, limit, cb->stream);
    } else {
        bf16 *g = cb->scratch, *u = cb->scratch + (int64_t)T * F;
        gemm(cb, g, false, (const bf16 *)x, Wg, NULL, F, T, K);
        gemm(cb, u, false, (const bf16 *)x, Wu, NULL, F, T, K);
        cuda_glu((bf16 *)out, g, u, F, bg, bu, T, F, act, limit, cb->stream);
    }
}

/* Wq|Wk|Wv as the one quantized matrix that the dp4a GEMV takes at T rows
 * (its route), or NULL. */
static const QuantMatrix *qkv_x8_matrix(const CudaBackend *cb, const LayerWeights *lw, int T) {
    const QuantMatrix *W = qkv_quant_matrix(lw);
    return W && matmul_route(cb, &lw->wq, T) == MM_QGEMV_X8 ? W : NULL;
}

/* Whether add_rmsnorm can be folded into a product of width K that reads
 * its output (nothing to add first, the norm as wide as K, a weight, the
 * residual and the weight 16-byte aligned): *rn is then set. The caller
 * checks that its kernel takes rn (shape, rows). */
static bool norm_foldable(const AddNorm *n, int64_t K, RowNorm *rn) {
    if (n->delta || n->C != K || !n->w->data || (uintptr_t)n->x % 16 || (uintptr_t)n->w->data % 16) return false;
    *rn = RowNorm{(const float *)n->x, (const float *)n->w->data, n->eps, n->offset};
    return true;
}

/* The FP8 GEMVs fold the norm at one row only: each block normalizes its T
 * rows one after another, which at T = 8 cost more than the launch it saves
 * (H200, 8B FP8 weights + FP8 KV, batch 8: 5.148 ms a step folded vs 4.800;
 * batch 1: 3.249 vs 3.269). */
#define FP8_NORM_FOLD_MAX_T 1

static void run_add_norm(Backend *be, const AddNorm *n, int T) {
    cuda_be_add_rmsnorm(be, n->x, n->delta, n->out, n->w, T, n->C, n->eps, n->offset);
}

/* The q|k|v GEMV with the norm folded in (the x8 dp4a GEMV at one row;
 * the FP8 and bf16 GEMVs up to their rows): true when it ran. */
static bool qkv_folded(CudaBackend *cb, const AddNorm *n, void *q, void *k, void *v, const LayerWeights *lw, int T) {
    RowNorm rn;
    const QuantMatrix *Wx8 = qkv_x8_matrix(cb, lw, T), *Wq = qkv_quant_matrix(lw);
    const bf16 *Wb = qkv_bf16_matrix(lw);
    if (!norm_foldable(n, lw->wq.cols, &rn)) return false;
    GemvOut out = qkv_out(q, k, v, lw);
    Err e = {};
    if (Wx8) {
        if (quant_gemv_x8(Wx8, NULL, &rn, &out, 1, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    if (Wq && T <= FP8_NORM_FOLD_MAX_T && matmul_route(cb, &lw->wq, T) == MM_FP8_GEMV &&
        fp8_gemv_norm_takes(Wq, &rn, false, T)) {
        if (fp8_gemv(Wq, NULL, &rn, &out, T, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    const int K = (int)lw->wq.cols, M = (int)(lw->wq.rows + lw->wk.rows + lw->wv.rows);
    if (Wb && matmul_route(cb, &lw->wq, T) == MM_GEMV && cuda_gemv_norm_takes(Wb, &rn, K, T)) {
        if (cuda_gemv_parts_norm(&out, Wb, &rn, M, K, T, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    return false;
}

/* Where a GEMV over Q|K|V takes it, that GEMV normalizes x itself (no
 * add_rmsnorm launch); else add_rmsnorm, then qkv. */
static void cuda_be_norm_qkv(Backend *be, const AddNorm *n, void *q, void *k, void *v, const LayerWeights *lw,
                             int T) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed || qkv_folded(cb, n, q, k, v, lw, T)) return;
    run_add_norm(be, n, T);
    cuda_be_qkv(be, q, k, v, n->out, lw, T);
}

/* The gate|up GEMV with the activation and the norm folded in (as
 * qkv_folded): true when it ran. */
static bool gate_up_folded(CudaBackend *cb, const AddNorm *n, void *out, const LayerWeights *lw, int T,
                           Activation act, float limit) {
    RowNorm rn;
    const int F = (int)lw->w_gate.rows, K = (int)lw->w_gate.cols;
    const float *bg = vec_of(&lw->b_gate, 0), *bu = vec_of(&lw->b_up, 0);
    const QuantMatrix *Wx8 = glu_x8_matrix(cb, lw, T);
    const QuantMatrix *Wq = is_quant(&lw->w_gate) && lw->w_up.data == lw->w_gate.data ? qm_of(&lw->w_gate) : NULL;
    const bf16 *Wg = is_quant(&lw->w_gate) || is_quant(&lw->w_up) ? NULL : mat_of(&lw->w_gate, 0);
    if (Wg && mat_of(&lw->w_up, 0) != Wg + (int64_t)F * K) Wg = NULL;
    if (!norm_foldable(n, K, &rn)) return false;
    Err e = {};
    if (Wx8) {
        if (quant_gemv_x8_glu(Wx8, NULL, &rn, out, bg, bu, act, limit, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    if (Wq && T <= FP8_NORM_FOLD_MAX_T && matmul_route(cb, &lw->w_gate, T) == MM_FP8_GEMV &&
        fp8_gemv_norm_takes(Wq, &rn, true, T)) {
        if (fp8_gemv_glu(Wq, NULL, &rn, out, bg, bu, act, limit, T, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    if (Wg && matmul_route(cb, &lw->w_gate, T) == MM_GEMV && cuda_gemv_norm_takes(Wg, &rn, K, T)) {
        if (cuda_gemv_glu_norm((bf16 *)out, Wg, &rn, bg, bu, F, K, T, act, limit, cb->stream, &e)) cb_fail(cb, &e);
        return true;
    }
    return false;
}

/* The same for Wgate|Wup with the activation fused. */
static void cuda_be_norm_gate_up(Backend *be, const AddNorm *n, void *out, const LayerWeights *lw, int T,
                                 Activation act, float limit) {
    CudaBackend *cb = cb_of(be);
    if (cb->failed || gate_up_folded(cb, n, out, lw, T, act, limit)) return;
    run_add_norm(be, n, T);
    cuda_be_gate_up(be, out, n->out, lw, 0, T, act, limit);
}

/* x += the product, stored by the quantized or FP8 GEMV itself (up to 8
 * rows), or by the bf16 one (its rows): then the norm that follows has
 * nothing to add and folds into the next GEMV. Not in the batch-invariant
 * mode, whose GEMM route writes a buffer. */
static bool cuda_be_matmul_add(Backend *be, void *x, const void *in, const WeightRef *w, int mat,
                               const WeightRef *bias, int T) {
    CudaBackend *cb = cb_of(be);
    MatmulRoute r = T >= 1 ? matmul_route(cb, w, T) : MM_CUBLASLT;
    bool bf16_gemv = r == MM_GEMV;
    if (!route_is_qgemv(r) && !bf16_gemv) return false;
    GemvOut out = gemv_out_one(x, true, vec_of(bias, mat), w->rows);
    out.add = true; /* x += bf16(product + bias), as add_rmsnorm adds the bf16 output */
    if (cb->failed) return true;
    if (bf16_gemv) cuda_gemv_parts(&out, mat_of(w, mat), (const bf16 *)in, (int)w->rows, (int)w->cols, T, cb->stream);
    else qgemv(cb, r, (const bf16 *)in, qm_of(w), &out, T);
    return true;
}

/* Top-k of one token's router logits, then a softmax over those k (as
 * gpt-oss routes). */
static void moe_route(const float *lg, int E, int K, int *sel, float *wts) {
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        sel[j] = best;
    }
    float m = lg[sel[0]], sum = 0;
    for (int j = 0; j < K; j++) sum += wts[j] = expf(lg[sel[j]] - m);
    for (int j = 0; j < K; j++) wts[j] /= sum;
}

/* Decode-sized MoE, all on the device (no host sync, so it can be graphed):
 * top-k routing kernel, then one matrix-vector pass per (token, choice) pair
 * over its expert's gate/up (GLU fused) and down rows, then the weighted sum. */
static void moe_decode(CudaBackend *cb, bf16 *out, const bf16 *x, const LayerWeights *lw, int T) {
    const ModelShape *c = cb->shape;
    int K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    Activation act = c->act == ACT_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU;
    cuda_moe_route(cb->moe_idx, cb->moe_w, cb->router, T, c->n_experts, K, cb->stream);
    cuda_gemv_experts(cb->moe_act, mat_of(&lw->w_gate, 0), mat_of(&lw->w_up, 0), vec_of(&lw->b_gate, 0),
                      vec_of(&lw->b_up, 0), x, K, cb->moe_idx, T * K, F, C, act, c->act_limit, cb->stream);
    cuda_gemv_experts(cb->moe_out, mat_of(&lw->w_down, 0), NULL, vec_of(&lw->b_down, 0), NULL, cb->moe_act, 1,
                      cb->moe_idx, T * K, C, F, act, 0, cb->stream);
    cuda_moe_combine(out, cb->moe_out, cb->moe_w, T, K, C, cb->stream);
}

/* MoE: the router runs on the GPU (fp32 logits). Up to GEMV_MAX_T rows
 * the rest does too (moe_decode); larger steps choose the top-k on the host
 * (one sync per layer), list the rows of all experts in one upload, then
 * gather each expert's rows, run its MLP and add them back with their
 * routing weight in fp32. */
static void cuda_be_moe(Backend *be, void *out, const void *x, const LayerWeights *lw, int T) {
    CudaBackend *cb = cb_of(be);
    const ModelShape *c = cb->shape;
    int E = c->n_experts, K = c->n_experts_used, C = c->dim, F = c->ffn_dim;
    wgemm(cb, cb->router, true, (const bf16 *)x, &lw->router, 0, vec_of(&lw->router_bias, 0), T);
    if (T <= GEMV_MAX_T && !cb->bi) { moe_decode(cb, (bf16 *)out, (const bf16 *)x, lw, T); return; }
    op_fail(cb, cudaMemcpyAsync(cb->h_router, cb->router, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost,
                                cb->stream), "router");
    op_fail(cb, cudaStreamSynchronize(cb->stream), "router");
    int *sel = (int *)malloc((size_t)T * K * sizeof(int)), *start = (int *)calloc(E + 1, sizeof(int));
    float *wts = (float *)malloc((size_t)T * K * sizeof(float));
    if (!sel || !wts || !start) op_fail(cb, cudaErrorMemoryAllocation, "moe routing");
    if (cb->failed) { free(sel); free(wts); free(start); return; }
    for (int t = 0; t < T; t++) moe_route(cb->h_router + (int64_t)t * E, E, K, sel + t * K, wts + t * K);
    for (int i = 0; i < T * K; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int e = 0, n = 0; e < E; e++)
        for (int i = 0; i < T * K; i++)
            if (sel[i] == e) { cb->h_idx[n] = i / K; cb->h_w[n] = wts[i]; n++; }
    op_fail(cb, cudaMemcpyAsync(cb->moe_idx, cb->h_idx, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                cb->stream), "moe");
    op_fail(cb, cudaMemcpyAsync(cb->moe_w, cb->h_w, (size_t)T * K * sizeof(float), cudaMemcpyHostToDevice, cb->stream),
            "moe");
    op_fail(cb, cudaMemsetAsync(cb->moe_acc, 0, (size_t)T * C * sizeof(float), cb->stream), "moe");
    Activation act = c->act == ACT_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SILU;
    for (int e = 0; e < E && !cb->failed; e++) {
        int n = start[e + 1] - start[e];
        if (n == 0) continue;
        cuda_gather_rows(cb->moe_rows, (const bf16 *)x, cb->moe_idx + start[e], n, C, cb->stream);
        cuda_be_gate_up(be, cb->moe_act, cb->moe_rows, lw, e, n, act, c->act_limit);
        gemm(cb, cb->moe_out, false, cb->moe_act, mat_of(&lw->w_down, e), vec_of(&lw->b_down, e), C, n, F);
        cuda_scatter_add(cb->moe_acc, cb->moe_out, cb->moe_idx + start[e], cb->moe_w + start[e], n, C, cb->stream);
    }
    cuda_f32_to_bf16((bf16 *)out, cb->moe_acc, (int64_t)T * C, cb->stream);
    free(sel);
    free(wts);
    free(start);
}

static void cuda_be_gather_rows(Backend *be, void *dst, const void *src, int n, int C) {
    CudaBackend *cb = cb_of(be);
    cuda_gather_rows((bf16 *)dst, (const bf16 *)src, cb->d_rows, n, C, cb->stream);
}

static void cuda_be_logits(Backend *be, void *logits, const void *x, const WeightRef *w, int n, float cap) {
    CudaBackend *cb = cb_of(be);
    wgemm(cb, logits, true, (const bf16 *)x, w, 0, NULL, n);
    if (cap > 0) cuda_softcap((float *)logits, (int64_t)n * w->rows, cap, cb->stream);
}

void cuda_layer_ops(Backend *be) {
    be->embed = cuda_be_embed;
    be->add_rmsnorm = cuda_be_add_rmsnorm;
    be->rmsnorm = cuda_be_rmsnorm;
    be->qkv = cuda_be_qkv;
    be->matmul = cuda_be_matmul;
    be->rope_kv_write = cuda_be_rope_kv_write;
    be->attention = cuda_be_attention;
    be->rope_attention = cuda_be_rope_attention;
    be->gate_up = cuda_be_gate_up;
    be->norm_qkv = cuda_be_norm_qkv;
    be->norm_gate_up = cuda_be_norm_gate_up;
    be->matmul_add = cuda_be_matmul_add;
    be->moe = cuda_be_moe;
    be->gather_rows = cuda_be_gather_rows;
    be->logits = cuda_be_logits;
}
