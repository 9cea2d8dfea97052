/* tp_peer_sum.cuh — the one-shot sum of a tensor-parallel group whose GPUs
 * read each other's memory (NVLink peers, ranks of one process): every rank
 * reads every rank's part where it lies and adds them in rank order, in one
 * kernel between two flag barriers (kernels/cuda/tp_peer_sum.cu). For the
 * small reduces of decode steps it replaces NCCL's all-gather + tp_sum with
 * the same bits at a fraction of the latency. */
#ifndef CLLM_TP_PEER_SUM_CUH
#define CLLM_TP_PEER_SUM_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#define TP_PEER_MAX_RANKS 8
#define TP_PEER_BLOCKS 32 /* the most blocks a sum runs on: each has its own flags */

/* Each rank's flag area (device memory of its GPU, zeroed): [2 barriers][TP_PEER_BLOCKS][TP_PEER_MAX_RANKS]
 * words its peers write, then [TP_PEER_BLOCKS] epochs only it writes. */
#define TP_PEER_FLAG_WORDS (2 * TP_PEER_BLOCKS * TP_PEER_MAX_RANKS + TP_PEER_BLOCKS)

typedef struct {
    const void *part[TP_PEER_MAX_RANKS]; /* every rank's part, at the same offset of its own buffer */
    unsigned *flags[TP_PEER_MAX_RANKS];  /* every rank's flag area */
    int n_ranks, rank;
} TpPeers;

/* What the sum is written as: bf16 or fp32 values of out, or added to an
 * fp32 out (a residual) rounded to bf16 first, as add_rmsnorm adds a bf16
 * sublayer output. */
typedef enum { TP_PEER_OUT_BF16, TP_PEER_OUT_F32, TP_PEER_ADD_BF16 } TpPeerOut;

/* out[i] = ((part[0][i] + part[1][i]) + part[2][i]) + ... (fp32 adds in rank
 * order, rounded once to out's type: the bits of cuda_tp_sum and of the
 * host's sum), n values, parts bf16 or fp32. Every rank of the group must
 * launch it with the same n; none returns before every rank has read every
 * part, so a part may be overwritten by the next step on the stream. Returns the launch's error. */
cudaError_t cuda_tp_peer_sum(void *out, TpPeerOut how, const TpPeers *p, bool parts_bf16, int64_t n,
                             cudaStream_t s);

#endif
