/* time_launch.h — the kernel benchmarks' timer: microseconds per launch, the
 * median of 7 samples of `loop` back-to-back launches after two warm-ups
 * (the median: a sample that met a clock change or another process does not
 * move it). NAN when a launch failed. */
#ifndef CLLM_TESTS_TIME_LAUNCH_H
#define CLLM_TESTS_TIME_LAUNCH_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

static int time_launch_cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float time_launch_us(int (*run)(void *), void *arg, int loop) {
    enum { REPS = 7 };
    float ms[REPS];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int rc = run(arg) || run(arg);
    for (int i = 0; i < REPS && !rc; i++) {
        cudaEventRecord(e0, 0);
        for (int k = 0; k < loop; k++) rc |= run(arg);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (rc) return NAN;
    qsort(ms, REPS, sizeof *ms, time_launch_cmp);
    return ms[REPS / 2] * 1000.0f / loop;
}

#endif
