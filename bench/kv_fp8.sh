#!/usr/bin/env bash
# bench/kv_fp8.sh — BENCH.md's FP8 KV section (issue 7): the fp8 KV cache
# (--kv-dtype fp8) against the bf16 one, whole-model decode at long context,
# on the GPU machine; writes $OUT/kv_fp8.json.
#   bench/kv_fp8.sh [MODEL_DIR]   (default: the random Llama-3-8B of bench/make_model.py
#                                  in $BENCH_MODELS, made when missing)
# `cllm bench --kv-dtype bf16|fp8` at contexts $KV_CTX (default 8192,32000),
# batch 1 and batch $KV_BATCH (default 8), $KV_DECODE_TOKENS (default 32) timed
# steps each; extra `cllm bench` options in KV_ARGS (e.g. --dummy-weights=q4_k).
# Bytes per step count the weights and the K/V as each cache holds them (fp8:
# codes + scales). The KV capacity is the cache each run allocated (what
# --gpu-mem-util leaves). Environment: see bench/lib.sh; BENCH_TIMEOUT (default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
CTX=${KV_CTX:-8192,32000}
BATCH=${KV_BATCH:-8}
STEPS=${KV_DECODE_TOKENS:-32}
LIMIT=${BENCH_TIMEOUT:-300}
DIR=${1:-}
[ -n "$DIR" ] || DIR=$(bench_model llama3-8b) || exit 1
bench_limits || exit 1
read -r -a peak <<< "$(bench_peak_args)"
read -r -a extra <<< "${KV_ARGS:-}"
rm -f "$OUT"/kv-*
for kv in bf16 fp8; do
    for b in 1 "$BATCH"; do
        echo "== KV $kv, batch $b"
        timeout "$LIMIT" "$CLLM" bench -m "$DIR" --kv-dtype $kv --prompt-lens 16 --ctx "$CTX" --decode-tokens "$STEPS" \
            --reps 1 --batch "$b" "${extra[@]}" "${peak[@]}" --json "$OUT/kv-$kv-b$b.json" > "$OUT/kv-$kv-b$b.txt" 2>&1
        rc=$?
        cat "$OUT/kv-$kv-b$b.txt"
        [ $rc = 0 ] || { echo "--kv-dtype $kv --batch $b: exit $rc: $(tail -1 "$OUT/kv-$kv-b$b.txt")" >> "$OUT/kv-errors";
                         rm -f "$OUT/kv-$kv-b$b.json"; }
    done
done
python3 - "$OUT" "$DIR" "$BATCH" "$CTX" "$STEPS" "${KV_ARGS:-}" <<'PY'
import os, re, sys
sys.path.insert(0, "bench")
import results
out, model, batch, ctx, steps, args = sys.argv[1:7]
runs, kv_tokens = [], {}
for kv in ("bf16", "fp8"):
    for b in sorted({1, int(batch)}):
        txt = os.path.join(out, f"kv-{kv}-b{b}.txt")
        m = re.search(r"^KV cache \S+, (\d+) tokens", open(txt).read(), re.M) if os.path.exists(txt) else None
        if m:
            kv_tokens[kv] = int(m.group(1))
        runs.append({"kv": kv, "batch": b, "bench": results.load(os.path.join(out, f"kv-{kv}-b{b}.json"))})
err = os.path.join(out, "kv-errors")
results.write_section(out, "kv_fp8", {
    "model": os.path.basename(model.rstrip("/")), "args": args,
    "settings": {"ctx": ctx, "batch": int(batch), "decode_tokens": int(steps)},
    "kv_tokens": kv_tokens, "runs": runs, "error": open(err).read().strip() if os.path.exists(err) else None})
sys.exit(0 if all(r["bench"] for r in runs) else 1)
PY
