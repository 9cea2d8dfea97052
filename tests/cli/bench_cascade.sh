#!/usr/bin/env bash
# bench_cascade.sh — bench/cascade.sh on the tiny model (CPU, fp32): both runs' results, the table with the
# whole-process and over-the-steps rates, cascade.json's ratios worked out again from its own fields, no output
# differing at fp32; a run whose log lacks -v's "steps took" line exits 1 naming the log.
source "$(dirname "$0")/lib.sh"
export CASCADE_PROMPTS=16 CASCADE_PREFIX=320 CASCADE_SUFFIX=8-32 CASCADE_OUT=16 CASCADE_ARGS="--cpu -t 2 -c 512"
expect_exit "bench/cascade.sh on the tiny model" 0 env CLLM="$CLLM" OUT="$TMP/c" bench/cascade.sh tests/fixtures/tiny/llama
expect_grep "the table: both runs, wall and steps columns" "$TMP/out" "^\| on \| [0-9.]+ \| 256 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$"
expect_grep "the ratio line: whole process and steps, outputs equal at fp32" "$TMP/out" \
    "x over the whole process, [0-9.]+x over the steps \(goal >= 1.5x\); outputs that differ: 0 of 16"
why=$(python3 - "$TMP/c/cascade.json" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
on, off = d["runs"]["on"], d["runs"]["off"]
for r in (on, off):
    assert r["output_tokens"] == 256 and 0 < r["steps_s"] <= r["wall_s"], r
    assert abs(r["steps_tok_s"] - 256 / r["steps_s"]) < 1e-6 * r["steps_tok_s"], r
assert abs(d["steps_ratio"] - on["steps_tok_s"] / off["steps_tok_s"]) < 1e-9, d
assert abs(d["ratio"] - on["output_tok_s"] / off["output_tok_s"]) < 1e-9, d
assert d["outputs_differ"] == 0, d
PY
) && ok "cascade.json: the ratios from its own fields" || notok "cascade.json: the ratios from its own fields" "$why"
# a cllm whose -v lines are gone: the script must refuse to make up the steps figure
cat > "$TMP/quiet.sh" <<SH
#!/usr/bin/env bash
"$PWD/$CLLM" "\$@" 2> >(grep -v '^steps took' >&2)
SH
chmod +x "$TMP/quiet.sh"
[ "${CLLM#/}" != "$CLLM" ] && sed -i "s|\"$PWD/$CLLM\"|\"$CLLM\"|" "$TMP/quiet.sh"
expect_exit "a log without 'steps took' exits 1" 1 env CLLM="$TMP/quiet.sh" OUT="$TMP/q" bench/cascade.sh tests/fixtures/tiny/llama
expect_grep "... naming the log" "$TMP/err" "no 'steps took' line in .*/cascade-on.log"
