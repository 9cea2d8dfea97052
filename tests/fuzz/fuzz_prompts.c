/* fuzz_prompts.c — libFuzzer target: a prompt file (text, JSON Lines or
 * OpenAI batch; gzip too, by its magic bytes) read to the end by the
 * prompt reader; the first byte picks the format and, a quarter of the time,
 * a short line limit (tests/fuzz/fuzz_loaders.h). */
#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static const PromptFormat fmts[] = {PROMPTS_AUTO, PROMPTS_TEXT, PROMPTS_JSONL, PROMPTS_OPENAI};
    char buf[64];
    if (fd < 0 && (fd = memfd_create("fuzz-prompts", MFD_CLOEXEC)) < 0) abort();
    uint8_t pick = size ? data[0] : 0;
    const char *path = fuzz_file_path(fd, data, size, buf);
    size_t max_line = (pick >> 2) % 4 == 0 ? 1 + (size_t)(pick >> 4) * 8 : PROMPTS_MAX_LINE;
    const char *bad = path ? fuzz_prompts(path, fmts[pick % 4], max_line, NULL) : "cannot write the memfd";
    if (bad) { fprintf(stderr, "fuzz_prompts: %s\n", bad); abort(); }
    return 0;
}
