#!/usr/bin/env bash
# bench_power.sh — bench/power.py without a GPU: nvidia-smi's samples (index, SM clock, its maximum,
# board power, the power limit, clock-event reasons) made up here by hand, their medians, maxima and
# power-capped share worked out by hand; torn and [N/A] lines skipped; the sentence BENCH.md prints.
source "$(dirname "$0")/lib.sh"
bash -n bench/lib.sh && ok "bash -n bench/lib.sh" || notok "bash -n bench/lib.sh"
printf '%s\n' "0, 1980, 1980, 130.00, 700.00, 0x0000000000000000" "1, 1980, 1980, 90.00, 700.00, 0x0000000000000000" \
    "0, 1700, 1980, 690.00, 700.00, 0x0000000000000004" "1, 1980, 1980, 95.00, 700.00, 0x0000000000000000" \
    "0, 1650, 1980, 695.00, 700.00, 0x0000000000000004" "0, 1600, 1980, 699.00, 700.00, 0x0000000000000084" \
    "0, 1800, 1980, [N/A], 700.00, 0x0000000000000000" "0, 1750, 19" > "$TMP/p.csv"
why=$(python3 - "$TMP/p.csv" <<'EOF' 2>&1
import sys
sys.path.insert(0, "bench")
import power
s = power.summarize(sys.argv[1])
assert sorted(s) == ["0", "1"], s
g = s["0"]  # 4 good lines: clocks 1980 1700 1650 1600 -> median 1675; power 130 690 695 699 -> median 692.5
assert g["samples"] == 4 and g["sm_mhz_median"] == 1675 and g["sm_mhz_max_clock"] == 1980, g
assert g["power_w_median"] == 692.5 and g["power_w_max"] == 699 and g["power_limit_w"] == 700, g
assert g["power_capped_pct"] == 75.0, g  # 0x4, 0x4 and 0x84 of 4
assert s["1"]["samples"] == 2 and s["1"]["power_capped_pct"] == 0.0 and s["1"]["power_w_median"] == 92.5, s["1"]
assert power.summarize(sys.argv[1] + ".missing") == {}
line = power.sentence({"0": g}, "batched")
want = ("During the batched run (nvidia-smi every 100 ms): GPU 0: SM clock median 1675 MHz of 1980, board power "
        "median 692 W (max 699, limit 700), at the power cap in 75% of 4 samples.")
assert line == want, line
assert power.sentence({}, "batched") == ""
EOF
) && ok "power.py: medians, maxima, the power-capped share, torn and N/A lines skipped, the sentence" ||
    notok "power.py: medians, maxima, the power-capped share, torn and N/A lines skipped, the sentence" "$why"
# bench_power_start where nvidia-smi is not on the PATH: nothing started, nothing written, stop a no-op
mkdir -p "$TMP/nosmi"
for t in bash kill mkdir; do ln -sf "$(command -v $t)" "$TMP/nosmi/$t"; done
out=$(PATH="$TMP/nosmi" bash -c 'source bench/lib.sh; bench_power_start "$1/q.csv"; bench_power_stop; echo "pid=[$BENCH_POWER_PID]"; [ -e "$1/q.csv" ] && echo written' _ "$TMP")
[ "$out" = "pid=[]" ] && ok "bench_power_start without nvidia-smi: nothing started or written" ||
    notok "bench_power_start without nvidia-smi: nothing started or written" "$out"
