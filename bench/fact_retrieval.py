#!/usr/bin/env python3
"""fact_retrieval.py — the long-context check of the FP8 KV cache (issue 40):
a fact planted at the start of a long prompt, the question at its end, greedy
answers with each KV cache type, at several prompt lengths.

    python3 bench/fact_retrieval.py MODEL [--cllm ./cllm] [--lengths 1000,4000,7800]
        [--kv bf16,fp8] [--chat] [--trials 4] [-- extra cllm generate options]

The filler is this repository's prose (README.md, docs/DESIGN.md: text the
model has not seen), cut to reach each length in the model's own tokens
(`cllm tokenize`); the fact is a random 4-digit number with a name ("The
access code of the blue vault is 4817."), asked back at the end. A trial
counts as retrieved when the answer holds the number. --chat sends the prompt
as a user message (instruct models), else as raw text ending in "The access
code of the blue vault is" (base models). Prints one row per (length, KV type):
trials retrieved; the same answers with bf16 and fp8 caches are what the issue
asks, and a model that fails with bf16 at a length cannot show it there.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLORS = ["blue", "red", "green", "amber", "silver", "black", "white", "violet"]


def filler_text():
    parts = []
    for f in ("README.md", "docs/DESIGN.md", "kernels/README.md"):
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            parts.append(fh.read())
    return "\n\n".join(parts).replace("\x00", "")


def n_tokens(cllm, model, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        out = subprocess.run([cllm, "tokenize", "-m", model, "-f", path], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    return len(out.stdout.split())


def prompt_of(cllm, model, fact, question, filler, length):
    """fact + filler + question, the filler cut (by bisection on characters) to about `length` tokens in all."""
    lo, hi = 0, len(filler)
    base = n_tokens(cllm, model, fact + "\n\n" + question)
    if base >= length:
        return fact + "\n\n" + question
    while hi - lo > 200:
        mid = (lo + hi) // 2
        if base + n_tokens(cllm, model, filler[:mid]) < length:
            lo = mid
        else:
            hi = mid
    return fact + "\n\n" + filler[:lo] + "\n\n" + question


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cllm", default=os.path.join(ROOT, "cllm"))
    ap.add_argument("--lengths", default="1000,4000,7800")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--trials", type=int, default=4)
    a, rest = ap.parse_known_args()  # the rest: cllm generate options
    a.rest = [x for x in rest if x != "--"]
    rng = random.Random(7)
    filler = filler_text()
    lengths = [int(x) for x in a.lengths.split(",")]
    rows, facts = [], []
    for L in lengths:
        for t in range(a.trials):
            color, code = COLORS[(t + L) % len(COLORS)], rng.randrange(1000, 10000)
            fact = f"Remember this fact: the access code of the {color} vault is {code}."
            if a.chat:
                q = f"What is the access code of the {color} vault? Answer with the number only."
            else:
                q = f"Remember the fact from the start. The access code of the {color} vault is"
            p = prompt_of(a.cllm, a.model, fact, q, filler, L)
            req = {"id": f"L{L}-t{t}", "max_tokens": 32}
            if a.chat:
                req["messages"] = [{"role": "user", "content": p}]
            else:
                req["prompt"] = p
            rows.append(req)
            facts.append((L, str(code)))
    ctx = max(lengths) + 256
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.jsonl")
        with open(inp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"# {a.model}: {a.trials} trials a length, greedy; retrieved = the answer holds the code")
        print("| prompt tokens | " + " | ".join(f"{kv} KV" for kv in a.kv.split(",")) + " | answers equal |")
        print("|---|" + "---|" * (len(a.kv.split(",")) + 1))
        answers = {}
        for kv in a.kv.split(","):
            out = os.path.join(d, f"out-{kv}.jsonl")
            cmd = [a.cllm, "generate", "-m", a.model, "-i", inp, "-o", out, "--temp", "0", "-c", str(ctx),
                   "--kv-dtype", kv, "--ordered"] + a.rest
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"fact_retrieval: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
            answers[kv] = [json.loads(l)["text"] for l in open(out)]
        for L in lengths:
            idx = [i for i, (l, _) in enumerate(facts) if l == L]
            cells = [f"{sum(facts[i][1] in answers[kv][i] for i in idx)} of {len(idx)}" for kv in a.kv.split(",")]
            kvs = a.kv.split(",")
            same = sum(all(answers[kv][i] == answers[kvs[0]][i] for kv in kvs) for i in idx)
            print(f"| {L} | " + " | ".join(cells) + f" | {same} of {len(idx)} |")
        for i, (L, code) in enumerate(facts):
            print(f"# {rows[i]['id']} code {code}: " + "; ".join(f"{kv} {answers[kv][i]!r}" for kv in a.kv.split(",")))


if __name__ == "__main__":
    main()
