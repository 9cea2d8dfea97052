/* safetensors.c — safetensors checkpoints through mmap (see safetensors.h).
 *
 * Each shard's header is parsed with the JSON reader and every tensor entry is
 * checked before anything points into the mapping: a known dtype, 0..4 dims
 * (a scalar is one element), begin <= end <= data size, and end - begin ==
 * elements x element size with no overflow. "__metadata__" must be an object
 * of strings and is otherwise ignored.
 *
 * Deliberately allowed: tensors whose byte ranges overlap, and data bytes no
 * tensor uses. The format forbids both, but neither makes a read unsafe (each
 * range is checked against the file on its own), and rejecting them would
 * need a sort of every range for no safety gain. Data pointers are not
 * checked for alignment: the format does not promise any, so readers of
 * `data` copy or use unaligned-safe loads.
 *
 * A sharded checkpoint is opened through its index: every shard named in
 * weight_map is mapped once, and every tensor the index names must be in the
 * shard it names. Names are unique across shards; lookups binary-search a
 * sorted order of the names (no hash a hostile file could flood). */
#include "formats/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20)
#define ST_MAX_DIM ((int64_t)1 << 40)

/* Maps dtype text to a DType: 0 known, -2 known but not supported yet, -1 unknown. */
static int st_dtype(const char *s, DType *out, int *elem_bytes) {
    if (!strcmp(s, "F32")) { *out = DT_F32; *elem_bytes = 4; return 0; }
    if (!strcmp(s, "F16")) { *out = DT_F16; *elem_bytes = 2; return 0; }
    if (!strcmp(s, "BF16")) { *out = DT_BF16; *elem_bytes = 2; return 0; }
    if (!strcmp(s, "F8_E4M3")) { *out = DT_F8_E4M3; *elem_bytes = 1; return 0; }
    return !strcmp(s, "F8_E5M2") ? -2 : -1;
}

static int st_map_file(SafetensorsShard *sh, const char *path, Err *err) {
    memset(sh, 0, sizeof *sh);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) { close(fd); return err_set(err, "%s: not a regular file", path); }
    sh->map_size = (size_t)s.st_size;
    if (sh->map_size > 0) {
        void *m = mmap(NULL, sh->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) { close(fd); return err_set(err, "%s: cannot map: %s", path, strerror(errno)); }
        sh->map = m;
    }
    close(fd);
    if (!(sh->path = strdup(path))) {
        if (sh->map) munmap((void *)sh->map, sh->map_size);
        sh->map = NULL;
        return err_set(err, "%s: out of memory", path);
    }
    return 0;
}

/* Reads shape (safetensors order, outermost first) into t->ne innermost
 * first; *n gets the element count, bounded so n x 8 cannot overflow. */
static int st_read_shape(TensorInfo *t, const JsonValue *shape, const char *path, const char *name, uint64_t *n,
                         Err *err) {
    size_t nd = json_len(shape);
    if (nd > TENSOR_MAX_DIMS)
        return err_set(err, "%s: tensor '%s': shape has %zu dimensions (at most %d are supported)", path, name, nd,
                       TENSOR_MAX_DIMS);
    t->n_dims = nd ? (int)nd : 1;
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) t->ne[d] = 1;
    *n = 1;
    for (size_t d = 0; d < nd; d++) {
        const JsonValue *v = json_at(shape, d);
        if (v->type != JSON_NUMBER || !v->u.number.is_int || v->u.number.i < 0 || v->u.number.i > ST_MAX_DIM)
            return err_set(err, "%s: tensor '%s': shape[%zu] is not a valid size (a whole number 0..2^40)", path, name, d);
        uint64_t dim = (uint64_t)v->u.number.i;
        t->ne[nd - 1 - d] = dim;
        if (dim && *n > UINT64_MAX / 8 / dim) return err_set(err, "%s: tensor '%s': shape overflows", path, name);
        *n *= dim;
    }
    return 0;
}

/* Reads data_offsets [begin, end] and checks them against the data section
 * and the element count. */
static int st_read_offsets(TensorInfo *t, const JsonValue *offs, uint64_t n, int eb, const char *dtype,
                           uint64_t data_size, const char *path, const char *name, Err *err) {
    const JsonValue *b = json_at(offs, 0), *e = json_at(offs, 1);
    if (b->type != JSON_NUMBER || e->type != JSON_NUMBER || !b->u.number.is_int || !e->u.number.is_int ||
        b->u.number.i < 0 || e->u.number.i < 0)
        return err_set(err, "%s: tensor '%s': data_offsets must be two whole numbers >= 0", path, name);
    uint64_t begin = (uint64_t)b->u.number.i, end = (uint64_t)e->u.number.i;
    if (begin > end || end > data_size)
        return err_set(err, "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the %llu data bytes", path, name,
                       (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
    if (end - begin != n * (uint64_t)eb)
        return err_set(err, "%s: tensor '%s': data_offsets span %llu bytes but the shape needs %llu elements of %s = %llu",
                       path, name, (unsigned long long)(end - begin), (unsigned long long)n, dtype,
                       (unsigned long long)(n * (uint64_t)eb));
    t->offset = begin;
    t->nbytes = end - begin;
    return 0;
}

/* Checks one header entry and appends it to st->tensors (capacity reserved by the caller). */
static int st_add_tensor(Safetensors *st, int shard, const char *name, const JsonValue *e, const uint8_t *data,
                         uint64_t data_size, Err *err) {
    const char *path = st->shards[shard].path;
    if (e->type != JSON_OBJECT) return err_set(err, "%s: tensor '%s': entry is not an object", path, name);
    const JsonValue *dt = json_get(e, "dtype"), *shape = json_get(e, "shape"), *offs = json_get(e, "data_offsets");
    if (!dt || dt->type != JSON_STRING) return err_set(err, "%s: tensor '%s': field 'dtype' missing or not a string", path, name);
    if (!shape || shape->type != JSON_ARRAY) return err_set(err, "%s: tensor '%s': field 'shape' missing or not an array", path, name);
    if (!offs || offs->type != JSON_ARRAY || json_len(offs) != 2)
        return err_set(err, "%s: tensor '%s': field 'data_offsets' missing or not [begin, end]", path, name);
    TensorInfo t = {0};
    int eb = 0, rc = st_dtype(dt->u.string.s, &t.type, &eb);
    if (rc == -2)
        return err_set(err, "%s: tensor '%s': dtype %s is not supported (FP8 weights must be F8_E4M3)", path, name,
                       dt->u.string.s);
    if (rc)
        return err_set(err, "%s: tensor '%s': unsupported dtype '%.32s' (F32, F16, BF16 and F8_E4M3 are)", path, name,
                       dt->u.string.s);
    uint64_t n = 0;
    if (st_read_shape(&t, shape, path, name, &n, err) ||
        st_read_offsets(&t, offs, n, eb, dt->u.string.s, data_size, path, name, err))
        return -1;
    t.data = data + t.offset;
    if (!(t.name = strdup(name))) return err_set(err, "%s: out of memory", path);
    st->tensors[st->n_tensors] = t;
    st->tensor_shard[st->n_tensors++] = shard;
    return 0;
}

static int st_check_metadata(const JsonValue *md, const char *path, Err *err) {
    if (md->type != JSON_OBJECT) return err_set(err, "%s: '__metadata__' must be an object of strings", path);
    for (size_t i = 0; i < md->u.object.n; i++)
        if (md->u.object.values[i].type != JSON_STRING)
            return err_set(err, "%s: '__metadata__' member '%s' is not a string", path, md->u.object.keys[i]);
    return 0;
}

/* Makes room for `more` tensors. */
static int st_reserve(Safetensors *st, size_t more, const char *path, Err *err) {
    size_t cap = (size_t)st->n_tensors + more;
    TensorInfo *ts = realloc(st->tensors, (cap ? cap : 1) * sizeof *ts);
    if (ts) st->tensors = ts;
    int *sh = realloc(st->tensor_shard, (cap ? cap : 1) * sizeof *sh);
    if (sh) st->tensor_shard = sh;
    return ts && sh ? 0 : err_set(err, "%s: out of memory", path);
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
    int rc = root->type == JSON_OBJECT ? st_reserve(st, root->u.object.n, sh->path, err)
                                       : err_set(err, "%s: header is not a JSON object", sh->path);
    for (size_t k = 0; rc == 0 && k < root->u.object.n; k++) {
        const char *name = root->u.object.keys[k];
        const JsonValue *e = &root->u.object.values[k];
        if (strlen(name) != root->u.object.key_lens[k])
            rc = err_set(err, "%s: tensor name '%s...' contains a NUL character", sh->path, name);
        else if (!strcmp(name, "__metadata__"))
            rc = st_check_metadata(e, sh->path, err);
        else
            rc = st_add_tensor(st, i, name, e, sh->map + 8 + hlen, sh->map_size - 8 - hlen, err);
    }
    json_free(doc);
    return rc;
}

static int st_cmp_names(const void *a, const void *b, void *arg) {
    const TensorInfo *ts = arg;
    return strcmp(ts[*(const size_t *)a].name, ts[*(const size_t *)b].name);
}

/* Sorts tensor numbers by name into priv; equal neighbours are duplicates. */
static int st_build_index(Safetensors *st, Err *err) {
    size_t n = (size_t)st->n_tensors, *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return err_set(err, "%s: out of memory", st->dir);
    for (size_t i = 0; i < n; i++) order[i] = i;
    qsort_r(order, n, sizeof *order, st_cmp_names, st->tensors);
    st->priv = order;
    for (size_t i = 1; i < n; i++) {
        if (strcmp(st->tensors[order[i - 1]].name, st->tensors[order[i]].name)) continue;
        /* qsort is not stable: name the later occurrence's file first. */
        size_t first = order[i - 1] < order[i] ? order[i - 1] : order[i], second = order[i - 1] ^ order[i] ^ first;
        const char *f1 = st->shards[st->tensor_shard[first]].path, *f2 = st->shards[st->tensor_shard[second]].path;
        return f1 == f2 ? err_set(err, "%s: tensor '%s' appears twice in the header", f2, st->tensors[first].name)
                        : err_set(err, "%s: tensor '%s' appears twice (also in %s)", f2, st->tensors[first].name, f1);
    }
    return 0;
}

const TensorInfo *safetensors_find(const Safetensors *st, const char *name) {
    const size_t *order = st->priv;
    if (!order || !name) return NULL;
    size_t lo = 0, hi = (size_t)st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[order[mid]].name, name);
        if (c == 0) return &st->tensors[order[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static bool is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* "dir/file" in a fresh allocation (NULL when out of memory). */
static char *path_join(const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, file, b + 1);
    return p;
}

/* Maps path as the next shard and reads its header. */
static int st_add_shard(Safetensors *st, const char *path, Err *err) {
    SafetensorsShard *s = realloc(st->shards, ((size_t)st->n_shards + 1) * sizeof *s);
    if (!s) return err_set(err, "%s: out of memory", path);
    st->shards = s;
    if (st_map_file(&st->shards[st->n_shards], path, err)) return -1;
    st->n_shards++;
    return st_read_shard(st, st->n_shards - 1, err);
}

/* Index of the shard already opened from file name f, or -1. */
static int st_shard_named(const Safetensors *st, const char *f) {
    size_t dl = strlen(st->dir);
    for (int s = 0; s < st->n_shards; s++) {
        const char *p = st->shards[s].path;
        if (!strncmp(p, st->dir, dl) && p[dl] == '/' && !strcmp(p + dl + 1, f)) return s;
    }
    return -1;
}

/* Opens the shards weight_map names, each once, in the order first named. */
static int st_open_shards(Safetensors *st, const JsonValue *wm, const char *index_path, Err *err) {
    for (size_t k = 0; k < wm->u.object.n; k++) {
        const JsonValue *f = &wm->u.object.values[k];
        if (f->type != JSON_STRING || !f->u.string.s[0] || strchr(f->u.string.s, '/') ||
            strlen(f->u.string.s) != f->u.string.len || !strcmp(f->u.string.s, "..") || !strcmp(f->u.string.s, "."))
            return err_set(err, "%s: weight_map['%s'] must be a file name in the same folder", index_path,
                           wm->u.object.keys[k]);
        if (st_shard_named(st, f->u.string.s) >= 0) continue;
        char *path = path_join(st->dir, f->u.string.s);
        if (!path) return err_set(err, "%s: out of memory", index_path);
        int rc = st_add_shard(st, path, err);
        if (rc && access(path, F_OK) != 0)
            err_set(err, "%s: shard %s named in weight_map (for tensor '%s') is missing", index_path, path,
                    wm->u.object.keys[k]);
        free(path);
        if (rc) return -1;
    }
    return 0;
}

/* Opens every shard named by an index file and checks the index's claims. */
static int st_open_index(Safetensors *st, const char *index_path, Err *err) {
    Json *doc = json_parse_file(index_path, err);
    if (!doc) return -1;
    const JsonValue *wm = json_get(json_root(doc), "weight_map");
    int rc = wm && wm->type == JSON_OBJECT ? 0 : err_set(err, "%s: field 'weight_map' missing or not an object", index_path);
    if (rc == 0) rc = st_open_shards(st, wm, index_path, err);
    if (rc == 0) rc = st_build_index(st, err);
    for (size_t k = 0; rc == 0 && k < wm->u.object.n; k++) {
        const TensorInfo *t = safetensors_find(st, wm->u.object.keys[k]);
        int want = st_shard_named(st, wm->u.object.values[k].u.string.s);
        if (!t || st->tensor_shard[t - st->tensors] != want)
            rc = err_set(err, "%s: tensor '%s' is not in %s as weight_map says", index_path, wm->u.object.keys[k],
                         st->shards[want].path);
    }
    json_free(doc);
    return rc;
}

/* A folder: its index if there is one, else its model.safetensors. */
static int st_open_dir(Safetensors *st, const char *dir, Err *err) {
    char *index = path_join(dir, "model.safetensors.index.json"), *single = path_join(dir, "model.safetensors");
    int rc;
    if (!index || !single) rc = err_set(err, "%s: out of memory", dir);
    else if (access(index, F_OK) == 0) rc = st_open_index(st, index, err);
    else if (access(single, F_OK) == 0) rc = st_add_shard(st, single, err) || st_build_index(st, err) ? -1 : 0;
    else rc = err_set(err, "%s: no model.safetensors or model.safetensors.index.json in this folder", dir);
    free(index);
    free(single);
    return rc;
}

int safetensors_open(Safetensors *st, const char *path, Err *err) {
    memset(st, 0, sizeof *st);
    int rc;
    if (is_dir(path)) {
        rc = (st->dir = strdup(path)) ? st_open_dir(st, path, err) : err_set(err, "%s: out of memory", path);
    } else {
        const char *slash = strrchr(path, '/');
        st->dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
        if (!st->dir) rc = err_set(err, "%s: out of memory", path);
        else if (ends_with(path, ".json")) rc = st_open_index(st, path, err);
        else rc = st_add_shard(st, path, err) || st_build_index(st, err) ? -1 : 0;
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
    free(st->priv);
    free(st->shards);
    free(st->tensors);
    free(st->tensor_shard);
    free(st->dir);
    memset(st, 0, sizeof *st);
}
