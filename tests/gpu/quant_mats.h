/* quant_mats.h — random quantized matrices for the GPU kernel checks
 * (test_quant.c, test_quant_gemm.c): random GGUF blocks uploaded and
 * repacked on the device, the native bytes kept on the host for the CPU
 * reference (base/dtype.c dequantize_row). Header-only, test code. */
#ifndef CLLM_TESTS_GPU_QUANT_MATS_H
#define CLLM_TESTS_GPU_QUANT_MATS_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/quant.cuh"
#include "base/dtype.h"
#include "tests/test.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static float frand(void) { return (float)((rnd64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

static void put_half(uint8_t *p, float v) {
    uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static const DType TYPES[] = {DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K};
#define N_TYPES 8

/* Random GGUF blocks: random bytes, then the fp16 scale fields set to random
 * finite values of a realistic size (values of order 0.01 .. 0.1). */
static uint8_t *rand_native(DType t, int64_t rows, int64_t cols, size_t *nbytes) {
    const DTypeInfo *info = dtype_info(t);
    int64_t nb = rows * (cols / info->block_elems);
    *nbytes = (size_t)nb * info->block_bytes;
    uint8_t *p = malloc(*nbytes + 8);
    for (size_t i = 0; i < *nbytes; i += 8) {
        uint64_t r = rnd64();
        memcpy(p + i, &r, 8);
    }
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * info->block_bytes;
        switch (t) {
        case DT_Q8_0: put_half(blk, 0.001f * frand()); break;
        case DT_Q4_0: case DT_Q5_0: put_half(blk, 0.02f * frand()); break;
        case DT_Q4_1: put_half(blk, 0.01f * (1.1f + frand())); put_half(blk + 2, -0.08f * (1.1f + frand())); break;
        case DT_Q5_1: put_half(blk, 0.005f * (1.1f + frand())); put_half(blk + 2, -0.08f * (1.1f + frand())); break;
        case DT_Q4_K: case DT_Q5_K:
            put_half(blk, 0.0005f * (1.1f + frand())); put_half(blk + 2, 0.001f * (1.1f + frand())); break;
        case DT_Q6_K: put_half(blk + 208, 0.0001f * frand()); break;
        default: break;
        }
    }
    return p;
}

typedef struct {
    DType type;
    int64_t rows, cols;
    size_t native_bytes, dev_bytes;
    uint8_t *native;     /* host */
    void *dev;           /* repacked, device */
    QuantMatrix m;
} Mat;

static int mat_build(Mat *M, DType t, int64_t rows, int64_t cols) {
    Err err = {{0}};
    memset(M, 0, sizeof *M);
    M->type = t; M->rows = rows; M->cols = cols;
    M->native = rand_native(t, rows, cols, &M->native_bytes);
    void *dn = NULL;
    int rc = quant_matrix_bytes(t, rows, cols, &M->dev_bytes, &err);
    rc = rc || cudaMalloc(&M->dev, M->dev_bytes) != cudaSuccess || cudaMalloc(&dn, M->native_bytes) != cudaSuccess;
    rc = rc || cudaMemcpy(dn, M->native, M->native_bytes, cudaMemcpyHostToDevice) != cudaSuccess;
    rc = rc || quant_matrix_init(&M->m, t, rows, cols, M->dev, &err) || quant_repack(&M->m, dn, 0, &err);
    rc = rc || cudaDeviceSynchronize() != cudaSuccess;
    cudaFree(dn);
    CHECK(!rc, "%s [%lld][%lld]: build failed: %s", dtype_info(t)->name, (long long)rows, (long long)cols, err.msg);
    return rc ? -1 : 0;
}

static void mat_free(Mat *M) {
    free(M->native);
    cudaFree(M->dev);
}

/* the rows a check looks at: all of a small matrix (up to max), else the
 * first and last 8 and a random spread */
static int quant_check_rows(int64_t rows, int64_t *out, int max) {
    if (rows <= max) {
        for (int64_t r = 0; r < rows; r++) out[r] = r;
        return (int)rows;
    }
    int n = 0;
    for (int64_t r = 0; r < 8; r++) out[n++] = r;
    for (int64_t r = rows - 8; r < rows; r++) out[n++] = r;
    while (n < max) out[n++] = (int64_t)(rnd64() % (uint64_t)rows);
    return n;
}

/* qsort order of floats (timing medians) */
static int quant_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* whether a CUDA device is there (else a "not ok" line for the test count) */
static bool quant_have_device(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
    printf("not ok - no CUDA device\n");
    return false;
}

#endif
