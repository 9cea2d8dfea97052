#!/usr/bin/env bash
# gpu_options.sh — GPU options on a machine (or a build) without a usable GPU:
# a GPU named explicitly (--gpu N > 0, --gpus) cannot be honoured and exits 2
# naming the option and why; --pp N runs its stages on the CPU and says so in
# one line; with --cpu nothing is said. CI has no GPU: these are its messages.
source "$(dirname "$0")/lib.sh"
FIX=${CLLM_FIXTURES:-tests/fixtures}
M=$FIX/tiny/llama.gguf
# (a machine with a GPU runs tests/gpu/run.sh instead; CI has none)
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo "ok - gpu_options: a GPU is present: these are no-GPU checks"; exit 0; fi

chat() { printf 'hi\n' | "$CLLM" chat -m "$M" -n 4 --temp 0 "$@"; }
expect_exit "gpu_options: chat --gpu 3 exits 2" 2 chat --gpu 3 \
    && expect_grep "gpu_options: ... naming --gpu 3 and why" "$TMP/err" "^cllm chat: --gpu 3: no usable GPU here \(.+\); leave --gpu out, or add --cpu"
expect_exit "gpu_options: chat --pp 2 --gpus 0,1 exits 2" 2 chat --pp 2 --gpus 0,1 \
    && expect_grep "gpu_options: ... naming --gpus" "$TMP/err" "^cllm chat: --gpus '0,1': no usable GPU here"
expect_exit "gpu_options: chat --pp 2 runs on the CPU" 0 chat --pp 2
n=$(grep -c -- '--pp 2 runs its stages on the CPU$' "$TMP/err")
[ "$n" = 1 ] && ok "gpu_options: ... saying so once" || notok "gpu_options: ... saying so once" "$n lines: $(head -c 400 "$TMP/err")"
echo '{"prompt": "hi"}' > "$TMP/in.jsonl"
expect_exit "gpu_options: generate --gpu 2 exits 2" 2 "$CLLM" generate -m "$M" -n 4 --gpu 2 -i "$TMP/in.jsonl" -o "$TMP/o.jsonl" \
    && expect_grep "gpu_options: ... naming --gpu 2" "$TMP/err" "--gpu 2: no usable GPU here"
expect_exit "gpu_options: chat --pp 2 --cpu" 0 chat --pp 2 --cpu
grep -q 'on the CPU' "$TMP/err" && notok "gpu_options: --cpu: no fallback line" "$(head -c 400 "$TMP/err")" \
    || ok "gpu_options: --cpu: no fallback line"
