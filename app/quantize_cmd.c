/* quantize_cmd.c — `cllm quantize`; see quantize_cmd.h.
 *
 * Which tensors: every matrix (2+ dims, more than one row) whose rows are
 * whole blocks of the asked type; a K type on rows that are not whole
 * 256-blocks falls back as llama.cpp's does (Q4_K to Q5_0, Q5_K to Q5_1,
 * Q6_K to Q8_0: 32-value blocks of at least its bits, so a file of ours
 * holds the types a published one does, all kept in blocks on the GPU;
 * rows not of whole 32-blocks keep their type). Vectors, MoE routers
 * (ffn_gate_inp: small, and routing is sensitive to them) and anything else
 * keep their type and bytes. A quantized input is dequantized and quantized
 * again. general.file_type is set to llama.cpp's file-type id. */
#include "app/quantize_cmd.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/quantize.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"

int quantize_parse_type(const char *name) {
    static const DType types[] = {DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K,
                                  DT_F16, DT_BF16, DT_F32};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(name, dtype_info(types[i])->name)) return (int)types[i];
    return -1;
}

int quantize_parse_recipe(const char *name, DType *type, bool *k_m) {
    size_t n = strlen(name);
    *k_m = n == 6 && (!strncasecmp(name, "q4_k", 4) || !strncasecmp(name, "q5_k", 4)) && !strcasecmp(name + 4, "_m");
    char base[8] = {0};
    if (*k_m) memcpy(base, name, 4);
    int t = quantize_parse_type(*k_m ? base : name);
    if (t < 0) return -1;
    *type = (DType)t;
    return 0;
}

/* llama.cpp's general.file_type ids (llama_ftype) */
static uint32_t file_type_id(DType t, bool k_m) {
    if (k_m) return t == DT_Q4_K ? 15 : 17; /* Q4_K_M, Q5_K_M */
    switch (t) {
    case DT_F32: return 0;
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 14; /* Q4_K_S: every matrix Q4_K */
    case DT_Q5_K: return 16; /* Q5_K_S */
    case DT_Q6_K: return 18;
    default: return 32;      /* BF16 */
    }
}

/* The _M mixes (llama.cpp's Q4_K_M / Q5_K_M): Q6_K for the LM head, and for
 * attn_v and ffn_down in the first and last eighth of the layers and every
 * third layer between; the base type elsewhere. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int layer_of(const char *name) {
    int l = -1;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

static DType mix_type_of(const GGUFTensor *t, DType base, bool k_m, int n_layers) {
    if (!k_m) return base;
    if (!strcmp(t->name, "output.weight")) return DT_Q6_K;
    int l = layer_of(t->name);
    bool v_or_down = strstr(t->name, ".attn_v.") || strstr(t->name, ".ffn_down");
    return l >= 0 && v_or_down && more_bits(l, n_layers) ? DT_Q6_K : base;
}

/* llama.cpp's type for a K type's matrix whose rows are not whole 256-blocks */
static DType k_fallback(DType k) { return k == DT_Q4_K ? DT_Q5_0 : k == DT_Q5_K ? DT_Q5_1 : DT_Q8_0; }

static DType out_type_of(const GGUFTensor *t, DType want) {
    bool matrix = t->n_dims >= 2 && t->ne[1] > 1 && !strstr(t->name, "ffn_gate_inp");
    if (!matrix || t->type == want) return t->type;
    if (t->ne[0] % (uint64_t)dtype_info(want)->block_elems == 0) return want;
    if (t->ne[0] % 32 == 0 && dtype_info(want)->block_elems == 256) return k_fallback(want);
    return t->type;
}

typedef struct {
    const GGUFFile *in;
    const DType *out_type;
    ThreadPool *tp;      /* rows are quantized in parallel (an 8B model: minutes on one core) */
} FillCtx;

/* Rows [a, b) of one tensor, on a worker of the pool. */
typedef struct {
    const GGUFTensor *t;
    DType out;
    void *dst;
    atomic_bool failed;  /* a worker had no memory for its row buffer */
} RowsJob;

static void quantize_rows(void *ctx, int64_t a, int64_t b) {
    RowsJob *j = ctx;
    int64_t cols = (int64_t)j->t->ne[0];
    uint64_t in_rb = dtype_row_bytes(j->t->type, cols), out_rb = dtype_row_bytes(j->out, cols);
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) { atomic_store(&j->failed, true); return; }
    for (int64_t r = a; r < b; r++) {
        dequantize_row(j->t->type, (const uint8_t *)j->t->data + r * in_rb, row, cols);
        quantize_row(j->out, row, (uint8_t *)j->dst + r * out_rb, cols);
    }
    free(row);
}

static int fill_tensor(void *ctx, uint64_t i, void *dst, uint64_t nbytes, Err *err) {
    const FillCtx *c = ctx;
    const GGUFTensor *t = &c->in->tensors[i];
    if (c->out_type[i] == t->type) {
        memcpy(dst, t->data, nbytes);
        return 0;
    }
    RowsJob job = {t, c->out_type[i], dst, false};
    cpu_parallel_for(c->tp, (int64_t)(tensor_nelems(t) / t->ne[0]), quantize_rows, &job);
    return atomic_load(&job.failed) ? err_set(err, "out of memory quantizing '%s'", t->name) : 0;
}

/* the input's kv pairs with general.file_type set (added when absent) */
static GGUFKV *kv_with_file_type(const GGUFFile *in, DType type, bool k_m, uint64_t *n_kv) {
    GGUFKV *kv = calloc(in->n_kv + 1, sizeof *kv);
    if (!kv) return NULL;
    memcpy(kv, in->kv, in->n_kv * sizeof *kv);
    *n_kv = in->n_kv;
    uint64_t i = 0;
    while (i < *n_kv && strcmp(kv[i].key, "general.file_type")) i++;
    if (i == *n_kv) (*n_kv)++;
    kv[i].key = "general.file_type";
    kv[i].value.type = GGUF_UINT32;
    kv[i].value.v.u = file_type_id(type, k_m);
    return kv;
}

int quantize_model(const char *in_path, const char *out_path, DType type, FILE *log, Err *err) {
    return quantize_model_mix(in_path, out_path, type, false, log, err);
}

int quantize_model_mix(const char *in_path, const char *out_path, DType type, bool k_m, FILE *log, Err *err) {
    if (!quantize_type_supported(type)) return err_set(err, "cllm quantize: cannot write type %d", (int)type);
    if (k_m && type != DT_Q4_K && type != DT_Q5_K)
        return err_set(err, "cllm quantize: the _M mix takes Q4_K or Q5_K, not %s", dtype_info(type)->name);
    if (!strcmp(in_path, out_path)) return err_set(err, "%s: OUT must differ from IN", out_path);
    FILE *f = fopen(in_path, "rb");
    if (!f) return err_set(err, "%s: cannot open the file", in_path);
    char magic[4] = {0};
    bool is_gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    if (!is_gguf)
        return err_set(err, "%s: cllm quantize reads GGUF files only for now (safetensors input is not supported "
                       "yet: convert it to GGUF first)", in_path);
    /* Loaded as every command loads it (config, tensor names, shapes and
     * types, tokenizer): what cllm would refuse to run is refused here,
     * before anything is written. */
    Model model;
    if (model_load(&model, in_path, 0, err)) return -1;
    const GGUFFile *in = &model.gguf;
    uint64_t n_kv = 0, n_q = 0, bytes_in = 0, bytes_out = 0;
    GGUFKV *kv = kv_with_file_type(in, type, k_m, &n_kv);
    int n_layers = 0;
    for (uint64_t i = 0; i < in->n_tensors; i++)
        if (layer_of(in->tensors[i].name) >= n_layers) n_layers = layer_of(in->tensors[i].name) + 1;
    GGUFOutTensor *ot = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *ot);
    DType *types = calloc(in->n_tensors ? in->n_tensors : 1, sizeof *types);
    int rc = kv && ot && types ? 0 : err_set(err, "out of memory");
    for (uint64_t i = 0; rc == 0 && i < in->n_tensors; i++) {
        const GGUFTensor *t = &in->tensors[i];
        types[i] = out_type_of(t, mix_type_of(t, type, k_m, n_layers));
        ot[i] = (GGUFOutTensor){t->name, t->n_dims, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, types[i]};
        n_q += types[i] != t->type;
        bytes_in += t->nbytes;
        bytes_out += dtype_row_bytes(types[i], t->ne[0]) * (tensor_nelems(t) / t->ne[0]);
    }
    FillCtx ctx = {in, types, rc == 0 ? thread_pool_create(0, err) : NULL};
    if (rc == 0 && !ctx.tp) rc = -1;
    if (rc == 0) rc = gguf_write(out_path, kv, n_kv, ot, in->n_tensors, in->alignment, fill_tensor, &ctx, err);
    if (ctx.tp) thread_pool_destroy(ctx.tp);
    if (rc == 0 && log)
        fprintf(log, "cllm quantize: %s -> %s: %llu of %llu tensors to %s%s, %.1f MB -> %.1f MB\n", in_path, out_path,
                (unsigned long long)n_q, (unsigned long long)in->n_tensors, dtype_info(type)->name, k_m ? "_M" : "",
                bytes_in / 1e6, bytes_out / 1e6);
    free(kv);
    free(ot);
    free(types);
    model_free(&model);
    return rc;
}

static void quantize_usage(FILE *out) {
    fprintf(out, "usage: cllm quantize IN.gguf OUT.gguf --type TYPE\n\n"
                 "Writes OUT with every weight matrix quantized to TYPE (vectors keep their type;\n"
                 "metadata and tokenizer are copied). K types fall back to Q8_0 on rows that are\n"
                 "not whole 256-value blocks. q4_k_m / q5_k_m: llama.cpp's mixes (Q6_K for the\n"
                 "LM head and for attn_v and ffn_down in the first and last eighth of the layers\n"
                 "and every third layer between).\n\n"
                 "TYPE: q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m f16 bf16 f32\n\n"
                 "       cllm quantize IN_FOLDER OUT_FOLDER --type fp8\n\n"
                 "fp8 reads a safetensors model folder and writes an FP8 checkpoint folder (compressed-\n"
                 "tensors float-quantized, as vLLM reads it): the attention and MLP matrices and an\n"
                 "untied LM head as e4m3 with a scale per output row, activations dynamic per token\n"
                 "(exactly --weights fp8's numbers); config.json gets quantization_config, the\n"
                 "tokenizer files are copied.\n");
}

int quantize_main(int argc, char **argv) {
    const char *pos[2], *type_name = NULL;
    int n_pos = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            quantize_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--type") || !strcmp(argv[i], "-t")) {
            if (++i == argc) { fprintf(stderr, "cllm quantize: --type needs a value\n"); return 2; }
            type_name = argv[i];
        } else if (argv[i][0] == '-' || n_pos == 2) {
            fprintf(stderr, "cllm quantize: unexpected argument '%s' (see cllm quantize --help)\n", argv[i]);
            return 2;
        } else {
            pos[n_pos++] = argv[i];
        }
    }
    if (n_pos != 2 || !type_name) {
        quantize_usage(stderr);
        return 2;
    }
    DType type;
    bool k_m;
    Err err = {{0}};
    if (!strcasecmp(type_name, "fp8")) {
        if (quantize_fp8_checkpoint(pos[0], pos[1], &err)) {
            fprintf(stderr, "cllm quantize: %s\n", err.msg);
            return 2;
        }
        printf("cllm quantize: %s -> %s: FP8 (e4m3, per-channel scales) checkpoint written\n", pos[0], pos[1]);
        return 0;
    }
    if (quantize_parse_recipe(type_name, &type, &k_m)) {
        fprintf(stderr, "cllm quantize: unknown --type '%s' (q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m "
                        "f16 bf16 f32 fp8)\n", type_name);
        return 2;
    }
    if (quantize_model_mix(pos[0], pos[1], type, k_m, stdout, &err)) {
        fprintf(stderr, "cllm quantize: %s\n", err.msg);
        return 2;
    }
    return 0;
}
