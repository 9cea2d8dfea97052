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

# expect_logprobs_close NAME A B TOL — the 6 replies of A and B (generate results asking "logprobs"): texts
# equal, every token logprob and top logprob within TOL (runs whose sums associate otherwise, e.g. --tp).
expect_logprobs_close() {
    local why
    if why=$(python3 - "$2" "$3" "$4" <<'PY' 2>&1
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
tol = float(sys.argv[3])
assert len(a) == len(b) == 6, f"{len(a)} and {len(b)} replies"
worst = 0.0
for x, y in zip(a, b):
    assert x["text"] == y["text"], f"{x['id']}: {x['text']!r} vs {y['text']!r}"
    lx, ly = x["logprobs"], y["logprobs"]
    worst = max([worst] + [abs(p - q) for p, q in zip(lx["token_logprobs"], ly["token_logprobs"])])
    for tx, ty in zip(lx["top_logprobs"], ly["top_logprobs"]):
        assert tx.keys() == ty.keys(), f"{x['id']}: top tokens {list(tx)} vs {list(ty)}"
        worst = max([worst] + [abs(tx[k] - ty[k]) for k in tx])
assert worst <= tol, f"worst logprob difference {worst:.3g}"
PY
    ); then ok "$1"; else notok "$1" "$why"; fi
}
