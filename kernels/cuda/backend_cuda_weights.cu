/* backend_cuda_weights.cu — the weights' upload to the GPU, once.
 *
 * Matrices of any file dtype become bf16 (dequantized on the host by a
 * thread pool into pinned staging buffers, two alternating so converting
 * overlaps the copy); vectors fp32. Each layer's Wq|Wk|Wv and Wgate|Wup go
 * back to back, one GEMM each. Matrices of a type quant.cuh reads (Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) stay in their blocks instead:
 * the file's bytes are copied up and repacked on the device, a concatenation of one
 * type as one matrix; their WeightRef keeps the file's type and row_bytes and
 * points at a QuantMatrix. F8_E4M3 matrices (FP8 checkpoints) stay too, as
 * their codes plus their fp32 row scales (WeightRef.scale), a group of them
 * concatenated like any other when their static input scales agree.
 * Embedding tables and stacked MoE experts stay bf16; BackendOptions.
 * bf16_weights makes every matrix bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/weight_rows.h"

static int cb_track(CudaBackend *cb, void *p, Err *err) {
    if (cb->n_allocs == cb->cap_allocs) {
        int cap = cb->cap_allocs ? 2 * cb->cap_allocs : 256;
        void **a = (void **)realloc(cb->allocs, cap * sizeof *a);
        if (!a) return err_set(err, "out of memory");
        cb->allocs = a;
        cb->cap_allocs = cap;
    }
    cb->allocs[cb->n_allocs++] = p;
    return 0;
}

typedef struct {
    void *pinned[2];
    cudaEvent_t done[2];
    int cur;
    uint64_t bytes;      /* uploaded */
    ThreadPool *tp;      /* converts rows in parallel (the file's dtype to bf16) */
} Staging;

/* Rows [a, b) of a staging chunk: src rows r0 + a.. of hw, out rows a.. of dst. */
typedef struct {
    const WeightRef *hw;
    char *dst;
    int64_t r0;
    size_t row_out;
    bool vec, raw;       /* raw: the file's bytes as they are (quantized matrices) */
} ConvertJob;

/* Each source row is read where it lies (weight_rows.h: a tensor-parallel
 * column slice's rows are the model's row stride apart). */
static void convert_rows(void *ctx, int64_t a, int64_t b) {
    const ConvertJob *j = (const ConvertJob *)ctx;
    const WeightRef *hw = j->hw;
    if (j->raw || (!j->vec && hw->type == DT_BF16)) { /* bf16: already the device format, row_out its row_bytes */
        weight_rows_gather(hw, j->r0 + a, b - a, j->dst + a * j->row_out);
        return;
    }
    float *tmp = j->vec || hw->type == DT_F8_E4M3 ? NULL : (float *)malloc(hw->cols * sizeof(float));
    for (int64_t r = a; r < b; r++) {
        const void *src = weight_row(hw, j->r0 + r);
        char *out = j->dst + r * j->row_out;
        if (j->vec) {
            dequantize_row(hw->type, src, (float *)out, hw->cols);
        } else if (hw->type == DT_F8_E4M3) { /* code x its row's scale, in fp32 as the host's dequantization */
            const uint8_t *q = (const uint8_t *)src;
            const float sc = hw->scale ? hw->scale[j->r0 + r] : NAN; /* no scales: NaN, seen downstream */
            uint16_t *o = (uint16_t *)out;
            for (int64_t c = 0; c < hw->cols; c++) o[c] = fp32_to_bf16(e4m3_to_fp32(q[c]) * sc);
        } else if (tmp) {
            dequantize_row(hw->type, src, tmp, hw->cols);
            uint16_t *o = (uint16_t *)out;
            for (int64_t c = 0; c < hw->cols; c++) o[c] = fp32_to_bf16(tmp[c]);
        } else { /* no memory for the row: NaN, which the checks downstream see */
            for (int64_t c = 0; c < hw->cols; c++) ((uint16_t *)out)[c] = 0x7fc0;
        }
    }
    free(tmp);
}

/* Copies the rows of a host WeightRef to dev, each converted to row_out
 * bytes (raw: copied as they are; vec: fp32; else bf16), staging through
 * pinned memory (two buffers: the pool converts a chunk while the previous
 * one is copied). */
static int stage_rows(CudaBackend *cb, Staging *stg, const WeightRef *hw, void *dev, size_t row_out, bool vec,
                      bool raw, Err *err) {
    int64_t rows = hw->rows * hw->n_mats;
    size_t rows_per_chunk = STAGING_BYTES / row_out;
    if (rows_per_chunk == 0) return err_set(err, "tensor '%s' row too large to stage", hw->name);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
        int64_t nr = rows - r0 < (int64_t)rows_per_chunk ? rows - r0 : (int64_t)rows_per_chunk;
        int b = stg->cur;
        CUDA_CHECK(cudaEventSynchronize(stg->done[b]), err); /* the buffer's previous copy finished */
        ConvertJob job = {hw, (char *)stg->pinned[b], r0, row_out, vec, raw};
        cpu_parallel_for(stg->tp, nr, convert_rows, &job);
        CUDA_CHECK(cudaMemcpyAsync((char *)dev + r0 * row_out, job.dst, nr * row_out, cudaMemcpyHostToDevice,
                                   cb->stream), err);
        CUDA_CHECK(cudaEventRecord(stg->done[b], cb->stream), err);
        stg->cur ^= 1;
        stg->bytes += nr * row_out;
    }
    return 0;
}

/* Converts a host WeightRef (any dtype) to bf16 (matrices) or fp32 (vectors)
 * on the device; into dst when given (a slot of a concatenated matrix), else
 * into its own allocation. */
static int upload_weight(CudaBackend *cb, Staging *stg, const WeightRef *hw, WeightRef *dw, void *dst_dev, Err *err) {
    *dw = *hw;
    if (!hw->data) return 0;
    bool vec = hw->rows == 1;
    size_t elem = vec ? sizeof(float) : sizeof(__nv_bfloat16);
    size_t row_out = (size_t)hw->cols * elem, total = row_out * hw->rows * hw->n_mats;
    void *dev = dst_dev;
    if (!dev) {
        CUDA_CHECK(cudaMalloc(&dev, total), err);
        if (cb_track(cb, dev, err)) return -1;
        cb->weight_bytes += total;
    }
    if (stage_rows(cb, stg, hw, dev, row_out, vec, false, err)) return -1;
    dw->data = dev;
    dw->type = vec ? DT_F32 : DT_BF16;
    dw->row_bytes = row_out;
    dw->scale = NULL; /* an F8_E4M3 matrix's scales are in its bf16 values now */
    dw->input_scale = 0.0f;
    dw->src_stride = 0;
    return 0;
}

/* Whether a host matrix stays in its blocks on the device (expert stacks,
 * vectors and the embedding table never do). */
static bool keep_quant(bool bf16_weights, const WeightRef *w) {
    if (w->type == DT_F8_E4M3 && (w->cols % 16 || !w->scale || w->row_bytes != (uint64_t)w->cols))
        return false; /* the GEMV's 16-byte loads need rows of whole 16-byte chunks: bf16 otherwise */
    return !bf16_weights && w->data && w->n_mats == 1 && w->rows > 1 && quant_type_supported(w->type);
}

/* Matrices that are uploaded back to back (one GEMM for all): Wq|Wk|Wv and
 * Wgate|Wup when each is one plain matrix of the same input width, and all
 * stay in blocks of one type or all become bf16. A mixed group (Q4_K_M
 * files: Wv in Q6_K in about half the layers) is uploaded matrix by matrix,
 * each kept quantized: concatenated it would have to be bf16 (3.5x the
 * bytes of Q4_K, read every decode step). */
static bool can_concat(bool bf16_weights, const WeightRef *const *m, int n) {
    for (int i = 0; i < n; i++) {
        if (!m[i]->data || m[i]->n_mats != 1 || m[i]->rows <= 1 || m[i]->cols != m[0]->cols) return false;
        bool q = keep_quant(bf16_weights, m[i]), q0 = keep_quant(bf16_weights, m[0]);
        if (q != q0 || (q && m[i]->type != m[0]->type)) return false;
        if (q && m[i]->input_scale != m[0]->input_scale) return false; /* FP8: one x quantization for all */
    }
    return true;
}

/* n F8_E4M3 matrices of one width (and input scale) as one: their codes
 * back to back in the qs plane, each row as the file has it, their row
 * scales back to back in sc. Each dst keeps its file type and shape, points
 * at slot, and its scale at its rows' device scales. */
static int upload_fp8(CudaBackend *cb, Staging *stg, const WeightRef *const *src, WeightRef *const *dst, int n,
                      QuantMatrix *slot, Err *err) {
    int64_t rows = 0, cols = src[0]->cols;
    for (int i = 0; i < n; i++) rows += src[i]->rows;
    size_t bytes = 0;
    Err why = {};
    if (quant_matrix_bytes(DT_F8_E4M3, rows, cols, &bytes, &why))
        return err_set(err, "tensor '%s': %s", src[0]->name, why.msg);
    void *buf = NULL;
    CUDA_CHECK(cudaMalloc(&buf, bytes), err);
    if (cb_track(cb, buf, err)) return -1;
    cb->weight_bytes += bytes;
    if (quant_matrix_init(slot, DT_F8_E4M3, rows, cols, buf, err)) return -1;
    slot->input_scale = src[0]->input_scale;
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        if (!src[i]->scale) return err_set(err, "tensor '%s': F8_E4M3 without its scales", src[i]->name);
        char *codes = (char *)slot->qs + r0 * cols;
        float *scales = (float *)slot->sc + r0;
        if (stage_rows(cb, stg, src[i], codes, (size_t)cols, false, true, err)) return -1;
        /* pageable source: the call returns once the bytes are staged, and the host copy outlives the upload */
        CUDA_CHECK(cudaMemcpyAsync(scales, src[i]->scale, (size_t)src[i]->rows * sizeof(float), cudaMemcpyHostToDevice,
                                   cb->stream), err);
        *dst[i] = *src[i];
        dst[i]->data = slot;
        dst[i]->src_stride = 0; /* packed on the device */
        dst[i]->scale = scales; /* on the device now */
        r0 += src[i]->rows;
    }
    if (cols > cb->fp8_max_cols) cb->fp8_max_cols = cols;
    /* the bf16 scratch, where FP8 GEMMs dequantize first (no FP8 tensor cores, or the batch-invariant mode) */
    if ((cb->bi || !cb->tune.fp8_gemm) && rows * cols > cb->deq_elems) cb->deq_elems = rows * cols;
    return 0;
}

/* Uploads n quantized matrices of one type and width as one repacked
 * matrix in slot: their file bytes back to back (rows are independent, so
 * they form one [sum rows][cols] tensor) into the qnative buffer, then
 * quant_repack. Each dst keeps its file type, shape and row_bytes and
 * points at slot (qkv / gate_up find the concatenation that way). */
static int upload_quant(CudaBackend *cb, Staging *stg, const WeightRef *const *src, WeightRef *const *dst, int n,
                        QuantMatrix *slot, Err *err) {
    if (src[0]->type == DT_F8_E4M3) return upload_fp8(cb, stg, src, dst, n, slot, err);
    int64_t rows = 0, cols = src[0]->cols;
    for (int i = 0; i < n; i++) rows += src[i]->rows;
    size_t native = (size_t)rows * src[0]->row_bytes, bytes = 0;
    if (native > cb->qnative_cap) { /* grows to the largest; upload only */
        CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
        CUDA_CHECK(cudaFree(cb->qnative), err);
        cb->qnative = NULL;
        CUDA_CHECK(cudaMalloc(&cb->qnative, native), err);
        cb->qnative_cap = native;
    }
    void *buf = NULL;
    Err why = {};
    if (quant_matrix_bytes(src[0]->type, rows, cols, &bytes, &why)) return err_set(err, "tensor '%s': %s", src[0]->name, why.msg);
    CUDA_CHECK(cudaMalloc(&buf, bytes), err);
    if (cb_track(cb, buf, err)) return -1;
    cb->weight_bytes += bytes;
    if (quant_matrix_init(slot, src[0]->type, rows, cols, buf, err)) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (stage_rows(cb, stg, src[i], (char *)cb->qnative + off, src[i]->row_bytes, false, true, err)) return -1;
        off += (size_t)src[i]->rows * src[i]->row_bytes;
        *dst[i] = *src[i];
        dst[i]->data = slot;
        dst[i]->src_stride = 0; /* packed on the device */
    }
    if (quant_repack(slot, cb->qnative, cb->stream, err)) return -1;
    int64_t deq = rows * cols; /* the bf16 scratch of the GEMMs that dequantize first */
    if (deq > cb->deq_elems) cb->deq_elems = deq;
    return 0;
}

/* n matrices that can_concat: one quantized matrix, or one bf16 buffer */
static int upload_concat(CudaBackend *cb, Staging *stg, const WeightRef *const *src, WeightRef *const *dst, int n,
                         QuantMatrix *slot, Err *err) {
    if (keep_quant(cb->bf16_weights, src[0])) return upload_quant(cb, stg, src, dst, n, slot, err);
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += src[i]->rows;
    char *base;
    CUDA_CHECK(cudaMalloc(&base, (size_t)rows * src[0]->cols * sizeof(bf16)), err);
    if (cb_track(cb, base, err)) return -1;
    cb->weight_bytes += (size_t)rows * src[0]->cols * sizeof(bf16);
    for (int i = 0; i < n; i++) {
        if (upload_weight(cb, stg, src[i], dst[i], base, err)) return -1;
        base += (size_t)src[i]->rows * src[i]->cols * sizeof(bf16);
    }
    return 0;
}

/* A layer's weights; slots: its LAYER_REFS QuantMatrix slots, one per
 * WeightRef (a concatenation uses the slot of its first matrix). */
static int upload_layer(CudaBackend *cb, Staging *stg, const LayerWeights *h, LayerWeights *d, QuantMatrix *slots,
                        Err *err) {
    const WeightRef *qkv[3] = {&h->wq, &h->wk, &h->wv}, *gu[2] = {&h->w_gate, &h->w_up};
    WeightRef *dqkv[3] = {&d->wq, &d->wk, &d->wv}, *dgu[2] = {&d->w_gate, &d->w_up};
    const WeightRef *src = (const WeightRef *)h;
    WeightRef *dst = (WeightRef *)d;
    bool cat_qkv = can_concat(cb->bf16_weights, qkv, 3), cat_gu = can_concat(cb->bf16_weights, gu, 2);
    if (cat_qkv && upload_concat(cb, stg, qkv, dqkv, 3, &slots[&h->wq - src], err)) return -1;
    if (cat_gu && upload_concat(cb, stg, gu, dgu, 2, &slots[&h->w_gate - src], err)) return -1;
    for (int i = 0; i < LAYER_REFS; i++) {
        bool done = (cat_qkv && (&src[i] == qkv[0] || &src[i] == qkv[1] || &src[i] == qkv[2])) ||
                    (cat_gu && (&src[i] == gu[0] || &src[i] == gu[1]));
        if (done) continue;
        const WeightRef *one[1] = {&src[i]};
        WeightRef *dst1[1] = {&dst[i]};
        int rc = keep_quant(cb->bf16_weights, &src[i]) ? upload_quant(cb, stg, one, dst1, 1, &slots[i], err)
                                                       : upload_weight(cb, stg, &src[i], &dst[i], NULL, err);
        if (rc) return -1;
    }
    return 0;
}

/* The bf16 scratch of quantized GEMMs that dequantize first:
 * DEQ_AHEAD_BUFFERS buffers of the largest quantized matrix
 * (dequant_ahead.cuh), at most DEQ_MAX_BYTES each (larger ones are done in
 * row chunks). */
static int alloc_deq(CudaBackend *cb, Err *err) {
    if (cb->deq_elems == 0) return 0;
    if (cb->deq_elems * (int64_t)sizeof(bf16) > (int64_t)DEQ_MAX_BYTES) cb->deq_elems = DEQ_MAX_BYTES / sizeof(bf16);
    return deq_ahead_init(&cb->deq, cb->deq_elems, DEQ_AHEAD_BUFFERS, err);
}

/* qnext: the order in which a step multiplies the quantized matrices (q|k|v,
 * o, gate|up, down, then the next layer's), so each GEMM knows which matrix
 * to dequantize ahead. A wrong guess costs time, never values. */
static int order_quant(CudaBackend *cb, int n_layers, Err *err) {
    size_t n = (size_t)n_layers * LAYER_REFS + 1;
    cb->qnext = (const QuantMatrix **)calloc(n, sizeof *cb->qnext);
    if (!cb->qnext) return err_set(err, "out of memory");
    const QuantMatrix *prev = NULL;
    for (int l = 0; l < n_layers; l++) {
        const LayerWeights *lw = &cb->w.layers[l];
        const WeightRef *order[7] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++) {
            if (!is_quant(order[i]) || qm_of(order[i]) == prev) continue;
            if (prev) cb->qnext[prev - cb->qm] = qm_of(order[i]);
            prev = qm_of(order[i]);
        }
    }
    return 0;
}

/* The first row of the embedding table the LM head is, when it is rows of
 * the table (tied; or a tensor-parallel rank's vocabulary range of a tied
 * head, tp_plan.h): it is then a view of the device table, computed as one
 * GPU computes the tied head. -1: a matrix of its own. */
static int64_t head_table_row(const ModelWeights *w) {
    const WeightRef *t = &w->tok_embd, *o = &w->output;
    if (!o->data || !t->data || o->type != t->type || o->cols != t->cols || o->row_bytes != t->row_bytes ||
        t->row_bytes == 0)
        return -1;
    uintptr_t a = (uintptr_t)t->data, b = (uintptr_t)o->data;
    if (b < a || (b - a) % t->row_bytes) return -1;
    int64_t r0 = (int64_t)((b - a) / t->row_bytes);
    return r0 + o->rows <= t->rows ? r0 : -1;
}

int upload_model(CudaBackend *cb, const ModelShape *c, const ModelWeights *host, double *gbps, Err *err) {
    Staging stg = {};
    int rc = 0;
    stg.tp = thread_pool_create(0, err);
    if (!stg.tp) rc = -1;
    for (int b = 0; rc == 0 && b < 2; b++) {
        cudaError_t e = cudaMallocHost(&stg.pinned[b], STAGING_BYTES);
        if (e == cudaSuccess) e = cudaEventCreate(&stg.done[b]);
        if (e == cudaSuccess) e = cudaEventRecord(stg.done[b], cb->stream);
        if (e != cudaSuccess) rc = err_set(err, "CUDA error '%s' preparing the weight upload", cudaGetErrorString(e));
    }
    double t0 = now_seconds();
    cb->w.layers = (LayerWeights *)calloc(c->n_layers, sizeof *cb->w.layers);
    QuantMatrix *head = NULL;
    cb->qm = (QuantMatrix *)calloc((size_t)c->n_layers * LAYER_REFS + 1, sizeof *cb->qm);
    if (rc == 0 && (!cb->w.layers || !cb->qm)) rc = err_set(err, "out of memory");
    else head = &cb->qm[(size_t)c->n_layers * LAYER_REFS];
    /* the embedding table stays bf16: a lookup reads T rows, and a tied LM head shares it */
    if (rc == 0) rc = upload_weight(cb, &stg, &host->tok_embd, &cb->w.tok_embd, NULL, err);
    if (rc == 0) rc = upload_weight(cb, &stg, &host->output_norm, &cb->w.output_norm, NULL, err);
    const WeightRef *out1[1] = {&host->output};
    WeightRef *dout1[1] = {&cb->w.output};
    int64_t head_row = head_table_row(host);
    if (rc == 0 && head_row >= 0) { /* the table's rows, bf16 on the device */
        cb->w.output = cb->w.tok_embd;
        cb->w.output.data = (const bf16 *)cb->w.tok_embd.data + head_row * cb->w.tok_embd.cols;
        cb->w.output.rows = host->output.rows;
        cb->w.output.name = host->output.name;
    } else if (rc == 0 && keep_quant(cb->bf16_weights, &host->output)) rc = upload_quant(cb, &stg, out1, dout1, 1, head, err);
    else if (rc == 0) rc = upload_weight(cb, &stg, &host->output, &cb->w.output, NULL, err);
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        rc = upload_layer(cb, &stg, &host->layers[l], &cb->w.layers[l], &cb->qm[(size_t)l * LAYER_REFS], err);
    cb->w.rope_freqs = host->rope_freqs; /* the model read it into ModelShape's tables */
    cudaError_t e = cudaStreamSynchronize(cb->stream);
    if (rc == 0 && e != cudaSuccess) rc = err_set(err, "CUDA error '%s' uploading weights", cudaGetErrorString(e));
    cudaFree(cb->qnative);
    cb->qnative = NULL;
    if (rc == 0) rc = alloc_deq(cb, err);
    if (rc == 0) rc = order_quant(cb, c->n_layers, err);
    double s = now_seconds() - t0;
    if (gbps) *gbps = s > 0 ? stg.bytes / s / 1e9 : 0;
    for (int b = 0; b < 2; b++) {
        if (stg.pinned[b]) cudaFreeHost(stg.pinned[b]);
        if (stg.done[b]) cudaEventDestroy(stg.done[b]);
    }
    if (stg.tp) thread_pool_destroy(stg.tp);
    return rc;
}

/* Device bytes of one host weight as upload_model stores it (quantized
 * concatenations differ from the sum of their parts by plane alignment
 * only: at most 512 bytes). */
static uint64_t ref_device_bytes(const WeightRef *w, bool bf16_weights) {
    if (!w->data) return 0;
    size_t qb = 0;
    Err why = {};
    if (keep_quant(bf16_weights, w) && quant_matrix_bytes(w->type, w->rows, w->cols, &qb, &why) == 0) return qb;
    return (uint64_t)w->rows * w->cols * w->n_mats * (w->rows == 1 ? sizeof(float) : sizeof(bf16));
}

extern "C" uint64_t cuda_weight_bytes_planned(const ModelShape *c, const ModelWeights *w, bool bf16_weights) {
    uint64_t b = ref_device_bytes(&w->tok_embd, true) + ref_device_bytes(&w->output_norm, true);
    if (head_table_row(w) < 0) b += ref_device_bytes(&w->output, bf16_weights);
    for (int l = 0; l < c->n_layers; l++) {
        const WeightRef *r = (const WeightRef *)&w->layers[l];
        for (int i = 0; i < LAYER_REFS; i++) b += ref_device_bytes(&r[i], bf16_weights);
    }
    return b;
}

