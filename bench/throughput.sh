#!/usr/bin/env bash
# bench/throughput.sh — offline batch throughput through the scheduler, on
# the GPU machine: N prompts of random lengths (about 128-1024 tokens of the
# bench models' tokenizer), 256 output tokens each (EOS ignored), greedy,
# through `cllm generate`; then the first SEQ prompts one at a time
# (--max-seqs 1) for the sequential rate. Prints a markdown section.
#   bench/throughput.sh MODEL_DIR [N=1000] [SEQ=8]
# Environment: CLLM (binary, default ./cllm), OUT (work folder, default
# build/bench-out), extra `cllm generate` options in THROUGHPUT_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/throughput.sh MODEL_DIR [N] [SEQ]}
N=${2:-1000}
SEQ=${3:-8}
CLLM=${CLLM:-./cllm}
OUT=${OUT:-build/bench-out}
mkdir -p "$OUT"
# ~1.75 characters per token (measured: 2.2 gave 163-1292 tokens) for the synthetic byte-pair tokenizer of
# bench/make_model.py; the real counts come back in prompt_tokens.
python3 - "$N" > "$OUT/tp-prompts.txt" <<'PY'
import random, string, sys
rng = random.Random(1234)
for i in range(int(sys.argv[1])):
    want = rng.randint(128, 1024) * 1.75
    words, n = [], 0
    while n < want:
        w = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
        words.append(w)
        n += len(w) + 1
    print(" ".join(words))
PY
head -n "$SEQ" "$OUT/tp-prompts.txt" > "$OUT/tp-seq-prompts.txt"
run() { # out-file, extra args: prints wall seconds
    local t0 t1
    t0=$(date +%s.%N)
    "$CLLM" generate -m "$MODEL" -i "$3" -o "$1" -n 256 --ignore-eos --temp 0 -v ${THROUGHPUT_ARGS:-} $2 \
        2> "$1.log" >&2
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)"
}
batched=$(run "$OUT/tp-batched.jsonl" "" "$OUT/tp-prompts.txt")
single=$(run "$OUT/tp-single.jsonl" "--max-seqs 1" "$OUT/tp-seq-prompts.txt")
python3 - "$OUT" "$batched" "$single" "$MODEL" <<'PY'
import json, re, sys
out, tb, ts, model = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def load(p):
    rows = [json.loads(l) for l in open(p)]
    return rows, sum(r.get("prompt_tokens", 0) for r in rows), sum(r.get("completion_tokens", 0) for r in rows)
b, bp, bc = load(f"{out}/tp-batched.jsonl")
s, sp, sc = load(f"{out}/tp-single.jsonl")
errs = sum(1 for r in b if r.get("error"))
sched = re.search(r"scheduler's own work .* = ([0-9.]+)%", open(f"{out}/tp-batched.jsonl.log").read())
lens = sorted(r.get("prompt_tokens", 0) for r in b)
print(f"## Offline throughput ({model.rstrip('/').split('/')[-1]})\n")
print(f"`bench/throughput.sh`: {len(b)} prompts ({errs} failed), prompt tokens {lens[0]}-{lens[-1]} "
      f"(mean {bp / max(len(b), 1):.0f}), 256 output tokens each, greedy, EOS ignored; wall time of the whole "
      f"`cllm generate` run (load included).\n")
print("| run | prompts | output tokens/s | total tokens/s | wall s |")
print("| --- | --- | --- | --- | --- |")
print(f"| batched (default --max-seqs 256, --max-batched-tokens 8192) | {len(b)} | {bc / tb:,.0f} | {(bp + bc) / tb:,.0f} | {tb:.1f} |")
print(f"| one at a time (--max-seqs 1), first {len(s)} prompts | {len(s)} | {sc / ts:,.0f} | {(sp + sc) / ts:,.0f} | {ts:.1f} |")
ratio = f"{(bc / tb) / (sc / ts):.1f}×" if sc > 0 and tb > 0 else "n/a (no output tokens)"
print(f"\nBatched ÷ one at a time (output tokens/s): {ratio}. "
      f"Scheduler's own work (outside forward and sampling): {sched.group(1) if sched else '?'}% of step time.")
PY
