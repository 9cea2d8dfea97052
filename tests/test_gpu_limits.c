/* test_gpu_limits.c — the spec table of tensor-core rates
 * (kernels/gpu_limits.c): the names CUDA reports for each card map to that
 * card's datasheet figures (dense, no sparsity), variants with other rates
 * (NVL, GH200, RTX 4090 D) and cards not in the table get none, and the CPU
 * build's query says there is no GPU. */
#include "kernels/gpu_limits.h"
#include "tests/test.h"

typedef struct {
    const char *name;
    int major, minor;
    double bf16, fp8; /* 0: unknown / none */
    const char *source;
} Case;

static void test_spec_table(void) {
    const Case cases[] = {
        {"NVIDIA H100 80GB HBM3", 9, 0, 989.4, 1978.9, "spec table: H100 SXM"},
        {"NVIDIA H100 PCIe", 9, 0, 756, 1513, "spec table: H100 PCIe"},
        {"NVIDIA H200", 9, 0, 989.4, 1978.9, "spec table: H200 SXM"},
        {"NVIDIA A100-SXM4-80GB", 8, 0, 312, 0, "spec table: A100"},
        {"NVIDIA A100-PCIE-40GB", 8, 0, 312, 0, "spec table: A100"},
        {"NVIDIA L40S", 8, 9, 362, 733, "spec table: L40S"},
        {"NVIDIA GeForce RTX 4090", 8, 9, 165.2, 330.3, "spec table: RTX 4090"},
        /* other rates than the card the name resembles: not guessed */
        {"NVIDIA H100 NVL", 9, 0, 0, 0, "unknown for NVIDIA H100 NVL"},
        {"NVIDIA H200 NVL", 9, 0, 0, 0, "unknown for NVIDIA H200 NVL"},
        {"NVIDIA GH200 480GB", 9, 0, 0, 0, "unknown for NVIDIA GH200 480GB"},
        {"NVIDIA GeForce RTX 4090 D", 8, 9, 0, 0, "unknown for NVIDIA GeForce RTX 4090 D"},
        {"NVIDIA GeForce RTX 3090", 8, 6, 0, 0, "unknown for NVIDIA GeForce RTX 3090"},
        {"NVIDIA B200", 10, 0, 0, 0, "unknown for NVIDIA B200 (compute capability 10.0)"},
        /* a name the table knows with a compute capability it does not */
        {"NVIDIA H200", 8, 0, 0, 0, "unknown for NVIDIA H200"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const Case *c = &cases[i];
        GpuLimits lim = {0};
        snprintf(lim.name, sizeof lim.name, "%s", c->name);
        lim.cc_major = c->major, lim.cc_minor = c->minor;
        int known = gpu_limits_from_spec(&lim);
        CHECK(known == (c->bf16 > 0), "%s: known %d", c->name, known);
        CHECK(lim.bf16_tflops == c->bf16 && lim.fp8_tflops == c->fp8, "%s: bf16 %g fp8 %g, want %g %g", c->name,
              lim.bf16_tflops, lim.fp8_tflops, c->bf16, c->fp8);
        CHECK(!strncmp(lim.flops_source, c->source, strlen(c->source)), "%s: source '%s', want '%s...'", c->name,
              lim.flops_source, c->source);
    }
}

static void test_query_without_gpu(void) {
#ifndef CLLM_CUDA
    GpuLimits lim;
    Err err = {{0}};
    CHECK(gpu_limits_query(0, &lim, &err) == -1, "the CPU build measured a GPU");
    CHECK(strstr(err.msg, "no GPU") != NULL, "err '%s'", err.msg);
    CHECK(lim.copy_tbps == 0 && lim.bf16_tflops == 0, "limits %g %g", lim.copy_tbps, lim.bf16_tflops);
#endif
}

int main(void) {
    RUN(test_spec_table);
    RUN(test_query_without_gpu);
    TEST_EXIT();
}
