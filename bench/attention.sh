#!/usr/bin/env bash
# bench/attention.sh — BENCH.md's attention section: cllm's CUDA attention
# kernels alone against PyTorch SDPA's flash and cuDNN backends in the same
# run (bench/sdpa_reference.py), on the GPU machine; the same kernels over an
# fp8 KV cache against bf16. Writes $OUT/attention.json.
#   bench/attention.sh [BIN]   BIN: a built bench_attention (default
#   build/cuda/bench/bench_attention, built here from build/cuda/libcllm.a
#   when missing: ./build.sh first)
# Prefill: causal, 32 heads, head size 128, TFLOP/s (4 L^2 H D / 2 per
# sequence); decode: one row per sequence, 32q/8kv, head size 128, K+V bytes
# (fp8: codes + scales) over time; shared: N sequences sharing a 2000-token
# prefix, one decode row each, flat vs cascade, the distinct K/V bytes over
# time. Environment: see bench/lib.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/lib.sh
BUILD=$(./build.sh --print-dir 2>/dev/null || echo build/cuda)
BIN=${1:-$BUILD/bench/bench_attention}
if [ ! -x "$BIN" ]; then
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    mkdir -p "$(dirname "$BIN")"
    gcc -std=c11 -D_GNU_SOURCE -O2 -I. -I"$CUDA_HOME/include" bench/bench_attention.c "$BUILD/libcllm.a" \
        -L"$CUDA_HOME/lib64" -lcudart_static -lcublasLt -lnccl -lz -ldl -lrt -lpthread -lm -lstdc++ -o "$BIN" || exit 1
fi
bench_limits || exit 1
"$BIN" > "$OUT/attention-cllm.txt" || { cat "$OUT/attention-cllm.txt"; exit 1; }
cat "$OUT/attention-cllm.txt"
python3 bench/sdpa_reference.py > "$OUT/attention-sdpa.txt" 2> "$OUT/attention-sdpa.log"
rc=$?
cat "$OUT/attention-sdpa.txt"
[ $rc = 0 ] || tail -3 "$OUT/attention-sdpa.log"
python3 - "$OUT" "$rc" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import results
out, sdpa_rc = sys.argv[1], int(sys.argv[2])
rows, skipped, ref_impl = [], [], None
# RESULT prefill[-fp8] SHAPE MS RATE [splits=N | flat | cascade ...] (bench_attention)
for line in open(os.path.join(out, "attention-cllm.txt")):
    f = line.split()
    if len(f) >= 5 and f[0] == "RESULT":
        kind, _, kv = f[1].partition("-")
        impl = "cllm-" + f[5] if kind == "shared" and len(f) >= 6 else "cllm"  # shared: flat | cascade
        rows.append({"kind": kind, "shape": f[2], "impl": impl, "kv": kv or "bf16", "ms": float(f[3]),
                     "rate": float(f[4]), "unit": "TFLOP/s" if kind == "prefill" else "TB/s"})
# RESULT KIND SHAPE BACKEND MS RATE | SKIP KIND SHAPE BACKEND REASON  (sdpa_reference.py)
for line in open(os.path.join(out, "attention-sdpa.txt")):
    f = line.split()
    if line.startswith("# "):
        ref_impl = line[2:].strip()
    elif len(f) >= 6 and f[0] == "RESULT":
        rows.append({"kind": f[1], "shape": f[2], "impl": "sdpa-" + f[3], "kv": "bf16", "ms": float(f[4]),
                     "rate": float(f[5]), "unit": "TFLOP/s" if f[1] == "prefill" else "TB/s"})
    elif len(f) >= 4 and f[0] == "SKIP":
        skipped.append({"kind": f[1], "shape": f[2], "impl": "sdpa-" + f[3], "reason": " ".join(f[4:])})
log = open(os.path.join(out, "attention-sdpa.log")).read().strip().splitlines()
error = None if sdpa_rc == 0 else f"bench/sdpa_reference.py exit {sdpa_rc}" + (f": {log[-1][:200]}" if log else "")
results.write_section(out, "attention", {"reference": ref_impl, "rows": rows, "skipped": skipped, "error": error})
PY
