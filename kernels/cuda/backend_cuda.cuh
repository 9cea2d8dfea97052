/* backend_cuda.cuh — the CUDA backend's own state and the functions its
 * files share (not for use outside kernels/cuda/backend_cuda*.cu).
 *
 *   backend_cuda.cu          creation, tuning, buffers, read / write, sampling, pipeline links
 *   backend_cuda_weights.cu  the weights' upload (bf16, or quantized blocks kept as they are)
 *   backend_cuda_memory.cu   step buffers, the KV cache and the attention scratch, by the memory budget
 *   backend_cuda_step.cu     begin_step: a step's inputs, its attention metadata, CUDA graphs
 *   backend_cuda_matmul.cu   the matmul route table and the GEMMs it routes to
 *   backend_cuda_layer.cu    the ops of a layer (norms, qkv, rope, attention, MLP, MoE, logits)
 *   backend_cuda_tp.cu       a tensor-parallel rank's collectives (NCCL, or through host memory)
 *   backend_cuda_async.cu    overlapped steps: a draw launched without a wait, its tokens fed to the next step
 */
#ifndef CLLM_BACKEND_CUDA_CUH
#define CLLM_BACKEND_CUDA_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "base/thread_pool.h"
#include "kernels/attn_meta.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_ahead.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/gemm_bi.cuh"
#include "kernels/cuda/nccl_link.cuh"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/sampling.cuh"

#define GEMM_CACHE 64                      /* cuBLASLt plans kept, one per GEMM shape */
#define STAGING_BYTES ((size_t)64 << 20)   /* each of the two pinned buffers of the weight upload */
#define MAX_BUFS 64                        /* activation buffers (Backend.alloc) */
/* Graph buckets of decode rows (BUCKET_ROWS, backend_cuda_step.cu): 1, 2, 4 ... 64, then every 64 up to 1024
 * (the most sequences a step holds: FORWARD_MAX_LOGITS); a step pads to its bucket, at most GRAPH_MAX_PAD rows. */
#define N_BUCKETS 22
#define GRAPH_MAX_PAD 63
/* Batch-invariant decode scratch: a bucket of this many rows at the most splits at once; larger buckets run
 * their decode rows in groups of it (attention.cu), so the scratch stays 64 x 64 splits. */
#define GRAPH_BI_WORK_ROWS 64
#define RESERVE_BYTES ((size_t)256 << 20)  /* left free beside the KV budget (cuBLASLt, graphs, fragmentation) */
#define MAX_AUTO_BLOCKS (1 << 20)          /* a budget-sized cache stops here (the host block pool is an array) */
/* bf16 scratch of a quantized GEMM that is dequantized first; larger matrices go in row chunks. */
#define DEQ_MAX_BYTES ((size_t)256 << 20)
/* Buffers of that scratch: the matrix a GEMM reads and the next, dequantized ahead on a side stream
 * (a third measured no faster: kernels/README.md "dequantize ahead"). */
#define DEQ_AHEAD_BUFFERS 2
/* Steps of fewer rows dequantize each matrix just before its GEMM: there the GEMMs are bound by
 * bandwidth too, and a copy made ahead competes with them. */
#define DEQ_AHEAD_MIN_T 128
/* Quantized GEMMs of more rows than the GEMVs take run fused (quant_gemm: tiles dequantized in shared
 * memory for wgmma) up to this many rows, dequantize + cuBLASLt above, where the fused kernel's
 * share of the tensor-core rate falls behind (kernels/README.md "quantized GEMM"). */
#define QGEMM_FUSED_MAX_T 1536
/* Q5_K's and Q6_K's fused dequantization costs about twice Q4_K's per value: fused up to here only. */
#define QGEMM_FUSED_MAX_T_K56 256
/* bf16 weights: the GEMV kernels up to this many rows, cuBLASLt above (the GEMV re-reads x for each
 * weight load, so cuBLASLt wins from 4 rows). */
#define BF16_GEMV_MAX_T 2
#define LAYER_REFS ((int)(sizeof(LayerWeights) / sizeof(WeightRef)))
/* Layer windows a step's cascade plans cover (a layer of another window runs flat). */
#define CASCADE_PLANS 4

/* The choices made once at creation (CudaChecks, the GPU, CLLM_PROFILE_STEPS). */
typedef struct {
    bool graphs;                 /* decode steps replayed as CUDA graphs (CudaChecks.no_graphs: off) */
    bool rope_in_decode;         /* a step of decode rows alone ropes and writes the cache in the attention
                                    kernel (CudaChecks.rope_apart: two launches, as prefill does) */
    bool quant_gemm;             /* the fused quantized GEMM can run: an sm_90a build on a 9.0 GPU, and not
                                    the batch-invariant mode */
    bool fp8_gemm;               /* FP8 weights' GEMMs on FP8 tensor cores (cuBLASLt, fp8.cuh): a GPU of compute
                                    capability 8.9 or newer, and not the batch-invariant mode; else they are
                                    dequantized to bf16 first */
    int prof_first, prof_count;  /* CLLM_PROFILE_STEPS=FIRST,COUNT: the profiler (ncu --profile-from-start off)
                                    records steps FIRST .. FIRST + COUNT - 1 only (0-based); count 0: off */
} CudaTuning;

typedef struct {
    int m, n, k, ldc;
    bool out_f32;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

typedef struct {
    void *ptr;
    BufKind kind;
    int64_t n;
} Buf;

/* Overlapped steps (backend_cuda_async.cu). */
typedef struct {
    cudaEvent_t staged;          /* after the last copy from the pinned step staging (h_ids .. h_meta, h_feed):
                                    begin_step waits for it before writing them again */
    cudaEvent_t drawn;           /* after a launched draw's tokens reached the host */
    int n_drawn;                 /* rows of the launched draw not yet taken (0: none) */
    int32_t *h_feed, *d_feed;    /* [2][max_seqs] a step's fed rows, then their draw rows: pinned / device */
    float *h_kept;               /* pinned, kept_bytes: the launched draw's kept logits rows (logprobs), [n][vocab] */
    int32_t *kept_row;           /* [max_seqs] the row each of them is */
    size_t kept_bytes;
    int n_kept;
} CudaOverlap;

/* A step's cascade plan for the layers of one window (backend_cuda_cascade.cu). */
typedef struct {
    AttnCascadePlan plan;        /* host */
    int window;
    bool used;                   /* built this step */
    AttnCascadeDev dev;          /* packed and uploaded; dev.m.n_units 0: no group (the flat path) */
} CascadeStepPlan;

/* A rank of a tensor-parallel group (backend_cuda_tp.cu). */
typedef struct {
    TpGroup *group;              /* NULL: not a rank */
    int rank, n_ranks;
    NcclGroup *comm;             /* NCCL between the group's GPUs (rank `rank` of it), or NULL: through host memory */
    bool nccl_sum;               /* all_reduce by ncclAllReduce's own sum (BackendOptions.tp_nccl_sum) */
    float *gather;               /* NCCL: every rank's part side by side, [n_ranks][gather_elems / n_ranks] (device) */
    int64_t gather_elems;
    void *host_sum, *host_part;  /* host transport, pinned: fp32 sums / the gathered logits; bf16 values or a
                                    rank's own logits (grown on demand: no graphs there) */
    size_t host_sum_bytes, host_part_bytes;
    unsigned *peer_flags;        /* NVLink peers: this rank's flag area (tp_peer_sum.cuh), or NULL: NCCL alone */
    int64_t peer_max;            /* values of the largest reduce the one-shot peer sum takes (CLLM_TP_PEER=off: 0) */
    int peer_state;              /* 0: table not asked yet; 1: the table is whole; -1: not there */
    TpPeers peers;
} CudaTp;

typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    GemmPlan plans[GEMM_CACHE];
    int n_plans;
    const ModelShape *shape;
    ModelWeights w;              /* device copies; layers array on the host */
    void **allocs;               /* every cudaMalloc of weights, for freeing */
    int n_allocs, cap_allocs;
    bool bf16_weights;           /* every matrix as bf16, quantized ones too (BackendOptions) */
    bool bi;                     /* batch-invariant mode (BackendOptions.batch_invariant) */
    CudaTuning tune;             /* read once at creation */
    int64_t steps;               /* steps begun */
    QuantMatrix *qm;             /* [n_layers * LAYER_REFS + 1] quantized matrices (slot of each WeightRef; last: LM head) */
    uint64_t weight_bytes;       /* device bytes of all weights */
    void *qnative;               /* upload only: a matrix's file bytes before repacking */
    size_t qnative_cap;
    DeqAhead deq;                /* bf16 copies of quantized matrices for GEMMs of more than 8 rows */
    QuantGemmWork qwork;         /* quant_gemm's split-K partials and counters (zeroed once; qgemm_mode != NEVER) */
    Fp8Gemm fp8;                 /* FP8 weights' GEMM: quantized x, cuBLASLt FP8 plans (tune.fp8_gemm, FP8 matrices) */
    int64_t fp8_max_cols;        /* the widest FP8 matrix kept as codes (0: none) */
    int64_t deq_elems;
    const QuantMatrix **qnext;   /* [n_layers * LAYER_REFS + 1] the quantized matrix a step multiplies after each slot's */
    float *d_inv_freq;           /* [n_layers][rope_dim/2] (ModelShape's, on the device) */
    void *kv_pool;               /* every layer's K then V (fp8: and their scales) */
    size_t kv_pool_bytes;
    KVLayerDev *kv;              /* [n_layers] views into kv_pool (and the static scales of --kv-scales) */
    AttnKVMaps *kv_maps;         /* [n_layers] the sm_90a prefill's TMA maps of each view (kv[l].maps), or NULL */
    float *d_kv_calib;           /* --kv-scales calibrate: [n_layers][2][n_kv_heads] the scales the first step sets */
    bool *kv_calib;              /* --kv-scales calibrate: [n_layers] still to be set (host); else NULL */
    int kv_calib_left;           /* layers still to calibrate: their step runs without graphs */
    int64_t n_slots;
    int max_tokens, max_seqs, max_blocks;
    int32_t *d_ids, *d_pos, *d_seq, *d_tables, *d_rows;
    int64_t *d_slot;
    int32_t *h_ids, *h_pos, *h_seq, *h_tables, *h_rows, *h_need; /* pinned staging (h_need: malloc) */
    int64_t *h_slot;
    KVDtype kv_dtype;
    DevAttnBatch batch;
    bool fast_attn;              /* attention.cuh has kernels for this model's variant (and no check asked otherwise) */
    int n_sms;
    int decode_resident;        /* decode attention blocks the GPU holds at once (its split rule) */
    AttnMeta meta;               /* this step's attention metadata (host) */
    int32_t *d_meta, *h_meta;    /* its upload, at a fixed address (graphs replay it) */
    int64_t meta_cap;            /* int32 values d_meta / h_meta hold */
    int32_t *meta_seq;           /* [max_tokens] sequence of each row, padding rows their own */
    const int32_t **meta_tables; /* [max_seqs + 64] block table of each of those sequences */
    AttnDevMeta dmeta;
    AttnDecodeWork work;
    AttnCascadeMode cascade;     /* CLLM_CASCADE; off in the batch-invariant mode and with the generic attention */
    CascadeStepPlan casc[CASCADE_PLANS]; /* this step's plans, one per layer window met */
    AttnBatch casc_batch;        /* the step's decode rows: the plans' rows */
    int casc_batch_rows;         /* the step's rows */
    int32_t *casc_pos, *casc_seq, *casc_row_of; /* [max_tokens] casc_batch's arrays, and each one's step row */
    float *casc_part;            /* the shared pass's partial results (casc_cap_slots of them) */
    int64_t casc_cap_slots;
    int64_t casc_meta_end;       /* h_meta / d_meta values this step has used */
    int64_t casc_rows_total;     /* decode rows put in a group, per step and layer window, ever */
    GpuSampler sampler;          /* built at the first sample() call */
    bool sampler_built;
    CudaOverlap ovl;             /* overlapped steps */
    bf16 *scratch;               /* [T][nq+nk+nv] or [T][2F] GEMM outputs */
    float *router, *h_router, *moe_w, *h_w, *moe_acc;
    int32_t *moe_idx, *h_idx;
    bf16 *moe_rows, *moe_act, *moe_out;
    Buf bufs[MAX_BUFS];
    int n_bufs;
    int bucket;                  /* this step's bucket (padded to BUCKET_ROWS[bucket] rows), -1: none */
    cudaGraphExec_t graph[N_BUCKETS];
    NcclGroup *link;             /* pipeline stage: NCCL to its neighbours (backend_cuda_link), or NULL */
    int link_rank;
    CudaTp tp;                   /* a tensor-parallel rank's group (tp.group NULL: none) */
    int graph_splits[N_BUCKETS]; /* the decode splits each graph was captured with (step_grid_splits, bi_graph_splits) */
    char name[16];               /* "cuda:N", "cuda:N+bi" in the batch-invariant mode */
    Err err;                     /* first error inside a void op; reported by read() */
    bool failed;
} CudaBackend;

extern const int BUCKET_ROWS[N_BUCKETS];

static inline CudaBackend *cb_of(Backend *be) { return (CudaBackend *)be->ctx; }

/* backend_cuda_async.cu */
int cuda_overlap_init(Backend *be, Err *err);              /* its events and buffers, and the three ops */
void cuda_overlap_free(CudaBackend *cb);
int cuda_overlap_staged_wait(CudaBackend *cb, Err *err);   /* before writing the pinned step staging */
void cuda_overlap_staged(CudaBackend *cb);                 /* after queueing a copy from it */

/* backend_cuda.cu */
CudaBackend *cb_use(Backend *be);                            /* makes the backend's GPU current */
void op_fail(CudaBackend *cb, cudaError_t e, const char *what); /* records the first error of a void op */
void cb_fail(CudaBackend *cb, const Err *e);                 /* the same for an error already written */

/* The views of a device weight. */
static inline bool is_quant(const WeightRef *w) { return w->data && quant_type_supported(w->type); }
static inline const QuantMatrix *qm_of(const WeightRef *w) { return (const QuantMatrix *)w->data; }
static inline const bf16 *mat_of(const WeightRef *w, int mat) {
    return (const bf16 *)w->data + (int64_t)mat * w->rows * w->cols;
}
static inline const float *vec_of(const WeightRef *b, int mat) {
    return b && b->data ? (const float *)b->data + (int64_t)mat * b->cols : NULL;
}

/* backend_cuda_matmul.cu: the route table. */
typedef enum {
    MM_GEMV,              /* bf16 matrix-vector kernels (gemv.cuh) */
    MM_CUBLASLT,          /* cuBLASLt (bf16 in, fp32 accumulate), then the bias */
    MM_GEMM_BI,           /* the batch-invariant GEMM (gemm_bi.cuh) */
    MM_QGEMV_X8,          /* quantized: dp4a on x rounded to two int8 terms (one row) */
    MM_QGEMV_MMA,         /* quantized: bf16 tensor cores on the exact codes */
    MM_QGEMV_SCALAR,      /* quantized: fp32 FMAs, several tiles of loads in flight */
    MM_QGEMM,             /* quantized: tiles dequantized in shared memory for wgmma */
    MM_DEQUANT_CUBLASLT,  /* quantized: dequantized to the bf16 scratch, then cuBLASLt */
    MM_DEQUANT_GEMM_BI,   /* quantized, batch-invariant: dequantized, then the batch-invariant GEMM */
    MM_FP8_GEMV,          /* FP8 weights: x quantized per token in each block, fp32 sums of exact code products */
    MM_FP8_GEMM,          /* FP8 weights: x quantized per token, then cuBLASLt's FP8 GEMM (fp8.cuh) */
} MatmulRoute;
MatmulRoute matmul_route(const CudaBackend *cb, const WeightRef *w, int T);
bool route_is_qgemv(MatmulRoute r);
/* y[T][M] (bf16, or fp32 when y_f32) = x[T][K] @ w[mat]^T (+ bias[M]), by w's route at T. */
void wgemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const WeightRef *w, int mat, const float *bias,
           int T);
/* The same for a bf16 matrix W [M][K] that is not a WeightRef (a concatenation's part, an expert). */
void gemm(CudaBackend *cb, void *y, bool y_f32, const bf16 *x, const bf16 *W, const float *bias, int M, int T,
          int K);
/* A quantized GEMV of route r (an MM_QGEMV_*, or MM_FP8_GEMV) with y in parts. */
void qgemv(CudaBackend *cb, MatmulRoute r, const bf16 *x, const QuantMatrix *W, const GemvOut *out, int T);
/* The fused GEMM with its parts or GLU epilogue where W's route at T is MM_QGEMM and it takes e; false:
 * nothing done. */
bool qgemm_epi(CudaBackend *cb, const bf16 *x, const QuantMatrix *W, const QuantGemmEpi *e, int T);
void gemm_plans_free(CudaBackend *cb);

/* backend_cuda_weights.cu */
int upload_model(CudaBackend *cb, const ModelShape *c, const ModelWeights *host, double *gbps, Err *err);

/* backend_cuda_memory.cu */
int cuda_alloc_step(CudaBackend *cb, const ModelShape *c, Err *err);
int attn_alloc_work(CudaBackend *cb, const ModelShape *c, int block_size, bool generic_attention, Err *err);
int cuda_alloc_kv(CudaBackend *cb, const ModelShape *c, const BackendOptions *o, Err *err);
int attn_alloc_meta(CudaBackend *cb, Err *err);
int decode_grid_splits(const CudaBackend *cb, int ctx, int n_decode);
int pinned_room(void **buf, size_t *have, size_t want, Err *err); /* grows by doubling */

/* backend_cuda_cascade.cu */
int cascade_alloc(CudaBackend *cb, Err *err);      /* CLLM_CASCADE and the scratch (after attn_alloc_work's checks) */
void cascade_free(CudaBackend *cb);
int64_t cascade_meta_len(const CudaBackend *cb);   /* metadata values the plans may add */
bool cascade_begin_step(CudaBackend *cb, const AttnBatch *b); /* the unwindowed plan: true when it has a group */
int cascade_pack_step(CudaBackend *cb, int64_t at); /* packs it at h_meta + at: the values added */
const AttnCascadeDev *cascade_of_layer(CudaBackend *cb, int window); /* NULL: the flat path */

/* backend_cuda_step.cu */
int cuda_be_begin_step(Backend *be, const int32_t *ids, const AttnBatch *b, const int32_t *logit_rows, int n_logits,
                       StepRows *rows, Err *err);
bool cuda_be_graph_replay(Backend *be);
void cuda_be_graph_capture(Backend *be, bool begin);
void graphs_drop(CudaBackend *cb);

/* backend_cuda_layer.cu: fills the layer ops of be. */
void cuda_layer_ops(Backend *be);

/* backend_cuda_tp.cu */
size_t cuda_tp_device_bytes(const ModelShape *c, const BackendOptions *o); /* the NCCL gather buffer's */
/* Makes cb rank o->tp_rank of o->tp_group (over comm, or through host memory): before the KV cache is
 * sized, so the budget counts the gather buffer; graphs off on the host transport. */
int cuda_tp_init(CudaBackend *cb, const ModelShape *c, const BackendOptions *o, NcclGroup *comm, Err *err);
void cuda_tp_ops(Backend *be);                 /* all_reduce, all_gather, matmul_all_reduce */
/* read's wait for the step: plain, or over the NCCL communicators the stream may wait on (a failed rank,
 * an NCCL error or the deadline aborts them, never a hang); then a broken group fails the step. */
int cuda_tp_wait(CudaBackend *cb, Err *err);
void cuda_tp_free(CudaBackend *cb);

#endif
