#!/usr/bin/env bash
# bench/tp.sh — tensor parallelism on GPUs (issue 43): batch-1 decode and a
# prefill of a Llama-3-8B shape (random bf16 weights made in memory:
# bench/make_dummy_model.py, --dummy-weights) with `cllm bench` at --tp 1, 2
# and 4 over NCCL (as many as the GPUs allow), then --tp-nccl-sum, and on a
# machine of fewer GPUs --tp 2 with both ranks on GPU 0 (--gpus 0,0: the
# host-memory transport, a correctness path, not a fast one). Prints each
# run's tok/s and its ratio to --tp 1; the logs and JSON go to $OUT/tp-*.
#   bench/tp.sh            (CLLM: the binary, default ./cllm; OUT: default build/bench-out)
# Environment: TP_PROMPT (prefill length, default 2048), TP_CTX (decode
# contexts, default 128,4096), BENCH_TIMEOUT (seconds per run, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
LIMIT=${BENCH_TIMEOUT:-300}
gpus=$(bench_gpu_count)
[ "${gpus:-0}" -ge 1 ] || { echo "bench/tp.sh: needs a GPU" >&2; exit 2; }
DIR=$BENCH_MODELS/llama3-8b-dummy
[ -f "$DIR/config.json" ] || python3 bench/make_dummy_model.py llama3-8b "$DIR" > /dev/null || exit 1
rm -f "$OUT"/tp-*.json "$OUT"/tp-*.log

runs=("1|" "2|--tp 2" "2s|--tp 2 --tp-nccl-sum" "4|--tp 4" "4s|--tp 4 --tp-nccl-sum" "2h|--tp 2 --gpus 0,0")
for run in "${runs[@]}"; do
    name=${run%%|*} args=${run#*|}
    n=${name%[sh]}
    if [ "$name" != 2h ] && [ "$n" -gt "$gpus" ]; then echo "== $args: skip: needs $n GPUs, this machine has $gpus"; continue; fi
    [ "$name" = 2h ] && [ "$gpus" -ge 2 ] && continue  # the host transport: where NCCL cannot be had
    echo "== cllm bench ${args:---tp 1}"
    # shellcheck disable=SC2086
    timeout "$LIMIT" "$CLLM" bench -m "$DIR" --dummy-weights $args --prompt-lens "${TP_PROMPT:-2048}" \
        --ctx "${TP_CTX:-128,4096}" --json "$OUT/tp-$name.json" > "$OUT/tp-$name.log" 2>&1
    rc=$?
    grep -E '^(prefill|decode at)' "$OUT/tp-$name.log"
    [ $rc = 0 ] || { echo "   exit $rc: $(tail -2 "$OUT/tp-$name.log")"; rm -f "$OUT/tp-$name.json"; }
done

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
label = {"1": "--tp 1", "2": "--tp 2", "2s": "--tp 2 --tp-nccl-sum", "4": "--tp 4", "4s": "--tp 4 --tp-nccl-sum",
         "2h": "--tp 2 --gpus 0,0 (host memory)"}
runs = {k: json.load(open(f"{out}/tp-{k}.json")) for k in label if os.path.exists(f"{out}/tp-{k}.json")}
base = runs.get("1")
if not base:
    print("bench/tp.sh: no --tp 1 result"); sys.exit(1)
cols = [f"prefill {p['tokens']}" for p in base["prefill"]] + [f"decode @{d['ctx']}" for d in base["decode"]]
print("\n| run | " + " | ".join(f"{c} tok/s (x --tp 1)" for c in cols) + " |")
print("| --- |" + " --- |" * len(cols))
for k, r in runs.items():
    vals = [p["tok_s"] for p in r["prefill"]] + [d["tok_s"] for d in r["decode"]]
    ref = [p["tok_s"] for p in base["prefill"]] + [d["tok_s"] for d in base["decode"]]
    print(f"| {label[k]} | " + " | ".join(f"{v:.1f} ({v / b:.2f}x)" if b else f"{v:.1f}" for v, b in zip(vals, ref)) + " |")
PY
