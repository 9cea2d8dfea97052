/* fuzz_safetensors.c — libFuzzer target for safetensors_open on a single
 * file (build line in README.md). The input is written to an in-memory file
 * opened through /proc/self/fd; accepted files must keep every tensor inside
 * the mapping (tests/fuzz/fuzz_common.h). */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1; /* one memfd for the whole run; libFuzzer gives no context pointer */
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-safetensors", MFD_CLOEXEC)) < 0) abort();
    const char *path = fuzz_file_path(fd, data, size, buf);
    const char *bad = path ? fuzz_safetensors_path(path, NULL) : "cannot write the memfd";
    if (bad) {
        fprintf(stderr, "fuzz_safetensors: %s\n", bad);
        abort();
    }
    return 0;
}
