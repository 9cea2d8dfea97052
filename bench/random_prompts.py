#!/usr/bin/env python3
"""random_prompts.py — the benchmarks' prompts: N lines of random lowercase
words, about LO..HI tokens each for the synthetic byte-pair tokenizer of
bench/make_model.py (~1.75 characters per token, measured: 2.2 gave 163-1292
tokens for 128-1024; the real counts come back in prompt_tokens). Seeded: the
same arguments give the same prompts.

    random_prompts.py N [LO HI]                 # a prompt per line (text)
    random_prompts.py N LO HI --jsonl TOKENS    # {"id", "prompt", "max_tokens"} lines (raw completions)
"""
import json
import random
import string
import sys

n = int(sys.argv[1])
lo, hi = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (128, 1024)
tokens = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--jsonl" else None
rng = random.Random(1234)
for i in range(n):
    want, words, chars = rng.randint(lo, hi) * 1.75, [], 0
    while chars < want:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
        words.append(w)
        chars += len(w) + 1
    text = " ".join(words)
    print(json.dumps({"id": f"p{i}", "prompt": text, "max_tokens": tokens}) if tokens else text)
