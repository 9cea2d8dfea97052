// bench/kernel_timeline.c — a CUPTI injection library that writes every kernel's
// start and end as the GPU ran them (graph replays and programmatic dependent
// launches included, nothing serialized), so gaps and overlaps between the
// kernels of a decode step can be read. ncu times kernels one at a time and
// cannot show them; the machine has no nsys.
//
// Build (CUPTI's headers and library come with the CUDA toolkit; bench/timeline.sh):
//   gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include bench/kernel_timeline.c
//       -L/usr/local/cuda/lib64 -l:libcupti.so.13 -o kernel_timeline.so
// Run: CUDA_INJECTION64_PATH=$PWD/kernel_timeline.so CLLM_TIMELINE_OUT=t.tsv ./cllm bench ...
// Output: one line per kernel, "start_ns end_ns graph_id graph_node stream grid block name"
// (times from CUPTI's clock; the mangled name as the driver gives it).
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { TIMELINE_BUFFER_BYTES = 8 << 20 };

// CUPTI calls back with no user pointer, so the output file is the one piece of
// state this library keeps at file scope (it lives inside a profiling tool, not cllm).
static FILE *timeline_out;

static void timeline_check(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return;
    const char *msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "kernel_timeline: %s: %s\n", what, msg);
}

static void CUPTIAPI timeline_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, TIMELINE_BUFFER_BYTES);
    *size = *buf ? TIMELINE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void timeline_write_kernel(const CUpti_ActivityKernel10 *k) {
    fprintf(timeline_out, "%llu\t%llu\t%u\t%llu\t%u\t%d,%d,%d\t%d\t%s\n", (unsigned long long)k->start,
            (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->streamId, k->gridX,
            k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
}

static void CUPTIAPI timeline_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                               size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (timeline_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            timeline_write_kernel((const CUpti_ActivityKernel10 *)rec);
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
    if (dropped) fprintf(stderr, "kernel_timeline: %zu records dropped\n", dropped);
    free(buf);
}

static void timeline_flush(void) {
    timeline_check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
    if (timeline_out) fclose(timeline_out);
    timeline_out = NULL;
}

// Called by the CUDA driver at cuInit when CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char *path = getenv("CLLM_TIMELINE_OUT");
    timeline_out = fopen(path ? path : "kernel_timeline.tsv", "w");
    if (!timeline_out) {
        fprintf(stderr, "kernel_timeline: cannot open %s\n", path ? path : "kernel_timeline.tsv");
        return 0;
    }
    timeline_check(cuptiActivityRegisterCallbacks(timeline_buffer_requested, timeline_buffer_completed),
                   "cuptiActivityRegisterCallbacks");
    timeline_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
    atexit(timeline_flush);
    return 1;
}
