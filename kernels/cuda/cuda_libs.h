/* cuda_libs.h — what the CUDA backend needs from the machine beyond the
 * driver: cuBLASLt and NCCL, loaded at run time (dlopen of their versioned
 * sonames), and a GPU its kernels were built for.
 *
 * cllm links them at run time, not at build time, so that one binary starts
 * on any Linux machine: without the CUDA libraries it runs on the CPU and
 * says why (backend_gpu_count), where a linked library would stop it before
 * main. Each table holds exactly the entry points cllm calls; their types
 * come from the toolkit's headers.
 *
 * cuda_lib_open, the loader itself, needs no CUDA header and is built in
 * every configuration, so its failure path is unit-tested everywhere
 * (tests/test_cuda_libs.c). */
#ifndef CLLM_CUDA_LIBS_H
#define CLLM_CUDA_LIBS_H

#include <stddef.h>

#include "base/err.h"

/* nvcc: the CUDA backend's own files */
#if defined(CLLM_CUDA) || defined(__CUDACC__)
#define CLLM_CUDA_LIBS_TABLES 1
#include <cublasLt.h> /* outside extern "C": its C++ overloads */
#include <nccl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CUBLASLT_SONAME "libcublasLt.so.13"
#define NCCL_SONAME "libnccl.so.2"
/* What to do when each is missing (the end of the loader's message). */
#define CUBLASLT_FIX "install the CUDA 13 runtime or pass --cpu"
#define NCCL_FIX "install NCCL 2 for CUDA 13 (libnccl2), or pass --cpu, or run without --pp"

/* One entry point: its exported name and where its pointer goes in a table. */
typedef struct {
    const char *name;
    size_t offset;
} CudaSym;

/* Opens soname (the loader's search path: LD_LIBRARY_PATH, ldconfig's
 * cache) and stores the address of each of syms[0..n-1] in table at its
 * offset. The library stays loaded for the life of the process, as a
 * linked one would. -1 with err "GPU found but SONAME not found: FIX" when
 * it cannot be opened, "SONAME has no NAME (...): FIX" when an entry point
 * is missing (an older version). */
int cuda_lib_open(const char *soname, const char *fix, const CudaSym *syms, int n, void *table, Err *err);

#ifdef CLLM_CUDA_LIBS_TABLES

typedef struct {
    __typeof__(cublasLtCreate) *Create;
    __typeof__(cublasLtDestroy) *Destroy;
    __typeof__(cublasLtMatmulDescCreate) *MatmulDescCreate;
    __typeof__(cublasLtMatmulDescDestroy) *MatmulDescDestroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *MatmulDescSetAttribute;
    __typeof__(cublasLtMatrixLayoutCreate) *MatrixLayoutCreate;
    __typeof__(cublasLtMatrixLayoutDestroy) *MatrixLayoutDestroy;
    __typeof__(cublasLtMatmulPreferenceCreate) *MatmulPreferenceCreate;
    __typeof__(cublasLtMatmulPreferenceDestroy) *MatmulPreferenceDestroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *MatmulPreferenceSetAttribute;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *MatmulAlgoGetHeuristic;
    __typeof__(cublasLtMatmul) *Matmul;
} CublasLt;

typedef struct {
    __typeof__(ncclGetErrorString) *GetErrorString;
    __typeof__(ncclGetUniqueId) *GetUniqueId;
    __typeof__(ncclCommInitAll) *CommInitAll;
    __typeof__(ncclCommInitRank) *CommInitRank;
    __typeof__(ncclCommDestroy) *CommDestroy;
    __typeof__(ncclCommAbort) *CommAbort;
    __typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
    __typeof__(ncclSend) *Send;
    __typeof__(ncclRecv) *Recv;
    __typeof__(ncclAllGather) *AllGather;  /* --tp: the partial sums, summed in rank order after */
    __typeof__(ncclAllReduce) *AllReduce;  /* --tp-nccl-sum */
    __typeof__(ncclBroadcast) *Broadcast;  /* --pp with --tp: a stage's input from its rank 0 to the others */
} Nccl;

/* The process's cuBLASLt / NCCL, loaded on the first call (later calls
 * return the same table, or the same error); NULL with err when the library
 * or one of its entry points is missing. */
const CublasLt *cublaslt_lib(Err *err);
const Nccl *nccl_lib(Err *err);

/* Compute capability 8.0 is the oldest the kernels are built for (sm_80). */
#define CUDA_MIN_CAPABILITY 80
/* 0 when GPU dev can run cllm's kernels; -1 with err naming the GPU and its
 * compute capability when it is older than CUDA_MIN_CAPABILITY. */
int cuda_device_supported(int dev, Err *err);
#endif

#ifdef __cplusplus
}
#endif

#endif
