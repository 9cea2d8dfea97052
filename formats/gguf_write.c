/* gguf_write.c — see gguf_write.h. Little-endian throughout (as the
 * reader); values are written back in their parsed type, so a copied kv pair
 * keeps its exact type and bytes. */
#include "formats/gguf_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    FILE *f;
    const char *path;
    uint64_t pos;
    int failed;
} Out;

static void put(Out *o, const void *p, uint64_t n) {
    if (o->failed || n == 0) return;
    if (fwrite(p, 1, n, o->f) != n) o->failed = 1;
    o->pos += n;
}

static void put_uint(Out *o, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> 8 * i);
    put(o, b, (uint64_t)n);
}

static void put_str(Out *o, const char *s, uint64_t len) {
    put_uint(o, len, 8);
    put(o, s, len);
}

static void put_pad(Out *o, uint64_t alignment) {
    static const uint8_t zeros[256];
    uint64_t pad = (alignment - o->pos % alignment) % alignment;
    while (pad) {
        uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        put(o, zeros, n);
        pad -= n;
    }
}

/* one value without its type tag */
static int put_value(Out *o, const GGUFValue *v, int depth, Err *err) {
    static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (depth > 8) return err_set(err, "%s: metadata arrays nested too deep", o->path);
    switch (v->type) {
    case GGUF_STRING: put_str(o, v->v.str.ptr, v->v.str.len); return 0;
    case GGUF_ARRAY:
        put_uint(o, (uint64_t)v->v.arr.elem, 4);
        put_uint(o, v->v.arr.n, 8);
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            if (put_value(o, &v->v.arr.items[i], depth + 1, err)) return -1;
        return 0;
    case GGUF_FLOAT32: {
        float f = (float)v->v.f;
        uint32_t b;
        memcpy(&b, &f, 4);
        put_uint(o, b, 4);
        return 0;
    }
    case GGUF_FLOAT64: {
        uint64_t b;
        memcpy(&b, &v->v.f, 8);
        put_uint(o, b, 8);
        return 0;
    }
    case GGUF_INT8: case GGUF_INT16: case GGUF_INT32: case GGUF_INT64:
        put_uint(o, (uint64_t)v->v.i, size[v->type]);
        return 0;
    default:
        if ((unsigned)v->type >= sizeof size / sizeof size[0])
            return err_set(err, "%s: metadata value of unknown type %d", o->path, (int)v->type);
        put_uint(o, v->v.u, size[v->type]);
        return 0;
    }
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int write_header(Out *o, const GGUFKV *kv, uint64_t n_kv, const GGUFOutTensor *t, uint64_t n_t,
                        uint64_t alignment, uint64_t *sizes, Err *err) {
    put(o, "GGUF", 4);
    put_uint(o, 3, 4);
    put_uint(o, n_t, 8);
    put_uint(o, n_kv, 8);
    for (uint64_t i = 0; i < n_kv; i++) {
        put_str(o, kv[i].key, strlen(kv[i].key));
        put_uint(o, (uint64_t)kv[i].value.type, 4);
        if (put_value(o, &kv[i].value, 0, err)) return -1;
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < n_t; i++) {
        uint64_t n = 1;
        for (int d = 1; d < t[i].n_dims; d++) n *= t[i].ne[d];
        sizes[i] = dtype_row_bytes(t[i].type, t[i].ne[0]) * n;
        if (!sizes[i]) return err_set(err, "%s: tensor '%s': %llu columns are not whole %s blocks", o->path,
                                      t[i].name, (unsigned long long)t[i].ne[0],
                                      dtype_info(t[i].type) ? dtype_info(t[i].type)->name : "?");
        put_str(o, t[i].name, strlen(t[i].name));
        put_uint(o, (uint64_t)t[i].n_dims, 4);
        for (int d = 0; d < t[i].n_dims; d++) put_uint(o, t[i].ne[d], 8);
        put_uint(o, (uint64_t)t[i].type, 4);
        put_uint(o, off, 8);
        off = align_up(off + sizes[i], alignment);
    }
    put_pad(o, alignment);
    return 0;
}

int gguf_write(const char *path, const GGUFKV *kv, uint64_t n_kv, const GGUFOutTensor *t, uint64_t n_t,
               uint64_t alignment, GGUFFillFn fill, void *ctx, Err *err) {
    if (!alignment || (alignment & (alignment - 1))) return err_set(err, "%s: alignment %llu is not a power of two",
                                                                    path, (unsigned long long)alignment);
    Out o = {fopen(path, "wb"), path, 0, 0};
    if (!o.f) return err_set(err, "%s: cannot create the file", path);
    uint64_t *sizes = calloc(n_t ? n_t : 1, sizeof *sizes);
    void *buf = NULL;
    uint64_t buf_size = 0;
    int rc = sizes ? write_header(&o, kv, n_kv, t, n_t, alignment, sizes, err) : err_set(err, "out of memory");
    for (uint64_t i = 0; rc == 0 && i < n_t; i++) {
        if (sizes[i] > buf_size) {
            free(buf);
            buf_size = sizes[i];
            buf = malloc(buf_size);
            if (!buf) { rc = err_set(err, "%s: out of memory for tensor '%s'", path, t[i].name); break; }
        }
        rc = fill(ctx, i, buf, sizes[i], err);
        put(&o, buf, sizes[i]);
        if (i + 1 < n_t) put_pad(&o, alignment);
    }
    if (rc == 0 && o.failed) rc = err_set(err, "%s: write failed (disk full?)", path);
    if (fclose(o.f) && rc == 0) rc = err_set(err, "%s: write failed on close", path);
    if (rc) remove(path);
    free(sizes);
    free(buf);
    return rc;
}
