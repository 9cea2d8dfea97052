#!/usr/bin/env python3
"""compare_logprobs.py — GPU vs CPU logprobs of the same greedy requests.

  compare_logprobs.py GPU.jsonl CPU.jsonl TOL [REL]

Both files are `cllm generate` JSON Lines results of requests asking for
"logprobs" (completions shape, with echo) and "prompt_logprobs". Compares,
per id: every prompt token's logprob (the same prompt, so every position),
and each generated token's logprob and top-k values while the two replies'
tokens agree (after a near-tie flips a token the contexts differ, and so do
the values: those positions are counted, not compared). |diff| <= TOL +
REL * |CPU value| (REL default 0).
Prints "ok - ..." or "not ok - ..." and exits 1 on a difference.
"""
import json
import sys


def load(path):
    return {x["id"]: x for x in map(json.loads, open(path))}


def main():
    gpu, cpu, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    rel = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    over = lambda x, y: abs(x - y) / (tol + rel * abs(y))  # > 1: outside the tolerance
    worst, compared, skipped, bad = 0.0, 0, 0, []
    for rid, c in cpu.items():
        g = gpu.get(rid)
        if g is None or "error" in g or "error" in c:
            bad.append(f"{rid}: missing or failed")
            continue
        for i, (a, b) in enumerate(zip(g["prompt_logprobs"], c["prompt_logprobs"])):
            if a is None or b is None:
                continue
            (ka, va), (kb, vb) = next(iter(a.items())), next(iter(b.items()))
            d = over(va["logprob"], vb["logprob"])
            worst, compared = max(worst, d), compared + 1
            if ka != kb or d > 1:
                bad.append(f"{rid} prompt {i}: {ka} {va['logprob']} vs {kb} {vb['logprob']}")
        lg, lc = g["logprobs"], c["logprobs"]
        for i, (ta, tb) in enumerate(zip(lg["tokens"], lc["tokens"])):
            if ta != tb:
                skipped += len(lc["tokens"]) - i
                break
            a, b = lg["token_logprobs"][i], lc["token_logprobs"][i]
            if a is None or b is None:
                continue
            d = over(a, b)
            top_a, top_b = sorted(lg["top_logprobs"][i].values()), sorted(lc["top_logprobs"][i].values())
            if len(top_a) == len(top_b):
                d = max([d] + [over(x, y) for x, y in zip(top_a, top_b)])
            worst, compared = max(worst, d), compared + 1
            if d > 1:
                bad.append(f"{rid} token {i} {ta!r}: {a} vs {b}")
    what = (f"{compared} logprobs compared, worst |diff| {worst:.3g} of the tolerance ({tol} + {rel} x |cpu|), "
            f"{skipped} after a parted token")
    if bad or compared == 0:
        print(f"not ok - logprobs GPU vs CPU: {what}")
        for b in bad[:20]:
            print("  " + b)
        sys.exit(1)
    print(f"ok - logprobs GPU vs CPU: {what}")


if __name__ == "__main__":
    main()
