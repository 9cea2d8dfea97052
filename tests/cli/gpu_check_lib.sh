#!/usr/bin/env bash
# gpu_check_lib.sh — the GPU suite's harness (tests/gpu/lib.sh) without a GPU:
# rows go to $OUT/summary.txt as they are made (what a run killed by a call's
# time limit leaves), CHECKS_ONLY leaves rows out, CHECKS_BUDGET_S stops
# starting checks once spent or when a check's usual time (CHECK_SECONDS)
# would end past it, and a check's row counts its ok / not ok lines.
source "$(dirname "$0")/lib.sh"

OUT=$TMP/gpu
mkdir -p "$OUT"
echo "stale row" > "$OUT/summary.txt"
(
    source tests/gpu/lib.sh
    run_check passing sh -c 'echo "ok - one"; echo "ok - two"'
    run_check failing sh -c 'echo "ok - one"; echo "not ok - two"; exit 3'
    CHECKS_ONLY="passing" run_check filtered sh -c 'echo "ok - never"'
    add_row "custom row"
    CHECKS_BUDGET_S=0 run_check late touch "$OUT/late-ran"
    CHECK_SECONDS[slow]=50
    CHECKS_BUDGET_S=30 run_check slow touch "$OUT/slow-ran"
    CHECKS_BUDGET_S=30 run_check unlisted sh -c 'echo "ok - ran"'
    print_rows
) > "$TMP/run.txt" 2>&1
S=$OUT/summary.txt
if grep -q "stale row" "$S"; then notok "summary starts empty" "$(cat "$S")"; else ok "summary starts empty"; fi
expect_grep "a passing check's row: rc 0, 2 ok" "$S" '^passing +rc=0 +2 ok +0 not-ok'
expect_grep "a failing check's row: rc 3, 1 ok, 1 not ok" "$S" '^failing +rc=3 +1 ok +1 not-ok'
expect_grep "a row left out by CHECKS_ONLY says so" "$S" '^filtered +not run: left out'
expect_grep "add_row reaches the summary" "$S" '^custom row$'
expect_grep "a check past CHECKS_BUDGET_S is not run" "$S" '^late +not run: CHECKS_BUDGET_S \(0 s\) spent'
if [ -e "$OUT/late-ran" ]; then notok "the late check's command never ran"; else ok "the late check's command never ran"; fi
expect_grep "a check whose usual time ends past the budget is not run" "$S" \
    '^slow +not run: takes ~50 s, (29|30) s of CHECKS_BUDGET_S left'
if [ -e "$OUT/slow-ran" ]; then notok "the slow check's command never ran"; else ok "the slow check's command never ran"; fi
expect_grep "an unlisted check runs while the budget lasts" "$S" '^unlisted +rc=0 +1 ok'
if [ "$(wc -l < "$S")" -eq 7 ]; then ok "one summary line a row"; else notok "one summary line a row" "$(cat "$S")"; fi
expect_grep "the printed table has every row" "$TMP/run.txt" '== summary'
if [ "$(sed -n '/== summary/,$p' "$TMP/run.txt" | tail -n +2 | diff - "$S")" = "" ]; then
    ok "the printed table equals the summary file"
else
    notok "the printed table equals the summary file" "$(cat "$TMP/run.txt")"
fi
expect_grep "the passing check's log is kept" "$OUT/passing.log" '^ok - two$'
