#!/usr/bin/env bash
# bench/throughput.sh — BENCH.md's offline-throughput section, on the GPU
# machine: N prompts of random lengths (about 128-1024 tokens of the bench
# models' tokenizer), 256 output tokens each (EOS ignored), greedy, through
# `cllm generate`; then the first SEQ prompts one at a time (--max-seqs 1) for
# the sequential rate (SEQ=0: not run). Each run writes its steps
# (--steps-csv), and bench/roofline.py sets them against the measured limits:
# the run's roofline (output tok/s) and the % of it reached, over the steps
# and over the whole process. Writes $OUT/$THROUGHPUT_NAME.json (default
# throughput.json) and prints a markdown summary.
#   bench/throughput.sh [MODEL_DIR] [N=1000] [SEQ=8]   (MODEL_DIR default: the random
#                        Llama-3-8B of bench/make_model.py in $BENCH_MODELS, made when missing)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS, BENCH_COMMIT); extra
# `cllm generate` options in THROUGHPUT_ARGS (e.g. "--pp 2"); THROUGHPUT_NAME.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
MODEL=${1:-}
N=${2:-1000}
SEQ=${3:-8}
NAME=${THROUGHPUT_NAME:-throughput}
[ -n "$MODEL" ] || MODEL=$(bench_model llama3-8b)
bench_limits || echo "throughput.sh: limits not measured; no % of limit" >&2
python3 bench/random_prompts.py "$N" > "$OUT/tp-prompts.txt"
head -n "$SEQ" "$OUT/tp-prompts.txt" > "$OUT/tp-seq-prompts.txt"
run() { # out-file, extra args, prompts: prints wall seconds
    local t0 t1
    t0=$(date +%s.%N)
    "$CLLM" generate --overwrite -m "$MODEL" -i "$3" -o "$1" -n 256 --ignore-eos --temp 0 -v --steps-csv "$1.csv" \
        ${THROUGHPUT_ARGS:-} $2 \
        2> "$1.log" >&2
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)"
}
rm -f "$OUT/tp-batched.jsonl.power.csv"
bench_power_start "$OUT/tp-batched.jsonl.power.csv"
batched=$(run "$OUT/tp-batched.jsonl" "" "$OUT/tp-prompts.txt") || { bench_power_stop; exit 1; }
bench_power_stop
single=0
[ "$SEQ" -gt 0 ] && single=$(run "$OUT/tp-single.jsonl" "--max-seqs 1" "$OUT/tp-seq-prompts.txt")
python3 - "$OUT" "$batched" "$single" "$MODEL" "$NAME" "${THROUGHPUT_ARGS:-}" <<'PY'
import glob, json, os, re, struct, sys
sys.path.insert(0, "bench")
import power, results, roofline
out, tb, ts, model, name, args = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]

def matrix_params(folder):
    """Elements of the layers' matrices and of the LM head, from the safetensors headers; a folder of
    config.json alone (bench/make_dummy_model.py, run with --dummy-weights) from the config's shape
    (roofline.shape_from_config: dense decoders); None for other formats (a GGUF file)."""
    layers = head = embed = 0
    files = glob.glob(os.path.join(folder, "*.safetensors"))
    if not files:
        cfg = results.load(os.path.join(folder, "config.json"))
        if not cfg:
            return None
        s = roofline.shape_from_config(cfg)
        return {"layers": s["layer_params"], "head": s["head_params"]}
    for p in files:
        with open(p, "rb") as f:
            hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for k, v in hdr.items():
            shape = v.get("shape", []) if isinstance(v, dict) else []
            if len(shape) != 2:
                continue
            n = shape[0] * shape[1]
            if ".layers." in k:
                layers += n
            elif k.startswith("lm_head"):
                head += n
            elif "embed_tokens" in k:
                embed += n
    return {"layers": layers, "head": head or embed}

def run(path, wall):
    if not os.path.exists(path):
        return None
    rows = [json.loads(l) for l in open(path)]
    log = open(path + ".log").read()
    steps = re.search(r"steps took ([0-9.]+) s; .* = ([0-9.]+)%", log)
    lens = sorted(r.get("prompt_tokens", 0) for r in rows)
    lim = results.load(f"{out}/limits.json") or {}
    rl = None
    if os.path.exists(path + ".csv") and lim.get("copy_tbps") and lim.get("matmul_tflops"):
        shape = roofline.model_shape(model, fp8_layers=roofline.fp8_layers_in_args(args))
        rl = roofline.roofline(roofline.read_steps(path + ".csv"), shape, lim,
                               kv_elem_bytes=roofline.kv_elem_bytes_in_args(args),
                               output_tokens=sum(r.get("completion_tokens", 0) for r in rows), wall_s=wall,
                               steps_s=float(steps.group(1)) if steps else None, gpus=roofline.gpus_in_args(args))
        print(f"{os.path.basename(path)}: {roofline.summary(rl)}", file=sys.stderr)
    wall_line = re.search(r"then [0-9.]+ s of which steps [0-9.]+ s = ([0-9.]+)% \(([0-9.]+)% of the whole\)", log)
    parts = re.search(r"^the load's ([0-9.]+) s: the model's tensors ([0-9.]+) s, finding the GPUs ([0-9.]+) s, "
                      r"backends, links and engine ([0-9.]+) s, the rest .* ([0-9.-]+) s$", log, re.M)
    closed = re.search(r"^closed in ([0-9.]+) s", log, re.M)
    return {"prompts": len(rows), "failed": sum(1 for r in rows if r.get("error")),
            "roofline": rl, "steps_pct_after_load": float(wall_line.group(1)) if wall_line else None,
            "prompt_tokens": sum(r.get("prompt_tokens", 0) for r in rows),
            "output_tokens": sum(r.get("completion_tokens", 0) for r in rows),
            "prompt_min": lens[0] if lens else 0, "prompt_max": lens[-1] if lens else 0, "wall_s": wall,
            "steps_s": float(steps.group(1)) if steps else None,
            "load_parts": dict(zip(("load_s", "model_s", "gpus_s", "open_s", "rest_s"), map(float, parts.groups())))
                          if parts else None,
            "close_s": float(closed.group(1)) if closed else None,
            "power": power.summarize(path + ".power.csv") or None,
            **roofline.generate_limits(log),
            "scheduler_pct": float(steps.group(2)) if steps else None}

b = run(f"{out}/tp-batched.jsonl", tb)
s = run(f"{out}/tp-single.jsonl", ts) if ts > 0 else None
doc = results.write_section(out, name, {
    "model": os.path.basename(model.rstrip("/")), "args": args, "output_tokens_each": 256,
    "matrix_params": matrix_params(model), "batched": b, "single": s}, gpus_used=roofline.gpus_in_args(args))
if not b:  # cllm generate failed before writing a line: its last words, not a traceback below
    log = f"{out}/tp-batched.jsonl.log"
    last = open(log).read().strip().splitlines()[-1:] if os.path.exists(log) else []
    sys.exit(f"throughput.sh: the batched run wrote no results: {last[0] if last else 'no log'}")

def rate(r, key):
    return r[key] / r["wall_s"] if r and r["wall_s"] > 0 else 0
print(f"## Offline throughput ({doc['model']}{', ' + args if args else ''})\n")
print(f"`bench/throughput.sh`: {b['prompts']} prompts ({b['failed']} failed), prompt tokens {b['prompt_min']}-"
      f"{b['prompt_max']} (mean {b['prompt_tokens'] / max(b['prompts'], 1):.0f}), 256 output tokens each, greedy, "
      f"EOS ignored; wall time of the whole `cllm generate` run (load included).\n")
print("| run | prompts | output tokens/s | total tokens/s | output tokens/s over the steps | wall s |")
print("| --- | --- | --- | --- | --- | --- |")
for label, r in (("batched", b), ("one at a time (--max-seqs 1)", s)):
    if r:
        over = f"{r['output_tokens'] / r['steps_s']:,.0f}" if r["steps_s"] else "?"
        print(f"| {label} | {r['prompts']} | {rate(r, 'output_tokens'):,.0f} | "
              f"{(r['prompt_tokens'] + r['output_tokens']) / r['wall_s']:,.0f} | {over} | {r['wall_s']:.1f} |")
ratio = f"{rate(b, 'output_tokens') / rate(s, 'output_tokens'):.1f}×" if rate(s, "output_tokens") else "n/a"
print(f"\nBatched ÷ one at a time (output tokens/s): {ratio}. Scheduler's own work (outside forward and sampling): "
      f"{b['scheduler_pct'] if b['scheduler_pct'] is not None else '?'}% of step time.")
for label, r in (("batched", b), ("one at a time", s)):
    if r and r["roofline"]:
        print(f"\nRoofline, {label}: {roofline.summary(r['roofline'])}.")
    elif r:
        print(f"\nRoofline, {label}: not computed (no limits.json with copy and matmul rates, or no steps CSV).")
PY
