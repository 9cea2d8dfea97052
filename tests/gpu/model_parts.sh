#!/usr/bin/env bash
# tests/gpu/model_parts.sh — the real models of models.txt to the GPU machine,
# whose calls carry at most 64 MiB each (tracked files included), so the
# run.sh rows that need them (cuda_forward_real, quant_forward_real,
# batched_real_*, cuda_batch_real) can run there:
#   here:  tests/gpu/model_parts.sh split [MB]   the two models run.sh reads (models/cache) -> build/mp0, ...
#          (one part per call: carry build/mp0 with the first call, build/mp1 with the next, ...;
#          a warm machine keeps what earlier calls carried)
#   there: tests/gpu/model_parts.sh join DIR     build/mp* -> DIR/NAME.gguf, each checked by
#          models.txt's sha256; then CLLM_MODELS=DIR tests/gpu/run.sh
# MB: bytes per part in MB (default 50: with ~13 MB of tracked files a call stays under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
names=(smollm2-135m-instruct gemma3-270m)

case "${1:-}" in
split)
    mb=${2:-50}
    for n in "${names[@]}"; do
        [ -f "models/cache/$n.gguf" ] || { echo "model_parts: models/cache/$n.gguf missing (models/fetch.sh $n)" >&2; exit 1; }
    done
    rm -rf build/mp[0-9]*
    tmp=$(mktemp -d)
    for n in "${names[@]}"; do cat "models/cache/$n.gguf"; done | split -b "${mb}000000" -d -a 2 - "$tmp/part"
    i=0
    for f in "$tmp"/part*; do mkdir -p "build/mp$i"; mv "$f" "build/mp$i/part"; i=$((i + 1)); done
    rmdir "$tmp"
    echo "model_parts: $i parts, build/mp0 .. build/mp$((i - 1)) (carry one a call)"
    ;;
join)
    dir=${2:?model_parts: join DIR}
    mkdir -p "$dir"
    all="$dir/.all"
    : > "$all"
    i=0
    while [ -f "build/mp$i/part" ]; do cat "build/mp$i/part" >> "$all"; i=$((i + 1)); done
    off=0
    for n in "${names[@]}"; do
        read -r sha size < <(awk -v n="$n" '$1 == n { print $5, $6 }' models.txt)
        dd if="$all" of="$dir/$n.gguf" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$size" status=none
        off=$((off + size))
        got=$(sha256sum "$dir/$n.gguf" | cut -d' ' -f1)
        [ "$got" = "$sha" ] || { echo "model_parts: $dir/$n.gguf: sha256 $got, models.txt says $sha (a part missing?)" >&2; exit 1; }
    done
    rm -f "$all"
    echo "model_parts: ${names[*]} in $dir ($i parts), sha256 ok"
    ;;
*)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
