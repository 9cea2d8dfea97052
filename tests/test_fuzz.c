/* test_fuzz.c — a deterministic mutation fuzzer for the readers of untrusted
 * files: json_parse, safetensors_open (single files and sharded folders) and
 * gguf_open. No libFuzzer needed; tests/fuzz/ has libFuzzer targets for
 * long runs, and the mutation engine (tests/fuzz/fuzz_mutate.h) this file
 * shares with tests/test_fuzz_loaders.c (the loaders built on these readers).
 *
 * Seeds: the committed fixtures (tests/fixtures/safetensors, every .gguf in
 * tests/fixtures/gguf, small JSON files) plus a tiny GGUF and a JSON
 * sample built here, so the run does not depend on other fixtures existing.
 * Each iteration applies 1-4 random mutations (bit flips, random bytes,
 * "interesting" integers, insertions, deletions, truncations, duplicated
 * chunks, splices with another seed, JSON tokens, numbers swapped for
 * extreme ones; for safetensors also header edits with a consistent length
 * field) and feeds the result to the reader through tests/fuzz/fuzz_common.h,
 * which checks what an accepted input promises. Any crash or sanitizer
 * report fails the run; a broken invariant fails the test and the input is
 * saved for replay.
 *
 * CLLM_FUZZ_SEED picks the seed (printed). CLLM_FUZZ_ITERS sets N, the JSON
 * and safetensors iterations; GGUF gets 3N/4, sharded folders N/32 (each
 * writes files). The default N = 200000 takes about 20 s under ASan on this
 * 2-core machine and half that without.
 */
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_mutate.h"
#include "tests/test.h"

typedef struct {
    Rng rng;
    uint64_t seed;
    long iters;               /* base iteration count */
    int memfd;
    char tmp[64];             /* folder for sharded cases and saved failures */
    Seeds json, st, gguf;
    Buf shard1, shard2, index;  /* the sharded fixture */
    long accepted;            /* inputs the reader took, in the current run */
} Fuzz;

/* ---------- seeds ---------- */

/* A small GGUF v3 built byte by byte: four metadata values (string, u32
 * alignment, i32 array, f32) and two tensors (F32 4x2, F16 8), aligned. */
static void put_le(Buf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    buf_splice(b, b->n, 0, t, (size_t)n);
}

static void put_str(Buf *b, const char *s) {
    put_le(b, strlen(s), 8);
    buf_splice(b, b->n, 0, (const uint8_t *)s, strlen(s));
}

static void make_tiny_gguf(Buf *b) {
    b->n = 0;
    buf_splice(b, 0, 0, (const uint8_t *)"GGUF", 4);
    put_le(b, 3, 4);  /* version */
    put_le(b, 2, 8);  /* tensors */
    put_le(b, 4, 8);  /* kv pairs */
    put_str(b, "general.architecture"); put_le(b, GGUF_STRING, 4); put_str(b, "llama");
    put_str(b, "general.alignment"); put_le(b, GGUF_UINT32, 4); put_le(b, 32, 4);
    put_str(b, "llama.list"); put_le(b, GGUF_ARRAY, 4); put_le(b, GGUF_INT32, 4); put_le(b, 3, 8);
    for (int i = 1; i <= 3; i++) put_le(b, (uint64_t)-i, 4);
    put_str(b, "llama.eps"); put_le(b, GGUF_FLOAT32, 4); put_le(b, 0x3727c5ac, 4); /* 1e-5f */
    put_str(b, "a"); put_le(b, 2, 4); put_le(b, 4, 8); put_le(b, 2, 8); put_le(b, DT_F32, 4); put_le(b, 0, 8);
    put_str(b, "b"); put_le(b, 1, 4); put_le(b, 8, 8); put_le(b, DT_F16, 4); put_le(b, 32, 8);
    while (b->n % 32) put_le(b, 0, 1);
    for (int i = 0; i < 32; i++) put_le(b, 0x3f800000u + (uint32_t)i, 4); /* 32 bytes of a, then b */
}

static void fuzz_load_seeds(Fuzz *fz) {
    char path[1024];
    const char *fx = test_fixture_dir();
    static const char *st_files[] = {"single.safetensors", "sharded/model-00001-of-00002.safetensors",
                                     "sharded/model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof st_files / sizeof *st_files; i++) {
        snprintf(path, sizeof path, "%s/safetensors/%s", fx, st_files[i]);
        seeds_add_file(&fz->st, path, 1 << 20);
    }
    snprintf(path, sizeof path, "%s/safetensors/sharded/model-00001-of-00002.safetensors", fx);
    read_file(path, &fz->shard1);
    snprintf(path, sizeof path, "%s/safetensors/sharded/model-00002-of-00002.safetensors", fx);
    read_file(path, &fz->shard2);
    snprintf(path, sizeof path, "%s/safetensors/sharded/model.safetensors.index.json", fx);
    read_file(path, &fz->index);
    static const char *json_files[] = {"safetensors/expected.json", "safetensors/sharded/model.safetensors.index.json",
                                       "gguf/valid.json", "tiny/llama/config.json", "tiny/gemma3/config.json",
                                       "tiny/gpt-oss/config.json"};
    for (size_t i = 0; i < sizeof json_files / sizeof *json_files; i++) {
        snprintf(path, sizeof path, "%s/%s", fx, json_files[i]);
        seeds_add_file(&fz->json, path, 64 << 10);
    }
    static const char sample[] = "{\"s\": \"caf\xc3\xa9 \\u00e9\\ud83d\\ude00\\n\\\"\", \"n\": [-0, 1.5e-3, 12345678901234567890,"
                                 " true, false, null], \"o\": {\"a\": [[], {}], \"a\": 2}, \"big\": 1e308}";
    seeds_add(&fz->json, sample, sizeof sample - 1);
    Buf g = {0};
    make_tiny_gguf(&g);
    seeds_add(&fz->gguf, g.b, g.n);
    free(g.b);
    snprintf(path, sizeof path, "%s/gguf", fx);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf")) continue;
        snprintf(path, sizeof path, "%s/gguf/%s", fx, e->d_name);
        seeds_add_file(&fz->gguf, path, 1 << 20);
    }
    if (d) closedir(d);
}

/* Keeps a failing input for replay and says where. */
static void save_failure(Fuzz *fz, const char *what, long iter, const Buf *b) {
    char path[160];
    snprintf(path, sizeof path, "%s/fail-%s-%ld.bin", fz->tmp, what, iter);
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(b->b, 1, b->n, f); fclose(f); }
    printf("  seed %llu iteration %ld: input saved as %s\n", (unsigned long long)fz->seed, iter, path);
}

/* ---------- the tests ---------- */

static void test_seeds_valid(Fuzz *fz) {
    /* The unmutated seeds must open, or the fuzzing starts from nothing. */
    char p[64];
    Err err;
    CHECK(fz->json.n >= 4 && fz->st.n == 3 && fz->gguf.n >= 1, "seeds: %zu json, %zu safetensors, %zu gguf",
          fz->json.n, fz->st.n, fz->gguf.n);
    for (size_t i = 0; i < fz->json.n; i++) {
        Json *d = json_parse((const char *)fz->json.items[i].b, fz->json.items[i].n, "seed", &err);
        CHECK(d != NULL, "json seed %zu: %s", i, err.msg);
        json_free(d);
    }
    for (size_t i = 0; i < fz->st.n; i++) {
        Safetensors st;
        const char *path = fuzz_file_path(fz->memfd, fz->st.items[i].b, fz->st.items[i].n, p);
        CHECK(path && safetensors_open(&st, path, &err) == 0, "safetensors seed %zu: %s", i, err.msg);
        if (path && st.n_shards) safetensors_close(&st);
    }
    for (size_t i = 0; i < fz->gguf.n; i++) {
        GGUFFile f;
        const char *path = fuzz_file_path(fz->memfd, fz->gguf.items[i].b, fz->gguf.items[i].n, p);
        int rc = path ? gguf_open(&f, path, &err) : -1;
        CHECK(rc == 0, "gguf seed %zu: %s", i, err.msg);
        if (rc == 0) {
            CHECK(i > 0 || (f.n_tensors == 2 && f.n_kv == 4 && gguf_find_tensor(&f, "b") &&
                            gguf_find_tensor(&f, "b")->offset == 32),
                  "the tiny GGUF reads back");
            gguf_close(&f);
        }
    }
}

static void fuzz_json_run(Fuzz *fz, long n) {
    Buf b = {0};
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->json.items[rng_below(&fz->rng, fz->json.n)];
        buf_set(&b, s->b, s->n);
        mutate_n(&fz->rng, &b, &fz->json, true);
        /* An exact-size copy: a read past the end is an ASan report. */
        uint8_t *exact = malloc(b.n ? b.n : 1);
        memcpy(exact, b.b, b.n);
        const char *why = fuzz_json(exact, b.n, &fz->accepted);
        free(exact);
        if (why && bad++ < 3) { CHECK(why == NULL, "json iteration %ld: %s", it, why); save_failure(fz, "json", it, &b); }
    }
    free(b.b);
}

static void fuzz_st_run(Fuzz *fz, long n) {
    Buf b = {0};
    char p[64];
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->st.items[rng_below(&fz->rng, fz->st.n)];
        buf_set(&b, s->b, s->n);
        if (rng_below(&fz->rng, 3)) mutate_st_header(&fz->rng, &b, &fz->st);
        else mutate_n(&fz->rng, &b, &fz->st, false);
        const char *path = fuzz_file_path(fz->memfd, b.b, b.n, p);
        const char *why = path ? fuzz_safetensors_path(path, &fz->accepted) : "cannot write the memfd";
        if (why && bad++ < 3) { CHECK(why == NULL, "safetensors iteration %ld: %s", it, why); save_failure(fz, "st", it, &b); }
    }
    free(b.b);
}

static void write_to(const char *dir, const char *name, const Buf *b) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(b->b, 1, b->n, f); fclose(f); }
}

/* Sharded folders: the index or one shard mutated. Only the files that
 * changed since the last iteration are rewritten. */
static void fuzz_sharded_run(Fuzz *fz, long n) {
    static const char *names[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"};
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ck", fz->tmp);
    mkdir(dir, 0755);
    const Buf *orig[3] = {&fz->index, &fz->shard1, &fz->shard2};
    for (int i = 0; i < 3; i++) write_to(dir, names[i], orig[i]);
    Buf b = {0};
    Seeds idx_seeds = {&fz->index, 1};
    int bad = 0;
    size_t last = 0;
    for (long it = 0; it < n; it++) {
        size_t k = rng_below(&fz->rng, 3);
        if (k != last) write_to(dir, names[last], orig[last]); /* undo the last mutation */
        buf_set(&b, orig[k]->b, orig[k]->n);
        if (k == 0) mutate_n(&fz->rng, &b, &idx_seeds, true);
        else mutate_st_header(&fz->rng, &b, &fz->st);
        write_to(dir, names[k], &b);
        last = k;
        const char *why = fuzz_safetensors_path(dir, &fz->accepted);
        if (why && bad++ < 3) { CHECK(why == NULL, "sharded iteration %ld (%s): %s", it, names[k], why); save_failure(fz, "sharded", it, &b); }
    }
    for (int i = 0; i < 3; i++) {
        char path[200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    free(b.b);
}

static void fuzz_gguf_run(Fuzz *fz, long n) {
    Buf b = {0};
    char p[64];
    int bad = 0;
    for (long it = 0; it < n; it++) {
        const Buf *s = &fz->gguf.items[rng_below(&fz->rng, fz->gguf.n)];
        buf_set(&b, s->b, s->n);
        mutate_n(&fz->rng, &b, &fz->gguf, false);
        const char *path = fuzz_file_path(fz->memfd, b.b, b.n, p);
        const char *why = path ? fuzz_gguf_path(path, &fz->accepted) : "cannot write the memfd";
        if (why && bad++ < 3) { CHECK(why == NULL, "gguf iteration %ld: %s", it, why); save_failure(fz, "gguf", it, &b); }
    }
    free(b.b);
}


int main(void) {
    Fuzz fz = {0};
    const char *s = getenv("CLLM_FUZZ_SEED"), *it = getenv("CLLM_FUZZ_ITERS");
    fz.seed = s ? strtoull(s, NULL, 0) : 20250117;
    fz.iters = it ? atol(it) : 200000;
    rng_seed(&fz.rng, fz.seed);
    snprintf(fz.tmp, sizeof fz.tmp, "%s/cllm-fuzz-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    fz.memfd = memfd_create("cllm-fuzz", MFD_CLOEXEC);
    if (fz.memfd < 0 || !mkdtemp(fz.tmp)) { printf("not ok - fuzz setup (memfd / mkdtemp)\n"); return 1; }
    printf("# fuzz: seed %llu (set CLLM_FUZZ_SEED to change), N = %ld (CLLM_FUZZ_ITERS)\n",
           (unsigned long long)fz.seed, fz.iters);
    fuzz_load_seeds(&fz);
    test_failed_checks = 0;
    test_seeds_valid(&fz);
    printf("%s - test_seeds_valid\n", test_failed_checks ? "not ok" : "ok");
    if (test_failed_checks) test_failed_tests++;
    if (fz.json.n) FUZZ_RUN(fuzz_json_run, &fz, fz.iters);
    if (fz.st.n) FUZZ_RUN(fuzz_st_run, &fz, fz.iters);
    if (fz.index.n && fz.shard1.n && fz.shard2.n) FUZZ_RUN(fuzz_sharded_run, &fz, fz.iters / 32);
    if (fz.gguf.n) FUZZ_RUN(fuzz_gguf_run, &fz, fz.iters * 3 / 4);
    close(fz.memfd);
    rmdir(fz.tmp); /* kept when a failing input was saved in it */
    seeds_free(&fz.json);
    seeds_free(&fz.st);
    seeds_free(&fz.gguf);
    free(fz.shard1.b); free(fz.shard2.b); free(fz.index.b);
    TEST_EXIT();
}
