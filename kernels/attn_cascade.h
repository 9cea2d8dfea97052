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

/* CLLM_CASCADE's values (read by each backend at creation): cascade attention
 * off, on where attn_cascade_pays says it pays (the default), or for every
 * group that can be formed (tests). */
typedef enum { ATTN_CASCADE_ON, ATTN_CASCADE_OFF, ATTN_CASCADE_ALWAYS } AttnCascadeMode;

/* The mode of CLLM_CASCADE's value v (NULL or empty: on); -1 with err naming
 * the value when it is none of off, on, always. */
int attn_cascade_mode(const char *v, AttnCascadeMode *mode, Err *err);

/* The device form of a plan (the CUDA kernels read it, attention.cuh
 * cuda_attention_cascade), packed into int32 sections at the offsets below:
 *   units   [n_units][2]   group, first pair: up to unit_pairs (member, query
 *                          head) pairs of one KV head, pair e of a group being
 *                          member e / q_per_kv, head e % q_per_kv of the KV head
 *   groups  [n_groups][5]  table (the block-table row of a member: its step
 *                          sequence), shared keys, first member, pairs
 *                          (members x q_per_kv), keys a split (a multiple of
 *                          key_tile; the group's splits: ceil(keys / that))
 *   members [n_members]    the step row of each member, group after group
 *   rows    [n_rows][3]    per step row: suffix start (the first key it
 *                          attends on its own; 0 outside a group), member
 *                          index (-1: none), its group's splits
 * The shared pass is a grid of n_units x n_kv_heads x n_splits blocks (a
 * block past its group's splits does nothing); its partial results are
 * slots (member x n_heads + head) x n_splits + split. */
typedef struct {
    int n_units, n_splits, n_members;
    int off_units, off_groups, off_members, off_rows, len;
} AttnCascadeMeta;

typedef struct {
    int q_per_kv, n_kv_heads;
    int unit_pairs;             /* (member, query head) pairs a block of the shared pass takes */
    int key_tile;               /* splits begin on multiples of it */
    int target_blocks;          /* splits are added until the shared pass has about this many blocks */
    int max_splits;             /* and never more than this (the room for partial results) */
} AttnCascadePackOpts;

/* The int32 values attn_cascade_pack writes for a plan of at most n_rows
 * members and n_rows step rows. */
int64_t attn_cascade_pack_len(int n_rows, const AttnCascadePackOpts *o);

/* Packs pl into buf (room for cap values) as described above. pl's rows are
 * rows of the batch pb it was planned from; row_of[i] is the step row of pb's
 * row i (pb may hold a subset of the step's rows, e.g. its decode rows) and
 * n_rows the step's row count; a group's table is pb->seq of its first
 * member. Returns 0, or -1 with err when buf is too small or o is invalid. */
int attn_cascade_pack(int32_t *buf, int64_t cap, AttnCascadeMeta *m, const AttnCascadePlan *pl, const AttnBatch *pb,
                      const int32_t *row_of, int n_rows, const AttnCascadePackOpts *o, Err *err);

#ifdef __cplusplus
}
#endif

#endif
