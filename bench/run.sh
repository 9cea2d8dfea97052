#!/usr/bin/env bash
# bench/run.sh — the one benchmark command, run on the GPU machine: measures
# the device's limits (bench/limits.py: copy bandwidth, bf16 matmul rate), runs
# the sections, each writing its JSON into one results folder ($OUT), then
# renders BENCH.md whole from that folder (bench/report.py):
#   bench/run.sh [--sections LIST] [--tiny]
# LIST, comma-separated, of: single (bench/single.sh: cllm bench vs transformers
# on the Llama-3-8B and Gemma-2-9B shapes), quant (bench/quant.sh), kv_fp8
# (bench/kv_fp8.sh), attention (bench/attention.sh), throughput
# (bench/throughput.sh), fixed_lengths (bench/fixed_lengths.sh: 128/128,
# 128/2048, 2048/128, 1000/1000 tokens), pipeline (bench/pipeline.sh, >= 2
# GPUs), tensor_parallel (bench/tp.sh: --tp N against one GPU, the 70B shape
# at --tp G vs --pp G, throughput at --tp 2 / 4; by default where >= 2 GPUs:
# on one GPU, picked by name, it runs --tp 2 with both ranks on GPU 0).
# Default: all that this machine can run. --tiny: single on the tiny shapes
# (a smoke test).
# Writes $OUT/BENCH.md and $OUT/history.csv (bench/history.csv with this
# generation's rows added); to adopt them here: cp $OUT/BENCH.md BENCH.md and
# cp $OUT/history.csv bench/history.csv, or render again from the folder(s):
#   python3 bench/report.py OUT [OUT2 ...] --out BENCH.md   (appends to bench/history.csv)
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS, BENCH_COMMIT) and
# each section's script; BENCH_ATTENTION_BIN (passed to bench/attention.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
ALL=(single quant kv_fp8 attention throughput fixed_lengths pipeline tensor_parallel)
SECTIONS=""
TINY=""
while [ $# -gt 0 ]; do
    case $1 in
        --sections) SECTIONS=$2; shift ;;
        --sections=*) SECTIONS=${1#--sections=} ;;
        --tiny) TINY=--tiny ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "bench/run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
gpus=$(bench_gpu_count)
if [ -z "$SECTIONS" ]; then
    SECTIONS=single,quant,kv_fp8,attention,throughput,fixed_lengths
    [ "${gpus:-0}" -ge 2 ] && SECTIONS+=,pipeline,tensor_parallel
fi
for s in ${SECTIONS//,/ }; do
    [[ " ${ALL[*]} " == *" $s "* ]] || { echo "bench/run.sh: unknown section '$s' (${ALL[*]})" >&2; exit 2; }
done
BENCH_COMMIT=${BENCH_COMMIT:-$(python3 -c 'import sys; sys.path.insert(0, "bench"); import results; print(results.commit())')}
export CLLM OUT BENCH_MODELS BENCH_COMMIT
LOG=$OUT/run.log
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }
say "cllm $BENCH_COMMIT ($CLLM) on $(python3 bench/results.py device); sections $SECTIONS; results in $OUT"
rm -f "$OUT/run.json" "$OUT/limits.json"
for s in "${ALL[@]}"; do rm -f "$OUT/$s.json"; done  # no results of an earlier run survive in the folder
python3 bench/results.py start "$OUT" "$SECTIONS"
for s in "${ALL[@]}"; do
    if [[ ",$SECTIONS," != *",$s,"* ]]; then
        if [ $s = pipeline ] && [ "${gpus:-0}" -lt 2 ]; then
            python3 bench/results.py note "$OUT" $s "needs 2 GPUs; this machine has ${gpus:-0}"
        elif [ $s = tensor_parallel ] && [ "${gpus:-0}" -lt 2 ]; then
            python3 bench/results.py note "$OUT" $s "not run by default with fewer than 2 GPUs, and this machine has ${gpus:-0}; --sections tensor_parallel runs --tp 2 with both ranks on GPU 0"
        else
            python3 bench/results.py note "$OUT" $s "not selected: bench/run.sh --sections $SECTIONS"
        fi
    fi
done
say "limits: bench/limits.py"
python3 bench/limits.py --json "$OUT/limits.json" 2>&1 | tee -a "$LOG"
if [ ! -s "$OUT/limits.json" ]; then
    say "limits not measured: nothing else runs"
    for s in ${SECTIONS//,/ }; do python3 bench/results.py note "$OUT" $s "the limits could not be measured: bench/limits.py failed, see run.log"; done
fi
status=0
[ -s "$OUT/limits.json" ] || status=1
for s in ${SECTIONS//,/ }; do
    [ -s "$OUT/limits.json" ] || break
    case $s in
        single) cmd=(bench/single.sh $TINY) ;;
        quant) cmd=(bench/quant.sh) ;;
        kv_fp8) cmd=(bench/kv_fp8.sh) ;;
        attention) cmd=(bench/attention.sh ${BENCH_ATTENTION_BIN:-}) ;;
        throughput) cmd=(bench/throughput.sh) ;;
        fixed_lengths) cmd=(bench/fixed_lengths.sh) ;;
        pipeline) cmd=(bench/pipeline.sh) ;;
        tensor_parallel) cmd=(bench/tp.sh) ;;
    esac
    say "$s: ${cmd[*]}"
    t0=$SECONDS
    bash "${cmd[@]}" > "$OUT/$s.log" 2>&1
    rc=$?
    say "$s: exit $rc after $((SECONDS - t0)) s (log: $s.log)"
    if [ ! -s "$OUT/$s.json" ]; then
        status=1
        python3 bench/results.py note "$OUT" $s "failed: ${cmd[*]} exit $rc after $((SECONDS - t0)) s: $(tail -1 "$OUT/$s.log" | cut -c1-200)"
    elif [ $rc != 0 ]; then
        python3 bench/results.py note "$OUT" $s "partly failed: ${cmd[*]} exit $rc (see $s.log)"
    fi
done
[ -f "$OUT/history.csv" ] || [ ! -f bench/history.csv ] || cp bench/history.csv "$OUT/history.csv"
python3 bench/report.py "$OUT" --out "$OUT/BENCH.md" --history "$OUT/history.csv" || exit 1
say "wrote $OUT/BENCH.md and $OUT/history.csv"
exit $status
