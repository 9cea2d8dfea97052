#!/usr/bin/env python3
"""random_prompts.py — the benchmarks' prompts. Seeded: the same arguments
give the same prompts.

Text: N lines of random lowercase words, about LO..HI tokens each for the
synthetic byte-pair tokenizer of bench/make_model.py (~1.75 characters per
token, measured: 2.2 gave 163-1292 tokens for 128-1024; the real counts come
back in prompt_tokens).

    random_prompts.py N [LO HI]                 # a prompt per line (text)
    random_prompts.py N LO HI --jsonl TOKENS    # {"id", "prompt", "max_tokens"} lines (raw completions)

Exact lengths: N JSON Lines whose "prompt" is an array of exactly LEN random
token ids (`cllm generate` uses token-id prompts as given: no template, no
BOS), so every prompt is LEN tokens whatever the tokenizer. Ids are drawn
from the model's vocabulary (config.json's vocab_size, or --vocab V) less
the tokenizer's added (special) tokens (tokenizer.json's added_tokens).

    random_prompts.py N --ids LEN --model DIR [--max-tokens OUT]
    random_prompts.py N --ids LEN --vocab V [--max-tokens OUT]

Shared prefix (bench/cascade.sh): --shared P puts one common prefix of P
random ids before every prompt's own ids, and --ids LO-HI draws each
prompt's own length from LO..HI (a system prompt shared by many requests).

    random_prompts.py N --ids LO-HI --shared P --model DIR [--max-tokens OUT]
"""
import json
import os
import random
import string
import sys


def vocabulary(model_dir, vocab):
    """The ids a random prompt may hold: 0..V-1 without the added tokens."""
    special = set()
    if model_dir:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        vocab = vocab or cfg.get("text_config", cfg)["vocab_size"]
        tok = os.path.join(model_dir, "tokenizer.json")
        if os.path.exists(tok):
            with open(tok, encoding="utf-8") as f:
                special = {t["id"] for t in json.load(f).get("added_tokens", [])}
    if not vocab:
        sys.exit("random_prompts.py: --ids needs --model DIR or --vocab V")
    ids = [i for i in range(vocab) if i not in special]
    if not ids:
        sys.exit("random_prompts.py: no ordinary token in the vocabulary")
    return ids


def opt(args, name, default=None):
    if name in args:
        i = args.index(name)
        v = args[i + 1]
        del args[i:i + 2]
        return v
    return default


def main(argv):
    args = list(argv)
    ids_len, model_dir = opt(args, "--ids"), opt(args, "--model")
    vocab, max_tokens = opt(args, "--vocab"), opt(args, "--max-tokens")
    shared = int(opt(args, "--shared", "0"))
    jsonl_tokens = opt(args, "--jsonl")
    n = int(args[0])
    rng = random.Random(1234)
    if ids_len is not None:
        ids = vocabulary(model_dir, int(vocab) if vocab else None)
        lo, _, hi = ids_len.partition("-")
        lo, hi = int(lo), int(hi or lo)
        prefix = [rng.choice(ids) for _ in range(shared)]
        for i in range(n):
            own = rng.randint(lo, hi) if hi > lo else lo
            line = {"id": f"p{i}", "prompt": prefix + [rng.choice(ids) for _ in range(own)]}
            if max_tokens:
                line["max_tokens"] = int(max_tokens)
            print(json.dumps(line, separators=(",", ":")))
        return
    lo, hi = (int(args[1]), int(args[2])) if len(args) > 2 else (128, 1024)
    tokens = int(jsonl_tokens) if jsonl_tokens else None
    for i in range(n):
        want, words, chars = rng.randint(lo, hi) * 1.75, [], 0
        while chars < want:
            w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
            words.append(w)
            chars += len(w) + 1
        text = " ".join(words)
        print(json.dumps({"id": f"p{i}", "prompt": text, "max_tokens": tokens}) if tokens else text)


if __name__ == "__main__":
    main(sys.argv[1:])
