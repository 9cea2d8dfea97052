/* backend_cuda_tp.cu — a CUDA backend as a rank of a tensor-parallel group
 * (backend_cuda.h backend_cuda_create_rank): its all_reduce, all_gather and
 * matmul_all_reduce, over one of two transports.
 *
 * NCCL (the ranks on distinct GPUs of this process): every rank's part is
 * all-gathered side by side (in place: each rank's part lies at its own
 * offset of the gather buffer), then tp_sum.cu adds the parts in rank order
 * in fp32 and rounds once, so every rank gets the same bits — the host
 * transport's bits. With --tp-nccl-sum, one ncclAllReduce instead (NCCL's
 * order, bf16 parts: faster, not rank-ordered). The collectives run on the
 * backend's stream and are captured into the decode steps' CUDA graphs like
 * its kernels (NCCL supports stream capture, thread-local as
 * backend_cuda_step.cu captures, a thread per GPU). NCCL asks that whether
 * a collective is captured be the same on every rank: it is, since every
 * rank decides from the same step (its bucket, the cascade plan, the
 * calibration) on GPUs of one kind. CLLM_TP_GRAPHS=off issues every step
 * instead: to compare, or where a driver / NCCL pair misbehaves.
 *
 * NVLink peers (the GPUs map each other's memory, nccl_peer_open): a
 * reduce of up to PEER_MAX_VALUES is one kernel on every rank that reads
 * every rank's part where it lies and adds them in rank order
 * (tp_peer_sum.cu): the same bits as the NCCL path, without its all-gather's
 * latency, which dominates the two reduces a layer of a decode step needs.
 *
 * Host memory (several ranks on one GPU, or no NCCL): a rank's part is
 * copied to pinned host memory, summed by kernels/tp_group.c (rank order,
 * fp32) and copied back. Each reduce waits for the stream, so a rank on it
 * runs no CUDA graphs. Slow, and the same on any GPUs.
 *
 * matmul_all_reduce keeps each rank's product in fp32 until the sum, rounded
 * once: the result differs from one GPU's product only by the association
 * of fp32 sums (a bf16 part per rank would add a rounding per rank). A rank
 * that fails breaks the group (tp_group_abort), so no rank waits for it: a
 * host reduce returns at once, an NCCL wait aborts the communicators. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.cuh"
#include "kernels/cuda/tp_sum.cuh"

/* Rows of logits a step may gather: cuda_alloc_step's max_seqs (forward.h FORWARD_MAX_LOGITS). */
static int logit_rows_max(int max_tokens) { return max_tokens < 1024 ? max_tokens : 1024; }

/* fp32 values of the device gather buffer: NCCL, every rank's part of the
 * largest reduce (max_tokens rows of dim) or of the logits (padded to the
 * widest rank's columns); the host transport, this rank's fp32 product. */
static int64_t gather_elems(const ModelShape *c, int n_ranks, int max_tokens, bool nccl) {
    int T = max_tokens > 0 ? max_tokens : 1;
    int64_t reduce = (int64_t)T * c->dim, colmax = (c->vocab + n_ranks - 1) / n_ranks;
    int64_t logits = (int64_t)logit_rows_max(T) * colmax;
    if (!nccl) return reduce;
    return (int64_t)n_ranks * (reduce > logits ? reduce : logits);
}

size_t cuda_tp_device_bytes(const ModelShape *c, const BackendOptions *o) {
    if (!o->tp_group) return 0;
    return (size_t)gather_elems(c, tp_group_size(o->tp_group), o->max_tokens, o->tp_links != NULL) * sizeof(float);
}

/* NVLink peers (nccl_peer_open): this rank's flag area, registered with its
 * gather buffer, whose start holds its part of a one-shot sum. Reduces of
 * up to PEER_MAX_VALUES take it (a decode step's, a short prefill's); larger
 * ones go through NCCL, whose bandwidth wins there. CLLM_TP_PEER=off: NCCL
 * for every reduce (to compare; the bits are the same). */
#define PEER_MAX_VALUES (1 << 20)

static int peer_init(CudaBackend *cb, Err *err) {
    CudaTp *tp = &cb->tp;
    const char *v = getenv("CLLM_TP_PEER");
    if (v && *v && strcmp(v, "on") && strcmp(v, "off")) return err_set(err, "CLLM_TP_PEER '%s': expected on or off", v);
    if (!tp->comm || tp->nccl_sum || (v && !strcmp(v, "off"))) return 0;
    size_t bytes = TP_PEER_FLAG_WORDS * sizeof(unsigned);
    CUDA_CHECK(cudaMalloc(&tp->peer_flags, bytes), err);
    CUDA_CHECK(cudaMemsetAsync(tp->peer_flags, 0, bytes, cb->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err); /* zero before any peer's first write */
    if (nccl_peer_register(tp->comm, tp->rank, tp->gather, tp->peer_flags)) tp->peer_max = PEER_MAX_VALUES;
    return 0;
}

/* Whether a reduce of n values takes the one-shot peer sum: the table is
 * whole once every rank's backend exists, which it does before any step. */
static bool peer_sum_takes(CudaTp *tp, int64_t n) {
    if (n > tp->peer_max) return false;
    if (tp->peer_state == 0) tp->peer_state = nccl_peer_table(tp->comm, tp->rank, &tp->peers) ? 1 : -1;
    return tp->peer_state == 1;
}

bool backend_cuda_tp_peers(Backend *be) { return peer_sum_takes(&cb_of(be)->tp, 1); }

int cuda_tp_init(CudaBackend *cb, const ModelShape *c, const BackendOptions *o, NcclGroup *comm, Err *err) {
    CudaTp *tp = &cb->tp;
    tp->group = o->tp_group;
    tp->rank = o->tp_rank;
    tp->n_ranks = tp_group_size(o->tp_group);
    tp->comm = comm;
    tp->nccl_sum = comm && o->tp_nccl_sum;
    const char *g = getenv("CLLM_TP_GRAPHS");
    if (g && *g && strcmp(g, "on") && strcmp(g, "off"))
        return err_set(err, "CLLM_TP_GRAPHS '%s': expected on or off", g);
    if (!comm || (g && !strcmp(g, "off"))) cb->tune.graphs = false; /* the host transport waits inside a step */
    tp->gather_elems = gather_elems(c, tp->n_ranks, cb->max_tokens, comm != NULL);
    CUDA_CHECK(cudaMalloc(&tp->gather, tp->gather_elems * sizeof(float)), err);
    /* the logits' padding columns travel too: defined values, never read */
    CUDA_CHECK(cudaMemsetAsync(tp->gather, 0, tp->gather_elems * sizeof(float), cb->stream), err);
    return peer_init(cb, err);
}

void cuda_tp_free(CudaBackend *cb) {
    CudaTp *tp = &cb->tp;
    cudaFree(tp->gather);
    cudaFree(tp->peer_flags);
    if (tp->host_sum) cudaFreeHost(tp->host_sum);
    if (tp->host_part) cudaFreeHost(tp->host_part);
    memset(tp, 0, sizeof *tp);
}

/* A failed op fails the step and breaks the group: the other ranks stop
 * waiting for this one. */
static void tp_fail(CudaBackend *cb, const Err *e) {
    cb_fail(cb, e);
    tp_group_abort(cb->tp.group);
}

/* ---------- the host transport ---------- */

/* Pinned host room of at least sum_bytes / part_bytes (grown once the
 * stream is idle: an earlier copy may still read the old buffers). */
static int host_room(CudaBackend *cb, size_t sum_bytes, size_t part_bytes, Err *err) {
    CudaTp *tp = &cb->tp;
    if (tp->host_sum_bytes >= sum_bytes && tp->host_part_bytes >= part_bytes) return 0;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
    if (pinned_room(&tp->host_sum, &tp->host_sum_bytes, sum_bytes, err)) return -1;
    return pinned_room(&tp->host_part, &tp->host_part_bytes, part_bytes, err);
}

/* dst (n values; bf16 or fp32) = the group's rank-order fp32 sum of every
 * rank's src (n values; bf16 or fp32), through host memory. The copy back
 * is left in flight: the next reduce's copy out follows it on the stream. */
static int host_reduce(CudaBackend *cb, void *dst, bool dst_bf16, const void *src, bool src_bf16, int64_t n,
                       Err *err) {
    CudaTp *tp = &cb->tp;
    size_t n4 = (size_t)n * sizeof(float), n2 = (size_t)n * sizeof(bf16);
    if (host_room(cb, n4, n2, err)) return -1;
    float *sum = (float *)tp->host_sum;
    bf16 *half = (bf16 *)tp->host_part;
    CUDA_CHECK(cudaMemcpyAsync(src_bf16 ? (void *)half : (void *)sum, src, src_bf16 ? n2 : n4, cudaMemcpyDeviceToHost,
                               cb->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
    for (int64_t i = 0; src_bf16 && i < n; i++) sum[i] = __bfloat162float(half[i]);
    tp_group_all_reduce_f32(tp->group, tp->rank, sum, n);
    if (tp_group_broken(tp->group)) return 0; /* the step's read says so */
    for (int64_t i = 0; dst_bf16 && i < n; i++) half[i] = __float2bfloat16(sum[i]);
    CUDA_CHECK(cudaMemcpyAsync(dst, dst_bf16 ? (const void *)half : (const void *)sum, dst_bf16 ? n2 : n4,
                               cudaMemcpyHostToDevice, cb->stream), err);
    return 0;
}

/* dst [rows][V] = every rank's src [rows][cols] side by side, through host memory. */
static int host_gather(CudaBackend *cb, float *dst, const float *src, int rows, int cols, Err *err) {
    CudaTp *tp = &cb->tp;
    size_t full = (size_t)rows * cb->shape->vocab * sizeof(float), part = (size_t)rows * cols * sizeof(float);
    if (host_room(cb, full, part, err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(tp->host_part, src, part, cudaMemcpyDeviceToHost, cb->stream), err);
    CUDA_CHECK(cudaStreamSynchronize(cb->stream), err);
    tp_group_all_gather_f32(tp->group, tp->rank, (float *)tp->host_sum, (const float *)tp->host_part, rows, cols);
    if (tp_group_broken(tp->group)) return 0;
    CUDA_CHECK(cudaMemcpyAsync(dst, tp->host_sum, full, cudaMemcpyHostToDevice, cb->stream), err);
    return 0;
}

/* ---------- NCCL ---------- */

/* dst (n values; bf16 or fp32) = the rank-order sum of every rank's part
 * (n values of the parts' type), this rank's at src: copied to its offset
 * of the gather buffer unless it lies there already. */
static int nccl_ordered_sum(CudaBackend *cb, void *dst, bool dst_bf16, const void *src, bool parts_bf16, int64_t n,
                            Err *err) {
    CudaTp *tp = &cb->tp;
    size_t elem = parts_bf16 ? sizeof(bf16) : sizeof(float);
    if ((size_t)n * tp->n_ranks * elem > (size_t)tp->gather_elems * sizeof(float))
        return err_set(err, "%s: a tensor-parallel reduce of %lld values exceeds the gather buffer (%lld fp32)",
                       cb->name, (long long)n, (long long)tp->gather_elems);
    char *mine = (char *)tp->gather + (size_t)tp->rank * n * elem;
    if (src != mine) CUDA_CHECK(cudaMemcpyAsync(mine, src, n * elem, cudaMemcpyDeviceToDevice, cb->stream), err);
    if (nccl_link_all_gather(tp->comm, tp->rank, mine, tp->gather, (size_t)n, parts_bf16, cb->stream, err)) return -1;
    cuda_tp_sum(dst, dst_bf16, tp->gather, parts_bf16, tp->n_ranks, n, cb->stream);
    return 0;
}

/* nccl_ordered_sum's result by the one-shot peer sum: this rank's part at
 * the start of its gather buffer, where the peers read it. */
static int peer_sum(CudaBackend *cb, void *dst, TpPeerOut how, const void *src, bool parts_bf16, int64_t n,
                    Err *err) {
    CudaTp *tp = &cb->tp;
    size_t elem = parts_bf16 ? sizeof(bf16) : sizeof(float);
    if (src != tp->gather) CUDA_CHECK(cudaMemcpyAsync(tp->gather, src, n * elem, cudaMemcpyDeviceToDevice, cb->stream), err);
    CUDA_CHECK(cuda_tp_peer_sum(dst, how, &tp->peers, parts_bf16, n, cb->stream), err);
    return 0;
}

/* dst [rows][V] = every rank's logits side by side: each rank's [rows][its
 * columns] padded to the widest rank's (the split's own rule, tp_sum.cuh)
 * so NCCL gathers equal counts, then put in place. */
static int nccl_gather_cols(CudaBackend *cb, float *dst, const float *src, int rows, int cols, Err *err) {
    CudaTp *tp = &cb->tp;
    int V = cb->shape->vocab, N = tp->n_ranks;
    if (cols != tp_vocab_cols(V, N, tp->rank))
        return err_set(err, "%s: tensor-parallel rank %d gathers %d logit columns; the split of %d over %d ranks gives "
                       "it %d", cb->name, tp->rank, cols, V, N, tp_vocab_cols(V, N, tp->rank));
    int64_t stride = (int64_t)rows * ((V + N - 1) / N);
    if (stride * N > tp->gather_elems)
        return err_set(err, "%s: %d rows of logits exceed the tensor-parallel gather buffer", cb->name, rows);
    float *mine = tp->gather + tp->rank * stride;
    CUDA_CHECK(cudaMemcpyAsync(mine, src, (size_t)rows * cols * sizeof(float), cudaMemcpyDeviceToDevice, cb->stream),
               err);
    if (nccl_link_all_gather(tp->comm, tp->rank, mine, tp->gather, (size_t)stride, false, cb->stream, err)) return -1;
    cuda_tp_place_cols(dst, tp->gather, stride, N, rows, V, cb->stream);
    return 0;
}

/* ---------- the ops ---------- */

static void tp_all_reduce(Backend *be, void *buf, int64_t n, BufKind kind) {
    CudaBackend *cb = cb_of(be);
    CudaTp *tp = &cb->tp;
    bool half = kind == BUF_ACT;
    Err e = {};
    if (cb->failed) { tp_group_abort(tp->group); return; }
    int rc = !tp->comm       ? host_reduce(cb, buf, half, buf, half, n, &e)
             : tp->nccl_sum ? nccl_link_all_reduce_sum(tp->comm, tp->rank, buf, (size_t)n, half, cb->stream, &e)
             : peer_sum_takes(tp, n) ? peer_sum(cb, buf, half ? TP_PEER_OUT_BF16 : TP_PEER_OUT_F32, buf, half, n, &e)
                            : nccl_ordered_sum(cb, buf, half, buf, half, n, &e);
    if (rc) tp_fail(cb, &e);
}

static void tp_all_gather(Backend *be, void *dst, const void *src, int rows, int cols) {
    CudaBackend *cb = cb_of(be);
    Err e = {};
    if (cb->failed) { tp_group_abort(cb->tp.group); return; }
    int rc = cb->tp.comm ? nccl_gather_cols(cb, (float *)dst, (const float *)src, rows, cols, &e)
                         : host_gather(cb, (float *)dst, (const float *)src, rows, cols, &e);
    if (rc) tp_fail(cb, &e);
}

static void tp_matmul_all_reduce(Backend *be, void *y, const void *in, const WeightRef *w, int mat,
                                 const WeightRef *bias, int T) {
    CudaBackend *cb = cb_of(be);
    CudaTp *tp = &cb->tp;
    int64_t n = (int64_t)T * w->rows;
    Err e = {};
    if (cb->failed) { tp_group_abort(tp->group); return; }
    if (tp->nccl_sum) { /* the fast form: a bf16 product per rank, NCCL's sum */
        wgemm(cb, y, false, (const bf16 *)in, w, mat, vec_of(bias, mat), T);
        if (cb->failed) tp_group_abort(tp->group);
        else if (nccl_link_all_reduce_sum(tp->comm, tp->rank, y, (size_t)n, true, cb->stream, &e)) tp_fail(cb, &e);
        return;
    }
    if (n * (tp->comm ? tp->n_ranks : 1) > tp->gather_elems) {
        err_set(&e, "%s: a tensor-parallel product of %d x %lld exceeds the gather buffer", cb->name, T,
                (long long)w->rows);
        tp_fail(cb, &e);
        return;
    }
    bool peer = tp->comm && peer_sum_takes(tp, n);
    float *part = tp->gather + (tp->comm && !peer ? tp->rank * n : 0);
    wgemm(cb, part, true, (const bf16 *)in, w, mat, vec_of(bias, mat), T);
    if (cb->failed) { tp_group_abort(tp->group); return; }
    int rc = peer       ? peer_sum(cb, y, TP_PEER_OUT_BF16, part, false, n, &e)
             : tp->comm ? nccl_ordered_sum(cb, y, true, part, false, n, &e)
                        : host_reduce(cb, y, true, part, false, n, &e);
    if (rc) tp_fail(cb, &e);
}

/* x += the group's sum rounded to bf16, where the one-shot peer sum takes
 * the reduce: the sum is added by the kernel that makes it, so the norm that
 * follows has nothing to add and folds into the next GEMV (as matmul_add on
 * one GPU). The same bits as matmul_all_reduce + add_rmsnorm's add. */
static bool tp_matmul_all_reduce_add(Backend *be, void *x, const void *in, const WeightRef *w, int mat,
                                     const WeightRef *bias, int T) {
    CudaBackend *cb = cb_of(be);
    CudaTp *tp = &cb->tp;
    int64_t n = (int64_t)T * w->rows;
    if (!tp->comm || tp->nccl_sum || !peer_sum_takes(tp, n)) return false;
    Err e = {};
    if (cb->failed) { tp_group_abort(tp->group); return true; }
    wgemm(cb, tp->gather, true, (const bf16 *)in, w, mat, vec_of(bias, mat), T);
    if (cb->failed) { tp_group_abort(tp->group); return true; }
    if (peer_sum(cb, x, TP_PEER_ADD_BF16, tp->gather, false, n, &e)) tp_fail(cb, &e);
    return true;
}

/* Over NCCL only: the host transport's ranks take a stage's input through
 * host memory (parallel/tp.c), so there broadcast stays NULL. */
static void tp_broadcast(Backend *be, void *buf, int64_t n, BufKind kind) {
    CudaBackend *cb = cb_of(be);
    CudaTp *tp = &cb->tp;
    Err e = {};
    if (cb->failed) { tp_group_abort(tp->group); return; }
    if (nccl_link_broadcast(tp->comm, tp->rank, buf, (size_t)n, kind == BUF_ACT, cb->stream, &e)) tp_fail(cb, &e);
}

void cuda_tp_ops(Backend *be) {
    be->broadcast = cb_of(be)->tp.comm ? tp_broadcast : NULL;
    be->all_reduce = tp_all_reduce;
    be->all_gather = tp_all_gather;
    be->matmul_all_reduce = tp_matmul_all_reduce;
    be->matmul_all_reduce_add = tp_matmul_all_reduce_add;
}

/* ---------- the end of a step ---------- */

static bool group_broken(void *g) { return tp_group_broken((const TpGroup *)g); }

int cuda_tp_wait(CudaBackend *cb, Err *err) {
    CudaTp *tp = &cb->tp;
    if (tp->comm) { /* NCCL collectives, maybe a pipeline link's transfers too */
        char who[48], link_who[48];
        NcclWatch w[2];
        int n = 0;
        snprintf(who, sizeof who, "tensor-parallel rank %d", tp->rank);
        w[n++] = (NcclWatch){tp->comm, tp->rank, who};
        if (cb->link) {
            snprintf(link_who, sizeof link_who, "the link of stage %d", cb->link_rank);
            w[n++] = (NcclWatch){cb->link, cb->link_rank, link_who};
        }
        if (nccl_link_wait_all(w, n, cb->stream, group_broken, tp->group, err)) return -1;
    } else if (cb->link) {
        if (nccl_link_wait(cb->link, cb->link_rank, cb->stream, err)) return -1;
    } else {
        cudaError_t e = cudaStreamSynchronize(cb->stream);
        if (e != cudaSuccess)
            return err_set(err, "CUDA error '%s' in step (device %d)", cudaGetErrorString(e), cb->device);
    }
    if (tp->group && tp_group_broken(tp->group))
        return err_set(err, "%s: tensor-parallel rank %d: another rank of its group failed", cb->name, tp->rank);
    return 0;
}
