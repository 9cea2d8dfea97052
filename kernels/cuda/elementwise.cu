/* elementwise.cu — the small kernels between the GEMMs (elementwise.cuh).
 * Where every width is a multiple of 8, the x8 kernels move 16 bytes a
 * thread (the scalar ones keep too little in flight at prefill sizes); both
 * compute the same values. */
#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

__global__ void kernel_embed(float *out, const bf16 *table, const int32_t *ids, int C, float scale) {
    pdl_enter();
    int t = blockIdx.y;
    const bf16 *row = table + (int64_t)ids[t] * C;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)t * C + c] = __bfloat162float(row[c]) * scale;
}

__global__ void kernel_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk,
                                 const float *bv, int nq, int nk, int nv) {
    pdl_enter();
    int t = blockIdx.y, n = nq + nk + nv;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float a = __bfloat162float(qkv[(int64_t)t * n + i]);
        if (i < nq) q[(int64_t)t * nq + i] = __float2bfloat16(bq ? a + bq[i] : a);
        else if (i < nq + nk) k[(int64_t)t * nk + i - nq] = __float2bfloat16(bk ? a + bk[i - nq] : a);
        else v[(int64_t)t * nv + i - nq - nk] = __float2bfloat16(bv ? a + bv[i - nq - nk] : a);
    }
}

/* Eight values a thread (16-byte loads and stores) where every part's width is a
 * multiple of 8: the scalar kernel keeps ~2 KB in flight an SM, a third of the
 * bandwidth at prefill sizes. Same values as kernel_split_qkv. */
__global__ void kernel_split_qkv_x8(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk,
                                    const float *bv, int nq, int nk, int nv) {
    pdl_enter();
    int t = blockIdx.y, n = nq + nk + nv;
    for (int i = 8 * (blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 8 * gridDim.x * blockDim.x) {
        uint4 in = *(const uint4 *)(qkv + (int64_t)t * n + i);
        bf16 *dst;
        const float *b;
        int j;
        if (i < nq) dst = q + (int64_t)t * nq + i, b = bq, j = i;
        else if (i < nq + nk) dst = k + (int64_t)t * nk + i - nq, b = bk, j = i - nq;
        else dst = v + (int64_t)t * nv + i - nq - nk, b = bv, j = i - nq - nk;
        if (b) {
            bf16 *e = (bf16 *)&in;
#pragma unroll
            for (int c = 0; c < 8; c++) e[c] = __float2bfloat16(__bfloat162float(e[c]) + b[j + c]);
        }
        *(uint4 *)dst = in;
    }
}

__global__ void kernel_add_bias(void *y, bool y_f32, const float *bias, int T, int n) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)T * n; i += (int64_t)gridDim.x * blockDim.x) {
        if (y_f32) ((float *)y)[i] += bias[i % n];
        else ((bf16 *)y)[i] = __float2bfloat16(__bfloat162float(((bf16 *)y)[i]) + bias[i % n]);
    }
}

__global__ void kernel_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu,
                           int F, Activation act, float limit) {
    pdl_enter();
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F; i += gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[(int64_t)t * ld + i]), u = __bfloat162float(up[(int64_t)t * ld + i]);
        if (bg) g += bg[i];
        if (bu) u += bu[i];
        out[(int64_t)t * F + i] = __float2bfloat16(act_glu(g, u, act, limit));
    }
}

/* Eight values a thread (16-byte loads and stores: see kernel_split_qkv_x8);
 * F and ld multiples of 8. Same values as kernel_glu. */
__global__ void kernel_glu_x8(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu,
                              int F, Activation act, float limit) {
    pdl_enter();
    int t = blockIdx.y;
    for (int i = 8 * (blockIdx.x * blockDim.x + threadIdx.x); i < F; i += 8 * gridDim.x * blockDim.x) {
        uint4 gv = *(const uint4 *)(gate + (int64_t)t * ld + i), uv = *(const uint4 *)(up + (int64_t)t * ld + i), o;
        const bf16 *ge = (const bf16 *)&gv, *ue = (const bf16 *)&uv;
        bf16 *oe = (bf16 *)&o;
#pragma unroll
        for (int c = 0; c < 8; c++) {
            float g = __bfloat162float(ge[c]), u = __bfloat162float(ue[c]);
            if (bg) g += bg[i + c];
            if (bu) u += bu[i + c];
            oe[c] = __float2bfloat16(act_glu(g, u, act, limit));
        }
        *(uint4 *)(out + (int64_t)t * F + i) = o;
    }
}

__global__ void kernel_softcap(float *x, int64_t n, float cap) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

__global__ void kernel_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int C) {
    pdl_enter();
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        dst[(int64_t)i * C + c] = src[(int64_t)rows[i] * C + c];
}

__global__ void kernel_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int C) {
    pdl_enter();
    int i = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        out[(int64_t)rows[i] * C + c] += w[i] * __bfloat162float(src[(int64_t)i * C + c]);
}

__global__ void kernel_f32_to_bf16(bf16 *out, const float *x, int64_t n) {
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(x[i]);
}

/* ---------------- launchers ---------------- */

void cuda_embed(float *out, const bf16 *table, const int32_t *ids, int T, int C, float scale, cudaStream_t s) {
    launch_pdl(kernel_embed, dim3(grid_for(C, 256), T), 256, 0, s, out, table, ids, C, scale);
}

void cuda_split_qkv(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, const float *bq, const float *bk, const float *bv,
                    int T, int nq, int nk, int nv, cudaStream_t s) {
    if (nq % 8 == 0 && nk % 8 == 0 && nv % 8 == 0 && aligned16(q, k, v, qkv))
        launch_pdl(kernel_split_qkv_x8, dim3(grid_for((nq + nk + nv) / 8, 128), T), 128, 0, s, q, k, v, qkv, bq, bk,
                   bv, nq, nk, nv);
    else launch_pdl(kernel_split_qkv, dim3(grid_for(nq + nk + nv, 256), T), 256, 0, s, q, k, v, qkv, bq, bk, bv, nq, nk, nv);
}

void cuda_add_bias(void *y, bool y_f32, const float *bias, int T, int n, cudaStream_t s) {
    launch_pdl(kernel_add_bias, grid_for((int64_t)T * n, 256), 256, 0, s, y, y_f32, bias, T, n);
}

void cuda_glu(bf16 *out, const bf16 *gate, const bf16 *up, int ld, const float *bg, const float *bu, int T, int F,
              Activation act, float limit, cudaStream_t s) {
    if (T <= 0) return;
    if (F % 8 == 0 && ld % 8 == 0 && aligned16(out, gate, up, up))
        launch_pdl(kernel_glu_x8, dim3(grid_for(F / 8, 128), T), 128, 0, s, out, gate, up, ld, bg, bu, F, act, limit);
    else launch_pdl(kernel_glu, dim3(grid_for(F, 256), T), 256, 0, s, out, gate, up, ld, bg, bu, F, act, limit);
}

void cuda_softcap(float *x, int64_t n, float cap, cudaStream_t s) {
    launch_pdl(kernel_softcap, grid_for(n, 256), 256, 0, s, x, n, cap);
}

void cuda_gather_rows(bf16 *dst, const bf16 *src, const int32_t *rows, int n, int C, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_gather_rows, dim3(grid_for(C, 256), n), 256, 0, s, dst, src, rows, C);
}

void cuda_scatter_add(float *out, const bf16 *src, const int32_t *rows, const float *w, int n, int C, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_scatter_add, dim3(grid_for(C, 256), n), 256, 0, s, out, src, rows, w, C);
}

void cuda_f32_to_bf16(bf16 *out, const float *x, int64_t n, cudaStream_t s) {
    if (n > 0) launch_pdl(kernel_f32_to_bf16, grid_for(n, 256), 256, 0, s, out, x, n);
}
