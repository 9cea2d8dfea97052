/* quant_repack.cu — GGUF quantized tensor bytes -> the split layout of
 * quant.cuh (qs plane + sc plane), on the GPU, once at load. A byte copy:
 * one thread per block, bandwidth does not matter here. */
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant.cuh"
#include "kernels/cuda/quant_layout.cuh"

#define QUANT_PLANE_ALIGN 256

bool quant_type_supported(DType t) { return dtype_gpu_keeps_blocks(t); } /* one list, shared with the stage plan */

/* Where the native block's bytes go: [qs_from, qs_from + QB) to the qs plane,
 * the rest (in order, minus that range) to the sc plane. The 32-value blocks
 * end with their codes; the K blocks start with what the qs plane takes. */
static __device__ int qs_from(int q) { return quant_block_elems(q) == 32 ? quant_native_bytes(q) - quant_qs_bytes(q) : 0; }

/* F8_E4M3: no blocks; a row is cols one-byte codes (cols % 16 == 0 keeps each row's 16-byte loads
 * aligned) and one fp32 scale. */
#define F8_COLS_ALIGN 16

static size_t qs_plane_bytes(DType t, int64_t rows, int64_t cols) {
    size_t b = t == DT_F8_E4M3 ? (size_t)rows * (size_t)cols
                               : (size_t)rows * (size_t)(cols / quant_block_elems(t)) * quant_qs_bytes(t);
    return (b + QUANT_PLANE_ALIGN - 1) / QUANT_PLANE_ALIGN * QUANT_PLANE_ALIGN;
}

/* A multiple of 4 bytes: Q5_0's 6-byte records are read as the aligned words
 * that hold them (quant_q5_record), the last one's second word up to 2 bytes
 * past the records. */
static size_t sc_plane_bytes(DType t, int64_t rows, int64_t cols) {
    return ((size_t)rows * (size_t)(cols / quant_block_elems(t)) * quant_sc_bytes(t) + 3) / 4 * 4;
}

int quant_matrix_bytes(DType t, int64_t rows, int64_t cols, size_t *bytes, Err *err) {
    if (!quant_type_supported(t))
        return err_set(err, "quantized GEMV: type %s is not supported on the GPU",
                       dtype_info(t) ? dtype_info(t)->name : "?");
    if (t == DT_F8_E4M3) {
        if (rows <= 0 || cols <= 0 || cols % F8_COLS_ALIGN || cols > INT32_MAX)
            return err_set(err, "F8_E4M3 matrix [%lld][%lld]: columns must be a positive multiple of %d",
                           (long long)rows, (long long)cols, F8_COLS_ALIGN);
        *bytes = qs_plane_bytes(t, rows, cols) + (size_t)rows * sizeof(float);
        return 0;
    }
    if (rows <= 0 || cols <= 0 || cols % quant_block_elems(t) || cols > INT32_MAX)
        return err_set(err, "quantized GEMV: %s matrix [%lld][%lld]: columns must be a positive multiple of %d",
                       dtype_info(t)->name, (long long)rows, (long long)cols, quant_block_elems(t));
    *bytes = qs_plane_bytes(t, rows, cols) + sc_plane_bytes(t, rows, cols);
    return 0;
}

int quant_matrix_init(QuantMatrix *m, DType t, int64_t rows, int64_t cols, void *buf, Err *err) {
    size_t bytes;
    if (quant_matrix_bytes(t, rows, cols, &bytes, err)) return -1;
    if ((uintptr_t)buf % QUANT_PLANE_ALIGN) return err_set(err, "quant_matrix_init: buffer not 256-byte aligned");
    m->type = t;
    m->rows = rows;
    m->cols = cols;
    m->qs = buf;
    m->sc = t == DT_F8_E4M3 || quant_sc_bytes(t) ? (char *)buf + qs_plane_bytes(t, rows, cols) : NULL;
    m->input_scale = 0.0f;
    return 0;
}

__global__ void kernel_quant_repack(uint8_t *qs, uint8_t *sc, const uint8_t *native, int q, int64_t n_blocks) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    int nb = quant_native_bytes(q), qb = quant_qs_bytes(q), from = qs_from(q);
    const uint8_t *src = native + i * nb;
    uint8_t *dq = qs + i * qb, *ds = sc ? sc + i * (nb - qb) : NULL;
    for (int j = 0; j < nb; j++) {
        if (j >= from && j < from + qb) dq[j - from] = src[j];
        else ds[j < from ? j : j - qb] = src[j];
    }
}

int quant_repack(const QuantMatrix *m, const void *native, cudaStream_t s, Err *err) {
    size_t bytes;
    if (quant_matrix_bytes(m->type, m->rows, m->cols, &bytes, err)) return -1;
    if (m->type == DT_F8_E4M3) return err_set(err, "quant_repack: F8_E4M3 codes are not repacked");
    int64_t n_blocks = m->rows * (m->cols / quant_block_elems(m->type));
    int64_t grid = (n_blocks + 255) / 256;
    kernel_quant_repack<<<(unsigned)grid, 256, 0, s>>>((uint8_t *)m->qs, (uint8_t *)m->sc, (const uint8_t *)native,
                                                      m->type, n_blocks);
    CUDA_CHECK(cudaGetLastError(), err);
    return 0;
}
