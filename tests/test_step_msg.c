/* test_step_msg.c — parallel/step_msg.c: a step survives encoding exactly;
 * decoding refuses wrong counts, indices past the receiver's cache and
 * foreign bytes; random corruptions and truncations never read out of
 * bounds (this runs under AddressSanitizer in tests/run.sh). */
#include <stdlib.h>
#include <string.h>

#include "parallel/step_msg.h"
#include "tests/test.h"

#define BS 16

/* A step of two sequences: a 5-row prefill chunk at 30.. and one decode row at 70. */
typedef struct {
    int32_t ids[6], pos[6], seq[6];
    int64_t slot[6];
    int32_t t0[2], t1[5];
    const int32_t *tables[2];
    AttnBatch b;
} Step;

static void make_step(Step *s) {
    int32_t t0[2] = {3, 9}, t1[5] = {1, 2, 4, 5, 7};
    memcpy(s->t0, t0, sizeof t0);
    memcpy(s->t1, t1, sizeof t1);
    for (int i = 0; i < 5; i++) {
        s->ids[i] = 100 + i, s->pos[i] = 0 + i, s->seq[i] = 0;
        s->slot[i] = (int64_t)s->t0[s->pos[i] / BS] * BS + s->pos[i] % BS;
    }
    s->ids[5] = 7, s->pos[5] = 70, s->seq[5] = 1, s->slot[5] = (int64_t)s->t1[70 / BS] * BS + 70 % BS;
    s->tables[0] = s->t0, s->tables[1] = s->t1;
    s->b = (AttnBatch){6, s->pos, s->seq, s->slot, 2, s->tables, BS};
}

/* The step of make_step, encoded into a new buffer (*buf, freed by the caller). */
static size_t encoded_step(Step *s, void **buf) {
    size_t cap = 0;
    Err err = {{0}};
    make_step(s);
    *buf = NULL;
    return step_msg_encode(s->ids, &s->b, buf, &cap, &err);
}

static void test_round_trip(void) {
    Step s;
    void *buf;
    size_t n = encoded_step(&s, &buf);
    Err err = {{0}};
    StepMsg m = {0};
    CHECK(n > 0 && step_msg_decode(&m, buf, n, 64, 10, BS, &err) == 0, "%s", err.msg);
    CHECK(m.kind == STEP_MSG_STEP && m.b.n_tokens == 6 && m.b.n_seqs == 2, "kind %d, %d rows", m.kind, m.b.n_tokens);
    CHECK(!memcmp(m.ids, s.ids, sizeof s.ids) && !memcmp(m.b.pos, s.pos, sizeof s.pos) &&
              !memcmp(m.b.seq, s.seq, sizeof s.seq) && !memcmp(m.b.slot, s.slot, sizeof s.slot), "rows differ");
    CHECK(m.table_len[0] == 1 && m.table_len[1] == 5 && m.tables[1][4] == 7, "tables %d %d", m.table_len[0], m.table_len[1]);
    /* the receiver's limits */
    CHECK(step_msg_decode(&m, buf, n, 5, 10, BS, &err) != 0, "6 rows past a 5-row limit");
    err.msg[0] = 0;
    CHECK(step_msg_decode(&m, buf, n, 64, 7, BS, &err) != 0 && strstr(err.msg, "of 112"), "block 7 / slot 118 of a 7-block cache: %s", err.msg);
    CHECK(step_msg_decode(&m, buf, n, 64, 10, 32, &err) != 0, "another block size");
    CHECK(step_msg_decode(&m, buf, n - 1, 64, 10, BS, &err) != 0, "one byte short");
    unsigned char small[16];
    size_t k = step_msg_encode_small(STEP_MSG_HELLO, 1234, BS, small);
    CHECK(step_msg_decode(&m, small, k, 1, 1, 1, &err) == 0 && m.kind == STEP_MSG_HELLO && m.hello[0] == 1234, "hello");
    small[0] ^= 1;
    CHECK(step_msg_decode(&m, small, k, 1, 1, 1, &err) != 0 && strstr(err.msg, "magic"), "foreign bytes: %s", err.msg);
    step_msg_free(&m);
    free(buf);
}

/* Random byte flips and truncations: decode succeeds only with every index
 * inside the limits, or fails; ASan catches any stray read. */
static void test_corruptions(void) {
    Step s;
    void *buf;
    size_t n = encoded_step(&s, &buf);
    Err err = {{0}};
    unsigned char *bad = malloc(n);
    StepMsg m = {0};
    uint64_t x = 88172645463325252ull;
    int accepted = 0, bad_index = 0;
    for (int it = 0; it < 200000; it++) {
        memcpy(bad, buf, n);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int flips = 1 + (int)(x % 4);
        for (int f = 0; f < flips; f++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bad[x % n] ^= (unsigned char)(1u << (x >> 32) % 8);
        }
        size_t len = x % 5 == 0 ? (size_t)(x >> 20) % n : n;
        unsigned char *copy = malloc(len ? len : 1); /* exact size: a read past it is caught */
        memcpy(copy, bad, len);
        if (step_msg_decode(&m, copy, len, 64, 10, BS, &err) == 0 && m.kind == STEP_MSG_STEP) {
            accepted++;
            for (int t = 0; t < m.b.n_tokens; t++) {
                int sq = m.b.seq[t];
                bad_index += sq < 0 || sq >= m.b.n_seqs || m.b.slot[t] >= 10 * BS || m.b.pos[t] / BS >= m.table_len[sq];
            }
            for (int q = 0; q < m.b.n_seqs; q++)
                for (int i = 0; i < m.table_len[q]; i++) bad_index += m.tables[q][i] < 0 || m.tables[q][i] >= 10;
        }
        free(copy);
    }
    CHECK(bad_index == 0, "%d out-of-range indices accepted", bad_index);
    printf("  200000 corruptions: %d decoded (flips inside ids or in-range values), the rest refused\n", accepted);
    step_msg_free(&m);
    free(bad);
    free(buf);
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_corruptions);
    TEST_EXIT();
}
