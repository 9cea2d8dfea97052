#!/usr/bin/env bash
# bench/single.sh — BENCH.md's single-GPU section, on the GPU machine: for each
# model, the random-weight shape made by bench/make_model.py (when missing),
# `cllm bench` on it and the transformers reference (bench/hf_reference.py)
# on the same folder; writes $OUT/single.json (after each model, so a run
# cut short keeps what it measured).
#   bench/single.sh [--tiny] [MODEL...]     MODEL: llama3-8b, gemma2-9b (default: both)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS, BENCH_COMMIT), and
# BENCH_PROMPT_LENS / BENCH_CTX / BENCH_DECODE_TOKENS / BENCH_REPS (default
# 512,4096 / 128,4096 / 64 / 3), BENCH_TIMEOUT (seconds per step, default 300),
# BENCH_NO_HF=1 (cllm alone).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
LENS=${BENCH_PROMPT_LENS:-512,4096}
CTX=${BENCH_CTX:-128,4096}
STEPS=${BENCH_DECODE_TOKENS:-64}
REPS=${BENCH_REPS:-3}
LIMIT=${BENCH_TIMEOUT:-300}
TINY=""
MODELS=()
for a in "$@"; do
    case $a in
        --tiny) TINY=--tiny ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) MODELS+=("$a") ;;
    esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(llama3-8b gemma2-9b)
bench_limits || exit 1
read -r -a peak <<< "$(bench_peak_args)"
# collect: OUT/single.json from every model tried so far (an error in place
# of a model's figures where a step failed)
collect() {
    python3 - "$OUT" "$LENS" "$CTX" "$STEPS" "$REPS" "${names[@]}" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import results
out, lens, ctx, steps, reps, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
def text(path):
    return open(path).read().strip() if os.path.exists(path) else None
models = []
for n in names:
    p = os.path.join(out, f"single-{n}")
    models.append({"name": n, "cllm": results.load(p + ".cllm.json"), "error": text(p + ".error"),
                   "hf": results.load(p + ".hf.json"), "hf_error": text(p + ".hf.error")})
results.write_section(out, "single", {"settings": {"prompt_lens": lens, "ctx": ctx, "decode_tokens": int(steps),
                                                   "reps": int(reps)}, "models": models})
PY
}
names=()
ok=0
for m in "${MODELS[@]}"; do
    name=$m${TINY:+-tiny}
    names+=("$name")
    rm -f "$OUT/single-$name".*
    if ! dir=$(bench_model "$m" $TINY); then
        echo "bench/make_model.py $m failed" > "$OUT/single-$name.error"
        collect
        continue
    fi
    echo "== cllm bench $name"
    timeout "$LIMIT" "$CLLM" bench -m "$dir" --prompt-lens "$LENS" --ctx "$CTX" --decode-tokens "$STEPS" \
        --reps "$REPS" "${peak[@]}" --json "$OUT/single-$name.cllm.json" > "$OUT/single-$name.cllm.log" 2>&1
    rc=$?
    cat "$OUT/single-$name.cllm.log"
    if [ $rc != 0 ]; then
        echo "cllm bench exit $rc: $(tail -1 "$OUT/single-$name.cllm.log")" > "$OUT/single-$name.error"
        rm -f "$OUT/single-$name.cllm.json"
        collect
        continue
    fi
    ok=1
    if [ "${BENCH_NO_HF:-0}" != 1 ]; then
        echo "== transformers $name"
        timeout "$LIMIT" python3 bench/hf_reference.py "$dir" --prompt-lens "$LENS" --ctx "$CTX" \
            --decode-tokens "$STEPS" --reps "$REPS" --json "$OUT/single-$name.hf.json" > "$OUT/single-$name.hf.log" 2>&1
        rc=$?
        tail -5 "$OUT/single-$name.hf.log"
        if [ $rc != 0 ]; then
            echo "transformers exit $rc: $(tail -1 "$OUT/single-$name.hf.log")" > "$OUT/single-$name.hf.error"
            rm -f "$OUT/single-$name.hf.json"
        fi
    else
        echo "not run (BENCH_NO_HF=1)" > "$OUT/single-$name.hf.error"
    fi
    collect
done
[ $ok = 1 ]
