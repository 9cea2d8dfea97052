#!/usr/bin/env bash
# kv_scales.sh — `--kv-scales` (issue 40: the fp8 KV cache's static scales)
# on the command line, on the CPU: a bad value, static scales for a bf16
# cache and checkpoint scales of a model that has none exit 2 in one line
# saying why; a checkpoint with k_scale / v_scale (tests/fixtures/fp8kv/
# tensor) uses them by default with --kv-dtype fp8, and they change what the
# cache holds (perplexity against --kv-scales dynamic); calibrate runs, and
# its results do not depend on a pipeline split (each stage calibrates its
# layers on the same first step).
source "$(dirname "$0")/lib.sh"
T=tests/fixtures/tiny/llama.gguf
K=tests/fixtures/fp8kv/tensor
TXT=tests/fixtures/perplexity/tiny.txt

for cmd in "chat -m $T --cpu" "generate -m $T --cpu -i -" "bench -m $T --cpu" "perplexity -m $T --cpu -f $TXT"; do
    c=${cmd%% *}
    for bad in static Dynamic ""; do
        expect_exit "$c --kv-scales '$bad' exits 2" 2 $CLLM $cmd --kv-dtype fp8 --kv-scales "$bad" < /dev/null
        expect_grep "$c --kv-scales '$bad' names the value and the choices" "$TMP/err" \
            "^cllm $c: --kv-scales '$bad': expected one of dynamic, checkpoint, calibrate$"
    done
    expect_exit "$c --kv-scales calibrate with a bf16 cache exits 2" 2 $CLLM $cmd --kv-scales calibrate < /dev/null
    expect_grep "$c: static scales need --kv-dtype fp8" "$TMP/err" \
        "^cllm $c: --kv-scales calibrate: only an fp8 KV cache has scales; add --kv-dtype fp8$"
done
expect_exit "generate --help" 0 $CLLM generate --help
expect_grep "generate --help lists --kv-scales" "$TMP/out" "--kv-scales S +fp8 KV cache scales: dynamic"
expect_exit "perplexity --help" 0 $CLLM perplexity --help
expect_grep "perplexity --help lists --kv-scales" "$TMP/out" "--kv-scales"

P="$CLLM perplexity --cpu -t 1 -f $TXT --kv-dtype fp8"
expect_exit "--kv-scales checkpoint without scales in the model exits 2" 2 $P -m $T --kv-scales checkpoint
expect_grep "--kv-scales checkpoint names the model" "$TMP/err" \
    "--kv-scales checkpoint: $T has no KV cache scales \(k_scale / v_scale tensors\)"
nll() { grep -E "^mean NLL: " "$TMP/out" | head -1; }
expect_exit "checkpoint scales by default" 0 $P -m $K && def=$(nll)
expect_exit "--kv-scales checkpoint" 0 $P -m $K --kv-scales checkpoint && ck=$(nll)
expect_exit "--kv-scales dynamic" 0 $P -m $K --kv-scales dynamic && dyn=$(nll)
expect_exit "--kv-scales calibrate" 0 $P -m $K --kv-scales calibrate && cal=$(nll)
[ -n "$def" ] && [ "$def" = "$ck" ] && ok "fp8 takes the checkpoint's scales by default ($def)" \
    || notok "fp8 takes the checkpoint's scales by default" "default '$def', checkpoint '$ck'"
[ -n "$ck" ] && [ "$ck" != "$dyn" ] && ok "the checkpoint's scales are used ($ck, dynamic $dyn)" \
    || notok "the checkpoint's scales are used" "checkpoint '$ck', dynamic '$dyn'"
expect_exit "bf16 cache of a model with scales" 0 $P -m $K --kv-dtype bf16

for i in $(seq 1 4); do echo "Question $i: name a colour and a number."; done > "$TMP/p.txt"
GEN="$CLLM generate -m $K --cpu -n 8 --temp 0 -c 64 -i $TMP/p.txt --ordered --kv-dtype fp8 --kv-scales calibrate"
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
expect_exit "generate --kv-scales calibrate" 0 $GEN -o "$TMP/cal.jsonl"
expect_exit "generate --kv-scales calibrate --pp 2" 0 $GEN --pp 2 -o "$TMP/calpp.jsonl"
cmp -s <(strip "$TMP/cal.jsonl") <(strip "$TMP/calpp.jsonl") && ok "calibrate: --pp 2 equals one stage" \
    || notok "calibrate: --pp 2 equals one stage" "$(diff <(strip "$TMP/cal.jsonl") <(strip "$TMP/calpp.jsonl") | head -4)"

expect_exit "info of a checkpoint with KV scales" 0 $CLLM info $K
expect_grep "info names the checkpoint's KV scales" "$TMP/out" \
    "static fp8 scales in the checkpoint \('model.layers.0.self_attn.k_scale' \.\.\.\)"
expect_exit "info of a model without" 0 $CLLM info $T
grep -q "static fp8 scales" "$TMP/out" && notok "info: no KV scales line without scales" || ok "info: no KV scales line without scales"
