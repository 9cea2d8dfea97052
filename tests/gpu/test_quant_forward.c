/* test_quant_forward.c — quantized weights kept quantized on the GPU (issue 7)
 * against the same file dequantized to bf16 at load (BackendOptions.bf16_weights,
 * the path before issue 7). Run by tests/gpu/run.sh; never in CI.
 *
 *   test_quant_forward [--positions N] [--raw-min F] [--text FILE] [--forced FIXTURE MODEL.gguf]... MODEL.gguf...
 *
 * --forced FIXTURE (tests/fixtures/make_real_forced.py: transformers in fp32 on
 * the file's exact weights, one forward over 1000 tokens of README) applies to
 * the model after it: the fixture's ids are fed, and both paths' argmax is
 * also compared with transformers' top-1. Both GPU paths round (the bf16
 * path rounds the weights, the quantized one the activations where it takes
 * int8), so each parts from the exact answer at near-ties (on the real files
 * 1-1.2% of positions, every one a margin under 0.11 logits), and their
 * agreement with each other sits at the same ~99%. Checked: the quantized
 * path agrees with transformers at >= 99% of the positions whose margin is
 * clear (> HF_TIE), and at no fewer positions than the bf16 path less
 * HF_SLACK.
 *
 * --raw-min 0.99 is the check as written, for real models (SmolLM2
 * Q4_1, Gemma 3 Q4_K_M: tests/gpu/run.sh's real-model block): every
 * position counts, near-ties included; with --text the ids are a text's
 * tokens (random ids leave even a real model's logits flat: 94.8-95.9% raw
 * there, every flip a near-tie within 1.5e-3 of max |logit|).
 *
 * For each file: both backends are fed the same pseudo-random token ids
 * (teacher forcing: neither sees its own choices), one token per step
 * (the quantized GEMVs at T = 1, graphed), in steps of 5 (the GEMVs at T =
 * 5) and of 64 (quant_gemm where the GPU runs it, else dequantize to bf16 +
 * cuBLASLt), and the argmax of each step's last logits row is compared.
 * The issue asks >= 99% top-1 agreement over a few hundred positions. What the two paths differ by is rounding (fp32 sums in
 * another order; bf16 rounding of the dequantized weights on the bf16 path):
 * the weights are the same numbers. Random-weight models amplify rounding
 * (transformers' own bf16 run is up to 6.45e-2 of max |logit| from its
 * fp32 one on tiny llama: tests/gpu/test_cuda_forward.c BF16_REF), and
 * their top-1 margins are small, so on them the checks are: top-1 agrees
 * at >= 99% of the positions that are not near-ties (the bf16 path's margin
 * between the two tokens above NEAR_TIE = 1.5 x 6.45e-2 of max |logit|,
 * the same 1.5x that test_cuda_forward allows), and >= MIN_RAW of all
 * positions (a wrong block layout, scale or row order collapses agreement
 * to chance, 1/vocab). The raw share is printed; real models (the issue's
 * SmolLM2 / Gemma 3 files) have margins far above rounding. Also checked:
 * the quantized backend holds fewer device bytes than bf16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/ref/ref_engine.h"
#include "tests/test.h"

#define MIN_AGREE 0.99
#define NEAR_TIE 9.7e-2  /* 1.5 x 6.45e-2 of max |logit| */
#define MIN_RAW 0.75
#define HF_TIE 0.05   /* a transformers top-1 margin (logits) at or below which either token is a fair answer */
#define HF_SLACK 0.005 /* 6 of 1216 positions: the two paths' counts differ by 1-3 on the real files */

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static Backend *make_backend(const Model *m, bool bf16, Err *err) {
    GpuRig g = {.block_size = 16, .n_blocks = 128, .max_tokens = 64, .bf16_weights = bf16, .kv_dtype = KV_DTYPE_BF16};
    return gpu_backend(&m->shape, &m->w, &g, err);
}

/* Feeds ids[0..n) in steps of `step` to both engines; counts the steps
 * whose last-row argmax agrees, and the largest logit difference relative
 * to the row's max |logit|. */
typedef struct { /* a transformers fp32 run on the file's exact weights (--forced): top1[i] predicts ids[i+1] */
    const int32_t *top1;
    const float *margin;
    int q, b, total;   /* positions where the quantized / bf16 path's argmax is transformers' */
    int q_clear, b_clear, clear; /* the same where transformers' margin is not a near-tie (HF_TIE) */
} HfTally;

static void compare_steps(Engine *eq, Engine *eb, const int32_t *ids, int n, int step, int V, int *agree,
                          int *total, int *ties, double *worst, HfTally *hf, Err *err) {
    Sequence sq = {0}, sb = {0};
    for (int done = 0; done < n;) {
        int k = n - done < step ? n - done : step;
        if (engine_feed(eq, &sq, ids + done, k, err) || engine_feed(eb, &sb, ids + done, k, err)) {
            CHECK(0, "%s", err->msg);
            break;
        }
        done += k;
        int a = argmax(sq.logits, V), b = argmax(sb.logits, V);
        double top = 0, d = 0;
        for (int i = 0; i < V; i++) {
            top = fmax(top, fabs(sb.logits[i]));
            d = isnan(sq.logits[i]) ? INFINITY : fmax(d, fabs(sq.logits[i] - sb.logits[i]));
        }
        *worst = fmax(*worst, d / (top > 0 ? top : 1));
        *agree += a == b;
        (*total)++;
        *ties += a != b && (sb.logits[b] - sb.logits[a]) <= NEAR_TIE * top;
        if (hf && hf->top1) {
            int want = hf->top1[done - 1];
            bool clear = hf->margin[done - 1] > HF_TIE;
            hf->q += a == want, hf->b += b == want, hf->total++;
            hf->q_clear += clear && a == want, hf->b_clear += clear && b == want, hf->clear += clear;
            if (a != want || b != want)
                printf("# step %d: transformers %d (margin %.4f), quantized %d, bf16 path %d\n", *total, want,
                       hf->margin[done - 1], a, b);
        }
        if (a != b)
            printf("# step %d (%d tokens): quantized %d (%.4f; bf16 path %.4f), bf16 path %d (%.4f); margin %.2e of "
                   "max |logit|\n", *total, k, a, sq.logits[a], sb.logits[a], b, sb.logits[b],
                   (sb.logits[b] - sb.logits[a]) / (top > 0 ? top : 1));
    }
    sequence_release(eq, &sq);
    sequence_release(eb, &sb);
}

/* The ids of text_path's first n tokens (the model's tokenizer), or -1. */
static int text_ids(const Model *m, const char *text_path, int32_t *ids, int n, Err *err) {
    FILE *f = fopen(text_path, "rb");
    if (!f) return err_set(err, "%s: cannot open", text_path);
    char *buf = malloc(1 << 20);
    size_t len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    TokenIds t = {0};
    int rc = buf ? tokenizer_encode(m->tok, buf, len, false, true, &t, err) : err_set(err, "out of memory");
    free(buf);
    if (rc == 0 && (int)t.n < n) rc = err_set(err, "%s: %zu tokens, %d wanted", text_path, t.n, n);
    if (rc == 0) memcpy(ids, t.ids, (size_t)n * sizeof *ids);
    token_ids_free(&t);
    return rc;
}

/* The ids, top1 and margins of a make_real_forced.py fixture into hf (n: positions wanted, cut to the
 * fixture's); ids gets n + 1 ids. Checks the fixture names a file of path's size. */
static int read_forced(const char *fixture, const char *path, int32_t **ids, HfTally *hf, int *n, Err *err) {
    Json *doc = json_parse_file(fixture, err);
    if (!doc) return -1;
    const JsonValue *r = json_root(doc), *jid = json_get(r, "ids"), *jt = json_get(r, "top1"),
                    *jm = json_get(r, "margin");
    FILE *f = fopen(path, "rb");
    long size = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (f) fclose(f);
    int rc = 0, len = (int)json_len(jt);
    if (size != json_get_int(r, "gguf_bytes", -2)) rc = err_set(err, "%s: made for another file than %s", fixture, path);
    else if (len < 1 || (int)json_len(jm) != len || (int)json_len(jid) != len + 1)
        rc = err_set(err, "%s: ids, top1 and margin do not fit together", fixture);
    if (rc == 0) {
        if (*n > len) *n = len;
        int32_t *t = malloc(*n * sizeof *t);
        float *m = malloc(*n * sizeof *m);
        for (int i = 0; i < *n; i++) {
            t[i] = (int32_t)json_at(jt, i)->u.number.num;
            m[i] = (float)json_at(jm, i)->u.number.num;
        }
        for (int i = 0; i <= *n; i++) (*ids)[i] = (int32_t)json_at(jid, i)->u.number.num;
        hf->top1 = t, hf->margin = m;
    }
    json_free(doc);
    return rc;
}

static void check_file(const char *path, int positions, double min_raw, const char *text, const char *forced) {
    Err err = {{0}};
    Model m;
    if (model_load(&m, path, text ? 0 : MODEL_LOAD_NO_TOKENIZER, &err)) { CHECK(0, "%s", err.msg); return; }
    Backend *bq = make_backend(&m, false, &err);
    Backend *bb = bq ? make_backend(&m, true, &err) : NULL;
    Engine eq, eb;
    bool ok = bq && bb && engine_init(&eq, &m, bq, 2048, 64, &err) == 0;
    ok = ok && engine_init(&eb, &m, bb, 2048, 64, &err) == 0;
    CHECK(ok, "%s: %s", path, err.msg);
    if (!ok) { if (bq) bq->destroy(bq); if (bb) bb->destroy(bb); model_free(&m); return; }
    uint64_t wq = bq->weight_bytes, wb = bb->weight_bytes;
    printf("# %s: weights on the GPU %.1f MiB quantized, %.1f MiB bf16\n", path, wq / 1048576.0, wb / 1048576.0);
    CHECK(wq < wb, "%s: the quantized backend holds %llu bytes, not fewer than bf16's %llu", path,
          (unsigned long long)wq, (unsigned long long)wb);
    int V = m.cfg.vocab, n = positions;
    if (n > m.cfg.ctx_len - 1) n = m.cfg.ctx_len - 1;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    HfTally hf = {0};
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) { x = x * 1664525u + 1013904223u; ids[i] = (int32_t)((x >> 8) % (uint32_t)V); }
    if (forced && read_forced(forced, path, &ids, &hf, &n, &err)) CHECK(0, "%s", err.msg);
    else if (!forced && text && text_ids(&m, text, ids, n, &err)) CHECK(0, "%s", err.msg);
    printf("# %s: %d positions of %s\n", path, n, forced ? forced : text ? text : "pseudo-random ids");
    const int steps[3] = {1, 5, 64};
    int agree_all = 0, total_all = 0, ties_all = 0;
    for (int s = 0; s < 3; s++) {
        int agree = 0, total = 0, ties = 0;
        double worst = 0;
        compare_steps(&eq, &eb, ids, n, steps[s], V, &agree, &total, &ties, &worst, &hf, &err);
        printf("# %s steps of %2d: top-1 agrees at %d of %d (%.1f%%), %d of the others near-ties; largest logit "
               "difference %.2e of max |logit|\n", path, steps[s], agree, total, 100.0 * agree / (total ? total : 1),
               ties, worst);
        agree_all += agree;
        total_all += total;
        ties_all += ties;
    }
    double raw = (double)agree_all / (total_all ? total_all : 1);
    double clear = (double)agree_all / (total_all - ties_all > 0 ? total_all - ties_all : 1);
    printf("# %s: top-1 agreement %.2f%% raw, %.2f%% of the %d positions that are not near-ties\n", path, 100 * raw,
           100 * clear, total_all - ties_all);
    CHECK(total_all > 0 && raw >= min_raw && clear >= MIN_AGREE, "%s: top-1 agreement %.2f%% raw (want >= %.0f%%), "
          "%.2f%% without near-ties (want >= %.0f%%)", path, 100 * raw, 100 * min_raw, 100 * clear, 100 * MIN_AGREE);
    if (hf.top1) {
        printf("# %s: against transformers (fp32, the file's exact weights): quantized %d, bf16 path %d of %d "
               "positions; where its margin > %.2f: quantized %d, bf16 path %d of %d\n", path, hf.q, hf.b, hf.total,
               HF_TIE, hf.q_clear, hf.b_clear, hf.clear);
        /* Which path rounds further from the file's own numbers: the quantized one may not be the worse
         * by more than HF_SLACK of the positions, and agrees with transformers wherever its top-1 is
         * clear (a wrong scale or block layout fails both at once). */
        CHECK(hf.q >= hf.b - HF_SLACK * hf.total, "%s: quantized path %d, bf16 path %d of %d positions agree with "
              "transformers", path, hf.q, hf.b, hf.total);
        CHECK(hf.q_clear >= MIN_AGREE * hf.clear, "%s: quantized path agrees with transformers at %d of the %d "
              "positions whose margin is > %.2f (want >= %.0f%%)", path, hf.q_clear, hf.clear, HF_TIE, 100 * MIN_AGREE);
        free((void *)hf.top1);
        free((void *)hf.margin);
    }
    free(ids);
    engine_free(&eq);
    engine_free(&eb);
    bq->destroy(bq);
    bb->destroy(bb);
    model_free(&m);
}

int main(int argc, char **argv) {
    int positions = 300, n_files = 0;
    double min_raw = MIN_RAW;
    const char *text = NULL;  /* --text FILE: teacher-force that text's tokens (real models) */
    const char *forced = NULL; /* --forced FIXTURE: the next model's ids and transformers' top-1 from a fixture */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--positions") && i + 1 < argc) { positions = atoi(argv[++i]); continue; }
        if (!strcmp(argv[i], "--raw-min") && i + 1 < argc) { min_raw = atof(argv[++i]); continue; }
        if (!strcmp(argv[i], "--text") && i + 1 < argc) { text = argv[++i]; continue; }
        if (!strcmp(argv[i], "--forced") && i + 1 < argc) { forced = argv[++i]; continue; }
        test_failed_checks = 0;
        check_file(argv[i], positions, min_raw, text, forced);
        forced = NULL;
        printf("%s - quantized vs bf16 weights: %s\n", test_failed_checks ? "not ok" : "ok", argv[i]);
        test_failed_tests += test_failed_checks > 0;
        n_files++;
    }
    if (n_files == 0) { printf("usage: test_quant_forward [--positions N] MODEL.gguf...\n"); return 2; }
    TEST_EXIT();
}
