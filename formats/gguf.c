/* gguf.c — the GGUF v2/v3 reader: maps the file read-only, parses the
 * metadata and tensor infos into GGUFFile, checks every field (the file is
 * untrusted), and indexes keys and tensor names in hash tables.
 *
 * Parsing walks a Reader (a cursor over the mapping) that knows what it is
 * reading ("kv 3", "key 'general.alignment'", "tensor 'blk.0.attn_q.weight'"),
 * so every error, a truncation included, names the file and the field. Counts
 * are checked against the bytes left before anything is allocated, so a
 * lying count fails fast instead of allocating what the file claims.
 */
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_DEPTH 8             /* arrays nested deeper are refused */
#define GGUF_MAX_VALUES (1ull << 24) /* metadata values in all arrays (512 MB parsed) */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1ull << 30)
/* Smallest encodings, used to bound counts by the bytes left. */
#define GGUF_MIN_KV_BYTES 14     /* key length 8 + 1-byte key + type 4 + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 33 /* name length 8 + 1-byte name + n_dims 4 + 1 dim 8 + type 4 + offset 8 */

typedef struct {
    const uint8_t *p;
    uint64_t pos, size;
    const char *path;
    char ctx[320];        /* what is being read, for error messages */
    uint64_t values_left; /* budget of array elements still allowed */
    Err *err;
} Reader;

/* Hash index: open addressing over slots holding index + 1 (0 = empty). */
typedef struct {
    size_t *slots;
    size_t cap; /* power of two */
} NameIndex;

typedef struct {
    NameIndex keys, tensors;
} GGUFIndex;

/* ---- reading primitives ---- */

static int rd_fail(Reader *r, const char *what, uint64_t n) {
    return err_set(r->err, "%s: %s: truncated: %s needs %llu bytes at offset %llu, file has %llu",
                   r->path, r->ctx, what, (unsigned long long)n, (unsigned long long)r->pos,
                   (unsigned long long)r->size);
}

static int rd_need(Reader *r, uint64_t n, const char *what) {
    return n > r->size - r->pos ? rd_fail(r, what, n) : 0;
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Reads an n-byte (1, 2, 4 or 8) little-endian unsigned integer. */
static int rd_uint(Reader *r, int n, uint64_t *out, const char *what) {
    if (rd_need(r, (uint64_t)n, what)) return -1;
    *out = rd_le(r->p + r->pos, n);
    r->pos += (uint64_t)n;
    return 0;
}

static int rd_u32(Reader *r, uint32_t *out, const char *what) {
    uint64_t v;
    if (rd_uint(r, 4, &v, what)) return -1;
    *out = (uint32_t)v;
    return 0;
}

static int rd_str(Reader *r, GGUFStr *s, const char *what) {
    uint64_t len;
    if (rd_uint(r, 8, &len, what)) return -1;
    if (len > r->size - r->pos)
        return err_set(r->err, "%s: %s: %s length %llu runs past the end of the file (%llu bytes left)",
                       r->path, r->ctx, what, (unsigned long long)len,
                       (unsigned long long)(r->size - r->pos));
    s->ptr = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += len;
    return 0;
}

/* Reads a key or tensor name and copies it NUL-terminated. Names must be
 * non-empty and free of NUL bytes, so the copy names exactly what the file does. */
static int rd_name(Reader *r, char **out, const char *what) {
    GGUFStr s;
    if (rd_str(r, &s, what)) return -1;
    if (s.len == 0) return err_set(r->err, "%s: %s: %s is empty", r->path, r->ctx, what);
    if (memchr(s.ptr, 0, s.len))
        return err_set(r->err, "%s: %s: %s contains a NUL byte", r->path, r->ctx, what);
    *out = malloc(s.len + 1);
    if (!*out) return err_set(r->err, "%s: %s: out of memory", r->path, r->ctx);
    memcpy(*out, s.ptr, s.len);
    (*out)[s.len] = 0;
    return 0;
}

/* ---- metadata values ---- */

/* Bytes of a scalar type, 0 for STRING/ARRAY, -1 for an unknown type id. */
static int scalar_size(uint32_t t) {
    static const int8_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof size ? size[t] : -1;
}

/* Least bytes one value of type t takes in the file. */
static uint64_t min_value_bytes(uint32_t t) {
    if (t == GGUF_STRING) return 8;
    if (t == GGUF_ARRAY) return 12;
    return (uint64_t)scalar_size(t);
}

static void value_free(GGUFValue *v) {
    if (v->type != GGUF_ARRAY || !v->v.arr.items) return;
    if (v->v.arr.elem == GGUF_ARRAY)
        for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&v->v.arr.items[i]);
    free(v->v.arr.items);
    v->v.arr.items = NULL;
}

static int read_scalar(Reader *r, GGUFType t, GGUFValue *out) {
    uint64_t raw;
    int n = scalar_size(t);
    if (rd_uint(r, n, &raw, gguf_type_name(t))) return -1;
    out->type = t;
    switch (t) {
    case GGUF_INT8: out->v.i = (int8_t)raw; break;
    case GGUF_INT16: out->v.i = (int16_t)raw; break;
    case GGUF_INT32: out->v.i = (int32_t)raw; break;
    case GGUF_INT64: out->v.i = (int64_t)raw; break;
    case GGUF_FLOAT32: {
        float f;
        uint32_t b = (uint32_t)raw;
        memcpy(&f, &b, sizeof f);
        out->v.f = f;
        break;
    }
    case GGUF_FLOAT64: memcpy(&out->v.f, &raw, sizeof out->v.f); break;
    case GGUF_BOOL:
        if (raw > 1)
            return err_set(r->err, "%s: %s: bool value %llu is neither 0 nor 1", r->path, r->ctx,
                           (unsigned long long)raw);
        out->v.u = raw;
        break;
    default: out->v.u = raw; break;
    }
    return 0;
}

static int read_value(Reader *r, GGUFType t, GGUFValue *out, int depth);

static int read_array(Reader *r, GGUFValue *out, int depth) {
    uint32_t elem;
    uint64_t n;
    out->type = GGUF_ARRAY;
    if (rd_u32(r, &elem, "array element type") || rd_uint(r, 8, &n, "array length")) return -1;
    if (scalar_size(elem) < 0)
        return err_set(r->err, "%s: %s: array element type %u is not a GGUF value type", r->path,
                       r->ctx, elem);
    if (elem == GGUF_ARRAY && depth + 1 >= GGUF_MAX_DEPTH)
        return err_set(r->err, "%s: %s: arrays nested more than %d deep", r->path, r->ctx,
                       GGUF_MAX_DEPTH);
    if (n > (r->size - r->pos) / min_value_bytes(elem))
        return err_set(r->err, "%s: %s: array of %llu %s values cannot fit in the %llu bytes left",
                       r->path, r->ctx, (unsigned long long)n, gguf_type_name((GGUFType)elem),
                       (unsigned long long)(r->size - r->pos));
    if (n > r->values_left)
        return err_set(r->err, "%s: %s: more than %llu metadata array values in the file", r->path,
                       r->ctx, (unsigned long long)GGUF_MAX_VALUES);
    r->values_left -= n;
    out->v.arr.elem = (GGUFType)elem;
    out->v.arr.items = calloc(n ? n : 1, sizeof(GGUFValue)); /* zeroed: safe to free part-built */
    if (!out->v.arr.items) return err_set(r->err, "%s: %s: out of memory", r->path, r->ctx);
    out->v.arr.n = n;
    for (uint64_t i = 0; i < n; i++)
        if (read_value(r, (GGUFType)elem, &out->v.arr.items[i], depth + 1)) return -1;
    return 0;
}

/* Reads one value of type t (already known valid) at nesting depth depth. */
static int read_value(Reader *r, GGUFType t, GGUFValue *out, int depth) {
    if (t == GGUF_ARRAY) return read_array(r, out, depth);
    if (t == GGUF_STRING) {
        out->type = GGUF_STRING;
        return rd_str(r, &out->v.str, "string");
    }
    return read_scalar(r, t, out);
}

/* ---- name index ---- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int index_init(NameIndex *ix, uint64_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* n is bounded by the file size, so this ends */
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->cap = ix->slots ? cap : 0;
    return ix->slots ? 0 : -1;
}

/* The name of entry k of the array an index covers. */
typedef const char *(*NameAt)(const void *base, size_t k);

static const char *kv_name_at(const void *base, size_t k) {
    return ((const GGUFKV *)base)[k].key;
}

static const char *tensor_name_at(const void *base, size_t k) {
    return ((const GGUFTensor *)base)[k].name;
}

/* Finds name among the entries at base through the index; returns its index
 * or -1. On a miss, *slot (if given) is the empty slot where it would go. */
static int64_t index_find(const NameIndex *ix, const char *name, const void *base, NameAt name_at,
                          size_t *slot) {
    if (!ix->cap) return -1;
    size_t mask = ix->cap - 1, i = (size_t)hash_name(name) & mask;
    for (; ix->slots[i]; i = (i + 1) & mask) {
        size_t k = ix->slots[i] - 1;
        if (strcmp(name_at(base, k), name) == 0) return (int64_t)k;
    }
    if (slot) *slot = i;
    return -1;
}

/* ---- header, kvs, tensor infos ---- */

static int read_header(Reader *r, GGUFFile *f) {
    snprintf(r->ctx, sizeof r->ctx, "header");
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0)
        return err_set(r->err, "%s: not a GGUF file (the first 4 bytes are not \"GGUF\")", r->path);
    r->pos = 4;
    uint64_t nt, nkv;
    if (rd_u32(r, &f->version, "version")) return -1;
    if (f->version != 2 && f->version != 3) {
        const char *hint = f->version && (f->version & 0xffff) == 0 ? " (a big-endian file?)" : "";
        return err_set(r->err, "%s: header: GGUF version %u is not supported (only 2 and 3)%s",
                       r->path, f->version, hint);
    }
    if (rd_uint(r, 8, &nt, "tensor count") || rd_uint(r, 8, &nkv, "kv count")) return -1;
    uint64_t left = r->size - r->pos;
    if (nkv > left / GGUF_MIN_KV_BYTES)
        return err_set(r->err, "%s: header: kv count %llu cannot fit in the %llu bytes left", r->path,
                       (unsigned long long)nkv, (unsigned long long)left);
    if (nt > left / GGUF_MIN_TENSOR_BYTES)
        return err_set(r->err, "%s: header: tensor count %llu cannot fit in the %llu bytes left",
                       r->path, (unsigned long long)nt, (unsigned long long)left);
    f->kv = calloc(nkv ? nkv : 1, sizeof *f->kv);
    f->tensors = calloc(nt ? nt : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return err_set(r->err, "%s: out of memory", r->path);
    f->n_kv = nkv;
    f->n_tensors = nt;
    return 0;
}

/* Reads the name of entry k (a key or a tensor name), makes it the error
 * context ("kv 3" until the name is known, then "key 'x'"), and adds it to the
 * index unless it is already there. */
typedef struct {
    const char *entry; /* "kv" / "tensor": context before the name is read */
    const char *named; /* "key" / "tensor": context once it is */
    const char *field; /* the string's name in a truncation message */
    NameAt name_at;
} NameKind;

static const NameKind KV_NAMES = {"kv", "key", "key", kv_name_at};
static const NameKind TENSOR_NAMES = {"tensor", "tensor", "name", tensor_name_at};

static int read_unique_name(Reader *r, NameIndex *ix, const void *base, const NameKind *kind,
                            uint64_t k, char **out) {
    size_t slot = 0;
    snprintf(r->ctx, sizeof r->ctx, "%s %llu", kind->entry, (unsigned long long)k);
    if (rd_name(r, out, kind->field)) return -1;
    snprintf(r->ctx, sizeof r->ctx, "%s '%.200s'", kind->named, *out);
    if (index_find(ix, *out, base, kind->name_at, &slot) >= 0)
        return err_set(r->err, "%s: %s: duplicate %s", r->path, r->ctx, kind->named);
    ix->slots[slot] = k + 1;
    return 0;
}

static int read_kvs(Reader *r, GGUFFile *f, NameIndex *ix) {
    for (uint64_t k = 0; k < f->n_kv; k++) {
        GGUFKV *kv = &f->kv[k];
        uint32_t type;
        if (read_unique_name(r, ix, f->kv, &KV_NAMES, k, &kv->key) ||
            rd_u32(r, &type, "value type"))
            return -1;
        if (scalar_size(type) < 0)
            return err_set(r->err, "%s: %s: value type %u is not a GGUF value type", r->path, r->ctx,
                           type);
        if (read_value(r, (GGUFType)type, &kv->value, 0)) return -1;
    }
    return 0;
}

/* general.alignment: absent = 32; otherwise an integer, a power of two. */
static int read_alignment(Reader *r, GGUFFile *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const GGUFValue *v = gguf_get(f, "general.alignment");
    if (!v) return 0;
    uint64_t a;
    if (gguf_get_u64(f, "general.alignment", &a))
        return err_set(r->err, "%s: key 'general.alignment': must be a non-negative integer, not %s",
                       r->path, gguf_type_name(v->type));
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
        return err_set(r->err, "%s: key 'general.alignment': %llu is not a power of two up to 2^30",
                       r->path, (unsigned long long)a);
    f->alignment = a;
    return 0;
}

/* Dims of one tensor: 1..4 of them, each positive, product without overflow. */
static int read_dims(Reader *r, GGUFTensor *t) {
    uint32_t nd;
    if (rd_u32(r, &nd, "n_dims")) return -1;
    if (nd < 1 || nd > TENSOR_MAX_DIMS)
        return err_set(r->err, "%s: %s: n_dims %u is not in 1..%d", r->path, r->ctx, nd,
                       TENSOR_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t prod = 1;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        if (rd_uint(r, 8, &t->ne[d], "dim")) return -1;
        if (t->ne[d] == 0)
            return err_set(r->err, "%s: %s: dim %d is 0", r->path, r->ctx, d);
        if (__builtin_mul_overflow(prod, t->ne[d], &prod) || prod > (uint64_t)INT64_MAX)
            return err_set(r->err, "%s: %s: the element count overflows at dim %d (%llu)", r->path,
                           r->ctx, d, (unsigned long long)t->ne[d]);
    }
    return 0;
}

static int read_tensor_info(Reader *r, GGUFFile *f, GGUFTensor *t) {
    uint32_t type;
    if (read_dims(r, t) || rd_u32(r, &type, "type")) return -1;
    const DTypeInfo *info = dtype_is_ggml(type) ? dtype_info(type) : NULL; /* 40 is cllm's F8_E4M3, no ggml type */
    if (!info)
        return err_set(r->err, "%s: %s: type id %u is not supported", r->path, r->ctx, type);
    t->type = (DType)type;
    if (t->ne[0] % (uint64_t)info->block_elems)
        return err_set(r->err, "%s: %s: ne[0] = %llu is not a multiple of the %s block size %d",
                       r->path, r->ctx, (unsigned long long)t->ne[0], info->name, info->block_elems);
    uint64_t row = dtype_row_bytes(t->type, t->ne[0]), rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (row == 0 || __builtin_mul_overflow(row, rows, &t->nbytes))
        return err_set(r->err, "%s: %s: the byte size overflows", r->path, r->ctx);
    if (rd_uint(r, 8, &t->offset, "offset")) return -1;
    if (t->offset % f->alignment)
        return err_set(r->err, "%s: %s: offset %llu is not a multiple of the alignment %llu", r->path,
                       r->ctx, (unsigned long long)t->offset, (unsigned long long)f->alignment);
    return 0;
}

static int read_tensor_infos(Reader *r, GGUFFile *f, NameIndex *ix) {
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        GGUFTensor *t = &f->tensors[k];
        if (read_unique_name(r, ix, f->tensors, &TENSOR_NAMES, k, &t->name) ||
            read_tensor_info(r, f, t))
            return -1;
    }
    return 0;
}

/* The data section starts at the next multiple of the alignment; every
 * tensor's bytes must lie inside the file. */
static int place_tensors(Reader *r, GGUFFile *f) {
    uint64_t pad = (f->alignment - r->pos % f->alignment) % f->alignment;
    f->data_offset = r->pos + pad; /* pos <= size < 2^63 and pad < 2^30: no overflow */
    for (uint64_t k = 0; k < f->n_tensors; k++) {
        GGUFTensor *t = &f->tensors[k];
        uint64_t start, end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->nbytes, &end) || end > r->size)
            return err_set(r->err,
                           "%s: tensor '%.200s': data at offset %llu + %llu bytes runs past the end "
                           "of the file (%llu bytes, data section at %llu)",
                           r->path, t->name, (unsigned long long)t->offset,
                           (unsigned long long)t->nbytes, (unsigned long long)r->size,
                           (unsigned long long)f->data_offset);
        t->data = r->p + start;
    }
    return 0;
}

/* ---- open / close ---- */

static int map_file(GGUFFile *f, const char *path, Err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return err_set(err, "%s: header: truncated: %lld bytes is shorter than a GGUF header (24)",
                       path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping stays valid */
    if (m == MAP_FAILED) return err_set(err, "%s: cannot mmap: %s", path, strerror(errno));
    f->map = m;
    f->map_size = (size_t)st.st_size;
    return 0;
}

static int parse_file(GGUFFile *f, GGUFIndex *ix, Err *err) {
    Reader r = {.p = f->map, .size = f->map_size, .path = f->path,
                .values_left = GGUF_MAX_VALUES, .err = err};
    if (read_header(&r, f)) return -1;
    if (index_init(&ix->keys, f->n_kv) || index_init(&ix->tensors, f->n_tensors))
        return err_set(err, "%s: out of memory", f->path);
    if (read_kvs(&r, f, &ix->keys) || read_alignment(&r, f) ||
        read_tensor_infos(&r, f, &ix->tensors))
        return -1;
    return place_tensors(&r, f);
}

int gguf_open(GGUFFile *f, const char *path, Err *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    GGUFIndex *ix = calloc(1, sizeof *ix);
    f->priv = ix;
    if (!f->path || !ix) {
        gguf_close(f);
        return err_set(err, "%s: out of memory", path);
    }
    if (map_file(f, path, err) || parse_file(f, ix, err)) {
        gguf_close(f);
        return -1;
    }
    return 0;
}

void gguf_close(GGUFFile *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t k = 0; k < f->n_kv; k++) {
            free(f->kv[k].key);
            value_free(&f->kv[k].value);
        }
    if (f->tensors)
        for (uint64_t k = 0; k < f->n_tensors; k++) free(f->tensors[k].name);
    free(f->kv);
    free(f->tensors);
    GGUFIndex *ix = f->priv;
    if (ix) {
        free(ix->keys.slots);
        free(ix->tensors.slots);
        free(ix);
    }
    if (f->map) munmap((void *)f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- lookups and typed getters ---- */

const GGUFValue *gguf_get(const GGUFFile *f, const char *key) {
    const GGUFIndex *ix = f->priv;
    if (!ix || !key) return NULL;
    int64_t k = index_find(&ix->keys, key, f->kv, kv_name_at, NULL);
    return k < 0 ? NULL : &f->kv[k].value;
}

const GGUFTensor *gguf_find_tensor(const GGUFFile *f, const char *name) {
    const GGUFIndex *ix = f->priv;
    if (!ix || !name) return NULL;
    int64_t k = index_find(&ix->tensors, name, f->tensors, tensor_name_at, NULL);
    return k < 0 ? NULL : &f->tensors[k];
}

static bool type_is_unsigned(GGUFType t) {
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool type_is_signed(GGUFType t) {
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

int gguf_get_u64(const GGUFFile *f, const char *key, uint64_t *out) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v) return -1;
    if (type_is_unsigned(v->type)) *out = v->v.u;
    else if (type_is_signed(v->type) && v->v.i >= 0) *out = (uint64_t)v->v.i;
    else return -1;
    return 0;
}

int gguf_get_i64(const GGUFFile *f, const char *key, int64_t *out) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v) return -1;
    if (type_is_signed(v->type)) *out = v->v.i;
    else if (type_is_unsigned(v->type) && v->v.u <= (uint64_t)INT64_MAX) *out = (int64_t)v->v.u;
    else return -1;
    return 0;
}

int gguf_get_f64(const GGUFFile *f, const char *key, double *out) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v) return -1;
    if (v->type == GGUF_FLOAT32 || v->type == GGUF_FLOAT64) *out = v->v.f;
    else if (type_is_signed(v->type)) *out = (double)v->v.i;
    else if (type_is_unsigned(v->type)) *out = (double)v->v.u;
    else return -1;
    return 0;
}

int gguf_get_bool(const GGUFFile *f, const char *key, bool *out) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v || v->type != GGUF_BOOL) return -1;
    *out = v->v.u != 0;
    return 0;
}

int gguf_get_str(const GGUFFile *f, const char *key, GGUFStr *out) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v || v->type != GGUF_STRING) return -1;
    *out = v->v.str;
    return 0;
}

const GGUFValue *gguf_get_arr(const GGUFFile *f, const char *key, GGUFType elem) {
    const GGUFValue *v = gguf_get(f, key);
    if (!v || v->type != GGUF_ARRAY) return NULL;
    return elem == GGUF_ARRAY || v->v.arr.elem == elem ? v : NULL;
}

const char *gguf_type_name(GGUFType t) {
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32",
                                        "int32", "float32", "bool", "string", "array",
                                        "uint64", "int64", "float64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}
