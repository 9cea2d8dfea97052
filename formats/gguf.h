/* gguf.h — reads GGUF v2 and v3 model files through mmap.
 *
 * Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 kv
 * count, then kv pairs (string key, u32 value type, value), then tensor infos
 * (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset), then
 * padding to `general.alignment` (default 32), then tensor data; each tensor's
 * offset is relative to that data start. Strings are u64 length + bytes.
 *
 * Everything read from the file is checked before use: counts against the
 * bytes left, offsets and sizes for overflow and for lying inside the file,
 * dims positive, type ids known, names unique, alignment a power of two.
 * Errors name the file and the key or tensor. Nothing is copied out of the
 * mapping except the parsed metadata index.
 */
#ifndef CLLM_GGUF_H
#define CLLM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/err.h"
#include "formats/tensor.h"

typedef enum {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
} GGUFType;

typedef struct { const char *ptr; uint64_t len; } GGUFStr; /* points into the mapping; not NUL-terminated */

typedef struct GGUFValue GGUFValue;
struct GGUFValue {
    GGUFType type;
    union {
        uint64_t u;      /* UINT8..UINT64, BOOL (0/1) */
        int64_t i;       /* INT8..INT64 */
        double f;        /* FLOAT32, FLOAT64 */
        GGUFStr str;     /* STRING */
        struct {
            GGUFType elem;      /* element type */
            uint64_t n;         /* element count */
            GGUFValue *items;   /* n parsed elements (nested arrays included) */
        } arr;
    } v;
};

typedef struct {
    char *key;        /* NUL-terminated copy */
    GGUFValue value;
} GGUFKV;

typedef TensorInfo GGUFTensor; /* offset: from the data start; data: inside the mapping */

typedef struct {
    char *path;
    uint32_t version;
    const uint8_t *map; size_t map_size;
    uint64_t n_kv; GGUFKV *kv;
    uint64_t n_tensors; GGUFTensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    void *priv;             /* lookup indexes */
} GGUFFile;

/* Maps and parses path. On failure fills err and leaves f closed. */
int gguf_open(GGUFFile *f, const char *path, Err *err);
void gguf_close(GGUFFile *f);

const GGUFValue *gguf_get(const GGUFFile *f, const char *key);  /* NULL if absent */
const GGUFTensor *gguf_find_tensor(const GGUFFile *f, const char *name);

/* Typed getters: 0 on success; -1 when missing or of an incompatible type
 * (integers convert between widths when the value fits). `arch`-relative keys
 * are the caller's business: pass the full key. */
int gguf_get_u64(const GGUFFile *f, const char *key, uint64_t *out);
int gguf_get_i64(const GGUFFile *f, const char *key, int64_t *out);
int gguf_get_f64(const GGUFFile *f, const char *key, double *out); /* any numeric type */
int gguf_get_bool(const GGUFFile *f, const char *key, bool *out);
int gguf_get_str(const GGUFFile *f, const char *key, GGUFStr *out);
/* Array of elem type (elem GGUF_ARRAY for any); returns NULL if absent/other. */
const GGUFValue *gguf_get_arr(const GGUFFile *f, const char *key, GGUFType elem);

const char *gguf_type_name(GGUFType t);

#endif
