/* test_tp.c — the CUDA backend as a tensor-parallel rank
 * (kernels/cuda/backend_cuda_tp.cu), on every transport this machine has
 * (run by tests/gpu/run.sh; never in CI):
 *
 *   - the collectives alone: N = 2 and 4 ranks of a model with a vocabulary
 *     of 301 (an uneven split: 150 | 151, 75 | 75 | 75 | 76), a thread each;
 *     every rank's all_reduce of a bf16 and an fp32 buffer must read the
 *     host's rank-order fp32 sum (rounded once to bf16) bit for bit, and its
 *     all_gather every rank's logits in their columns. Host transport: all
 *     ranks on GPU 0; NCCL: ranks on GPUs 0..N-1 where there are N (and
 *     --tp-nccl-sum: ncclAllReduce, within a bf16 rounding of the sum); NCCL
 *     runs twice: with every reduce through it (CLLM_TP_PEER=off) and with
 *     the small ones summed over NVLink peers (tp_peer_sum.cu), both exact;
 *   - the forward: the tiny dense models (and the 301-token one), one
 *     sequence's steps (a 13-token prompt in chunks of 5, then 6 decode
 *     steps: CUDA graphs on NCCL ranks), N ranks against one GPU: each
 *     step's logits within TP_TOL of the row's largest and the same argmax
 *     unless one GPU's top two are nearer than that (TP_TOL_NCCL_SUM with
 *     --tp-nccl-sum, whose bf16 parts add a rounding each; the ranks' products
 *     are summed in another order, then rounded to bf16 as one GPU rounds
 *     its own: a rounding may flip, and these random models amplify it);
 *     NCCL's logits equal the host transport's bit for bit (the same
 *     kernels and the same rank-order sums).
 *
 *   test_tp [--quick]   (--quick: N = 2 on GPU 0 only, llama only: for compute-sanitizer)
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dtype.h"
#include "model/forward.h"
#include "model/model.h"
#include "parallel/tp.h"
#include "tests/gpu/gpu_backend.h"
#include "tests/one_seq_steps.h"
#include "tests/test.h"

#define TP_TOL 3e-2  /* max |tp - one GPU| / max |one GPU| of a step's logits */
/* --tp-nccl-sum: bf16 parts and NCCL's order add a rounding per rank; as far as one GPU's bf16 logits may be
 * from fp32 ones on these models (tests/gpu/test_cuda_forward.c TOL) */
#define TP_TOL_NCCL_SUM 6e-2
#define ROWS 5       /* rows of the collectives' buffers */

static int g_quick, g_gpus;
static char g_dir[64];  /* the 301-token model's config folder */

/* VIA_NCCL: NCCL for every reduce (CLLM_TP_PEER=off); VIA_PEER: the default, small reduces by the one-shot sum
 * over NVLink peers (tp_peer_sum.cu) where the GPUs map each other's memory */
typedef enum { VIA_HOST, VIA_NCCL, VIA_PEER, VIA_NCCL_SUM } Via;
static const char *via_name(Via v) {
    return v == VIA_HOST ? "host memory" : v == VIA_NCCL ? "NCCL" : v == VIA_PEER ? "NCCL + peers" : "NCCL sum";
}

/* A config-only model (random weights made in memory): 4 heads, 2 KV heads, vocabulary 301. */
static bool make_dummy_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/cllm-test-tp-XXXXXX");
    if (!mkdtemp(g_dir)) return false;
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 128, "
               "\"intermediate_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
               "\"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 301, \"max_position_embeddings\": 256, "
               "\"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}\n");
    return fclose(f) == 0;
}

static bool load(Model *m, const char *name) {
    Err err = {{0}};
    char path[1024];
    int rc;
    if (!strcmp(name, "dummy-301")) {
        rc = model_load_dummy(m, g_dir, MODEL_LOAD_NO_TOKENIZER, DT_BF16, &err);
    } else {
        snprintf(path, sizeof path, "%s/tiny/%s", test_fixture_dir(), name);
        rc = model_load(m, path, MODEL_LOAD_NO_TOKENIZER, &err);
    }
    CHECK(rc == 0, "%s: %s", name, err.msg);
    return rc == 0;
}

/* The ranks of model m over n ranks by `via`, on one sequence's KV blocks. */
static bool open_ranks(TpRanks *t, const Model *m, int n, Via via, Err *err) {
    BackendOptions bo = {.device = 0, .block_size = ONE_SEQ_BLOCK, .n_blocks = ONE_SEQ_N_BLOCKS,
                         .max_tokens = ONE_SEQ_MAX_T, .mem_util = 0.9f, .tp_nccl_sum = via == VIA_NCCL_SUM};
    forward_buffer_elems(&m->cfg, ONE_SEQ_MAX_T, &bo.act_elems, &bo.f32_elems);
    TpPlacement where;
    setenv("CLLM_TP_PEER", via == VIA_NCCL ? "off" : "on", 1); /* read as each rank's backend is made */
    if (via == VIA_HOST) {
        placement_same(0, n, &where);
    } else {
        int dev[TP_MAX];
        for (int r = 0; r < n; r++) dev[r] = r;
        placement_group(dev, n, 0, n, &where);
        where.timeout_s = 60;
    }
    if (tp_ranks_open(t, &m->cfg, &m->shape, &m->w, n, &bo, &where, "the model", err)) return false;
    if (via != VIA_HOST && !t->links) return err_set(err, "NCCL asked for, not used: %s", t->note), false;
    for (int r = 0; via == VIA_PEER && r < n; r++)
        if (!backend_cuda_tp_peers(t->be[r])) return err_set(err, "rank %d: no NVLink peer sums", r), false;
    return true;
}

static void close_ranks(TpRanks *t) {
    Backend *b0 = t->be[0];
    tp_ranks_free(t);
    if (b0) b0->destroy(b0);
}

/* ---------- the collectives alone ---------- */

static float value_of(int rank, int64_t i) { return sinf(0.37f * (float)i + 1.3f * (float)rank) * (float)(rank + 1); }

typedef struct {
    Backend *be;
    TpGroup *group;                /* broken when this rank cannot take part: the others stop waiting */
    int rank, n, V, cols, dim;
    float *act, *f32, *gathered;   /* what the rank read back */
    Err err;
    int rc;
} RankJob;

static int run_collectives(RankJob *j, Err *err) {
    Backend *be = j->be;
    int64_t n = (int64_t)ROWS * j->dim;
    float *in = malloc((size_t)(n > (int64_t)ROWS * j->cols ? n : (int64_t)ROWS * j->cols) * sizeof *in);
    void *a = be->alloc(be, n, BUF_ACT), *f = be->alloc(be, n, BUF_F32);
    void *src = be->alloc(be, (int64_t)ROWS * j->cols, BUF_F32), *dst = be->alloc(be, (int64_t)ROWS * j->V, BUF_F32);
    int rc = in && a && f && src && dst ? 0 : err_set(err, "rank %d: no memory", j->rank);
    for (int64_t i = 0; rc == 0 && i < n; i++) in[i] = value_of(j->rank, i);
    if (rc == 0) rc = be->write(be, a, in, n, err) || be->write(be, f, in, n, err);
    for (int64_t i = 0; rc == 0 && i < (int64_t)ROWS * j->cols; i++) in[i] = (float)(j->rank * 1000) + (float)i * 0.25f;
    if (rc == 0) rc = be->write(be, src, in, (int64_t)ROWS * j->cols, err);
    if (rc) tp_group_abort(j->group);
    if (rc == 0) {
        be->all_reduce(be, a, n, BUF_ACT);
        be->all_reduce(be, f, n, BUF_F32);
        be->all_gather(be, dst, src, ROWS, j->cols);
        rc = be->read(be, j->act, a, n, err) || be->read(be, j->f32, f, n, err) ||
             be->read(be, j->gathered, dst, (int64_t)ROWS * j->V, err);
    }
    void *bufs[] = {a, f, src, dst};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) be->release(be, bufs[i]);
    free(in);
    return rc ? -1 : 0;
}

static void *rank_thread(void *arg) {
    RankJob *j = arg;
    j->rc = run_collectives(j, &j->err);
    return NULL;
}

static void check_collectives(int n, Via via) {
    Model m;
    Err err = {{0}};
    TpRanks t;
    if (!load(&m, "dummy-301")) return;
    if (!open_ranks(&t, &m, n, via, &err)) {
        CHECK(0, "--tp %d via %s: %s", n, via_name(via), err.msg);
        model_free(&m);
        return;
    }
    int V = m.cfg.vocab, dim = m.cfg.dim;
    int64_t nv = (int64_t)ROWS * dim;
    RankJob jobs[TP_MAX];
    pthread_t th[TP_MAX];
    for (int r = 0; r < n; r++) {
        jobs[r] = (RankJob){.be = t.be[r], .group = t.group, .rank = r, .n = n, .V = V, .cols = t.plan.n_vocab[r],
                            .dim = dim};
        jobs[r].act = malloc(nv * sizeof(float));
        jobs[r].f32 = malloc(nv * sizeof(float));
        jobs[r].gathered = malloc((size_t)ROWS * V * sizeof(float));
        pthread_create(&th[r], NULL, rank_thread, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    int bad_act = 0, bad_f32 = 0, bad_gather = 0, shown = 0;
    double worst_sum = 0;
    for (int r = 0; r < n; r++) {
        CHECK(jobs[r].rc == 0, "--tp %d via %s, rank %d: %s", n, via_name(via), r, jobs[r].err.msg);
        if (jobs[r].rc) continue;
        for (int64_t i = 0; i < nv; i++) {
            float sa = bf16_to_fp32(fp32_to_bf16(value_of(0, i))), sf = value_of(0, i);
            double mag = fabs(value_of(0, i));
            for (int k = 1; k < n; k++) {
                sa += bf16_to_fp32(fp32_to_bf16(value_of(k, i)));
                sf += value_of(k, i);
                mag += fabs(value_of(k, i));
            }
            float want_act = bf16_to_fp32(fp32_to_bf16(sa));
            if (via == VIA_NCCL_SUM) { /* NCCL's order: a few roundings, of the terms' size (sums may cancel) */
                double d = fabs((double)jobs[r].act[i] - want_act) / (mag > 0 ? mag : 1);
                worst_sum = d > worst_sum ? d : worst_sum;
                bad_act += d > 2e-2;
                bad_f32 += fabs((double)jobs[r].f32[i] - sf) > 1e-6 * (mag > 0 ? mag : 1);
            } else {
                bool off = memcmp(&jobs[r].act[i], &want_act, sizeof(float)) != 0;
                bad_act += off;
                bad_f32 += memcmp(&jobs[r].f32[i], &sf, sizeof(float)) != 0;
                if (off && shown++ < 4) /* what went wrong, for the log */
                    printf("#   rank %d value %lld: bf16 sum %.8g, want %.8g (rank 0's term %.8g, rank 1's %.8g)\n", r,
                           (long long)i, jobs[r].act[i], want_act, bf16_to_fp32(fp32_to_bf16(value_of(0, i))),
                           bf16_to_fp32(fp32_to_bf16(value_of(1, i))));
            }
        }
        for (int row = 0; row < ROWS; row++)
            for (int k = 0; k < n; k++)
                for (int c = 0; c < t.plan.n_vocab[k]; c++) {
                    float want = (float)(k * 1000) + (float)(row * t.plan.n_vocab[k] + c) * 0.25f;
                    bad_gather += jobs[r].gathered[(int64_t)row * V + t.plan.vocab0[k] + c] != want;
                }
    }
    printf("# --tp %d via %s: all_reduce bf16 %d, fp32 %d values off the rank-order sum%s; all_gather %d of %d "
           "columns misplaced\n", n, via_name(via), bad_act, bad_f32, via == VIA_NCCL_SUM ? " (tolerance)" : "",
           bad_gather, V);
    if (via == VIA_NCCL_SUM) printf("#   ncclAllReduce bf16: worst difference %.3g of the terms' magnitude\n", worst_sum);
    CHECK(bad_act == 0 && bad_f32 == 0 && bad_gather == 0, "--tp %d via %s: %d, %d, %d values wrong", n, via_name(via),
          bad_act, bad_f32, bad_gather);
    for (int r = 0; r < n; r++) {
        free(jobs[r].act);
        free(jobs[r].f32);
        free(jobs[r].gathered);
    }
    close_ranks(&t);
    model_free(&m);
}

/* ---------- the forward against one GPU ---------- */

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The gap between a row's two largest values, of its largest magnitude. */
static double top2_gap(const float *x, int n) {
    int b = argmax(x, n);
    double second = -INFINITY, mx = 0;
    for (int i = 0; i < n; i++) {
        if (i != b && x[i] > second) second = x[i];
        mx = fabs(x[i]) > mx ? fabs(x[i]) : mx;
    }
    return (x[b] - second) / (mx > 0 ? mx : 1);
}

/* The logits of every step of one sequence, [ONE_SEQ_STEPS][V]: one GPU
 * (t NULL) or the ranks of t. */
static bool run_steps(const Model *m, TpRanks *t, float *logits, Err *err) {
    const ModelConfig *c = &m->cfg;
    Forward fw = {0};
    Backend *be = NULL;
    GpuRig rig = {.block_size = ONE_SEQ_BLOCK, .n_blocks = ONE_SEQ_N_BLOCKS, .max_tokens = ONE_SEQ_MAX_T};
    if (!t && !(be = gpu_backend(&m->shape, &m->w, &rig, err))) return false;
    bool ok = forward_init(&fw, t ? tp_ranks_cfg(t) : c, t ? t->be[0] : be, ONE_SEQ_MAX_T, err) == 0;
    OneSeqSteps q;
    one_seq_init(&q, c->vocab, 7);
    for (int s = 0; ok && one_seq_next(&q); s++) {
        float *out = logits + (size_t)s * c->vocab;
        for (int i = 0; i < c->vocab; i++) out[i] = NAN;
        ForwardStep st = {q.ids, q.b, &q.row, 1, out};
        ok = (t ? tp_ranks_run(t, &fw, &st, err) : forward_run(&fw, q.ids, &q.b, &q.row, 1, out, err)) == 0;
    }
    if (fw.cfg) forward_free(&fw);
    if (be) be->destroy(be);
    return ok;
}

/* Steps whose logits are off by more than TP_TOL, or whose argmax differs
 * where one GPU's top two are apart by more than TP_TOL; the worst error. */
static int compare_steps(const float *got, const float *want, int V, double tol, double *worst, int *flips) {
    int bad = 0;
    *worst = 0;
    *flips = 0;
    for (int s = 0; s < ONE_SEQ_STEPS; s++) {
        const float *g = got + (size_t)s * V, *w = want + (size_t)s * V;
        double e = test_row_err(g, w, V);
        *worst = e > *worst ? e : *worst;
        bool flip = argmax(g, V) != argmax(w, V);
        *flips += flip;
        bad += e > tol || (flip && top2_gap(w, V) > tol);
    }
    return bad;
}

static void check_forward(const char *name, int n, const Via *vias, int n_vias) {
    Model m;
    Err err = {{0}};
    if (!load(&m, name)) return;
    int V = m.cfg.vocab;
    size_t bytes = (size_t)ONE_SEQ_STEPS * V * sizeof(float);
    float *one = malloc(bytes), *host = malloc(bytes), *got = malloc(bytes);
    bool ok = run_steps(&m, NULL, one, &err);
    CHECK(ok, "%s on one GPU: %s", name, err.msg);
    bool have_host = false;
    for (int i = 0; ok && i < n_vias; i++) {
        TpRanks t;
        float *out = vias[i] == VIA_HOST ? host : got;
        if (!open_ranks(&t, &m, n, vias[i], &err)) {
            CHECK(0, "%s --tp %d via %s: %s", name, n, via_name(vias[i]), err.msg);
            continue;
        }
        bool ran = run_steps(&m, &t, out, &err);
        CHECK(ran, "%s --tp %d via %s: %s", name, n, via_name(vias[i]), err.msg);
        close_ranks(&t);
        if (!ran) continue;
        double worst;
        int flips, bad = compare_steps(out, one, V, vias[i] == VIA_NCCL_SUM ? TP_TOL_NCCL_SUM : TP_TOL, &worst, &flips);
        printf("# %s --tp %d via %s: %d steps, largest logit error %.3g of the row's largest, %d argmax flips\n", name,
               n, via_name(vias[i]), ONE_SEQ_STEPS, worst, flips);
        CHECK(bad == 0, "%s --tp %d via %s: %d steps off one GPU's (worst %.3g)", name, n, via_name(vias[i]), bad,
              worst);
        if (vias[i] == VIA_HOST) have_host = true;
        if ((vias[i] == VIA_NCCL || vias[i] == VIA_PEER) && have_host) {
            int differ = 0;
            for (size_t k = 0; k < (size_t)ONE_SEQ_STEPS * V; k++) differ += memcmp(&got[k], &host[k], sizeof(float)) != 0;
            printf("#   %s vs host memory: %d of %zu logits differ in their bits\n", via_name(vias[i]), differ,
                   (size_t)ONE_SEQ_STEPS * V);
            CHECK(differ == 0, "%s --tp %d: %s's logits differ from the host transport's in %d values", name, n,
                  via_name(vias[i]), differ);
        }
    }
    free(one);
    free(host);
    free(got);
    model_free(&m);
}

/* The transports this machine has for n ranks. */
static int transports(int n, Via *vias) {
    int k = 0;
    vias[k++] = VIA_HOST;
    if (!g_quick && g_gpus >= n) {
        vias[k++] = VIA_NCCL;
        vias[k++] = VIA_PEER;
        vias[k++] = VIA_NCCL_SUM;
    } else if (!g_quick) {
        printf("# --tp %d over NCCL: skip: needs %d GPUs, this machine has %d\n", n, n, g_gpus);
    }
    return k;
}

static void test_collectives(void) {
    for (int n = 2; n <= (g_quick ? 2 : 4); n += 2) {
        Via vias[4];
        int k = transports(n, vias);
        for (int i = 0; i < k; i++) check_collectives(n, vias[i]);
    }
}

static void test_forward(void) {
    const char *all[] = {"llama.gguf", "gemma3.gguf", "llama-mlp-bias.gguf", "mistral.gguf", "qwen2.gguf",
                         "qwen3.gguf", "gemma2.gguf", "dummy-301"};
    int n_models = g_quick ? 1 : (int)(sizeof all / sizeof all[0]);
    for (int n = 2; n <= (g_quick ? 2 : 4); n += 2) {
        Via vias[4];
        int k = transports(n, vias);
        for (int i = 0; i < n_models; i++) check_forward(all[i], n, vias, k);
    }
}

int main(int argc, char **argv) {
    g_quick = argc > 1 && !strcmp(argv[1], "--quick");
    Err why = {{0}};
    g_gpus = backend_gpu_count(&why);
    if (g_gpus < 1) {
        printf("not ok - no usable GPU: %s\n", why.msg);
        return 1;
    }
    if (!make_dummy_dir()) {
        printf("not ok - cannot write the test model's config.json\n");
        return 1;
    }
    RUN(test_collectives);
    RUN(test_forward);
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    unlink(path);
    rmdir(g_dir);
    TEST_EXIT();
}
