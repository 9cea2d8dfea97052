/* cuda_libs.c — cuBLASLt and NCCL loaded at run time, and the GPU check
 * (see cuda_libs.h). */
#include "kernels/cuda/cuda_libs.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

int cuda_lib_open(const char *soname, const char *fix, const CudaSym *syms, int n, void *table, Err *err) {
    /* RTLD_LOCAL: its symbols serve this table only, never a name elsewhere */
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        if (!why || strstr(why, "No such file")) return err_set(err, "GPU found but %s not found: %s", soname, fix);
        return err_set(err, "GPU found but %s cannot be loaded (%s): %s", soname, why, fix);
    }
    for (int i = 0; i < n; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            dlclose(h);
            return err_set(err, "%s has no %s (an older version?): %s", soname, syms[i].name, fix);
        }
        memcpy((char *)table + syms[i].offset, &f, sizeof f);
    }
    return 0; /* h stays open: the table's pointers live as long as the process */
}

#ifdef CLLM_CUDA
#include <pthread.h>
#include <cuda_runtime_api.h>

/* The tables are process-wide, written once under pthread_once and only read
 * after: a library is loaded once per process whoever asks (dlopen hands
 * every caller the same one), and the CUDA backend's ops, graph captures and
 * pipeline stage threads all call through them, so one table per process is
 * what there is, not a hidden choice. */
typedef struct {
    pthread_once_t once;
    int rc;
    Err err;
} LoadOnce;

#define LT_SYM(f) {"cublasLt" #f, offsetof(CublasLt, f)}
static const CudaSym lt_syms[] = {
    LT_SYM(Create), LT_SYM(Destroy), LT_SYM(MatmulDescCreate), LT_SYM(MatmulDescDestroy),
    LT_SYM(MatmulDescSetAttribute), LT_SYM(MatrixLayoutCreate), LT_SYM(MatrixLayoutDestroy),
    LT_SYM(MatmulPreferenceCreate), LT_SYM(MatmulPreferenceDestroy), LT_SYM(MatmulPreferenceSetAttribute),
    LT_SYM(MatmulAlgoGetHeuristic), LT_SYM(Matmul),
};
static CublasLt lt_table;
static LoadOnce lt_once = {PTHREAD_ONCE_INIT, 0, {{0}}};

static void lt_load(void) {
    lt_once.rc = cuda_lib_open(CUBLASLT_SONAME, CUBLASLT_FIX, lt_syms, (int)(sizeof lt_syms / sizeof lt_syms[0]),
                               &lt_table, &lt_once.err);
}

const CublasLt *cublaslt_lib(Err *err) {
    pthread_once(&lt_once.once, lt_load);
    if (lt_once.rc == 0) return &lt_table;
    if (err) *err = lt_once.err;
    return NULL;
}

#define NCCL_SYM(f) {"nccl" #f, offsetof(Nccl, f)}
static const CudaSym nccl_syms[] = {
    NCCL_SYM(GetErrorString), NCCL_SYM(GetUniqueId), NCCL_SYM(CommInitAll), NCCL_SYM(CommInitRank),
    NCCL_SYM(CommDestroy), NCCL_SYM(CommAbort), NCCL_SYM(CommGetAsyncError), NCCL_SYM(Send), NCCL_SYM(Recv),
    NCCL_SYM(AllGather), NCCL_SYM(AllReduce), NCCL_SYM(Broadcast),
};
static Nccl nccl_table;
static LoadOnce nccl_once = {PTHREAD_ONCE_INIT, 0, {{0}}};

/* NVLink multicast (NVLS) stays off unless the user set NCCL_NVLS_ENABLE:
 * it takes memory and setup time on every communicator, and the machines
 * cllm runs its GPU checks on keep it off. Set here, before NCCL is loaded
 * and before any of its threads could read the environment. */
static void nccl_load(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    nccl_once.rc = cuda_lib_open(NCCL_SONAME, NCCL_FIX, nccl_syms, (int)(sizeof nccl_syms / sizeof nccl_syms[0]),
                                 &nccl_table, &nccl_once.err);
}

const Nccl *nccl_lib(Err *err) {
    pthread_once(&nccl_once.once, nccl_load);
    if (nccl_once.rc == 0) return &nccl_table;
    if (err) *err = nccl_once.err;
    return NULL;
}

int cuda_device_supported(int dev, Err *err) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return err_set(err, "GPU %d: cannot read its compute capability", dev);
    if (major * 10 + minor >= CUDA_MIN_CAPABILITY) return 0;
    char name[256] = "?";
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) == cudaSuccess) snprintf(name, sizeof name, "%s", p.name);
    return err_set(err, "GPU %d (%s) has compute capability %d.%d; cllm's GPU kernels need %d.%d or newer "
                   "(Ampere, Ada, Hopper, later)", dev, name, major, minor, CUDA_MIN_CAPABILITY / 10,
                   CUDA_MIN_CAPABILITY % 10);
}
#endif
