/* dummy.c — random weights of any shape for --dummy-weights; see dummy.h.
 *
 * A block type is filled in two passes: random bytes everywhere (the codes),
 * then each block's scale fields are overwritten with values that make the
 * block valid and give the dequantized values the standard deviation
 * DUMMY_STD. The random bits a scale field held before it is overwritten
 * pick that block's sub-block scales and signs, so no second generator is
 * needed. For uniform codes over lo..hi the scales follow from
 *   rms(lo..hi) = sqrt(((hi-lo+1)^2 - 1)/12 + ((lo+hi)/2)^2)
 * (sd: the same without the mean term, for types whose min cancels it).
 *
 * The random values come from a counter (a hash of each value's index), so
 * a buffer is filled by a thread pool (base/thread_pool.h), in pieces of
 * whole blocks (values and then fixes, a cache-sized piece at a time), and
 * holds the same bytes for any number of threads. */
#include "model/dummy.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/quantize.h"
#include "base/thread_pool.h"

static const DType SUPPORTED[] = {DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1,
                                  DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_F8_E4M3};
#define N_SUPPORTED (sizeof SUPPORTED / sizeof SUPPORTED[0])

bool dummy_type_supported(DType t) {
    for (size_t i = 0; i < N_SUPPORTED; i++)
        if (SUPPORTED[i] == t) return true;
    return false;
}

int dummy_type_parse(const char *name, DType *t, Err *err) {
    if (name && !strcasecmp(name, "fp8")) { *t = DT_F8_E4M3; return 0; } /* --weights fp8's spelling */
    for (size_t i = 0; name && i < N_SUPPORTED; i++)
        if (!strcasecmp(name, dtype_info(SUPPORTED[i])->name)) { *t = SUPPORTED[i]; return 0; }
    return err_set(err, "--dummy-weights=%s: not a type cllm makes dummy weights in (one of %s)", name ? name : "",
                   DUMMY_TYPE_NAMES);
}

DType dummy_tensor_type(DType t, int64_t rows, int64_t cols) {
    if (rows <= 1 || !dummy_type_supported(t)) return DT_BF16;
    /* rows of partial blocks cannot be stored in t: such a matrix stays bf16 */
    return cols % dtype_info(t)->block_elems ? DT_BF16 : t;
}

DType dummy_head_type(DType t) {
    if (t == DT_F8_E4M3) return DT_BF16; /* FP8 checkpoints keep lm_head in bf16 */
    return t == DT_BF16 || t == DT_Q8_0 ? t : DT_Q6_K;
}

float dummy_fp8_scale(void) {
    double sum = 0;
    int n = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) { /* the two NaN codes: never stored (fix_f8_e4m3) */
            double v = e4m3_to_fp32((uint8_t)c);
            sum += v * v;
            n++;
        }
    return (float)(DUMMY_STD / sqrt(sum / n));
}

/* ---- random sources ----
 *
 * Counter-based: the 32-bit value of index i (an element of bf16, a 4-byte
 * word of a block type) is a hash of i alone, so any range of a buffer is
 * filled on its own and the threads of dummy_fill_threads give the same
 * bytes however the buffer is split. The hash is Wellons' lowbias32 (a
 * bijection of 32 bits) of the low 32 bits of i plus a key made from its
 * high 32 bits: 32-bit multiplies, so the loops vectorize under x86-64-v2
 * (splitmix64 cut into two values does not, and was 2-3x slower). */

static inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352du;
    x ^= x >> 15, x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* the key of indices [k << 32, (k + 1) << 32) */
static uint32_t hash_key(uint64_t i, uint32_t seed) { return hash32((uint32_t)(i >> 32) ^ seed); }

#define SEED_BF16 0x9e3779b9u
#define SEED_BYTES 0x2545f491u

#define LANES 64 /* values an inner loop */

/* the bf16 value of counter c (fill_bf16) */
static inline uint16_t bf16_value(uint32_t c, float k) {
    float f = (float)((int32_t)hash32(c) | 1) * k;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static inline void put_word(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* bf16 values d[i0..i1) uniform in [-a, a], a = 0.0346 (std 0.02, a Llama
 * init): a signed 32-bit hash made odd (symmetric about 0), to fp32 (24
 * bits kept), scaled, truncated to bf16 (symmetric too: the mean is 0). */
static void fill_bf16(uint16_t *d, uint64_t i0, uint64_t i1) {
    const float k = 0.0346f / 2147483648.0f;
    while (i0 < i1) {
        uint64_t end = (i0 | 0xffffffffull) + 1; /* one key a run */
        if (end > i1) end = i1;
        uint32_t key = hash_key(i0, SEED_BF16) + (uint32_t)i0;
        uint16_t *o = d + i0;
        size_t n = (size_t)(end - i0), j = 0;
        for (; j + LANES <= n; j += LANES) /* a fixed count: gcc -O2 vectorizes it */
            for (size_t l = 0; l < LANES; l++) o[j + l] = bf16_value(key + (uint32_t)(j + l), k);
        for (; j < n; j++) o[j] = bf16_value(key + (uint32_t)j, k);
        i0 = end;
    }
}

/* the 4-byte words w0..w1 of p, whole */
static void fill_words(uint8_t *p, uint64_t w0, uint64_t w1) {
    while (w0 < w1) {
        uint64_t end = (w0 | 0xffffffffull) + 1;
        if (end > w1) end = w1;
        uint32_t key = hash_key(w0, SEED_BYTES) + (uint32_t)w0;
        uint8_t *o = p + 4 * w0;
        size_t n = (size_t)(end - w0), j = 0;
        for (; j + LANES <= n; j += LANES)
            for (size_t l = 0; l < LANES; l++) put_word(o + 4 * (j + l), hash32(key + (uint32_t)(j + l)));
        for (; j < n; j++) put_word(o + 4 * j, hash32(key + (uint32_t)j));
        w0 = end;
    }
}

/* bytes [from, to) of p, inside the one word w (fill_words' value of it) */
static void fill_word_part(uint8_t *p, uint64_t w, uint64_t from, uint64_t to) {
    uint32_t v = hash32(hash_key(w, SEED_BYTES) + (uint32_t)w);
    uint8_t b[4];
    memcpy(b, &v, 4);
    memcpy(p + from, b + (from - 4 * w), (size_t)(to - from));
}

/* bytes [b0, b1) of p random: the words they overlap, cut to the range */
static void fill_bytes(uint8_t *p, uint64_t b0, uint64_t b1) {
    uint64_t a = (b0 + 3) / 4 * 4, b = b1 / 4 * 4; /* the whole words: [a, b) */
    if (a > b) { fill_word_part(p, b0 / 4, b0, b1); return; }
    if (b0 < a) fill_word_part(p, b0 / 4, b0, a);
    fill_words(p, a / 4, b / 4);
    if (b < b1) fill_word_part(p, b / 4, b, b1);
}

/* ---- scales that make a block of random codes valid ---- */

static double uniform_sd(int lo, int hi) {
    double n = hi - lo + 1;
    return sqrt((n * n - 1) / 12);
}

static double uniform_rms(int lo, int hi) {
    double mean = (lo + hi) / 2.0;
    return sqrt(uniform_sd(lo, hi) * uniform_sd(lo, hi) + mean * mean);
}

/* writes v as fp16 and returns the value stored (what a reader decodes) */
static float put_fp16(uint8_t p[2], double v) {
    uint16_t h = fp32_to_fp16((float)v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
    return fp16_to_fp32(h);
}

/* What the fix of a block of type t writes, worked out once a fill: fp16
 * scales (little-endian bytes) and, for Q4_K / Q5_K, the 6-bit min of each
 * sub-block scale. */
typedef struct {
    DType t;
    uint64_t bb;               /* bytes a block (2 for bf16: one value, no fix) */
    uint8_t d[2], d_neg[2], m[2];
    int mn[16];                /* Q4_K / Q5_K: the min of sub-block scale 16 + i */
} Fix;

/* Q8_0: d, int8 codes -128..127 (mean -0.5: 0.7% of their rms, left as is).
 * Q4_0 / Q5_0: d * (q - 8), q - 8 in -8..7 (Q5_0: q - 16 in -16..15) leans
 * negative by half a step; a random sign of d (as ggml's own d = absmax / -8
 * or / -16 has) makes the mean 0.
 * Q4_1 / Q5_1: d * q + m, q in 0..15 (0..31); m = -7.5 d (-15.5 d) centres it.
 * Q4_K / Q5_K: d * sc_k * q - dmin * m_k, q in 0..2^bits-1, sub-block scales
 * sc_k random in 16..31 (an fp16 d stays a normal number), dmin = 2^(bits-1) d
 * so that the 6-bit m_k = round(sc_k * d * qmax/2 / dmin) (at most 31)
 * centres each sub-block to within dmin / 2 (at most an 18th of its sd).
 * Q6_K: d * sc_j * (q - 32), q - 32 in -32..31; int8 sub-block scales of
 * random sign (as ggml's are: the mean is 0) and size 8..15 (d normal).
 * F8_E4M3: a code a byte, uniform over the 254 finite ones (0x7f and 0xff
 * are NaN in e4m3fn); the row scale is dummy_fp8_scale().
 * false for a type dummy_type_supported refuses. */
static bool fix_setup(Fix *f, DType t) {
    memset(f, 0, sizeof *f);
    f->t = t;
    if (!dummy_type_supported(t)) return false;
    f->bb = (uint64_t)dtype_info(t)->block_bytes;
    switch (t) {
    case DT_Q8_0: put_fp16(f->d, DUMMY_STD / uniform_rms(-128, 127)); break;
    case DT_Q4_0:
    case DT_Q5_0: {
        int half = t == DT_Q4_0 ? 8 : 16;
        double d = DUMMY_STD / uniform_rms(-half, half - 1);
        put_fp16(f->d, d);
        put_fp16(f->d_neg, -d);
        break;
    }
    case DT_Q4_1:
    case DT_Q5_1: {
        int qmax = t == DT_Q4_1 ? 15 : 31;
        put_fp16(f->m, -0.5 * qmax * put_fp16(f->d, DUMMY_STD / uniform_sd(0, qmax)));
        break;
    }
    case DT_Q4_K:
    case DT_Q5_K: {
        int bits = t == DT_Q4_K ? 4 : 5, qmax = (1 << bits) - 1;
        float d = put_fp16(f->d, DUMMY_STD / (uniform_rms(16, 31) * uniform_sd(0, qmax)));
        float dmin = put_fp16(f->m, (double)d * (1 << (bits - 1)));
        for (int i = 0; i < 16; i++) f->mn[i] = (int)lrint((16 + i) * (double)d * qmax / 2 / dmin);
        break;
    }
    case DT_Q6_K: put_fp16(f->d, DUMMY_STD / (uniform_rms(8, 15) * uniform_rms(-32, 31))); break;
    default: break; /* bf16, F8_E4M3: no scale in the data */
    }
    return true;
}

/* n blocks at p, random bytes so far, made valid: the random bits a scale
 * field held pick that block's signs and sub-block scales */
static void fix_blocks(const Fix *f, uint8_t *p, uint64_t n) {
    uint64_t bb = f->bb;
    switch (f->t) {
    case DT_Q8_0:
        for (uint64_t i = 0; i < n; i++) memcpy(p + i * bb, f->d, 2);
        break;
    case DT_Q4_0:
    case DT_Q5_0:
        for (uint64_t i = 0; i < n; i++) memcpy(p + i * bb, p[i * bb] & 1 ? f->d_neg : f->d, 2);
        break;
    case DT_Q4_1:
    case DT_Q5_1:
        for (uint64_t i = 0; i < n; i++) memcpy(p + i * bb, f->d, 2), memcpy(p + i * bb + 2, f->m, 2);
        break;
    case DT_Q4_K:
    case DT_Q5_K:
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *b = p + i * bb;
            int sc[8], mn[8];
            for (int k = 0; k < 8; k++) sc[k] = 16 + (b[4 + k] & 15), mn[k] = f->mn[b[4 + k] & 15];
            memcpy(b, f->d, 2);
            memcpy(b + 2, f->m, 2);
            quantize_pack_k_scales(sc, mn, b + 4);
        }
        break;
    case DT_Q6_K:
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *b = p + i * bb;
            for (int j = 0; j < 16; j++) {
                uint8_t r = b[192 + j];
                int s = 8 + (r & 7);
                b[192 + j] = (uint8_t)(int8_t)(r & 0x80 ? -s : s);
            }
            memcpy(b + 208, f->d, 2);
        }
        break;
    case DT_F8_E4M3: {
        uint64_t i = 0;
        for (; i + LANES <= n; i += LANES) /* a fixed count: vectorized */
            for (uint64_t l = 0; l < LANES; l++) p[i + l] ^= (uint8_t)((p[i + l] & 0x7f) == 0x7f);
        for (; i < n; i++) p[i] ^= (uint8_t)((p[i] & 0x7f) == 0x7f);
        break;
    }
    default: break;
    }
}

/* ---- the fill, split over threads ---- */

#define FILL_BYTES_A_THREAD (2ull << 20) /* at least: small buffers stay on the caller's thread */
#define FILL_PIECE 65536                 /* about: filled and fixed while in cache */

typedef struct {
    const Fix *f;
    uint8_t *buf;
    uint64_t bytes, piece; /* piece: whole blocks; the last piece also the bytes after the last block */
} FillJob;

/* pieces [begin, end) of the job: random values, then each whole block's fix */
static void fill_pieces(void *ctx, int64_t begin, int64_t end) {
    const FillJob *j = ctx;
    for (int64_t k = begin; k < end; k++) {
        uint64_t p = (uint64_t)k * j->piece, e = j->bytes - p < j->piece ? j->bytes : p + j->piece;
        if (j->f->t == DT_BF16) {
            fill_bf16((uint16_t *)j->buf, p / 2, e / 2);
        } else {
            fill_bytes(j->buf, p, e);
            fix_blocks(j->f, j->buf + p, (e - p) / j->f->bb);
        }
    }
}

void dummy_fill_threads(DType t, void *buf, uint64_t bytes, int n_threads) {
    Fix f;
    if (!fix_setup(&f, t)) return; /* a caller bug: dummy_type_supported said no */
    FillJob j = {&f, buf, bytes, FILL_PIECE / f.bb * f.bb};
    int64_t pieces = (int64_t)((bytes + j.piece - 1) / j.piece);
    if (n_threads <= 0 && bytes < 2 * FILL_BYTES_A_THREAD) n_threads = 1;
    /* no pool (out of memory or threads): the caller fills it all, the same bytes */
    Err err = {{0}};
    ThreadPool *tp = n_threads == 1 ? NULL : thread_pool_create(n_threads, &err);
    cpu_parallel_for(tp, pieces, fill_pieces, &j);
    if (tp) thread_pool_destroy(tp);
}

void dummy_fill(DType t, void *buf, uint64_t bytes) { dummy_fill_threads(t, buf, bytes, 0); }
