/* moe.cu — mixture-of-experts routing and combining on the device (moe.cuh). */
#include "kernels/cuda/moe.cuh"

#include <math.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

/* One thread per row: E and k are small (gpt-oss: 32 / 4). Same choice as
 * the CPU's moe_route: repeated argmax, the lowest id on ties. */
__global__ void kernel_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k) {
    pdl_enter();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *lg = logits + (int64_t)t * E;
    int32_t *st = sel + (int64_t)t * k;
    float *wt = w + (int64_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= st[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        st[j] = best;
    }
    float m = lg[st[0]], sum = 0;
    for (int j = 0; j < k; j++) sum += wt[j] = expf(lg[st[j]] - m);
    for (int j = 0; j < k; j++) wt[j] /= sum;
}

__global__ void kernel_moe_combine(bf16 *out, const bf16 *y, const float *w, int k, int C) {
    pdl_enter();
    int t = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float a = 0;
        for (int j = 0; j < k; j++) a += w[t * k + j] * __bfloat162float(y[((int64_t)t * k + j) * C + c]);
        out[(int64_t)t * C + c] = __float2bfloat16(a);
    }
}

void cuda_moe_route(int32_t *sel, float *w, const float *logits, int T, int E, int k, cudaStream_t s) {
    launch_pdl(kernel_moe_route, (T + 63) / 64, 64, 0, s, sel, w, logits, T, E, k);
}

void cuda_moe_combine(bf16 *out, const bf16 *y, const float *w, int T, int k, int C, cudaStream_t s) {
    if (T > 0) launch_pdl(kernel_moe_combine, dim3(grid_for(C, 256), T), 256, 0, s, out, y, w, k, C);
}
