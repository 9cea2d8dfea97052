/* perplexity.c — `cllm perplexity` (perplexity.h): the windows, the forward
 * pass over one sequence's KV blocks, log-softmax in double on the host. */
#include "app/perplexity.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app/kl_stats.h"
#include "app/logits_file.h"

/* ---------- windows ---------- */

void ppl_windows_init(PplWindows *it, int64_t n, int ctx, int stride) {
    *it = (PplWindows){n, 0, 0, ctx, stride, n < 2 || ctx < 1 || stride < 1};
}

bool ppl_windows_next(PplWindows *it, PplWindow *w) {
    while (!it->done && it->begin < it->n) {
        int64_t begin = it->begin, end = begin + it->ctx < it->n ? begin + it->ctx : it->n;
        int64_t first = it->prev_end > begin + 1 ? it->prev_end : begin + 1;
        it->prev_end = end;
        it->begin += it->stride;
        if (end == it->n) it->done = true; /* HF stops at the window that reaches the end */
        if (first < end) { *w = (PplWindow){begin, end, first}; return true; }
    }
    it->done = true;
    return false;
}

int64_t ppl_n_scored(int64_t n, int ctx, int stride) {
    PplWindows it;
    PplWindow w;
    int64_t s = 0;
    ppl_windows_init(&it, n, ctx, stride);
    while (ppl_windows_next(&it, &w)) s += w.end - w.first;
    return s;
}

int ppl_check(int64_t n, int ctx, int stride, Err *err) {
    if (ctx < 2) return err_set(err, "--ctx %d: a window needs at least 2 tokens", ctx);
    if (stride < 1 || stride > ctx)
        return err_set(err, "--stride %d: must be in [1, --ctx %d] (a larger stride would leave tokens unscored)",
                       stride, ctx);
    if (n < 2) return err_set(err, "the text is %lld token(s) long: perplexity needs at least 2", (long long)n);
    return 0;
}

/* ---------- the run ---------- */

typedef struct {
    Engine *e;
    int vocab;
    const int32_t *ids;
    float *logits;           /* [chunk][vocab] */
    double *logp, *ref_logp; /* [vocab] */
    int32_t *pos, *seq, *rows;
    int64_t *slot;
    double nll_sum;
    int64_t n_scored;
    /* --save-logits */
    FILE *save;
    const char *save_path;
    uint16_t *scratch;
    /* --kl-divergence */
    FILE *ref;
    const char *ref_path;
    LogitsRow row;
    bool bad_ref;            /* a row of the file was refused: bad input (exit 2) */
    KlStats kl;
} PplRun;

/* log-softmax of one row, in double. */
static int log_softmax(const float *x, int n, double *out, Err *err) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < n; v++) {
        if (!isfinite(x[v])) return err_set(err, "logit %d is %g: the forward pass broke", v, x[v]);
        if (x[v] > m) m = x[v];
    }
    for (int v = 0; v < n; v++) s += exp((double)x[v] - m);
    double lse = m + log(s);
    for (int v = 0; v < n; v++) out[v] = (double)x[v] - lse;
    return 0;
}

/* One scored position: the row of logits that predicts target. */
static int score_row(PplRun *r, const float *logits, int32_t target, Err *err) {
    if (log_softmax(logits, r->vocab, r->logp, err)) return -1;
    r->nll_sum -= r->logp[target];
    if (r->save && logits_file_write_row(r->save, r->save_path, r->logp, r->vocab, target, r->scratch, err)) return -1;
    if (r->ref) {
        if (logits_file_read_row(r->ref, r->ref_path, r->n_scored, r->vocab, &r->row, err)) {
            r->bad_ref = true;
            return -1;
        }
        logits_row_logp(&r->row, r->vocab, r->ref_logp);
        kl_stats_add(&r->kl, r->ref_logp, r->logp, r->vocab, target, r->row.target_logp, r->row.top1);
    }
    r->n_scored++;
    return 0;
}

/* Tokens [start, start + n) of window w as one forward step over the
 * sequence's blocks bt; scores the rows whose next token is a target. */
static int run_chunk(PplRun *r, const PplWindow *w, const BlockTable *bt, int start, int n, Err *err) {
    int bs = r->e->block_size, k = 0;
    for (int i = 0; i < n; i++) {
        int64_t p = w->begin + start + i; /* the row predicts ids[p + 1] */
        r->pos[i] = start + i;            /* positions count from the window's start */
        r->seq[i] = 0;
        r->slot[i] = block_table_slot(bt, start + i, bs);
        if (p + 1 >= w->first && p + 1 < w->end) r->rows[k++] = i;
    }
    const int32_t *tables[1] = {bt->blocks};
    AttnBatch b = {n, r->pos, r->seq, r->slot, 1, tables, bs};
    if (engine_forward(r->e, r->ids + w->begin + start, &b, r->rows, k, k ? r->logits : NULL, err)) return -1;
    for (int j = 0; j < k; j++)
        if (score_row(r, r->logits + (size_t)j * r->vocab, r->ids[w->begin + start + r->rows[j] + 1], err)) return -1;
    return 0;
}

/* One window from an empty cache: blocks taken from the engine's pool and
 * given back at the end. */
static int run_window(PplRun *r, const PplWindow *w, int max_rows, Err *err) {
    BlockTable bt = {0};
    int len = (int)(w->end - w->begin), rc = 0;
    if (block_table_reserve(&bt, &r->e->pool, len, r->e->block_size))
        rc = err_set(err, "KV cache full: no room for a window of %d tokens", len);
    for (int start = 0; rc == 0 && start < len;) {
        int n = engine_prompt_chunk(len - start, max_rows, max_rows);
        rc = run_chunk(r, w, &bt, start, n, err);
        start += n;
    }
    block_table_release(&bt, &r->e->pool);
    block_table_free(&bt);
    return rc;
}

static int run_alloc(PplRun *r, int max_rows, Err *err) {
    size_t V = (size_t)r->vocab, R = (size_t)max_rows;
    r->logits = malloc(R * V * sizeof *r->logits);
    r->logp = malloc(V * sizeof *r->logp);
    r->ref_logp = malloc(V * sizeof *r->ref_logp);
    r->scratch = malloc(V * sizeof *r->scratch);
    r->row.q = malloc(V * sizeof *r->row.q);
    r->pos = malloc(R * sizeof *r->pos);
    r->seq = malloc(R * sizeof *r->seq);
    r->rows = malloc(R * sizeof *r->rows);
    r->slot = malloc(R * sizeof *r->slot);
    if (r->logits && r->logp && r->ref_logp && r->scratch && r->row.q && r->pos && r->seq && r->rows && r->slot)
        return 0;
    return err_set(err, "out of memory for %d rows of %d logits", max_rows, r->vocab);
}

static void run_free(PplRun *r) {
    free(r->logits);
    free(r->logp);
    free(r->ref_logp);
    free(r->scratch);
    free(r->row.q);
    free(r->pos);
    free(r->seq);
    free(r->rows);
    free(r->slot);
    kl_stats_free(&r->kl);
}

/* Every window; -v prints each one's figures. */
static int run_windows(PplRun *r, int64_t n, int ctx, int stride, bool verbose, Err *err) {
    Engine *e = r->e;
    int max_rows = e->max_chunk < e->fw.max_logits ? e->max_chunk : e->fw.max_logits;
    if (run_alloc(r, max_rows, err)) return -1;
    PplWindows it;
    PplWindow w;
    ppl_windows_init(&it, n, ctx, stride);
    for (int k = 0; ppl_windows_next(&it, &w); k++) {
        double nll0 = r->nll_sum;
        int64_t s0 = r->n_scored;
        if (run_window(r, &w, max_rows, err)) return -1;
        double mean = (r->nll_sum - nll0) / (double)(r->n_scored - s0);
        if (verbose)
            fprintf(stderr, "window %d: tokens [%lld, %lld), %lld scored, mean NLL %.6f, perplexity %.4f\n", k,
                    (long long)w.begin, (long long)w.end, (long long)(r->n_scored - s0), mean, exp(mean));
    }
    return 0;
}

/* ---------- inputs ---------- */

static int read_text(const char *path, char **text, size_t *len, Err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, got;
    char *t = malloc(cap);
    while (t && (got = fread(t + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) { char *g = realloc(t, cap *= 2); if (!g) { free(t); t = NULL; } else t = g; }
    }
    int bad = t ? ferror(f) : 1;
    fclose(f);
    if (bad) { free(t); return err_set(err, "%s: read failed", path); }
    *text = t;
    *len = n;
    return 0;
}

/* The reference file's header (before the model loads: ctx and stride come from it). */
static int open_reference(const char *path, FILE **f, LogitsHeader *h, Err *err) {
    struct stat st;
    if (!(*f = fopen(path, "rb"))) return err_set(err, "%s: %s", path, strerror(errno));
    if (fstat(fileno(*f), &st) == 0 &&
        logits_file_read_header(*f, path, (int64_t)st.st_size, ppl_n_scored, h, err) == 0)
        return 0;
    if (!err->msg[0]) err_set(err, "%s: cannot stat", path);
    fclose(*f);
    *f = NULL;
    return -1;
}

/* The text's ids must be the reference's: same tokenizer, same text. */
static int check_same_ids(const TokenIds *ids, const LogitsHeader *h, const char *path, int vocab, Err *err) {
    if (h->vocab != vocab)
        return err_set(err, "%s: vocabulary of %d, this model's is %d: not comparable", path, h->vocab, vocab);
    int64_t n = (int64_t)ids->n < h->n_tokens ? (int64_t)ids->n : h->n_tokens;
    for (int64_t i = 0; i < n; i++)
        if (ids->ids[i] != h->ids[i])
            return err_set(err, "%s: token %lld differs: %d here, %d in the file (another tokenizer or text?)", path,
                           (long long)i, ids->ids[i], h->ids[i]);
    if ((int64_t)ids->n != h->n_tokens)
        return err_set(err, "%s: %lld tokens in the file, the text gives %zu (another text?)", path,
                       (long long)h->n_tokens, ids->n);
    return 0;
}

/* ---------- the command ---------- */

typedef struct {
    const PerplexityOptions *o;
    Runtime rt;
    bool rt_open;
    char *text;
    size_t len;
    TokenIds ids;
    LogitsHeader ref_h;
    PplRun run;
    int ctx, stride;
} PplCmd;

static int open_save(PplCmd *c, Err *err) {
    PplRun *r = &c->run;
    if (!(r->save = fopen(c->o->save_logits, "wb"))) return err_set(err, "%s: %s", c->o->save_logits, strerror(errno));
    r->save_path = c->o->save_logits;
    LogitsHeader h = {r->vocab, c->ctx, c->stride, (int64_t)c->ids.n, ppl_n_scored((int64_t)c->ids.n, c->ctx, c->stride),
                      c->ids.ids};
    return logits_file_write_header(r->save, r->save_path, &h, err);
}

/* Loads, tokenizes, checks; returns 2 for bad input (nothing ran). */
static int ppl_prepare(PplCmd *c, Err *err) {
    const PerplexityOptions *o = c->o;
    if (o->kl_file && open_reference(o->kl_file, &c->run.ref, &c->ref_h, err)) return 2;
    c->run.ref_path = o->kl_file;
    c->ctx = o->kl_file ? c->ref_h.ctx : o->ctx;
    c->stride = o->kl_file ? c->ref_h.stride : o->stride;
    if (read_text(o->file, &c->text, &c->len, err)) return 2;
    RunOptions ro = o->run;
    ro.ctx_size = c->ctx > 0 ? c->ctx : 0;
    if (runtime_open(&c->rt, &ro, err)) return 2;
    c->rt_open = true;
    const ModelConfig *cfg = &c->rt.model.cfg;
    if (c->ctx <= 0) c->ctx = cfg->ctx_len < 512 ? cfg->ctx_len : 512;
    if (c->ctx > cfg->ctx_len)
        return err_set(err, "--ctx %d: longer than the model's context of %d tokens", c->ctx, cfg->ctx_len), 2;
    if (c->stride <= 0) c->stride = c->ctx;
    const Tokenizer *tok = c->rt.model.tok;
    if (tokenizer_encode(tok, c->text, c->len, false, tokenizer_add_bos(tok), &c->ids, err)) return 2;
    if (ppl_check((int64_t)c->ids.n, c->ctx, c->stride, err)) return 2;
    if (o->kl_file && check_same_ids(&c->ids, &c->ref_h, o->kl_file, cfg->vocab, err)) return 2;
    c->run.vocab = cfg->vocab;
    c->run.e = &c->rt.engine;
    c->run.ids = c->ids.ids;
    if (o->kl_file && kl_stats_init(&c->run.kl, c->ref_h.n_scored, err)) return 1;
    if (o->save_logits && open_save(c, err)) return 2;
    return 0;
}

static void ppl_report(PplCmd *c) {
    PplRun *r = &c->run;
    double mean = r->nll_sum / (double)r->n_scored;
    printf("text: %s, %zu tokens (%s)\n", c->o->file, c->ids.n,
           tokenizer_add_bos(c->rt.model.tok) ? "BOS added by the model's tokenizer" : "no BOS: the model adds none");
    printf("windows: ctx %d, stride %d; %lld tokens scored\n", c->ctx, c->stride, (long long)r->n_scored);
    printf("mean NLL: %.8f\n", mean);
    printf("perplexity: %.6f\n", exp(mean));
    if (r->ref) kl_stats_print(&r->kl, stdout, mean);
    if (c->o->save_logits) printf("saved: %s\n", c->o->save_logits);
}

static void ppl_close(PplCmd *c) {
    if (c->run.ref) fclose(c->run.ref);
    run_free(&c->run);
    logits_header_free(&c->ref_h);
    token_ids_free(&c->ids);
    free(c->text);
    if (c->rt_open) runtime_close(&c->rt);
}

int perplexity_main(const PerplexityOptions *o) {
    PplCmd c = {.o = o};
    Err err = {{0}};
    int rc = ppl_prepare(&c, &err);
    if (rc == 0 && run_windows(&c.run, (int64_t)c.ids.n, c.ctx, c.stride, o->run.verbose, &err))
        rc = c.run.bad_ref ? 2 : 1;
    if (c.run.save && fclose(c.run.save) && rc == 0) {
        err_set(&err, "%s: write failed", o->save_logits);
        rc = 1;
    }
    if (c.run.save && rc) remove(o->save_logits); /* never leave a cut-short file behind */
    c.run.save = NULL;
    if (rc == 0) ppl_report(&c);
    else fprintf(stderr, "cllm perplexity: %s\n", err.msg);
    ppl_close(&c);
    return rc;
}
