#!/usr/bin/env python3
"""report.py — BENCH.md from the JSON files of one bench/run.sh run.

    python3 bench/report.py --out BENCH.md --gpu "NVIDIA H200" --driver 580.159.03 \
        --commit abc1234 --model llama3-8b cllm-llama3-8b.json hf-llama3-8b.json [--attention attention.md]

Each figure is set against its physical limit (from cllm's own FLOP and byte
counts, in its JSON) and, as a ratio, against transformers measured in the
same run on the same model folder.
"""
import argparse
import datetime
import json
import os

TITLES = {
    "llama3-8b": "Llama-3-8B shape (dim 4096, 32 layers, 32/8 heads, FFN 14336, vocab 128256), random bf16 weights",
    "gemma2-9b": "Gemma-2-9B shape (dim 3584, 42 layers, 16/8 heads of 256, FFN 14336, vocab 256000, "
                 "window 4096 on every other layer, soft-caps 50/30), random bf16 weights",
}

# /work/shared/ANCHORS.md: a widely used GGUF engine, F16, flash attention, batch 1, on the H200.
GGUF_ENGINE = {"llama3-8b": {"prefill": {512: 19534, 4096: 18359}, "decode": 164}}


def fmt(v, digits=0):
    return f"{v:,.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


def model_section(name, c, h):
    tiny = "tiny" in os.path.basename(c["path"].rstrip("/"))
    title = TITLES.get(name, name) + (" — TINY smoke-test size, not the real shape" if tiny else "")
    lines = [f"## {name}", "", title, "",
             f"{c['params'] / 1e9:.3f} B parameters, {c['weight_bytes'] / 1e9:.2f} GB of weights; "
             f"cllm backend `{c['backend']}`; reference: {h['impl'] if h else 'not run'}.", "",
             "| measure | cllm | % of limit | transformers | cllm ÷ transformers |",
             "| --- | --- | --- | --- | --- |"]
    up = f", GPU upload {c['upload_gbps']:.1f} GB/s" if c.get("upload_gbps") else ""
    hf_load = f"{h['load_s']:.1f} s | {ratio(h['load_s'], c['load_s'])} (speed)" if h else "— | —"
    lines.append(f"| load (file → ready) | {c['load_s']:.1f} s ({c['load_gbps']:.2f} GB/s{up}) | — | {hf_load} |")
    href = {p["tokens"]: p for p in h["prefill"]} if h else {}
    for p in c["prefill"]:
        r = href.get(p["tokens"])
        pct = f"{p['pct_peak']:.1f}% of {c['peak_tflops']:.0f} TFLOP/s" if p["pct_peak"] is not None else "—"
        hf = (f"{fmt(r['tok_s'])} tok/s, {p['flops'] / r['seconds'] / 1e12:.1f} TFLOP/s" if r else "—")
        lines.append(f"| prefill {p['tokens']} tokens | {fmt(p['tok_s'])} tok/s, {p['tflops']:.1f} TFLOP/s | {pct} | "
                     f"{hf} | {ratio(p['tok_s'], r['tok_s'] if r else 0)} |")
    dref = {(d["ctx"], d["batch"]): d for d in h["decode"]} if h else {}
    for d in c["decode"]:
        r = dref.get((d["ctx"], d["batch"]))
        if r and r.get("generate_tok_s", 0) > r["tok_s"]:  # the faster of the two ways transformers decodes
            r = dict(r, tok_s=r["generate_tok_s"], step_s=r["generate_step_s"])
        pct = f"{d['pct_peak']:.1f}% of {c['peak_tbps']:.2f} TB/s" if d["pct_peak"] is not None else "—"
        hf = (f"{fmt(r['tok_s'], 1)} tok/s, {d['bytes'] / r['step_s'] / 1e9:,.0f} GB/s" if r else "—")
        lines.append(f"| decode batch {d['batch']} at {d['ctx']} context | {fmt(d['tok_s'], 1)} tok/s "
                     f"({d['step_s'] * 1e3:.2f} ms/step), {d['gbps']:,.0f} GB/s | {pct} | {hf} | "
                     f"{ratio(d['tok_s'], r['tok_s'] if r else 0)} |")
    g = None if tiny else GGUF_ENGINE.get(name)
    if g:
        pre = ", ".join(f"prefill {t}: {fmt(v)} tok/s" for t, v in g["prefill"].items())
        lines += ["", f"Not from this run — ANCHORS.md's GGUF engine on the H200, F16, same shape: {pre}; "
                      f"decode {g['decode']} tok/s."]
    return lines + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="unknown")
    ap.add_argument("--driver", default="unknown")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--model", nargs=3, action="append", default=[], metavar=("NAME", "CLLM_JSON", "HF_JSON"))
    ap.add_argument("--attention", help="markdown that bench/attention.sh printed")
    ap.add_argument("--note", default="", help="a line to print under the header")
    a = ap.parse_args()

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# cllm benchmarks", "",
           f"Run {now} on {a.gpu} (driver {a.driver}), cllm commit `{a.commit}`, by `bench/run.sh`.", ""]
    if a.note:
        out += [a.note, ""]
    out += ["Limits (ANCHORS.md, measured on the H200): 790 TFLOP/s bf16 through the tensor cores, "
            "4.26 TB/s memory copy. Prefill FLOPs = 2 × layer weights × T + attention (QK^T and PV over the "
            "causal pairs, windows respected) + the LM head for the one row that gets logits; the transformers "
            "column uses the same count. Decode bytes per step = every weight the step reads (LM head yes, "
            "untied embedding table no) + the context's K/V counted as bf16. Times: median of whole forward "
            "steps (prefill: --reps runs after a warm-up; decode: --decode-tokens steps after a warm-up step), "
            "random token ids, batch 1, one sequence. transformers decode: the faster of a timed forward loop "
            "with the KV cache and generate().", ""]
    for name, cj, hj in a.model:
        c = json.load(open(cj))
        h = json.load(open(hj)) if hj != "-" and os.path.exists(hj) else None
        out += model_section(name, c, h)
    if a.attention and os.path.exists(a.attention) and os.path.getsize(a.attention) > 0:
        out += ["## Attention kernels (bench/attention.sh)", "", open(a.attention).read().rstrip(), ""]
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
