/* attn_cascade.h — the cascade plan of one attention step: which rows attend
 * to a shared prefix of KV blocks that can be read once for all of them.
 *
 * When the prefix cache gives many sequences of a step the same leading
 * blocks (a common system prompt, many samples of one prompt), their block
 * tables begin with the same block ids. Cascade attention then splits each
 * such row's keys in two: the shared prefix, attended once per group with
 * every member row's queries against each key (each key and value read once
 * for the group, not once per row), and the row's own suffix; the two
 * partial softmaxes are merged by log-sum-exp (DESIGN.md "Cascade
 * attention"). The plan is host data, built from the AttnBatch (and the
 * layer's AttnParams: a windowed layer cascades only where the window covers
 * the whole prefix); any backend may use it.
 *
 * A group: rows of two or more distinct sequences whose tables begin with
 * the same n_blocks full block ids, every row at a position >= n_blocks *
 * block_size (so each row attends to every shared key and to at least one
 * key of its own), on a windowed layer every row with its window starting at
 * key 0. Groups are disjoint: among the sequences whose tables begin with
 * one block, the group is the set sharing the prefix that saves the most
 * block reads ((sequences - 1) x shared blocks); those left are grouped the
 * same way. A group the rule (attn_cascade_pays) rejects is dropped.
 */
#ifndef CLLM_ATTN_CASCADE_H
#define CLLM_ATTN_CASCADE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "kernels/attn_batch.h"

#ifdef __cplusplus
extern "C" { /* also called from the CUDA backend */
#endif

/* Below this many shared keys a second pass and a merge cost more than the
 * reads they save (vLLM's threshold too). */
#define ATTN_CASCADE_MIN_SHARED 256

/* What attn_cascade_pays weighs for one group on one layer. */
typedef struct {
    int shared_tokens;          /* keys of the shared prefix */
    int n_seqs;                 /* distinct sequences in the group */
    int n_rows;                 /* their query rows this step */
    int n_heads, n_kv_heads;
    int n_workers;              /* work units that run at once: CPU threads, GPU multiprocessors */
    int rows_per_unit;          /* (row, query head) pairs of one KV head one unit of the shared pass takes */
    int keys_per_tile;          /* keys a unit loads at a time */
} AttnCascadeCost;

/* Whether cascading a group pays, a pure function of c:
 *   - no when the prefix is shorter than ATTN_CASCADE_MIN_SHARED keys or
 *     fewer than 2 sequences share it;
 *   - else a comparison of time in key tiles, in waves of n_workers units:
 *       flat:    every sequence reads the prefix itself, split over keys as
 *                the decode kernel splits it: n_seqs * n_kv_heads * tiles
 *                tile loads spread over every worker,
 *                ceil(n_seqs * n_kv_heads * tiles / n_workers);
 *       cascade: units of rows_per_unit (row, head) pairs per KV head, each
 *                streaming every tile of the prefix (the reads are shared,
 *                the key range is not split),
 *                ceil(n_kv_heads * ceil(n_rows * q_per_kv / rows_per_unit) / n_workers) * tiles,
 *                plus one tile's worth for the merge;
 *     cascade pays when its time is smaller. Few sequences with many
 *     workers idle keep the flat path (its split over keys keeps every
 *     worker busy); many sequences make the shared reads win. */
bool attn_cascade_pays(const AttnCascadeCost *c);

typedef struct {
    int n_blocks;               /* P: full blocks shared */
    const int32_t *blocks;      /* [n_blocks] their ids (a member's block table, borrowed) */
    int row0, n_rows;           /* members: plan rows[row0 .. row0 + n_rows), in step order */
    int n_seqs;                 /* distinct sequences among them */
} AttnCascadeGroup;

typedef struct {
    int n_groups;
    AttnCascadeGroup *groups;
    int32_t *rows;              /* [n_tokens] member rows, group after group */
    int32_t *group_of;          /* [n_tokens] each row's group, -1: none */
    int32_t *suffix_start;      /* [n_tokens] first key a row attends on its own: n_blocks * block_size of
                                   its group, 0 outside a group (the window still applies there) */
    int n_tokens;
} AttnCascadePlan;

typedef struct {
    bool always;                /* every group that can be formed, pays or not (tests, CLLM_CASCADE=always) */
    int n_workers;              /* see AttnCascadeCost (<= 0: 1) */
    int rows_per_unit;          /* (<= 0: 1) */
    int keys_per_tile;          /* (<= 0: 1) */
} AttnCascadeOpts;

/* Builds pl from b for a layer of params p (only its window and heads are
 * read). pl is overwritten; free with attn_cascade_free. A plan with no
 * group is valid (n_groups 0). Returns 0, or -1 with err naming the row or
 * sequence and value (a seq index out of range, a negative position, a row
 * without a block table, a block size <= 0, out of memory). */
int attn_cascade_plan(AttnCascadePlan *pl, const AttnBatch *b, const AttnParams *p, const AttnCascadeOpts *o,
                      Err *err);
void attn_cascade_free(AttnCascadePlan *pl);

#ifdef __cplusplus
}
#endif

#endif
