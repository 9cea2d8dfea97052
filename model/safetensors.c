/* safetensors.c — safetensors checkpoints through mmap (see safetensors.h).
 *
 * Each shard's header is parsed with the JSON reader and every tensor entry is
 * checked before anything points into the mapping: a known dtype, 1..4 dims,
 * begin <= end <= data size, and end - begin == elements x element size with
 * no overflow. A sharded checkpoint is opened through its index: every shard
 * named in weight_map is mapped once, and every tensor the index names must
 * be in the shard it names. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/json.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20)

typedef struct { uint32_t *slots; size_t cap; } NameIndex; /* slot = tensor index + 1 */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int st_dtype(const char *s, DType *out, int *elem_bytes) {
    if (!strcmp(s, "F32")) { *out = DT_F32; *elem_bytes = 4; return 0; }
    if (!strcmp(s, "F16")) { *out = DT_F16; *elem_bytes = 2; return 0; }
    if (!strcmp(s, "BF16")) { *out = DT_BF16; *elem_bytes = 2; return 0; }
    return !strcmp(s, "F8_E4M3") || !strcmp(s, "F8_E5M2") ? -2 : -1;
}

static int st_map_file(SafetensorsShard *sh, const char *path, Err *err) {
    memset(sh, 0, sizeof *sh);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) { close(fd); return err_set(err, "%s: not a regular file", path); }
    sh->path = strdup(path);
    sh->map_size = (size_t)s.st_size;
    if (sh->map_size > 0) {
        void *m = mmap(NULL, sh->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) { close(fd); return err_set(err, "%s: cannot map: %s", path, strerror(errno)); }
        sh->map = m;
    }
    close(fd);
    return sh->path ? 0 : err_set(err, "%s: out of memory", path);
}

static int st_add_tensor(Safetensors *st, int shard, const char *name, const JsonValue *e, const uint8_t *data,
                         uint64_t data_size, Err *err) {
    const char *path = st->shards[shard].path;
    const JsonValue *dt = json_get(e, "dtype"), *shape = json_get(e, "shape"), *offs = json_get(e, "data_offsets");
    if (!dt || dt->type != JSON_STRING) return err_set(err, "%s: tensor '%s': field 'dtype' missing or not a string", path, name);
    if (!shape || shape->type != JSON_ARRAY) return err_set(err, "%s: tensor '%s': field 'shape' missing or not an array", path, name);
    if (!offs || offs->type != JSON_ARRAY || json_len(offs) != 2)
        return err_set(err, "%s: tensor '%s': field 'data_offsets' must be [begin, end]", path, name);
    TensorInfo t = {0};
    int eb = 0, rc = st_dtype(dt->u.string.s, &t.type, &eb);
    if (rc == -2) return err_set(err, "%s: tensor '%s': dtype %s is not supported yet", path, name, dt->u.string.s);
    if (rc) return err_set(err, "%s: tensor '%s': unsupported dtype '%s' (F32, F16 and BF16 are)", path, name, dt->u.string.s);
    size_t nd = json_len(shape);
    if (nd > TENSOR_MAX_DIMS) return err_set(err, "%s: tensor '%s': %zu dimensions (at most %d)", path, name, nd, TENSOR_MAX_DIMS);
    uint64_t n = 1;
    t.n_dims = nd ? (int)nd : 1;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) t.ne[d] = 1;
    for (size_t d = 0; d < nd; d++) {
        const JsonValue *v = json_at(shape, d);
        if (v->type != JSON_NUMBER || !v->u.number.is_int || v->u.number.i < 0 || v->u.number.i > ((int64_t)1 << 40))
            return err_set(err, "%s: tensor '%s': shape[%zu] is not a valid size", path, name, d);
        t.ne[nd - 1 - d] = (uint64_t)v->u.number.i; /* innermost first */
        if (v->u.number.i && n > UINT64_MAX / (uint64_t)v->u.number.i / 8)
            return err_set(err, "%s: tensor '%s': shape overflows", path, name);
        n *= (uint64_t)v->u.number.i;
    }
    const JsonValue *b = json_at(offs, 0), *en = json_at(offs, 1);
    if (b->type != JSON_NUMBER || en->type != JSON_NUMBER || !b->u.number.is_int || !en->u.number.is_int ||
        b->u.number.i < 0 || en->u.number.i < b->u.number.i || (uint64_t)en->u.number.i > data_size)
        return err_set(err, "%s: tensor '%s': data_offsets lie outside the %llu data bytes", path, name,
                       (unsigned long long)data_size);
    t.offset = (uint64_t)b->u.number.i;
    t.nbytes = (uint64_t)(en->u.number.i - b->u.number.i);
    if (t.nbytes != n * (uint64_t)eb)
        return err_set(err, "%s: tensor '%s': %llu bytes for %llu elements of %s", path, name,
                       (unsigned long long)t.nbytes, (unsigned long long)n, dt->u.string.s);
    t.data = data + t.offset;
    t.name = strdup(name);
    if (!t.name) return err_set(err, "%s: out of memory", path);
    uint64_t n_now = st->n_tensors;
    if (n_now == 0 || (n_now >= 64 && (n_now & (n_now - 1)) == 0)) { /* capacity 64, 128, 256, ... */
        uint64_t cap = n_now ? 2 * n_now : 64;
        TensorInfo *ts = realloc(st->tensors, cap * sizeof *ts);
        int *sh = realloc(st->tensor_shard, cap * sizeof *sh);
        if (ts) st->tensors = ts;
        if (sh) st->tensor_shard = sh;
        if (!ts || !sh) { free(t.name); return err_set(err, "%s: out of memory", path); }
    }
    st->tensors[st->n_tensors] = t;
    st->tensor_shard[st->n_tensors++] = shard;
    return 0;
}

/* Parses the header of shard i and adds its tensors. */
static int st_read_shard(Safetensors *st, int i, Err *err) {
    const SafetensorsShard *sh = &st->shards[i];
    if (sh->map_size < 8) return err_set(err, "%s: file too short for a safetensors header (%zu bytes)", sh->path, sh->map_size);
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--) hlen = hlen << 8 | sh->map[b];
    if (hlen > ST_MAX_HEADER || hlen > sh->map_size - 8)
        return err_set(err, "%s: header length %llu exceeds the file (%zu bytes) or the 100 MB limit", sh->path,
                       (unsigned long long)hlen, sh->map_size);
    Json *doc = json_parse((const char *)sh->map + 8, hlen, sh->path, err);
    if (!doc) return -1;
    const JsonValue *root = json_root(doc);
    int rc = root->type == JSON_OBJECT ? 0 : err_set(err, "%s: header is not a JSON object", sh->path);
    for (size_t k = 0; rc == 0 && k < root->u.object.n; k++) {
        const char *name = root->u.object.keys[k];
        const JsonValue *e = &root->u.object.values[k];
        if (!strcmp(name, "__metadata__")) {
            if (e->type != JSON_OBJECT) rc = err_set(err, "%s: '__metadata__' must be an object", sh->path);
            continue;
        }
        if (e->type != JSON_OBJECT) { rc = err_set(err, "%s: tensor '%s': entry is not an object", sh->path, name); break; }
        rc = st_add_tensor(st, i, name, e, sh->map + 8 + hlen, sh->map_size - 8 - hlen, err);
    }
    json_free(doc);
    return rc;
}

static int st_build_index(Safetensors *st, Err *err) {
    NameIndex *ix = calloc(1, sizeof *ix);
    size_t cap = 16;
    while (cap < st->n_tensors * 2) cap *= 2;
    if (!ix || !(ix->slots = calloc(cap, sizeof *ix->slots))) { free(ix); return err_set(err, "%s: out of memory", st->dir); }
    ix->cap = cap;
    st->priv = ix;
    for (uint64_t i = 0; i < st->n_tensors; i++) {
        for (size_t h = name_hash(st->tensors[i].name) & (cap - 1);; h = (h + 1) & (cap - 1)) {
            uint32_t s = ix->slots[h];
            if (!s) { ix->slots[h] = (uint32_t)i + 1; break; }
            if (!strcmp(st->tensors[s - 1].name, st->tensors[i].name))
                return err_set(err, "%s: tensor '%s' appears twice (in %s and %s)", st->dir, st->tensors[i].name,
                               st->shards[st->tensor_shard[s - 1]].path, st->shards[st->tensor_shard[i]].path);
        }
    }
    return 0;
}

const TensorInfo *safetensors_find(const Safetensors *st, const char *name) {
    const NameIndex *ix = st->priv;
    if (!ix) return NULL;
    for (size_t h = name_hash(name) & (ix->cap - 1);; h = (h + 1) & (ix->cap - 1)) {
        uint32_t s = ix->slots[h];
        if (!s) return NULL;
        if (!strcmp(st->tensors[s - 1].name, name)) return &st->tensors[s - 1];
    }
}

static bool is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int st_add_shard(Safetensors *st, const char *path, Err *err) {
    SafetensorsShard *s = realloc(st->shards, (st->n_shards + 1) * sizeof *s);
    if (!s) return err_set(err, "%s: out of memory", path);
    st->shards = s;
    if (st_map_file(&st->shards[st->n_shards], path, err)) {
        free(st->shards[st->n_shards].path);
        return -1;
    }
    st->n_shards++;
    return 0;
}

/* Opens every shard named by an index file and checks the index's claims. */
static int st_open_index(Safetensors *st, const char *index_path, Err *err) {
    Json *doc = json_parse_file(index_path, err);
    if (!doc) return -1;
    const JsonValue *wm = json_get(json_root(doc), "weight_map");
    int rc = wm && wm->type == JSON_OBJECT ? 0 : err_set(err, "%s: field 'weight_map' missing or not an object", index_path);
    char path[4096];
    for (size_t k = 0; rc == 0 && k < wm->u.object.n; k++) {
        const JsonValue *f = &wm->u.object.values[k];
        if (f->type != JSON_STRING || strchr(f->u.string.s, '/') || !f->u.string.s[0]) {
            rc = err_set(err, "%s: weight_map['%s'] must be a file name in the same folder", index_path, wm->u.object.keys[k]);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", st->dir, f->u.string.s);
        bool seen = false;
        for (int s = 0; s < st->n_shards && !seen; s++) seen = !strcmp(st->shards[s].path, path);
        if (!seen && (rc = st_add_shard(st, path, err)) == 0) rc = st_read_shard(st, st->n_shards - 1, err);
    }
    if (rc == 0) rc = st_build_index(st, err);
    for (size_t k = 0; rc == 0 && k < wm->u.object.n; k++) {
        const TensorInfo *t = safetensors_find(st, wm->u.object.keys[k]);
        snprintf(path, sizeof path, "%s/%s", st->dir, wm->u.object.values[k].u.string.s);
        if (!t || strcmp(st->shards[st->tensor_shard[t - st->tensors]].path, path))
            rc = err_set(err, "%s: tensor '%s' is not in %s as the index says", index_path, wm->u.object.keys[k], path);
    }
    json_free(doc);
    return rc;
}

int safetensors_open(Safetensors *st, const char *path, Err *err) {
    memset(st, 0, sizeof *st);
    char buf[4096];
    int rc;
    if (is_dir(path)) {
        st->dir = strdup(path);
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (access(buf, R_OK) == 0) {
            rc = st_open_index(st, buf, err);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (access(buf, R_OK) != 0) {
                safetensors_close(st);
                return err_set(err, "%s: no model.safetensors or model.safetensors.index.json in this folder", path);
            }
            rc = st_add_shard(st, buf, err) || st_read_shard(st, 0, err) || st_build_index(st, err) ? -1 : 0;
        }
    } else {
        const char *slash = strrchr(path, '/');
        st->dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
        if (ends_with(path, ".json")) rc = st_open_index(st, path, err);
        else rc = st_add_shard(st, path, err) || st_read_shard(st, 0, err) || st_build_index(st, err) ? -1 : 0;
    }
    if (rc) safetensors_close(st);
    return rc;
}

void safetensors_close(Safetensors *st) {
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map) munmap((void *)st->shards[i].map, st->shards[i].map_size);
        free(st->shards[i].path);
    }
    for (uint64_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    NameIndex *ix = st->priv;
    if (ix) free(ix->slots);
    free(ix);
    free(st->shards);
    free(st->tensors);
    free(st->tensor_shard);
    free(st->dir);
    memset(st, 0, sizeof *st);
}
