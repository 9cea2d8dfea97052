#!/usr/bin/env bash
# bench/cascade.sh — cascade attention's workload (issue 39): CASCADE_PROMPTS
# prompts of random token ids sharing one CASCADE_PREFIX-token prefix (a
# system prompt) with own suffixes of CASCADE_SUFFIX tokens, exactly
# CASCADE_OUT output tokens each (--ignore-eos -n), greedy, through `cllm
# generate` twice: cascade on (the default) and CLLM_CASCADE=off. Prints the
# output tokens/s of both over the whole process and over the steps (`-v`'s
# "steps took": after the load, which both runs share), their ratios (the
# goal: >= 1.5x) and how many outputs differ (0 expected on the CPU at fp32;
# within bf16 tolerance on a GPU); writes $OUT/cascade.json. Exit 1 when a run failed or a result is
# missing. CLLM_CASCADE is read by the CPU backend; the CUDA backend ignores
# the plan until its kernel exists, so there both runs measure the same path.
#   bench/cascade.sh [MODEL_DIR]   (default: the random Llama-3-8B of bench/make_model.py)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS);
#   CASCADE_PROMPTS  prompts (default 1000)
#   CASCADE_PREFIX   shared prefix tokens (default 2000)
#   CASCADE_SUFFIX   each prompt's own tokens, LO-HI (default 64-256)
#   CASCADE_OUT      output tokens per prompt (default 128)
#   CASCADE_ARGS     extra `cllm generate` options
# A CPU smoke test on the tiny fixture model:
#   CASCADE_PROMPTS=16 CASCADE_PREFIX=320 CASCADE_SUFFIX=8-32 CASCADE_OUT=16 \
#   CASCADE_ARGS="--cpu -c 512" bench/cascade.sh tests/fixtures/tiny/llama
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
MODEL=${1:-}
N=${CASCADE_PROMPTS:-1000}
PREFIX=${CASCADE_PREFIX:-2000}
SUFFIX=${CASCADE_SUFFIX:-64-256}
NOUT=${CASCADE_OUT:-128}
[ -n "$MODEL" ] || MODEL=$(bench_model llama3-8b)
base=$OUT/cascade
python3 bench/random_prompts.py "$N" --ids "$SUFFIX" --shared "$PREFIX" --model "$MODEL" > "$base.prompts.jsonl"
rc=0
for mode in on off; do
    rm -f "$base-$mode.jsonl"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086  # CASCADE_ARGS is a list of options
    CLLM_CASCADE=$mode "$CLLM" generate --overwrite -m "$MODEL" -i "$base.prompts.jsonl" -o "$base-$mode.jsonl" \
        -n "$NOUT" --ignore-eos --temp 0 -v ${CASCADE_ARGS:-} 2> "$base-$mode.log" >&2 || rc=$?
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)" > "$base-$mode.wall"
    [ $rc = 0 ] || { echo "cascade.sh: cascade $mode: cllm generate exit $rc: $(tail -1 "$base-$mode.log")" >&2; exit 1; }
done
python3 - "$base" "$N" "$PREFIX" "$SUFFIX" "$NOUT" <<'PY'
import json, re, sys
base, n, prefix, suffix, nout = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
runs = {}
for mode in ("on", "off"):
    lines = [json.loads(l) for l in open(f"{base}-{mode}.jsonl")]
    wall = float(open(f"{base}-{mode}.wall").read())
    bad = [l for l in lines if "error" in l or l.get("completion_tokens") != nout]
    if len(lines) != n or bad:
        sys.exit(f"cascade.sh: cascade {mode}: {len(lines)} results of {n}, {len(bad)} failed or short")
    tokens = sum(l["completion_tokens"] for l in lines)
    steps = re.search(r"^steps took ([0-9.]+) s", open(f"{base}-{mode}.log").read(), re.M)
    if not steps or float(steps.group(1)) <= 0:
        sys.exit(f"cascade.sh: cascade {mode}: no 'steps took' line in {base}-{mode}.log")
    steps_s = float(steps.group(1))
    runs[mode] = {"wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall, "steps_s": steps_s,
                  "steps_tok_s": tokens / steps_s, "text": {str(l["id"]): l["text"] for l in lines}}
differ = sum(runs["on"]["text"][k] != runs["off"]["text"].get(k) for k in runs["on"]["text"])
ratio = runs["on"]["output_tok_s"] / runs["off"]["output_tok_s"]
steps_ratio = runs["on"]["steps_tok_s"] / runs["off"]["steps_tok_s"]
print(f"cascade: {n} prompts, shared prefix {prefix} tokens, suffixes {suffix}, {nout} output tokens each")
print("| cascade | wall s | output tokens | output tok/s | steps s | output tok/s over the steps |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for mode in ("on", "off"):
    r = runs[mode]
    print(f"| {mode} | {r['wall_s']:.2f} | {r['output_tokens']} | {r['output_tok_s']:.1f} | {r['steps_s']:.2f} | "
          f"{r['steps_tok_s']:.1f} |")
print(f"on / off: {ratio:.2f}x over the whole process, {steps_ratio:.2f}x over the steps (goal >= 1.5x); "
      f"outputs that differ: {differ} of {n}")
for r in runs.values():
    del r["text"]
json.dump({"prompts": n, "prefix": int(prefix), "suffix": suffix, "output_tokens": nout, "runs": runs,
           "ratio": ratio, "steps_ratio": steps_ratio, "outputs_differ": differ}, open(f"{base}.json", "w"), indent=1)
PY
rm -f "$base.prompts.jsonl"
