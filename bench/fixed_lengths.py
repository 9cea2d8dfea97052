#!/usr/bin/env python3
"""fixed_lengths.py — bench/fixed_lengths.sh's figures: for each input/output
length it ran, the counts of the output file, the wall time, the steps
(--steps-csv) and the roofline of the same steps (bench/roofline.py, with the
limits in OUT/limits.json when they are there). Writes OUT/NAME.json
(bench/results.py) and prints the markdown table; bench/report.py renders the
same table from the JSON (table()).

    python3 bench/fixed_lengths.py OUT MODEL_DIR --shapes "128/128 ..." [--name fixed_lengths] [--args "..."]

Each shape I/O left OUT/fl-I-O.jsonl (cllm generate's output), .csv (its
steps) and .wall (seconds of the whole process).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402
import roofline  # noqa: E402


def one_run(out, model, lin, lout, limits, args=""):
    base = os.path.join(out, f"fl-{lin}-{lout}")
    if not os.path.exists(base + ".jsonl"):
        return {"input": lin, "output": lout, "error": "no output file"}
    rows = [json.loads(x) for x in open(base + ".jsonl") if x.strip()]
    wall = float(open(base + ".wall").read()) if os.path.exists(base + ".wall") else None
    ok = [r for r in rows if not r.get("error")]
    r = {"input": lin, "output": lout, "prompts": len(rows), "failed": len(rows) - len(ok),
         "prompt_tokens": sum(x.get("prompt_tokens", 0) for x in rows),
         "output_tokens": sum(x.get("completion_tokens", 0) for x in rows),
         "inexact": sum(1 for x in ok if x.get("prompt_tokens") != lin or x.get("completion_tokens") != lout),
         "wall_s": wall}
    if os.path.exists(base + ".log"):
        r.update(roofline.generate_limits(open(base + ".log", errors="replace").read()))
    if os.path.exists(base + ".csv"):
        steps = roofline.read_steps(base + ".csv")
        r["steps"] = len(steps)
        r["steps_s"] = sum(s["seconds"] for s in steps)
        if limits and limits.get("copy_tbps") and limits.get("matmul_tflops"):
            shape = roofline.model_shape(model, fp8_layers=roofline.fp8_layers_in_args(args))
            rl = roofline.roofline(steps, shape, limits, kv_elem_bytes=roofline.kv_elem_bytes_in_args(args),
                                   output_tokens=r["output_tokens"], wall_s=wall)
            r["roofline"] = {k: rl[k] for k in ("roofline_s", "roofline_tok_s", "pct_steps", "pct_wall",
                                                 "compute_bound_steps", "kv_bytes_per_token", "weight_bytes")
                             if k in rl}
    return r


def cell(v, fmt):
    return format(v, fmt) if v is not None else "—"


def table(doc):
    """The markdown lines of the section (used by this script and by bench/report.py)."""
    out = ["| input / output tokens | prompts | output tok/s, whole process | output tok/s over the steps | "
           "roofline output tok/s | % of roofline, steps | % of roofline, whole process | steps, share of wall | "
           "wall s | sequences a step (preemptions) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc.get("runs", []):
        shape = f"{r['input']} / {r['output']}"
        if r.get("error"):
            out.append(f"| {shape} | failed: {r['error']} | | | | | | | | |")
            continue
        wall, steps, n = r.get("wall_s"), r.get("steps_s"), r["output_tokens"]
        rl = r.get("roofline") or {}
        failed = f" ({r['failed']} failed)" if r.get("failed") else ""
        inexact = f" ({r['inexact']} not exactly {shape})" if r.get("inexact") else ""
        out.append(f"| {shape} | {r['prompts']}{failed}{inexact} | {cell(n / wall if wall else None, ',.0f')} | "
                   f"{cell(n / steps if steps else None, ',.0f')} | {cell(rl.get('roofline_tok_s'), ',.0f')} | "
                   f"{cell(rl.get('pct_steps'), '.1f')}{'%' if rl.get('pct_steps') is not None else ''} | "
                   f"{cell(rl.get('pct_wall'), '.1f')}{'%' if rl.get('pct_wall') is not None else ''} | "
                   f"{cell(100 * steps / wall if steps and wall else None, '.1f')}"
                   f"{'%' if steps and wall else ''} | {cell(wall, '.1f')} | {cell(r.get('max_seqs'), 'd')}"
                   f"{' (' + str(r['preempted']) + ')' if r.get('max_seqs') is not None else ''} |")
    return out


def about(doc):
    args = f", `{doc['args']}`" if doc.get("args") else ""
    return (f"{doc.get('model', '?')}: random token-id prompts of exactly the input length (bench/random_prompts.py "
            f"--ids), exactly the output length generated (--ignore-eos -n), greedy{args}; the default scheduler "
            "limits unless given (the sequences a step took, and the preemptions, in the last column). Whole "
            "process: wall time of `cllm generate` (load included); over the steps: the sum of its steps "
            "(--steps-csv). Roofline: each step's max(FLOPs / matmul rate, (weight bytes + KV bytes read) "
            "/ copy rate), summed over the steps (bench/roofline.py); the % columns are the roofline's time over the "
            "steps' and over the whole process's.")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("model")
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--name", default="fixed_lengths")
    ap.add_argument("--args", default="")
    a = ap.parse_args(argv)
    limits = results.load(os.path.join(a.out, "limits.json"))
    runs = []
    for s in a.shapes.split():
        lin, lout = (int(x) for x in s.split("/"))
        runs.append(one_run(a.out, a.model, lin, lout, limits, a.args))
    doc = results.write_section(a.out, a.name, {"model": os.path.basename(a.model.rstrip("/")), "args": a.args,
                                                "runs": runs})
    print(f"## Fixed lengths ({doc['model']})\n\n{about(doc)}\n")
    print("\n".join(table(doc)))
    if not (limits and limits.get("copy_tbps")):
        print("\n(no limits.json in the results folder: no roofline)")
    bad = [r for r in runs if r.get("error") or r.get("failed") or r.get("inexact")]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
