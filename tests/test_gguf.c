/* test_gguf.c — the GGUF reader against files written by gguf-py.
 *
 * 1. valid_v3.gguf / valid_v2.gguf read back exactly as valid.json says
 *    (every kv with nested arrays, tensor shapes/types/offsets/data).
 * 2. The two real model files open fast and agree with models.json (facts
 *    taken from gguf-py's GGUFReader) key by key and tensor by tensor.
 * 3. Hostile files, made here by mutating a valid file in memory: every
 *    truncation, wrong magic/version, lying counts and lengths, nesting
 *    bombs, bad dims and types, misaligned or out-of-file data, duplicates,
 *    bad alignment. Each must fail with an error naming the file and field.
 */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/json.h"
#include "formats/detect.h"
#include "formats/gguf.h"
#include "test.h"

static bool quick(void) {
    const char *q = getenv("CLLM_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static Json *load_json(const char *name) {
    char path[1024];
    Err err = {{0}};
    snprintf(path, sizeof path, "%s/gguf/%s", test_fixture_dir(), name);
    Json *doc = json_parse_file(path, &err);
    CHECK(doc != NULL, "%s (run tests/fixtures/make_gguf_fixtures.py): %s", path, err.msg);
    return doc;
}

/* Integers are written as decimal strings (exact for 64 bits) in valid.json
 * and as plain numbers in models.json; accept both. */
static bool json_u64(const JsonValue *j, uint64_t *out) {
    if (j && j->type == JSON_STRING) {
        char *end;
        *out = strtoull(j->u.string.s, &end, 10);
        return *end == 0 && j->u.string.s[0] != '-';
    }
    if (j && j->type == JSON_NUMBER && j->u.number.is_int && j->u.number.i >= 0) {
        *out = (uint64_t)j->u.number.i;
        return true;
    }
    return false;
}

static bool json_i64(const JsonValue *j, int64_t *out) {
    if (j && j->type == JSON_STRING) {
        char *end;
        *out = strtoll(j->u.string.s, &end, 10);
        return *end == 0;
    }
    if (j && j->type == JSON_NUMBER && j->u.number.is_int) {
        *out = j->u.number.i;
        return true;
    }
    return false;
}

/* Compares a parsed value with its expectation {type, value} or {type, elem, items}
 * (or, for array samples, a bare JSON value of the element type). */
static void check_scalar(const char *key, const GGUFValue *v, GGUFType t, const JsonValue *want) {
    uint64_t u;
    int64_t i;
    switch (t) {
    case GGUF_UINT8: case GGUF_UINT16: case GGUF_UINT32: case GGUF_UINT64:
        CHECK(json_u64(want, &u) && v->v.u == u, "%s: %llu", key, (unsigned long long)v->v.u);
        break;
    case GGUF_INT8: case GGUF_INT16: case GGUF_INT32: case GGUF_INT64:
        CHECK(json_i64(want, &i) && v->v.i == i, "%s: %lld", key, (long long)v->v.i);
        break;
    case GGUF_FLOAT32: case GGUF_FLOAT64:
        CHECK(want && want->type == JSON_NUMBER && v->v.f == want->u.number.num, "%s: %.17g", key, v->v.f);
        break;
    case GGUF_BOOL:
        CHECK(want && want->type == JSON_BOOL && v->v.u == (uint64_t)want->u.boolean, "%s: bool", key);
        break;
    case GGUF_STRING:
        CHECK(want && want->type == JSON_STRING && v->v.str.len == want->u.string.len &&
                  memcmp(v->v.str.ptr, want->u.string.s, v->v.str.len) == 0,
              "%s: string '%.*s'", key, (int)(v->v.str.len > 60 ? 60 : v->v.str.len), v->v.str.ptr);
        break;
    default: CHECK(0, "%s: unexpected type %d", key, t);
    }
}

static void check_value(const char *key, const GGUFValue *v, const JsonValue *want) {
    int64_t type = json_get_int(want, "type", -1);
    CHECK(v->type == type, "%s: type %s, want %lld", key, gguf_type_name(v->type), (long long)type);
    if (v->type != type) return;
    if (type != GGUF_ARRAY) {
        check_scalar(key, v, v->type, json_get(want, "value"));
        return;
    }
    const JsonValue *items = json_get(want, "items");
    CHECK(v->v.arr.elem == json_get_int(want, "elem", -1), "%s: elem %s", key,
          gguf_type_name(v->v.arr.elem));
    CHECK(v->v.arr.n == json_len(items), "%s: %llu items, want %zu", key,
          (unsigned long long)v->v.arr.n, json_len(items));
    if (v->v.arr.n != json_len(items)) return;
    for (uint64_t k = 0; k < v->v.arr.n; k++) {
        CHECK(v->v.arr.items[k].type == v->v.arr.elem, "%s[%llu]: item type", key, (unsigned long long)k);
        check_value(key, &v->v.arr.items[k], json_at(items, k));
    }
}

/* The tensor infos every file json lists: name, type, ne, offset, nbytes. */
static void check_tensor(const GGUFFile *f, size_t k, const JsonValue *want, bool check_index) {
    const char *name = json_get_str(want, "name", "");
    const GGUFTensor *t = gguf_find_tensor(f, name);
    CHECK(t != NULL, "%s: tensor %s missing", f->path, name);
    if (!t) return;
    if (check_index) CHECK(t == &f->tensors[k], "%s: tensor %s is not entry %zu", f->path, name, k);
    const JsonValue *ne = json_get(want, "ne");
    CHECK(t->type == json_get_int(want, "type", -1), "%s: type %d", name, t->type);
    CHECK(t->n_dims == (int)json_len(ne), "%s: n_dims %d", name, t->n_dims);
    for (int d = 0; d < TENSOR_MAX_DIMS; d++) {
        uint64_t want_d = d < (int)json_len(ne) ? (uint64_t)json_at(ne, (size_t)d)->u.number.i : 1;
        CHECK(t->ne[d] == want_d, "%s: ne[%d] = %llu, want %llu", name, d,
              (unsigned long long)t->ne[d], (unsigned long long)want_d);
    }
    CHECK(t->offset == (uint64_t)json_get_int(want, "offset", -1), "%s: offset %llu", name,
          (unsigned long long)t->offset);
    CHECK(t->nbytes == (uint64_t)json_get_int(want, "nbytes", -1), "%s: nbytes %llu", name,
          (unsigned long long)t->nbytes);
    CHECK(t->data == f->map + f->data_offset + t->offset, "%s: data pointer", name);
}

/* ---- 1. the valid fixtures ---- */

static void check_valid_file(const JsonValue *want) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/%s", test_fixture_dir(), json_get_str(want, "file", ""));
    GGUFFile f;
    Err err = {{0}};
    int rc = gguf_open(&f, path, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(f.version == json_get_int(want, "version", -1), "version %u", f.version);
    CHECK(f.alignment == (uint64_t)json_get_int(want, "alignment", -1), "alignment %llu",
          (unsigned long long)f.alignment);
    CHECK(f.data_offset == (uint64_t)json_get_int(want, "data_offset", -1), "data_offset %llu",
          (unsigned long long)f.data_offset);
    const JsonValue *kvs = json_get(want, "kv"), *ts = json_get(want, "tensors");
    CHECK(f.n_kv == json_len(kvs) && f.n_kv == (uint64_t)json_get_int(want, "n_kv", -1), "n_kv %llu",
          (unsigned long long)f.n_kv);
    CHECK(f.n_tensors == json_len(ts), "n_tensors %llu", (unsigned long long)f.n_tensors);
    for (size_t k = 0; k < json_len(kvs) && k < f.n_kv; k++) {
        const JsonValue *w = json_at(kvs, k);
        const char *key = json_get_str(w, "key", "");
        CHECK(strcmp(f.kv[k].key, key) == 0, "kv %zu: key %s, want %s", k, f.kv[k].key, key);
        CHECK(gguf_get(&f, key) == &f.kv[k].value, "gguf_get(%s)", key);
        check_value(key, &f.kv[k].value, w);
    }
    for (size_t k = 0; k < json_len(ts) && k < f.n_tensors; k++) {
        const JsonValue *w = json_at(ts, k);
        check_tensor(&f, k, w, true);
        const GGUFTensor *t = &f.tensors[k];
        const JsonValue *bits = json_get(w, "bits");
        uint64_t n = tensor_nelems(t);
        CHECK(json_len(bits) == n, "%s: %zu expected values", t->name, json_len(bits));
        if (json_len(bits) != n) continue;
        float *vals = malloc(n * sizeof *vals);
        dequantize_row(t->type, t->data, vals, (int64_t)n);
        int bad = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &vals[i], 4);
            bad += b != (uint32_t)json_at(bits, i)->u.number.i;
        }
        CHECK(bad == 0, "%s: %d values differ from gguf-py", t->name, bad);
        free(vals);
    }
    gguf_close(&f);
    CHECK(f.map == NULL && f.kv == NULL && f.priv == NULL, "close zeroes the struct");
    gguf_close(&f); /* a second close is harmless */
}

static void test_valid_fixtures(void) {
    Json *doc = load_json("valid.json");
    if (!doc) return;
    const JsonValue *files = json_get(json_root(doc), "files");
    CHECK(json_len(files) == 2, "two files");
    for (size_t i = 0; i < json_len(files); i++) check_valid_file(json_at(files, i));
    json_free(doc);
}

static void test_getters(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/valid_v3.gguf", test_fixture_dir());
    GGUFFile f;
    Err err = {{0}};
    CHECK(gguf_open(&f, path, &err) == 0, "%s", err.msg);
    uint64_t u = 0;
    int64_t i = 0;
    double d = 0;
    bool b = false;
    GGUFStr s = {0};
    CHECK(gguf_get_u64(&f, "test.u8", &u) == 0 && u == 200, "u8 as u64");
    CHECK(gguf_get_i64(&f, "test.u8", &i) == 0 && i == 200, "u8 as i64");
    CHECK(gguf_get_u64(&f, "test.u64", &u) == 0 && u == 18000000000000000000ull, "u64");
    CHECK(gguf_get_i64(&f, "test.u64", &i) == -1, "u64 too big for i64");
    CHECK(gguf_get_i64(&f, "test.i8", &i) == 0 && i == -100, "i8");
    CHECK(gguf_get_u64(&f, "test.i8", &u) == -1, "negative as u64");
    CHECK(gguf_get_i64(&f, "test.u32", &i) == 0 && i == 4000000000ll, "u32 as i64");
    CHECK(gguf_get_f64(&f, "test.i32", &d) == 0 && d == -2e9, "i32 as f64");
    CHECK(gguf_get_f64(&f, "test.f32", &d) == 0 && d == (double)0.1f, "f32");
    CHECK(gguf_get_u64(&f, "test.f32", &u) == -1, "float as u64");
    CHECK(gguf_get_f64(&f, "test.str", &d) == -1, "string as f64");
    CHECK(gguf_get_f64(&f, "test.bool_true", &d) == -1, "bool as f64");
    CHECK(gguf_get_bool(&f, "test.bool_true", &b) == 0 && b, "bool");
    CHECK(gguf_get_bool(&f, "test.u8", &b) == -1, "u8 as bool");
    CHECK(gguf_get_str(&f, "general.architecture", &s) == 0 && s.len == 11 &&
              memcmp(s.ptr, "fixturearch", 11) == 0, "architecture");
    CHECK(gguf_get_str(&f, "test.u8", &s) == -1, "u8 as string");
    CHECK(gguf_get_u64(&f, "no.such.key", &u) == -1 && gguf_get(&f, "no.such.key") == NULL, "missing");
    const GGUFValue *a = gguf_get_arr(&f, "test.arr_str", GGUF_STRING);
    CHECK(a && a->v.arr.n == 4 && a->v.arr.items[2].v.str.len == strlen("gamma δ"), "array of strings");
    CHECK(gguf_get_arr(&f, "test.arr_str", GGUF_INT32) == NULL, "wrong element type");
    CHECK(gguf_get_arr(&f, "test.arr_str", GGUF_ARRAY) == a, "any element type");
    CHECK(gguf_get_arr(&f, "test.u8", GGUF_ARRAY) == NULL, "not an array");
    const GGUFValue *n = gguf_get_arr(&f, "test.nested3", GGUF_ARRAY);
    CHECK(n && n->v.arr.items[0].v.arr.items[1].v.arr.items[0].v.f == 3.5, "nested3[0][1][0]");
    CHECK(gguf_find_tensor(&f, "t.q8_0") && !gguf_find_tensor(&f, "t.q8"), "find_tensor");
    CHECK(strcmp(gguf_type_name(GGUF_FLOAT64), "float64") == 0 &&
              strcmp(gguf_type_name((GGUFType)77), "unknown") == 0, "type names");
    gguf_close(&f);
    GGUFFile z;
    memset(&z, 0, sizeof z);
    CHECK(gguf_get(&z, "x") == NULL && gguf_find_tensor(&z, "x") == NULL, "lookups on a zeroed struct");
    gguf_close(&z);
}

/* ---- 2. the real models ---- */

static const char *models_dir(void) {
    const char *d = getenv("CLLM_MODELS");
    return d && *d ? d : "models/cache";
}

static void check_model_kv(const GGUFFile *f, const JsonValue *w) {
    const char *key = json_get_str(w, "key", "");
    const GGUFValue *v = gguf_get(f, key);
    CHECK(v != NULL, "%s: key %s missing", f->path, key);
    if (!v) return;
    CHECK(v->type == json_get_int(w, "type", -1), "%s: type %s", key, gguf_type_name(v->type));
    if (v->type != json_get_int(w, "type", -1)) return;
    if (v->type != GGUF_ARRAY) {
        check_scalar(key, v, v->type, json_get(w, "value"));
        return;
    }
    CHECK(v->v.arr.elem == json_get_int(w, "elem", -1) &&
              v->v.arr.n == (uint64_t)json_get_int(w, "n", -1),
          "%s: %llu items of %s", key, (unsigned long long)v->v.arr.n, gguf_type_name(v->v.arr.elem));
    const JsonValue *samples = json_get(w, "samples");
    for (size_t i = 0; i < json_len(samples); i++) {
        const JsonValue *s = json_at(samples, i);
        uint64_t idx = (uint64_t)json_at(s, 0)->u.number.i;
        CHECK(idx < v->v.arr.n, "%s: sample %llu", key, (unsigned long long)idx);
        if (idx < v->v.arr.n) check_scalar(key, &v->v.arr.items[idx], v->v.arr.elem, json_at(s, 1));
    }
}

/* The raw rows in dequant/real-<model>-<tensor>-row<r>.raw are the bytes of
 * that row in the model file as gguf-py saw them. */
static void check_model_rows(const GGUFFile *f, const char *model) {
    char path[1024], line[512], prefix[64];
    snprintf(path, sizeof path, "%s/gguf/dequant.txt", test_fixture_dir());
    snprintf(prefix, sizeof prefix, "real-%s-", model);
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL, "%s missing", path);
    if (!fp) return;
    int rows = 0;
    while (fgets(line, sizeof line, fp)) {
        char name[400], tensor[400];
        unsigned type;
        long long n, r;
        if (sscanf(line, "%399s %u %lld", name, &type, &n) != 3 || strncmp(name, prefix, strlen(prefix)))
            continue;
        snprintf(tensor, sizeof tensor, "%s", name + strlen(prefix));
        char *row = strstr(tensor, "-row");
        if (!row) continue;
        r = atoll(row + 4);
        *row = 0;
        const GGUFTensor *t = gguf_find_tensor(f, tensor);
        CHECK(t && t->type == (DType)type && t->ne[0] == (uint64_t)n, "%s: tensor %s", model, tensor);
        if (!t) continue;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/gguf/dequant/%s.raw", test_fixture_dir(), name);
        uint8_t *raw = read_all(path, &len);
        uint64_t rb = dtype_row_bytes(t->type, t->ne[0]);
        CHECK(raw && len == rb && memcmp(raw, (const uint8_t *)t->data + (uint64_t)r * rb, len) == 0,
              "%s: row %lld of %s differs from gguf-py's", model, r, tensor);
        free(raw);
        rows++;
    }
    fclose(fp);
    CHECK(rows >= 3, "%s: only %d rows checked", model, rows);
}

static void check_model(const JsonValue *w) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", models_dir(), json_get_str(w, "file", ""));
    struct stat st;
    CHECK(stat(path, &st) == 0, "%s not found: run models/fetch.sh or set CLLM_MODELS", path);
    if (stat(path, &st) != 0) return;
    GGUFFile f;
    Err err = {{0}};
    double t0 = now_s();
    int rc = gguf_open(&f, path, &err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "%s", err.msg);
    if (rc) return;
    printf("  %s: opened in %.1f ms (%llu keys, %llu tensors)\n", json_get_str(w, "name", ""),
           dt * 1e3, (unsigned long long)f.n_kv, (unsigned long long)f.n_tensors);
    if (!quick()) CHECK(dt < 0.2, "%s: opening took %.3f s", path, dt);
    CHECK(f.version == json_get_int(w, "version", -1), "version %u", f.version);
    CHECK(f.n_kv == (uint64_t)json_get_int(w, "n_kv", -1), "n_kv %llu", (unsigned long long)f.n_kv);
    CHECK(f.n_tensors == (uint64_t)json_get_int(w, "n_tensors", -1), "n_tensors %llu",
          (unsigned long long)f.n_tensors);
    CHECK(f.alignment == (uint64_t)json_get_int(w, "alignment", -1), "alignment");
    CHECK(f.data_offset == (uint64_t)json_get_int(w, "data_offset", -1), "data_offset %llu",
          (unsigned long long)f.data_offset);
    CHECK(f.map_size == (size_t)json_get_int(w, "file_size", -1), "map_size");
    const JsonValue *kvs = json_get(w, "kv"), *ts = json_get(w, "tensors");
    CHECK(json_len(kvs) == f.n_kv && json_len(ts) == f.n_tensors, "fixture counts");
    for (size_t k = 0; k < json_len(kvs); k++) check_model_kv(&f, json_at(kvs, k));
    for (size_t k = 0; k < json_len(ts); k++) check_tensor(&f, k, json_at(ts, k), true);
    check_model_rows(&f, json_get_str(w, "name", ""));
    gguf_close(&f);
}

static void test_real_models(void) {
    Json *doc = load_json("models.json");
    if (!doc) return;
    const JsonValue *models = json_get(json_root(doc), "models");
    CHECK(json_len(models) == 2, "two models");
    const char *arch[] = {"llama", "gemma3"};
    for (size_t i = 0; i < json_len(models); i++) {
        const JsonValue *w = json_at(models, i);
        /* a sanity check of the fixture itself: the architectures gguf-py read */
        const JsonValue *first = json_at(json_get(w, "kv"), 0);
        CHECK(i < 2 && strcmp(json_get_str(first, "value", ""), arch[i]) == 0, "fixture architecture");
        check_model(w);
    }
    json_free(doc);
}

/* ---- 3. hostile files ---- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->b = realloc(b->b, b->cap);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void buf_u32(Buf *b, uint32_t v) { buf_put(b, &v, 4); } /* the test host is little-endian */
static void buf_u64(Buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_str(Buf *b, const char *s) {
    buf_u64(b, strlen(s));
    buf_put(b, s, strlen(s));
}
static void buf_header(Buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    buf_put(b, "GGUF", 4);
    buf_u32(b, version);
    buf_u64(b, n_tensors);
    buf_u64(b, n_kv);
}

typedef struct {
    char path[64];
    uint8_t *orig; /* valid_v3.gguf */
    size_t len;
    uint64_t need; /* bytes a valid prefix must have: end of the last tensor's data */
} Hostile;

static int write_file(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(p, 1, n, fp) : 0;
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

/* Writes the bytes to the temp file and opens it. Returns gguf_open's code;
 * the file is closed again either way. */
static int open_bytes(const Hostile *h, const void *p, size_t n, Err *err) {
    GGUFFile f;
    err->msg[0] = 0;
    if (write_file(h->path, p, n)) return 99;
    int rc = gguf_open(&f, h->path, err);
    if (rc == 0) gguf_close(&f);
    else CHECK(f.map == NULL && f.kv == NULL && f.tensors == NULL && f.priv == NULL,
               "a failed open leaves the struct closed");
    gguf_close(&f); /* safe on a failed/closed struct */
    return rc;
}

/* Expects the bytes to be refused with a message naming the file and each of
 * the words (NULL-terminated list). */
#define EXPECT_FAIL(h, p, n, ...) expect_fail(h, p, n, __LINE__, (const char *[]){__VA_ARGS__, NULL})
static void expect_fail(const Hostile *h, const void *p, size_t n, int line, const char **words) {
    Err err;
    int rc = open_bytes(h, p, n, &err);
    CHECK(rc == -1, "line %d: opened a bad file (rc %d)", line, rc);
    CHECK(strstr(err.msg, h->path) != NULL, "line %d: error does not name the file: %s", line, err.msg);
    for (; *words; words++)
        CHECK(strstr(err.msg, *words) != NULL, "line %d: error lacks '%s': %s", line, *words, err.msg);
}

/* Where a string (a key or tensor name with its u64 length before it) sits. */
static size_t find_name(const Hostile *h, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 8; i + n <= h->len; i++) {
        uint64_t len;
        memcpy(&len, h->orig + i - 8, 8);
        if (len == n && memcmp(h->orig + i, name, n) == 0) return i;
    }
    CHECK(0, "%s not found in the fixture", name);
    return 0;
}

/* A copy of the valid file with a u32/u64 at pos replaced. */
static uint8_t *patched(const Hostile *h, size_t pos, uint64_t v, int width) {
    uint8_t *c = malloc(h->len);
    memcpy(c, h->orig, h->len);
    memcpy(c + pos, &v, (size_t)width);
    return c;
}

#define EXPECT_PATCH_FAIL(h, pos, v, width, ...)                 \
    do {                                                         \
        uint8_t *c_ = patched(h, pos, v, width);                 \
        EXPECT_FAIL(h, c_, (h)->len, __VA_ARGS__);               \
        free(c_);                                                \
    } while (0)

static void test_truncations(Hostile *h) {
    int wrong = 0, unnamed = 0;
    size_t step = quick() ? 7 : 1;
    for (size_t n = 0; n < h->len; n += (n < h->need - 8 ? step : 1)) {
        Err err;
        int rc = open_bytes(h, h->orig, n, &err);
        bool want_ok = n >= h->need; /* the tail padding after the last tensor is optional */
        if ((rc == 0) != want_ok && wrong++ < 5) printf("  truncated to %zu: rc %d %s\n", n, rc, err.msg);
        if (rc != 0 && !strstr(err.msg, h->path) && unnamed++ < 5) printf("  unnamed: %s\n", err.msg);
    }
    CHECK(wrong == 0, "%d truncation lengths misjudged", wrong);
    CHECK(unnamed == 0, "%d errors without the file name", unnamed);
}

static void test_header_mutations(Hostile *h) {
    EXPECT_PATCH_FAIL(h, 0, 0x58554747, 4, "GGUF");           /* "GGUX" */
    EXPECT_PATCH_FAIL(h, 4, 1, 4, "version 1");
    EXPECT_PATCH_FAIL(h, 4, 4, 4, "version 4");
    EXPECT_PATCH_FAIL(h, 4, 0x03000000, 4, "version", "big-endian");
    EXPECT_PATCH_FAIL(h, 8, 1ull << 60, 8, "tensor count");
    EXPECT_PATCH_FAIL(h, 16, 1ull << 60, 8, "kv count");
    EXPECT_PATCH_FAIL(h, 16, UINT64_MAX, 8, "kv count");
    EXPECT_PATCH_FAIL(h, 24, 1ull << 62, 8, "kv 0", "length");  /* first key's length */
    EXPECT_PATCH_FAIL(h, 24, 0, 8, "kv 0", "empty");
    Err err;
    CHECK(open_bytes(h, "GGUF", 4, &err) == -1 && strstr(err.msg, h->path), "4 bytes: %s", err.msg);
    GGUFFile f;
    CHECK(gguf_open(&f, "/nonexistent/x.gguf", &err) == -1 && strstr(err.msg, "/nonexistent/x.gguf"),
          "missing file: %s", err.msg);
    CHECK(gguf_open(&f, "/tmp", &err) == -1 && strstr(err.msg, "/tmp"), "directory: %s", err.msg);
}

static void test_kv_mutations(Hostile *h) {
    size_t p;
    p = find_name(h, "general.alignment");
    EXPECT_PATCH_FAIL(h, p + 21, 0, 4, "general.alignment", "power of two");
    EXPECT_PATCH_FAIL(h, p + 21, 3, 4, "general.alignment", "power of two");
    EXPECT_PATCH_FAIL(h, p + 17, GGUF_FLOAT32, 4, "general.alignment", "integer");
    p = find_name(h, "test.str");
    EXPECT_PATCH_FAIL(h, p + 12, 1ull << 62, 8, "key 'test.str'", "length");
    EXPECT_PATCH_FAIL(h, p + 8, 13, 4, "key 'test.str'", "value type 13");
    p = find_name(h, "test.arr_i32");
    EXPECT_PATCH_FAIL(h, p + 16, 99, 4, "key 'test.arr_i32'", "element type 99");
    EXPECT_PATCH_FAIL(h, p + 20, 1ull << 40, 8, "key 'test.arr_i32'", "cannot fit");
    EXPECT_PATCH_FAIL(h, p + 20, UINT64_MAX, 8, "key 'test.arr_i32'");
    p = find_name(h, "test.arr_str");
    EXPECT_PATCH_FAIL(h, p + 28, 1ull << 50, 8, "key 'test.arr_str'", "length");
    p = find_name(h, "test.bool_true");
    EXPECT_PATCH_FAIL(h, p + 18, 2, 1, "key 'test.bool_true'", "bool");
    p = find_name(h, "test.i16"); /* renaming it test.i32 makes a duplicate key */
    EXPECT_PATCH_FAIL(h, p + 6, 0x3233, 2, "key 'test.i32'", "duplicate key");
    EXPECT_PATCH_FAIL(h, p + 4, 0, 1, "kv", "NUL");
}

static void test_tensor_mutations(Hostile *h) {
    size_t p = find_name(h, "t.f32"); /* then n_dims u32, ne[0..1] u64, type u32, offset u64 */
    EXPECT_PATCH_FAIL(h, p + 5, 0, 4, "tensor 't.f32'", "n_dims 0");
    EXPECT_PATCH_FAIL(h, p + 5, 5, 4, "tensor 't.f32'", "n_dims 5");
    EXPECT_PATCH_FAIL(h, p + 9, 0, 8, "tensor 't.f32'", "dim 0 is 0");
    EXPECT_PATCH_FAIL(h, p + 17, 0, 8, "tensor 't.f32'", "dim 1 is 0");
    EXPECT_PATCH_FAIL(h, p + 9, 1ull << 62, 8, "tensor 't.f32'", "overflow");
    EXPECT_PATCH_FAIL(h, p + 9, 1ull << 40, 8, "tensor 't.f32'", "past the end");
    EXPECT_PATCH_FAIL(h, p + 25, 99, 4, "tensor 't.f32'", "type id 99");
    EXPECT_PATCH_FAIL(h, p + 25, 4, 4, "tensor 't.f32'", "type id 4");
    EXPECT_PATCH_FAIL(h, p + 25, 40, 4, "tensor 't.f32'", "type id 40 is not supported"); /* cllm's F8_E4M3, no ggml type */
    EXPECT_PATCH_FAIL(h, p + 29, 32, 8, "tensor 't.f32'", "offset 32", "alignment 64");
    EXPECT_PATCH_FAIL(h, p + 29, 1, 8, "tensor 't.f32'", "offset 1");
    EXPECT_PATCH_FAIL(h, p + 29, 4096, 8, "tensor 't.f32'", "past the end");
    EXPECT_PATCH_FAIL(h, p + 29, UINT64_MAX - 63, 8, "tensor 't.f32'", "past the end");
    p = find_name(h, "t.q8_0");
    EXPECT_PATCH_FAIL(h, p + 10, 48, 8, "tensor 't.q8_0'", "multiple", "32");
    p = find_name(h, "t.f16"); /* renaming it t.f32 makes a duplicate tensor */
    EXPECT_PATCH_FAIL(h, p + 3, 0x3233, 2, "tensor 't.f32'", "duplicate tensor");
    EXPECT_PATCH_FAIL(h, p - 8, 1ull << 61, 8, "tensor 1", "length");
    EXPECT_PATCH_FAIL(h, p - 8, 0, 8, "tensor 1", "empty");
    p = find_name(h, "t.f32_4d"); /* 4 dims: 2*3*1*2 */
    EXPECT_PATCH_FAIL(h, p + 8, 5, 4, "tensor 't.f32_4d'", "n_dims 5");
}

/* Arrays of arrays of ... `levels` deep (levels counts the arrays). */
static void nested_file(Buf *b, int levels) {
    b->n = 0;
    buf_header(b, 3, 0, 1);
    buf_str(b, "bomb");
    buf_u32(b, GGUF_ARRAY);
    for (int l = 1; l < levels; l++) {
        buf_u32(b, GGUF_ARRAY);
        buf_u64(b, 1);
    }
    buf_u32(b, GGUF_INT32);
    buf_u64(b, 0);
}

static void test_built_files(Hostile *h) {
    Buf b = {0};
    Err err;
    buf_header(&b, 3, 0, 0);
    CHECK(open_bytes(h, b.b, b.n, &err) == 0, "an empty GGUF opens: %s", err.msg);
    nested_file(&b, 8);
    CHECK(open_bytes(h, b.b, b.n, &err) == 0, "8 nested arrays are allowed: %s", err.msg);
    nested_file(&b, 9);
    EXPECT_FAIL(h, b.b, b.n, "key 'bomb'", "nested");
    nested_file(&b, 100000);
    EXPECT_FAIL(h, b.b, b.n, "key 'bomb'", "nested");
    /* many huge arrays of arrays, each claiming more than the file holds */
    b.n = 0;
    buf_header(&b, 3, 0, 1);
    buf_str(&b, "wide");
    buf_u32(&b, GGUF_ARRAY);
    buf_u32(&b, GGUF_ARRAY);
    buf_u64(&b, 1ull << 40);
    for (int i = 0; i < 64; i++) { buf_u32(&b, GGUF_ARRAY); buf_u64(&b, 0); }
    EXPECT_FAIL(h, b.b, b.n, "key 'wide'", "cannot fit");
    /* general.alignment of a string type */
    b.n = 0;
    buf_header(&b, 3, 0, 1);
    buf_str(&b, "general.alignment");
    buf_u32(&b, GGUF_STRING);
    buf_str(&b, "64");
    EXPECT_FAIL(h, b.b, b.n, "general.alignment");
    /* a tensor whose data would start beyond the end */
    b.n = 0;
    buf_header(&b, 3, 1, 0);
    buf_str(&b, "w");
    buf_u32(&b, 1);
    buf_u64(&b, 32);
    buf_u32(&b, DT_Q8_0);
    buf_u64(&b, 0);
    EXPECT_FAIL(h, b.b, b.n, "tensor 'w'", "past the end");
    uint8_t data[64] = {0};
    buf_put(&b, data, sizeof data);
    CHECK(open_bytes(h, b.b, b.n, &err) == 0, "the same with its data: %s", err.msg);
    free(b.b);
}

/* Random byte and field corruptions of the valid file (fixed seed): each must
 * open or fail with a message naming the file; ASan catches any stray read. */
static void test_random_corruptions(Hostile *h) {
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int iters = quick() ? 300 : 3000, opened = 0, unnamed = 0;
    uint8_t *c = malloc(h->len);
    for (int it = 0; it < iters; it++) {
        memcpy(c, h->orig, h->len);
        int edits = 1 + it % 4;
        for (int e = 0; e < edits; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(seed >> 33) % h->need;
            uint8_t v = (uint8_t)(seed >> 17);
            if (e == 0 && it % 3 == 0 && pos + 8 <= h->len) { /* a lying u64 */
                uint64_t big = (seed >> 5) | (1ull << (40 + it % 24));
                memcpy(c + pos, &big, 8);
            } else {
                c[pos] = it % 2 ? v : (uint8_t)(c[pos] ^ (1u << (v % 8)));
            }
        }
        Err err;
        int rc = open_bytes(h, c, h->len, &err);
        opened += rc == 0;
        if (rc != 0 && !strstr(err.msg, h->path) && unnamed++ < 5) printf("  unnamed: %s\n", err.msg);
    }
    free(c);
    CHECK(unnamed == 0, "%d errors without the file name", unnamed);
    printf("  %d corruptions, %d still opened (changed values or padding)\n", iters, opened);
}

static void test_hostile_files(void) {
    Hostile h = {.path = "/tmp/cllm_test_gguf_XXXXXX"};
    int fd = mkstemp(h.path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    char src[1024];
    snprintf(src, sizeof src, "%s/gguf/valid_v3.gguf", test_fixture_dir());
    h.orig = read_all(src, &h.len);
    Json *doc = load_json("valid.json");
    CHECK(h.orig != NULL && doc != NULL, "%s", src);
    if (h.orig && doc) {
        const JsonValue *v3 = json_at(json_get(json_root(doc), "files"), 0);
        const JsonValue *ts = json_get(v3, "tensors");
        h.need = 0;
        for (size_t i = 0; i < json_len(ts); i++) {
            const JsonValue *t = json_at(ts, i);
            uint64_t end = (uint64_t)(json_get_int(v3, "data_offset", 0) + json_get_int(t, "offset", 0) +
                                      json_get_int(t, "nbytes", 0));
            if (end > h.need) h.need = end;
        }
        CHECK(h.need > 0 && h.need <= h.len, "need %llu of %zu", (unsigned long long)h.need, h.len);
        test_truncations(&h);
        test_header_mutations(&h);
        test_kv_mutations(&h);
        test_tensor_mutations(&h);
        test_built_files(&h);
        test_random_corruptions(&h);
    }
    json_free(doc);
    free(h.orig);
    unlink(h.path);
}

/* Detection (formats/detect.h): the GGUF magic makes a GGUF file whatever
 * its name or version (gguf_open names a bad version); without it, a file
 * named .gguf is named as not a model. */
static void test_detect(void) {
    char src[1024], path[] = "/tmp/cllm_test_gguf_det_XXXXXX";
    snprintf(src, sizeof src, "%s/gguf/valid_v3.gguf", test_fixture_dir());
    ModelFileKind kind = (ModelFileKind)-1;
    Err err = {{0}};
    CHECK(model_file_detect(src, &kind, &err) == 0 && kind == MODEL_FILE_GGUF, "%s: kind %d: %s", src, (int)kind,
          err.msg);
    uint8_t head[16] = "GGUF\x07\0\0\0"; /* version 7 */
    kind = (ModelFileKind)-1;
    CHECK(model_file_detect_bytes("x.bin", head, sizeof head, sizeof head, &kind, &err) == 0 && kind == MODEL_FILE_GGUF,
          "GGUF magic, version 7: kind %d: %s", (int)kind, err.msg);
    memcpy(head, "GGML", 4); /* the format before GGUF */
    CHECK(model_file_detect_bytes("old.gguf", head, sizeof head, 1000, &kind, &err) == -1 &&
              strstr(err.msg, "old.gguf: not a model file") && strstr(err.msg, "no 'GGUF' magic") &&
              strstr(err.msg, "named .gguf"),
          "GGML file: %s", err.msg);
    CHECK(model_file_detect_bytes("short.gguf", (const uint8_t *)"GGU", 3, 3, &kind, &err) == -1 &&
              strstr(err.msg, "short.gguf: not a model file"),
          "3-byte file: %s", err.msg);
    /* the real file: a v3 file edited to version 7 is detected, then refused by the reader with its version */
    size_t n = 0;
    uint8_t *b = read_all(src, &n);
    int fd = mkstemp(path);
    CHECK(b && n > 8 && fd >= 0, "%s", src);
    if (b && n > 8 && fd >= 0) {
        close(fd);
        b[4] = 7;
        write_file(path, b, n);
        kind = (ModelFileKind)-1;
        CHECK(model_file_detect(path, &kind, &err) == 0 && kind == MODEL_FILE_GGUF, "%s: %s", path, err.msg);
        GGUFFile f;
        CHECK(gguf_open(&f, path, &err) == -1 && strstr(err.msg, "GGUF version 7 is not supported"), "%s", err.msg);
        unlink(path);
    }
    free(b);
}

int main(void) {
    RUN(test_valid_fixtures);
    RUN(test_getters);
    RUN(test_real_models);
    RUN(test_hostile_files);
    RUN(test_detect);
    TEST_EXIT();
}
