#!/usr/bin/env bash
# tests/fuzz/build.sh — builds the libFuzzer targets (fuzz_*.c here) with
# clang, AddressSanitizer and UBSan into build/fuzz/ (see README.md):
#     tests/fuzz/build.sh [TARGET...]     # default: every target
# The engine's sources (every layer but kernels/cuda, not main.c) are
# compiled once into build/fuzz/obj and linked into each target.
set -euo pipefail
cd "$(dirname "$0")/../.."
CC=${CC:-$(command -v clang-14 || command -v clang)}
OUT=build/fuzz
FLAGS="-g -O1 -std=c11 -D_GNU_SOURCE -I. -pthread -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||;s|\.c$||'))
mkdir -p "$OUT/obj"
SRCS=$(ls base/*.c formats/*.c tokenizer/*.c kernels/*.c kernels/cpu/*.c model/*.c engine/*.c parallel/*.c app/*.c)
objs=() stale=()
for src in $SRCS; do
    obj="$OUT/obj/${src//\//_}"; obj="${obj%.c}.o"
    objs+=("$obj")
    # rebuilt when the source or any header is newer (headers: a coarse but safe rule)
    if [ ! -e "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find base formats tokenizer kernels model engine parallel app -name '*.h' -newer "$obj" | head -1)" ]; then
        stale+=("$src" "$obj")
    fi
done
# -fsanitize=fuzzer-no-link: coverage for the engine; libFuzzer's main only in the targets
[ ${#stale[@]} -eq 0 ] || printf '%s\n' "${stale[@]}" | xargs -n 2 -P 2 sh -c "echo cc \$0; $CC $FLAGS -fsanitize=fuzzer-no-link -c \$0 -o \$1"
for t in "${targets[@]}"; do
    echo "link $OUT/fuzz_$t"
    $CC $FLAGS -fsanitize=fuzzer "tests/fuzz/fuzz_$t.c" "${objs[@]}" -o "$OUT/fuzz_$t" -lz -lm
done
