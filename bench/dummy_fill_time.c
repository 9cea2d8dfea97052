/* dummy_fill_time.c — times model/dummy.c's fill of --dummy-weights values
 * on the sizes a big model asks for: 1 GiB of bf16 (the 8B shape's
 * embedding) and 0.5 GiB of F8_E4M3 and Q4_K. Not a test: prints one line a
 * type and thread count (1, and dummy_fill's choice: the online CPUs), the first fill of a fresh buffer (page faults included, as the
 * loader's) and the best of 3 fills of that buffer once touched.
 *
 *   make -s build/cpu/libcllm.a
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -I. bench/dummy_fill_time.c build/cpu/libcllm.a \
 *       -l:libz.a -lm -ldl -pthread -o /tmp/dummy_fill_time && /tmp/dummy_fill_time
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "model/dummy.h"

static int time_fill(DType t, uint64_t bytes, int threads) {
    void *buf = malloc(bytes);
    if (!buf) { fprintf(stderr, "out of memory for %llu bytes\n", (unsigned long long)bytes); return -1; }
    double t0 = now_seconds();
    dummy_fill_threads(t, buf, bytes, threads);
    double first = now_seconds() - t0, best = 1e30;
    for (int r = 0; r < 3; r++) {
        t0 = now_seconds();
        dummy_fill_threads(t, buf, bytes, threads);
        double s = now_seconds() - t0;
        if (s < best) best = s;
    }
    printf("%-8s %7.1f MiB  %-9s first %6.3f s  best %6.3f s  %6.2f GB/s\n", dtype_info(t)->name, bytes / 1048576.0,
           threads ? "1 thread" : "threads", first, best, bytes / best / 1e9);
    free(buf);
    return 0;
}

int main(void) {
    const struct { DType t; uint64_t bytes; } CASES[] = {
        {DT_BF16, 1ull << 30}, {DT_F8_E4M3, 1ull << 29}, {DT_Q4_K, (1ull << 29) / 144 * 144}};
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (time_fill(CASES[i].t, CASES[i].bytes, 1) || time_fill(CASES[i].t, CASES[i].bytes, 0)) return 1;
    return 0;
}
