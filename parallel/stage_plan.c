/* stage_plan.c — balanced and user-given splits of layers into stages. */
#include "parallel/stage_plan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

uint64_t weight_device_bytes(const WeightRef *w) {
    if (!w->data) return 0;
    uint64_t elems = (uint64_t)w->rows * w->cols * (w->n_mats > 0 ? w->n_mats : 1);
    /* a single matrix of a type the GPU keeps in blocks: its file bytes (the
     * repacked planes add at most 512 bytes of alignment); expert stacks
     * become bf16 there like every other matrix */
    if (w->rows > 1 && w->n_mats <= 1 && dtype_gpu_keeps_blocks(w->type)) return (uint64_t)w->rows * w->row_bytes;
    return elems * (w->rows == 1 ? 4 : 2);
}

/* The token embedding as the GPU holds it: bf16 whatever its file type (a
 * lookup reads T rows; a tied LM head shares the table). */
uint64_t table_device_bytes(const WeightRef *w) {
    return w->data ? (uint64_t)w->rows * w->cols * 2 : 0;
}

/* The final norm and the LM head on the last of P stages: a tied head is a
 * second copy of the embedding table there when P > 1. */
static uint64_t head_device_bytes(const ModelWeights *w, int P) {
    bool tied = w->output.data == w->tok_embd.data;
    uint64_t head = tied ? (P > 1 ? table_device_bytes(&w->output) : 0) : weight_device_bytes(&w->output);
    return weight_device_bytes(&w->output_norm) + head;
}

uint64_t layer_device_bytes(const LayerWeights *lw) {
    const WeightRef *refs = (const WeightRef *)lw;
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof *lw / sizeof *refs; i++) sum += weight_device_bytes(&refs[i]);
    return sum;
}

/* Per-stage bytes of a split given by layer counts; stage 0 adds the
 * embedding, the last stage the final norm and LM head (a tied head is a
 * second copy of the embedding when it lives on another GPU). */
int stage_plan_from_counts(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages,
                           const int *counts, Err *err) {
    memset(p, 0, sizeof *p);
    p->n_stages = n_stages;
    int l = 0;
    for (int s = 0; s < n_stages; s++) {
        if (counts[s] < 1) return err_set(err, "--pp-split: stage %d gets %d layers (each stage needs at least 1)", s, counts[s]);
        p->first_layer[s] = l;
        p->n_layers[s] = counts[s];
        for (int i = 0; i < counts[s] && l + i < c->n_layers; i++) p->bytes[s] += layer_device_bytes(&w->layers[l + i]);
        l += counts[s];
    }
    if (l != c->n_layers) return err_set(err, "--pp-split: the stages hold %d layers, the model has %d", l, c->n_layers);
    p->bytes[0] += table_device_bytes(&w->tok_embd);
    p->bytes[n_stages - 1] += head_device_bytes(w, n_stages);
    return 0;
}

static int check_stages(const ModelConfig *c, int n_stages, Err *err) {
    if (n_stages < 1 || n_stages > STAGE_MAX) return err_set(err, "--pp %d: between 1 and %d stages", n_stages, STAGE_MAX);
    if (n_stages > c->n_layers)
        return err_set(err, "--pp %d: the model has only %d layers (one stage needs at least one)", n_stages, c->n_layers);
    return 0;
}

/* Contiguous partition minimizing the largest stage: best[s][i] is the
 * smallest possible largest stage when the first i layers form s+1 stages
 * (the embedding in the first, the head counted once all layers are placed). */
int stage_plan_balanced(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages, Err *err) {
    if (check_stages(c, n_stages, err)) return -1;
    int L = c->n_layers, P = n_stages;
    uint64_t *prefix = calloc(L + 1, sizeof *prefix);
    uint64_t *best = malloc((size_t)P * (L + 1) * sizeof *best);
    int *cut = malloc((size_t)P * (L + 1) * sizeof *cut);
    if (!prefix || !best || !cut) { free(prefix); free(best); free(cut); return err_set(err, "out of memory"); }
    for (int i = 0; i < L; i++) prefix[i + 1] = prefix[i] + layer_device_bytes(&w->layers[i]);
    uint64_t embd = table_device_bytes(&w->tok_embd), head = head_device_bytes(w, P);
#define B(s, i) best[(size_t)(s) * (L + 1) + (i)]
    for (int i = 0; i <= L; i++) B(0, i) = embd + prefix[i] + (P == 1 && i == L ? head : 0);
    for (int s = 1; s < P; s++) {
        for (int i = 0; i <= L; i++) {
            B(s, i) = UINT64_MAX;
            cut[(size_t)s * (L + 1) + i] = -1;
            for (int j = s; j < i; j++) { /* stage s holds layers [j, i) */
                uint64_t last = prefix[i] - prefix[j] + (s == P - 1 && i == L ? head : 0);
                uint64_t worst = B(s - 1, j) > last ? B(s - 1, j) : last;
                if (B(s - 1, j) != UINT64_MAX && worst < B(s, i)) { B(s, i) = worst; cut[(size_t)s * (L + 1) + i] = j; }
            }
        }
    }
#undef B
    int counts[STAGE_MAX], end = L;
    for (int s = P - 1; s > 0; s--) {
        int j = cut[(size_t)s * (L + 1) + end];
        counts[s] = end - j;
        end = j;
    }
    counts[0] = end;
    free(prefix); free(best); free(cut);
    return stage_plan_from_counts(p, c, w, P, counts, err);
}

int stage_plan_parse(StagePlan *p, const ModelConfig *c, const ModelWeights *w, int n_stages, const char *split,
                     Err *err) {
    if (check_stages(c, n_stages, err)) return -1;
    int counts[STAGE_MAX], n = 0;
    const char *s = split;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || (*end && *end != ','))
            return err_set(err, "--pp-split '%s': expected comma-separated layer counts such as 14,18", split);
        if (v > c->n_layers)
            return err_set(err, "--pp-split '%s': a stage of %ld layers, the model has %d", split, v, c->n_layers);
        if (n == STAGE_MAX || n == n_stages)
            return err_set(err, "--pp-split '%s': more counts than the %d stages of --pp", split, n_stages);
        counts[n++] = (int)v;
        s = *end ? end + 1 : end;
        if (*end && !*s) return err_set(err, "--pp-split '%s': trailing comma", split);
    }
    if (n != n_stages) return err_set(err, "--pp-split '%s': %d counts for %d stages", split, n, n_stages);
    return stage_plan_from_counts(p, c, w, n_stages, counts, err);
}

void plan_print_size(FILE *out, uint64_t b) {
    if (b >= 1000000000ULL) fprintf(out, "%.2f GB", b / 1e9);
    else fprintf(out, "%.1f MB", b / 1e6);
}

void plan_print_memory(FILE *out, uint64_t weights, uint64_t kv) {
    fprintf(out, "weights ");
    plan_print_size(out, weights);
    fprintf(out, " + KV ");
    plan_print_size(out, kv);
    fprintf(out, " = ");
    plan_print_size(out, weights + kv);
    fprintf(out, "\n");
}

uint64_t stage_plan_kv_bytes(const StagePlan *p, const ModelConfig *c, int s, int64_t kv_tokens, KVDtype kv_dtype) {
    uint64_t kv_layer = c->n_kv_heads * kv_head_token_bytes(kv_dtype, c->head_dim_k, c->head_dim_v); /* per token */
    return kv_layer * p->n_layers[s] * (uint64_t)kv_tokens;
}

void stage_plan_print(FILE *out, const StagePlan *p, const ModelConfig *c, int64_t kv_tokens, KVDtype kv_dtype) {
    fprintf(out, "pipeline               %d stages, KV cache of %lld tokens (%s)\n", p->n_stages,
            (long long)kv_tokens, kv_dtype_name(kv_dtype));
    for (int s = 0; s < p->n_stages; s++) {
        uint64_t kv = stage_plan_kv_bytes(p, c, s, kv_tokens, kv_dtype);
        fprintf(out, "  stage %-2d             layers %d-%d (%d)%s%s: ", s, p->first_layer[s],
                p->first_layer[s] + p->n_layers[s] - 1, p->n_layers[s], s == 0 ? ", embedding" : "",
                s == p->n_stages - 1 ? ", final norm + LM head" : "");
        plan_print_memory(out, p->bytes[s], kv);
    }
}
