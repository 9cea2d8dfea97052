#!/usr/bin/env python3
"""power.py — what the GPUs' clocks and board power did during a run, from the samples bench/lib.sh's
bench_power_start writes (nvidia-smi every 100 ms: index, clocks.sm, clocks.max.sm, power.draw, power.limit,
clocks_throttle_reasons.active; csv, no header, no units). The limits a bench sets its figures against are
measured on a cool GPU for a few seconds; a long batched run can sit at the board's power limit, where the
driver lowers the SM clock (reason bit 0x4, the software power cap; 0x80, the hardware power brake).

    python3 bench/power.py SAMPLES.csv      prints the summary as JSON (stdlib only)
"""
import json
import statistics
import sys

POWER_CAP_BITS = 0x4 | 0x80


def summarize(path):
    """{gpu index (str): {samples, sm_mhz_median, sm_mhz_max_clock, power_w_median, power_w_max,
    power_limit_w, power_capped_pct}} over the file's well-formed lines; {} when it has none."""
    per = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return {}
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        if len(f) != 6:
            continue
        try:
            idx, sm, sm_max, watts, limit = f[0], float(f[1]), float(f[2]), float(f[3]), float(f[4])
            reasons = int(f[5], 16)
        except ValueError:  # a torn last line, or [N/A] where the board does not report a field
            continue
        per.setdefault(idx, []).append((sm, sm_max, watts, limit, reasons))
    out = {}
    for idx, s in sorted(per.items()):
        out[idx] = {"samples": len(s),
                    "sm_mhz_median": statistics.median(x[0] for x in s),
                    "sm_mhz_max_clock": max(x[1] for x in s),
                    "power_w_median": statistics.median(x[2] for x in s),
                    "power_w_max": max(x[2] for x in s),
                    "power_limit_w": statistics.median(x[3] for x in s),
                    "power_capped_pct": 100.0 * sum(1 for x in s if x[4] & POWER_CAP_BITS) / len(s)}
    return out


def sentence(summary, label):
    """One line for BENCH.md: each sampled GPU's median SM clock against its maximum, its power against the
    board's limit, and the share of samples the driver held it at the power cap; "" without samples."""
    parts = []
    for idx, g in summary.items():
        parts.append(f"GPU {idx}: SM clock median {g['sm_mhz_median']:.0f} MHz of {g['sm_mhz_max_clock']:.0f}, "
                     f"board power median {g['power_w_median']:.0f} W (max {g['power_w_max']:.0f}, limit "
                     f"{g['power_limit_w']:.0f}), at the power cap in {g['power_capped_pct']:.0f}% of "
                     f"{g['samples']} samples")
    if not parts:
        return ""
    return f"During the {label} run (nvidia-smi every 100 ms): " + "; ".join(parts) + "."


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(summarize(sys.argv[1]), indent=1))
