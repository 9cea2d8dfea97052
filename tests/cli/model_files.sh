#!/usr/bin/env bash
# model_files.sh — hostile or unsupported model files: `cllm info` exits 2 with
# a message naming the file, the field and its value (config.json, GGUF
# metadata, tokenizer.json), and what transformers does with a field cllm
# implements shows in `cllm info`.
source "$(dirname "$0")/lib.sh"

# A folder: the tiny model's config.json with FIELDS merged in (null deletes
# a key), and its tokenizer.json (random weights: --dummy-weights).
# config_folder NAME MODEL FIELDS-JSON
config_folder() {
    local dir="$TMP/$1"
    mkdir -p "$dir"
    cp "tests/fixtures/tiny/$2/tokenizer.json" "tests/fixtures/tiny/$2/tokenizer_config.json" "$dir/"
    python3 - "tests/fixtures/tiny/$2/config.json" "$3" "$dir/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for k, v in json.loads(sys.argv[2]).items():
    if v is None: c.pop(k, None)
    else: c[k] = v
json.dump(c, open(sys.argv[3], "w"))
PY
}

# info_refuses NAME MODEL FIELDS-JSON PATTERN — exit 2, stderr matches PATTERN.
info_refuses() {
    config_folder "$1" "$2" "$3"
    expect_exit "$1: exits 2" 2 $CLLM info "$TMP/$1" --dummy-weights &&
        expect_grep "$1: names the file, field and value" "$TMP/err" "$4"
}

info_refuses kv_heads_zero llama '{"num_key_value_heads": 0}' \
    'config\.json: num_key_value_heads = 0 \(must divide num_attention_heads = 4\)'
info_refuses hidden_size_string llama '{"hidden_size": "64"}' "config\.json: hidden_size = '64' \(must be an integer"
info_refuses rope_dynamic llama '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}' \
    "config\.json: rope_scaling\.rope_type = 'dynamic' \(not supported; cllm implements default, linear, llama3 and yarn\)"
info_refuses rope_longrope llama '{"rope_scaling": {"type": "longrope", "factor": 2.0}}' \
    "config\.json: rope_scaling\.type = 'longrope'"
info_refuses yarn_no_factor llama '{"rope_scaling": {"rope_type": "yarn"}}' \
    "config\.json: rope_scaling\.factor is missing"
info_refuses swiglu_alpha gpt-oss '{"swiglu_alpha": 1.5}' \
    'config\.json: swiglu_alpha = 1\.5 \(not supported; cllm implements 1\.702\)'
info_refuses hidden_act llama '{"hidden_act": "gelu"}' "config\.json: hidden_act = 'gelu'"

# Qwen2 without layer_types: use_sliding_window windows the layers from
# max_window_layers on (transformers' Qwen2Config), with sliding_window's window.
config_folder qwen2_window qwen2 \
    '{"use_sliding_window": true, "sliding_window": 32, "max_window_layers": 1, "layer_types": null}'
expect_exit "qwen2 max_window_layers: info" 0 $CLLM info "$TMP/qwen2_window" --dummy-weights
expect_grep "qwen2 max_window_layers: layer 1 of 2 windowed" "$TMP/out" "sliding window +1 of 2 layers windowed: 0 32$"

# tokenizer.json: ten chained Replaces of "a" by eight "a"s would make 8 bytes 8 GB.
config_folder tok_growth llama '{}'
python3 - "$TMP/tok_growth/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
rule = {"type": "Replace", "pattern": {"String": "a"}, "content": "aaaaaaaa"}
t["normalizer"] = {"type": "Sequence", "normalizers": [rule] * 10}
json.dump(t, open(sys.argv[1], "w"))
PY
expect_exit "tokenizer growth: exits 2" 2 $CLLM info "$TMP/tok_growth" --dummy-weights &&
    expect_grep "tokenizer growth: names the file and the normalizer" "$TMP/err" \
        "tok_growth/tokenizer\.json: normalizer: its steps can make text up to 1\.07e\+09 times longer \(limit 64\)"

# GGUF metadata: the tiny llama GGUF with one key set (replaced or added).
# gguf_with NAME KEY TYPE VALUE — TYPE: u32, i32, f32 or str.
gguf_with() {
    python3 - tests/fixtures/tiny/llama.gguf "$TMP/$1.gguf" "$2" "$3" "$4" <<'PY'
import struct, sys
src, dst, key, typ, val = sys.argv[1:]
b = open(src, "rb").read()
n_t, n_kv = struct.unpack_from("<QQ", b, 8)
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t, p):  # past one value of type t at p
    if t == 8: return p + 8 + struct.unpack_from("<Q", b, p)[0]
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p); p += 12
        for _ in range(n): p = skip(et, p)
        return p
    return p + SIZES[t]
p, kvs, align = 24, [], 32
for _ in range(n_kv):
    n, = struct.unpack_from("<Q", b, p); k = b[p + 8:p + 8 + n]; p += 8 + n
    t, = struct.unpack_from("<I", b, p); v0 = p; p = skip(t, p + 4)
    if k == b"general.alignment": align = struct.unpack_from("<I", b, v0 + 4)[0]
    kvs.append((k, b[v0:p]))
q = p  # tensor infos: name, n_dims, dims, type, offset (relative to the data start)
for _ in range(n_t):
    n, = struct.unpack_from("<Q", b, q); q += 8 + n
    nd, = struct.unpack_from("<I", b, q); q += 4 + 8 * nd + 4 + 8
data = b[-(-q // align) * align:]
typ_id, packed = {"u32": (4, lambda v: struct.pack("<I", int(v))), "i32": (5, lambda v: struct.pack("<i", int(v))),
                  "f32": (6, lambda v: struct.pack("<f", float(v))),
                  "str": (8, lambda v: struct.pack("<Q", len(v.encode())) + v.encode())}[typ]
kvs = [(k, v) for k, v in kvs if k != key.encode()] + [(key.encode(), struct.pack("<I", typ_id) + packed(val))]
out = b[:8] + struct.pack("<QQ", n_t, len(kvs)) + b"".join(struct.pack("<Q", len(k)) + k + v for k, v in kvs)
out += b[p:q]
out += b"\0" * (-len(out) % align) + data
open(dst, "wb").write(out)
PY
}

gguf_refuses() { # NAME KEY TYPE VALUE PATTERN
    gguf_with "$1" "$2" "$3" "$4" || { notok "$1: GGUF written"; return; }
    expect_exit "$1: exits 2" 2 $CLLM info "$TMP/$1.gguf" && expect_grep "$1: names the file, key and value" "$TMP/err" "$5"
}

# The rewriting itself keeps a valid file (so the refusals below are the keys').
gguf_with same llama.block_count u32 2 && expect_exit "GGUF rewritten with the same block count: info" 0 $CLLM info "$TMP/same.gguf"
gguf_refuses gguf_kv_heads llama.attention.head_count_kv u32 3 \
    "gguf_kv_heads\.gguf: llama\.attention\.head_count_kv = 3 \(must divide llama\.attention\.head_count = 4\)"
gguf_refuses gguf_kv_heads_type llama.attention.head_count_kv str 2 \
    "gguf_kv_heads_type\.gguf: key 'llama\.attention\.head_count_kv' must be an integer \(it is string\)"
gguf_refuses gguf_rope_type llama.rope.scaling.type str longrope \
    "gguf_rope_type\.gguf: key 'llama\.rope\.scaling\.type' = 'longrope' is not supported \(supported: none, linear, yarn\)"
gguf_refuses gguf_eps llama.attention.layer_norm_rms_epsilon f32 0 \
    "gguf_eps\.gguf: llama\.attention\.layer_norm_rms_epsilon = 0 \(must be in \(0, 1\)\)"
