#!/usr/bin/env bash
# loading.sh — what loading tells of a model file: the biases it applies, the
# tensors it ignores (a warning at load, listed by `cllm info`), and
# `cllm quantize` refusing, before writing anything, inputs that loading
# refuses. The broken inputs are the tiny llama GGUF edited byte for byte
# (same lengths, so every offset stays valid) by python3's standard library.
source "$(dirname "$0")/lib.sh"
TINY=tests/fixtures/tiny

# info reports the MLP biases it binds (GGUF llama blk.N.ffn_*.bias; HF mlp_bias)
for m in $TINY/llama-mlp-bias.gguf $TINY/llama-mlp-bias; do
    expect_exit "info $(basename $m)" 0 $CLLM info $m
    expect_grep "info $(basename $m): biases" "$TMP/out" "^biases +gate, up, down$"
    expect_grep "info $(basename $m): no unused tensor" "$TMP/out" "^unused tensors +0$"
done
expect_exit "info llama.gguf" 0 $CLLM info $TINY/llama.gguf
expect_grep "info llama.gguf: no biases" "$TMP/out" "^biases +none$"

# edit SRC DST OP... — DST is SRC with each OP applied, in place (same
# lengths: every offset stays valid): OLD=NEW renames a string found once;
# KEY:OLD:NEW changes the uint32 value of metadata key KEY.
edit() {
    python3 - "$@" <<'PY'
import struct, sys
src, dst, ops = sys.argv[1], sys.argv[2], sys.argv[3:]
data = open(src, "rb").read()
for op in ops:
    if "=" in op:
        o, n = (s.encode() for s in op.split("="))
    else:
        key, a, b = op.split(":")
        o, n = (key.encode() + struct.pack("<II", 4, int(v)) for v in (a, b))  # type 4: uint32
    assert len(o) == len(n) and data.count(o) == 1, (op, data.count(o))
    data = data.replace(o, n)
open(dst, "wb").write(data)
PY
}

# a safetensors copy of tiny llama with one more tensor ("extra.weight", 4 floats)
mkdir -p "$TMP/st"
cp $TINY/llama/config.json $TINY/llama/tokenizer.json $TINY/llama/tokenizer_config.json "$TMP/st/"
python3 - $TINY/llama/model.safetensors "$TMP/st/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
head, body = json.loads(data[8:8 + n]), data[8 + n:]
head["extra.weight"] = {"dtype": "F32", "shape": [4], "data_offsets": [len(body), len(body) + 16]}
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + body + struct.pack("<4f", 1, 2, 3, 4))
PY
expect_exit "extra tensor: info loads" 0 $CLLM info "$TMP/st"
expect_grep "extra tensor: warned at load" "$TMP/err" "warning: .*tensor 'extra.weight' is not used"
expect_grep "extra tensor: listed by info" "$TMP/out" "^unused tensors +1 "
expect_grep "extra tensor: named by info" "$TMP/out" "^ +extra.weight$"
n=$(grep -c "extra.weight" "$TMP/err")
[ "$n" = 1 ] && ok "extra tensor: warned once" || notok "extra tensor: warned once" "$n warnings: $(cat "$TMP/err")"

# quantize: each broken input refused (exit 2, the field named), no OUT left
check_refused() {  # NAME FILE PATTERN
    rm -f "$TMP/q.gguf"
    expect_exit "$1: info refuses" 2 $CLLM info "$2"
    expect_exit "$1: quantize refuses" 2 $CLLM quantize "$2" "$TMP/q.gguf" --type q8_0
    expect_grep "$1: quantize names it" "$TMP/err" "$3"
    [ ! -e "$TMP/q.gguf" ] && ok "$1: no output file" || notok "$1: no output file" "$TMP/q.gguf exists"
}
edit $TINY/llama.gguf "$TMP/missing.gguf" blk.0.ffn_up.weight=blk.0.ffn_up.weighx
check_refused "missing tensor" "$TMP/missing.gguf" "tensor 'blk.0.ffn_up.weight' is missing"
# attn_q [64][64] and attn_k [32][64] trade names: attn_q's shape is wrong
edit $TINY/llama.gguf "$TMP/shape.gguf" blk.1.attn_q.weight=blk.1.attn_X.weight \
    blk.1.attn_k.weight=blk.1.attn_q.weight blk.1.attn_X.weight=blk.1.attn_k.weight
check_refused "wrong shape" "$TMP/shape.gguf" "tensor 'blk.1.attn_q.weight' has shape"
edit $TINY/llama.gguf "$TMP/bos.gguf" tokenizer.ggml.bos_token_id:0:5000
check_refused "bad token id" "$TMP/bos.gguf" "tokenizer.ggml.bos_token_id: 5000 is out of range"
edit $TINY/llama.gguf "$TMP/heads.gguf" llama.attention.head_count_kv:2:3
check_refused "head counts" "$TMP/heads.gguf" "head_count_kv = 3 \(must divide"
exit 0
