#!/usr/bin/env python3
"""compare_generate.py A.jsonl B.jsonl MIN_SHARE [--min-identical F] — greedy outputs of the same
prompts run two ways (batched by the scheduler, and one at a time): how many
replies are identical, and the mean share of each reply's characters that
match before the first difference. Exits 1 when a prompt is missing, has an
error, the mean matched share is below MIN_SHARE, or (--min-identical) the
share of identical replies is below F. bf16 rounding differs
between a batch of rows and one row (GEMV vs GEMM), so a near-tie of a random
model may flip; broken batching (another sequence's KV, a wrong row) changes
replies from the first token."""
import json
import sys


def load(path):
    out = {}
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        out[r["id"]] = r
    return out


a, b, min_share = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
min_identical = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--min-identical" else 0.0
if sorted(a) != sorted(b) or not a:
    print(f"not ok - different prompt sets ({len(a)} vs {len(b)})")
    sys.exit(1)
same, shares, errors = 0, [], 0
for k in a:
    x, y = a[k], b[k]
    if x.get("error") or y.get("error"):
        errors += 1
        continue
    tx, ty = x["text"], y["text"]
    n = 0
    while n < min(len(tx), len(ty)) and tx[n] == ty[n]:
        n += 1
    same += tx == ty
    shares.append(n / max(len(tx), len(ty), 1))
mean = sum(shares) / max(len(shares), 1)
print(f"# {len(a)} prompts: {same} identical, mean matched share {mean:.3f}, {errors} errors")
ok = errors == 0 and mean >= min_share and same >= min_identical * len(a)
print(f"{'ok' if ok else 'not ok'} - batched vs one at a time (share >= {min_share}, identical >= {min_identical:.0%})")
sys.exit(0 if ok else 1)
