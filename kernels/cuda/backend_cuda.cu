/* backend_cuda.cu — the CUDA backend: the Backend ops of kernels/backend.h
 * on one GPU (backend_cuda.cuh lists the files and what each does).
 *
 * Activations between GEMMs are bf16, the residual stream and logits fp32.
 * Attention runs the kernels of attention.cuh (FlashAttention-style prefill
 * tiles, split-KV decode with each row's splits from its own length) from one
 * metadata buffer built and uploaded per step; a model whose head sizes they
 * lack gets the simple kernel.
 *
 * Batch-invariant mode (BackendOptions.batch_invariant): a row's results do
 * not depend on the other rows of its step. Every GEMM, at every T, is
 * gemm_bi.cuh's (one fixed sum order; quantized matrices dequantized to the
 * bf16 scratch first, also at T <= 8); decode rows take their KV splits from
 * their own length (attn_row_splits); MoE routes on the host at every T. The
 * norms, rope, the prefill attention tiles (key tiles at fixed positions, so
 * also how a prompt is chunked) and the element-wise kernels work per row in
 * both modes. What remains is which kernel a row meets: a run of >= 2 rows
 * is prefill, a lone row decode; the scheduler never makes a prompt chunk of
 * one row (engine.h engine_prompt_chunk), so each token meets the same kernel
 * in any batch.
 *
 * Written C-style: plain structs and functions, extern "C" entry points. */
#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/cuda_libs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The entry points of a step (and buffer calls) make the backend's GPU the
 * thread's current device: pipeline stages on several GPUs share a thread. */
CudaBackend *cb_use(Backend *be) {
    CudaBackend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    return cb;
}

void op_fail(CudaBackend *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess || cb->failed) return;
    cb->failed = true;
    err_set(&cb->err, "CUDA error '%s' in %s (device %d)", cudaGetErrorString(e), what, cb->device);
}

void cb_fail(CudaBackend *cb, const Err *e) {
    if (cb->failed) return;
    cb->failed = true;
    cb->err = *e;
}

/* ---------- buffers ---------- */

static void *cuda_be_alloc(Backend *be, int64_t n, BufKind kind) {
    CudaBackend *cb = cb_use(be);
    void *p = NULL;
    if (n <= 0 || cb->n_bufs == MAX_BUFS) return NULL;
    if (cudaMalloc(&p, n * (kind == BUF_F32 ? sizeof(float) : sizeof(bf16))) != cudaSuccess) return NULL;
    cb->bufs[cb->n_bufs++] = (Buf){p, kind, n};
    return p;
}

/* Captured graphs hold buffer addresses: any release drops them. */
static void cuda_be_release(Backend *be, void *p) {
    CudaBackend *cb = cb_use(be);
    graphs_drop(cb);
    for (int i = 0; i < cb->n_bufs; i++)
        if (cb->bufs[i].ptr == p) { cb->bufs[i] = cb->bufs[--cb->n_bufs]; break; }
    cudaFree(p);
}

static const Buf *buf_of(CudaBackend *cb, const void *p) {
    for (int i = 0; i < cb->n_bufs; i++)
        if (cb->bufs[i].ptr == p) return &cb->bufs[i];
    return NULL;
}

/* Ends the step: copies n values of buf (fp32, or bf16 widened on the host). */
static int cuda_be_read(Backend *be, float *host, const void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    op_fail(cb, cudaGetLastError(), "kernel launch");
    Err je = {};
    if (!cb->failed && deq_ahead_join(&cb->deq, cb->stream, &je)) cb_fail(cb, &je);
    if (!cb->failed && (!b || n > b->n)) return err_set(err, "cuda: read of %lld values from an unknown buffer", (long long)n);
    bf16 *tmp = !cb->failed && n > 0 && b->kind == BUF_ACT ? (bf16 *)malloc(n * sizeof(bf16)) : NULL;
    if (!cb->failed && n > 0 && b->kind == BUF_ACT && !tmp) return err_set(err, "out of memory");
    void *dst = tmp ? (void *)tmp : (void *)host;
    size_t bytes = n * (tmp ? sizeof(bf16) : sizeof(float));
    if (!cb->failed && n > 0) op_fail(cb, cudaMemcpyAsync(dst, buf, bytes, cudaMemcpyDeviceToHost, cb->stream), "read");
    /* a stage or a tensor-parallel rank: its transfers may wait on a peer, so wait with a deadline */
    if (!cb->failed && (cb->link || cb->tp.group)) {
        Err e = {};
        if (cuda_tp_wait(cb, &e)) cb_fail(cb, &e);
    } else if (!cb->failed) op_fail(cb, cudaStreamSynchronize(cb->stream), "step");
    for (int64_t i = 0; tmp && !cb->failed && i < n; i++) host[i] = __bfloat162float(tmp[i]);
    free(tmp);
    if (cb->failed) { *err = cb->err; return -1; }
    return 0;
}

static int cuda_be_write(Backend *be, void *buf, const float *host, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: write of %lld values to an unknown buffer", (long long)n);
    if (n <= 0) return 0;
    /* On the backend's stream, waited for: a plain cudaMemcpy from pageable
     * memory may return before its DMA lands, and the non-blocking stream
     * would not wait for it. */
    bf16 *tmp = b->kind == BUF_F32 ? NULL : (bf16 *)malloc(n * sizeof(bf16));
    if (b->kind != BUF_F32 && !tmp) return err_set(err, "out of memory");
    for (int64_t i = 0; tmp && i < n; i++) tmp[i] = __float2bfloat16(host[i]);
    cudaError_t e = cudaMemcpyAsync(buf, tmp ? (const void *)tmp : (const void *)host,
                                    n * (tmp ? sizeof(bf16) : sizeof(float)), cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
    free(tmp);
    CUDA_CHECK(e, err);
    return 0;
}

/* Rows of a step whose logits stay on the device: the GPU sampler draws
 * them and only the token ids come back (a 256-row step of a 128k
 * vocabulary would otherwise copy 131 MB to the host). */
static int cuda_be_sample(Backend *be, void *logits, int n, const SampleRow *rows, int32_t *tokens, bool *drew,
                          Err *err) {
    CudaBackend *cb = cb_use(be);
    if (cb->failed) { *err = cb->err; return -1; }
    if (n <= 0) return 0;
    if (!cb->sampler_built) {
        if (gpu_sampler_build(&cb->sampler, cb->max_seqs, cb->shape->vocab, 256 * cb->max_seqs, err)) return -1;
        cb->sampler_built = true;
    }
    if (n > cb->sampler.max_rows) return 1;
    Err why = {};
    for (int r = 0; r < n; r++)
        if (gpu_sampler_set_row(&cb->sampler, r, &rows[r], &why)) return 1; /* e.g. top_k above the GPU limit */
    if (gpu_sampler_run(&cb->sampler, (float *)logits, n, cb->stream, err)) return -1;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
    memcpy(tokens, cb->sampler.h_out, n * sizeof(int32_t));
    for (int r = 0; r < n; r++) drew[r] = cb->sampler.h_out[cb->sampler.max_rows + r] != 0;
    return 0;
}

/* ---------- pipeline links (nccl_link.h) ---------- */

static void cuda_destroy(Backend *be);

static int cuda_be_send_next(Backend *be, const void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: send of %lld values from an unknown buffer", (long long)n);
    if (cb->failed) { *err = cb->err; return -1; }
    return nccl_link_send(cb->link, cb->link_rank, buf, (size_t)n, b->kind == BUF_ACT, cb->link_rank + 1, cb->stream,
                          err);
}

static int cuda_be_recv_prev(Backend *be, void *buf, int64_t n, Err *err) {
    CudaBackend *cb = cb_use(be);
    const Buf *b = buf_of(cb, buf);
    if (!b || n > b->n) return err_set(err, "cuda: receive of %lld values into an unknown buffer", (long long)n);
    if (cb->failed) { *err = cb->err; return -1; }
    return nccl_link_recv(cb->link, cb->link_rank, buf, (size_t)n, b->kind == BUF_ACT, cb->link_rank - 1, cb->stream,
                          err);
}

extern "C" int backend_cuda_link(Backend *be, NcclGroup *g, int rank, Err *err) {
    if (!be || be->destroy != cuda_destroy) return err_set(err, "nccl: stage %d is not on a CUDA backend", rank);
    CudaBackend *cb = cb_of(be);
    cb->link = g;
    cb->link_rank = rank;
    be->send_next = cuda_be_send_next;
    be->recv_prev = cuda_be_recv_prev;
    return 0;
}

static void cuda_destroy(Backend *be) {
    CudaBackend *cb = cb_of(be);
    cudaSetDevice(cb->device);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    if (cb->sampler_built) gpu_sampler_free(&cb->sampler);
    cuda_overlap_free(cb);
    graphs_drop(cb);
    deq_ahead_free(&cb->deq);
    fp8_gemm_free(&cb->fp8);
    cuda_tp_free(cb);
    free(cb->qnext);
    free(cb->kv_calib);
    for (int i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
    for (int i = 0; i < cb->n_bufs; i++) cudaFree(cb->bufs[i].ptr);
    void *dev[] = {cb->d_ids, cb->d_pos, cb->d_seq, cb->d_tables, cb->d_slot, cb->d_rows, cb->scratch, cb->router,
                   cb->moe_w, cb->moe_acc, cb->moe_idx, cb->moe_rows, cb->moe_act, cb->moe_out, cb->workspace,
                   cb->d_inv_freq, cb->kv_pool, cb->d_kv_calib, cb->d_meta, cb->work.part, cb->qnative, cb->qwork.buf};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    void *pinned[] = {cb->h_ids, cb->h_pos, cb->h_seq, cb->h_slot, cb->h_rows, cb->h_tables, cb->h_router, cb->h_w,
                      cb->h_idx, cb->h_meta};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) cudaFreeHost(pinned[i]);
    gemm_plans_free(cb);
    if (cb->lt) cublaslt_lib(NULL)->Destroy(cb->lt); /* made: the library is loaded */
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb->kv);
    free(cb->kv_maps);
    free(cb->h_need);
    free(cb->meta_seq);
    free(cb->meta_tables);
    attn_meta_free(&cb->meta);
    cascade_free(cb);
    free(cb->allocs);
    free(cb->qm);
    free(cb->w.layers);
    free(cb);
    free(be);
}

/* ---------- creation ---------- */

/* The choices made once: the checks' switches, whether the fused quantized
 * GEMM can run here, and CLLM_PROFILE_STEPS (the one knob: which steps the
 * profiler records). */
static int read_tuning(CudaTuning *t, const BackendOptions *o, const CudaChecks *ck, Err *err) {
    memset(t, 0, sizeof *t);
    t->graphs = !(ck && ck->no_graphs);
    t->rope_in_decode = !(ck && ck->rope_apart);
    t->quant_gemm = !o->batch_invariant && quant_gemm_available();
    int dev = 0, major = 0, minor = 0; /* FP8 tensor cores: Ada (8.9) and newer */
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
        t->fp8_gemm = !o->batch_invariant && major * 10 + minor >= 89;
    const char *ps = getenv("CLLM_PROFILE_STEPS");
    if (ps && *ps && (sscanf(ps, "%d,%d", &t->prof_first, &t->prof_count) != 2 || t->prof_first < 0 ||
                      t->prof_count < 1))
        return err_set(err, "CLLM_PROFILE_STEPS '%s': not FIRST,COUNT (0-based steps)", ps);
    return 0;
}

/* The stream (above dequant_ahead's side stream), cuBLASLt (loaded here,
 * cuda_libs.h) and its workspace, the fused GEMM's split-K scratch. */
static int open_device(CudaBackend *cb, int device, Err *err) {
    int least = 0, greatest = 0, sms = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return err_set(err, "cuda: cannot use device %d: %s", device, cudaGetErrorString(e));
    const CublasLt *lt = cublaslt_lib(err);
    if (!lt) return -1;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), err);
    CUDA_CHECK(cudaStreamCreateWithPriority(&cb->stream, cudaStreamNonBlocking, greatest), err);
    if (lt->Create(&cb->lt) != CUBLAS_STATUS_SUCCESS) return err_set(err, "cuBLASLt: cannot initialize");
    cb->workspace_bytes = (size_t)32 << 20;
    CUDA_CHECK(cudaMalloc(&cb->workspace, cb->workspace_bytes), err);
    if (!cb->tune.quant_gemm) return 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), err);
    cb->qwork.bytes = quant_gemm_work_bytes(sms);
    CUDA_CHECK(cudaMalloc(&cb->qwork.buf, cb->qwork.bytes), err);
    CUDA_CHECK(cudaMemset(cb->qwork.buf, 0, cb->qwork.bytes), err);
    return 0;
}

extern "C" Backend *backend_cuda_create(const ModelShape *c, const ModelWeights *host, const BackendOptions *o,
                                        const CudaChecks *checks, Err *err) {
    return backend_cuda_create_rank(c, host, o, checks, NULL, err);
}

extern "C" Backend *backend_cuda_create_rank(const ModelShape *c, const ModelWeights *host, const BackendOptions *o,
                                             const CudaChecks *checks, NcclGroup *comm, Err *err) {
    Backend *be = (Backend *)calloc(1, sizeof *be);
    CudaBackend *cb = (CudaBackend *)calloc(1, sizeof *cb);
    if (!be || !cb) { free(be); free(cb); err_set(err, "out of memory"); return NULL; }
    be->ctx = cb;
    be->destroy = cuda_destroy;
    cb->device = o->device;
    cb->shape = c;
    cb->max_tokens = o->max_tokens > 0 ? o->max_tokens : 1;
    cb->bf16_weights = o->bf16_weights;
    cb->bi = o->batch_invariant;
    cb->kv_dtype = o->kv_dtype; /* attn_alloc_work sizes the decode splits by it */
    cb->bucket = -1;
    int rc = o->block_size > 0 ? 0 : err_set(err, "cuda: block size %d", o->block_size);
    cudaError_t e = rc ? cudaSuccess : cudaSetDevice(o->device); /* quant_gemm_available asks the current device */
    if (e != cudaSuccess) rc = err_set(err, "cuda: cannot use device %d: %s", o->device, cudaGetErrorString(e));
    if (rc == 0) rc = cuda_device_supported(o->device, err); /* before any kernel: an older GPU has none of them */
    if (rc == 0) rc = read_tuning(&cb->tune, o, checks, err);
    if (rc == 0) rc = open_device(cb, o->device, err);
    if (rc == 0) rc = upload_model(cb, c, host, &be->load_gbps, err);
    if (rc == 0) rc = cuda_alloc_step(cb, c, err);
    if (rc == 0 && o->tp_group) rc = cuda_tp_init(cb, c, o, comm, err);
    if (rc == 0) rc = attn_alloc_work(cb, c, o->block_size, checks && checks->generic_attention, err);
    if (rc == 0) rc = cuda_alloc_kv(cb, c, o, err);
    if (rc == 0) rc = attn_alloc_meta(cb, err);
    if (rc == 0) rc = cuda_overlap_init(be, err);
    if (rc) { cuda_destroy(be); return NULL; }
    snprintf(cb->name, sizeof cb->name, "cuda:%d%s", o->device, cb->bi ? "+bi" : "");
    be->name = cb->name;
    be->device = o->device;
    be->weights = &cb->w;
    be->weight_bytes = cb->weight_bytes;
    be->kv_block_size = o->block_size;
    be->kv_n_blocks = (int)(cb->n_slots / o->block_size);
    be->alloc = cuda_be_alloc;
    be->release = cuda_be_release;
    be->begin_step = cuda_be_begin_step;
    be->graph_replay = cuda_be_graph_replay;
    be->graph_capture = cuda_be_graph_capture;
    be->read = cuda_be_read;
    be->write = cuda_be_write;
    be->sample = cuda_be_sample;
    cuda_layer_ops(be);
    if (o->tp_group) cuda_tp_ops(be);
    return be;
}
