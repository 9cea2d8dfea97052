#!/usr/bin/env bash
# perplexity.sh — `cllm perplexity` (issue 38) on the CPU against transformers:
# the strided-window mean NLL of the tiny fixtures (fp32, to 1e-5 relative)
# and of the real models (the dequantized GGUF, perplexity to 0.1%), with the
# golden numbers and token ids of tests/fixtures/make_perplexity_refs.py
# (refs.tsv, ids/); --save-logits then --kl-divergence: the same run gives
# KL ~ 0 and 100% top-1, an fp8 KV cache a small positive KL; a truncated,
# corrupted or mismatched logits file is refused naming the file and field;
# bad options exit 2 before anything loads.
source "$(dirname "$0")/lib.sh"
D=tests/fixtures/perplexity
L=tests/fixtures/tiny/llama
P="$CLLM perplexity --cpu -t 1"

# ---- options
expect_exit "no text exits 2" 2 $P -m $L
expect_exit "stride > ctx exits 2" 2 $P -m $L -f $D/tiny.txt --ctx 16 --stride 17
expect_grep "stride > ctx says why" "$TMP/err" "--stride 17: must be at most --ctx 16"
expect_exit "ctx 1 exits 2" 2 $P -m $L -f $D/tiny.txt --ctx 1
expect_grep "ctx 1 names the range" "$TMP/err" "--ctx 1: must be an integer in \[2, "
expect_exit "stride 0 exits 2" 2 $P -m $L -f $D/tiny.txt --stride 0
expect_exit "ctx with --kl-divergence exits 2" 2 $P -m $L -f $D/tiny.txt --ctx 16 --kl-divergence x
expect_exit "--save-logits over the --kl-divergence file exits 2" 2 $P -m $L -f $D/tiny.txt --kl-divergence x --save-logits x
expect_exit "a missing text exits 2" 2 $P -m $L -f "$TMP/none.txt"
expect_grep "a missing text is named" "$TMP/err" "none.txt: No such file"
: > "$TMP/empty.txt"
expect_exit "an empty text exits 2" 2 $P -m $L -f "$TMP/empty.txt"
expect_grep "an empty text: at least 2 tokens" "$TMP/err" "1 token\(s\) long: perplexity needs at least 2"
expect_exit "ctx beyond the model's context exits 2" 2 $P -m $L -f $D/tiny.txt --ctx 600
expect_grep "ctx beyond the model's context says so" "$TMP/err" "--ctx 600: longer than the model's context of 512"
expect_exit "perplexity --help" 0 $CLLM perplexity --help
expect_grep "--help states the windowing" "$TMP/out" "strided sliding window"

# ---- golden perplexities (transformers): same ids, same scored count, same NLL
# check_ref NAME MODEL TEXT CTX STRIDE N_TOKENS N_SCORED MEAN_NLL PPL TOL (relative, on the perplexity)
check_ref() {
    local name="$1 ctx $4 stride $5" model=$2 text=$3
    $CLLM tokenize -m "$model" -f "$text" > "$TMP/ids" 2> "$TMP/err"
    cmp -s "$TMP/ids" "$D/ids/$1.txt" && ok "$1: the ids of transformers" \
        || notok "$1: the ids of transformers" "$(head -c 300 "$TMP/ids") $(head -c 200 "$TMP/err")"
    expect_exit "$name runs" 0 $P -m "$model" -f "$text" --ctx $4 --stride $5 || return
    awk -v n="$6" -v s="$7" -v nll="$8" -v ppl="$9" -v tol="${10}" '
        function rel(a, b) { return (a > b ? a - b : b - a) / b }
        /^text: / { gsub(/,/, "", $3); got_n = $3 }
        /^windows: / { got_s = $6 }
        /^mean NLL: / { got_nll = $3 }
        /^perplexity: / { got_ppl = $2 }
        END { if (got_n != n || got_s != s || rel(got_ppl, ppl) > tol || rel(got_nll, nll) > tol) {
                  printf "tokens %s/%s scored %s/%s nll %s/%s ppl %s/%s\n", got_n, n, got_s, s, got_nll, nll, got_ppl, ppl; exit 1 } }' \
        "$TMP/out" > "$TMP/why" && ok "$name: transformers' perplexity $9" || notok "$name: transformers' perplexity $9" \
        "$(cat "$TMP/why")"
}
while IFS=$'\t' read -r name model text ctx stride n s nll ppl; do
    case $name in "#"*) continue ;; esac
    model=${model/\$CLLM_MODELS/$MODELS}
    [ "$text" = tiny ] && tol=1e-5 || tol=1e-3
    check_ref "$name" "$model" "$D/$( [ "$text" = tiny ] && echo tiny.txt || echo text.txt)" "$ctx" "$stride" "$n" "$s" \
        "$nll" "$ppl" "$tol"
done < $D/refs.tsv

# ---- KL divergence
# kl_field FILE LINE-PREFIX: the first number after the prefix
kl_num() { grep "^$2" "$1" | head -1 | sed "s/^$2 *//; s/[^0-9.e+-].*//"; }
expect_exit "save logits" 0 $P -m $L -f $D/tiny.txt --ctx 64 --stride 24 --save-logits "$TMP/ref.logits"
cp "$TMP/out" "$TMP/ref.out"
bytes=$(stat -c %s "$TMP/ref.logits")
[ "$bytes" = $((48 + 4 * 383 + 382 * (16 + 2 * 320))) ] && ok "logits file: header + ids + 382 rows of 320" \
    || notok "logits file: header + ids + 382 rows of 320" "$bytes bytes"
expect_exit "KL against itself" 0 $P -m $L -f $D/tiny.txt --kl-divergence "$TMP/ref.logits"
kl=$(kl_num "$TMP/out" "mean KL divergence:")
awk -v k="$kl" 'BEGIN { exit !(k >= 0 && k < 1e-6) }' && ok "KL against itself ~ 0 ($kl)" || notok "KL against itself ~ 0" "$(cat "$TMP/out")"
expect_grep "top-1 100% against itself" "$TMP/out" "^top-1 agreement: 100.0000% \(382 of 382\)"
expect_grep "ratio 1 against itself" "$TMP/out" "^perplexity ratio \(this / reference\): 1.000000"
expect_grep "the windows come from the file" "$TMP/out" "^windows: ctx 64, stride 24; 382 tokens scored"
r1=$(grep "^perplexity:" "$TMP/ref.out" | cut -d' ' -f2); r2=$(kl_num "$TMP/out" "reference perplexity:")
awk -v a="$r1" -v b="$r2" 'BEGIN { d = (a - b) / a; exit !(d < 1e-6 && d > -1e-6) }' && ok "the reference's perplexity from the file" || notok "the reference's perplexity from the file" "$r1 vs $r2"
expect_exit "KL with an fp8 KV cache" 0 $P -m $L -f $D/tiny.txt --kl-divergence "$TMP/ref.logits" --kv-dtype fp8
kl=$(kl_num "$TMP/out" "mean KL divergence:")
awk -v k="$kl" 'BEGIN { exit !(k > 1e-6 && k < 0.5) }' && ok "fp8 KV: 0 < KL < 0.5 ($kl)" || notok "fp8 KV: 0 < KL < 0.5" "$(cat "$TMP/out")"
expect_grep "fp8 KV: the percentiles and dp" "$TMP/out" "^dp percentiles: min -[0-9.]+%, 1% .*, 99% .*, max \+"

# ---- hostile and mismatched logits files: refused, naming the file and the field
refuse() { # NAME FILE PATTERN [model]
    expect_exit "$1 exits 2" 2 $P -m "${4:-$L}" -f $D/tiny.txt --kl-divergence "$2" && expect_grep "$1 is named" "$TMP/err" "$3"
}
head -c 3000 "$TMP/ref.logits" > "$TMP/cut.logits"
refuse "a truncated file" "$TMP/cut.logits" "cut.logits: 3000 bytes, but its header .* \(truncated\?\)"
head -c 20 "$TMP/ref.logits" > "$TMP/short.logits"
refuse "a file shorter than its header" "$TMP/short.logits" "short.logits: truncated in the header"
cp "$TMP/ref.logits" "$TMP/magic.logits"; printf 'XXXX' | dd of="$TMP/magic.logits" conv=notrunc status=none
refuse "a bad magic" "$TMP/magic.logits" "magic.logits: not a cllm logits file"
cp "$TMP/ref.logits" "$TMP/stride.logits"; printf '\x41\x00\x00\x00' | dd of="$TMP/stride.logits" bs=1 seek=20 conv=notrunc status=none
refuse "stride > ctx in the header" "$TMP/stride.logits" "stride.logits: header field stride 65: must be in \[1, ctx 64\]"
cp "$TMP/ref.logits" "$TMP/lo.logits"; printf '\x00\x00\x80\x7f' | dd of="$TMP/lo.logits" bs=1 seek=$((48 + 4 * 383 + 5 * 656)) conv=notrunc status=none
refuse "an infinite row field" "$TMP/lo.logits" "lo.logits: row 5: field lo inf"
cp "$TMP/ref.logits" "$TMP/id.logits"; printf '\xff\xff\x00\x00' | dd of="$TMP/id.logits" bs=1 seek=$((48 + 4 * 7)) conv=notrunc status=none
refuse "a token id outside the vocabulary" "$TMP/id.logits" "id.logits: token id 65535 at position 7: outside the vocabulary of 320"
refuse "another model's vocabulary" "$TMP/ref.logits" "ref.logits: vocabulary of 320, this model's is 288" tests/fixtures/tiny/gemma3
sed 's/rivers/Rivers/' $D/tiny.txt > "$TMP/other.txt"
expect_exit "another text exits 2" 2 $P -m $L -f "$TMP/other.txt" --kl-divergence "$TMP/ref.logits"
expect_grep "another text: the first differing position" "$TMP/err" "ref.logits: token [0-9]+ differs: [0-9]+ here, [0-9]+ in the file"

# ---- a real model against an fp8 KV cache of itself
M=$MODELS/smollm2-135m-instruct.gguf
expect_exit "smollm2: save logits" 0 $P -m $M -f $D/tiny.txt --ctx 64 --save-logits "$TMP/sm.logits"
expect_exit "smollm2: KL with an fp8 KV cache" 0 $P -m $M -f $D/tiny.txt --kl-divergence "$TMP/sm.logits" --kv-dtype fp8
kl=$(kl_num "$TMP/out" "mean KL divergence:"); top=$(kl_num "$TMP/out" "top-1 agreement:")
awk -v k="$kl" -v t="$top" 'BEGIN { exit !(k > 1e-6 && k < 0.05 && t > 85) }' && ok "smollm2 fp8 KV: small KL ($kl), top-1 $top%" \
    || notok "smollm2 fp8 KV: small KL, top-1 > 85%" "$(cat "$TMP/out")"
