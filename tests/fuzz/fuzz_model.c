/* fuzz_model.c — libFuzzer target: a whole GGUF file through model_load
 * (config, vocabulary, every weight bound and its shape checked), then the
 * tokenizer's encode/decode and a read of every tensor's first and last byte
 * (tests/fuzz/fuzz_loaders.h). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char text[8192];
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-model", MFD_CLOEXEC)) < 0) abort();
    const char *path = fuzz_file_path(fd, data, size, buf);
    size_t tail = size < 64 ? size : 64;
    size_t len = fuzz_text(data + size - tail, tail, text, sizeof text);
    const char *bad = path ? fuzz_model(path, text, len, NULL) : "cannot write the memfd";
    if (bad) { fprintf(stderr, "fuzz_model: %s\n", bad); abort(); }
    return 0;
}
