/* fuzz_common.h — what one fuzz input does to each untrusted-input reader,
 * shared by the deterministic driver tests/test_fuzz.c and the libFuzzer
 * targets beside this file (see README.md).
 *
 * Each fuzz_* function feeds one input to a reader. A clean refusal is fine;
 * an accepted input is walked end to end and its invariants are checked
 * (every tensor's bytes inside the mapping, every member findable by its
 * key, every string re-written by JsonBuf parses back). The functions return
 * NULL when all is well or a description of the broken invariant; crashes
 * and out-of-bounds reads are left to AddressSanitizer to report.
 *
 * Readers that need a path get one from fuzz_file_path: an in-memory file
 * (memfd) seen through /proc/self/fd, so no disk is touched per input.
 */
#ifndef CLLM_FUZZ_COMMON_H
#define CLLM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "formats/gguf.h"
#include "base/json.h"
#include "formats/safetensors.h"

/* ---------- JSON ---------- */

/* Walks every value; strings are re-escaped with JsonBuf and parsed again,
 * keys are looked up (the answer must carry that key: last-wins duplicates
 * point at another member with the same key). */
static inline const char *fuzz_walk_json(const JsonValue *v, int depth, uint64_t *acc) {
    if (depth > JSON_MAX_DEPTH + 1) return "tree deeper than JSON_MAX_DEPTH";
    switch (v->type) {
    case JSON_NULL: case JSON_BOOL: return NULL;
    case JSON_NUMBER: *acc += (uint64_t)v->u.number.i + (v->u.number.num != v->u.number.num); return NULL;
    case JSON_STRING: {
        if (v->u.string.s[v->u.string.len] != 0) return "string not NUL-terminated";
        JsonBuf b = {0};
        if (jsonbuf_put_string(&b, v->u.string.s, v->u.string.len)) return "jsonbuf_put_string failed";
        Err err;
        Json *again = json_parse(b.data, b.len, "re-escaped", &err);
        const JsonValue *r = json_root(again);
        const char *bad = !again ? "a JsonBuf-escaped string does not parse"
                          : r->type != JSON_STRING || r->u.string.len != v->u.string.len ||
                                    memcmp(r->u.string.s, v->u.string.s, v->u.string.len)
                              ? "a parsed (valid UTF-8) string changed through JsonBuf"
                              : NULL;
        json_free(again);
        jsonbuf_free(&b);
        return bad;
    }
    case JSON_ARRAY:
        for (size_t i = 0; i < v->u.array.n; i++) {
            const char *bad = fuzz_walk_json(json_at(v, i), depth + 1, acc);
            if (bad) return bad;
        }
        return json_at(v, v->u.array.n) ? "json_at past the end" : NULL;
    case JSON_OBJECT:
        for (size_t i = 0; i < v->u.object.n; i++) {
            const char *k = v->u.object.keys[i];
            size_t kl = v->u.object.key_lens[i];
            if (k[kl] != 0) return "key not NUL-terminated";
            if (strlen(k) == kl) {
                const JsonValue *got = json_get(v, k);
                if (!got) return "json_get misses a key that is there";
                size_t j = (size_t)(got - v->u.object.values);
                if (j >= v->u.object.n || v->u.object.key_lens[j] != kl || memcmp(v->u.object.keys[j], k, kl))
                    return "json_get returns a member with another key";
                if (j < i) return "json_get returns an earlier duplicate (the last must win)";
            }
            const char *bad = fuzz_walk_json(&v->u.object.values[i], depth + 1, acc);
            if (bad) return bad;
        }
        return NULL;
    }
    return "unknown JSON type";
}

/* *accepted (when not NULL) is incremented when the reader took the input. */
static inline const char *fuzz_json(const uint8_t *data, size_t n, long *accepted) {
    Err err;
    Json *doc = json_parse((const char *)data, n, "fuzz.json", &err);
    if (doc && accepted) ++*accepted;
    if (!doc) return strncmp(err.msg, "fuzz.json: offset ", 18) ? "JSON error without source and offset" : NULL;
    uint64_t acc = 0;
    const char *bad = fuzz_walk_json(json_root(doc), 0, &acc);
    json_free(doc);
    return bad;
}

/* ---------- safetensors ---------- */

static inline const char *fuzz_check_safetensors(const Safetensors *st) {
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < st->n_tensors; i++) {
        const TensorInfo *t = &st->tensors[i];
        int s = st->tensor_shard[i];
        if (s < 0 || s >= st->n_shards) return "tensor_shard out of range";
        const SafetensorsShard *sh = &st->shards[s];
        const uint8_t *d = t->data;
        if (t->n_dims < 1 || t->n_dims > TENSOR_MAX_DIMS) return "n_dims out of range";
        if (d < sh->map + 8 || t->nbytes > sh->map_size || d + t->nbytes > sh->map + sh->map_size)
            return "tensor data outside its shard's mapping";
        int eb = t->type == DT_F32 ? 4 : t->type == DT_F16 || t->type == DT_BF16 ? 2 : 0;
        if (!eb) return "tensor dtype not F32/F16/BF16";
        if (tensor_nelems(t) * (uint64_t)eb != t->nbytes) return "nbytes disagrees with ne[] x element size";
        if (safetensors_find(st, t->name) != t) return "safetensors_find does not find a tensor by its name";
        if (t->nbytes) sink ^= d[0] ^ d[t->nbytes - 1];
    }
    (void)sink;
    return NULL;
}

static inline const char *fuzz_safetensors_path(const char *path, long *accepted) {
    Safetensors st;
    Err err;
    if (safetensors_open(&st, path, &err)) {
        if (st.tensors || st.shards || st.priv) return "failed safetensors_open left memory behind";
        return strstr(err.msg, "/") ? NULL : "safetensors error without a file name";
    }
    if (accepted) ++*accepted;
    const char *bad = fuzz_check_safetensors(&st);
    safetensors_close(&st);
    return bad;
}

/* ---------- GGUF ---------- */

static inline const char *fuzz_walk_gguf_value(const GGUFFile *f, const GGUFValue *v, int depth) {
    if (depth > 64) return "GGUF array nesting unbounded";
    if (v->type == GGUF_STRING && v->v.str.len &&
        ((const uint8_t *)v->v.str.ptr < f->map || v->v.str.len > f->map_size ||
         (const uint8_t *)v->v.str.ptr + v->v.str.len > f->map + f->map_size))
        return "GGUF string outside the mapping";
    if (v->type == GGUF_ARRAY)
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            if (v->v.arr.items[i].type != v->v.arr.elem) return "GGUF array item of another type";
            const char *bad = fuzz_walk_gguf_value(f, &v->v.arr.items[i], depth + 1);
            if (bad) return bad;
        }
    return NULL;
}

static inline const char *fuzz_gguf_path(const char *path, long *accepted) {
    GGUFFile f;
    Err err;
    if (gguf_open(&f, path, &err)) return strstr(err.msg, path) ? NULL : "GGUF error without the file name";
    if (accepted) ++*accepted;
    const char *bad = NULL;
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < f.n_kv && !bad; i++) {
        if (gguf_get(&f, f.kv[i].key) != &f.kv[i].value) bad = "gguf_get does not find a key";
        else bad = fuzz_walk_gguf_value(&f, &f.kv[i].value, 0);
        uint64_t u;
        double d;
        (void)gguf_get_u64(&f, f.kv[i].key, &u);
        (void)gguf_get_f64(&f, f.kv[i].key, &d);
    }
    for (uint64_t i = 0; i < f.n_tensors && !bad; i++) {
        const GGUFTensor *t = &f.tensors[i];
        const uint8_t *d = t->data;
        if (gguf_find_tensor(&f, t->name) != t) bad = "gguf_find_tensor does not find a tensor";
        else if (d < f.map || t->nbytes > f.map_size || d + t->nbytes > f.map + f.map_size)
            bad = "GGUF tensor data outside the mapping";
        else if (t->nbytes) sink ^= d[0] ^ d[t->nbytes - 1];
    }
    (void)sink;
    gguf_close(&f);
    return bad;
}

/* ---------- in-memory files ---------- */

/* Replaces the contents of memfd `fd` with data and returns the path that
 * opens it (buf holds at least 64 bytes); NULL on failure. */
static inline const char *fuzz_file_path(int fd, const uint8_t *data, size_t n, char *buf) {
    if (ftruncate(fd, 0) || (n && pwrite(fd, data, n, 0) != (ssize_t)n)) return NULL;
    snprintf(buf, 64, "/proc/self/fd/%d", fd);
    return buf;
}

#endif
