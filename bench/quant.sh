#!/usr/bin/env bash
# bench/quant.sh — BENCH.md's quantized-weights section (issue 7), on the GPU
# machine: a random-weight Llama-3-8B-shaped model (bench/make_model.py --gguf,
# BF16), quantized by `cllm quantize` to each of TYPES, then `cllm bench` on
# each file with the weights quantized on the GPU and with --bf16-weights (the
# same numbers dequantized to bf16 at load: the bf16 path), in the same run:
# prefill and decode. The decode bytes count the weights as the GPU holds them.
# (Each quantized kernel alone: tests/gpu/test_quant --time.) Writes $OUT/quant.json.
# The files need ~35 GB of disk while they are made (the BF16 GGUF, removed once
# every type is quantized unless QUANT_KEEP_BF16=1, and the quantized files);
# with less free, or QUANT_DUMMY=1, the section runs on --dummy-weights=TYPE
# (random valid blocks of the type made in memory, LM head Q6_K as llama.cpp's
# files hold it; bf16 path: --dummy-weights) and says so.
#   bench/quant.sh [DIR]    (models in DIR, default $QUANT_DIR or /tmp/cllm-quant; made when missing)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS, BENCH_COMMIT), and TYPES
# (default "q8_0 q4_k q4_k_m"), QUANT_PROMPT_LENS (default 512,2048), QUANT_CTX
# (default 128,4096), QUANT_DECODE_TOKENS (default 64), BENCH_TIMEOUT (seconds per step, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
DIR=${1:-${QUANT_DIR:-/tmp/cllm-quant}}
TYPES=${TYPES:-q8_0 q4_k q4_k_m}
LENS=${QUANT_PROMPT_LENS:-512,2048}
CTX=${QUANT_CTX:-128,4096}
STEPS=${QUANT_DECODE_TOKENS:-64}
LIMIT=${BENCH_TIMEOUT:-300}
mkdir -p "$DIR"
bench_limits || exit 1
read -r -a peak <<< "$(bench_peak_args)"
rm -f "$OUT"/quant-*
SOURCE=files
missing=0
for t in $TYPES; do [ -f "$DIR/l8-$t.gguf" ] || missing=1; done
if [ "${QUANT_DUMMY:-0}" = 1 ]; then
    SOURCE="dummy (QUANT_DUMMY=1)"
elif [ $missing = 1 ] && [ ! -f "$DIR/l8-bf16.gguf" ]; then
    free_gb=$(df -Pk "$DIR" | awk 'NR == 2 {print int($4 / 1048576)}')
    [ "${free_gb:-0}" -ge 36 ] || SOURCE="dummy (${free_gb:-?} GB free in $DIR: the files need ~35 GB)"
fi
echo "quant.sh: weights from $SOURCE"
if [ "$SOURCE" != files ]; then
    dummy=$BENCH_MODELS/llama3-8b-config
    [ -f "$dummy/config.json" ] || python3 bench/make_dummy_model.py llama3-8b "$dummy" || exit 1
    for t in $TYPES; do
        case $t in q8_0|q4_0|q4_1|q4_k|q5_k|q6_k) ;; *) echo "no --dummy-weights=$t" > "$OUT/quant-$t.error"; continue ;; esac
        for mode in quant bf16; do
            flag=--dummy-weights=$t; [ $mode = bf16 ] && flag=--dummy-weights
            if [ $mode = bf16 ] && [ -f "$OUT/quant-dummy-bf16.json" ]; then  # one bf16 run serves every type
                cp "$OUT/quant-dummy-bf16.json" "$OUT/quant-$t-$mode.json"
                continue
            fi
            echo "== $t, weights $mode ($flag)"
            timeout "$LIMIT" "$CLLM" bench -m "$dummy" $flag --prompt-lens "$LENS" --ctx "$CTX" --decode-tokens "$STEPS" \
                "${peak[@]}" --json "$OUT/quant-$t-$mode.json" > "$OUT/quant-$t-$mode.log" 2>&1
            rc=$?
            cat "$OUT/quant-$t-$mode.log"
            [ $rc = 0 ] || { echo "cllm bench $flag exit $rc: $(tail -1 "$OUT/quant-$t-$mode.log")" >> "$OUT/quant-$t.error";
                             rm -f "$OUT/quant-$t-$mode.json"; }
            [ $mode = bf16 ] && [ $rc = 0 ] && cp "$OUT/quant-$t-$mode.json" "$OUT/quant-dummy-bf16.json"
        done
    done
    TYPES_RUN=""
else
    TYPES_RUN=$TYPES
fi
if [ -n "$TYPES_RUN" ] && [ $missing = 1 ] && [ ! -f "$DIR/l8-bf16.gguf" ]; then
    python3 bench/make_model.py llama3-8b "$DIR/l8-bf16.gguf" --gguf || { rm -f "$DIR/l8-bf16.gguf"; exit 1; }
fi
for t in $TYPES_RUN; do
    if [ ! -f "$DIR/l8-$t.gguf" ]; then
        timeout "$LIMIT" "$CLLM" quantize "$DIR/l8-bf16.gguf" "$DIR/l8-$t.gguf" --type "$t" > "$OUT/quant-$t.make.log" 2>&1 ||
            { echo "cllm quantize --type $t failed: $(tail -1 "$OUT/quant-$t.make.log")" > "$OUT/quant-$t.error";
              rm -f "$DIR/l8-$t.gguf"; continue; }
    fi
done
[ "${QUANT_KEEP_BF16:-0}" = 1 ] || rm -f "$DIR/l8-bf16.gguf"
for t in $TYPES_RUN; do
    [ -f "$DIR/l8-$t.gguf" ] || continue
    stat -c %s "$DIR/l8-$t.gguf" > "$OUT/quant-$t.size"
    for mode in quant bf16; do
        flag=""; [ $mode = bf16 ] && flag=--bf16-weights
        echo "== $t, weights $mode"
        timeout "$LIMIT" "$CLLM" bench -m "$DIR/l8-$t.gguf" --prompt-lens "$LENS" --ctx "$CTX" --decode-tokens "$STEPS" \
            $flag "${peak[@]}" --json "$OUT/quant-$t-$mode.json" > "$OUT/quant-$t-$mode.log" 2>&1
        rc=$?
        cat "$OUT/quant-$t-$mode.log"
        [ $rc = 0 ] || { echo "cllm bench $flag exit $rc: $(tail -1 "$OUT/quant-$t-$mode.log")" >> "$OUT/quant-$t.error";
                         rm -f "$OUT/quant-$t-$mode.json"; }
    done
done
python3 - "$OUT" "$LENS" "$CTX" "$STEPS" "$SOURCE" $TYPES <<'PY'
import os, sys
sys.path.insert(0, "bench")
import results
out, lens, ctx, steps, source, types = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6:]
def text(path):
    return open(path).read().strip() if os.path.exists(path) else None
runs = []
for t in types:
    p = os.path.join(out, f"quant-{t}")
    size = text(p + ".size")
    runs.append({"type": t, "file_bytes": int(size) if size else None, "quant": results.load(p + "-quant.json"),
                 "bf16": results.load(p + "-bf16.json"), "error": text(p + ".error")})
results.write_section(out, "quant", {"model": "llama3-8b", "source": source, "settings": {"prompt_lens": lens, "ctx": ctx,
                                     "decode_tokens": steps}, "runs": runs})
sys.exit(0 if any(r["quant"] for r in runs) else 1)
PY
