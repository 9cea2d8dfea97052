/* gguf_kv.h — GGUF metadata written by a test: the KV_* initializers and a
 * file of those keys (no tensors) in /tmp, opened. */
#ifndef CLLM_TESTS_GGUF_KV_H
#define CLLM_TESTS_GGUF_KV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "formats/gguf_write.h"

#define KV_U32(k, x) {(char *)(k), {GGUF_UINT32, {.u = (x)}}}
#define KV_I32(k, x) {(char *)(k), {GGUF_INT32, {.i = (x)}}}
#define KV_F32(k, x) {(char *)(k), {GGUF_FLOAT32, {.f = (x)}}}
#define KV_STR(k, s) {(char *)(k), {GGUF_STRING, {.str = {(s), sizeof(s) - 1}}}}

/* Writes kv[0..n) to a new file named in path (at least 32 bytes) and opens
 * it into f. 0: the caller gguf_closes f and removes path; -1: neither is
 * left behind. */
static inline int test_gguf_open_kv(const GGUFKV *kv, size_t n, char *path, GGUFFile *f, Err *err) {
    strcpy(path, "/tmp/cllm_kv_XXXXXX.gguf");
    int fd = mkstemps(path, 5);
    if (fd < 0) return err_set(err, "mkstemps failed");
    close(fd);
    if (gguf_write(path, kv, n, NULL, 0, 32, NULL, NULL, err) || gguf_open(f, path, err)) {
        remove(path);
        return -1;
    }
    return 0;
}

#endif
