#!/usr/bin/env bash
# bench/tp.sh — BENCH.md's tensor_parallel section (issue 43): tensor
# parallelism (--tp N) against one GPU. Writes $OUT/tensor_parallel.json; its
# own logs and JSON are $OUT/tensor-* (not tp-*: bench/throughput.sh's files
# in the same folder are tp-*).
#  1. The Llama-3-8B shape (random bf16 weights made in memory:
#     bench/make_dummy_model.py, --dummy-weights), `cllm bench` (prefill
#     TP_PROMPT, batch-1 decode at TP_CTX) at --tp 1, --tp 2, --tp 2
#     --tp-nccl-sum, with >= 4 GPUs --tp 4 and --tp 4 --tp-nccl-sum, with >= 8
#     --tp 8; on a
#     one-GPU machine --tp 2 --gpus 0,0 instead (both ranks on GPU 0, the
#     host-memory transport: a correctness path, not a fast one).
#  2. >= 2 GPUs (TP_70B=0 leaves it out): the Llama-3-70B shape on G GPUs
#     (G = 8, 4 or 2: the most the GPUs allow): `cllm info --tp G` (memory
#     per GPU), then `cllm bench --tp G` and `--pp G` (prefill 512, decode at
#     128). With >= 8 GPUs (issue 44) the Llama-3.1-405B shape in Q4_K
#     (--dummy-weights=q4_k) at --tp 8, --pp 2 --tp 4 and --pp 8: `cllm
#     bench` and bench/throughput.sh (TP_N prompts) each.
#  3. >= 2 GPUs (TP_THROUGHPUT=0 leaves it out): bench/throughput.sh on the 8B
#     shape with THROUGHPUT_ARGS="--dummy-weights --tp 2" (>= 4 GPUs also
#     --tp 4, --pp 2 --tp 2, --pp 4), TP_N prompts, each in $OUT/tensor-thr-NAME/.
# A run that fails (or passes BENCH_TIMEOUT) is named in the section's "error"
# and the others go on; the exit status is non-zero only when --tp 1 failed.
#   bench/tp.sh            (CLLM: the binary, default ./cllm; OUT: default build/bench-out)
# Environment: see bench/lib.sh; TP_PROMPT (prefill length, default 2048),
# TP_CTX (decode contexts, default 128,4096), TP_N (prompts of the throughput
# runs, default 1000), TP_70B, TP_THROUGHPUT, BENCH_TIMEOUT (seconds per run,
# default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
LIMIT=${BENCH_TIMEOUT:-300}
gpus=$(bench_gpu_count)
[ "${gpus:-0}" -ge 1 ] || { echo "bench/tp.sh: needs a GPU" >&2; exit 2; }
bench_limits || exit 1
read -r -a peak <<< "$(bench_peak_args)"
DIR=$BENCH_MODELS/llama3-8b-dummy
[ -f "$DIR/config.json" ] || python3 bench/make_dummy_model.py llama3-8b "$DIR" > /dev/null || exit 1
rm -rf "$OUT"/tensor-*
ERR=$OUT/tensor-errors

# tp_bench NAME MODEL_DIR ARGS...: `cllm bench --dummy-weights ARGS` into
# $OUT/tensor-NAME.json and .log; a failure is a line in $ERR (no JSON left).
# DW: the --dummy-weights option (default plain: bf16).
tp_bench() {
    local name=$1 dir=$2 rc
    shift 2
    echo "== cllm bench ${DW:---dummy-weights} $*"
    timeout "$LIMIT" "$CLLM" bench -m "$dir" "${DW:---dummy-weights}" "$@" "${peak[@]}" \
        --json "$OUT/tensor-$name.json" > "$OUT/tensor-$name.log" 2>&1
    rc=$?
    grep -E '^(prefill [0-9]|decode at)' "$OUT/tensor-$name.log"
    if [ $rc != 0 ]; then
        echo "cllm bench $* exit $rc: $(tail -1 "$OUT/tensor-$name.log" | cut -c1-200)" | tee -a "$ERR"
        rm -f "$OUT/tensor-$name.json"
    fi
}

# 1. The 8B shape. NAME|GPUS|ARGS; the host-memory run only where NCCL between
# two GPUs cannot be had (one GPU: both ranks share it, so its limit is one GPU's).
runs=("tp1|1|--tp 1" "tp2|2|--tp 2" "tp2s|2|--tp 2 --tp-nccl-sum" "tp4|4|--tp 4" "tp4s|4|--tp 4 --tp-nccl-sum"
      "tp8|8|--tp 8")
[ "$gpus" -lt 2 ] && runs+=("tp2h|1|--tp 2 --gpus 0,0")
ran=()
for run in "${runs[@]}"; do
    IFS='|' read -r name n args <<< "$run"
    if [ "$n" -gt "$gpus" ]; then echo "== $args: skip: needs $n GPUs, this machine has $gpus"; continue; fi
    # shellcheck disable=SC2086
    tp_bench "$name" "$DIR" $args --prompt-lens "${TP_PROMPT:-2048}" --ctx "${TP_CTX:-128,4096}"
    ran+=("$run")
done

# 2. The 70B shape (141 GB of weights: more than one GPU holds) on G GPUs,
# split by heads (--tp G) and by layers (--pp G: batch-1 decode runs the stages in turn).
G=0
if [ "$gpus" -ge 2 ] && [ "${TP_70B:-1}" != 0 ]; then
    G=$((gpus >= 8 ? 8 : gpus >= 4 ? 4 : 2))
    big=$BENCH_MODELS/llama3-70b
    echo "== llama3-70b shape, --dummy-weights, --tp $G and --pp $G"
    if [ -f "$big/config.json" ] || python3 bench/make_dummy_model.py llama3-70b "$big" > "$OUT/tensor-70b-info.log" 2>&1; then
        "$CLLM" info "$big" --dummy-weights --tp $G > "$OUT/tensor-70b-info.log" 2>&1 ||
            echo "cllm info --dummy-weights --tp $G exit $?: $(tail -1 "$OUT/tensor-70b-info.log" | cut -c1-200)" | tee -a "$ERR"
        cat "$OUT/tensor-70b-info.log"
        tp_bench 70b-tp "$big" --tp $G --prompt-lens 512 --ctx 128
        tp_bench 70b-pp "$big" --pp $G --prompt-lens 512 --ctx 128
    else
        echo "make_dummy_model.py llama3-70b failed: $(tail -1 "$OUT/tensor-70b-info.log")" | tee -a "$ERR"
    fi
fi

# 2b. >= 8 GPUs: the 405B shape in Q4_K (228.8 GB) three ways, each `cllm bench` and 1000-prompt throughput.
huge=()
if [ "$gpus" -ge 8 ] && [ "${TP_70B:-1}" != 0 ]; then
    h=$BENCH_MODELS/llama3.1-405b
    if [ -f "$h/config.json" ] || python3 bench/make_dummy_model.py llama3.1-405b "$h" > /dev/null 2>&1; then
        huge=("405b-tp8|8|--tp 8" "405b-pp2tp4|8|--pp 2 --tp 4" "405b-pp8|8|--pp 8")
        for run in "${huge[@]}"; do
            IFS='|' read -r name n args <<< "$run"
            # shellcheck disable=SC2086
            DW=--dummy-weights=q4_k tp_bench "$name" "$h" $args --prompt-lens 512 --ctx 128
            bench_throughput "tensor-thr-$name" "$h" "${TP_N:-1000}" "--dummy-weights=q4_k $args" "$ERR"
        done
    else
        echo "make_dummy_model.py llama3.1-405b failed" | tee -a "$ERR"
    fi
fi

# 3. Offline throughput of the 8B shape. throughput.sh takes the config-only
# folder: with --dummy-weights in THROUGHPUT_ARGS cllm makes the weights, and
# its roofline and matrix FLOPs come from config.json (no safetensors to read).
thr=()
if [ "$gpus" -ge 2 ] && [ "${TP_THROUGHPUT:-1}" != 0 ]; then
    thr=("tp2|2|--tp 2")
    [ "$gpus" -ge 4 ] && thr+=("tp4|4|--tp 4" "pp2-tp2|4|--pp 2 --tp 2" "pp4|4|--pp 4")
fi
for run in "${thr[@]}"; do
    IFS='|' read -r name n args <<< "$run"
    bench_throughput "tensor-thr-$name" "$DIR" "${TP_N:-1000}" "--dummy-weights $args" "$ERR"
done

python3 - "$OUT" "$gpus" "$G" "${TP_PROMPT:-2048}" "${TP_CTX:-128,4096}" "$(printf '%s;' "${ran[@]}")" \
    "$(printf '%s;' "${thr[@]}")" "$(printf '%s;' "${huge[@]}")" <<'PY'
import os, re, sys
sys.path.insert(0, "bench")
import results
out, gpus, big_gpus, prompt, ctx, ran, thr, huge = sys.argv[1:9]
gpus, big_gpus = int(gpus), int(big_gpus)


def runs(text):
    """The NAME|GPUS|ARGS entries that bash joined, each ending in ';'."""
    return [r.split("|", 2) for r in text.split(";") if r]


def info_gpu_lines(path):
    """`cllm info --tp G`'s placement lines, one per GPU: its ranks and their memory."""
    try:
        text = open(path).read()
    except OSError:
        return []
    return [f"{m.group(1)}: {m.group(2)}" for m in re.finditer(r"^\s+(GPU \d+)\s+(.*\S)\s*$", text, re.M)]


def label(args):
    return args + (" (host memory)" if "--gpus 0,0" in args else "")


err = os.path.join(out, "tensor-errors")
bench = [{"name": n, "args": label(a), "gpus": int(g), "bench": results.load(os.path.join(out, f"tensor-{n}.json"))}
         for n, g, a in runs(ran)]
big = None
if big_gpus:
    big = {"model": "llama3-70b", "gpus": big_gpus, "info": info_gpu_lines(os.path.join(out, "tensor-70b-info.log")),
           "tp": results.load(os.path.join(out, "tensor-70b-tp.json")),
           "pp": results.load(os.path.join(out, "tensor-70b-pp.json"))}
throughput = []
for n, g, a in runs(thr):
    doc = results.load(os.path.join(out, f"tensor-thr-{n}", "throughput.json")) or {}
    throughput.append({"name": n, "args": a, "gpus": int(g), "batched": doc.get("batched"),
                       "matrix_params": doc.get("matrix_params")})
huge_runs = []
for n, g, a in runs(huge):
    doc = results.load(os.path.join(out, f"tensor-thr-{n}", "throughput.json")) or {}
    huge_runs.append({"name": n, "args": a, "gpus": int(g), "bench": results.load(os.path.join(out, f"tensor-{n}.json")),
                      "batched": doc.get("batched")})
used = max([r["gpus"] for r in bench + throughput + huge_runs] + [big_gpus, 1])
results.write_section(out, "tensor_parallel", {
    "model": "llama3-8b", "prompt_lens": prompt, "ctx": ctx, "runs": bench, "big": big, "throughput": throughput,
    "huge": {"model": "llama3.1-405b", "weights": "q4_k", "runs": huge_runs} if huge_runs else None,
    "error": open(err).read().strip() if os.path.exists(err) else None}, gpus_used=used)
base = next((r for r in bench if r["name"] == "tp1"), None)
if not base or not base["bench"]:
    sys.exit("bench/tp.sh: no --tp 1 result")
# the old printout: each run's tok/s and its ratio to --tp 1 (BENCH.md has the whole table)
ref = [p["tok_s"] for p in base["bench"]["prefill"]] + [d["tok_s"] for d in base["bench"]["decode"]]
cols = [f"prefill {p['tokens']}" for p in base["bench"]["prefill"]] + [f"decode @{d['ctx']}" for d in base["bench"]["decode"]]
print("\n| run | " + " | ".join(f"{c} tok/s (x --tp 1)" for c in cols) + " |")
print("| --- |" + " --- |" * len(cols))
for r in bench:
    if r["bench"]:
        vals = [p["tok_s"] for p in r["bench"]["prefill"]] + [d["tok_s"] for d in r["bench"]["decode"]]
        print(f"| {r['args']} | " + " | ".join(f"{v:.1f} ({v / b:.2f}x)" if b else f"{v:.1f}" for v, b in zip(vals, ref)) + " |")
PY
