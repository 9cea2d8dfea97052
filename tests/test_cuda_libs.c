/* test_cuda_libs.c — the run-time loader of cuBLASLt and NCCL
 * (kernels/cuda/cuda_libs.h): its messages when a library or an entry point
 * is missing, and a table filled from a library that is there (libm, so the
 * test runs on any machine). A machine without a GPU never loads cuBLASLt,
 * so this is where the missing-library path is checked. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cuda/cuda_libs.h"
#include "tests/test.h"

typedef struct {
    double (*f_cos)(double);
    double (*f_sqrt)(double);
} MathTable;

static const CudaSym math_syms[] = {{"cos", offsetof(MathTable, f_cos)}, {"sqrt", offsetof(MathTable, f_sqrt)}};

static void test_missing_library(void) {
    MathTable t = {0};
    Err err = {{0}};
    int rc = cuda_lib_open("libcllm-absent.so.13", CUBLASLT_FIX, math_syms, 2, &t, &err);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(strcmp(err.msg, "GPU found but libcllm-absent.so.13 not found: install the CUDA 13 runtime or pass --cpu") == 0,
          "message '%s'", err.msg);
    CHECK(!t.f_cos && !t.f_sqrt, "table written");
    rc = cuda_lib_open("libcllm-absent.so.2", NCCL_FIX, math_syms, 2, &t, &err);
    CHECK(rc == -1 && strstr(err.msg, "GPU found but libcllm-absent.so.2 not found: install NCCL"), "message '%s'",
          err.msg);
}

static void test_present_library(void) {
    MathTable t = {0};
    Err err = {{0}};
    int rc = cuda_lib_open("libm.so.6", CUBLASLT_FIX, math_syms, 2, &t, &err);
    CHECK(rc == 0, "rc %d: %s", rc, err.msg);
    if (rc) return;
    CHECK(t.f_cos && t.f_cos(0.0) == 1.0, "cos(0) through the table");
    CHECK(t.f_sqrt && t.f_sqrt(16.0) == 4.0, "sqrt(16) through the table");
}

static void test_missing_entry_point(void) {
    MathTable t = {0};
    Err err = {{0}};
    const CudaSym syms[] = {{"cos", offsetof(MathTable, f_cos)}, {"cllm_no_such_entry", offsetof(MathTable, f_sqrt)}};
    int rc = cuda_lib_open("libm.so.6", CUBLASLT_FIX, syms, 2, &t, &err);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(strcmp(err.msg, "libm.so.6 has no cllm_no_such_entry (an older version?): install the CUDA 13 runtime or "
                          "pass --cpu") == 0, "message '%s'", err.msg);
}

/* A file that is there but no library: not "not found", the loader's reason. */
static void test_not_a_library(void) {
    char path[] = "/tmp/cllm-not-a-lib-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    CHECK(write(fd, "not an ELF file\n", 16) == 16, "write");
    close(fd);
    MathTable t = {0};
    Err err = {{0}};
    int rc = cuda_lib_open(path, CUBLASLT_FIX, math_syms, 2, &t, &err);
    unlink(path);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(strstr(err.msg, "cannot be loaded (") && strstr(err.msg, path) && !strstr(err.msg, "not found"),
          "message '%s'", err.msg);
}

int main(void) {
    RUN(test_missing_library);
    RUN(test_present_library);
    RUN(test_missing_entry_point);
    RUN(test_not_a_library);
    TEST_EXIT();
}
