#!/usr/bin/env python3
"""real_prompts.py — 64 short chat prompts for the batched-vs-one-at-a-time
check of tests/gpu/run.sh on the real models (printed one per line)."""
TOPICS = ["the sea", "a red bicycle", "winter", "coffee", "mountains", "a lost key", "the moon", "trains",
          "libraries", "rain", "a small dog", "bread", "music", "the desert", "clocks", "gardens"]
VERBS = ["Write one sentence about", "Give two facts about", "Describe", "Tell a short story about"]
for i in range(64):
    print(f"{VERBS[i % 4]} {TOPICS[(i * 7) % 16]} (number {i}).")
