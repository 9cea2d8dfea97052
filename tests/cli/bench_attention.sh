#!/usr/bin/env bash
# bench_attention.sh — BENCH.md's attention section without a GPU: bench_attention.c
# compiles (against the CUDA headers; it runs on the GPU machine only), the lines of
# bench_attention and bench/sdpa_reference.py parsed by bench/attention_results.py
# (variant rows, fp8 rows, cascade rows, the reference's skips), then bench/report.py
# on a hand-made attention.json whose table rows, ratios and percentages are worked
# out here by hand (the variant table: window, soft-cap and sinks against the plain
# kernel and flex_attention).
source "$(dirname "$0")/lib.sh"
for f in bench/attention.sh; do
    bash -n "$f" && ok "bash -n $f" || notok "bash -n $f"
done
python3 -c "import ast; ast.parse(open('bench/sdpa_reference.py').read())" && ok "sdpa_reference.py parses" ||
    notok "sdpa_reference.py parses"
# bench_attention.c is built on the GPU machine (attention.sh): compiled here so it cannot rot unseen
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I. -I"$CUDA_HOME/include" -c bench/bench_attention.c \
    -o "$TMP/bench_attention.o" 2> "$TMP/cc.txt"; then
    ok "bench_attention.c compiles without warnings"
else
    notok "bench_attention.c compiles without warnings" "$(head -20 "$TMP/cc.txt")"
fi

# --- bench/attention_results.py on hand-made lines ---------------------------
why=$(python3 - <<'EOF' 2>&1
import sys
sys.path.insert(0, "bench")
from attention_results import parse_cllm, parse_reference
rows = parse_cllm(["# prefill kernel: bf16 sm90, fp8 sm90",
                   "RESULT prefill 1x16384 2.0000 400.0 block=32 tma=64",
                   "RESULT prefill 1x16384 0.8000 375.0 block=32 tma=64 variant=window4096",
                   "RESULT decode-fp8 8x32768 0.1000 2.000 splits=4 kernel=split copy=0.0800",
                   "RESULT decode 8x32768 0.2500 3.200 splits=4 kernel=split variant=softcap50",
                   "RESULT shared 64x2000+64..256 0.2000 1.500 cascade groups=1 units=2 splits=3"])
assert len(rows) == 5, rows
assert rows[0] == {"kind": "prefill", "shape": "1x16384", "impl": "cllm", "kv": "bf16", "ms": 2.0, "rate": 400.0,
                   "unit": "TFLOP/s"}, rows[0]
assert rows[1]["variant"] == "window4096" and rows[1]["rate"] == 375.0, rows[1]
assert rows[2]["kv"] == "fp8" and rows[2]["unit"] == "TB/s" and "variant" not in rows[2], rows[2]
assert rows[2]["copy_ms"] == 0.08 and "copy_ms" not in rows[0] and "copy_ms" not in rows[3], rows
assert rows[3]["variant"] == "softcap50" and rows[3]["kind"] == "decode", rows[3]
assert rows[4]["impl"] == "cllm-cascade" and rows[4]["kind"] == "shared", rows[4]
ref, skipped, desc = parse_reference(["# torch 2.11, cuDNN 91000, NVIDIA H200",
                                      "RESULT prefill 1x16384 flash 3.0000 266.700",
                                      "RESULT prefill 1x16384 flex 1.6000 187.500 variant=window4096",
                                      "SKIP prefill 4x4096 cudnn not available",
                                      "SKIP decode 8x32768 flex no flex_attention in this torch (x) variant=softcap50"])
assert desc == "torch 2.11, cuDNN 91000, NVIDIA H200", desc
assert [r["impl"] for r in ref] == ["sdpa-flash", "torch-flex"] and ref[1]["variant"] == "window4096", ref
assert "variant" not in ref[0], ref[0]
assert skipped == [{"kind": "prefill", "shape": "4x4096", "impl": "sdpa-cudnn", "reason": "not available"},
                   {"kind": "decode", "shape": "8x32768", "impl": "torch-flex",
                    "reason": "no flex_attention in this torch (x)", "variant": "softcap50"}], skipped
EOF
) && ok "attention_results.py: variants, fp8, cascade rows and the reference's skips" ||
    notok "attention_results.py: variants, fp8, cascade rows and the reference's skips" "$why"

# --- bench/report.py on a hand-made attention.json ---------------------------
# RENDERER INPUT, made up by hand (not measurements): limits copy 4 TB/s and matmul 800 TFLOP/s.
mkdir -p "$TMP/rep"
python3 - "$TMP/rep" <<'EOF'
import json, os, sys
dev = {"name": "TEST GPU", "driver": "1.0", "count": 1, "memory_mib": 143771}
lim = {"device": "TEST GPU", "copy_tbps": 4.0, "matmul_tflops": 800.0}
row = lambda kind, shape, impl, ms, rate, **kw: dict(kind=kind, shape=shape, impl=impl, kv="bf16", ms=ms, rate=rate,
                                                     unit="TFLOP/s" if kind == "prefill" else "TB/s", **kw)
rows = [row("prefill", "1x16384", "cllm", 2.0, 400.0), row("decode", "8x32768", "cllm", 0.24, 3.333, copy_ms=0.2),
        row("prefill", "1x16384", "sdpa-flash", 3.0, 266.7),
        row("prefill", "1x16384", "cllm", 0.8, 375.0, variant="window4096"),
        row("prefill", "1x16384", "torch-flex", 1.6, 187.5, variant="window4096"),
        row("prefill", "1x16384", "cllm", 2.2, 360.0, variant="sinks"),
        row("decode", "8x32768", "cllm", 0.25, 3.2, variant="softcap50")]
skipped = [{"kind": "decode", "shape": "8x32768", "impl": "torch-flex", "reason": "x", "variant": "softcap50"}]
doc = {"date": "2026-01-02 03:04 UTC", "commit": "test", "device": dev, "limits": lim, "section": "attention",
       "reference": "torch 2.11", "rows": rows, "skipped": skipped, "error": None}
json.dump(doc, open(os.path.join(sys.argv[1], "attention.json"), "w"))
EOF
expect_exit "report.py renders the hand-made attention.json" 0 \
    python3 bench/report.py "$TMP/rep" --out "$TMP/rep/BENCH.md" --history "$TMP/rep/history.csv"
md=$TMP/rep/BENCH.md
expect_line() { if grep -qxF -- "$2" "$md"; then ok "$1"; else notok "$1" "no line: $2" "$(grep -F "${2:0:24}" "$md" | head -3)"; fi; }
# 400 / 800 = 50%; SDPA 266.7 / 800 = 33.3%; 3.0 / 2.0 = 1.50x
expect_line "report: the plain row against SDPA" \
    "| prefill 1x16384 | 2.000 | 400 TFLOP/s (50.0%) | 3.000 | 267 TFLOP/s (33.3%) | 1.50× |"
n=$(grep -c '^| prefill 1x16384 |' "$md")
[ "$n" = 1 ] && ok "report: variant rows stay out of the main table" || notok "report: variant rows stay out of the main table" "$n rows"
expect_line "report: the variant table's columns" \
    "| variant | shape | cllm ms | cllm rate (% of limit) | plain kernel ms | time ÷ plain | flex ms | cllm speed ÷ flex |"
# 375 / 800 = 46.9%; 0.8 / 2.0 = 0.40x the plain kernel's time; flex 1.6 / 0.8 = 2.00x
expect_line "report: window row, against plain and flex" \
    "| window4096 | prefill 1x16384 | 0.800 | 375 TFLOP/s (46.9%) | 2.000 | 0.40× | 1.600 | 2.00× |"
# 360 / 800 = 45%; 2.2 / 2.0 = 1.10x; no flex row nor skip: dashes
expect_line "report: sinks row, no flex" "| sinks | prefill 1x16384 | 2.200 | 360 TFLOP/s (45.0%) | 2.000 | 1.10× | — | — |"
# the copy table: 3.333 TB/s x 0.24 ms = 800 MB; copied in 0.2 ms: 4.0 TB/s = 100% of the 4 TB/s limit; 0.24 / 0.2 = 1.20x
expect_line "report: decode against a copy of its bytes" "| bf16 | 8x32768 | 800 MB | 0.240 | 0.200 | 4 TB/s (100.0%) | 1.20× |"
n=$(grep -c '^| bf16 | ' "$md")
[ "$n" = 1 ] && ok "report: only rows with a copy time in the copy table" || notok "report: only rows with a copy time in the copy table" "$n rows"
# 3.2 TB/s / 4 = 80%; 0.25 / 0.24 = 1.04x; flex skipped
expect_line "report: soft-cap decode row, flex skipped" \
    "| softcap50 | decode 8x32768 | 0.250 | 3.2 TB/s (80.0%) | 0.240 | 1.04× | not supported | — |"
