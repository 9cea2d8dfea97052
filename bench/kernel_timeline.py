#!/usr/bin/env python3
"""bench/kernel_timeline.py — where the time of one graphed step goes, from the
kernel timeline bench/kernel_timeline.c wrote:
    bench/kernel_timeline.py T.tsv [--steps N] [--graph G] [--list]
    bench/kernel_timeline.py T.tsv --all      (every kernel, graphed or not:
        count, busy time and its share by name, e.g. a prefill run)
Takes the last N replays (default 8) of a graph (default: the one replayed
most), and for each kernel of a step prints, averaged over the replays:
  run   end - start as CUPTI saw it (a kernel launched early by PDL starts
        while its predecessor runs, so this includes its wait);
  own   end - max(start, the previous kernel's end): the step time this kernel
        adds beyond its predecessor. The owns of a step sum to its wall time
        (the kernels of one stream end in order).
Then the same grouped by kernel name (template arguments dropped)."""
import re
import sys
from collections import defaultdict


def load(path):
    out = []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if len(f) < 8:
            continue
        out.append(dict(start=int(f[0]), end=int(f[1]), graph=int(f[2]), node=int(f[3]),
                        stream=int(f[4]), grid=f[5], block=int(f[6]), name=f[7]))
    return sorted(out, key=lambda k: k["start"])


def short_name(mangled):
    # _Z<len><name>... -> name; template arguments (I...E) dropped.
    m = re.match(r"_Z(\d+)", mangled)
    if not m:
        return mangled[:40]
    n = int(m.group(1))
    return mangled[len(m.group(0)):len(m.group(0)) + n]


def replays(kernels, graph):
    """Splits a graph's kernels into replays: a replay ends where a node repeats."""
    steps, cur, seen = [], [], set()
    for k in kernels:
        if k["graph"] != graph:
            continue
        if k["node"] in seen:
            steps.append(cur)
            cur, seen = [], set()
        cur.append(k)
        seen.add(k["node"])
    if cur:
        steps.append(cur)
    return steps


def summarize_all(kernels):
    """Every kernel by name: launches, summed durations (overlaps counted twice), share."""
    groups = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        g = groups[short_name(k["name"])]
        g[0] += 1
        g[1] += (k["end"] - k["start"]) / 1e3
    total = sum(g[1] for g in groups.values())
    span = (max(k["end"] for k in kernels) - min(k["start"] for k in kernels)) / 1e3
    print(f"{len(kernels)} kernels, {total:.1f} us of kernel time over a {span:.1f} us span")
    print(f"{'kernel':44} {'n':>6} {'us':>10} {'us/n':>8} {'%':>5}")
    for name, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:44} {n:6d} {us:10.1f} {us / n:8.2f} {100 * us / total:5.1f}")


def main():
    args = sys.argv[1:]
    path = args[0]
    n_steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 8
    kernels = load(path)
    if not kernels:
        sys.exit(f"{path}: no kernels")
    if "--all" in args:
        return summarize_all(kernels)
    graphs = defaultdict(int)
    for k in kernels:
        if k["graph"]:
            graphs[k["graph"]] += 1
    if not graphs:
        sys.exit(f"{path}: no kernel ran inside a graph")
    graph = int(args[args.index("--graph") + 1]) if "--graph" in args else max(graphs, key=graphs.get)
    steps = replays(kernels, graph)[-n_steps:]
    shape = len(steps[-1])
    steps = [s for s in steps if len(s) == shape]
    per_pos = [defaultdict(float) for _ in range(shape)]
    for s in steps:
        prev_end = s[0]["start"]
        for i, k in enumerate(s):
            per_pos[i]["run"] += (k["end"] - k["start"]) / 1e3 / len(steps)
            per_pos[i]["own"] += (k["end"] - max(k["start"], prev_end)) / 1e3 / len(steps)
            prev_end = max(prev_end, k["end"])
    wall = sum((s[-1]["end"] - s[0]["start"]) / 1e3 for s in steps) / len(steps)
    print(f"graph {graph}: {len(steps)} replays of {shape} kernels, step wall {wall:.1f} us")
    if "--list" in args:
        print(f"{'#':>4} {'kernel':44} {'grid':>12} {'block':>5} {'run us':>8} {'own us':>8}")
        for i, k in enumerate(steps[-1]):
            print(f"{i:4d} {short_name(k['name']):44} {k['grid']:>12} {k['block']:5d} "
                  f"{per_pos[i]['run']:8.2f} {per_pos[i]['own']:8.2f}")
    groups = defaultdict(lambda: [0, 0.0, 0.0])
    for i, k in enumerate(steps[-1]):
        g = groups[(short_name(k["name"]), k["grid"])]
        g[0] += 1
        g[1] += per_pos[i]["run"]
        g[2] += per_pos[i]["own"]
    print(f"{'kernel':44} {'grid':>12} {'n':>4} {'run us':>9} {'own us':>9} {'own/n':>7} {'%':>5}")
    for (name, grid), (n, run, own) in sorted(groups.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:44} {grid:>12} {n:4d} {run:9.1f} {own:9.1f} {own / n:7.2f} {100 * own / wall:5.1f}")


if __name__ == "__main__":
    main()
