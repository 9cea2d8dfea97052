/* fuzz_config.c — libFuzzer target: a config.json text through
 * config_from_hf (tests/fuzz/fuzz_loaders.h; build: build.sh). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *bad = fuzz_config_json(data, size, NULL);
    if (bad) { fprintf(stderr, "fuzz_config: %s\n", bad); abort(); }
    return 0;
}
