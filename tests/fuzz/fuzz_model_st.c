/* fuzz_model_st.c — libFuzzer target: a safetensors model folder through
 * model_load. The input is its config.json; the weights, tokenizer.json and
 * tokenizer_config.json are the tiny Llama fixture's
 * ($CLLM_FIXTURES/tiny/llama, default tests/fixtures/tiny/llama), copied
 * once into a fresh folder, so a config that disagrees with them is what the
 * loader must refuse (tests/fuzz/fuzz_loaders.h). */
#include <sys/stat.h>

#include "tests/fuzz/fuzz_loaders.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    if (!in || !out) { fprintf(stderr, "fuzz_model_st: cannot copy %s to %s\n", from, to); abort(); }
    char b[65536];
    size_t n;
    while ((n = fread(b, 1, sizeof b, in)) > 0) fwrite(b, 1, n, out);
    fclose(in);
    fclose(out);
}

static char dir[128];

/* The folder goes at exit (libFuzzer ends a timed run with exit()). */
static void remove_dir(void) {
    static const char *names[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    char path[256];
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static const char *model_dir(void) {
    if (dir[0]) return dir;
    const char *fx = getenv("CLLM_FIXTURES") ? getenv("CLLM_FIXTURES") : "tests/fixtures";
    snprintf(dir, sizeof dir, "%s/cllm-fuzz-model-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) abort();
    atexit(remove_dir);
    static const char *names[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 3; i++) {
        char from[1024], to[256];
        snprintf(from, sizeof from, "%s/tiny/llama/%s", fx, names[i]);
        snprintf(to, sizeof to, "%s/%s", dir, names[i]);
        copy_file(from, to);
    }
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char text[8192];
    const char *dir = model_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
    size_t len = fuzz_text(data, size < 64 ? size : 64, text, sizeof text);
    const char *bad = fuzz_model(dir, text, len, NULL);
    if (bad) { fprintf(stderr, "fuzz_model_st: %s\n", bad); abort(); }
    return 0;
}
