# tests/gpu/lib.sh — what the GPU check scripts share (sourced by run.sh and
# pipeline.sh, $OUT set first): run_check NAME CMD... runs CMD with its output
# in $OUT/NAME.log, prints the log's notable lines and adds a row to the table
# that print_rows prints last. Each row also goes to $OUT/summary.txt as it is
# made, so a run killed by a time limit still leaves the rows it finished.
declare -a rows
: > "$OUT/summary.txt"
CHECKS_T0=$(date +%s)

# add_row TEXT: a row of the table (and of $OUT/summary.txt, at once).
add_row() {
    rows+=("$1")
    printf '%s\n' "$1" >> "$OUT/summary.txt"
}

# CHECKS_ONLY / CHECKS_SKIP (space-separated names): run only those rows / all but those,
# so the suite can be split over calls of a time-limited GPU machine; a row left out says so.
# CHECKS_BUDGET_S: seconds from the start after which no further check starts (its row says
# so), nor one whose usual time (CHECK_SECONDS) would end past it; set it to the call's limit
# minus a margin and the table still prints.
# check_wanted NAME...: true when any of these rows runs (so a row's costly set-up can be skipped with it).
check_wanted() {
    local name
    for name in "$@"; do
        { [ -z "${CHECKS_ONLY:-}" ] || [[ " $CHECKS_ONLY " == *" $name "* ]]; } &&
            [[ " ${CHECKS_SKIP:-} " != *" $name "* ]] && return 0
    done
    return 1
}

# A check's usual seconds on one H200 (tests/gpu/run.sh rows measured there, sanitizer runs
# included): with CHECKS_BUDGET_S a check is not started when it would end past the budget, so
# a time-limited call does not spend its last minutes on a check it cannot finish. A row not
# listed counts 0 (started whenever the budget is not yet spent).
declare -A CHECK_SECONDS=(
    [cuda_ops]=10 [cuda_forward]=5 [attention]=60 [attention_rows]=75 [attn_cascade]=28 [attention_fa2]=15
    [quant]=80 [quant_gemm]=160 [fp8_matmul]=25 [norm_fold]=15 [sanitizer_cuda_forward]=10 [cuda_batch]=8
    [async_steps]=18 [fp8_forward]=19 [tensor_parallel_tp2_one_gpu]=25 [quant_forward_tiny]=15
)

run_check() { # name, command...
    local name=$1; shift
    if ! check_wanted "$name"; then
        add_row "$(printf '%-28s not run: left out (CHECKS_ONLY / CHECKS_SKIP)' "$name")"
        return 0
    fi
    if [ -n "${CHECKS_BUDGET_S:-}" ]; then
        local spent=$(( $(date +%s) - CHECKS_T0 )) usual=${CHECK_SECONDS[$name]:-0}
        if (( spent >= CHECKS_BUDGET_S )); then
            add_row "$(printf '%-28s not run: CHECKS_BUDGET_S (%s s) spent' "$name" "$CHECKS_BUDGET_S")"
            return 0
        fi
        if (( spent + usual > CHECKS_BUDGET_S )); then
            add_row "$(printf '%-28s not run: takes ~%s s, %s s of CHECKS_BUDGET_S left' "$name" "$usual" \
                "$(( CHECKS_BUDGET_S - spent ))")"
            return 0
        fi
    fi
    local log="$OUT/$name.log" t0=$(date +%s%N)
    "$@" > "$log" 2>&1; local rc=$?
    local secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    local p=$(grep -c '^ok - ' "$log") f=$(grep -c '^not ok - ' "$log")
    grep -E '^#|^not ok|CHECK|ERROR|error|identical' "$log" | head -60
    add_row "$(printf '%-28s rc=%-3s %3s ok %3s not-ok %7sms' "$name" "$rc" "$p" "$f" "$secs")"
}

print_rows() {
    echo
    echo "== summary"
    for r in "${rows[@]}"; do echo "$r"; done
}
