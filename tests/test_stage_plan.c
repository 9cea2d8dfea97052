/* test_stage_plan.c — the layer split of `--pp N` (parallel/stage_plan.c):
 * the balanced split against an exhaustive search over every contiguous
 * split, embedding and head on the end stages, and bad `--pp` / `--pp-split`
 * values. */
#include <stdint.h>

#include "parallel/stage_plan.h"
#include "tests/test.h"

static char dummy;

/* A model whose layer l is one [rows_l][64] matrix (bf16 on the GPU). */
typedef struct {
    ModelConfig c;
    ModelWeights w;
    LayerWeights layers[24];
} FakeModel;

static void fake_model(FakeModel *m, int n_layers, const int *rows, bool tied, int vocab_rows) {
    memset(m, 0, sizeof *m);
    m->c.n_layers = n_layers;
    for (int l = 0; l < n_layers; l++)
        m->layers[l].wq = (WeightRef){&dummy, DT_BF16, rows[l], 64, 1, 128, "wq", NULL, 0, 0};
    m->w.layers = m->layers;
    m->w.tok_embd = (WeightRef){&dummy, DT_BF16, vocab_rows, 64, 1, 128, "embd", NULL, 0, 0};
    m->w.output_norm = (WeightRef){&dummy, DT_F32, 1, 64, 1, 256, "norm", NULL, 0, 0};
    m->w.output = tied ? m->w.tok_embd : (WeightRef){(char *)&dummy + 1, DT_BF16, vocab_rows, 64, 1, 128, "out", NULL, 0, 0};
}

static uint64_t plan_max(const StagePlan *p) {
    uint64_t m = 0;
    for (int s = 0; s < p->n_stages; s++) m = p->bytes[s] > m ? p->bytes[s] : m;
    return m;
}

/* The smallest largest stage over every way to cut L layers into P parts. */
static uint64_t brute_best(const FakeModel *m, int P, int *counts, int s, int left) {
    if (s == P - 1) {
        counts[s] = left;
        StagePlan p;
        Err err;
        return stage_plan_from_counts(&p, &m->c, &m->w, P, counts, &err) ? UINT64_MAX : plan_max(&p);
    }
    uint64_t best = UINT64_MAX;
    for (int n = 1; n <= left - (P - 1 - s); n++) {
        counts[s] = n;
        uint64_t v = brute_best(m, P, counts, s + 1, left - n);
        best = v < best ? v : best;
    }
    return best;
}

static void test_balanced_is_optimal(void) {
    uint64_t rng = 12345;
    int cases = 0;
    for (int trial = 0; trial < 200; trial++) {
        int L = 1 + (int)((rng = rng * 6364136223846793005ULL + 1442695040888963407ULL) >> 60) % 12;
        int rows[24];
        for (int l = 0; l < L; l++) rows[l] = 1 + (int)((rng = rng * 6364136223846793005ULL + 1) >> 52) % 4000;
        FakeModel m;
        fake_model(&m, L, rows, trial % 2, 500 + trial * 37);
        for (int P = 1; P <= L && P <= 5; P++) {
            StagePlan p;
            Err err;
            int counts[STAGE_MAX];
            CHECK(stage_plan_balanced(&p, &m.c, &m.w, P, &err) == 0, "L=%d P=%d: %s", L, P, err.msg);
            CHECK(plan_max(&p) == brute_best(&m, P, counts, 0, L), "L=%d P=%d: largest stage %llu, exhaustive best %llu", L,
                  P, (unsigned long long)plan_max(&p), (unsigned long long)brute_best(&m, P, counts, 0, L));
            int sum = 0;
            for (int s = 0; s < P; s++) {
                CHECK(p.first_layer[s] == sum && p.n_layers[s] >= 1, "L=%d P=%d stage %d: first %d count %d", L, P, s,
                      p.first_layer[s], p.n_layers[s]);
                sum += p.n_layers[s];
            }
            CHECK(sum == L, "layers placed %d of %d", sum, L);
            cases++;
        }
    }
    printf("# %d random splits matched the exhaustive optimum\n", cases);
}

static void test_end_stages(void) {
    int rows[4] = {100, 100, 100, 100};
    FakeModel m;
    fake_model(&m, 4, rows, true, 1000);
    StagePlan p;
    Err err;
    CHECK(stage_plan_parse(&p, &m.c, &m.w, 2, "2,2", &err) == 0, "%s", err.msg);
    uint64_t layer = 100 * 64 * 2, embd = 1000 * 64 * 2, norm = 64 * 4;
    CHECK(p.bytes[0] == 2 * layer + embd, "stage 0: %llu", (unsigned long long)p.bytes[0]);
    /* tied head: the last GPU holds its own copy of the embedding matrix */
    CHECK(p.bytes[1] == 2 * layer + embd + norm, "stage 1: %llu", (unsigned long long)p.bytes[1]);
    CHECK(stage_plan_parse(&p, &m.c, &m.w, 1, "4", &err) == 0, "%s", err.msg);
    CHECK(p.bytes[0] == 4 * layer + embd + norm, "one stage, tied head counted once: %llu", (unsigned long long)p.bytes[0]);
    /* a heavy embedding pushes layers off stage 0 */
    fake_model(&m, 4, rows, false, 20000);
    m.w.output.rows = 10;
    CHECK(stage_plan_balanced(&p, &m.c, &m.w, 2, &err) == 0, "%s", err.msg);
    CHECK(p.n_layers[0] == 1 && p.n_layers[1] == 3, "split %d,%d", p.n_layers[0], p.n_layers[1]);
}

/* Quantized matrices count as the GPU holds them: a type it keeps in
 * blocks (Q4_K, Q5_0, Q6_K) by its file bytes, an expert stack or a type it
 * dequantizes (Q2_K) as bf16; the embedding table is bf16 whatever its type. */
static void test_quantized_bytes(void) {
    int rows[2] = {512, 512};
    FakeModel m;
    fake_model(&m, 2, rows, false, 1000);
    for (int l = 0; l < 2; l++) m.layers[l].wq = (WeightRef){&dummy, DT_Q4_K, 512, 256, 1, 144, "wq", NULL, 0, 0};
    m.layers[1].wk = (WeightRef){&dummy, DT_Q2_K, 64, 256, 1, 84, "wk", NULL, 0, 0};
    m.layers[1].wv = (WeightRef){&dummy, DT_Q5_0, 64, 256, 1, 176, "wv", NULL, 0, 0};
    m.layers[1].w_gate = (WeightRef){&dummy, DT_Q4_K, 32, 256, 8, 144, "experts", NULL, 0, 0};
    m.w.tok_embd = (WeightRef){&dummy, DT_Q4_K, 1000, 256, 1, 144, "embd", NULL, 0, 0};
    m.w.output = (WeightRef){(char *)&dummy + 1, DT_Q6_K, 1000, 256, 1, 210, "out", NULL, 0, 0};
    StagePlan p;
    Err err;
    CHECK(stage_plan_parse(&p, &m.c, &m.w, 2, "1,1", &err) == 0, "%s", err.msg);
    uint64_t q4k = 512 * 144, embd = 1000 * 256 * 2, head = 1000 * 210 + 64 * 4;
    uint64_t layer1 = q4k + 64 * 256 * 2 + 64 * 176 + 8 * 32 * 256 * 2;
    CHECK(p.bytes[0] == q4k + embd, "stage 0: %llu, want %llu", (unsigned long long)p.bytes[0],
          (unsigned long long)(q4k + embd));
    CHECK(p.bytes[1] == layer1 + head, "stage 1: %llu, want %llu", (unsigned long long)p.bytes[1],
          (unsigned long long)(layer1 + head));
    m.w.output = m.w.tok_embd; /* tied: the last GPU's copy of the table is bf16 too */
    CHECK(stage_plan_parse(&p, &m.c, &m.w, 2, "1,1", &err) == 0, "%s", err.msg);
    CHECK(p.bytes[1] == layer1 + embd + 64 * 4, "tied, stage 1: %llu", (unsigned long long)p.bytes[1]);
}

static void test_bad_values(void) {
    int rows[4] = {1, 2, 3, 4};
    FakeModel m;
    fake_model(&m, 4, rows, false, 10);
    StagePlan p;
    Err err;
    static const struct { int pp; const char *split, *want; } BAD[] = {
        {5, NULL, "only 4 layers"},      {0, NULL, "between 1"},          {2, "1,2", "hold 3 layers"},
        {2, "1,2,1", "more counts"},     {3, "2,2", "2 counts for 3"},     {2, "0,4", "expected"},
        {2, "a,b", "expected"},          {2, "2,", "trailing comma"},      {2, "", "0 counts"},
        {2, "2;2", "expected"},          {2, "-1,5", "expected"},          {2, "99999999999,1", "the model has 4"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        err.msg[0] = 0;
        int rc = BAD[i].split ? stage_plan_parse(&p, &m.c, &m.w, BAD[i].pp, BAD[i].split, &err)
                              : stage_plan_balanced(&p, &m.c, &m.w, BAD[i].pp, &err);
        CHECK(rc != 0 && strstr(err.msg, BAD[i].want), "--pp %d --pp-split '%s': rc %d, message '%s'", BAD[i].pp,
              BAD[i].split ? BAD[i].split : "", rc, err.msg);
    }
}

int main(void) {
    RUN(test_balanced_is_optimal);
    RUN(test_end_stages);
    RUN(test_quantized_bytes);
    RUN(test_bad_values);
    return test_failed_tests != 0;
}
