/* test_safetensors.c — the safetensors reader (model/safetensors.c).
 *
 * Good files: the fixtures of tests/fixtures/make_safetensors_fixtures.py
 * (written by the safetensors package; expected names, shapes, dtypes,
 * offsets and element values from torch and Python's json) read back as a
 * single file, as a folder, and as a 2-shard checkpoint through its index.
 * Bad files: made in memory from a valid one (every truncation, header
 * length fields, malformed headers, wrong field types, offsets, dtypes,
 * dims, names, shards) and written to a temporary folder; each must fail
 * with an error naming the file and the tensor or field. Detection
 * (formats/detect.h): what is a safetensors file or folder, and what is not
 * (text, empty, PyTorch zip or pickle, ONNX, a folder without config.json)
 * named as such.
 */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/json.h"
#include "formats/detect.h"
#include "formats/safetensors.h"
#include "tests/test.h"

static char tmp_dir[] = "/tmp/cllm-st-XXXXXX";

static char *fixture(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/safetensors/%s", test_fixture_dir(), rel);
    return p;
}

static char *tmp_path(const char *name) {
    static char buf[8][512]; /* a few live at once in one call's arguments */
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp_dir, name);
    return p;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    if (n) fwrite(b, 1, n, f);
    fclose(f);
}

/* A safetensors file: u64 header length (as given), header text, data_len
 * bytes of data. */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, size_t data_len) {
    size_t h = strlen(header), n = 8 + h + data_len;
    uint8_t *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (uint8_t)(i * 7 + 1);
    write_all(path, b, n);
    free(b);
}

static void write_st(const char *path, const char *header, size_t data_len) {
    write_st_raw(path, strlen(header), header, data_len);
}

/* Opening path must fail, leave st closed, and give a message containing
 * every piece given (the first one is usually the file that is wrong). */
#define expect_fail(path, ...) expect_fail_(__LINE__, path, (const char *[]){__VA_ARGS__, NULL})
static void expect_fail_(int line, const char *path, const char **pieces) {
    Safetensors st;
    Err err = {{0}};
    int rc = safetensors_open(&st, path, &err);
    CHECK(rc == -1, "line %d: %s opened", line, path);
    if (rc == 0) { safetensors_close(&st); return; }
    CHECK(st.tensors == NULL && st.shards == NULL && st.priv == NULL && st.dir == NULL,
          "line %d: failed open leaves the struct closed", line);
    for (const char **p = pieces; *p; p++)
        CHECK(strstr(err.msg, *p) != NULL, "line %d: error '%s' does not contain '%s'", line, err.msg, *p);
}

/* ---------- good files ---------- */

/* Checks every tensor the sidecar lists for file `rel` against st. */
static void check_file_tensors(const Safetensors *st, const JsonValue *exp, const char *rel, int want_shard) {
    const JsonValue *ts = json_get(exp, "tensors");
    int64_t data_start = json_get_int(exp, "data_start", -1);
    CHECK(json_len(ts) > 0 && data_start > 8, "%s: sidecar entry", rel);
    for (size_t i = 0; i < json_len(ts); i++) {
        const JsonValue *e = json_at(ts, i);
        const char *name = json_get_str(e, "name", "?");
        const TensorInfo *t = safetensors_find(st, name);
        CHECK(t != NULL, "%s: tensor %s not found", rel, name);
        if (!t) continue;
        int shard = st->tensor_shard[t - st->tensors];
        CHECK(want_shard < 0 || shard == want_shard, "%s: %s in shard %d", rel, name, shard);
        CHECK(strstr(st->shards[shard].path, rel) != NULL, "%s: %s in %s", rel, name, st->shards[shard].path);
        CHECK(!strcmp(t->name, name), "name %s", t->name);
        const JsonValue *shape = json_get(e, "shape");
        size_t nd = json_len(shape);
        CHECK(t->n_dims == (nd ? (int)nd : 1), "%s: n_dims %d for %zu-dim shape", name, t->n_dims, nd);
        for (size_t d = 0; d < TENSOR_MAX_DIMS; d++) {
            uint64_t want = d < nd ? (uint64_t)json_at(shape, nd - 1 - d)->u.number.i : 1;
            CHECK(t->ne[d] == want, "%s: ne[%zu] = %llu, want %llu", name, d, (unsigned long long)t->ne[d],
                  (unsigned long long)want);
        }
        const char *dt = json_get_str(e, "dtype", "?");
        DType want_t = !strcmp(dt, "F32") ? DT_F32 : !strcmp(dt, "F16") ? DT_F16 : DT_BF16;
        CHECK(t->type == want_t, "%s: type %d for %s", name, t->type, dt);
        CHECK(t->offset == (uint64_t)json_get_int(e, "offset", -1) && t->nbytes == (uint64_t)json_get_int(e, "nbytes", -1),
              "%s: offset %llu nbytes %llu", name, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        CHECK(t->nbytes == tensor_nelems(t) * (t->type == DT_F32 ? 4 : 2), "%s: nbytes vs ne", name);
        CHECK((const uint8_t *)t->data == st->shards[shard].map + data_start + t->offset, "%s: data pointer", name);
        /* Values through the dtype converter, bit-exact (these conversions are exact). */
        uint64_t n = tensor_nelems(t);
        float *vals = malloc((n ? n : 1) * sizeof *vals);
        if (n) dequantize_row(t->type, t->data, vals, (int64_t)n);
        const JsonValue *vs = json_get(e, "values");
        CHECK(json_len(vs) >= (n < 4 ? n : 4), "%s: only %zu values listed", name, json_len(vs));
        for (size_t k = 0; k < json_len(vs); k++) {
            uint64_t idx = (uint64_t)json_at(json_at(vs, k), 0)->u.number.i;
            float want = (float)json_at(json_at(vs, k), 1)->u.number.num;
            CHECK(idx < n && memcmp(&vals[idx], &want, 4) == 0, "%s[%llu] = %.9g, want %.9g", name,
                  (unsigned long long)idx, idx < n ? vals[idx] : NAN, want);
        }
        free(vals);
    }
}

static Json *load_expected(void) {
    Err err = {{0}};
    Json *doc = json_parse_file(fixture("expected.json"), &err);
    CHECK(doc != NULL, "%s", err.msg);
    return doc;
}

static void test_single_file(void) {
    Json *exp = load_expected();
    if (!exp) return;
    const JsonValue *e = json_get(json_root(exp), "single.safetensors");
    Safetensors st;
    Err err = {{0}};
    int rc = safetensors_open(&st, fixture("single.safetensors"), &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(st.n_shards == 1 && st.n_tensors == json_len(json_get(e, "tensors")), "%d shards, %llu tensors",
              st.n_shards, (unsigned long long)st.n_tensors);
        const char *want_dir = fixture("");
        CHECK(strlen(st.dir) + 1 == strlen(want_dir) && !strncmp(st.dir, want_dir, strlen(st.dir)), "dir %s", st.dir);
        check_file_tensors(&st, e, "single.safetensors", 0);
        CHECK(safetensors_find(&st, "model.norm") == NULL && safetensors_find(&st, "") == NULL &&
                  safetensors_find(&st, "__metadata__") == NULL && safetensors_find(&st, "zzz") == NULL,
              "absent names");
        safetensors_close(&st);
        CHECK(st.tensors == NULL && st.shards == NULL && st.n_tensors == 0 && st.priv == NULL, "close zeroes");
    }
    json_free(exp);
}

/* A folder holding model.safetensors (a copy of the single file). */
static void test_folder(void) {
    Json *exp = load_expected();
    if (!exp) return;
    size_t n;
    uint8_t *b = read_all(fixture("single.safetensors"), &n);
    CHECK(b != NULL, "read fixture");
    mkdir(tmp_path("folder"), 0755);
    write_all(tmp_path("folder/model.safetensors"), b, n);
    free(b);
    Safetensors st;
    Err err = {{0}};
    int rc = safetensors_open(&st, tmp_path("folder"), &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
        CHECK(!strcmp(st.dir, tmp_path("folder")), "dir %s", st.dir);
        check_file_tensors(&st, json_get(json_root(exp), "single.safetensors"), "model.safetensors", 0);
        safetensors_close(&st);
    }
    unlink(tmp_path("folder/model.safetensors"));
    expect_fail(tmp_path("folder"), tmp_path("folder"), "no model.safetensors or model.safetensors.index.json");
    rmdir(tmp_path("folder"));
    expect_fail(tmp_path("nonexistent.safetensors"), tmp_path("nonexistent.safetensors"), "cannot open");
    json_free(exp);
}

static void test_sharded(void) {
    Json *exp = load_expected();
    if (!exp) return;
    const char *paths[] = {fixture("sharded"), fixture("sharded/model.safetensors.index.json")};
    for (int k = 0; k < 2; k++) {
        Safetensors st;
        Err err = {{0}};
        int rc = safetensors_open(&st, paths[k], &err);
        CHECK(rc == 0, "%s: %s", paths[k], err.msg);
        if (rc) continue;
        CHECK(st.n_shards == 2 && st.n_tensors == 6, "%d shards, %llu tensors", st.n_shards, (unsigned long long)st.n_tensors);
        /* Shards open in the order weight_map first names them (sorted keys:
         * lm_head.weight, in shard 2, comes first). */
        CHECK(st.n_shards == 2 && strstr(st.shards[0].path, "model-00002-of-00002") &&
                  strstr(st.shards[1].path, "model-00001-of-00002"),
              "shard order");
        check_file_tensors(&st, json_get(json_root(exp), "sharded/model-00001-of-00002.safetensors"),
                           "model-00001-of-00002.safetensors", -1);
        check_file_tensors(&st, json_get(json_root(exp), "sharded/model-00002-of-00002.safetensors"),
                           "model-00002-of-00002.safetensors", -1);
        safetensors_close(&st);
    }
    json_free(exp);
}

/* Valid corner cases: a scalar, zero-sized tensors, overlapping ranges
 * (allowed by design, see safetensors.c), unused data bytes, metadata, an
 * empty header. */
static void test_valid_corners(void) {
    const char *p = tmp_path("corner.safetensors");
    write_st(p, "{\"__metadata__\": {\"format\": \"pt\", \"x\": \"\"}, \"s\": {\"dtype\": \"F32\", \"shape\": [],"
                " \"data_offsets\": [0, 4]}, \"z\": {\"dtype\": \"BF16\", \"shape\": [3, 0], \"data_offsets\": [8, 8]},"
                " \"o\": {\"dtype\": \"F16\", \"shape\": [2, 2], \"data_offsets\": [2, 10]}}   ",
             16);
    Safetensors st;
    Err err = {{0}};
    int rc = safetensors_open(&st, p, &err);
    CHECK(rc == 0, "%s", err.msg);
    if (rc == 0) {
        const TensorInfo *s = safetensors_find(&st, "s"), *z = safetensors_find(&st, "z"), *o = safetensors_find(&st, "o");
        CHECK(st.n_tensors == 3 && s && z && o, "3 tensors");
        CHECK(s && s->n_dims == 1 && tensor_nelems(s) == 1 && s->nbytes == 4, "scalar");
        CHECK(z && z->n_dims == 2 && z->ne[0] == 0 && z->ne[1] == 3 && z->nbytes == 0, "zero-sized");
        CHECK(o && o->ne[0] == 2 && o->ne[1] == 2 && o->offset == 2 && o->type == DT_F16, "overlapping");
        safetensors_close(&st);
    }
    write_st(p, "{}", 0);
    rc = safetensors_open(&st, p, &err);
    CHECK(rc == 0 && st.n_tensors == 0 && safetensors_find(&st, "a") == NULL, "empty header: %s", err.msg);
    if (rc == 0) safetensors_close(&st);
}

/* ---------- bad files ---------- */

static void test_truncations(void) {
    size_t n;
    uint8_t *b = read_all(fixture("single.safetensors"), &n);
    CHECK(b && n > 100, "read fixture");
    if (!b) return;
    const char *p = tmp_path("trunc.safetensors");
    int opened = 0, unnamed = 0;
    size_t step = getenv("CLLM_QUICK") ? 3 : 1;
    for (size_t len = 0; len < n; len += step) {
        write_all(p, b, len);
        Safetensors st;
        Err err = {{0}};
        if (safetensors_open(&st, p, &err) == 0) { opened++; safetensors_close(&st); }
        else if (strstr(err.msg, p) != err.msg) unnamed++;
    }
    CHECK(opened == 0, "%d truncated files opened", opened);
    CHECK(unnamed == 0, "%d errors did not start with the file name", unnamed);
    /* Truncated by one byte: the tensor at the end of the data is named. */
    write_all(p, b, n - 1);
    expect_fail(p, p, "tensor '", "data_offsets", "lie outside");
    free(b);
}

static void test_header_length(void) {
    const char *p = tmp_path("hlen.safetensors");
    const char *h = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    uint64_t lens[] = {UINT64_MAX, (uint64_t)1 << 63, ((uint64_t)100 << 20) + 1, strlen(h) + 5};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        write_st_raw(p, lens[i], h, 4); /* the file has strlen(h) + 4 bytes after the length field */
        expect_fail(p, p, "header length", "exceeds the file");
    }
    write_st_raw(p, strlen(h) + 1, h, 4); /* takes in the first data byte, 0x01 */
    expect_fail(p, p, "offset 61", "unexpected text after the JSON value");
    write_st_raw(p, 0, h, 4);
    expect_fail(p, p, "offset 0", "unexpected end of input");
    write_st_raw(p, 3, "abc", 0);
    expect_fail(p, p, "unexpected character 'a'");
    write_all(p, "\x10\0\0\0\0\0\0", 7);
    expect_fail(p, p, "file too short");
    write_all(p, "", 0);
    expect_fail(p, p, "file too short");
    /* A header length that cuts the JSON short. */
    write_st_raw(p, strlen(h) - 1, h, 4);
    expect_fail(p, p, "expected ',' or '}' in object");
}

typedef struct { const char *header; size_t data; const char *want[3]; } BadHeader;

static const BadHeader bad_headers[] = {
    {"{\"a\": ", 0, {"offset 6", "unexpected end of input"}},
    {"[1, 2]", 0, {"header is not a JSON object"}},
    {"{\"w\": 1}", 0, {"tensor 'w'", "entry is not an object"}},
    {"{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "'dtype' missing"}},
    {"{\"w\": {\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "'dtype'"}},
    {"{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "'shape' missing"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": \"1\", \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "'shape'"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "shape[0]"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1.5], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "shape[1]"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "shape[0]"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2199023255553], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "shape[0]"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "shape[0]"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1099511627776, 1099511627776], \"data_offsets\": [0, 4]}}", 4,
     {"tensor 'w'", "shape overflows"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, {"tensor 'w'", "'data_offsets' missing"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8, {"tensor 'w'", "'data_offsets'"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"0\": 4}}}", 8, {"tensor 'w'", "'data_offsets'"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", 4, {"tensor 'w'", "data_offsets must be"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, {"tensor 'w'", "data_offsets must be"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0.0, 4]}}", 4, {"tensor 'w'", "data_offsets must be"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8, {"tensor 'w'", "[8, 4] lie outside"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 7, {"tensor 'w'", "lie outside the 7 data bytes"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 18446744073709551615]}}", 7,
     {"tensor 'w'", "data_offsets must be"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8, {"tensor 'w'", "span 8 bytes", "1 elements of F32"}},
    {"{\"w\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", 24, {"tensor 'w'", "span 24 bytes", "6 elements of F16 = 12"}},
    {"{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 3]}}", 4, {"tensor 'w'", "4 elements of F8_E4M3 = 4"}},
    {"{\"w\": {\"dtype\": \"F8_E5M2\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "dtype F8_E5M2 is not supported (FP8 weights must be F8_E4M3)"}},
    {"{\"w\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8, {"tensor 'w'", "unsupported dtype 'I64'"}},
    {"{\"w\": {\"dtype\": \"BOOL\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, {"tensor 'w'", "unsupported dtype 'BOOL'"}},
    {"{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1, {"tensor 'w'", "unsupported dtype 'U8'"}},
    {"{\"w\": {\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "unsupported dtype 'f32'"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", 4, {"tensor 'w'", "5 dimensions"}},
    {"{\"__metadata__\": [\"pt\"]}", 0, {"'__metadata__' must be an object"}},
    {"{\"__metadata__\": {\"format\": 1}}", 0, {"'__metadata__' member 'format' is not a string"}},
    {"{\"a\\u0000b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, {"tensor name 'a...'", "NUL"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"w\": {\"dtype\": \"F32\", \"shape\": [1],"
     " \"data_offsets\": [0, 4]}}", 4, {"tensor 'w' appears twice in the header"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} x", 4, {"unexpected text after"}},
    {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], }}", 4, {"expected a string key"}},
};

static void test_bad_headers(void) {
    const char *p = tmp_path("bad.safetensors");
    for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
        const BadHeader *b = &bad_headers[i];
        write_st(p, b->header, b->data);
        Safetensors st;
        Err err = {{0}};
        int rc = safetensors_open(&st, p, &err);
        CHECK(rc == -1, "case %zu opened", i);
        if (rc == 0) { safetensors_close(&st); continue; }
        CHECK(strstr(err.msg, p) == err.msg, "case %zu: '%s' does not start with the file", i, err.msg);
        for (int k = 0; k < 3 && b->want[k]; k++)
            CHECK(strstr(err.msg, b->want[k]) != NULL, "case %zu: '%s' does not say '%s'", i, err.msg, b->want[k]);
    }
}

/* ---------- bad sharded checkpoints ---------- */

static const char *T4 = "{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}";

static void write_shard(const char *name, const char *t1, const char *t2) {
    char h[512];
    snprintf(h, sizeof h, "{\"%s\": %s, \"%s\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", t1, T4, t2);
    write_st(tmp_path(name), h, 8);
}

static void write_index(const char *body) {
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"metadata\": {\"total_size\": 16}, \"weight_map\": %s}", body);
    write_all(tmp_path("ck/model.safetensors.index.json"), buf, strlen(buf));
}

static void test_bad_sharded(void) {
    mkdir(tmp_path("ck"), 0755);
    char index[512]; /* tmp_path's buffers are reused */
    snprintf(index, sizeof index, "%s", tmp_path("ck/model.safetensors.index.json"));
    write_shard("ck/s1.safetensors", "a", "b");
    write_shard("ck/s2.safetensors", "c", "d");
    /* The good case first, so the failures below are the index's doing. */
    write_index("{\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\", \"d\": \"s2.safetensors\"}");
    Safetensors st;
    Err err = {{0}};
    int rc = safetensors_open(&st, tmp_path("ck"), &err);
    CHECK(rc == 0 && st.n_shards == 2 && st.n_tensors == 4, "good index: %s", err.msg);
    if (rc == 0) {
        const TensorInfo *d = safetensors_find(&st, "d");
        CHECK(d && st.tensor_shard[d - st.tensors] == 1 && d->offset == 4, "d in s2");
        safetensors_close(&st);
    }
    /* A shard the index names is missing. */
    write_index("{\"a\": \"s1.safetensors\", \"c\": \"s9.safetensors\"}");
    expect_fail(tmp_path("ck"), index, tmp_path("ck/s9.safetensors"), "missing", "tensor 'c'");
    /* A tensor the index puts in s1 is not there. */
    write_index("{\"a\": \"s1.safetensors\", \"x\": \"s1.safetensors\"}");
    expect_fail(tmp_path("ck"), index, "tensor 'x'", "s1.safetensors");
    /* ... or is in the other shard. */
    write_index("{\"a\": \"s1.safetensors\", \"c\": \"s1.safetensors\", \"d\": \"s2.safetensors\"}");
    expect_fail(index, index, "tensor 'c'", "s1.safetensors");
    /* The same name in two shards. */
    write_shard("ck/s2.safetensors", "c", "a");
    write_index("{\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}");
    expect_fail(tmp_path("ck"), "tensor 'a' appears twice", "s1.safetensors", "s2.safetensors");
    /* A bad shard: its own error, naming the shard and tensor. */
    write_st(tmp_path("ck/s2.safetensors"), "{\"c\": {\"dtype\": \"F8_E5M2\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1);
    expect_fail(tmp_path("ck"), tmp_path("ck/s2.safetensors"), "tensor 'c'", "not supported");
    /* Malformed indexes. */
    const char *bad_maps[][2] = {
        {"[\"s1.safetensors\"]", "'weight_map' missing or not an object"},
        {"{\"a\": 1}", "weight_map['a'] must be a file name"},
        {"{\"a\": \"../ck/s1.safetensors\"}", "weight_map['a'] must be a file name"},
        {"{\"a\": \"\"}", "weight_map['a'] must be a file name"},
        {"{\"a\": \"..\"}", "weight_map['a'] must be a file name"},
        {"{\"a\": \"s1\\u0000x\"}", "weight_map['a'] must be a file name"},
    };
    for (size_t i = 0; i < sizeof bad_maps / sizeof *bad_maps; i++) {
        write_index(bad_maps[i][0]);
        expect_fail(tmp_path("ck"), index, bad_maps[i][1]);
    }
    write_all(index, "{\"weight_map\": {", 16);
    expect_fail(tmp_path("ck"), index, "offset 16", "expected a string key");
    write_all(index, "{\"metadata\": {}}", 16);
    expect_fail(tmp_path("ck"), index, "'weight_map' missing");
    /* A shard that is a folder. */
    mkdir(tmp_path("ck/dir.safetensors"), 0755);
    write_index("{\"a\": \"dir.safetensors\"}");
    expect_fail(tmp_path("ck"), tmp_path("ck/dir.safetensors"), "not a regular file");
    rmdir(tmp_path("ck/dir.safetensors"));
    unlink(index);
    unlink(tmp_path("ck/s1.safetensors"));
    unlink(tmp_path("ck/s2.safetensors"));
    rmdir(tmp_path("ck"));
}

/* path must be detected as `want`. */
static void expect_kind(const char *path, ModelFileKind want) {
    ModelFileKind kind = (ModelFileKind)-1;
    Err err = {{0}};
    int rc = model_file_detect(path, &kind, &err);
    CHECK(rc == 0 && kind == want, "%s: kind %d (want %d), rc %d: %s", path, (int)kind, (int)want, rc, err.msg);
}

/* path must not be detected as a model; the message names it and holds every piece. */
#define expect_not_model(path, ...) expect_not_model_(__LINE__, path, (const char *[]){__VA_ARGS__, NULL})
static void expect_not_model_(int line, const char *path, const char **pieces) {
    ModelFileKind kind;
    Err err = {{0}};
    CHECK(model_file_detect(path, &kind, &err) == -1, "line %d: %s detected as a model", line, path);
    CHECK(strstr(err.msg, path) != NULL, "line %d: '%s' does not name %s", line, err.msg, path);
    for (const char **p = pieces; *p; p++)
        CHECK(strstr(err.msg, *p) != NULL, "line %d: '%s' lacks '%s'", line, err.msg, *p);
}

static void test_detect(void) {
    expect_kind(fixture("single.safetensors"), MODEL_FILE_SAFETENSORS);
    const char *p = tmp_path("det.safetensors");
    /* a header length past the end is still safetensors (a truncated one: the reader says so) */
    write_st_raw(p, 1000, "{\"a\": 1}", 0);
    expect_kind(p, MODEL_FILE_SAFETENSORS);
    const char *reads = "cllm reads .gguf files and Hugging Face folders";
    const char *txt = tmp_path("notes.txt");
    write_all(txt, "These are my notes about the model.\n", 36);
    expect_not_model(txt, "not a model file", "no 'GGUF' magic", "no JSON header", reads);
    const char *junk = tmp_path("junk.gguf");
    write_all(junk, "junk", 4);
    expect_not_model(junk, "not a model file", "named .gguf", reads);
    write_all(p, "{\"a\": 1}", 8); /* JSON, but no length field before it */
    expect_not_model(p, "not a model file", "named .safetensors");
    const char *empty = tmp_path("empty.gguf");
    write_all(empty, "", 0);
    expect_not_model(empty, "an empty file", reads);
    const char *pt = tmp_path("model.pt");
    write_all(pt, "PK\x03\x04\x14\0\0\0\x08\0", 10);
    expect_not_model(pt, "PyTorch", "convert it to safetensors or GGUF");
    const char *bin = tmp_path("pytorch_model.bin");
    write_all(bin, "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8", 12);
    expect_not_model(bin, "a PyTorch checkpoint (a pickle, protocol 2)", "convert it to safetensors or GGUF");
    const char *onnx = tmp_path("model.onnx");
    write_all(onnx, "\x08\x07\x12\x07pytorch", 11);
    expect_not_model(onnx, "an ONNX model", "convert it to safetensors or GGUF");
    const char *idx = tmp_path("model.safetensors.index.json");
    write_all(idx, " {\"weight_map\": {}}", 19);
    expect_kind(idx, MODEL_FILE_ST_INDEX);
    const char *dir = tmp_path("det_dir");
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    expect_not_model(dir, "a folder without config.json", reads);
    const char *cfg = tmp_path("det_dir/config.json");
    write_all(cfg, "{}", 2);
    expect_kind(dir, MODEL_FILE_HF_FOLDER);
    expect_not_model(tmp_path("nope.gguf"), "no such file or folder");
    /* the files (p, txt, junk: tmp_path's buffers, overwritten by now) go with tmp_dir in main */
}

int main(void) {
    if (!mkdtemp(tmp_dir)) { printf("not ok - mkdtemp\n"); return 1; }
    RUN(test_single_file);
    RUN(test_folder);
    RUN(test_sharded);
    RUN(test_valid_corners);
    RUN(test_truncations);
    RUN(test_header_length);
    RUN(test_bad_headers);
    RUN(test_bad_sharded);
    RUN(test_detect);
    test_remove_tree(tmp_dir); /* and every file the tests left in it */
    TEST_EXIT();
}
