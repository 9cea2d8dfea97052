#!/usr/bin/env bash
# fp8_weights.sh — FP8 (e4m3) weights on the command line, on the CPU:
# --weights is refused with a bad value on every command that loads a model;
# generate runs FP8 checkpoints and --weights fp8; `cllm quantize --type fp8`
# writes a checkpoint that generates exactly what --weights fp8 does (and
# with --pp 2); broken scales and other quantizations exit 2 naming the
# tensor or the field; info shows the FP8 matrices and their scale kind.
source "$(dirname "$0")/lib.sh"
F=tests/fixtures
M=$F/tiny/mistral

for cmd in "chat -m $M --cpu" "generate -m $M --cpu -i -" "serve -m $M --cpu" "bench -m $M --cpu" "perplexity -m $M --cpu -f /dev/null"; do
    expect_exit "${cmd%% *} --weights int4 exits 2" 2 $CLLM $cmd --weights int4 < /dev/null
    expect_grep "${cmd%% *} --weights int4 names the value and the choices" "$TMP/err" \
        "^cllm ${cmd%% *}: --weights 'int4': expected file or fp8$"
done
expect_exit "generate --help" 0 $CLLM generate --help && expect_grep "generate --help lists --weights" "$TMP/out" "--weights S +fp8: quantize"

for i in $(seq 1 6); do echo "The model reads the file $i"; done > "$TMP/p.txt"
GEN="$CLLM generate --cpu -n 8 --temp 0 -c 64 -i $TMP/p.txt --ordered"
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
expect_exit "generate --weights fp8" 0 $GEN -m $M --weights fp8 -o "$TMP/w8.jsonl"
n=$(grep -c '"text"' "$TMP/w8.jsonl")
[ "$n" = 6 ] && ok "--weights fp8: a reply per prompt" || notok "--weights fp8: a reply per prompt" "$n lines"
expect_exit "generate unquantized" 0 $GEN -m $M -o "$TMP/f32.jsonl"
cmp -s <(strip "$TMP/w8.jsonl") <(strip "$TMP/f32.jsonl") && notok "--weights fp8 changes the numbers" "same output as fp32" \
    || ok "--weights fp8 changes the numbers"

expect_exit "quantize --type fp8" 0 $CLLM quantize $M "$TMP/q8" --type fp8
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
    [ -f "$TMP/q8/$f" ] && ok "quantize --type fp8 wrote $f" || notok "quantize --type fp8 wrote $f"
done
expect_grep "config.json: compressed-tensors" "$TMP/q8/config.json" '"quant_method": "compressed-tensors"'
expect_exit "generate the fp8 checkpoint" 0 $GEN -m "$TMP/q8" -o "$TMP/q8.jsonl"
cmp -s <(strip "$TMP/w8.jsonl") <(strip "$TMP/q8.jsonl") && ok "the checkpoint generates what --weights fp8 does" \
    || notok "the checkpoint generates what --weights fp8 does" "$(diff <(strip "$TMP/w8.jsonl") <(strip "$TMP/q8.jsonl") | head -4)"
expect_exit "generate the fp8 checkpoint --pp 2" 0 $GEN -m "$TMP/q8" --pp 2 -o "$TMP/q8pp.jsonl"
cmp -s <(strip "$TMP/q8.jsonl") <(strip "$TMP/q8pp.jsonl") && ok "fp8: --pp 2 equals one stage" \
    || notok "fp8: --pp 2 equals one stage" "$(diff <(strip "$TMP/q8.jsonl") <(strip "$TMP/q8pp.jsonl") | head -4)"
expect_exit "info of the checkpoint" 0 $CLLM info "$TMP/q8"
expect_grep "info: per-channel FP8 matrices" "$TMP/out" "^fp8 weights +15 matrices in e4m3: 15 with per-channel scales, activations dynamic per token \(quantization_config 'compressed-tensors'\)$"
expect_exit "info --tensors" 0 $CLLM info "$TMP/q8" --tensors
expect_grep "info --tensors: scale kind" "$TMP/out" "^lm_head.weight +F8_E4M3 \[64, 304\] 19456 bytes, scale per-channel$"
expect_exit "quantize --type fp8 of an fp8 checkpoint exits 2" 2 $CLLM quantize "$TMP/q8" "$TMP/q8b" --type fp8
expect_grep "... saying it is quantized" "$TMP/err" "already quantized \(quantization_config quant_method 'compressed-tensors'\)"
expect_exit "quantize --type fp8 of a GGUF exits 2" 2 $CLLM quantize $F/tiny/llama.gguf "$TMP/q8c" --type fp8
expect_grep "... saying it reads safetensors" "$TMP/err" "reads a safetensors model folder"

expect_exit "generate the fp8 static checkpoint" 0 $GEN -m $F/fp8/fp8-static -o "$TMP/st.jsonl"
expect_exit "info: static" 0 $CLLM info $F/fp8/fp8-static
expect_grep "info: per-tensor, static" "$TMP/out" "^fp8 weights +14 matrices in e4m3: 14 with a per-tensor scale, activations static \(input_scale\) \(quantization_config 'fp8'\)$"

for b in zero missing; do cp -r $F/fp8/bad/$b "$TMP/$b" && cp $M/tokenizer*.json "$TMP/$b/"; done
expect_exit "a zero scale exits 2" 2 $CLLM info "$TMP/zero"
expect_grep "... naming the tensor" "$TMP/err" "tensor 'model.layers.0.self_attn.q_proj.weight_scale': value 0 is 0; a scale must be a positive finite number"
expect_exit "a missing scale exits 2" 2 $CLLM generate -m "$TMP/missing" --cpu -i - < /dev/null
expect_grep "... naming the tensor" "$TMP/err" "'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but its scale 'model.layers.0.self_attn.q_proj.weight_scale' is missing"

mkdir -p "$TMP/awq"
sed 's/"quant_method": "compressed-tensors"/"quant_method": "awq"/' "$TMP/q8/config.json" > "$TMP/awq/config.json"
ln -s "$TMP/q8/model.safetensors" "$TMP/awq/model.safetensors"
cp $M/tokenizer*.json "$TMP/awq/"
expect_exit "quant_method awq exits 2" 2 $CLLM generate -m "$TMP/awq" --cpu -i - < /dev/null
expect_grep "... naming quant_method" "$TMP/err" "quantization_config.quant_method 'awq' is not supported"
