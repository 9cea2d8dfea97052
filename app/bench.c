/* bench.c — `cllm bench` (see bench.h): times whole scheduler steps (the
 * loop chat and generate run: batch, forward, draw, stop checks) with a
 * monotonic clock. Every step ends with its tokens drawn, so a step's time
 * is what a run pays for it. */
#include "app/bench.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "kernels/gpu_limits.h"

void bench_options_default(BenchOptions *b) {
    memset(b, 0, sizeof *b);
    b->decode_tokens = b->reps = BENCH_UNSET; /* the backend's default (bench_options_for_backend) */
    b->batch = 1;
    b->seed = 1234;
}

void bench_options_for_backend(BenchOptions *b, bool gpu) {
    /* the CPU runs a 135M model at ~100 prefill and ~7 decode tok/s on 2 cores: short runs, one rep */
    static const int gpu_prompts[] = {512, 4096}, gpu_ctxs[] = {128, 4096}, cpu_prompts[] = {128, 256},
                     cpu_ctxs[] = {128, 256};
    if (b->n_prompt_lens == 0) {
        memcpy(b->prompt_lens, gpu ? gpu_prompts : cpu_prompts, sizeof gpu_prompts);
        b->n_prompt_lens = 2;
    }
    if (b->n_ctxs == 0) {
        memcpy(b->ctxs, gpu ? gpu_ctxs : cpu_ctxs, sizeof gpu_ctxs);
        b->n_ctxs = 2;
    }
    if (b->decode_tokens == BENCH_UNSET) b->decode_tokens = gpu ? 64 : 32;
    if (b->reps == BENCH_UNSET) b->reps = gpu ? 3 : 1;
}

int bench_parse_list(const char *s, int *out, int cap, int *n, Err *err) {
    *n = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v <= 0 || v > INT_MAX / 4 || (*end && *end != ','))
            return err_set(err, "'%s': expected positive token counts separated by commas, like 512,4096", s);
        if (*n >= cap) return err_set(err, "'%s': at most %d values", s, cap);
        out[(*n)++] = (int)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

int bench_options_check(const BenchOptions *b, Err *err) {
    if (b->decode_tokens != BENCH_UNSET && (b->decode_tokens < 1 || b->decode_tokens > 100000))
        return err_set(err, "--decode-tokens %d: expected 1 to 100000", b->decode_tokens);
    if (b->batch < 1 || b->batch > BENCH_MAX_BATCH)
        return err_set(err, "--batch %d: expected 1 to %d", b->batch, BENCH_MAX_BATCH);
    if (b->reps != BENCH_UNSET && (b->reps < 1 || b->reps > BENCH_MAX_REPS)) return err_set(err, "--reps %d: expected 1 to %d", b->reps, BENCH_MAX_REPS);
    return 0;
}

/* ---------- what a step must compute and read ---------- */

static double ref_elems(const WeightRef *r) {
    return r->data ? (double)r->rows * (double)r->cols * (double)(r->n_mats > 0 ? r->n_mats : 1) : 0.0;
}

static double ref_bytes(const WeightRef *r) {
    return r->data ? (double)r->row_bytes * (double)r->rows * (double)(r->n_mats > 0 ? r->n_mats : 1) : 0.0;
}

/* Share of the expert weights that `rows` tokens use: k of E per token, at
 * most all of them (1 for a dense MLP). */
static double expert_share(const ModelConfig *c, int rows) {
    if (c->n_experts <= 0) return 1.0;
    double s = (double)rows * c->n_experts_used / c->n_experts;
    return s < 1.0 ? s : 1.0;
}

/* Query-key pairs of a causal prefill of T rows from position 0 under window W. */
static double causal_pairs(int T, int W) {
    double t = T;
    if (W <= 0 || W >= T) return t * (t + 1) / 2;
    return (double)W * (W + 1) / 2 + (t - W) * W;
}

double bench_prefill_flops(const ModelConfig *c, const ModelWeights *w, int T) {
    double flops = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        double dense = ref_elems(&lw->wq) + ref_elems(&lw->wk) + ref_elems(&lw->wv) + ref_elems(&lw->wo) +
                       ref_elems(&lw->router);
        double mlp = ref_elems(&lw->w_gate) + ref_elems(&lw->w_up) + ref_elems(&lw->w_down);
        /* every token runs k experts: per token, k/E of the expert weights */
        double per_token = dense + mlp * (c->n_experts > 0 ? (double)c->n_experts_used / c->n_experts : 1.0);
        flops += 2.0 * per_token * T;
        flops += 2.0 * c->n_heads * (double)(c->head_dim_k + c->head_dim_v) * causal_pairs(T, c->layer_window[l]);
    }
    return flops + 2.0 * ref_elems(&w->output); /* logits of the last row only */
}

static double layer_bytes(const LayerWeights *lw, double share) {
    const WeightRef *plain[] = {&lw->attn_norm, &lw->wq, &lw->wk, &lw->wv, &lw->bq, &lw->bk, &lw->bv,
                                &lw->q_norm, &lw->k_norm, &lw->wo, &lw->bo, &lw->sinks, &lw->post_attn_norm,
                                &lw->ffn_norm, &lw->router, &lw->router_bias, &lw->post_ffn_norm};
    const WeightRef *mlp[] = {&lw->w_gate, &lw->w_up, &lw->w_down, &lw->b_gate, &lw->b_up, &lw->b_down};
    double b = 0;
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) b += ref_bytes(plain[i]);
    for (size_t i = 0; i < sizeof mlp / sizeof mlp[0]; i++) b += ref_bytes(mlp[i]) * share;
    return b;
}

double bench_decode_bytes_at(const ModelConfig *c, const ModelWeights *w, const int *ctx, int batch,
                             double kv_head_token) {
    double share = expert_share(c, batch), bytes = 0;
    double kv_row = (double)c->n_kv_heads * kv_head_token; /* K, V of a token */
    for (int l = 0; l < c->n_layers; l++) {
        bytes += layer_bytes(&w->layers[l], share);
        for (int i = 0; i < batch; i++) {
            int keys = ctx[i] + 1, win = c->layer_window[l]; /* the new token sees itself too */
            if (win > 0 && win < keys) keys = win;
            bytes += (double)keys * kv_row;
        }
    }
    /* the LM head is read whole; of an untied embedding table only the step's rows */
    bytes += ref_bytes(&w->output) + ref_bytes(&w->output_norm);
    if (w->tok_embd.data != w->output.data) bytes += (double)batch * w->tok_embd.row_bytes;
    return bytes;
}

/* ---------- timing ---------- */

typedef struct {
    int tokens;
    double flops, seconds, tok_s, tflops;
} PrefillResult;

typedef struct {
    int ctx, batch, steps;
    double ctx_mean;                    /* the sequences' mean context at the median step */
    double bytes, step_s, tok_s, gbps;  /* bytes: read by the median step */
} DecodeResult;

typedef struct {
    Runtime rt;
    Scheduler sched;
    bool sched_ready;
    const BenchOptions *b;
    KVDtype kv_dtype;        /* of the cache (--kv-dtype) */
    bool gpu;                /* the backend is a GPU's (else the CPU's: bf16 is held as fp32) */
    uint64_t rng;
    int32_t *ids;            /* [longest prompt] */
    volatile sig_atomic_t stop; /* ends the decode requests once timed */
    double load_s;
    GpuLimits lim;           /* of the GPU or CPU it runs on; each 0 where not known */
    char lim_why[200];       /* why there are no limits (the query failed), or "" */
    PrefillResult prefill[BENCH_MAX_LIST];
    DecodeResult decode[BENCH_MAX_LIST];
} Bench;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* splitmix64: random ids over the whole vocabulary. */
static void random_ids(Bench *bn, int32_t *ids, int n) {
    int vocab = bn->rt.model.cfg.vocab;
    for (int i = 0; i < n; i++) {
        uint64_t z = (bn->rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        ids[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)vocab);
    }
}

/* A request of n random prompt tokens: greedy, EOS ignored, up to
 * max_tokens (0: until bn->stop). */
static SchedRequest *bench_submit(Bench *bn, int n, int max_tokens, Err *err) {
    GenParams p = {.sampling = sampler_params_default(), .max_tokens = max_tokens, .ignore_eos = true};
    p.sampling.temperature = 0;
    random_ids(bn, bn->ids, n);
    SchedRequest *r = scheduler_submit(&bn->sched, bn->ids, n, &p, NULL, err);
    if (r) r->interrupt = &bn->stop;
    return r;
}

/* Steps until every request has finished, and frees them. */
static int bench_drain(Bench *bn, Err *err) {
    while (!scheduler_idle(&bn->sched))
        if (scheduler_step(&bn->sched, err)) return -1;
    SchedRequest *r;
    while ((r = scheduler_pop_finished(&bn->sched))) sched_request_free(r);
    return 0;
}

/* One prefill of T fresh tokens (one step: its first token is drawn too);
 * its seconds in *dt. */
static int bench_prefill_once(Bench *bn, int T, double *dt, Err *err) {
    if (!bench_submit(bn, T, 1, err)) return -1;
    double t0 = now_seconds();
    int rc = bench_drain(bn, err);
    *dt = now_seconds() - t0;
    return rc;
}

/* The weights a step reads, as the backend holds them; a pipeline's
 * backends each hold a slice, so there the whole model's as loaded. */
static const ModelWeights *counted_weights(const Bench *bn) {
    return bn->rt.engine.stages.n_stages > 0 ? &bn->rt.model.w : bn->rt.be->weights;
}

static int bench_prefill(Bench *bn, int T, PrefillResult *r, Err *err) {
    double times[BENCH_MAX_REPS], dt;
    int reps = bn->b->reps;
    if (bench_prefill_once(bn, T, &dt, err)) return -1; /* warm-up: plans, graphs, caches */
    for (int i = 0; i < reps; i++)
        if (bench_prefill_once(bn, T, &times[i], err)) return -1;
    r->tokens = T;
    r->seconds = median(times, reps);
    r->tok_s = T / r->seconds;
    r->flops = bench_prefill_flops(&bn->rt.model.cfg, counted_weights(bn), T);
    r->tflops = r->flops / r->seconds / 1e12;
    return 0;
}

/* The cache's element type as the backend holds it: the CPU keeps bf16's in fp32. */
static const char *kv_name(const Bench *bn) {
    return !bn->gpu && bn->kv_dtype == KV_DTYPE_BF16 ? "fp32" : kv_dtype_name(bn->kv_dtype);
}

/* Bytes of one KV head's K and V of one token, as the cache holds them. */
static double kv_token_bytes(const Bench *bn) {
    const ModelConfig *c = &bn->rt.model.cfg;
    if (!bn->gpu && bn->kv_dtype == KV_DTYPE_BF16) return 4.0 * (c->head_dim_k + c->head_dim_v);
    return (double)kv_head_token_bytes(bn->kv_dtype, c->head_dim_k, c->head_dim_v);
}

/* Each running sequence's context (tokens whose K/V a decode row reads,
 * less its own) after `ahead` more steps; their count. */
static int batch_contexts(const Scheduler *s, int ahead, int *ctx) {
    for (int i = 0; i < s->n_running; i++) ctx[i] = (int)s->running[i]->tokens.n - 1 + ahead;
    return s->n_running;
}

/* B requests of ctx prompt tokens; once every one decodes (a step of B
 * decode rows alone, which is also the warm-up), N such steps are timed. */
static int bench_decode(Bench *bn, int ctx, DecodeResult *r, Err *err) {
    int B = bn->b->batch, N = bn->b->decode_tokens, rc = 0;
    double *times = malloc((size_t)N * sizeof *times);
    int ctxs[BENCH_MAX_BATCH], n_ctx = 0;
    if (!times) return err_set(err, "out of memory");
    bn->stop = 0;
    for (int i = 0; i < B && rc == 0; i++)
        if (!bench_submit(bn, ctx, 0, err)) rc = -1;
    const SchedStats *st = &bn->sched.stats;
    bool warm = false;
    while (rc == 0 && !warm) { /* prefills, then the first step of decode rows alone */
        rc = scheduler_step(&bn->sched, err);
        warm = st->n_decode == B && st->n_tokens == B;
        if (rc == 0 && !warm && scheduler_idle(&bn->sched)) rc = err_set(err, "bench: the requests ended early");
    }
    for (int i = 0; i < N && rc == 0; i++) {
        if (i == 0) n_ctx = batch_contexts(&bn->sched, N / 2, ctxs); /* at the median step */
        double t0 = now_seconds();
        rc = scheduler_step(&bn->sched, err);
        times[i] = now_seconds() - t0;
        if (rc == 0 && st->n_tokens != B) rc = err_set(err, "bench: a decode step ran %d rows, not %d", st->n_tokens, B);
    }
    bn->stop = 1;
    if (bench_drain(bn, err)) rc = -1;
    if (rc == 0) {
        r->ctx = ctx, r->batch = B, r->steps = N;
        r->step_s = median(times, N);
        r->tok_s = B / r->step_s;
        /* the median step sits halfway through the timed ones; a sequence whose prompt was done a step
         * early holds a token more: each one's bytes at its own context */
        r->ctx_mean = 0;
        for (int i = 0; i < n_ctx; i++) r->ctx_mean += (double)ctxs[i] / n_ctx;
        r->bytes = bench_decode_bytes_at(&bn->rt.model.cfg, counted_weights(bn), ctxs, n_ctx, kv_token_bytes(bn));
        r->gbps = r->bytes / r->step_s / 1e9;
    }
    free(times);
    return rc;
}

/* ---------- report ---------- */

/* The limits a % is taken of: 0 where unknown (the CPU's FLOP rate, a card not in the spec table). */
static double peak_tflops(const Bench *bn) { return bn->gpu ? bn->lim.bf16_tflops : 0; }
static double peak_tbps(const Bench *bn) { return bn->lim.copy_tbps; }

static void tbps_source(const Bench *bn, char *out, size_t cap) {
    if (peak_tbps(bn) <= 0) snprintf(out, cap, "%s", bn->lim_why);
    else if (bn->gpu)
        snprintf(out, cap, "measured: device-to-device copy of %.2f GiB, best of %d", bn->lim.copy_gib, bn->lim.copy_reps);
    else snprintf(out, cap, "measured: memcpy of %.2f GiB on one thread, best of %d", bn->lim.copy_gib, bn->lim.copy_reps);
}

static void tflops_source(const Bench *bn, char *out, size_t cap) {
    snprintf(out, cap, "%s", bn->lim_why[0] ? bn->lim_why : bn->lim.flops_source);
}

/* The limits and where each came from, for the header. */
static void print_limits(const Bench *bn) {
    char mem[512], fl[512];
    tbps_source(bn, mem, sizeof mem);
    tflops_source(bn, fl, sizeof fl);
    if (bn->gpu)
        printf("GPU      %s (compute capability %d.%d)\n", bn->lim.name[0] ? bn->lim.name : "?", bn->lim.cc_major,
               bn->lim.cc_minor);
    if (peak_tbps(bn) > 0 && bn->gpu) printf("limits   memory %.2f TB/s (%s)\n", peak_tbps(bn), mem);
    else if (peak_tbps(bn) > 0) printf("limits   CPU memory %.1f GB/s (%s)\n", peak_tbps(bn) * 1e3, mem);
    else printf("limits   memory unknown (%s): no %% of it\n", mem);
    if (!bn->gpu) {
        printf("         %s: no %% for prefill\n", fl);
    } else if (peak_tflops(bn) > 0) {
        printf("         bf16 %.1f TFLOP/s", peak_tflops(bn));
        if (bn->lim.fp8_tflops > 0) printf(", fp8 %.1f TFLOP/s", bn->lim.fp8_tflops);
        else printf(", no fp8 tensor cores");
        printf(" (%s)\n", fl);
    } else {
        printf("         tensor-core rate %s: no %% of it\n", fl);
    }
}

/* 16.06 G, 94.5 K: three significant digits and an SI prefix. */
static void human(char *out, size_t cap, double v, const char *unit) {
    const char *prefix[] = {"", " K", " M", " G", " T"};
    int i = 0;
    while (v >= 1000 && i < 4) v /= 1000, i++;
    snprintf(out, cap, "%.*f%s%s%s", v >= 100 ? 1 : 2, v, prefix[i], i == 0 && *unit ? " " : "", unit);
}

static void print_table(const Bench *bn) {
    const BenchOptions *b = bn->b;
    const Model *m = &bn->rt.model;
    char params[32], bytes[32];
    human(params, sizeof params, (double)m->n_params, "");
    human(bytes, sizeof bytes, (double)m->weight_bytes, "B");
    printf("model    %s (%s, %s parameters, %s of weights)\n", m->cfg.name, arch_name(m->cfg.arch), params, bytes);
    printf("backend  %s\n", bn->rt.be->name);
    print_limits(bn);
    printf("KV cache %s, %lld tokens (%d blocks)\n", kv_name(bn), (long long)bn->rt.kv_tokens,
           bn->rt.be->kv_n_blocks);
    printf("load     %.2f s, %.2f GB/s", bn->load_s, m->weight_bytes / bn->load_s / 1e9);
    if (bn->rt.load_gbps > 0) printf(" (GPU upload %.2f GB/s)", bn->rt.load_gbps);
    printf("\n\nprefill  tokens         ms        tok/s    TFLOP/s   %% peak\n");
    for (int i = 0; i < b->n_prompt_lens; i++) {
        const PrefillResult *r = &bn->prefill[i];
        printf("         %6d %10.2f %12.1f %10.2f", r->tokens, r->seconds * 1e3, r->tok_s, r->tflops);
        if (peak_tflops(bn) > 0) printf(" %7.1f%%\n", 100 * r->tflops / peak_tflops(bn));
        else printf("       -\n");
    }
    printf("\ndecode   ctx  batch    ms/step        tok/s       GB/s   %% peak\n");
    for (int i = 0; i < b->n_ctxs; i++) {
        const DecodeResult *r = &bn->decode[i];
        printf("       %5d %6d %10.3f %12.1f %10.1f", r->ctx, r->batch, r->step_s * 1e3, r->tok_s, r->gbps);
        if (peak_tbps(bn) > 0) printf(" %7.1f%%\n", 100 * r->gbps / (peak_tbps(bn) * 1e3));
        else printf("       -\n");
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* A figure, or null where its limit is unknown (peak 0). */
static void json_pct(FILE *f, double value, double peak, double scale) {
    if (peak > 0) fprintf(f, "%.2f", 100 * value / (peak * scale));
    else fputs("null", f);
}

static void json_peak(FILE *f, const char *key, double v, const char *fmt) {
    fprintf(f, "\"%s\": ", key);
    if (v > 0) fprintf(f, fmt, v);
    else fputs("null", f);
}

/* Writes the numbers to f (opened before the run, so a bad path fails at once) and closes it. */
static int write_json(const Bench *bn, FILE *f, Err *err) {
    const BenchOptions *b = bn->b;
    const Model *m = &bn->rt.model;
    bool gpu = bn->gpu;
    fputs("{\"model\": ", f);
    json_string(f, m->cfg.name);
    fprintf(f, ", \"path\": ");
    json_string(f, m->path);
    fprintf(f, ", \"arch\": \"%s\", \"kv_dtype\": \"%s\", \"backend\": ", arch_name(m->cfg.arch),
            kv_name(bn));
    json_string(f, bn->rt.be->name);
    fprintf(f, ",\n \"params\": %llu, \"weight_bytes\": %llu, \"gpu\": ", (unsigned long long)m->n_params,
            (unsigned long long)m->weight_bytes);
    if (gpu && bn->lim.name[0]) json_string(f, bn->lim.name);
    else fputs("null", f);
    char src[512];
    fputs(",\n ", f);
    json_peak(f, "peak_tflops", peak_tflops(bn), "%.2f");
    fputs(", ", f);
    json_peak(f, "peak_fp8_tflops", gpu ? bn->lim.fp8_tflops : 0, "%.2f");
    tflops_source(bn, src, sizeof src);
    fputs(", \"peak_tflops_source\": ", f);
    json_string(f, src);
    fputs(",\n ", f);
    json_peak(f, "peak_tbps", peak_tbps(bn), "%.5g");
    tbps_source(bn, src, sizeof src);
    fputs(", \"peak_tbps_source\": ", f);
    json_string(f, src);
    fputs(",\n", f);
    fprintf(f, " \"reps\": %d, \"decode_tokens\": %d,\n", b->reps, b->decode_tokens);
    fprintf(f, " \"load_s\": %.4f, \"load_gbps\": %.3f, \"upload_gbps\": %.3f,\n \"prefill\": [", bn->load_s,
            m->weight_bytes / bn->load_s / 1e9, bn->rt.load_gbps);
    for (int i = 0; i < b->n_prompt_lens; i++) {
        const PrefillResult *r = &bn->prefill[i];
        fprintf(f, "%s\n  {\"tokens\": %d, \"flops\": %.6e, \"seconds\": %.9g, \"tok_s\": %.2f, \"tflops\": %.6g, \"pct_peak\": ",
                i ? "," : "", r->tokens, r->flops, r->seconds, r->tok_s, r->tflops);
        json_pct(f, r->tflops, peak_tflops(bn), 1);
        fputc('}', f);
    }
    fputs("],\n \"decode\": [", f);
    for (int i = 0; i < b->n_ctxs; i++) {
        const DecodeResult *r = &bn->decode[i];
        fprintf(f, "%s\n  {\"ctx\": %d, \"batch\": %d, \"steps\": %d, \"ctx_mean\": %.3f, \"bytes\": %.6e, "
                   "\"step_s\": %.9g, \"tok_s\": %.2f, \"gbps\": %.6g, \"pct_peak\": ",
                i ? "," : "", r->ctx, r->batch, r->steps, r->ctx_mean, r->bytes, r->step_s, r->tok_s, r->gbps);
        json_pct(f, r->gbps, peak_tbps(bn), 1e3);
        fputc('}', f);
    }
    fputs("]}\n", f);
    if (fclose(f)) return err_set(err, "%s: %s", b->json, strerror(errno));
    return 0;
}

/* ---------- the run ---------- */

static int list_max(const int *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static int bench_run(Bench *bn, Err *err) {
    const BenchOptions *b = bn->b;
    for (int i = 0; i < b->n_prompt_lens; i++) {
        if (bench_prefill(bn, b->prompt_lens[i], &bn->prefill[i], err)) return -1;
        fprintf(stderr, "prefill %d tokens: %.1f tok/s\n", b->prompt_lens[i], bn->prefill[i].tok_s);
    }
    for (int i = 0; i < b->n_ctxs; i++) {
        if (bench_decode(bn, b->ctxs[i], &bn->decode[i], err)) return -1;
        fprintf(stderr, "decode at %d: %.1f tok/s\n", b->ctxs[i], bn->decode[i].tok_s);
    }
    return 0;
}

/* The GPU of the first stage: --gpus' first entry, else --gpu. */
static int first_gpu(const RunOptions *o) {
    return o->gpus && *o->gpus >= '0' && *o->gpus <= '9' ? atoi(o->gpus) : o->gpu;
}

int bench_main(const RunOptions *o_in, const BenchOptions *b_in) {
    Bench *bn = calloc(1, sizeof *bn);
    if (!bn) { fprintf(stderr, "cllm bench: out of memory\n"); return 1; }
    /* the backend decides the defaults: on a GPU unless --cpu or none is there (as runtime_open picks) */
    Err why = {{0}};
    bn->gpu = !o_in->cpu && backend_gpu_count(&why) > 0;
    BenchOptions bo = *b_in;
    const BenchOptions *b = &bo;
    bench_options_for_backend(&bo, bn->gpu);
    bn->b = b;
    bn->rng = b->seed;
    bn->kv_dtype = o_in->kv_dtype;
    RunOptions o = *o_in;
    int max_prompt = list_max(b->prompt_lens, b->n_prompt_lens), max_ctx = list_max(b->ctxs, b->n_ctxs);
    /* one forward step per prompt; the cache holds every decoded sequence */
    o.prefill_chunk = max_prompt > max_ctx ? max_prompt : max_ctx;
    /* a request that finishes its prompt early decodes while the others' prompts run: at most one step each */
    int per_seq = max_ctx + b->decode_tokens + 1 + b->batch, pool = b->batch * (per_seq + 16);
    /* a prefill request is its prompt and the one token it samples */
    o.ctx_size = max_prompt + 1 > pool ? max_prompt + 1 : pool;
    Err err = {{0}};
    FILE *json = b->json ? fopen(b->json, "w") : NULL;
    if (b->json && !json) {
        fprintf(stderr, "cllm bench: %s: %s\n", b->json, strerror(errno));
        free(bn);
        return 2;
    }
    /* the limits first: the copy test needs memory the KV cache will take */
    Err lerr = {{0}};
    if (bn->gpu ? gpu_limits_query(first_gpu(&o), &bn->lim, &lerr) : gpu_limits_cpu_measure(&bn->lim, &lerr))
        snprintf(bn->lim_why, sizeof bn->lim_why, "not measured: %.180s", lerr.msg);
    double t0 = now_seconds();
    int rc = runtime_open(&bn->rt, &o, &err);
    bn->load_s = now_seconds() - t0;
    if (rc) {
        fprintf(stderr, "cllm bench: %s\n", err.msg);
        if (json) fclose(json);
        free(bn);
        return 2;
    }
    bn->ids = malloc((size_t)o.prefill_chunk * sizeof *bn->ids);
    if (!bn->ids) rc = err_set(&err, "out of memory");
    SchedOptions so = {.max_seqs = b->batch, .max_batched_tokens = o.prefill_chunk, .no_prefix_cache = true,
                       .host_sampling = o.host_sampling};
    if (rc == 0 && scheduler_init(&bn->sched, &bn->rt.engine, &so, &err) == 0) bn->sched_ready = true;
    else rc = -1;
    if (rc == 0) rc = bench_run(bn, &err);
    if (rc == 0) print_table(bn);
    if (json) {
        if (rc == 0) rc = write_json(bn, json, &err);
        else fclose(json);
    }
    if (rc) fprintf(stderr, "cllm bench: %s\n", err.msg);
    free(bn->ids);
    if (bn->sched_ready) scheduler_free(&bn->sched);
    runtime_close(&bn->rt);
    free(bn);
    return rc ? 1 : 0;
}
