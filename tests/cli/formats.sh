#!/usr/bin/env bash
# formats.sh — what a path passed as a model is, told by its first bytes:
# GGUF ("GGUF"), safetensors (u64 header length, then '{'), a Hugging Face
# folder (config.json). Anything else exits 2 with one line naming the file
# and what it is not (or what it is: empty, a PyTorch checkpoint, ONNX), never
# a safetensors header length read out of text.
source "$(dirname "$0")/lib.sh"
READS="cllm reads .gguf files and Hugging Face folders"

# refuses NAME PATTERN — `cllm info $TMP/NAME` exits 2 with one line matching PATTERN that names the file.
refuses() {
    expect_exit "$1: exits 2" 2 $CLLM info "$TMP/$1" || return
    expect_grep "$1: says what it is" "$TMP/err" "$TMP/$1: $2"
    [ "$(wc -l < "$TMP/err")" = 1 ] && ok "$1: one line" || notok "$1: one line" "$(cat "$TMP/err")"
}

printf 'These are my notes about the model.\n' > "$TMP/notes.txt"
refuses notes.txt "not a model file \(not GGUF: no 'GGUF' magic; not safetensors: no JSON header after the 8-byte length\); $READS"
printf 'junk\n' > "$TMP/junk.gguf"
refuses junk.gguf "not a model file .*, though it is named .gguf; $READS"
python3 -c "import random, sys; r = random.Random(7); sys.stdout.buffer.write(bytes(r.choice(b'abcdef0123456789') for _ in range(4096)))" > "$TMP/noise.safetensors"
refuses noise.safetensors "not a model file .*, though it is named .safetensors"
: > "$TMP/empty.gguf"
refuses empty.gguf "an empty file \(0 bytes\), not a model; $READS"
printf 'PK\003\004\024\000\000\000\010\000' > "$TMP/model.pt"
refuses model.pt "a zip archive \(a PyTorch checkpoint\?\).*convert it to safetensors or GGUF"
printf '\200\002\212\012l\374\234F\371 j\250' > "$TMP/pytorch_model.bin"
refuses pytorch_model.bin "a PyTorch checkpoint \(a pickle, protocol 2\): convert it to safetensors or GGUF"
printf '\010\007\022\007pytorch' > "$TMP/model.onnx"
refuses model.onnx "an ONNX model .*convert it to safetensors or GGUF"
mkdir -p "$TMP/weights_only" && cp tests/fixtures/tiny/llama/model.safetensors "$TMP/weights_only/"
refuses weights_only "a folder without config.json, not a Hugging Face model folder; $READS"
# the GGUF magic with a version cllm does not read: the reader names the version
python3 -c "import sys; d = bytearray(open(sys.argv[1], 'rb').read()); d[4] = 7; open(sys.argv[2], 'wb').write(d)" \
    tests/fixtures/tiny/llama.gguf "$TMP/v7.gguf"
refuses v7.gguf "header: GGUF version 7 is not supported \(only 2 and 3\)"
# a safetensors file cut short keeps the reader's own message (its header is there, its length past the end)
head -c 100 tests/fixtures/tiny/llama/model.safetensors > "$TMP/cut.safetensors"
refuses cut.safetensors "header length [0-9]+ exceeds the file"

# the good ones, whatever their names: a GGUF file named .bin, a safetensors folder
cp tests/fixtures/tiny/llama.gguf "$TMP/renamed.bin"
expect_exit "GGUF named .bin: read by its magic" 0 $CLLM info "$TMP/renamed.bin"
expect_exit "safetensors folder" 0 $CLLM info tests/fixtures/tiny/llama
