/* fuzz_tokenizer_json.c — libFuzzer target: a tokenizer.json through
 * tokenizer_load_hf; a loaded tokenizer encodes a text made from the input's
 * first 64 bytes and every id is decoded (tests/fuzz/fuzz_loaders.h). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char text[8192];
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-tokenizer", MFD_CLOEXEC)) < 0) abort();
    const char *path = fuzz_file_path(fd, data, size, buf);
    size_t len = fuzz_text(data, size < 64 ? size : 64, text, sizeof text);
    const char *bad = path ? fuzz_tokenizer_hf(path, NULL, text, len, NULL) : "cannot write the memfd";
    if (bad) { fprintf(stderr, "fuzz_tokenizer_json: %s\n", bad); abort(); }
    return 0;
}
