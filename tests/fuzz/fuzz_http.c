/* fuzz_http.c — libFuzzer target: the bytes a client sends to `cllm serve`,
 * through the HTTP request parser and, for a whole request, its body through
 * the OpenAI body parser of both endpoints (tests/fuzz/fuzz_loaders.h). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *bad = fuzz_http(data, size, NULL);
    if (bad) { fprintf(stderr, "fuzz_http: %s\n", bad); abort(); }
    return 0;
}
