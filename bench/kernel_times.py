#!/usr/bin/env python3
"""bench/kernel_times.py — where a run's GPU time goes, from Nsight Compute's
CSV of one metric per kernel launch:
    ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM > F.csv
    bench/kernel_times.py F.csv [--top N]
Groups launches by kernel (template arguments dropped) and grid size, and
prints count, mean and total microseconds, largest total first."""
import csv
import io
import re
import sys
from collections import defaultdict


def rows(path):
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV header (\"ID\",...) found")
    return csv.DictReader(io.StringIO(text[start:]))


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    groups = defaultdict(list)
    for r in rows(path):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
        name = re.sub(r"<.*", "", r["Kernel Name"])[:48]
        args = re.search(r"<(.*)>", r["Kernel Name"])
        key = (name, (args.group(1)[:20] if args else ""), r.get("Grid Size", ""))
        groups[key].append(us)
    total = sum(sum(v) for v in groups.values())
    print(f"{'kernel':48} {'tmpl':20} {'grid':>16} {'n':>5} {'mean us':>9} {'total us':>10} {'%':>5}")
    for key, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"{key[0]:48} {key[1]:20} {key[2]:>16} {len(v):5d} {sum(v) / len(v):9.2f} {sum(v):10.1f} "
              f"{100 * sum(v) / total:5.1f}")
    print(f"total {total:.1f} us over {sum(len(v) for v in groups.values())} launches")


if __name__ == "__main__":
    main()
