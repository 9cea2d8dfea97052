/* safetensors_write.c — see safetensors_write.h. */
#include "formats/safetensors_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

const char *safetensors_dtype_name(DType t) {
    switch (t) {
    case DT_F32: return "F32";
    case DT_F16: return "F16";
    case DT_BF16: return "BF16";
    case DT_F8_E4M3: return "F8_E4M3";
    default: return NULL;
    }
}

static uint64_t out_nbytes(const SafetensorsOutTensor *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n * (uint64_t)dtype_info((uint32_t)t->type)->block_bytes;
}

/* The header: {"name": {"dtype": .., "shape": [outermost first], "data_offsets": [b, e]}, ...}. */
static int build_header(JsonBuf *h, const SafetensorsOutTensor *t, uint64_t n_t, const char *path, Err *err) {
    uint64_t off = 0;
    int rc = jsonbuf_printf(h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (uint64_t i = 0; rc == 0 && i < n_t; i++) {
        const char *dt = safetensors_dtype_name(t[i].type);
        if (!dt || t[i].n_dims < 0 || t[i].n_dims > TENSOR_MAX_DIMS)
            return err_set(err, "%s: tensor '%s': cannot be written to safetensors (type %d, %d dims)", path,
                           t[i].name, (int)t[i].type, t[i].n_dims);
        rc = jsonbuf_printf(h, ",");
        if (rc == 0) rc = jsonbuf_put_string(h, t[i].name, strlen(t[i].name));
        if (rc == 0) rc = jsonbuf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        for (int d = t[i].n_dims - 1; rc == 0 && d >= 0; d--)
            rc = jsonbuf_printf(h, "%s%llu", d == t[i].n_dims - 1 ? "" : ",", (unsigned long long)t[i].ne[d]);
        uint64_t nb = out_nbytes(&t[i]);
        if (rc == 0)
            rc = jsonbuf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + nb));
        off += nb;
    }
    if (rc == 0) rc = jsonbuf_printf(h, "}");
    while (rc == 0 && h->len % 8) rc = jsonbuf_printf(h, " ");
    return rc ? err_set(err, "%s: out of memory", path) : 0;
}

int safetensors_write(const char *path, const SafetensorsOutTensor *t, uint64_t n_t, SafetensorsFillFn fill,
                      void *ctx, Err *err) {
    JsonBuf h = {0};
    if (build_header(&h, t, n_t, path, err)) { jsonbuf_free(&h); return -1; }
    FILE *f = fopen(path, "wb");
    if (!f) { jsonbuf_free(&h); return err_set(err, "%s: cannot create: %s", path, strerror(errno)); }
    uint8_t len[8];
    for (int b = 0; b < 8; b++) len[b] = (uint8_t)((uint64_t)h.len >> (8 * b));
    int rc = fwrite(len, 1, 8, f) == 8 && fwrite(h.data, 1, h.len, f) == h.len ? 0 : -1;
    if (rc) err_set(err, "%s: write failed: %s", path, strerror(errno));
    jsonbuf_free(&h);
    for (uint64_t i = 0; rc == 0 && i < n_t; i++) {
        uint64_t nb = out_nbytes(&t[i]);
        void *buf = malloc(nb ? nb : 1);
        if (!buf) rc = err_set(err, "%s: out of memory for tensor '%s'", path, t[i].name);
        else if (fill(ctx, i, buf, nb, err)) rc = -1;
        else if (fwrite(buf, 1, nb, f) != nb) rc = err_set(err, "%s: write failed: %s", path, strerror(errno));
        free(buf);
    }
    if (fclose(f) != 0 && rc == 0) rc = err_set(err, "%s: write failed: %s", path, strerror(errno));
    if (rc) remove(path);
    return rc;
}
