/* fuzz_json.c — libFuzzer target for json_parse (build line in README.md).
 * One input = one JSON text; accepted documents are walked and their strings
 * re-escaped through JsonBuf and parsed back (tests/fuzz/fuzz_common.h). */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *bad = fuzz_json(data, size, NULL);
    if (bad) {
        fprintf(stderr, "fuzz_json: %s\n", bad);
        abort();
    }
    return 0;
}
