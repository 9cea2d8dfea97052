/* backend.c — the backend factory: the CUDA backend where this build has it
 * and a GPU is asked for, the CPU backend otherwise. The one place outside
 * kernels/cuda/ that knows whether the build has CUDA, so nothing above
 * kernels/ needs to. */
#include "kernels/backend.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/backend_cpu.h"
#include "kernels/weight_rows.h"
#ifdef CLLM_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_link.h"
#endif

struct BackendLinks {
#ifdef CLLM_CUDA
    NcclGroup *g;
#endif
    int unused;
};

Backend *backend_create(const ModelShape *shape, const ModelWeights *w, const BackendOptions *o, Err *err) {
    if (o->block_size <= 0) return err_set(err, "backend: KV blocks of %d tokens", o->block_size), NULL;
    if (o->device < 0) {
        if (o->n_blocks <= 0) return err_set(err, "cpu: a KV cache of %d blocks", o->n_blocks), NULL;
        const char *apart = weights_strided(w, shape->n_layers);
        if (apart) /* its ops read row i at data + i * row_bytes */
            return err_set(err, "cpu: the rows of '%s' lie apart (a view of wider rows); the CPU backend computes from "
                           "packed rows (tp_rank_make's copy)", apart), NULL;
        Backend *be = backend_cpu_create(shape, w, o->threads, o->block_size, o->n_blocks, o->kv_dtype, o->kv_scales, err);
        if (be && o->tp_group) backend_cpu_join_tp(be, o->tp_group, o->tp_rank);
        return be;
    }
#ifdef CLLM_CUDA
    if (o->tp_group) return backend_cuda_create_rank(shape, w, o, NULL, o->tp_links ? o->tp_links->g : NULL, err);
    return backend_cuda_create(shape, w, o, NULL, err);
#else
    return err_set(err, "GPU %d asked for, but this cllm was built without CUDA (./build.sh on a machine with the "
                   "CUDA toolkit); --cpu runs on the CPU", o->device), NULL;
#endif
}

/* cuBLASLt is loaded only where a GPU is there to use it; GPUs older than
 * the oldest the kernels are built for count as none (one new enough: its
 * index is what --gpu takes, and backend_create refuses an old one). */
int backend_gpu_count(Err *why) {
#ifdef CLLM_CUDA
    int n = 0, usable = 0;
    Err e = {{0}}, first_old = {{0}};
    if (cuda_device_count(&n, &e)) {
        if (why) *why = e;
        return 0;
    }
    if (n == 0) return err_set(why, "no CUDA device"), 0;
    for (int d = 0; d < n; d++) {
        Err old = {{0}};
        if (cuda_device_supported(d, &old) == 0) usable++;
        else if (!first_old.msg[0]) first_old = old;
    }
    if (usable == 0) {
        if (why) *why = first_old;
        return 0;
    }
    if (!cublaslt_lib(&e)) {
        if (why) *why = e;
        return 0;
    }
    return n;
#else
    (void)why; /* a CPU-only build: nothing to report */
    return 0;
#endif
}

int backend_gpu_plan(const ModelShape *shape, const ModelWeights *w, const BackendOptions *o,
                     uint64_t *weight_bytes, int64_t *kv_tokens, Err *err) {
#ifdef CLLM_CUDA
    *weight_bytes = cuda_weight_bytes_planned(shape, w, o->bf16_weights);
    return cuda_kv_tokens_that_fit(shape, *weight_bytes, o, kv_tokens, err);
#else
    (void)shape, (void)w, (void)o;
    *weight_bytes = 0;
    *kv_tokens = 0;
    return err_set(err, "built without CUDA");
#endif
}

BackendLinks *backend_link_open(Backend *const *stages, int n, double timeout_s, Err *err) {
#ifdef CLLM_CUDA
    int dev[64];
    if (n < 2 || n > 64) return err_set(err, "links: %d stages (2..64)", n), NULL;
    for (int i = 0; i < n; i++) {
        dev[i] = stages[i]->device;
        if (dev[i] < 0) return err_set(err, "links: stage %d runs on the CPU", i), NULL;
        for (int j = 0; j < i; j++)
            if (dev[j] == dev[i]) return err_set(err, "links: stages %d and %d share GPU %d", j, i, dev[i]), NULL;
    }
    BackendLinks *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, "out of memory"), NULL;
    if (!(l->g = nccl_group_open(dev, n, timeout_s, err))) { free(l); return NULL; }
    for (int s = 0; s < n; s++)
        if (backend_cuda_link(stages[s], l->g, s, err)) { backend_link_close(l); return NULL; }
    return l;
#else
    (void)stages, (void)n, (void)timeout_s;
    return err_set(err, "links: built without CUDA"), NULL;
#endif
}

int backend_link_id(unsigned char id[BACKEND_LINK_ID_BYTES], Err *err) {
#ifdef CLLM_CUDA
    return nccl_unique_id(id, err);
#else
    (void)id;
    return err_set(err, "links: built without CUDA");
#endif
}

BackendLinks *backend_link_join(Backend *be, const unsigned char id[BACKEND_LINK_ID_BYTES], int rank, int n,
                                double timeout_s, Err *err) {
#ifdef CLLM_CUDA
    if (be->device < 0) return err_set(err, "links: rank %d runs on the CPU", rank), NULL;
    BackendLinks *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, "out of memory"), NULL;
    if (!(l->g = nccl_group_join(id, rank, n, be->device, timeout_s, err))) { free(l); return NULL; }
    if (backend_cuda_link(be, l->g, rank, err)) { backend_link_close(l); return NULL; }
    return l;
#else
    (void)be, (void)id, (void)rank, (void)n, (void)timeout_s;
    return err_set(err, "multi-process GPU stages need a CUDA build"), NULL;
#endif
}

int backend_link_available(Err *err) {
#ifdef CLLM_CUDA
    return nccl_lib(err) ? 0 : -1;
#else
    return err_set(err, "links: built without CUDA");
#endif
}

BackendLinks *backend_tp_links_open(const int *devices, int n, double timeout_s, Err *err) {
#ifdef CLLM_CUDA
    for (int i = 0; i < n; i++)
        if (devices[i] < 0) return err_set(err, "tensor-parallel rank %d runs on the CPU", i), NULL;
    BackendLinks *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, "out of memory"), NULL;
    if (!(l->g = nccl_group_open(devices, n, timeout_s, err))) { free(l); return NULL; }
    nccl_peer_open(l->g); /* where the GPUs map each other's memory: the one-shot sum of small reduces */
    return l;
#else
    (void)devices, (void)n, (void)timeout_s;
    return err_set(err, "built without CUDA"), NULL;
#endif
}

BackendLinks *backend_tp_link_join(int device, const unsigned char id[BACKEND_LINK_ID_BYTES], int rank, int n,
                                   double timeout_s, Err *err) {
#ifdef CLLM_CUDA
    if (device < 0) return err_set(err, "tensor-parallel rank %d runs on the CPU", rank), NULL;
    BackendLinks *l = calloc(1, sizeof *l);
    if (!l) return err_set(err, "out of memory"), NULL;
    if (!(l->g = nccl_group_join(id, rank, n, device, timeout_s, err))) { free(l); return NULL; }
    return l;
#else
    (void)device, (void)id, (void)rank, (void)n, (void)timeout_s;
    return err_set(err, "built without CUDA"), NULL;
#endif
}

void backend_link_close(BackendLinks *l) {
    if (!l) return;
#ifdef CLLM_CUDA
    nccl_group_close(l->g);
#endif
    free(l);
}
