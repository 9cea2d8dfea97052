/* logits_file.c — write and read the --save-logits file (logits_file.h). */
#include "app/logits_file.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------- little-endian fields ---------- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }
static void put_f32(uint8_t *p, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(p, u);
}
static float get_f32(const uint8_t *p) {
    uint32_t u = get_u32(p);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static int write_bytes(FILE *f, const char *path, const void *p, size_t n, Err *err) {
    if (fwrite(p, 1, n, f) == n) return 0;
    return err_set(err, "%s: write failed (disk full?)", path);
}

/* ---------- write ---------- */

int logits_file_write_header(FILE *f, const char *path, const LogitsHeader *h, Err *err) {
    uint8_t b[LOGITS_FILE_HEADER_BYTES];
    memcpy(b, LOGITS_FILE_MAGIC, 8);
    put_u32(b + 8, LOGITS_FILE_VERSION);
    put_u32(b + 12, (uint32_t)h->vocab);
    put_u32(b + 16, (uint32_t)h->ctx);
    put_u32(b + 20, (uint32_t)h->stride);
    put_u64(b + 24, (uint64_t)h->n_tokens);
    put_u64(b + 32, (uint64_t)h->n_scored);
    memset(b + 40, 0, 8); /* reserved */
    if (write_bytes(f, path, b, sizeof b, err)) return -1;
    for (int64_t i = 0; i < h->n_tokens; i++) {
        uint8_t id[4];
        put_u32(id, (uint32_t)h->ids[i]);
        if (write_bytes(f, path, id, 4, err)) return -1;
    }
    return 0;
}

int logits_file_write_row(FILE *f, const char *path, const double *logp, int vocab, int32_t target, uint16_t *scratch,
                          Err *err) {
    double lo = 0;
    int32_t top1 = 0;
    for (int v = 0; v < vocab; v++) {
        if (logp[v] < lo) lo = logp[v];
        if (logp[v] > logp[top1]) top1 = v;
    }
    double scale = -lo / 65535.0;
    for (int v = 0; v < vocab; v++) {
        double q = scale > 0 ? (logp[v] - lo) / scale : 0;
        scratch[v] = (uint16_t)(q < 0 ? 0 : q > 65535 ? 65535 : lround(q));
    }
    uint8_t b[16];
    put_f32(b, (float)lo);
    put_f32(b + 4, (float)scale);
    put_f32(b + 8, (float)(logp[target] < 0 ? logp[target] : 0));
    put_u32(b + 12, (uint32_t)top1);
    if (write_bytes(f, path, b, 16, err)) return -1;
    for (int v = 0; v < vocab; v++) { /* little-endian in place */
        uint8_t *p = (uint8_t *)&scratch[v];
        uint16_t x = scratch[v];
        p[0] = (uint8_t)x;
        p[1] = (uint8_t)(x >> 8);
    }
    return write_bytes(f, path, scratch, 2 * (size_t)vocab, err);
}

/* ---------- read ---------- */

static int read_bytes(FILE *f, const char *path, void *p, size_t n, const char *what, Err *err) {
    if (fread(p, 1, n, f) == n) return 0;
    return err_set(err, "%s: truncated in %s (a cllm perplexity --save-logits file cut short?)", path, what);
}

static int check_sizes(const char *path, const LogitsHeader *h, int64_t file_bytes, Err *err) {
    if (h->vocab < 2 || h->vocab > LOGITS_FILE_MAX_VOCAB)
        return err_set(err, "%s: header field vocab %d: must be in [2, %d]", path, h->vocab, LOGITS_FILE_MAX_VOCAB);
    if (h->n_tokens < 2 || h->n_tokens > LOGITS_FILE_MAX_TOKENS)
        return err_set(err, "%s: header field n_tokens %lld: must be in [2, %d]", path, (long long)h->n_tokens,
                       LOGITS_FILE_MAX_TOKENS);
    if (h->ctx < 2 || h->ctx > LOGITS_FILE_MAX_TOKENS)
        return err_set(err, "%s: header field ctx %d: must be in [2, %d]", path, h->ctx, LOGITS_FILE_MAX_TOKENS);
    if (h->stride < 1 || h->stride > h->ctx)
        return err_set(err, "%s: header field stride %d: must be in [1, ctx %d]", path, h->stride, h->ctx);
    if (h->n_scored < 1 || h->n_scored >= h->n_tokens)
        return err_set(err, "%s: header field n_scored %lld: must be in [1, n_tokens %lld)", path,
                       (long long)h->n_scored, (long long)h->n_tokens);
    /* < 2^28 * (16 + 2^25) + 2^30: no overflow */
    int64_t want = LOGITS_FILE_HEADER_BYTES + 4 * h->n_tokens + h->n_scored * logits_row_bytes(h->vocab);
    if (file_bytes >= 0 && file_bytes != want)
        return err_set(err, "%s: %lld bytes, but its header (vocab %d, %lld tokens, %lld rows) says %lld%s", path,
                       (long long)file_bytes, h->vocab, (long long)h->n_tokens, (long long)h->n_scored,
                       (long long)want, file_bytes < want ? " (truncated?)" : "");
    return 0;
}

int logits_file_read_header(FILE *f, const char *path, int64_t file_bytes,
                            int64_t (*expect_scored)(int64_t, int, int), LogitsHeader *h, Err *err) {
    memset(h, 0, sizeof *h);
    uint8_t b[LOGITS_FILE_HEADER_BYTES];
    if (read_bytes(f, path, b, sizeof b, "the header", err)) return -1;
    if (memcmp(b, LOGITS_FILE_MAGIC, 8))
        return err_set(err, "%s: not a cllm logits file (magic is not \"%s\"; write one with cllm perplexity "
                       "--save-logits)", path, LOGITS_FILE_MAGIC);
    uint32_t version = get_u32(b + 8);
    if (version != LOGITS_FILE_VERSION)
        return err_set(err, "%s: header field version %u: this cllm reads version %d", path, version,
                       LOGITS_FILE_VERSION);
    uint32_t vocab = get_u32(b + 12), ctx = get_u32(b + 16), stride = get_u32(b + 20);
    uint64_t n_tokens = get_u64(b + 24), n_scored = get_u64(b + 32);
    /* clamp before narrowing so a huge field is reported as out of range */
    h->vocab = vocab > LOGITS_FILE_MAX_VOCAB ? -1 : (int)vocab;
    h->ctx = ctx > LOGITS_FILE_MAX_TOKENS ? -1 : (int)ctx;
    h->stride = stride > LOGITS_FILE_MAX_TOKENS ? -1 : (int)stride;
    h->n_tokens = n_tokens > LOGITS_FILE_MAX_TOKENS ? -1 : (int64_t)n_tokens;
    h->n_scored = n_scored > LOGITS_FILE_MAX_TOKENS ? -1 : (int64_t)n_scored;
    if (check_sizes(path, h, file_bytes, err)) return -1;
    if (expect_scored && expect_scored(h->n_tokens, h->ctx, h->stride) != h->n_scored)
        return err_set(err, "%s: header field n_scored %lld: windows of ctx %d, stride %d over %lld tokens score %lld",
                       path, (long long)h->n_scored, h->ctx, h->stride, (long long)h->n_tokens,
                       (long long)expect_scored(h->n_tokens, h->ctx, h->stride));
    if (!(h->ids = malloc((size_t)h->n_tokens * sizeof *h->ids))) return err_set(err, "%s: out of memory", path);
    for (int64_t i = 0; i < h->n_tokens; i++) {
        uint8_t id[4];
        if (read_bytes(f, path, id, 4, "the token ids", err)) goto fail;
        h->ids[i] = (int32_t)get_u32(id);
        if (h->ids[i] < 0 || h->ids[i] >= h->vocab) {
            err_set(err, "%s: token id %d at position %lld: outside the vocabulary of %d", path, h->ids[i],
                    (long long)i, h->vocab);
            goto fail;
        }
    }
    return 0;
fail:
    logits_header_free(h);
    return -1;
}

int logits_file_read_row(FILE *f, const char *path, int64_t index, int vocab, LogitsRow *r, Err *err) {
    uint8_t b[16];
    char what[64];
    snprintf(what, sizeof what, "row %lld", (long long)index);
    if (read_bytes(f, path, b, 16, what, err) || read_bytes(f, path, r->q, 2 * (size_t)vocab, what, err)) return -1;
    r->lo = get_f32(b);
    r->scale = get_f32(b + 4);
    r->target_logp = get_f32(b + 8);
    r->top1 = (int32_t)get_u32(b + 12);
    for (int v = 0; v < vocab; v++) { /* little-endian in place */
        const uint8_t *p = (const uint8_t *)&r->q[v];
        r->q[v] = (uint16_t)(p[0] | p[1] << 8);
    }
    /* a log-probability is <= 0; lo is the row's least, its top near 0 */
    if (!isfinite(r->lo) || r->lo > 0 || r->lo < -1e6)
        return err_set(err, "%s: row %lld: field lo %g: must be a log-probability in [-1e6, 0]", path,
                       (long long)index, r->lo);
    if (!isfinite(r->scale) || r->scale < 0 || fabs(r->lo + 65535.0 * r->scale) > 1e-3 * (1 - r->lo))
        return err_set(err, "%s: row %lld: field scale %g: must be -lo / 65535 (lo %g)", path, (long long)index,
                       r->scale, r->lo);
    if (!isfinite(r->target_logp) || r->target_logp > 0)
        return err_set(err, "%s: row %lld: field target_logp %g: must be a finite log-probability <= 0", path,
                       (long long)index, r->target_logp);
    if (r->top1 < 0 || r->top1 >= vocab)
        return err_set(err, "%s: row %lld: field top1 %d: outside the vocabulary of %d", path, (long long)index,
                       r->top1, vocab);
    return 0;
}

void logits_row_logp(const LogitsRow *r, int vocab, double *logp) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < vocab; v++) {
        logp[v] = r->lo + (double)r->scale * r->q[v];
        if (logp[v] > m) m = logp[v];
    }
    for (int v = 0; v < vocab; v++) s += exp(logp[v] - m);
    double lse = m + log(s);
    for (int v = 0; v < vocab; v++) logp[v] -= lse;
}

void logits_header_free(LogitsHeader *h) {
    free(h->ids);
    h->ids = NULL;
}
