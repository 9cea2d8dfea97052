#!/usr/bin/env bash
# tests/layers.sh — the include rule of docs/DESIGN.md, checked on every
# source file: a folder includes only folders of lower layers (and itself),
# and the folder graph has no cycle. Prints one "ok - " / "not ok - " line per
# rule and the offending includes.
set -uo pipefail
cd "$(dirname "$0")/.."

# layer of a folder (a file's folder; kernels/cpu and kernels/cuda sit in
# kernels' layer but may not include each other)
rank() {
    case $1 in
        base) echo 0 ;; formats) echo 1 ;; tokenizer|kernels|kernels/cpu|kernels/cuda) echo 2 ;;
        model) echo 3 ;; engine|parallel) echo 4 ;; app) echo 5 ;; .) echo 6 ;; *) echo -1 ;;
    esac
}

bad=0; edges=""
for f in $(git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v '^tests/\|^bench/'); do
    from=$(dirname "$f"); rf=$(rank "$from")
    if [ "$rf" -lt 0 ]; then echo "  $f: folder '$from' has no layer"; bad=$((bad + 1)); continue; fi
    for inc in $(grep -o '^#include "[^"]*"' "$f" | sed 's/#include "//;s/"$//'); do
        to=$(dirname "$inc"); [ "$to" = "$from" ] && continue
        rt=$(rank "$to")
        ok=0
        if [ "$rt" -ge 0 ] && [ "$rt" -lt "$rf" ]; then ok=1; fi
        # kernels' own subfolders: cpu/ and cuda/ use kernels/*.h; the backend factory (kernels/*.c) uses both
        case "$from>$to" in kernels/cpu\>kernels|kernels/cuda\>kernels|kernels\>kernels/cpu|kernels\>kernels/cuda) ok=1 ;; esac
        if [ $ok = 0 ]; then echo "  $f includes $inc (layer $rf -> $rt)"; bad=$((bad + 1)); fi
        edges+="${from%%/*} ${to%%/*}"$'\n' # kernels/cpu and kernels/cuda are kernels' layer: one node
    done
done
[ $bad = 0 ] && echo "ok - every include points down the layers" || echo "not ok - $bad includes point up or sideways"

# only kernels/ knows whether the build has CUDA (kernels/backend.c is the factory)
cuda_ifs=$(git ls-files '*.c' '*.h' | grep -v '^kernels/\|^tests/\|^bench/' | xargs grep -l 'CLLM_CUDA' 2>/dev/null)
if [ -z "$cuda_ifs" ]; then echo "ok - no CLLM_CUDA outside kernels/"
else echo "not ok - CLLM_CUDA outside kernels/:"; echo "$cuda_ifs" | sed 's/^/  /'; fi

# the folder graph is acyclic: tsort reports a loop otherwise (a folder's includes of itself are left out)
if printf '%s' "$edges" | sort -u | awk '$1 != $2' | grep -v '^$' | tsort > /dev/null 2> /tmp/cllm-tsort.$$; then
    echo "ok - the folders' include graph has no cycle"
else
    echo "not ok - the folders' include graph has a cycle"; sed 's/^/  /' /tmp/cllm-tsort.$$
fi
rm -f /tmp/cllm-tsort.$$
