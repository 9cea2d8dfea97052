/* main.c — the command line of cllm: options, subcommands, help. No model
 * logic lives here; each subcommand parses its options into a struct and
 * calls the layers. User errors print one line and exit 2. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/batch.h"
#include "app/bench.h"
#include "app/chat.h"
#include "app/info.h"
#include "app/models.h"
#include "app/perplexity.h"
#include "app/quantize_cmd.h"
#include "app/runtime.h"
#include "app/serve.h"
#include "app/tokenize_cmd.h"
#include "model/dummy.h"
#include "model/model.h"
#include "parallel/stage_plan.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#define CLLM_VERSION "0.1.0"

/* ---------- option parsing ---------- */

/* OPT_FLAG_VALUE: a flag that may carry a value written with '='
 * ("--dummy-weights" stores "", "--dummy-weights=q4_k" stores "q4_k"); the
 * next argument is never taken as its value. Every long option with a value
 * may also be written --name=VALUE. */
typedef enum { OPT_FLAG, OPT_INT, OPT_FLOAT, OPT_STR, OPT_FLAG_VALUE } OptKind;
typedef struct {
    const char *lng;      /* "--model" */
    const char *shrt;     /* "-m" or NULL */
    OptKind kind;
    void *dest;           /* bool* / int* / float* / const char** (OPT_STR, OPT_FLAG_VALUE) */
    const char *help;
} Opt;

static int parse_number(const char *cmd, const char *opt, const char *s, OptKind k, void *dest) {
    char *end;
    errno = 0;
    if (k == OPT_INT) {
        long v = strtol(s, &end, 10);
        /* INT_MIN is OPT_UNSET, the mark of an option not given. */
        if (*s == 0 || *end || errno || v <= INT_MIN || v > INT_MAX) goto bad;
        *(int *)dest = (int)v;
    } else {
        float v = strtof(s, &end);
        /* NaN is the mark of a sampling option not given; no option takes it. */
        if (*s == 0 || *end || errno || isnan(v)) goto bad;
        *(float *)dest = v;
    }
    return 0;
bad:
    fprintf(stderr, "cllm %s: option %s expects %s, got '%s'\n", cmd, opt,
            k == OPT_INT ? "an integer in [-2147483647, 2147483647]" : "a number", s);
    return 2;
}

/* ---------- option ranges ----------
 * Every number a command takes is checked before anything is loaded, so a
 * bad value stops the run at once (exit 2) instead of failing each request
 * or silently turning into a default. Integers whose default is "not given"
 * start as OPT_UNSET; check_int puts the default in only when so. */

#define OPT_UNSET INT_MIN
#define MAX_CTX_TOKENS (1 << 24) /* a larger context overflows the block counts (int) */
#define MAX_THREADS 4096

typedef struct {
    const char *name;  /* "--max-tokens" */
    int *v;
    int lo, hi;
    int dflt;          /* what OPT_UNSET becomes */
    const char *note;  /* said after the range, or NULL */
} IntRange;

static int check_ints(const char *cmd, const IntRange *r, int n) {
    for (int i = 0; i < n; i++) {
        if (*r[i].v == OPT_UNSET) { *r[i].v = r[i].dflt; continue; }
        if (*r[i].v >= r[i].lo && *r[i].v <= r[i].hi) continue;
        fprintf(stderr, "cllm %s: %s %d: must be an integer in [%d, %d]%s%s\n", cmd, r[i].name, *r[i].v, r[i].lo,
                r[i].hi, r[i].note ? "; " : "", r[i].note ? r[i].note : "");
        return 2;
    }
    return 0;
}

/* v in [lo, hi] (lo_open: (lo, hi]); NaN and infinities never pass. */
static int check_float(const char *cmd, const char *name, float v, double lo, bool lo_open, double hi,
                       const char *note) {
    if (isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi) return 0;
    if (isinf(hi)) fprintf(stderr, "cllm %s: %s %g: must be a number %s %g (%s)\n", cmd, name, v, lo_open ? ">" : ">=",
                           lo, note);
    else fprintf(stderr, "cllm %s: %s %g: must be a number in %c%g, %g] (%s)\n", cmd, name, v, lo_open ? '(' : '[', lo,
                 hi, note);
    return 2;
}

/* The sampling options: the ranges the prompt file's per-request fields
 * have too (app/prompts.c). */
static int check_sampling(const char *cmd, const SamplerParams *s) {
    if (check_float(cmd, "--temp", s->temperature, 0, false, INFINITY, "0 = greedy") ||
        check_float(cmd, "--top-p", s->top_p, 0, true, 1, "1 = off") ||
        check_float(cmd, "--min-p", s->min_p, 0, false, 1, "0 = off") ||
        check_float(cmd, "--repeat-penalty", s->repetition_penalty, 0, true, INFINITY, "1 = off") ||
        check_float(cmd, "--presence-penalty", s->presence_penalty, -2, false, 2, "0 = off") ||
        check_float(cmd, "--frequency-penalty", s->frequency_penalty, -2, false, 2, "0 = off"))
        return 2;
    if (s->top_k >= 0) return 0;
    fprintf(stderr, "cllm %s: --top-k %d: must be an integer in [0, %d] (0 = off)\n", cmd, s->top_k, INT_MAX);
    return 2;
}

static void print_opts(FILE *out, const Opt *opts) {
    for (const Opt *o = opts; o->lng; o++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s", o->shrt ? o->shrt : "", o->shrt ? ", " : "", o->lng,
                 o->kind == OPT_FLAG ? "" : o->kind == OPT_FLAG_VALUE ? "[=S]" : o->kind == OPT_STR ? " S" : " N");
        fprintf(out, "  %-26s %s\n", left, o->help);
    }
}

/* Parses argv into opts; positional arguments go to pos (at most max_pos).
 * Returns 0, 1 when --help was printed, or 2 on a user error. */
static int parse_opts(const char *cmd, const char *usage, int argc, char **argv, const Opt *opts, const char **pos,
                      int max_pos, int *n_pos) {
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: cllm %s\n\noptions:\n", usage);
            print_opts(stdout, opts);
            return 1;
        }
        if (a[0] != '-' || !strcmp(a, "-")) {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "cllm %s: unexpected argument '%s' (see cllm %s --help)\n", cmd, a, cmd);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL; /* --name=VALUE */
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const Opt *o = opts;
        for (; o->lng; o++)
            if ((strlen(o->lng) == len && !strncmp(a, o->lng, len)) || (!eq && o->shrt && !strcmp(a, o->shrt))) break;
        if (!o->lng) {
            fprintf(stderr, "cllm %s: unknown option '%.*s' (see cllm %s --help)\n", cmd, (int)len, a, cmd);
            return 2;
        }
        if (eq && (o->kind == OPT_FLAG || !eq[1])) {
            fprintf(stderr, "cllm %s: option %s %s (got '%s')\n", cmd, o->lng,
                    o->kind == OPT_FLAG ? "takes no value" : "needs a value after '='", a);
            return 2;
        }
        if (o->kind == OPT_FLAG) { *(bool *)o->dest = true; continue; }
        if (o->kind == OPT_FLAG_VALUE) { *(const char **)o->dest = eq ? eq + 1 : ""; continue; }
        if (!eq && i + 1 >= argc) {
            fprintf(stderr, "cllm %s: option %s needs a value\n", cmd, a);
            return 2;
        }
        const char *v = eq ? eq + 1 : argv[++i];
        if (o->kind == OPT_STR) *(const char **)o->dest = v;
        else if (parse_number(cmd, eq ? o->lng : a, v, o->kind, o->dest)) return 2;
    }
    return 0;
}

/* --kv-dtype NAME into *t, and --kv-scales NAME (scales, or NULL) checked
 * against it; 2 (after saying why) for a name cllm lacks, or static scales
 * for a cache that has none. */
static int parse_kv_dtype(const char *cmd, const char *name, KVDtype *t, const char *scales) {
    if (name && kv_dtype_from_name(name, t)) {
        fprintf(stderr, "cllm %s: --kv-dtype '%s': expected one of %s\n", cmd, name, KV_DTYPE_NAMES);
        return 2;
    }
    KVScales s;
    if (scales && kv_scales_from_name(scales, &s)) {
        fprintf(stderr, "cllm %s: --kv-scales '%s': expected one of %s\n", cmd, scales, KV_SCALES_NAMES);
        return 2;
    }
    if (scales && s != KV_SCALES_DYNAMIC && *t != KV_DTYPE_FP8) {
        fprintf(stderr, "cllm %s: --kv-scales %s: only an fp8 KV cache has scales; add --kv-dtype fp8\n", cmd,
                scales);
        return 2;
    }
    return 0;
}

/* --weights NAME: "fp8" quantizes the float matrices at load; "file" (the
 * default) keeps them as stored. 2 (after saying why) for another name. */
static int parse_weights(const char *cmd, const char *name) {
    if (!name || !strcmp(name, "fp8") || !strcmp(name, "file")) return 0;
    fprintf(stderr, "cllm %s: --weights '%s': expected file or fp8\n", cmd, name);
    return 2;
}

/* --dummy-weights[=TYPE] (OPT_FLAG_VALUE: NULL when absent, "" without a
 * type: bf16) into *on and *type; 2 (after saying why) for a type cllm does
 * not make. */
static int parse_dummy_weights(const char *cmd, const char *arg, bool *on, DType *type) {
    Err err = {{0}};
    if (!arg) return 0;
    *on = true;
    if (!*arg) { *type = DT_BF16; return 0; }
    if (dummy_type_parse(arg, type, &err) == 0) return 0;
    fprintf(stderr, "cllm %s: %s\n", cmd, err.msg);
    return 2;
}

#define DUMMY_HELP "random weights instead of reading them (a folder with config.json + tokenizer.json; " \
                   "benchmarks); =TYPE: the matrices in " DUMMY_TYPE_NAMES " (default bf16)"

#define WEIGHTS_HELP "fp8: quantize the float matrices (attention, MLP, an untied LM head) to FP8 e4m3 at load, " \
    "a scale per output row; refused for GGUF-quantized (Q*) matrices (default: file, as stored)"
#define KV_DTYPE_HELP "KV cache elements: bf16 (default; fp32 on the CPU) or fp8 (e4m3, a scale per token and KV head)"
#define KV_SCALES_HELP "fp8 KV cache scales: dynamic (amax/448 per token and KV head), checkpoint (the model's " \
    "k_scale/v_scale), calibrate (per KV head from the first step, then fixed) (default: checkpoint where the model " \
    "has them, else dynamic)"

#define TP_HELP "tensor-parallel ranks: every layer's heads and MLP split over N GPUs (per --pp stage; with --cpu " \
    "or no usable GPU: CPU backends; default 1)"
#define TP_NCCL_SUM_HELP "--tp over NCCL: sum the ranks' partial results with ncclAllReduce (faster: bf16 parts in " \
    "NCCL's order; default: fp32 parts gathered, then summed in rank order: the bits of the host-memory transport)"
#define GPUS_HELP "every backend's GPU, comma-separated: the stages', or with --tp each rank's, stage by stage; a GPU " \
    "named twice holds two ranks (they exchange through host memory) (default 0,1,...; with no usable GPU: exits 2 " \
    "saying why)"

/* ---------- subcommands ---------- */

static int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    bool tensors = false, dummy = false;
    int kv_tokens = OPT_UNSET, pp = OPT_UNSET, tp = OPT_UNSET;
    const char *pp_split = NULL, *kv_name = NULL, *dummy_arg = NULL, *gpus = NULL;
    DType dummy_type = DT_BF16;
    KVDtype kv_dtype = KV_DTYPE_BF16;
    const Opt opts[] = {
        {"--model", "-m", OPT_STR, &model, "model file or folder (also as the first argument)"},
        {"--tensors", NULL, OPT_FLAG, &tensors, "list every tensor"},
        {"--ctx-size", "-c", OPT_INT, &kv_tokens, "tokens of KV cache to size (default: the model's context)"},
        {"--kv-dtype", NULL, OPT_STR, &kv_name, "KV cache elements to size: bf16 (default) or fp8"},
        {"--pp", NULL, OPT_INT, &pp, "show the split into N pipeline stages and the memory per GPU"},
        {"--pp-split", NULL, OPT_STR, &pp_split, "layers per stage, comma-separated (default: balanced by bytes)"},
        {"--tp", NULL, OPT_INT, &tp, "show the split over N tensor-parallel ranks (per --pp stage) and the memory per GPU"},
        {"--gpus", NULL, OPT_STR, &gpus, "with --tp or --pp: every backend's GPU, comma-separated, stage by "
         "stage, rank by rank, as a run would take it; a GPU named twice is shared (default 0,1,...)"},
        {"--dummy-weights", NULL, OPT_FLAG_VALUE, &dummy_arg,
         "a folder with config.json only: the shapes, no weights read; =TYPE: the matrices in " DUMMY_TYPE_NAMES},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("info", "info [MODEL] [options]", argc, argv, opts, pos, 1, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    const IntRange ints[] = {
        {"--ctx-size", &kv_tokens, 1, MAX_CTX_TOKENS, 0, "leave it out for the model's context"},
        {"--pp", &pp, 1, 1024, 0, NULL},
        {"--tp", &tp, 1, TP_GROUP_MAX, 0, NULL},
    };
    if ((rc = check_ints("info", ints, 3)) || (rc = parse_kv_dtype("info", kv_name, &kv_dtype, NULL)) ||
        (rc = parse_dummy_weights("info", dummy_arg, &dummy, &dummy_type)))
        return rc;
    InfoOptions io = {n_pos ? pos[0] : model, tensors, dummy, dummy_type, kv_tokens, kv_dtype, pp, pp_split, tp, gpus};
    return info_main(&io);
}

static int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    bool pieces = false, no_special = false, no_bos = false;
    const Opt opts[] = {
        {"--model", "-m", OPT_STR, &model, "model file or folder"},
        {"--pieces", NULL, OPT_FLAG, &pieces, "print each token's piece beside its id"},
        {"--no-parse-special", NULL, OPT_FLAG, &no_special, "treat special-token text as plain text"},
        {"--no-bos", NULL, OPT_FLAG, &no_bos, "do not add BOS even where the model expects it"},
        {"--file", "-f", OPT_STR, &file, "tokenize the contents of a file ('-' = stdin)"},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("tokenize", "tokenize -m MODEL \"text\" [options]", argc, argv, opts, pos, 1, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!n_pos && !file) {
        fprintf(stderr, "cllm tokenize: give the text as an argument or with --file\n");
        return 2;
    }
    TokenizeOptions to = {model, file, n_pos ? pos[0] : NULL, pieces, !no_special, !no_bos};
    return tokenize_main(&to);
}

/* ---------- chat and generate ---------- */

/* Options shared by chat and generate, followed by each one's own. */
#define RUN_OPTS(o)                                                                                            \
    {"--model", "-m", OPT_STR, &(o)->model, "model file or folder (default: first model of models.txt)"},      \
    {"--cpu", NULL, OPT_FLAG, &(o)->cpu, "run on the CPU even where a GPU is present (default: the GPU when there is one)"},                       \
    {"--gpu", NULL, OPT_INT, &(o)->gpu, "CUDA device to use (default 0; with no usable GPU, N > 0 exits 2 saying why)"},                                     \
    {"--gpu-mem-util", NULL, OPT_FLOAT, &(o)->gpu_mem_util,                                                    \
     "fraction of the GPU's memory to use; what weights and activations leave holds the KV cache (default 0.9)"}, \
    {"--pp", NULL, OPT_INT, &(o)->pp, "pipeline stages: the layers split over this many GPUs (with --cpu or no usable GPU: CPU backends, said once; default 1)"}, \
    {"--pp-split", NULL, OPT_STR, &(o)->pp_split, "layers per stage, comma-separated (default: balanced by bytes)"}, \
    {"--tp", NULL, OPT_INT, &(o)->tp, TP_HELP},                                                               \
    {"--tp-nccl-sum", NULL, OPT_FLAG, &(o)->tp_nccl_sum, TP_NCCL_SUM_HELP},                                   \
    {"--gpus", NULL, OPT_STR, &(o)->gpus, GPUS_HELP},                                                         \
    {"--threads", "-t", OPT_INT, &(o)->threads, "CPU threads (default: one per core)"},                        \
    {"--ctx-size", "-c", OPT_INT, &(o)->ctx_size, "context size in tokens (default: min(model, 4096))"},        \
    {"--max-tokens", "-n", OPT_INT, &(o)->max_tokens, "most tokens per reply (default: generate 512, chat until the context fills)"},                               \
    {"--temp", NULL, OPT_FLOAT, &(o)->sampling.temperature, "temperature, 0 = greedy (default: the model's own setting or its models.txt entry's, else 0.8 as llama.cpp)"},                      \
    {"--top-k", NULL, OPT_INT, &(o)->sampling.top_k, "top-k, 0 = off (default: the model's, else 40)"},                                      \
    {"--top-p", NULL, OPT_FLOAT, &(o)->sampling.top_p, "top-p, 1 = off (default: the model's, else 0.95)"},                                    \
    {"--min-p", NULL, OPT_FLOAT, &(o)->sampling.min_p, "min-p, 0 = off (default: the model's, else 0.05)"},                                    \
    {"--repeat-penalty", NULL, OPT_FLOAT, &(o)->sampling.repetition_penalty, "repetition penalty, 1 = off (default: the model's, else 1)"},  \
    {"--presence-penalty", NULL, OPT_FLOAT, &(o)->sampling.presence_penalty, "presence penalty (default 0 = off)"},             \
    {"--frequency-penalty", NULL, OPT_FLOAT, &(o)->sampling.frequency_penalty, "frequency penalty (default 0 = off)"},          \
    {"--seed", NULL, OPT_INT, &seed, "random seed: reproducible sampling (default: chat a fresh seed per reply, generate 0)"},                                  \
    {"--chat-template", NULL, OPT_STR, &(o)->chat_template, "chatml, qwen3, llama3, llama3.1, llama2, mistral, gemma, harmony (default: the model's own template)"}, \
    {"--system", NULL, OPT_STR, &(o)->system, "system prompt (default: none)"},                                               \
    {"--ignore-eos", NULL, OPT_FLAG, &(o)->ignore_eos, "keep generating past end-of-text tokens (default: stop there)"},            \
    {"--host-sampling", NULL, OPT_FLAG, &(o)->host_sampling, "draw tokens on the CPU even where the GPU could (default: the GPU draws)"}, \
    {"--bf16-weights", NULL, OPT_FLAG, &(o)->bf16_weights, "GPU: dequantize quantized weights to bf16 at load (default: kept as stored)"}, \
    {"--dummy-weights", NULL, OPT_FLAG_VALUE, &dummy, DUMMY_HELP},                                            \
    {"--rank", NULL, OPT_INT, &(o)->rank, "multi-process run: this process's stage, --tp rank, or with both stage*N+rank (default: OMPI_COMM_WORLD_RANK / PMI_RANK)"}, \
    {"--world-size", NULL, OPT_INT, &(o)->world_size, "multi-process run: processes = --pp stages, --tp ranks, or their product (default: OMPI_COMM_WORLD_SIZE / PMI_SIZE)"}, \
    {"--master", NULL, OPT_STR, &(o)->master, "multi-process run: ADDR:PORT where the driver listens: the last rank, with --tp rank 0, with both the last stage's rank 0 (default: CLLM_MASTER)"}, \
    {"--batch-invariant", NULL, OPT_FLAG, &(o)->batch_invariant,                                              \
     "GPU: a sequence's tokens do not depend on the batch it runs in (slower; see README; default off)"},                  \
    {"--kv-dtype", NULL, OPT_STR, &kv_dtype, KV_DTYPE_HELP},                                                 \
    {"--kv-scales", NULL, OPT_STR, &(o)->kv_scales, KV_SCALES_HELP},                                         \
    {"--weights", NULL, OPT_STR, &(o)->weights, WEIGHTS_HELP},                                               \
    {"--verbose", "-v", OPT_FLAG, &(o)->verbose, "print statistics (default: chat prints them when stdout is a terminal)"}

/* The integers of RUN_OPTS start as OPT_UNSET: a value given is checked, one
 * not given takes RunOptions' default ("0 = the default" is never typed). */
static void run_ints_unset(RunOptions *o, int *seed) {
    o->gpu = o->threads = o->ctx_size = o->max_tokens = o->pp = o->tp = *seed = OPT_UNSET;
}

static int check_run_options(const char *cmd, RunOptions *o, int *seed) {
    const IntRange ints[] = {
        {"--gpu", &o->gpu, 0, 1023, 0, NULL},
        {"--threads", &o->threads, 1, MAX_THREADS, 0, "leave it out for one per core"},
        {"--ctx-size", &o->ctx_size, 1, MAX_CTX_TOKENS, 0, "leave it out for min(model, 4096)"},
        {"--max-tokens", &o->max_tokens, 1, INT_MAX, 0, NULL},
        {"--pp", &o->pp, 1, 1024, 0, NULL},
        {"--tp", &o->tp, 1, TP_GROUP_MAX, 0, NULL},
        {"--seed", seed, 0, INT_MAX, -1, NULL},
    };
    int rc = check_ints(cmd, ints, (int)(sizeof ints / sizeof *ints));
    return rc ? rc : check_sampling(cmd, &o->sampling);
}

static int resolve_model(RunOptions *o, char *buf, size_t cap) {
    if (o->model) return 0;
    int rc = app_default_model(buf, cap);
    o->model = buf;
    return rc;
}

static int env_run_options(const char *cmd, RunOptions *o) {
    Err err = {{0}};
    if (run_options_from_env(o, &err) == 0) return 0;
    fprintf(stderr, "cllm %s: %s\n", cmd, err.msg);
    return 2;
}

/* Chat's sampling options start unset (NaN, OPT_UNSET) so that the ones the
 * user gave can win over the model's own settings, read after the load. */
static void sampling_unset(SamplerParams *s) {
    s->temperature = s->top_p = s->min_p = s->repetition_penalty = NAN;
    s->top_k = OPT_UNSET;
}

/* The SAMPLING_GIVEN_* bits of the options given; the others take cllm's
 * defaults (sampler_params_default). */
static unsigned sampling_given(SamplerParams *s) {
    SamplerParams d = sampler_params_default();
    unsigned given = 0;
    if (isnan(s->temperature)) s->temperature = d.temperature; else given |= SAMPLING_GIVEN_TEMP;
    if (s->top_k == OPT_UNSET) s->top_k = d.top_k; else given |= SAMPLING_GIVEN_TOP_K;
    if (isnan(s->top_p)) s->top_p = d.top_p; else given |= SAMPLING_GIVEN_TOP_P;
    if (isnan(s->min_p)) s->min_p = d.min_p; else given |= SAMPLING_GIVEN_MIN_P;
    if (isnan(s->repetition_penalty)) s->repetition_penalty = d.repetition_penalty; else given |= SAMPLING_GIVEN_REPEAT;
    return given;
}

static int cmd_chat(int argc, char **argv) {
    RunOptions o;
    run_options_default(&o);
    int seed;
    const char *kv_dtype = NULL, *dummy = NULL;
    run_ints_unset(&o, &seed);
    sampling_unset(&o.sampling);
    const Opt opts[] = {RUN_OPTS(&o), {0}};
    const char *pos[1];
    int n_pos, rc = parse_opts("chat", "chat [-m MODEL] [options]", argc, argv, opts, pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    unsigned given = sampling_given(&o.sampling);
    if ((rc = check_run_options("chat", &o, &seed)) || (rc = parse_kv_dtype("chat", kv_dtype, &o.kv_dtype, o.kv_scales)) ||
        (rc = parse_weights("chat", o.weights)) ||
        (rc = parse_dummy_weights("chat", dummy, &o.dummy_weights, &o.dummy_type)))
        return rc;
    if (seed >= 0) o.sampling.seed = (uint64_t)seed;
    char def[PATH_MAX];
    if ((rc = resolve_model(&o, def, sizeof def)) || (rc = env_run_options("chat", &o))) return rc;
    return chat_main(&o, given, seed >= 0);
}

static int cmd_generate(int argc, char **argv) {
    RunOptions o;
    BatchOptions b;
    run_options_default(&o);
    batch_options_default(&b);
    int seed;
    const char *kv_dtype = NULL, *dummy = NULL;
    run_ints_unset(&o, &seed);
    sampling_unset(&o.sampling);
    b.max_seqs = b.max_batched_tokens = OPT_UNSET; /* unset: 0, the defaults from the KV cache */
    const Opt opts[] = {
        RUN_OPTS(&o),
        {"--input", "-i", OPT_STR, &b.input, "prompts: text (a prompt per line), JSON Lines, OpenAI batch; .gz; - = stdin"},
        {"--output", "-o", OPT_STR, &b.output, "results as JSON Lines (.gz compresses; - = stdout, the default)"},
        {"--resume", NULL, OPT_FLAG, &b.resume,
         "skip prompts whose id is already in the output (a cut-off last line is dropped, and said so)"},
        {"--overwrite", NULL, OPT_FLAG, &b.overwrite, "replace an output file that already holds results"},
        {"--ordered", NULL, OPT_FLAG, &b.ordered, "write results in input order"},
        {"--raw", NULL, OPT_FLAG, &b.raw, "text-file lines as raw completions, even for a model with a chat template"},
        {"--chat", NULL, OPT_FLAG, &b.chat, "every prompt, JSON Lines \"prompt\" too, through the chat template"},
        {"--retry-errors", NULL, OPT_FLAG, &b.retry_errors, "with --resume: run ids whose output line is an error again"},
        {"--max-seqs", NULL, OPT_INT, &b.max_seqs, "most sequences per step (default: as many 1024-token sequences as the KV cache holds, 16 to 256)"},
        {"--max-batched-tokens", NULL, OPT_INT, &b.max_batched_tokens, "most tokens per step (default 8192, or the KV cache's tokens if fewer)"},
        {"--steps-csv", NULL, OPT_STR, &b.steps_csv,
         "write a CSV line per step (rows, context tokens, attention pairs, seconds: bench/roofline.py's input)"},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("generate", "generate -m MODEL -i PROMPTS [-o OUT] [options]\n\n"
                               "input: a text file is one prompt per line, a user turn through the model's chat\n"
                               "template when it has one (--raw: a raw completion); JSON Lines, one object a line:\n"
                               "  id                  string or number (default line-N); written back in the output\n"
                               "  prompt              text, completed raw (the OpenAI completions API); or an\n"
                               "                      array of token ids, used as given (no BOS added)\n"
                               "  messages            [{role, content}], through the chat template (chat API);\n"
                               "                      role system|developer|user|assistant|tool, content a string\n"
                               "                      or [{type: text, text}]; one of prompt / messages\n"
                               "  max_tokens          (or max_completion_tokens) most tokens to generate\n"
                               "  temperature, top_p, min_p, top_k, seed, repetition_penalty, presence_penalty,\n"
                               "  frequency_penalty   sampling, over the command line's\n"
                               "  stop                a string or up to 64 strings that end the completion\n"
                               "  model               echoed in OpenAI batch output; n must be 1\n"
                               "  logprobs            prompt: K (0..20) alternatives per token, OpenAI completions\n"
                               "                      shape; messages: true, with top_logprobs K (0..20), chat shape\n"
                               "  echo                prompt: true puts the prompt first in text (and in logprobs)\n"
                               "  prompt_logprobs     K (0..20): each prompt token's logprob and top K (vLLM)\n"
                               "                      logprobs: log-softmax of the raw logits (before temperature,\n"
                               "                      penalties, top-k/p), fp32 on the host\n"
                               "OpenAI batch lines ({custom_id, method, url, body}) take the same fields in body.\n\n"
                               "exit status: 0 every prompt has its line in OUT (a bad prompt gets an error line);\n"
                               "1 the input held no prompt (OUT is left empty) or broke while read (the prompts\n"
                               "read before the break have their lines); 2 nothing ran and OUT is untouched (bad\n"
                               "options, -o naming the input or holding results without --resume/--overwrite, an\n"
                               "unreadable input or model), or OUT could not be written; 130 stopped by Ctrl-C\n"
                               "(finished prompts have their lines; the message gives the --resume command)",
                               argc, argv, opts, pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    b.sampling_given = sampling_given(&o.sampling);
    const IntRange ints[] = {
        {"--max-seqs", &b.max_seqs, 1, 65536, 0, NULL},
        {"--max-batched-tokens", &b.max_batched_tokens, 1, 1 << 24, 0, NULL},
    };
    if ((rc = check_ints("generate", ints, 2))) return rc;
    if ((rc = check_run_options("generate", &o, &seed)) || (rc = parse_kv_dtype("generate", kv_dtype, &o.kv_dtype, o.kv_scales)) ||
        (rc = parse_weights("generate", o.weights)) ||
        (rc = parse_dummy_weights("generate", dummy, &o.dummy_weights, &o.dummy_type)))
        return rc;
    if ((rc = env_run_options("generate", &o))) return rc;
    if (!b.input && !run_options_serves_stage(&o)) { /* a serving rank reads no prompts */
        fprintf(stderr, "cllm generate: give the prompts with -i FILE (or -i - for stdin)\n");
        return 2;
    }
    if (seed >= 0) o.sampling.seed = (uint64_t)seed;
    b.argc = argc;
    b.argv = argv;
    char def[PATH_MAX];
    if ((rc = resolve_model(&o, def, sizeof def))) return rc;
    return batch_main(&o, &b);
}

/* ---------- serve ---------- */

static int cmd_serve(int argc, char **argv) {
    RunOptions o;
    ServeOptions so;
    run_options_default(&o);
    serve_options_default(&so);
    int seed, max_req = OPT_UNSET;
    const char *kv_dtype = NULL, *dummy = NULL;
    run_ints_unset(&o, &seed);
    sampling_unset(&o.sampling);
    so.port = so.max_connections = so.max_seqs = so.max_batched_tokens = so.grace_seconds = OPT_UNSET;
    const Opt opts[] = {
        RUN_OPTS(&o),
        {"--host", NULL, OPT_STR, &so.host, "address to listen on (default 127.0.0.1: this machine only)"},
        {"--port", NULL, OPT_INT, &so.port, "TCP port (default 8080; 0 = any free port, printed at start)"},
        {"--api-key", NULL, OPT_STR, &so.api_key, "require 'Authorization: Bearer KEY' on /v1/ (default: none)"},
        {"--model-name", NULL, OPT_STR, &so.model_name, "the model id /v1/models and responses give (default: the file's name)"},
        {"--max-request-bytes", NULL, OPT_INT, &max_req, "largest request body in bytes (default 1048576)"},
        {"--max-connections", NULL, OPT_INT, &so.max_connections, "connections served at once; more get 503 (default 256)"},
        {"--max-seqs", NULL, OPT_INT, &so.max_seqs, "most sequences per step (default: as many 1024-token sequences as the KV cache holds, 16 to 256)"},
        {"--max-batched-tokens", NULL, OPT_INT, &so.max_batched_tokens, "most tokens per step (default 8192, or the KV cache's tokens if fewer)"},
        {"--grace", NULL, OPT_INT, &so.grace_seconds,
         "seconds running requests get to finish after SIGTERM/SIGINT before they are cut short (default 30)"},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("serve", "serve -m MODEL [options]\n\n"
                               "An OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions\n"
                               "(stream, n, stop, seed, max_tokens, temperature, top_p, top_k, min_p, penalties;\n"
                               "logprobs, top_logprobs), GET /v1/models, GET /health, GET /metrics\n"
                               "(Prometheus). SIGTERM or SIGINT stops it: running requests finish, exit 0.\n"
                               "Without --max-tokens or a request's max_tokens a reply runs until the context fills.",
                               argc, argv, opts, pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    so.sampling_given = sampling_given(&o.sampling);
    const IntRange ints[] = {
        {"--port", &so.port, 0, 65535, 8080, NULL},
        {"--max-request-bytes", &max_req, 1024, 1 << 30, 1 << 20, NULL},
        {"--max-connections", &so.max_connections, 1, 65536, 256, NULL},
        {"--max-seqs", &so.max_seqs, 1, 65536, 0, NULL},                  /* unset: from the KV cache */
        {"--max-batched-tokens", &so.max_batched_tokens, 1, 1 << 24, 0, NULL},
        {"--grace", &so.grace_seconds, 0, 86400, 30, NULL},
    };
    if ((rc = check_run_options("serve", &o, &seed)) || (rc = check_ints("serve", ints, 6)) ||
        (rc = parse_kv_dtype("serve", kv_dtype, &o.kv_dtype, o.kv_scales)) || (rc = parse_weights("serve", o.weights)) ||
        (rc = parse_dummy_weights("serve", dummy, &o.dummy_weights, &o.dummy_type)))
        return rc;
    if (o.system) {
        fprintf(stderr, "cllm serve: --system is chat's; a request gives its own system message\n");
        return 2;
    }
    if (so.api_key && !*so.api_key) {
        fprintf(stderr, "cllm serve: --api-key must not be empty\n");
        return 2;
    }
    so.max_request_bytes = (size_t)max_req;
    if (seed >= 0) o.sampling.seed = (uint64_t)seed;
    so.seed_given = seed >= 0;
    char def[PATH_MAX];
    if ((rc = resolve_model(&o, def, sizeof def)) || (rc = env_run_options("serve", &o))) return rc;
    return serve_main(&o, &so);
}

/* ---------- bench ---------- */

static int cmd_bench(int argc, char **argv) {
    RunOptions o;
    BenchOptions b;
    run_options_default(&o);
    bench_options_default(&b);
    const char *prompt_lens = NULL, *ctxs = NULL, *kv_dtype = NULL, *dummy = NULL;
    int seed = OPT_UNSET;
    o.gpu = o.threads = o.pp = o.tp = OPT_UNSET;
    const Opt opts[] = {
        {"--model", "-m", OPT_STR, &o.model, "model file or folder (default: first model of models.txt)"},
        {"--cpu", NULL, OPT_FLAG, &o.cpu, "run on the CPU even where a GPU is present"},
        {"--gpu", NULL, OPT_INT, &o.gpu, "CUDA device to use (default 0)"},
        {"--threads", "-t", OPT_INT, &o.threads, "CPU threads (default: one per core)"},
        {"--bf16-weights", NULL, OPT_FLAG, &o.bf16_weights, "GPU: dequantize quantized weights to bf16 at load"},
        {"--dummy-weights", NULL, OPT_FLAG_VALUE, &dummy, DUMMY_HELP},
        {"--batch-invariant", NULL, OPT_FLAG, &o.batch_invariant, "GPU: the batch-invariant kernels (see README)"},
        {"--kv-dtype", NULL, OPT_STR, &kv_dtype, KV_DTYPE_HELP},
        {"--kv-scales", NULL, OPT_STR, &o.kv_scales, KV_SCALES_HELP},
        {"--weights", NULL, OPT_STR, &o.weights, WEIGHTS_HELP},
        {"--pp", NULL, OPT_INT, &o.pp, "pipeline stages (one GPU each)"},
        {"--tp", NULL, OPT_INT, &o.tp, TP_HELP},
        {"--tp-nccl-sum", NULL, OPT_FLAG, &o.tp_nccl_sum, TP_NCCL_SUM_HELP},
        {"--gpus", NULL, OPT_STR, &o.gpus, GPUS_HELP},
        {"--prompt-lens", NULL, OPT_STR, &prompt_lens, "prefill lengths, comma-separated (default: GPU 512,4096; CPU 128,256)"},
        {"--ctx", NULL, OPT_STR, &ctxs, "decode context lengths, comma-separated (default: GPU 128,4096; CPU 128,256)"},
        {"--decode-tokens", NULL, OPT_INT, &b.decode_tokens, "timed decode steps per context (default: GPU 64, CPU 32)"},
        {"--batch", NULL, OPT_INT, &b.batch, "sequences decoded together (default 1)"},
        {"--reps", NULL, OPT_INT, &b.reps, "timed prefills per length, median reported (default: GPU 3, CPU 1)"},
        {"--seed", NULL, OPT_INT, &seed, "seed of the random token ids"},
        {"--json", NULL, OPT_STR, &b.json, "also write the numbers to this JSON file"},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("bench", "bench -m MODEL [options]", argc, argv, opts, pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    const IntRange ints[] = {
        {"--gpu", &o.gpu, 0, 1023, 0, NULL},
        {"--threads", &o.threads, 1, MAX_THREADS, 0, "leave it out for one per core"},
        {"--pp", &o.pp, 1, 1024, 0, NULL},
        {"--tp", &o.tp, 1, TP_GROUP_MAX, 0, NULL},
        {"--seed", &seed, 0, INT_MAX, -1, NULL},
    };
    if ((rc = check_ints("bench", ints, 5)) || (rc = parse_kv_dtype("bench", kv_dtype, &o.kv_dtype, o.kv_scales)) ||
        (rc = parse_weights("bench", o.weights)) ||
        (rc = parse_dummy_weights("bench", dummy, &o.dummy_weights, &o.dummy_type)))
        return rc;
    Err err = {{0}};
    if ((prompt_lens && bench_parse_list(prompt_lens, b.prompt_lens, BENCH_MAX_LIST, &b.n_prompt_lens, &err)) ||
        (ctxs && bench_parse_list(ctxs, b.ctxs, BENCH_MAX_LIST, &b.n_ctxs, &err)) || bench_options_check(&b, &err)) {
        fprintf(stderr, "cllm bench: %s\n", err.msg);
        return 2;
    }
    if (seed >= 0) b.seed = (uint64_t)seed;
    char def[PATH_MAX];
    if ((rc = resolve_model(&o, def, sizeof def))) return rc;
    return bench_main(&o, &b);
}

/* ---------- perplexity ---------- */

static int cmd_perplexity(int argc, char **argv) {
    PerplexityOptions p = {0};
    RunOptions *o = &p.run;
    run_options_default(o);
    const char *kv_dtype = NULL;
    int ctx = OPT_UNSET, stride = OPT_UNSET;
    o->gpu = o->threads = OPT_UNSET;
    const Opt opts[] = {
        {"--model", "-m", OPT_STR, &o->model, "model file or folder (default: first model of models.txt)"},
        {"--file", "-f", OPT_STR, &p.file, "the text to score"},
        {"--ctx", NULL, OPT_INT, &ctx, "tokens per window (default: min(512, the model's context))"},
        {"--stride", NULL, OPT_INT, &stride, "tokens between window starts, in [1, ctx] (default: ctx, disjoint windows)"},
        {"--save-logits", NULL, OPT_STR, &p.save_logits, "write every scored position's distribution here (for --kl-divergence)"},
        {"--kl-divergence", NULL, OPT_STR, &p.kl_file, "compare with a --save-logits file (its ctx and stride; same tokens)"},
        {"--cpu", NULL, OPT_FLAG, &o->cpu, "run on the CPU even where a GPU is present"},
        {"--gpu", NULL, OPT_INT, &o->gpu, "CUDA device to use (default 0)"},
        {"--gpu-mem-util", NULL, OPT_FLOAT, &o->gpu_mem_util, "fraction of the GPU's memory to use (default 0.9)"},
        {"--threads", "-t", OPT_INT, &o->threads, "CPU threads (default: one per core)"},
        {"--bf16-weights", NULL, OPT_FLAG, &o->bf16_weights, "GPU: dequantize quantized weights to bf16 at load"},
        {"--batch-invariant", NULL, OPT_FLAG, &o->batch_invariant, "GPU: the batch-invariant kernels (see README)"},
        {"--kv-dtype", NULL, OPT_STR, &kv_dtype, KV_DTYPE_HELP},
        {"--kv-scales", NULL, OPT_STR, &o->kv_scales, KV_SCALES_HELP},
        {"--weights", NULL, OPT_STR, &o->weights, WEIGHTS_HELP},
        {"--verbose", "-v", OPT_FLAG, &o->verbose, "print each window's figures"},
        {0},
    };
    const char *pos[1];
    int n_pos, rc = parse_opts("perplexity", "perplexity -m MODEL -f TEXT [options]\n\n"
                               "Teacher-forced negative log-likelihood and perplexity = exp(mean NLL) of a text.\n"
                               "The text is tokenized whole (BOS first when the model's tokenizer adds one; special-\n"
                               "token text is plain text). Windows of --ctx tokens start every --stride tokens, each\n"
                               "from an empty KV cache, and score only the tokens no earlier window scored, never\n"
                               "their own first token: Hugging Face's strided sliding window, so transformers gives\n"
                               "the same numbers. Exit status: 0 done, 2 bad options or input, 1 a failure while running",
                               argc, argv, opts, pos, 0, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    const IntRange ints[] = {
        {"--gpu", &o->gpu, 0, 1023, 0, NULL},
        {"--threads", &o->threads, 1, MAX_THREADS, 0, "leave it out for one per core"},
        {"--ctx", &ctx, 2, MAX_CTX_TOKENS, 0, "leave it out for min(512, the model's context)"},
        {"--stride", &stride, 1, MAX_CTX_TOKENS, 0, "leave it out for --ctx"},
    };
    if ((rc = check_ints("perplexity", ints, 4)) || (rc = parse_kv_dtype("perplexity", kv_dtype, &o->kv_dtype, o->kv_scales)) ||
        (rc = parse_weights("perplexity", o->weights)) ||
        check_float("perplexity", "--gpu-mem-util", o->gpu_mem_util, 0, true, 1, "a fraction"))
        return rc ? rc : 2;
    if (!p.file) {
        fprintf(stderr, "cllm perplexity: give the text with -f FILE\n");
        return 2;
    }
    if (ctx > 0 && stride > ctx) {
        fprintf(stderr, "cllm perplexity: --stride %d: must be at most --ctx %d (a larger stride leaves tokens unscored)\n",
                stride, ctx);
        return 2;
    }
    if (p.kl_file && (ctx > 0 || stride > 0)) {
        fprintf(stderr, "cllm perplexity: --ctx and --stride come from the --kl-divergence file; leave them out\n");
        return 2;
    }
    if (p.kl_file && p.save_logits && !strcmp(p.kl_file, p.save_logits)) {
        fprintf(stderr, "cllm perplexity: --save-logits %s would overwrite the --kl-divergence file it reads\n",
                p.save_logits);
        return 2;
    }
    p.ctx = ctx;
    p.stride = stride;
    char def[PATH_MAX];
    if ((rc = resolve_model(o, def, sizeof def))) return rc;
    return perplexity_main(&p);
}

static void print_usage(FILE *out) {
    fprintf(out,
            "cllm %s — LLM inference in C (GGUF / safetensors; CUDA and CPU)\n\n"
            "usage: cllm [SUBCOMMAND] [OPTIONS]\n\n"
            "subcommands:\n"
            "  chat        interactive chat (the default when no subcommand is given)\n"
            "  generate    answer every prompt of a file\n"
            "  serve       an OpenAI-compatible HTTP server (chat and completions, streaming)\n"
            "  info        describe a model file\n"
            "  tokenize    print the token ids of a text\n"
            "  bench       measure load, prefill and decode speed on random tokens\n"
            "  perplexity  perplexity of a text; KL divergence against a saved run\n"
            "  quantize    write a GGUF copy with the weight matrices quantized (q8_0, q4_k, ...)\n\n"
            "  cllm SUBCOMMAND --help   options of one subcommand\n"
            "  cllm --version           version\n",
            CLLM_VERSION);
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        print_usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("cllm %s\n", CLLM_VERSION);
        return 0;
    }
    const char *cmd = argc >= 2 ? argv[1] : "chat";
    if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 2, argv + 2);
    if (!strcmp(cmd, "quantize")) return quantize_main(argc - 2, argv + 2);
    if (argc >= 2 && argv[1][0] == '-') return cmd_chat(argc - 1, argv + 1); /* `cllm -m X` = chat */
    if (argc < 2) return cmd_chat(0, argv);
    fprintf(stderr, "cllm: unknown subcommand '%s' (see cllm --help)\n", cmd);
    return 2;
}
