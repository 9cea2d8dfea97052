#!/usr/bin/env bash
# bench.sh — `cllm bench` on the tiny Llama fixture (CPU): the table has a row
# per prompt length and context, the JSON file holds the same runs, and its
# TFLOP/s and GB/s follow from the timings by FLOP and byte counts worked out
# here by hand from the fixture's shapes; bad options exit 2.
source "$(dirname "$0")/lib.sh"
M=tests/fixtures/tiny/llama.gguf
B="$CLLM bench -m $M --cpu -t 1"

expect_exit "bench tiny llama" 0 $B --prompt-lens 16,40,7 --ctx 8,33 --decode-tokens 6 --reps 2 --json "$TMP/b.json"
expect_grep "bench: load line" "$TMP/out" "^load +[0-9.]+ s, [0-9.]+ GB/s"
expect_grep "bench: model line" "$TMP/out" "^model +tiny-llama \(llama, 94.54 K parameters"
n=$(grep -cE "^ +(16|40|7) +[0-9.]+ +[0-9.]+ +[0-9.]+ +-$" "$TMP/out")
[ "$n" = 3 ] && ok "bench: a prefill row per length" || notok "bench: a prefill row per length" "$n rows: $(cat "$TMP/out")"
n=$(grep -cE "^ +(8|33) +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +([0-9.]+%|-)$" "$TMP/out")
[ "$n" = 2 ] && ok "bench: a decode row per context" || notok "bench: a decode row per context" "$n rows: $(cat "$TMP/out")"

# The fixtures: 2 layers, C 64, 4 heads / 2 KV heads of 16, F32 weights.
# llama: layer matrices 64*64*2 + 64*32*2 + 3*64*128 = 36864 a layer, 2 norms of 64; V 320, tied; no window.
# gemma2: 64*64*2 + 64*32*2 + 3*64*96 = 30720 a layer, 4 norms; V 300, tied; window 5 on layer 0.
# Prefill T: 2*matrices*T + 2 layers of 2*4*(16+16)*pairs (T(T+1)/2, or W(W+1)/2 + (T-W)W under window W)
#   + the LM head 2*V*64 (one row).
# Decode, K/V cached at ctx + 2 + steps/2 (the median step; +1 warm-up, +1 itself); a batch's
# sequences each at their own context (ctx_mean: their mean at the median step; no window here):
#   4 bytes * (matrices + norms + head + final norm) + batch * keys (at most W) * 2*(16+16)*4 bytes of K/V, which
#   the CPU holds in fp32 for --kv-dtype bf16 (KV_BYTES, a layer's K/V of one token: 256; --kv-dtype fp8:
#   2 heads * (16+16 codes + 2*4 scale bytes) = 80).
# check_json FILE PREFILL_ROWS DECODE_ROWS STEPS BATCH MATRICES HEAD WEIGHT_BYTES WINDOW0 [KV_BYTES]
check_json() {
    awk -v want_p="$2" -v want_d="$3" -v steps="$4" -v batch="$5" -v mm="$6" -v head="$7" -v wb="$8" -v w0="$9" \
        -v kvb="${10:-256}" '
        function num(key,   m) { if (match($0, "\"" key "\": [-0-9.e+]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*: /, "", m); return m + 0 } return -1 }
        function rel(a, b) { return (a > b ? a - b : b - a) / b }
        function pairs(T, W) { return (W <= 0 || W >= T) ? T*(T+1)/2 : W*(W+1)/2 + (T-W)*W }
        function keys(k, W) { return (W > 0 && W < k) ? W : k }
        /"tokens":/ { np++; T = num("tokens"); s = num("seconds")
            f = 2*mm*T + 2*4*32*(pairs(T, w0) + pairs(T, 0)) + 2*head
            if (rel(num("tflops"), f / s / 1e12) > 1e-3 || rel(num("tok_s"), T / s) > 1e-3) { bad = bad " prefill" T } }
        /"ctx":/ { nd++; k = num("ctx_mean") + 1; s = num("step_s")
            if (batch == 1 && num("ctx_mean") != num("ctx") + 1 + int(steps / 2)) { bad = bad " ctx_mean" num("ctx") }
            if (num("ctx_mean") < num("ctx") + 1 + int(steps / 2) || num("ctx_mean") > num("ctx") + batch + int(steps / 2)) { bad = bad " ctx_range" num("ctx") }
            by = wb + batch * (keys(k, w0) + k) * kvb
            if (rel(num("gbps"), by / s / 1e9) > 1e-3 || rel(num("tok_s"), batch / s) > 1e-3 || num("batch") != batch) { bad = bad " decode" num("ctx") } }
        END { if (np != want_p || nd != want_d || bad != "") { print "rows " np "/" nd ", wrong:" bad; exit 1 } }' "$1"
}
LLAMA="73728 20480 378112 0"
msg=$(check_json "$TMP/b.json" 3 2 6 1 $LLAMA) && ok "bench JSON: TFLOP/s and GB/s from hand-counted FLOPs and bytes" \
    || notok "bench JSON: TFLOP/s and GB/s from hand-counted FLOPs and bytes" "$msg" "$(cat "$TMP/b.json")"
# The limits are the backend's own, each with its source: the CPU's memory bandwidth measured by a memcpy
# (decode is a % of it), no FLOP rate (prefill is not), no GPU's.
expect_grep "bench JSON: no % of a FLOP rate on the CPU" "$TMP/b.json" '"tokens": 16, .*"pct_peak": null'
expect_grep "bench: the header states the CPU's bandwidth and its source" "$TMP/out" \
    "^limits +CPU memory [0-9.]+ GB/s \(measured: memcpy of 0.[0-9]+ GiB on one thread, best of 5\)$"
expect_grep "bench: the header says the CPU has no FLOP rate" "$TMP/out" "^ +no FLOP rate for the CPU: no % for prefill$"
sed -n "1,/^load/p" "$TMP/out" | grep -qE "TFLOP/s|TB/s|^GPU " && notok "bench: no GPU's limits on the CPU" "$(head -5 "$TMP/out")" \
    || ok "bench: no GPU's limits on the CPU"
expect_grep "bench: the header names the CPU cache's own dtype" "$TMP/out" "^KV cache fp32, [0-9]+ tokens"
expect_grep "bench JSON: the CPU cache's own dtype" "$TMP/b.json" '"kv_dtype": "fp32"'
expect_grep "bench JSON: no FLOP limit on the CPU, and why" "$TMP/b.json" \
    '"peak_tflops": null, .*"peak_tflops_source": "no FLOP rate for the CPU"'
expect_grep "bench JSON: the CPU's bandwidth, and its source" "$TMP/b.json" \
    '"peak_tbps": [0-9.e-]+, "peak_tbps_source": "measured: memcpy of 0.[0-9]+ GiB on one thread, best of 5"'
# decode's % peak is its GB/s over the measured bandwidth (TB/s * 1000), on every decode row
msg=$(awk 'function num(key,   m) { if (match($0, "\"" key "\": [-0-9.e+]+")) { m = substr($0, RSTART, RLENGTH); sub(/.*: /, "", m); return m + 0 } return -1 }
    /"peak_tbps":/ { peak = num("peak_tbps") }
    /"ctx":/ { n++; want = 100 * num("gbps") / (peak * 1000); got = num("pct_peak")
        if (peak <= 0 || got <= 0 || (got - want > 0.01 + want * 1e-3) || (want - got > 0.01 + want * 1e-3)) bad = bad " ctx" num("ctx") ": " got " vs " want }
    END { if (n != 2 || bad != "") { print n " rows, wrong:" bad; exit 1 } }' "$TMP/b.json") \
    && ok "bench JSON: decode % of the CPU's bandwidth" || notok "bench JSON: decode % of the CPU's bandwidth" "$msg" "$(cat "$TMP/b.json")"
n=$(grep -cE "^ +(8|33) +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+%$" "$TMP/out")
[ "$n" = 2 ] && ok "bench: decode rows show a % on the CPU" || notok "bench: decode rows show a % on the CPU" "$(cat "$TMP/out")"

# the CPU's defaults: short runs (2 prompt lengths and contexts of 128 and 256, 32 decode steps, 1 rep)
expect_exit "bench defaults on the CPU" 0 $B --json "$TMP/def.json"
expect_grep "bench defaults on the CPU: 1 rep, 32 decode steps" "$TMP/def.json" '"reps": 1, "decode_tokens": 32'
n=$(grep -cE '"tokens": (128|256), ' "$TMP/def.json")
[ "$n" = 2 ] && ok "bench defaults on the CPU: prompts 128 and 256" || notok "bench defaults on the CPU: prompts 128 and 256" "$(cat "$TMP/def.json")"
n=$(grep -cE '"ctx": (128|256), "batch": 1, "steps": 32,' "$TMP/def.json")
[ "$n" = 2 ] && ok "bench defaults on the CPU: contexts 128 and 256" || notok "bench defaults on the CPU: contexts 128 and 256" "$(cat "$TMP/def.json")"

# a prompt longer than every decode context: the context is sized for the prompt and its sampled token
expect_exit "bench prompt longer than the decode contexts" 0 $B --prompt-lens 200 --ctx 8 --decode-tokens 4 --reps 1
expect_exit "bench --batch 3" 0 $B --prompt-lens 12 --ctx 20 --decode-tokens 5 --reps 1 --batch 3 --json "$TMP/b3.json"
msg=$(check_json "$TMP/b3.json" 1 1 5 3 $LLAMA) && ok "bench --batch 3: bytes count each sequence's K/V" \
    || notok "bench --batch 3: bytes count each sequence's K/V" "$msg" "$(cat "$TMP/b3.json")"
# --pp 2: the stages' backends each hold one layer; FLOPs and bytes still count the whole model.
expect_exit "bench --pp 2" 0 $B --prompt-lens 12 --ctx 20 --decode-tokens 5 --reps 1 --pp 2 --json "$TMP/pp.json"
msg=$(check_json "$TMP/pp.json" 1 1 5 1 $LLAMA) && ok "bench --pp 2: the whole model counted" \
    || notok "bench --pp 2: the whole model counted" "$msg" "$(cat "$TMP/pp.json")"
expect_exit "bench gemma2 (window 5 on layer 0)" 0 $CLLM bench -m tests/fixtures/tiny/gemma2.gguf --cpu -t 1 \
    --prompt-lens 3,12 --ctx 2,30 --decode-tokens 4 --reps 1 --json "$TMP/g.json"
msg=$(check_json "$TMP/g.json" 2 2 4 1 61440 19200 324864 5) && ok "bench gemma2: windowed pairs and keys counted" \
    || notok "bench gemma2: windowed pairs and keys counted" "$msg" "$(cat "$TMP/g.json")"
# --kv-dtype fp8: the cache's own bytes counted (80 per token and layer instead of 128).
expect_exit "bench --kv-dtype fp8" 0 $B --prompt-lens 12 --ctx 20 --decode-tokens 5 --reps 1 --kv-dtype fp8 --json "$TMP/f8.json"
msg=$(check_json "$TMP/f8.json" 1 1 5 1 $LLAMA 80) && ok "bench --kv-dtype fp8: K/V bytes as fp8 codes + scales" \
    || notok "bench --kv-dtype fp8: K/V bytes as fp8 codes + scales" "$msg" "$(cat "$TMP/f8.json")"
expect_grep "bench --kv-dtype fp8: JSON names it" "$TMP/f8.json" '"kv_dtype": "fp8"'
expect_grep "bench --kv-dtype fp8: table names it" "$TMP/out" "^KV cache fp8, [0-9]+ tokens"
# --dummy-weights=q4_k: a config-only folder (quantizable shapes, as in basic.sh) runs on quantized random weights
mkdir -p "$TMP/dq" && cp tests/fixtures/tiny/llama/tokenizer.json "$TMP/dq/"
echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 320,
 "max_position_embeddings": 256, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1}' > "$TMP/dq/config.json"
expect_exit "bench --dummy-weights=q4_k" 0 $CLLM bench -m "$TMP/dq" --dummy-weights=q4_k --cpu -t 1 --prompt-lens 8 \
    --ctx 8 --decode-tokens 2 --reps 1
expect_grep "bench --dummy-weights=q4_k: prefill row" "$TMP/out" "^ +8 +[0-9.]+ +[0-9.]+ +[0-9.]+ +-$"
expect_exit "bench --dummy-weights=q2_k exits 2" 2 $B --dummy-weights=q2_k
expect_grep "bench --dummy-weights=q2_k: value named" "$TMP/err" "dummy-weights=q2_k"
expect_exit "bench --help exits 0" 0 $CLLM bench --help
expect_grep "bench --help lists --prompt-lens" "$TMP/out" "--prompt-lens"
expect_grep "bench --help: prompt lengths per backend" "$TMP/out" "default: GPU 512,4096; CPU 128,256"
expect_grep "bench --help: contexts per backend" "$TMP/out" "default: GPU 128,4096; CPU 128,256"
expect_grep "bench --help: decode steps per backend" "$TMP/out" "default: GPU 64, CPU 32"
expect_grep "bench --help: reps per backend" "$TMP/out" "default: GPU 3, CPU 1"
expect_exit "cllm --help exits 0" 0 $CLLM --help && expect_grep "help lists bench" "$TMP/out" "^  bench "

for bad in "--prompt-lens 0" "--prompt-lens abc" "--prompt-lens 512,,4096" "--prompt-lens 512," "--ctx -5" \
           "--ctx 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17" "--batch 0" "--batch 100000" "--reps 0" \
           "--decode-tokens 0" "--decode-tokens x" "--bogus" "--json" "--kv-dtype fp16" "--kv-dtype"; do
    expect_exit "bench $bad exits 2" 2 $B $bad
    [ -s "$TMP/err" ] && [ "$(wc -l < "$TMP/err")" = 1 ] && ok "bench $bad: one-line error" \
        || notok "bench $bad: one-line error" "$(cat "$TMP/err")"
done
expect_exit "bench missing model exits 2" 2 $CLLM bench -m "$TMP/nope.gguf" --cpu
expect_grep "bench missing model named" "$TMP/err" "nope.gguf"
expect_exit "bench unwritable JSON exits 2" 2 $B --prompt-lens 4 --ctx 4 --decode-tokens 2 --reps 1 --json "$TMP/no/dir/b.json"
expect_grep "bench unwritable JSON named" "$TMP/err" "no/dir/b.json"
