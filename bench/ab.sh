#!/usr/bin/env bash
# bench/ab.sh — two cllm binaries on one GPU in one run, interleaved (A B, then
# B A, ...), so a change is judged against its baseline on the same machine at
# the same time: `cllm bench` on a random-weight Llama-3-8B shape (no weight
# file: --dummy-weights) per weight type, then bench/throughput.sh's offline
# run through the scheduler. Prints one table; the JSON stays in $OUT/ab.
#   bench/ab.sh OLD_CLLM NEW_CLLM [ROUNDS=2]
# Environment: AB_TYPES (default "bf16 q8_0 q4_k"), AB_PROMPT_LENS (512,4096),
# AB_CTX (128,4096), AB_THROUGHPUT_N (prompts of the offline run, default 1000;
# 0: not run), and bench/lib.sh's OUT and BENCH_MODELS.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
BIN=("$1" "$2")
ROUNDS=${3:-2}
TYPES=${AB_TYPES:-bf16 q8_0 q4_k}
N=${AB_THROUGHPUT_N:-1000}
AB=$OUT/ab
mkdir -p "$AB"
MODEL=$BENCH_MODELS/llama3-8b-dummy
[ -f "$MODEL/config.json" ] || python3 bench/make_dummy_model.py llama3-8b "$MODEL" >&2
nvidia-smi --query-gpu=name --format=csv,noheader | head -1

for ((r = 0; r < ROUNDS; r++)); do
    for t in $TYPES; do
        for k in $(if ((r % 2)); then echo 1 0; else echo 0 1; fi); do
            "${BIN[$k]}" bench -m "$MODEL" --dummy-weights="$t" --prompt-lens "${AB_PROMPT_LENS:-512,4096}" \
                --ctx "${AB_CTX:-128,4096}" --json "$AB/bench-$t-$k-$r.json" > "$AB/bench-$t-$k-$r.log" 2>&1 ||
                { echo "ab.sh: ${BIN[$k]} bench --dummy-weights=$t failed:" >&2; tail -5 "$AB/bench-$t-$k-$r.log" >&2; exit 1; }
        done
    done
done
if [ "$N" -gt 0 ]; then
    for k in 0 1; do
        CLLM=${BIN[$k]} THROUGHPUT_ARGS=--dummy-weights THROUGHPUT_NAME=ab/throughput-$k \
            bench/throughput.sh "$MODEL" "$N" 0 > "$AB/throughput-$k.md"
    done
fi

python3 - "$AB" "$ROUNDS" "$TYPES" "${BIN[0]}" "${BIN[1]}" <<'PY'
import json, os, statistics, sys
ab, rounds, types, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
print(f"A = {old}\nB = {new}\n")
print("| weights | measure | A | B | B/A |")
print("| --- | --- | --- | --- | --- |")
def load(t, k):
    return [json.load(open(f"{ab}/bench-{t}-{k}-{r}.json")) for r in range(rounds)]
for t in types:
    a, b = load(t, 0), load(t, 1)
    for i, p in enumerate(a[0]["prefill"]):   # the best of the rounds: noise only slows a run down
        x = max(d["prefill"][i]["tok_s"] for d in a); y = max(d["prefill"][i]["tok_s"] for d in b)
        print(f"| {t} | prefill {p['tokens']} tok/s | {x:,.0f} | {y:,.0f} | {y / x:.3f} |")
    for i, p in enumerate(a[0]["decode"]):
        x = min(d["decode"][i]["step_s"] for d in a) * 1e3; y = min(d["decode"][i]["step_s"] for d in b) * 1e3
        print(f"| {t} | decode ctx {p['ctx']} ms/step | {x:.3f} | {y:.3f} | {y / x:.3f} |")
for k, label in ((0, "A"), (1, "B")):
    path = f"{ab}/throughput-{k}.md"
    if os.path.exists(path):
        print(f"\n### offline throughput, {label}\n")
        print(open(path).read())
PY
