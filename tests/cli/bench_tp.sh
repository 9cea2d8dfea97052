#!/usr/bin/env bash
# bench_tp.sh — BENCH.md's tensor_parallel section without a GPU: bench/tp.sh
# end to end on CPU backends (a fake nvidia-smi says 2 GPUs; tiny shapes stand
# in for the 8B and 70B folders; the figures mean nothing, the files and
# their names are checked), bench/pipeline.sh likewise, then bench/report.py on a hand-made
# tensor_parallel.json whose table rows, ratios and percentages are worked
# out here by hand. Also bench/run.sh's section list and usage.
source "$(dirname "$0")/lib.sh"
for f in bench/tp.sh bench/run.sh bench/throughput.sh; do
    bash -n "$f" && ok "bash -n $f" || notok "bash -n $f"
done
bash bench/run.sh --help > "$TMP/help.txt" 2>&1
expect_grep "run.sh --help: the tensor_parallel section" "$TMP/help.txt" "tensor_parallel \(bench/tp.sh"
expect_exit "run.sh: an unknown section exits 2" 2 env OUT="$TMP/run-out" bash bench/run.sh --sections nope
expect_grep "run.sh: the sections it names include tensor_parallel" "$TMP/err" "pipeline tensor_parallel\)"

# --- bench/tp.sh on the CPU -------------------------------------------------
# The fake GPUs: nvidia-smi (bench_gpu_count, results.py device) names 2, and
# cllm's bench and generate run on CPU backends whatever the build.
mkdir -p "$TMP/bin" "$TMP/models" "$TMP/tpout"
cat > "$TMP/bin/nvidia-smi" <<'EOF'
#!/bin/bash
case "$1" in -L) printf 'GPU 0: TEST GPU (UUID: a)\nGPU 1: TEST GPU (UUID: b)\n' ;;
             *) printf 'TEST GPU, 1.0, 143771\nTEST GPU, 1.0, 143771\n' ;; esac
EOF
bin=$(cd "$(dirname "$CLLM")" && pwd)/$(basename "$CLLM")
cat > "$TMP/bin/cllm" <<EOF
#!/bin/bash
cmd=\$1; shift
case \$cmd in bench|generate) exec "$bin" \$cmd --cpu "\$@" ;; *) exec "$bin" \$cmd "\$@" ;; esac
EOF
chmod +x "$TMP/bin/nvidia-smi" "$TMP/bin/cllm"
for m in llama3-8b-dummy llama3-70b; do  # config-only folders as bench/make_dummy_model.py writes, tiny shapes
    python3 bench/make_dummy_model.py llama3-8b "$TMP/models/$m" > /dev/null
    python3 - "$TMP/models/$m/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4)
json.dump(c, open(sys.argv[1], "w"))
EOF
done
echo '{"device": "TEST GPU", "copy_tbps": 0.01, "matmul_tflops": 0.05}' > "$TMP/tpout/limits.json"
echo "throughput.sh's prompts" > "$TMP/tpout/tp-prompts.txt"  # bench/throughput.sh's file: tp.sh must leave it
PATH=$TMP/bin:$PATH CLLM=$TMP/bin/cllm OUT=$TMP/tpout BENCH_MODELS=$TMP/models BENCH_COMMIT=test TP_PROMPT=16 \
    TP_CTX=16 TP_N=3 bash bench/tp.sh > "$TMP/tp.txt" 2>&1; rc=$?
[ $rc = 0 ] && ok "tp.sh on CPU backends (2 fake GPUs) exits 0" || notok "tp.sh exits 0" "exit $rc: $(tail -5 "$TMP/tp.txt")"
[ "$(cat "$TMP/tpout/tp-prompts.txt" 2> /dev/null)" = "throughput.sh's prompts" ] && ok "tp.sh leaves tp-* files alone" \
    || notok "tp.sh leaves tp-* files alone" "$(ls "$TMP/tpout")"
expect_grep "tp.sh: the old table's --tp 2 row" "$TMP/tp.txt" '^\| --tp 2 \| [0-9.]+ \([0-9.]+x\) \| [0-9.]+ \([0-9.]+x\) \|$'
why=$(python3 - "$TMP/tpout" <<'EOF' 2>&1
import json, os, sys
out = sys.argv[1]
d = json.load(open(os.path.join(out, "tensor_parallel.json")))
assert d["section"] == "tensor_parallel" and d["gpus_used"] == 2, (d["section"], d["gpus_used"])
names = [(r["name"], r["args"], r["gpus"], bool(r["bench"])) for r in d["runs"]]
assert names == [("tp1", "--tp 1", 1, True), ("tp2", "--tp 2", 2, True),
                 ("tp2s", "--tp 2 --tp-nccl-sum", 2, True)], names
assert d["runs"][0]["bench"]["prefill"][0]["tokens"] == 16 and d["runs"][0]["bench"]["decode"][0]["ctx"] == 16
b = d["big"]
assert b["gpus"] == 2 and b["tp"] and b["pp"], b
assert [l.split(":")[0] for l in b["info"]] == ["GPU 0", "GPU 1"] and "rank 1: weights" in b["info"][1], b["info"]
t = d["throughput"]
assert [(x["name"], x["args"], x["gpus"]) for x in t] == [("tp2", "--tp 2", 2)], t
assert t[0]["batched"]["prompts"] == 3 and t[0]["batched"]["failed"] == 0, t[0]["batched"]
mp = t[0]["matrix_params"]  # from config.json: no safetensors in the folder
assert mp == {"layers": 2 * (128 * 128 * 2 + 2 * 128 * 64 + 3 * 128 * 256), "head": 128256 * 128}, mp
thr = json.load(open(os.path.join(out, "tensor-thr-tp2", "throughput.json")))
assert thr["gpus_used"] == 2 and thr["batched"]["roofline"], thr["gpus_used"]
assert d["error"] is None, d["error"]
EOF
) && ok "tp.sh: tensor_parallel.json holds every run, the 70B pair, info lines and throughput" \
    || notok "tp.sh: tensor_parallel.json" "$why"

# --- bench/pipeline.sh on the CPU (the same 2 fake GPUs) ----------------------
# The tiny Llama's safetensors folder for the 8B's (the section reads weights from files); big models left out.
mkdir -p "$TMP/ppout" && cp "$TMP/tpout/limits.json" "$TMP/ppout/"
PATH=$TMP/bin:$PATH CLLM=$TMP/bin/cllm OUT=$TMP/ppout BENCH_MODELS=$TMP/models BENCH_COMMIT=test PP_BIG=0 PP_N=2 \
    bash bench/pipeline.sh tests/fixtures/tiny/llama > "$TMP/pp.txt" 2>&1; rc=$?
[ $rc = 0 ] && ok "pipeline.sh on CPU backends (2 fake GPUs) exits 0" || notok "pipeline.sh exits 0" "exit $rc: $(tail -5 "$TMP/pp.txt")"
why=$(python3 - "$TMP/ppout/pipeline.json" <<'EOF' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["section"] == "pipeline" and d["gpus_used"] == 2, (d["section"], d["gpus_used"])
assert sorted(d["bench"]) == ["1", "2"] and all(d["bench"].values()), d["bench"]
assert {k: v["batched"]["prompts"] for k, v in d["throughput"].items()} == {"1": 2, "2": 2}, d["throughput"]
assert d["big"] == [] and d["big_throughput"] is None and d["error"] is None, (d["big"], d["error"])
EOF
) && ok "pipeline.sh: pipeline.json holds --pp 1 and 2, bench and throughput" || notok "pipeline.sh: pipeline.json" "$why"

# --- bench/report.py on hand-made results -----------------------------------
# RENDERER INPUT, made up by hand (not measurements): limits copy 4 TB/s and
# matmul 800 TFLOP/s; 2 GPUs.
mkdir -p "$TMP/rep"
python3 - "$TMP/rep" <<'EOF'
import json, os, sys
out = sys.argv[1]
dev = {"name": "TEST GPU", "driver": "1.0", "count": 2, "memory_mib": 143771}
lim = {"device": "TEST GPU", "copy_tbps": 4.0, "matmul_tflops": 800.0}
head = {"date": "2026-01-02 03:04 UTC", "commit": "test", "device": dev, "limits": lim}
tp = dict(head, section="tensor_parallel", gpus_used=2, model="llama3-8b", prompt_lens="2048", ctx="128",
    runs=[{"name": "tp1", "args": "--tp 1", "gpus": 1, "bench": {
              "prefill": [{"tokens": 2048, "flops": 4.0e13, "seconds": 0.1, "tok_s": 20480}],
              "decode": [{"ctx": 128, "batch": 1, "bytes": 1.6e10, "step_s": 0.005, "tok_s": 200}]}},
          {"name": "tp2", "args": "--tp 2", "gpus": 2, "bench": {
              "prefill": [{"tokens": 2048, "flops": 4.0e13, "seconds": 0.0625, "tok_s": 32768}],
              "decode": [{"ctx": 128, "batch": 1, "bytes": 1.6e10, "step_s": 1 / 340, "tok_s": 340}]}},
          {"name": "tp2s", "args": "--tp 2 --tp-nccl-sum", "gpus": 2, "bench": None}],
    big={"model": "llama3-70b", "gpus": 2,
         "info": ["GPU 0: rank 0: weights 71.61 GB + KV 1.34 GB = 72.95 GB",
                  "GPU 1: rank 1: weights 71.61 GB + KV 1.34 GB = 72.95 GB"],
         "tp": {"params": 70.55e9, "weight_bytes": 1.411e11, "load_s": 8.0, "load_gbps": 17.6,
                "prefill": [{"tokens": 512, "flops": 7.2e13, "seconds": 0.09, "tok_s": 5688.89}],
                "decode": [{"ctx": 128, "batch": 1, "bytes": 1.44e11, "step_s": 0.024, "tok_s": 41.667}]},
         "pp": {"params": 70.55e9, "weight_bytes": 1.411e11, "load_s": 9.0, "load_gbps": 15.7,
                "prefill": [{"tokens": 512, "flops": 7.2e13, "seconds": 0.144, "tok_s": 3555.56}],
                "decode": [{"ctx": 128, "batch": 1, "bytes": 1.44e11, "step_s": 0.048, "tok_s": 20.833}]}},
    throughput=[{"name": "tp2", "args": "--tp 2", "gpus": 2, "batched": {
        "prompts": 1000, "failed": 0, "prompt_tokens": 500000, "output_tokens": 256000, "wall_s": 20.0, "steps_s": 16.0}}],
    huge={"model": "llama3.1-405b", "weights": "q4_k", "runs": [
        {"name": "405b-tp8", "args": "--tp 8", "gpus": 8, "bench": {
            "params": 405.85e9, "weight_bytes": 2.288e11, "load_s": 20.0, "load_gbps": 11.4,
            "decode": [{"ctx": 128, "batch": 1, "bytes": 2.3e11, "step_s": 0.01, "tok_s": 100.0}]},
         "batched": {"prompts": 1000, "failed": 0, "prompt_tokens": 500000, "output_tokens": 256000, "wall_s": 64.0,
                     "steps_s": 51.2}},
        {"name": "405b-pp8", "args": "--pp 8", "gpus": 8, "bench": None, "batched": None}]},
    error="throughput --tp 4 exit 124: timed out")
def batched(wall, steps):
    return {"batched": {"prompts": 1000, "failed": 0, "prompt_tokens": 500000, "output_tokens": 256000,
                        "wall_s": wall, "steps_s": steps}}
dec = lambda s: {"decode": [{"ctx": 128, "batch": 1, "bytes": 1.6e10, "step_s": s, "tok_s": 1 / s}]}
pp = dict(head, section="pipeline", gpus_used=4, model="llama3-8b", bench={"1": dec(0.005), "4": dec(0.00625)},
          throughput={"1": batched(32.0, 25.6), "2": batched(25.6, 20.48), "4": batched(10.0, 8.0)},
          big=[{"model": "llama3.1-405b", "weights": "q4_k", "pp": 4, "bench": {
                   "params": 405.8e9, "weight_bytes": 2.288e11, "load_s": 40.0, "load_gbps": 5.72,
                   "decode": [{"ctx": 128, "batch": 1, "bytes": 2.3e11, "step_s": 0.1, "tok_s": 10.0}]}},
               {"model": "llama3-70b", "pp": 4, "bench": None}],
          error="llama3-70b --pp 4 exit 124: timed out")
thr = dict(head, section="throughput", gpus_used=1, model="llama3-8b", output_tokens_each=256,
           batched=dict(batched(32.0, 25.6)["batched"], load_parts={"load_s": 1.78, "model_s": 0.05, "gpus_s": 0.31,
                                                                    "open_s": 1.2, "rest_s": 0.22}, close_s=0.4,
                        power={"0": {"samples": 290, "sm_mhz_median": 1665, "sm_mhz_max_clock": 1980,
                                     "power_w_median": 688.4, "power_w_max": 699.5, "power_limit_w": 700,
                                     "power_capped_pct": 91.4}}))
for name, doc in (("tensor_parallel", tp), ("pipeline", pp), ("throughput", thr)):
    json.dump(doc, open(os.path.join(out, name + ".json"), "w"))
EOF
expect_exit "report.py renders the hand-made tensor_parallel.json" 0 \
    python3 bench/report.py "$TMP/rep" --out "$TMP/rep/BENCH.md" --history "$TMP/rep/history.csv"
md=$TMP/rep/BENCH.md
# expect_line NAME LINE — BENCH.md holds LINE exactly
expect_line() { if grep -qxF -- "$2" "$md"; then ok "$1"; else notok "$1" "no line: $2" "$(grep -F "${2:0:24}" "$md" | head -3)"; fi; }
expect_line "report: the Tensor parallelism section" "## Tensor parallelism"
expect_line "report: the 8B table's columns" \
    "| measure | --tp 1 | % of 1 GPU | --tp 2 | % of 2 GPUs | ÷ --tp 1 | --tp 2 --tp-nccl-sum | % of 2 GPUs | ÷ --tp 1 |"
# prefill: 4e13 FLOPs / 0.1 s = 400 TFLOP/s = 50% of 800; --tp 2: / 0.0625 s = 640 = 40% of 2 x 800; 32768 / 20480 = 1.60
expect_line "report: prefill, --tp 2 against 2 GPUs' matmul rate, 1.60×" \
    "| prefill 2048 tokens | 20,480 tok/s, 400.0 TFLOP/s | 50.0% | 32,768 tok/s, 640.0 TFLOP/s | 40.0% | 1.60× | — | — | — |"
# decode: 1.6e10 B / 5 ms = 3,200 GB/s = 80% of 4 TB/s; --tp 2: x 340 = 5,440 GB/s = 68% of 2 x 4 TB/s; 340 / 200 = 1.70
expect_line "report: decode, --tp 2 against 2 GPUs' copy rate, 1.70×" \
    "| decode batch 1 at 128 context | 200.0 tok/s (5.00 ms/step), 3,200 GB/s | 80.0% | 340.0 tok/s (2.94 ms/step), 5,440 GB/s | 68.0% | 1.70× | — | — | — |"
expect_line "report: the 70B table's columns" "| measure | --tp 2 | % of 2 GPUs | --pp 2 | % of 1 GPU | --tp 2 ÷ --pp 2 |"
expect_line "report: the 70B loads" "| load (random weights made and uploaded) | 8.0 s, 17.6 GB/s | | 9.0 s, 15.7 GB/s | | |"
# 7.2e13 / 0.09 s = 800 TFLOP/s = 50% of 2 x 800; / 0.144 s = 500 = 62.5% of one GPU's 800; 5688.89 / 3555.56 = 1.60
expect_line "report: 70B prefill, --tp 2 of 2 GPUs, --pp 2 of one" \
    "| prefill 512 tokens | 5,689 tok/s, 800.0 TFLOP/s | 50.0% | 3,556 tok/s, 500.0 TFLOP/s | 62.5% | 1.60× |"
# 1.44e11 B / 24 ms = 6,000 GB/s = 75% of 2 x 4 TB/s; / 48 ms = 3,000 GB/s = 75% of one GPU's 4 TB/s; 41.667 / 20.833 = 2.00
expect_line "report: 70B decode, --tp 2 of 2 GPUs, --pp 2 of one" \
    "| decode batch 1 at 128 context | 41.7 tok/s (24.00 ms/step), 6,000 GB/s | 75.0% | 20.8 tok/s (48.00 ms/step), 3,000 GB/s | 75.0% | 2.00× |"
expect_grep "report: cllm info's memory per GPU" "$md" \
    '^Memory per GPU, `cllm info --dummy-weights --tp 2`: GPU 0: rank 0: weights 71.61 GB \+ KV 1.34 GB = 72.95 GB; GPU 1: '
# 256,000 output tokens: over 32 s / 25.6 s of steps = 8,000 / 10,000 tok/s (--pp 1); 10,000 / 12,500 (--pp 2, 1.25×);
# --tp 2: 12,800 / 16,000 (16,000 / 10,000 = 1.60×)
expect_line "report: throughput, the pipeline section's --pp 1 beside" "| --pp 1 (pipeline section) | 1 | 8,000 | 10,000 | 1.00× | 32.0 |"
expect_line "report: throughput, the pipeline section's --pp 2 beside" "| --pp 2 (pipeline section) | 2 | 10,000 | 12,500 | 1.25× | 25.6 |"
expect_line "report: throughput, --tp 2" "| --tp 2 | 2 | 12,800 | 16,000 | 1.60× | 20.0 |"
expect_line "report: the errors" "Partly failed: throughput --tp 4 exit 124: timed out"
# the 405B shape on 8 GPUs: 2.3e11 B / 10 ms = 23,000 GB/s = 71.9% of 8 x 4 TB/s (--tp 8: one stage of 8 GPUs)
expect_line "report: 405B columns, each run's % of its stage's GPUs" "| measure | --tp 8 | % of 8 GPUs | --pp 8 | % of 1 GPU |"
expect_line "report: 405B load" "| load (random weights made and uploaded) | 20.0 s, 11.4 GB/s | | — | |"
expect_line "report: 405B decode at --tp 8 against 8 GPUs" \
    "| decode batch 1 at 128 context | 100.0 tok/s (10.00 ms/step), 23,000 GB/s | 71.9% | — | — |"
# 256,000 / 64 s = 4,000 whole; / 51.2 s = 5,000 over the steps
expect_line "report: 405B throughput, whole process" "| 1000-prompt throughput: output tok/s, whole process | 4,000 | | — | |"
expect_line "report: 405B throughput, over the steps" "| 1000-prompt throughput: output tok/s over the steps | 5,000 | | — | |"
# the pipeline section: a column group per --pp (no --pp 2 bench here); 1.6e10 B / 5 ms = 3,200 GB/s = 80% of 4 TB/s,
# / 6.25 ms = 64%, 160 / 200
expect_line "report: pipeline columns, one group per --pp" \
    "| measure | --pp 1 (1 GPU) | % of limit | --pp 2 (2 GPUs) | % of limit | ÷ --pp 1 | --pp 4 (4 GPUs) | % of limit | ÷ --pp 1 |"
expect_line "report: pipeline decode, --pp 4 of one GPU's limit" \
    "| decode batch 1 at 128 context | 200.0 tok/s (5.00 ms/step), 3,200 GB/s | 80.0% | — | — | — | 160.0 tok/s (6.25 ms/step), 2,560 GB/s | 64.0% | 0.80× |"
# 256,000 / 8 s = 32,000 over the steps (3.20× 10,000); / 10 s = 25,600 whole (3.20× 8,000)
expect_line "report: pipeline throughput over the steps, --pp 4" \
    "| 1000 prompts x 256 output tokens: output tok/s over the steps | 10,000 | | 12,500 | | 1.25× | 32,000 | | 3.20× |"
expect_line "report: pipeline throughput whole, --pp 4" \
    "| 1000 prompts x 256 output tokens: output tok/s, whole process | 8,000 | | 10,000 | | 1.25× | 25,600 | | 3.20× |"
# 2.3e11 B / 0.1 s = 2,300 GB/s = 57.5% of one GPU's 4 TB/s
expect_line "report: 405B Q4_K over --pp 4" "| decode batch 1 at 128 context | 10.0 tok/s (100.00 ms/step), 2,300 GB/s | 57.5% |"
expect_grep "report: the 405B table names its weights" "$md" 'in Q4_K \(`--dummy-weights=q4_k`\): 405\.80 G parameters, 228\.8 GB'
expect_grep "report: a big model without results says so" "$md" '`--pp 4`: no result \(the errors below\)'
expect_line "report: the pipeline errors" "Partly failed: llama3-70b --pp 4 exit 124: timed out"
expect_grep "report: throughput, where the load went and the close" "$md" \
    "The batched run's load, 1\.78 s: the model's tensors 0\.05 s, finding the GPUs 0\.31 s, backends, links and engine 1\.20 s, the rest 0\.22 s; closing took 0\.40 s\."
expect_grep "report: throughput, the batched run's clocks and power" "$md" \
    "During the batched run \(nvidia-smi every 100 ms\): GPU 0: SM clock median 1665 MHz of 1980, board power median 688 W \(max 700, limit 700\), at the power cap in 91% of 290 samples\."
why=$(python3 - "$TMP/rep/history.csv" <<'EOF' 2>&1
import csv, sys
rows = {(r["section"], r["model"], r["measure"]): r for r in csv.DictReader(open(sys.argv[1]))}
r = rows[("tensor_parallel", "llama3-8b", "decode batch 1 at 128 context, --tp 2")]
assert (r["value"], r["unit"], r["pct_of_limit"]) == ("340", "tok/s", "68.0"), r
r = rows[("tensor_parallel", "llama3-70b", "prefill 512 tokens, --pp 2")]
assert (r["value"], r["pct_of_limit"]) == ("3555.56", "62.5"), r
r = rows[("tensor_parallel", "llama3-8b", "throughput output tok/s over the steps, --tp 2")]
assert r["value"] == "16000", r
EOF
) && ok "report: the section's figures in the history CSV" || notok "report: the section's figures in the history CSV" "$why"
