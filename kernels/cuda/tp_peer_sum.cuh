/* tp_peer_sum.cuh — the one-shot sum of a tensor-parallel group whose GPUs
 * read each other's memory (NVLink peers, ranks of one process): every rank
 * puts its part in its staging buffer, the ranks meet once (flags), and each
 * reads every rank's staged part and adds them in rank order, in one kernel
 * (kernels/cuda/tp_peer_sum.cu). For the small reduces of decode steps it
 * replaces NCCL's all-gather + tp_sum with the same bits at a fraction of
 * the latency. */
#ifndef CLLM_TP_PEER_SUM_CUH
#define CLLM_TP_PEER_SUM_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#define TP_PEER_MAX_RANKS 8
#define TP_PEER_BLOCKS 32 /* the most blocks a sum runs on: each has its own flags */

/* Each rank's flag area (device memory of its GPU, zeroed): [TP_PEER_BLOCKS][TP_PEER_MAX_RANKS] words its
 * peers write, then [TP_PEER_BLOCKS] epochs only it writes. */
#define TP_PEER_FLAG_WORDS (TP_PEER_BLOCKS * TP_PEER_MAX_RANKS + TP_PEER_BLOCKS)

typedef struct {
    void *stage[TP_PEER_MAX_RANKS];     /* every rank's staging buffer: two slots of slot_bytes (sums alternate) */
    unsigned *flags[TP_PEER_MAX_RANKS]; /* every rank's flag area */
    size_t slot_bytes;                  /* the most a sum stages: its n values of 4 bytes or fewer */
    int n_ranks, rank;
} TpPeers;

/* What the sum is written as: bf16 or fp32 values of out, or added to an
 * fp32 out (a residual) rounded to bf16 first, as add_rmsnorm adds a bf16
 * sublayer output. */
typedef enum { TP_PEER_OUT_BF16, TP_PEER_OUT_F32, TP_PEER_ADD_BF16 } TpPeerOut;

/* out[i] = ((part[0][i] + part[1][i]) + part[2][i]) + ... where part[r] is
 * rank r's src (fp32 adds in rank order, rounded once to out's type: the
 * bits of cuda_tp_sum and of the host's sum), n values (n x 4 bytes <=
 * slot_bytes), parts bf16 or fp32; out may be src. Every rank of the group
 * must launch it with the same n. src is read by this rank alone (the peers
 * read its staged copy), so it may be overwritten by the next kernel on the
 * stream; a staging slot is written again two sums later, when every peer
 * has met this rank at the sum between (and so has read it). */
void cuda_tp_peer_sum(void *out, TpPeerOut how, const TpPeers *p, const void *src, bool parts_bf16, int64_t n,
                      cudaStream_t s);

#endif
