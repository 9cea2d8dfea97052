#!/usr/bin/env python3
"""same_results.py A.jsonl B.jsonl [LABEL] — two `cllm generate` outputs of the same prompts
must be the same line for line: every field (text, finish reason, token counts, logprobs,
errors) but the timing ("seconds"). Prints the first differences and exits 1 on any."""
import json
import sys


def load(path):
    out = {}
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        r.pop("seconds", None)
        out[r.get("id", r.get("custom_id"))] = r
    return out


a, b = load(sys.argv[1]), load(sys.argv[2])
label = sys.argv[3] if len(sys.argv) > 3 else f"{sys.argv[1]} vs {sys.argv[2]}"
if sorted(a, key=str) != sorted(b, key=str) or not a:
    print(f"not ok - {label}: different prompt sets ({len(a)} vs {len(b)})")
    sys.exit(1)
diff = [k for k in a if a[k] != b[k]]
errors = sum(1 for k in a if a[k].get("error"))
for k in diff[:5]:
    for f in sorted(set(a[k]) | set(b[k])):
        if a[k].get(f) != b[k].get(f):
            print(f"#   {k}: {f}: {str(a[k].get(f))[:120]!r} vs {str(b[k].get(f))[:120]!r}")
            break
print(f"# {label}: {len(a)} prompts, {len(a) - len(diff)} identical, {errors} errors")
ok = not diff and errors == 0
print(f"{'ok' if ok else 'not ok'} - {label}: identical")
sys.exit(0 if ok else 1)
