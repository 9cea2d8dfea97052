/* gpu_limits.c — the spec table of tensor-core rates and the dispatch to the
 * CUDA measurement (see gpu_limits.h). The rates are the vendors' datasheet
 * figures for dense matrices (without 2:4 sparsity). */
#include "kernels/gpu_limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

typedef struct {
    const char *words;   /* every word must appear whole in the device name */
    const char *not_word; /* a variant with other rates (NULL: none) */
    int cc_major;
    const char *label;
    double bf16, fp8;    /* dense TFLOP/s; fp8 0: none */
} GpuSpec;

/* First match wins: the PCIe H100 before the SXM one. */
static const GpuSpec SPECS[] = {
    {"H100 PCIe", NULL, 9, "H100 PCIe", 756.0, 1513.0},
    {"H100", "NVL", 9, "H100 SXM", 989.4, 1978.9},
    {"H200", "NVL", 9, "H200 SXM", 989.4, 1978.9},
    {"A100", NULL, 8, "A100", 312.0, 0.0},
    {"L40S", NULL, 8, "L40S", 362.0, 733.0},
    {"RTX 4090", "D", 8, "RTX 4090 (fp32 accumulate)", 165.2, 330.3},
};

/* 1 when `word` is a whole word of name (words end at space, '-' or '_'). */
static int has_word(const char *name, const char *word, size_t n) {
    for (const char *p = name; *p; p++) {
        if (strncmp(p, word, n)) continue;
        int starts = p == name || strchr(" -_", p[-1]);
        int ends = p[n] == 0 || strchr(" -_", p[n]);
        if (starts && ends) return 1;
    }
    return 0;
}

static int has_words(const char *name, const char *words) {
    while (*words) {
        size_t n = strcspn(words, " ");
        if (!has_word(name, words, n)) return 0;
        words += n;
        while (*words == ' ') words++;
    }
    return 1;
}

int gpu_limits_from_spec(GpuLimits *lim) {
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++) {
        const GpuSpec *s = &SPECS[i];
        if (s->cc_major != lim->cc_major || !has_words(lim->name, s->words)) continue;
        if (s->not_word && has_words(lim->name, s->not_word)) continue;
        lim->bf16_tflops = s->bf16;
        lim->fp8_tflops = s->fp8;
        snprintf(lim->flops_source, sizeof lim->flops_source, "spec table: %s, dense", s->label);
        return 1;
    }
    lim->bf16_tflops = lim->fp8_tflops = 0;
    snprintf(lim->flops_source, sizeof lim->flops_source, "unknown for %s (compute capability %d.%d)", lim->name,
             lim->cc_major, lim->cc_minor);
    return 0;
}

int gpu_limits_query(int device, GpuLimits *lim, Err *err) {
    memset(lim, 0, sizeof *lim);
#ifdef CLLM_CUDA
    if (gpu_limits_cuda_measure(device, lim, err)) return -1;
    gpu_limits_from_spec(lim);
    return 0;
#else
    (void)device;
    snprintf(lim->flops_source, sizeof lim->flops_source, "no GPU");
    return err_set(err, "no GPU: this cllm was built without CUDA");
#endif
}

int gpu_limits_cpu_measure(GpuLimits *lim, Err *err) {
    memset(lim, 0, sizeof *lim);
    snprintf(lim->name, sizeof lim->name, "CPU");
    snprintf(lim->flops_source, sizeof lim->flops_source, "no FLOP rate for the CPU");
    /* 256 MiB outsizes any last-level cache, so the copy runs at the memory's rate */
    size_t bytes = (size_t)256 << 20;
    char *src = NULL, *dst = NULL;
    for (; bytes >= ((size_t)16 << 20); bytes /= 2) {
        src = malloc(bytes), dst = malloc(bytes);
        if (src && dst) break;
        free(src), free(dst);
        src = dst = NULL;
    }
    if (!src) return err_set(err, "CPU memory bandwidth: no memory for two 16 MiB buffers");
    memset(src, 1, bytes), memset(dst, 2, bytes); /* the pages faulted in before the clock runs */
    double best = 0;
    enum { REPS = 5 };
    for (int i = 0; i < REPS; i++) {
        double t0 = now_seconds();
        memcpy(dst, src, bytes);
        double dt = now_seconds() - t0;
        src[i] = dst[bytes - 1 - i]; /* the copy's result used, so it is not optimized away */
        if (dt > 0 && (best == 0 || dt < best)) best = dt;
    }
    free(src), free(dst);
    if (best <= 0) return err_set(err, "CPU memory bandwidth: the clock did not advance over a copy");
    lim->copy_tbps = 2.0 * (double)bytes / best / 1e12; /* bytes read + written, as the GPU's copy */
    lim->copy_gib = (double)bytes / 1073741824.0;
    lim->copy_reps = REPS;
    return 0;
}
