/* fuzz_logits.c — libFuzzer target: a `cllm perplexity --save-logits` file
 * read as --kl-divergence reads it (header, ids, every row;
 * tests/fuzz/fuzz_loaders.h). Seeds: files written by the tool. */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-logits", MFD_CLOEXEC)) < 0) abort();
    const char *path = fuzz_file_path(fd, data, size, buf);
    const char *bad = path ? fuzz_logits_file(path, NULL) : "cannot write the memfd";
    if (bad) { fprintf(stderr, "fuzz_logits: %s\n", bad); abort(); }
    return 0;
}
