/* fuzz_gguf_loaders.c — libFuzzer target: a GGUF file's metadata through
 * config_from_gguf and its vocabulary through tokenizer_load_gguf; a loaded
 * tokenizer encodes a text made from the input's last 64 bytes (the tensor
 * data, rarely what a mutation of the metadata touches) and every id is
 * decoded (tests/fuzz/fuzz_loaders.h). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char text[8192];
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-gguf-loaders", MFD_CLOEXEC)) < 0) abort();
    const char *path = fuzz_file_path(fd, data, size, buf);
    size_t tail = size < 64 ? size : 64;
    size_t len = fuzz_text(data + size - tail, tail, text, sizeof text);
    const char *bad = path ? fuzz_gguf_loaders(path, text, len, NULL) : "cannot write the memfd";
    if (bad) { fprintf(stderr, "fuzz_gguf_loaders: %s\n", bad); abort(); }
    return 0;
}
