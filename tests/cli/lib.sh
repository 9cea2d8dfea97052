# lib.sh — helpers for the command-line checks (sourced by tests/cli/*.sh).
# Each check prints "ok - name" or "not ok - name" plus the evidence.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CLLM=${CLLM:-./cllm}
MODELS=${CLLM_MODELS:-models/cache}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

ok() { echo "ok - $1"; }
notok() { echo "not ok - $1"; shift; for l in "$@"; do echo "  $l"; done; }

# expect_exit NAME CODE CMD... — runs CMD, checks its exit code; output in $TMP/out, $TMP/err.
expect_exit() {
    local name=$1 code=$2; shift 2
    "$@" > "$TMP/out" 2> "$TMP/err"; local rc=$?
    if [ "$rc" = "$code" ]; then ok "$name"; return 0; fi
    notok "$name" "exit $rc, expected $code: $*" "stderr: $(head -c 400 "$TMP/err")"; return 1
}

# expect_grep NAME FILE PATTERN — FILE must contain PATTERN (grep -E).
expect_grep() {
    if grep -qE -- "$3" "$2"; then ok "$1"; else notok "$1" "no /$3/ in $(basename "$2"): $(head -c 400 "$2")"; fi
}
