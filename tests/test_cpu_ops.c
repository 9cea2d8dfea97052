/* test_cpu_ops.c — the CPU backend ops (kernels/cpu/) against references
 * computed by tests/fixtures/make_op_fixtures.py with torch / transformers /
 * gguf-py in float64: RMSNorm, rope, the GLU activations, soft-cap, softmax,
 * the matmul on F32/F16/BF16/Q8_0/Q4_K weights, the embedding lookup, and
 * attention (computed densely by the script) through a paged cache whose
 * blocks are assigned at random. Also the thread pool.
 *
 * CLLM_BENCH=1 additionally prints matmul GFLOP/s and the cost of a
 * cpu_parallel_for call (figures only, nothing asserted on them).
 */
#include <stdint.h>
#include <time.h>

#include "kernels/cpu/cpu_ops.h"
#include "tests/test.h"

/* ------------------------------------------------------------ fixtures */

enum { FX_F32 = 0, FX_I32 = 1, FX_U8 = 2 };

typedef struct {
    char name[96];
    uint32_t kind;
    uint64_t n;
    void *data; /* an aligned copy of the array */
} FxArray;

typedef struct {
    char file[64];
    FxArray *a;
    int n;
} Fixture;

static void fx_free(Fixture *f) {
    for (int i = 0; i < f->n; i++) free(f->a[i].data);
    free(f->a);
    memset(f, 0, sizeof *f);
}

static bool fx_read(FILE *fp, void *dst, size_t n) { return fread(dst, 1, n, fp) == n; }

/* Reads tests/fixtures/ops/<file> (format in make_op_fixtures.py). */
static bool fx_load(Fixture *f, const char *file) {
    memset(f, 0, sizeof *f);
    snprintf(f->file, sizeof f->file, "%s", file);
    char path[512];
    snprintf(path, sizeof path, "%s/ops/%s", test_fixture_dir(), file);
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL, "%s missing: run tests/fixtures/make_op_fixtures.py", path);
    if (!fp) return false;
    char magic[8];
    uint32_t count = 0;
    bool ok = fx_read(fp, magic, 8) && !memcmp(magic, "CLLMOPS1", 8) && fx_read(fp, &count, 4) && count < 10000;
    f->a = ok ? calloc(count, sizeof *f->a) : NULL;
    for (uint32_t i = 0; ok && f->a && i < count; i++) {
        FxArray *a = &f->a[f->n];
        uint32_t len = 0;
        ok = fx_read(fp, &len, 4) && len < sizeof a->name && fx_read(fp, a->name, len) && fx_read(fp, &a->kind, 4) &&
             fx_read(fp, &a->n, 8) && a->kind <= FX_U8 && a->n < (1u << 24);
        size_t bytes = ok ? a->n * (a->kind == FX_U8 ? 1 : 4) : 0;
        a->data = ok ? malloc(bytes ? bytes : 1) : NULL;
        ok = ok && a->data && fx_read(fp, a->data, bytes);
        if (a->data) f->n++;
    }
    ok = ok && f->a && fgetc(fp) == EOF;
    fclose(fp);
    CHECK(ok, "%s: malformed fixture file", path);
    if (!ok) fx_free(f);
    return ok;
}

/* The array `name` of the given kind; n > 0 also requires that many elements.
 * NULL (and a failed check) otherwise. */
static void *fx_get(const Fixture *f, const char *name, uint32_t kind, uint64_t n) {
    for (int i = 0; i < f->n; i++) {
        if (strcmp(f->a[i].name, name)) continue;
        bool ok = f->a[i].kind == kind && (n == 0 || f->a[i].n == n);
        CHECK(ok, "%s: %s has kind %u and %llu elements, expected kind %u and %llu", f->file, name, f->a[i].kind,
              (unsigned long long)f->a[i].n, kind, (unsigned long long)n);
        return ok ? f->a[i].data : NULL;
    }
    CHECK(0, "%s: no array %s", f->file, name);
    return NULL;
}

static uint64_t fx_count(const Fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->a[i].name, name)) return f->a[i].n;
    return 0;
}

/* ------------------------------------------------------------ comparisons */

/* Every |got - want| <= rtol * |want| + atol; reports the worst element. */
static void check_close(const char *what, const float *got, const float *want, int64_t n, double rtol, double atol) {
    int64_t worst = -1;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = rtol * fabs(want[i]) + atol;
        if (!(d <= lim) && (worst < 0 || d - lim > worst_excess)) { worst = i; worst_excess = d - lim; }
    }
    CHECK(worst < 0, "%s: element %lld is %.9g, expected %.9g (rtol %g, atol %g)", what, (long long)worst,
          worst >= 0 ? got[worst] : 0.0, worst >= 0 ? want[worst] : 0.0, rtol, atol);
}

/* max |got - want| <= rtol * max |want| over one vector (an attention output
 * head, whose scale can be anything down to e^-40). */
static void check_vec_rel(const char *what, const float *got, const float *want, int n, double rtol) {
    double err = 0, ref = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        err = d > err || d != d ? d : err;
        ref = fmax(ref, fabs(want[i]));
    }
    CHECK(err <= rtol * ref && ref > 0, "%s: max error %.3g vs max |ref| %.3g (rtol %g)", what, err, ref, rtol);
}

static float *copy_floats(const float *src, int64_t n) {
    float *d = malloc((size_t)n * sizeof *d);
    if (d) memcpy(d, src, (size_t)n * sizeof *d);
    return d;
}

/* ------------------------------------------------------------ thread pool */

typedef struct {
    int *hits;
} CountJob;

static void count_range(void *ctx, int64_t b, int64_t e) {
    CountJob *j = ctx;
    for (int64_t i = b; i < e; i++) __atomic_add_fetch(&j->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_thread_pool(void) {
    Err err;
    int sizes[] = {1, 2, 3, 5};
    int64_t ns[] = {0, 1, 2, 3, 4, 7, 64, 1000};
    for (int s = 0; s < 4; s++) {
        ThreadPool *tp = thread_pool_create(sizes[s], &err);
        CHECK(tp != NULL, "thread_pool_create(%d): %s", sizes[s], err.msg);
        if (!tp) continue;
        CHECK(thread_pool_size(tp) == sizes[s], "size %d != %d", thread_pool_size(tp), sizes[s]);
        for (int k = 0; k < 8; k++) {
            int hits[1000] = {0};
            CountJob j = {hits};
            for (int rep = 0; rep < 3; rep++) cpu_parallel_for(tp, ns[k], count_range, &j);
            for (int64_t i = 0; i < ns[k]; i++) CHECK(hits[i] == 3, "pool %d, n %lld: index %lld ran %d times of 3",
                                                      sizes[s], (long long)ns[k], (long long)i, hits[i]);
            for (int64_t i = ns[k]; i < 1000; i++) CHECK(hits[i] == 0, "index %lld outside [0,n) ran", (long long)i);
        }
        /* Many back-to-back calls: no thread per call, no lost wake-up. */
        int hits[16] = {0};
        CountJob j = {hits};
        int reps = getenv("CLLM_QUICK") ? 500 : 5000;
        for (int r = 0; r < reps; r++) cpu_parallel_for(tp, 16, count_range, &j);
        for (int i = 0; i < 16; i++) CHECK(hits[i] == reps, "index %d ran %d times of %d", i, hits[i], reps);
        thread_pool_destroy(tp);
    }
    thread_pool_destroy(NULL);
    CHECK(thread_pool_size(NULL) == 1, "a NULL pool is the caller alone");
    int hits[5] = {0};
    CountJob j = {hits};
    cpu_parallel_for(NULL, 5, count_range, &j); /* NULL pool: inline */
    for (int i = 0; i < 5; i++) CHECK(hits[i] == 1, "NULL pool: index %d ran %d times", i, hits[i]);
    ThreadPool *tp = thread_pool_create(0, &err); /* one per core */
    CHECK(tp && thread_pool_size(tp) >= 1, "thread_pool_create(0)");
    thread_pool_destroy(tp);
}

/* ------------------------------------------------------------ norms */

static void test_rmsnorm(void) {
    Fixture f;
    if (!fx_load(&f, "norm.bin")) return;
    const int32_t *dims = fx_get(&f, "dims", FX_I32, 2);
    const float *eps = fx_get(&f, "eps", FX_F32, 1);
    if (!dims || !eps) { fx_free(&f); return; }
    int T = dims[0], C = dims[1];
    int64_t n = (int64_t)T * C;
    const float *x = fx_get(&f, "x", FX_F32, n), *delta = fx_get(&f, "delta", FX_F32, n), *w = fx_get(&f, "w", FX_F32, C);
    const float *o0 = fx_get(&f, "out_off0", FX_F32, n), *o1 = fx_get(&f, "out_off1", FX_F32, n);
    const float *sum = fx_get(&f, "sum", FX_F32, n), *an = fx_get(&f, "addnorm_off1", FX_F32, n);
    float *out = malloc(n * sizeof *out), *xx = copy_floats(x ? x : eps, x ? n : 1);
    if (x && delta && w && o0 && o1 && sum && an && out && xx) {
        cpu_rmsnorm(out, x, w, T, C, *eps, 0.0f);
        check_close("rmsnorm w_offset 0", out, o0, n, 1e-5, 1e-6);
        cpu_rmsnorm(out, x, w, T, C, *eps, 1.0f);
        check_close("rmsnorm w_offset 1", out, o1, n, 1e-5, 1e-6);
        cpu_rmsnorm(xx, xx, w, T, C, *eps, 1.0f); /* in place */
        check_close("rmsnorm in place", xx, o1, n, 1e-5, 1e-6);
        memcpy(xx, x, n * sizeof *xx);
        cpu_add_rmsnorm(xx, delta, out, w, T, C, *eps, 1.0f);
        check_close("add_rmsnorm residual", xx, sum, n, 0, 0); /* one fp32 add: exact */
        check_close("add_rmsnorm norm", out, an, n, 1e-5, 1e-6);
        memcpy(xx, x, n * sizeof *xx);
        cpu_add(xx, delta, n);
        check_close("add", xx, sum, n, 0, 0);
    }
    free(out);
    free(xx);
    fx_free(&f);
}

/* ------------------------------------------------------------ rope */

static void test_rope(void) {
    Fixture f;
    if (!fx_load(&f, "rope.bin")) return;
    const int32_t *dims = fx_get(&f, "dims", FX_I32, 3);
    if (!dims) { fx_free(&f); return; }
    int T = dims[0], H = dims[1], D = dims[2];
    int64_t n = (int64_t)T * H * D;
    const int32_t *pos = fx_get(&f, "pos", FX_I32, T);
    const float *x = fx_get(&f, "x", FX_F32, n);
    const char *cases[] = {"neox_full", "interleaved_full", "neox_partial", "interleaved_partial", "neox_yarn"};
    for (int c = 0; c < 5 && pos && x; c++) {
        char name[128];
        snprintf(name, sizeof name, "%s/cfg", cases[c]);
        const int32_t *cfg = fx_get(&f, name, FX_I32, 2);
        snprintf(name, sizeof name, "%s/mscale", cases[c]);
        const float *ms = fx_get(&f, name, FX_F32, 1);
        if (!cfg || !ms) continue;
        snprintf(name, sizeof name, "%s/inv_freq", cases[c]);
        const float *inv = fx_get(&f, name, FX_F32, cfg[1] / 2);
        snprintf(name, sizeof name, "%s/out", cases[c]);
        const float *want = fx_get(&f, name, FX_F32, n);
        float *got = copy_floats(x, n);
        if (inv && want && got) {
            cpu_rope(got, pos, T, H, D, cfg[1], inv, *ms, cfg[0] != 0);
            check_close(cases[c], got, want, n, 1e-5, 1e-6);
            for (int64_t r = 0; r < (int64_t)T * H; r++) /* channels past rot_dim: bit for bit */
                CHECK(!memcmp(got + r * D + cfg[1], x + r * D + cfg[1], (D - cfg[1]) * sizeof *x),
                      "%s: channels past rot_dim %d changed in head row %lld", cases[c], cfg[1], (long long)r);
        }
        free(got);
    }
    fx_free(&f);
}

/* ------------------------------------------------------------ activations */

static void test_activations(void) {
    Fixture f;
    if (!fx_load(&f, "act.bin")) return;
    int64_t n = (int64_t)fx_count(&f, "gate");
    const float *g = fx_get(&f, "gate", FX_F32, n), *u = fx_get(&f, "up", FX_F32, n);
    struct { const char *name; Activation act; float limit; } glu[] = {
        {"silu", ACT_SILU, 0}, {"gelu_tanh", ACT_GELU_TANH, 0},
        {"swiglu_oai_l7", ACT_SWIGLU_OAI, 7.0f}, {"swiglu_oai_nolimit", ACT_SWIGLU_OAI, 0},
    };
    float *out = malloc((n > 0 ? n : 1) * sizeof *out);
    for (int k = 0; k < 4 && g && u && out && n > 0; k++) {
        const float *want = fx_get(&f, glu[k].name, FX_F32, n);
        if (!want) continue;
        cpu_glu(out, g, u, n, glu[k].act, glu[k].limit);
        check_close(glu[k].name, out, want, n, 1e-5, 1e-6);
    }
    if (g && u && out && n > 0) { /* out may alias gate (the MoE path does that) */
        float *gg = copy_floats(g, n);
        const float *want = fx_get(&f, "silu", FX_F32, n);
        if (gg && want) {
            cpu_glu(gg, gg, u, n, ACT_SILU, 0);
            check_close("silu in place", gg, want, n, 1e-5, 1e-6);
        }
        free(gg);
    }
    const float *sx = fx_get(&f, "softcap_x", FX_F32, n);
    const char *caps[] = {"softcap_5", "softcap_30"};
    float capv[] = {5.0f, 30.0f};
    for (int k = 0; k < 2 && sx && out; k++) {
        const float *want = fx_get(&f, caps[k], FX_F32, n);
        if (!want) continue;
        memcpy(out, sx, n * sizeof *out);
        cpu_softcap(out, n, capv[k]);
        check_close(caps[k], out, want, n, 1e-5, 1e-6);
    }
    const int32_t *sd = fx_get(&f, "softmax_dims", FX_I32, 2);
    if (sd) {
        int64_t m = (int64_t)sd[0] * sd[1];
        const float *x = fx_get(&f, "softmax_x", FX_F32, m), *want = fx_get(&f, "softmax_out", FX_F32, m);
        float *y = x ? copy_floats(x, m) : NULL;
        if (y && want) {
            for (int r = 0; r < sd[0]; r++) cpu_softmax(y + (int64_t)r * sd[1], sd[1]);
            check_close("softmax", y, want, m, 1e-5, 1e-9);
        }
        free(y);
    }
    free(out);
    fx_free(&f);
}

/* ------------------------------------------------------------ matmul */

static void matmul_case(const Fixture *f, const char *name, ThreadPool *tp) {
    char key[128];
    snprintf(key, sizeof key, "%s/dims", name);
    const int32_t *dims = fx_get(f, key, FX_I32, 4);
    if (!dims) return;
    DType type = (DType)dims[0];
    int rows = dims[1], cols = dims[2], T = dims[3];
    uint64_t row_bytes = dtype_row_bytes(type, cols);
    snprintf(key, sizeof key, "%s/w", name);
    const void *w = fx_get(f, key, FX_U8, row_bytes * rows);
    const float *x, *bias, *y, *yb, *absdot;
    snprintf(key, sizeof key, "%s/x", name);
    x = fx_get(f, key, FX_F32, (uint64_t)T * cols);
    snprintf(key, sizeof key, "%s/bias", name);
    bias = fx_get(f, key, FX_F32, rows);
    snprintf(key, sizeof key, "%s/y", name);
    y = fx_get(f, key, FX_F32, (uint64_t)T * rows);
    snprintf(key, sizeof key, "%s/y_bias", name);
    yb = fx_get(f, key, FX_F32, (uint64_t)T * rows);
    snprintf(key, sizeof key, "%s/absdot", name);
    absdot = fx_get(f, key, FX_F32, (uint64_t)T * rows);
    CHECK(row_bytes > 0, "%s: dtype %d", name, (int)type);
    if (!w || !x || !bias || !y || !yb || !absdot || !row_bytes) return;

    CpuMatrix m = {w, type, rows, cols, row_bytes, NULL, 0};
    float *got = malloc((size_t)T * rows * sizeof *got), got1[64];
    if (!got || rows > 64) { free(got); CHECK(0, "%s: too many rows for the test", name); return; }
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *want = with_bias ? yb : y;
        memset(got, 0xff, (size_t)T * rows * sizeof *got); /* NaN: every output must be written */
        cpu_matmul(tp, got, x, &m, with_bias ? bias : NULL, T);
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)T * rows; i++) bad += !(fabs((double)got[i] - want[i]) <= 1e-5 * absdot[i]);
        CHECK(bad == 0, "%s T=%d%s: %d of %d outputs off by more than 1e-5 of sum |x||w|", name, T,
              with_bias ? " +bias" : "", bad, T * rows);
        /* T = 1 takes the one-row dot, T = 7 the four-row one for row 0: same bits. */
        cpu_matmul(NULL, got1, x, &m, with_bias ? bias : NULL, 1);
        CHECK(!memcmp(got1, got, rows * sizeof *got), "%s: T=1 result differs from row 0 of T=%d", name, T);
    }
    free(got);
}

static void test_matmul(void) {
    Fixture f;
    if (!fx_load(&f, "matmul.bin")) return;
    Err err;
    ThreadPool *tp = thread_pool_create(3, &err);
    CHECK(tp != NULL, "%s", err.msg);
    const char *cases[] = {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q4_K_long"};
    for (int c = 0; c < 6; c++) matmul_case(&f, cases[c], tp);
    matmul_case(&f, "Q4_K", NULL);
    /* A dtype cllm does not know is a caller bug: NaN outputs, no crash. */
    float w[64] = {0}, x[32] = {0}, y[2];
    CpuMatrix bad = {w, (DType)4, 2, 32, 128, NULL, 0};
    cpu_matmul(tp, y, x, &bad, NULL, 1);
    CHECK(isnan(y[0]) && isnan(y[1]), "unknown dtype: %g %g", y[0], y[1]);
    thread_pool_destroy(tp);
    fx_free(&f);
}

/* Embedding rows against gguf-py's dequantization; ids outside the table
 * give zeros. */
static void test_embed(void) {
    Fixture f;
    if (!fx_load(&f, "matmul.bin")) return;
    const char *cases[] = {"F16", "Q8_0", "Q4_K"};
    for (int c = 0; c < 3; c++) {
        char key[64];
        snprintf(key, sizeof key, "%s/dims", cases[c]);
        const int32_t *dims = fx_get(&f, key, FX_I32, 4);
        if (!dims) continue;
        int rows = dims[1], cols = dims[2];
        uint64_t rb = dtype_row_bytes((DType)dims[0], cols);
        snprintf(key, sizeof key, "%s/w", cases[c]);
        const void *w = fx_get(&f, key, FX_U8, rb * rows);
        snprintf(key, sizeof key, "%s/wdeq", cases[c]);
        const float *deq = fx_get(&f, key, FX_F32, (uint64_t)rows * cols);
        if (!w || !deq) continue;
        CpuMatrix m = {w, (DType)dims[0], rows, cols, rb, NULL, 0};
        int32_t ids[5] = {3, 0, rows - 1, -1, rows};
        float *out = malloc(5 * (size_t)cols * sizeof *out), *want = calloc(5 * (size_t)cols, sizeof *want);
        if (out && want) {
            for (int t = 0; t < 3; t++)
                for (int i = 0; i < cols; i++) want[(int64_t)t * cols + i] = deq[(int64_t)ids[t] * cols + i] * 2.0f;
            memset(out, 0xff, 5 * (size_t)cols * sizeof *out);
            cpu_embed(out, &m, ids, 5, 2.0f);
            check_close(cases[c], out, want, 5 * (int64_t)cols, 1e-6, 0);
        }
        free(out);
        free(want);
    }
    fx_free(&f);
}

/* ------------------------------------------------------------ attention */

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

typedef struct {
    int T, n_seqs, H, Hkv, Dk, Dv, window, has_sinks;
    float scale, cap;
    const float *sinks, *k, *v, *q, *out;
    const int32_t *pos, *seq, *seq_len;
} AttnCase;

static bool attn_case_load(const Fixture *f, const char *name, AttnCase *c) {
    char key[128];
#define GET(field, suffix, kind, n) \
    (snprintf(key, sizeof key, "%s/%s", name, suffix), c->field = fx_get(f, key, kind, n))
    const int32_t *dims;
    const float *fp;
    snprintf(key, sizeof key, "%s/dims", name);
    if (!(dims = fx_get(f, key, FX_I32, 8))) return false;
    snprintf(key, sizeof key, "%s/f", name);
    if (!(fp = fx_get(f, key, FX_F32, 2))) return false;
    *c = (AttnCase){.T = dims[0], .n_seqs = dims[1], .H = dims[2], .Hkv = dims[3], .Dk = dims[4], .Dv = dims[5],
                    .window = dims[6], .has_sinks = dims[7], .scale = fp[0], .cap = fp[1]};
    if (!GET(pos, "pos", FX_I32, c->T) || !GET(seq, "seq", FX_I32, c->T) || !GET(seq_len, "seq_len", FX_I32, c->n_seqs))
        return false;
    int64_t keys = 0;
    for (int s = 0; s < c->n_seqs; s++) keys += c->seq_len[s];
    bool ok = GET(k, "k", FX_F32, keys * c->Hkv * c->Dk) && GET(v, "v", FX_F32, keys * c->Hkv * c->Dv) &&
              GET(q, "q", FX_F32, (int64_t)c->T * c->H * c->Dk) && GET(out, "out", FX_F32, (int64_t)c->T * c->H * c->Dv);
    if (ok && c->has_sinks) ok = GET(sinks, "sinks", FX_F32, c->H);
#undef GET
    return ok;
}

/* ---- fp8 KV: the bound on attention's error from e4m3's rounding ----
 *
 * A cached value x with head-vector scale s comes back as x' with
 * |x' - x| <= e(x) = 2^-4 |x| at or above 2^-6 s, 2^-10 s below (half an
 * e4m3 step; + 2^-21 |x| for the fp32 roundings). So each score moves by at
 * most d_j = scale * sum_d |q_d| e(k_jd) (soft-cap is 1-Lipschitz; + the
 * fp32 dot product's own Dk 2^-23 scale sum |q_d k_jd|); with every score
 * (the sink's too, unmoved) within D = max_j d_j, each softmax weight moves
 * by at most a factor e^(2D), so for output channel c
 *   |o'_c - o_c| <= (e^(2D) - 1) max_j |v'_jc| + max_j e(v_jc),
 * + 1e-5 max_j |v_jc| for the fp32 arithmetic the exact check allows. */
static double fp8_err(double x, double s) {
    return (fabs(x) >= 0x1p-6 * s ? 0x1p-4 * fabs(x) : 0x1p-10 * s) + 0x1p-21 * fabs(x);
}

static double amax_of(const float *x, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Checks row i, head h of an fp8-cache output against the exact reference
 * with the bound above; returns the largest error / bound seen. */
static double attn_fp8_check(const char *what, const AttnCase *c, int i, int h, const float *got) {
    int s = c->seq[i], pos = c->pos[i], kvh = h / (c->H / c->Hkv);
    int first = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
    int64_t base = 0;
    for (int t = 0; t < s; t++) base += c->seq_len[t];
    const float *q = c->q + ((int64_t)i * c->H + h) * c->Dk, *want = c->out + ((int64_t)i * c->H + h) * c->Dv;
    double D = 0, worst = 0;
    for (int j = first; j <= pos; j++) {
        const float *k = c->k + ((base + j) * c->Hkv + kvh) * c->Dk;
        double sk = amax_of(k, c->Dk) / 448, d = 0, mag = 0;
        for (int e = 0; e < c->Dk; e++) d += fabs(q[e]) * fp8_err(k[e], sk), mag += fabs(q[e] * k[e]);
        D = fmax(D, c->scale * (d + c->Dk * 0x1p-23 * mag));
    }
    for (int ch = 0; ch < c->Dv; ch++) {
        double vmax = 0, verr = 0;
        for (int j = first; j <= pos; j++) {
            const float *v = c->v + ((base + j) * c->Hkv + kvh) * c->Dv;
            double sv = amax_of(v, c->Dv) / 448;
            vmax = fmax(vmax, fabs(v[ch]));
            verr = fmax(verr, fp8_err(v[ch], sv));
        }
        double bound = expm1(2 * D) * (vmax + verr) + verr + 1e-5 * vmax, err = fabs((double)got[ch] - want[ch]);
        CHECK(err <= bound, "%s channel %d: |%.9g - %.9g| = %.3g > bound %.3g (D %.3g)", what, ch, got[ch], want[ch],
              err, bound, D);
        if (bound > 0) worst = fmax(worst, err / bound);
    }
    return worst;
}

/* Writes every key of every sequence into layer 1 of a NaN-filled cache
 * (fp32, or fp8 with nan codes) whose blocks are handed out in a random
 * order, runs attention on the case's rows and compares each (row, head)
 * output with the dense reference: within 1e-5 (fp32), within the bound
 * above (fp8). */
static double attn_case_run(const char *name, const AttnCase *c, int block_size, ThreadPool *tp, uint64_t seed,
                            KVDtype dtype) {
    int max_blocks = 0, n_blocks = 7; /* spare blocks stay NaN */
    for (int s = 0; s < c->n_seqs; s++) {
        int nb = (c->seq_len[s] + block_size - 1) / block_size;
        n_blocks += nb;
        max_blocks = nb > max_blocks ? nb : max_blocks;
    }
    KVCacheHost kv;
    Err err;
    double worst = 0;
    CHECK(kv_cache_host_alloc(&kv, 2, c->Hkv, c->Dk, c->Dv, block_size, n_blocks, dtype, &err) == 0, "%s", err.msg);
    int32_t *ids = malloc(n_blocks * sizeof *ids), *tables = malloc((size_t)c->n_seqs * max_blocks * sizeof *tables);
    const int32_t **table_ptrs = malloc(c->n_seqs * sizeof *table_ptrs);
    int64_t *slots = malloc(256 * sizeof *slots);
    int32_t *kpos = malloc(256 * sizeof *kpos), *kseq = calloc(256, sizeof *kseq);
    int64_t *qslots = malloc(c->T * sizeof *qslots);
    float *out = malloc((size_t)c->T * c->H * c->Dv * sizeof *out), *out1 = malloc((size_t)c->T * c->H * c->Dv * sizeof *out);
    if ((!kv.k && !kv.k8) || !ids || !tables || !table_ptrs || !slots || !kpos || !kseq || !qslots || !out || !out1)
        goto done;
    for (int l = 0; l < 2; l++) {
        int64_t ne_k = (int64_t)n_blocks * block_size * c->Hkv * c->Dk, ne_v = (int64_t)n_blocks * block_size * c->Hkv * c->Dv;
        if (dtype == KV_DTYPE_FP8) {
            memset(kv.k8[l], 0x7f, ne_k); /* nan codes */
            memset(kv.v8[l], 0x7f, ne_v);
            continue;
        }
        for (int64_t i = 0; i < ne_k; i++) kv.k[l][i] = NAN;
        for (int64_t i = 0; i < ne_v; i++) kv.v[l][i] = NAN;
    }
    /* Random, non-contiguous block assignment: a shuffled list of all ids. */
    for (int i = 0; i < n_blocks; i++) ids[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    int next = 0;
    const float *k = c->k, *v = c->v;
    for (int s = 0; s < c->n_seqs; s++) {
        int32_t *tab = tables + (int64_t)s * max_blocks;
        table_ptrs[s] = tab;
        for (int b = 0; b * block_size < c->seq_len[s]; b++) tab[b] = ids[next++];
        int L = c->seq_len[s];
        CHECK(L <= 256, "%s: sequence too long for the test", name);
        for (int p = 0; p < L && L <= 256; p++) {
            kpos[p] = p;
            slots[p] = (int64_t)tab[p / block_size] * block_size + p % block_size;
        }
        AttnBatch wb = {L, kpos, kseq, slots, 1, &table_ptrs[s], block_size};
        if (L <= 256) cpu_kv_write(&kv, 1, &wb, k, v);
        k += (int64_t)L * c->Hkv * c->Dk;
        v += (int64_t)L * c->Hkv * c->Dv;
    }
    for (int i = 0; i < c->T; i++)
        qslots[i] = (int64_t)table_ptrs[c->seq[i]][c->pos[i] / block_size] * block_size + c->pos[i] % block_size;
    AttnBatch b = {c->T, c->pos, c->seq, qslots, c->n_seqs, table_ptrs, block_size};
    AttnParams p = {c->H, c->Hkv, c->Dk, c->Dv, c->scale, c->cap, c->window, c->has_sinks ? c->sinks : NULL};
    cpu_attention(tp, out, c->q, &kv, 1, &b, &p);
    for (int i = 0; i < c->T; i++)
        for (int h = 0; h < c->H; h++) {
            char what[160];
            snprintf(what, sizeof what, "%s (block size %d) row %d (seq %d, pos %d) head %d", name, block_size, i,
                     c->seq[i], c->pos[i], h);
            int64_t off = ((int64_t)i * c->H + h) * c->Dv;
            if (dtype == KV_DTYPE_FP8) worst = fmax(worst, attn_fp8_check(what, c, i, h, out + off));
            else check_vec_rel(what, out + off, c->out + off, c->Dv, 1e-5);
        }
    /* Same bits without the pool: the split over threads changes nothing. */
    cpu_attention(NULL, out1, c->q, &kv, 1, &b, &p);
    CHECK(!memcmp(out, out1, (size_t)c->T * c->H * c->Dv * sizeof *out), "%s: pool and inline results differ", name);
done:
    kv_cache_host_free(&kv);
    free(qslots);
    free(ids);
    free(tables);
    free(table_ptrs);
    free(slots);
    free(kpos);
    free(kseq);
    free(out);
    free(out1);
    return worst;
}

/* Every fixture case through attn_case_run with a kv cache, at block sizes
 * 4 and 16; the largest value it returned. */
static double attention_cases(KVDtype kv, uint64_t seed) {
    Fixture f;
    if (!fx_load(&f, "attention.bin")) return 0;
    Err err;
    ThreadPool *tp = thread_pool_create(3, &err);
    CHECK(tp != NULL, "%s", err.msg);
    const char *cases[] = {"gqa_causal", "dk16_dv8", "window1", "window_full", "window5",
                           "softcap5", "sinks", "mixed", "mixed_all"};
    double worst = 0;
    for (int k = 0; k < 9; k++) {
        AttnCase c;
        if (!attn_case_load(&f, cases[k], &c)) continue;
        for (int b = 4; b <= 16; b *= 4) worst = fmax(worst, attn_case_run(cases[k], &c, b, tp, seed + k * 31 + b, kv));
    }
    thread_pool_destroy(tp);
    fx_free(&f);
    return worst;
}

static void test_attention(void) { attention_cases(KV_DTYPE_BF16, 0x9E3779B97F4A7C15ULL); }

/* The same cases over an fp8 cache: every output channel within the bound
 * derived from e4m3's half-step (attn_fp8_check); the largest share of the
 * bound used is printed (a bound never approached would test nothing). */
static void test_attention_fp8(void) {
    double worst = attention_cases(KV_DTYPE_FP8, 77);
    printf("# fp8 KV attention: largest error %.2f of its bound\n", worst);
    CHECK(worst > 0.01, "the fp8 cache changed nothing (error %.3g of the bound): is it in use?", worst);
}

/* 4 rows x 2 heads of K (width 4) and V (width 3), every value distinct:
 * K = 100t + 10h + d + 1, V = -(the same) / v_div. */
static void kv_rows(float k[4][2][4], float v[4][2][3], float v_div) {
    for (int t = 0; t < 4; t++)
        for (int h = 0; h < 2; h++) {
            for (int d = 0; d < 4; d++) k[t][h][d] = 100 * t + 10 * h + d + 1;
            for (int d = 0; d < 3; d++) v[t][h][d] = -(100 * t + 10 * h + d + 1) / v_div;
        }
}

/* cpu_kv_write lands each row at its slot (and only there), in the right
 * layer, and skips slots outside the cache. */
static void test_kv_write(void) {
    KVCacheHost kv;
    Err err;
    int ok = kv_cache_host_alloc(&kv, 3, 2, 4, 3, 4, 5, KV_DTYPE_BF16, &err) == 0; /* 20 slots */
    CHECK(ok, "%s", err.msg);
    if (!ok) return;
    float k[4][2][4], v[4][2][3];
    kv_rows(k, v, 1.0f);
    int32_t pos[4] = {0, 1, 2, 3}, seq[4] = {0};
    int64_t slot[4] = {17, -1, 20, 2};
    AttnBatch b = {4, pos, seq, slot, 1, NULL, 4};
    cpu_kv_write(&kv, 2, &b, &k[0][0][0], &v[0][0][0]);
    for (int l = 0; l < 3; l++)
        for (int64_t s = 0; s < 20; s++)
            for (int h = 0; h < 2; h++) {
                int t = l != 2 ? -1 : s == 17 ? 0 : s == 2 ? 3 : -1;
                for (int d = 0; d < 4; d++)
                    CHECK(kv_k_at(&kv, l, s, h)[d] == (t < 0 ? 0.0f : k[t][h][d]), "K layer %d slot %lld head %d", l,
                          (long long)s, h);
                for (int d = 0; d < 3; d++)
                    CHECK(kv_v_at(&kv, l, s, h)[d] == (t < 0 ? 0.0f : v[t][h][d]), "V layer %d slot %lld head %d", l,
                          (long long)s, h);
            }
    kv_cache_host_free(&kv);
}

/* The same writes into an fp8 cache: each head vector of a written slot is
 * fp8_quantize_row of the row's head, the rest stays zero. */
static void test_kv_write_fp8(void) {
    KVCacheHost kv;
    Err err;
    int ok = kv_cache_host_alloc(&kv, 3, 2, 4, 3, 4, 5, KV_DTYPE_FP8, &err) == 0;
    CHECK(ok, "%s", err.msg);
    if (!ok) return;
    float k[4][2][4], v[4][2][3];
    kv_rows(k, v, 1000.0f);
    int32_t pos[4] = {0, 1, 2, 3}, seq[4] = {0};
    int64_t slot[4] = {17, -1, 20, 2};
    AttnBatch b = {4, pos, seq, slot, 1, NULL, 4};
    cpu_kv_write(&kv, 2, &b, &k[0][0][0], &v[0][0][0]);
    int bad = 0;
    for (int l = 0; l < 3; l++)
        for (int64_t s = 0; s < 20; s++)
            for (int h = 0; h < 2; h++) {
                int t = l != 2 ? -1 : s == 17 ? 0 : s == 2 ? 3 : -1;
                uint8_t qk[4] = {0}, qv[3] = {0};
                float sk = 0, sv = 0;
                if (t >= 0) fp8_quantize_row(k[t][h], 4, qk, &sk), fp8_quantize_row(v[t][h], 3, qv, &sv);
                int64_t at = s * 2 + h;
                bad += memcmp(kv.k8[l] + at * 4, qk, 4) || memcmp(kv.v8[l] + at * 3, qv, 3) || kv.ks[l][at] != sk ||
                       kv.vs[l][at] != sv;
            }
    CHECK(bad == 0, "%d head vectors differ", bad);
    kv_cache_host_free(&kv);
}

/* ------------------------------------------------------------ benchmark */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void noop_range(void *ctx, int64_t b, int64_t e) {}

/* y[T][576] = x[T][1536] @ W^T: a SmolLM2-135M down projection, F32 and Q4_1. */
static void bench(void) {
    int rows = 576, cols = 1536;
    uint64_t seed = 42;
    Err err;
    float *wf = malloc((size_t)rows * cols * sizeof *wf), *x = malloc(64 * (size_t)cols * sizeof *x);
    float *y = malloc(64 * (size_t)rows * sizeof *y);
    uint64_t rb = dtype_row_bytes(DT_Q4_1, cols);
    uint8_t *wq = malloc(rb * rows);
    if (!wf || !x || !y || !wq) return;
    for (int64_t i = 0; i < (int64_t)rows * cols; i++) wf[i] = (float)((rng_next(&seed) >> 40) / 16777216.0 - 0.5);
    for (int64_t i = 0; i < 64 * (int64_t)cols; i++) x[i] = (float)((rng_next(&seed) >> 40) / 16777216.0 - 0.5);
    for (uint64_t i = 0; i < rb * rows; i++) wq[i] = (uint8_t)rng_next(&seed);
    for (uint64_t blk = 0; blk < rb * rows; blk += 20) { /* Q4_1: fp16 d, fp16 m, 16 bytes of nibbles */
        uint16_t d = fp32_to_fp16(0.01f), m = fp32_to_fp16(-0.08f);
        memcpy(wq + blk, &d, 2);
        memcpy(wq + blk + 2, &m, 2);
    }
    CpuMatrix mats[2] = {{wf, DT_F32, rows, cols, (uint64_t)cols * 4, NULL, 0}, {wq, DT_Q4_1, rows, cols, rb, NULL, 0}};
    const char *names[2] = {"F32", "Q4_1"};
    for (int threads = 1; threads <= 2; threads++) {
        ThreadPool *tp = thread_pool_create(threads, &err);
        if (!tp) break;
        for (int mi = 0; mi < 2; mi++)
            for (int T = 1; T <= 64; T *= 8) {
                int reps = 0;
                double t0 = now_s(), el;
                do {
                    cpu_matmul(tp, y, x, &mats[mi], NULL, T);
                    reps++;
                } while ((el = now_s() - t0) < 0.5);
                printf("# bench matmul %dx%d %-4s T=%-2d %d thread(s): %6.2f GFLOP/s (%.3f ms per call)\n", rows, cols,
                       names[mi], T, threads, 2.0 * rows * cols * T * reps / el * 1e-9, el / reps * 1e3);
            }
        int calls = 0;
        double t0 = now_s(), el;
        do {
            for (int i = 0; i < 100; i++) cpu_parallel_for(tp, 64, noop_range, NULL);
            calls += 100;
        } while ((el = now_s() - t0) < 0.3);
        printf("# bench cpu_parallel_for, %d thread(s): %.2f us per call\n", threads, el / calls * 1e6);
        thread_pool_destroy(tp);
    }
    free(wf);
    free(x);
    free(y);
    free(wq);
}

int main(void) {
    RUN(test_thread_pool);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_activations);
    RUN(test_matmul);
    RUN(test_embed);
    RUN(test_kv_write);
    RUN(test_kv_write_fp8);
    RUN(test_attention);
    RUN(test_attention_fp8);
    if (getenv("CLLM_BENCH")) bench();
    TEST_EXIT();
}
