#!/usr/bin/env python3
"""report.py — BENCH.md, whole, from the results folder(s) of bench/run.sh,
and one row per figure appended to the history CSV (stdlib only).

    python3 bench/report.py OUT [OUT2 ...] --out BENCH.md [--history bench/history.csv | --no-history]

Each folder holds the sections' JSON (single.json, quant.json, kv_fp8.json,
attention.json, throughput.json, fixed_lengths.json, pipeline.json, tensor_parallel.json;
bench/results.py says what they carry) and run.json (why a section has none). With several folders
(sections run in separate calls), a section's results come from the last
folder that has them. Every table gets a device line (GPU as nvidia-smi
reports it, driver, count, commit, date) and the limits measured in that run
(bench/limits.py); every "% of limit" is computed here from those. A section
without results renders as one "not run in this generation (reason)" line.
History rows are keyed by (date, commit, device, section, model, measure):
rendering the same results again adds nothing.
"""
import argparse
import csv
import json
import os
import sys

import fixed_lengths  # bench/, the script's own folder, is on the path
import power
import roofline
from results import load

HERE = os.path.dirname(os.path.abspath(__file__))

SECTIONS = [
    ("single", "Single GPU", "bench/single.sh: `cllm bench` against transformers"),
    ("quant", "Quantized weights", "bench/quant.sh: GGUF blocks on the GPU against the bf16 path"),
    ("kv_fp8", "FP8 KV cache", "bench/kv_fp8.sh: `--kv-dtype fp8` against the bf16 cache"),
    ("attention", "Attention kernels", "bench/attention.sh: cllm's kernels against PyTorch SDPA"),
    ("throughput", "Offline throughput", "bench/throughput.sh: 1000 prompts through `cllm generate`"),
    ("fixed_lengths", "Fixed lengths", "bench/fixed_lengths.sh: input/output lengths of the published tables "
     "through `cllm generate`"),
    ("pipeline", "Pipeline stages", "bench/pipeline.sh: `--pp 2` (and `--pp 4`) against one GPU"),
    ("tensor_parallel", "Tensor parallelism", "bench/tp.sh: `--tp N` against one GPU"),
]

TITLES = {
    "llama3-8b": "Llama-3-8B shape (dim 4096, 32 layers, 32/8 heads, FFN 14336, vocab 128256), random bf16 weights",
    "gemma2-9b": "Gemma-2-9B shape (dim 3584, 42 layers, 16/8 heads of 256, FFN 14336, vocab 256000, "
                 "window 4096 on every other layer, soft-caps 50/30), random bf16 weights",
    "llama3-70b": "Llama-3-70B shape (dim 8192, 80 layers, 64/8 heads, FFN 28672, vocab 128256), "
                  "random bf16 weights made in memory (--dummy-weights)",
}

HISTORY_FIELDS = ["date", "commit", "device", "section", "model", "measure", "value", "unit", "pct_of_limit"]


# ---------- numbers ----------

def num(v, digits=0):
    return f"{v:,.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


def pct_text(p):
    return f"{p:.1f}%" if p is not None else "—"


class Limits:
    def __init__(self, doc):
        lim = doc.get("limits") or {}
        self.tbps = lim.get("copy_tbps")
        self.tflops = lim.get("matmul_tflops")
        self.fp8_tflops = lim.get("fp8_matmul_tflops")
        self.source = lim.get("source")

    # gpus: the limit of that many GPUs together (tensor-parallel ranks each run a share of every step)
    def flops_pct(self, tflops, gpus=1):
        return 100.0 * tflops / (gpus * self.tflops) if tflops and self.tflops else None

    def bw_pct(self, gbps, gpus=1):
        return 100.0 * gbps / (gpus * self.tbps * 1e3) if gbps and self.tbps else None

    def line(self):
        if not (self.tbps and self.tflops):
            return "limits: not measured (no % of limit)"
        return (f"limits: copy {self.tbps:.2f} TB/s, bf16 matmul {self.tflops:.0f} TFLOP/s"
                + (f", fp8 matmul {self.fp8_tflops:.0f} TFLOP/s" if self.fp8_tflops else "")
                + (f" ({self.source})" if self.source else ""))


def prefill_tflops(p):
    if p.get("flops") and p.get("seconds"):
        return p["flops"] / p["seconds"] / 1e12
    return p.get("tflops")


def decode_gbps(d):
    if d.get("bytes") and d.get("step_s"):
        return d["bytes"] / d["step_s"] / 1e9
    return d.get("gbps")


def device_name(doc):
    dev = doc.get("device") or {}
    n = doc.get("gpus_used", 1)
    name = dev.get("name", "unknown")
    return name if n == 1 else f"{n}x {name}"


def device_line(doc):
    dev = doc.get("device") or {}
    used, count = doc.get("gpus_used", 1), dev.get("count")
    gpus = f"{used} GPU" + ("s" if used != 1 else "")
    if count and count != used:
        gpus += f" of the machine's {count}"
    driver = f"driver {dev['driver']}" if dev.get("driver") else "driver not stated"
    return (f"Device: {dev.get('name', 'unknown')}, {driver}, {gpus}; cllm commit `{doc.get('commit', 'unknown')}`; "
            f"{doc.get('date') or 'date not stated'}; {Limits(doc).line()}.")


class Figures:
    """The figures a section renders, for the history CSV."""

    def __init__(self, doc):
        self.doc, self.rows = doc, []

    def add(self, model, measure, value, unit, pct=None):
        if value is None:
            return
        self.rows.append({"date": self.doc.get("date", ""), "commit": self.doc.get("commit", ""),
                          "device": device_name(self.doc), "section": self.doc.get("section", ""),
                          "model": model, "measure": measure, "value": f"{value:.6g}", "unit": unit,
                          "pct_of_limit": f"{pct:.1f}" if pct is not None else ""})


# ---------- sections ----------

def prefill_cell(p, lim, gpus=1):
    t = prefill_tflops(p)
    return (f"{num(p['tok_s'])} tok/s" + (f", {t:.1f} TFLOP/s" if t else ""), lim.flops_pct(t, gpus))


def decode_cell(d, lim, gpus=1):
    g = decode_gbps(d)
    ms = f" ({d['step_s'] * 1e3:.2f} ms/step)" if d.get("step_s") else ""
    return (f"{num(d['tok_s'], 1)} tok/s{ms}" + (f", {num(g)} GB/s" if g else ""), lim.bw_pct(g, gpus))


def decode_label(d):
    return f"decode batch {d.get('batch', 1)} at {d['ctx']} context"


def cell_pair(cellf, x, y, lim, gx=1, gy=1):
    """Table text of x's and y's cells (cellf: prefill_cell or decode_cell, against gx and gy GPUs' limits), each
    with its % of limit, then x ÷ y; and the two %s."""
    cx, px = cellf(x, lim, gx) if x else ("—", None)
    cy, py = cellf(y, lim, gy) if y else ("—", None)
    r = ratio(x["tok_s"] if x else 0, y["tok_s"] if y else 0)
    return f"{cx} | {pct_text(px)} | {cy} | {pct_text(py)} | {r}", px, py


def bench_rows(*benches):
    """The measures of `cllm bench` results (None: not run), in the first result's order: (label, its cell
    function, each result's row of that measure or None)."""
    first = next((b for b in benches if b), {})
    rows = []
    for kind, cellf in (("prefill", prefill_cell), ("decode", decode_cell)):
        for x in first.get(kind, []):
            key = (x.get("tokens"), x.get("ctx"), x.get("batch"))
            same = [next((y for y in (b or {}).get(kind, []) if (y.get("tokens"), y.get("ctx"), y.get("batch")) == key),
                         None) for b in benches]
            rows.append((f"prefill {x['tokens']} tokens" if kind == "prefill" else decode_label(x), cellf, same))
    return rows


def render_single(doc, fig):
    lim = Limits(doc)
    s = doc.get("settings", {})
    out = ["Prefill FLOPs = 2 × layer weights × T + attention (QK^T and PV over the causal pairs, windows respected) "
           "+ the LM head for the one row that gets logits; the transformers columns use the same count. Decode "
           "bytes per step = every weight the step reads (LM head yes, untied embedding table no) + the context's "
           "K/V as the cache holds them. cllm: median of whole scheduler steps (batch, forward, draw), random token "
           "ids, one sequence; transformers (bench/hf_reference.py, same folder, same run): median of forward calls, "
           "decode the faster of a forward loop with the KV cache and generate()."]
    if s:
        out[0] += (f" Prompt lengths {s.get('prompt_lens')}, contexts {s.get('ctx')}, {s.get('decode_tokens')} "
                   f"timed decode steps, {s.get('reps')} timed prefills each.")
    out.append("")
    for m in doc.get("models", []):
        name, c, h = m["name"], m.get("cllm"), m.get("hf")
        base = name[:-5] if name.endswith("-tiny") else name
        title = TITLES.get(base, base) + (" — TINY smoke-test size, not the real shape" if name != base else "")
        out += [f"### {name}", "", title, ""]
        if not c:
            out += [f"Not run in this generation ({m.get('error') or 'no results'}).", ""]
            continue
        ref = h.get("impl") if h else f"not run ({m.get('hf_error') or 'no results'})"
        out += [f"{c['params'] / 1e9:.3f} B parameters, {c['weight_bytes'] / 1e9:.2f} GB of weights; cllm backend "
                f"`{c.get('backend', '?')}`; reference: {ref}.", "",
                "| measure | cllm | % of limit | transformers | % of limit | cllm ÷ transformers |",
                "| --- | --- | --- | --- | --- | --- |"]
        up = f", GPU upload {c['upload_gbps']:.1f} GB/s" if c.get("upload_gbps") else ""
        gbs = f" ({c['load_gbps']:.2f} GB/s{up})" if c.get("load_gbps") else ""
        hl = f"{h['load_s']:.1f} s" if h and h.get("load_s") else "—"
        out.append(f"| load (file → ready) | {c['load_s']:.1f} s{gbs} | — | {hl} | — | "
                   f"{ratio(h['load_s'], c['load_s']) + ' (speed)' if h and h.get('load_s') else '—'} |")
        fig.add(name, "load", c["load_s"], "s")
        if h and h.get("load_s"):
            fig.add(name, "transformers load", h["load_s"], "s")
        href = {p["tokens"]: p for p in h.get("prefill", [])} if h else {}
        for p in c.get("prefill", []):
            cell, pct = prefill_cell(p, lim)
            r = href.get(p["tokens"])
            hcell, hpct = "—", None
            if r:
                ht = r.get("tflops") or (p["flops"] / r["seconds"] / 1e12 if p.get("flops") and r.get("seconds")
                                         else None)
                hcell = f"{num(r['tok_s'])} tok/s" + (f", {ht:.1f} TFLOP/s" if ht else "")
                hpct = lim.flops_pct(ht)
                fig.add(name, f"transformers prefill {p['tokens']} tokens", r["tok_s"], "tok/s", hpct)
            out.append(f"| prefill {p['tokens']} tokens | {cell} | {pct_text(pct)} | {hcell} | {pct_text(hpct)} | "
                       f"{ratio(p['tok_s'], r['tok_s'] if r else 0)} |")
            fig.add(name, f"prefill {p['tokens']} tokens", p["tok_s"], "tok/s", pct)
        dref = {(d["ctx"], d.get("batch", 1)): d for d in h.get("decode", [])} if h else {}
        for d in c.get("decode", []):
            cell, pct = decode_cell(d, lim)
            r = dref.get((d["ctx"], d.get("batch", 1)))
            hcell, hpct = "—", None
            if r:
                if r.get("generate_tok_s", 0) > r["tok_s"]:  # the faster of the two ways transformers decodes
                    r = dict(r, tok_s=r["generate_tok_s"], step_s=r["generate_step_s"])
                hg = r.get("gbps") or (d["bytes"] / r["step_s"] / 1e9 if d.get("bytes") and r.get("step_s") else None)
                hcell = f"{num(r['tok_s'], 1)} tok/s" + (f", {num(hg)} GB/s" if hg else "")
                hpct = lim.bw_pct(hg)
                fig.add(name, f"transformers {decode_label(d)}", r["tok_s"], "tok/s", hpct)
            out.append(f"| {decode_label(d)} | {cell} | {pct_text(pct)} | {hcell} | {pct_text(hpct)} | "
                       f"{ratio(d['tok_s'], r['tok_s'] if r else 0)} |")
            fig.add(name, decode_label(d), d["tok_s"], "tok/s", pct)
        out.append("")
    return out


def render_quant(doc, fig):
    lim = Limits(doc)
    s = doc.get("settings", {})
    model = doc.get("model", "llama3-8b")
    source = doc.get("source", "files")
    if source.startswith("dummy"):
        how = (f"{TITLES.get(model, model).replace('random bf16 weights', 'random weights made in memory')}: "
               "`--dummy-weights=TYPE` (random valid blocks of the type, LM head Q6_K as llama.cpp's files hold it) "
               f"against `--dummy-weights` (bf16: the bf16 path), in the same run; no files ({source[5:].strip(' ()')}).")
    else:
        how = (f"{TITLES.get(model, model)}, written as one BF16 GGUF (`bench/make_model.py {model} F.gguf --gguf`) and "
               "quantized by `cllm quantize`; each file benched twice in the same run: its blocks on the GPU "
               "(quantized) and with `--bf16-weights` (dequantized to bf16 at load: the bf16 path).")
    out = [how + " Prefill FLOPs as in the single-GPU section; decode bytes count the weights as the GPU holds them "
           "(quantized bytes for quantized matrices)."
           + (f" Prompt lengths {s.get('prompt_lens')}, contexts {s.get('ctx')}, {s.get('decode_tokens')} timed "
              f"decode steps, batch 1." if s else ""), ""]
    sizes = []
    for r in doc.get("runs", []):
        q, b = r.get("quant"), r.get("bf16")
        parts = []
        if r.get("file_bytes"):
            parts.append(f"file {r['file_bytes'] / 1e9:.2f} GB")
        if q and q.get("weight_bytes"):
            parts.append(f"weights {q['weight_bytes'] / 1e9:.2f} GB quantized")
        if b and b.get("weight_bytes"):
            parts.append(f"{b['weight_bytes'] / 1e9:.2f} GB " + ("bf16" if source.startswith("dummy") else "with --bf16-weights"))
        if parts:
            sizes.append(f"{r['type'].upper()}: " + ", ".join(parts))
    if sizes:
        out += ["; ".join(sizes) + ".", ""]
    bf = "bf16 weights" if source.startswith("dummy") else "--bf16-weights"
    out += [f"| {'type' if source.startswith('dummy') else 'file'} | measure | quantized | % of limit | {bf} | % of limit | quantized ÷ bf16 |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc.get("runs", []):
        t, q, b = r["type"].upper(), r.get("quant"), r.get("bf16")
        mname = f"{model} {r['type']}"
        if not q and not b:
            out.append(f"| {t} | not run ({r.get('error') or 'no results'}) | | | | | |")
            continue
        for label, cellf, (qx, bx) in bench_rows(q, b):
            cells, qpct, bpct = cell_pair(cellf, qx, bx, lim)
            out.append(f"| {t} | {label} | {cells} |")
            if qx:
                fig.add(mname, f"{label} (quantized)", qx["tok_s"], "tok/s", qpct)
            if bx:
                fig.add(mname, f"{label} (--bf16-weights)", bx["tok_s"], "tok/s", bpct)
        if r.get("error"):
            out.append(f"| {t} | partly failed: {r['error']} | | | | | |")
    return out + [""]


def render_kv_fp8(doc, fig):
    lim = Limits(doc)
    s = doc.get("settings", {})
    model = doc.get("model", "?")
    title = TITLES.get(model, model)
    if doc.get("args"):
        title = (title.replace("random bf16 weights", f"random weights made in memory (`{doc['args']}`)")
                 if "--dummy-weights" in doc["args"] else f"{title}, `{doc['args']}`")
    steps = f" ({s['decode_tokens']} timed steps)" if s.get("decode_tokens") else ""
    out = [f"{title}; `cllm bench --kv-dtype bf16|fp8`, batch-1 and batch-{s.get('batch', '?')} "
           f"decode at each context{steps}. Bytes per step: the weights and the K/V as each cache holds them (fp8: "
           "e4m3 codes + a scale per token and KV head)."]
    kt = doc.get("kv_tokens") or {}
    if kt.get("bf16") and kt.get("fp8"):
        out[0] += (f" KV cache capacity in the same memory budget: bf16 {num(kt['bf16'])} tokens, fp8 "
                   f"{num(kt['fp8'])} tokens ({kt['fp8'] / kt['bf16']:.2f}×).")
        fig.add(model, "KV cache capacity, bf16", kt["bf16"], "tokens")
        fig.add(model, "KV cache capacity, fp8", kt["fp8"], "tokens")
    out += ["", "| decode | bf16 KV | % of limit | fp8 KV | % of limit | fp8 ÷ bf16 |", "| --- | --- | --- | --- | --- | --- |"]
    runs = {(r["kv"], r["batch"]): r.get("bench") for r in doc.get("runs", [])}
    for b in sorted({r["batch"] for r in doc.get("runs", [])}):
        x, y = runs.get(("bf16", b)), runs.get(("fp8", b))
        ydec = {d["ctx"]: d for d in y.get("decode", [])} if y else {}
        for d in (x or y or {}).get("decode", []):
            xd = d if x else None
            yd = ydec.get(d["ctx"])
            xc, xp = decode_cell(xd, lim) if xd else ("—", None)
            yc, yp = decode_cell(yd, lim) if yd else ("—", None)
            out.append(f"| batch {b} at {d['ctx']} context | {xc} | {pct_text(xp)} | {yc} | {pct_text(yp)} | "
                       f"{ratio(yd['tok_s'] if yd else 0, xd['tok_s'] if xd else 0)} |")
            if xd:
                fig.add(model, f"decode batch {b} at {d['ctx']} context, bf16 KV", xd["tok_s"], "tok/s", xp)
            if yd:
                fig.add(model, f"decode batch {b} at {d['ctx']} context, fp8 KV", yd["tok_s"], "tok/s", yp)
    if doc.get("error"):
        out += ["", f"Partly failed: {doc['error']}"]
    return out + [""]


BACKEND_NAMES = {"sdpa-flash": "flash (FlashAttention-2)", "sdpa-cudnn": "cuDNN",
                 "sdpa-default": "default (the backend torch picks)"}


def render_attention(doc, fig):
    lim = Limits(doc)
    rows = doc.get("rows", [])
    ref = doc.get("reference")
    tried = {r["impl"] for r in rows + doc.get("skipped", []) if r["impl"].startswith("sdpa-")}
    backends = [b for b in BACKEND_NAMES if b in tried] + sorted(tried - set(BACKEND_NAMES))
    sdpa = (f"PyTorch SDPA (bench/sdpa_reference.py) through its {' and '.join(BACKEND_NAMES.get(b, b) for b in backends)} "
            f"backend{'s' if len(backends) > 1 else ''} on dense tensors" + (f" ({ref})" if ref else "")
            if backends else "PyTorch SDPA: no results")
    out = ["Kernels alone, CUDA events, median of 30 launches after 5 warm-ups, random inputs. Prefill: causal, 32 "
           "heads, head size 128, whole prompts (SEQUENCES x LENGTH), FLOPs 4 L² H D / 2 per sequence, against the "
           "matmul limit. Decode: one query row per sequence (SEQUENCES x CONTEXT), 32 query / 8 KV heads, head "
           f"size 128, bytes = the K and V read once, against the copy limit. cllm over its paged cache; {sdpa}.", ""]

    def find(kind, shape, impl, kv="bf16", variant=None):
        for r in rows:
            if (r["kind"], r["shape"], r["impl"], r.get("kv", "bf16"), r.get("variant")) == (kind, shape, impl, kv,
                                                                                              variant):
                return r
        return None

    def skipped(kind, shape, impl, variant=None):
        for r in doc.get("skipped", []):
            if (r["kind"], r["shape"], r["impl"], r.get("variant")) == (kind, shape, impl, variant):
                return "not supported"
        return "—"

    def pct(r):
        return lim.flops_pct(r["rate"]) if r["kind"] == "prefill" else lim.bw_pct(r["rate"] * 1e3)

    def rate(r):
        return f"{r['rate']:.3g} {r['unit']} ({pct_text(pct(r))})"

    def ms(r):
        return f"{r['ms']:.3f}"

    ours = [r for r in rows if r["impl"] == "cllm" and r.get("kv", "bf16") == "bf16" and not r.get("variant")]
    cols = "".join(f" SDPA {b[5:]} ms |" for b in backends)
    best_name = "faster SDPA" if len(backends) > 1 else "SDPA"
    out += [f"| shape | cllm ms | cllm rate (% of limit) |{cols} {best_name} rate (% of limit) | cllm speed ÷ {best_name} |",
            "| --- | --- | --- |" + " --- |" * len(backends) + " --- | --- |"]
    for r in ours:
        label = f"{r['kind']} {r['shape']}"
        refs = [find(r["kind"], r["shape"], b) for b in backends]
        best = min([x for x in refs if x], key=lambda x: x["ms"], default=None)
        cells = "".join(f" {ms(x) if x else skipped(r['kind'], r['shape'], b)} |" for x, b in zip(refs, backends))
        out.append(f"| {label} | {ms(r)} | {rate(r)} |{cells} {rate(best) if best else '—'} | "
                   f"{ratio(best['ms'], r['ms']) if best else '—'} |")
        fig.add("kernels", f"{label} cllm", r["rate"], r["unit"], pct(r))
        for x in refs:
            if x:
                fig.add("kernels", f"{label} {x['impl']}", x["rate"], x["unit"], pct(x))
    fp8 = [r for r in rows if r["impl"] == "cllm" and r.get("kv") == "fp8" and not r.get("variant")]
    if fp8:
        out += ["", "The same kernels over an fp8 KV cache (`--kv-dtype fp8`: e4m3 codes + a scale per token and KV "
                "head; decode bytes as the cache holds them) against the bf16 cache, same run:", "",
                "| shape | bf16 cache ms | fp8 cache ms | fp8 speed-up | fp8 rate (% of limit) |",
                "| --- | --- | --- | --- | --- |"]
        for r in fp8:
            b = find(r["kind"], r["shape"], "cllm", "bf16")
            out.append(f"| {r['kind']} {r['shape']} | {ms(b) if b else '—'} | {ms(r)} | "
                       f"{ratio(b['ms'], r['ms']) if b else '—'} | {rate(r)} |")
            fig.add("kernels", f"{r['kind']} {r['shape']} cllm fp8 KV", r["rate"], r["unit"], pct(r))
    copies = [r for r in rows if r["impl"] == "cllm" and r.get("copy_ms") and not r.get("variant")]
    if copies:
        out += ["", "Decode against a device copy of the same size: cudaMemcpy device to device moving the row's bytes "
                "(half read, half written), timed the same way in the same run. The limit is a 4 GiB copy; at a decode "
                "row's size a launch's ramp and tail weigh, and this is what the copy engine reaches there:", "",
                "| cache | shape | bytes | cllm ms | copy ms | copy rate (% of limit) | cllm time ÷ copy |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in copies:
            nbytes = r["rate"] * r["ms"] * 1e9  # TB/s x ms
            crate = nbytes / r["copy_ms"] / 1e9
            out.append(f"| {r.get('kv', 'bf16')} | {r['shape']} | {nbytes / 1e6:.0f} MB | {ms(r)} | {r['copy_ms']:.3f} | "
                       f"{crate:.3g} TB/s ({pct_text(lim.bw_pct(crate * 1e3))}) | {ratio(r['ms'], r['copy_ms'])} |")
            fig.add("kernels", f"decode {r['shape']} {r.get('kv', 'bf16')} copy of the same bytes", crate, "TB/s",
                    lim.bw_pct(crate * 1e3))
    variants = [r for r in rows if r["impl"] == "cllm" and r.get("variant")]
    if variants:
        out += ["", "The model set's variants (bf16 cache): a sliding window of 4096 (its FLOPs and bytes those inside "
                "the window), a logit soft-cap of 50, attention sinks; against the plain causal kernel on the same "
                "shape and, where it has the variant, PyTorch's flex_attention (compiled, block-sparse; SDPA has "
                "neither a window nor a soft-cap of its own), same run:", "",
                "| variant | shape | cllm ms | cllm rate (% of limit) | plain kernel ms | time ÷ plain | flex ms | "
                "cllm speed ÷ flex |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in variants:
            plain = find(r["kind"], r["shape"], "cllm")
            flex = find(r["kind"], r["shape"], "torch-flex", variant=r["variant"])
            out.append(f"| {r['variant']} | {r['kind']} {r['shape']} | {ms(r)} | {rate(r)} | "
                       f"{ms(plain) if plain else '—'} | {ratio(r['ms'], plain['ms']) if plain else '—'} | "
                       f"{ms(flex) if flex else skipped(r['kind'], r['shape'], 'torch-flex', r['variant'])} | "
                       f"{ratio(flex['ms'], r['ms']) if flex else '—'} |")
            fig.add("kernels", f"{r['kind']} {r['shape']} {r['variant']} cllm", r["rate"], r["unit"], pct(r))
            if flex:
                fig.add("kernels", f"{r['kind']} {r['shape']} {r['variant']} torch-flex", flex["rate"], flex["unit"],
                        pct(flex))
    if doc.get("error"):
        out += ["", f"Partly failed: {doc['error']}"]
    return out + [""]


def tp_rates(r):
    """(output tok/s over the whole process, total tok/s, output tok/s over the steps): given, or from the counts."""
    wall, steps = r.get("wall_s"), r.get("steps_s")
    o = r.get("output_tok_s") or (r["output_tokens"] / wall if wall and "output_tokens" in r else None)
    t = r.get("total_tok_s") or ((r["prompt_tokens"] + r["output_tokens"]) / wall
                                 if wall and "output_tokens" in r and "prompt_tokens" in r else None)
    s = r.get("steps_output_tok_s") or (r["output_tokens"] / steps if steps and "output_tokens" in r else None)
    return o, t, s


def tp_tflops(doc, r):
    """Matrix FLOP/s over the steps: the layers' matrices for every row they run (prompt tokens, then each output
    token but the first), the LM head for every output token; attention not counted (a lower bound)."""
    mp = doc.get("matrix_params")
    if not mp or not r.get("steps_s") or "output_tokens" not in r or "prompt_tokens" not in r:
        return None
    rows = r["prompt_tokens"] + r["output_tokens"] - r["prompts"]
    return (2.0 * mp["layers"] * rows + 2.0 * mp["head"] * r["output_tokens"]) / r["steps_s"] / 1e12


def render_throughput(doc, fig):
    lim = Limits(doc)
    b, s = doc.get("batched"), doc.get("single")
    model = doc.get("model", "?")
    if not b:
        return ["Not run in this generation (no batched run in the results).", ""]
    m = b.get("prompt_mean") or (b["prompt_tokens"] / max(b["prompts"], 1) if b.get("prompt_tokens") else None)
    mean = f" (mean {m:.0f})" if m else ""
    lens = f", prompt tokens {b['prompt_min']}-{b['prompt_max']}{mean}" if b.get("prompt_max") else ""
    args = f", `{doc['args']}`" if doc.get("args") else ""
    failed = f" ({b['failed']} failed)" if b.get("failed") is not None else ""
    took = (f"{b['max_seqs']} sequences and {b['max_batched_tokens']} tokens a step" if b.get("max_seqs")
            else "not recorded by this run")
    out = [f"{TITLES.get(model, model)}: {b['prompts']} prompts{failed}{lens}, "
           f"{doc.get('output_tokens_each', 256)} output tokens each, greedy, EOS ignored{args}; scheduler "
           f"limits: {took}. Whole process: wall time of `cllm generate` (start, "
           "load, tokenizing included); over the steps: the scheduler steps' own time. Matrix FLOP/s: 2 × the "
           "layers' matrix weights per row they run + the LM head per output token, over the steps (attention not "
           "counted: a lower bound).", "",
           "| run | prompts | output tok/s, whole process | total tok/s | output tok/s over the steps | wall s | "
           "matrix FLOP/s over the steps (% of limit) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, key, r in (("batched", "batched", b), ("one at a time (--max-seqs 1)", "one at a time", s)):
        if not r:
            continue
        o, t, st = tp_rates(r)
        tf = tp_tflops(doc, r)
        p = lim.flops_pct(tf)
        wall = f"{r['wall_s']:.1f}" if r.get("wall_s") else "—"
        flops = f"{tf:.1f} TFLOP/s ({pct_text(p)})" if tf else "—"
        out.append(f"| {label} | {r['prompts']} | {num(o) if o else '—'} | {num(t) if t else '—'} | "
                   f"{num(st) if st else '—'} | {wall} | {flops} |")
        fig.add(model, f"{key}: output tok/s, whole process", o, "tok/s")
        fig.add(model, f"{key}: total tok/s, whole process", t, "tok/s")
        fig.add(model, f"{key}: output tok/s over the steps", st, "tok/s", p)
    notes = []
    if s and tp_rates(s)[0] and tp_rates(b)[0]:
        notes.append(f"Batched ÷ one at a time (output tok/s, whole process): {ratio(tp_rates(b)[0], tp_rates(s)[0])}.")
    for label, key, r in (("batched", "batched", b), ("one-at-a-time", "one at a time", s)):
        rl = (r or {}).get("roofline") or {}
        if rl.get("roofline_tok_s") and rl.get("pct_steps") is not None:
            whole = f", {rl['pct_wall']:.1f}% over the whole process" if rl.get("pct_wall") is not None else ""
            notes.append(f"Roofline of the {label} run's own steps (bench/roofline.py: per step max(FLOPs / matmul "
                         f"rate, (weight + KV bytes read) / copy rate)): {num(rl['roofline_tok_s'])} output tok/s; "
                         f"reached {rl['pct_steps']:.1f}% of it over the steps{whole}.")
            fig.add(model, f"{key}: roofline output tok/s", rl["roofline_tok_s"], "tok/s")
        if r and r.get("steps_pct_after_load") is not None:
            notes.append(f"Steps' share of the {label} run's wall time after the load: {r['steps_pct_after_load']:.2f}%.")
        lp = (r or {}).get("load_parts")
        if lp:
            close = f"; closing took {r['close_s']:.2f} s" if r.get("close_s") is not None else ""
            notes.append(f"The {label} run's load, {lp['load_s']:.2f} s: the model's tensors {lp['model_s']:.2f} s, "
                         f"finding the GPUs {lp['gpus_s']:.2f} s, backends, links and engine {lp['open_s']:.2f} s, "
                         f"the rest {lp['rest_s']:.2f} s{close}.")
        if r and r.get("power"):
            notes.append(power.sentence(r["power"], label))
    if b.get("scheduler_pct") is not None:
        notes.append(f"Scheduler's own work (outside forward and sampling): {b['scheduler_pct']:.2f}% of step time.")
        fig.add(model, "batched: scheduler's own work, share of step time", b["scheduler_pct"], "%")
    return out + ([""] + [" ".join(notes)] if notes else []) + [""]


def render_pipeline(doc, fig):
    lim = Limits(doc)
    model = doc.get("model", "llama3-8b")
    bench = doc.get("bench") or {}
    tp = doc.get("throughput") or {}
    pps = sorted(set(bench) | set(tp), key=int) or ["1", "2"]
    bar = "|".join(pps)
    out = [f"{TITLES.get(model, model)}. `cllm bench --pp {bar}` (prefill 512, batch-1 decode) and bench/throughput.sh "
           f"with `THROUGHPUT_ARGS=\"--pp {bar}\"`. Stages on their own threads, hidden states over NCCL. A batch-1 "
           "request goes through the stages in turn, so its limit is one GPU's: every % is of one GPU's measured "
           "limits, with the bytes and FLOPs of the whole model (a prompt's 256-token chunks may run on different "
           "stages at once, so a prefill may pass 100%).", ""]
    head, rule = "| measure |", "| --- |"
    for k in pps:
        head += f" --pp {k} ({gpus_text(int(k))}) | % of limit |" + (f" ÷ --pp 1 |" if k != "1" else "")
        rule += " --- | --- |" + (" --- |" if k != "1" else "")
    out += [head, rule]
    for label, cellf, xs in bench_rows(*[bench.get(k) for k in pps]):
        line = f"| {label} |"
        base = xs[0] if pps[0] == "1" else None
        for k, x in zip(pps, xs):
            c, pc = cellf(x, lim) if x else ("—", None)
            line += f" {c} | {pct_text(pc)} |"
            if k != "1":
                line += f" {ratio(x['tok_s'] if x else 0, base['tok_s'] if base else 0)} |"
            if x:
                fig.add(model, f"{label}, --pp {k}", x["tok_s"], "tok/s", pc)
        out.append(line)
    ts = {k: (tp.get(k) or {}).get("batched") for k in pps}
    if any(ts.values()):
        rs = {k: tp_rates(t) if t else (None, None, None) for k, t in ts.items()}
        n = next(t for t in ts.values() if t)["prompts"]
        for i, what in ((2, "output tok/s over the steps"), (0, "output tok/s, whole process")):
            line = f"| {n} prompts x 256 output tokens: {what} |"
            for k in pps:
                v = rs[k][i]
                line += f" {num(v) if v else '—'} | |" + (f" {ratio(v, rs['1'][i] if '1' in rs else None)} |"
                                                        if k != "1" else "")
                fig.add(model, f"throughput {what}, --pp {k}", v, "tok/s")
            out.append(line)
        line = "| scheduler's own work, share of step time |"
        for k in pps:
            sp = (ts[k] or {}).get("scheduler_pct")
            fig.add(model, f"throughput scheduler's own work, share of step time, --pp {k}", sp, "%")
            line += f" {f'{sp:.2f}%' if sp is not None else '—'} | |" + (" |" if k != "1" else "")
        out.append(line)
    bigs = doc.get("big") or []
    if isinstance(bigs, dict):  # one big model, --pp 2 (the section's older form)
        bigs = [dict(bigs, pp=bigs.get("pp", 2))]
    mem = (doc.get("device") or {}).get("memory_mib")
    for big in bigs:
        bb = big.get("bench")
        bname, g = big.get("model", "?"), big.get("pp", 2)
        kind = f" in {big['weights'].upper()} (`--dummy-weights={big['weights']}`)" if big.get("weights") not in (
            None, "bf16") else ""
        if not bb:
            out += ["", f"{TITLES.get(bname, bname)}{kind}, `--pp {g}`: no result (the errors below)."]
            continue
        over = f" (more than one GPU's {mem / 1024:.0f} GiB)" if mem and bb["weight_bytes"] > mem * 2**20 else ""
        out += ["", f"{TITLES.get(bname, bname)}{kind}: {bb['params'] / 1e9:.2f} G parameters, "
                f"{bb['weight_bytes'] / 1e9:.1f} GB of weights{over}, `--pp {g}`; a batch-1 step runs the stages in "
                "turn, so the limits are one GPU's (a prefill's 256-token chunks overlap on the stages: it may pass "
                "100%):", "", f"| measure | --pp {g} | % of limit |", "| --- | --- | --- |"]
        up = f", {bb['load_gbps']:.1f} GB/s" if bb.get("load_gbps") else ""
        out.append(f"| load (random weights made and uploaded) | {bb['load_s']:.1f} s{up} | |")
        for label, cellf, (x,) in bench_rows(bb):
            c, pc = cellf(x, lim)
            out.append(f"| {label} | {c} | {pct_text(pc)} |")
            fig.add(bname, f"{label}, --pp {g}" + (f", {big['weights']}" if kind else ""), x["tok_s"], "tok/s", pc)
    bt = doc.get("big_throughput") or {}
    if bt.get("runs"):
        bname = bt.get("model", "llama3-70b")
        out += ["", f"{TITLES.get(bname, bname)}: bench/throughput.sh "
                "(`THROUGHPUT_ARGS=\"--dummy-weights --pp P\"`, the prompts and output lengths above; it does not "
                "fit one GPU):", "", "| run | output tok/s, whole process | output tok/s over the steps | wall s |",
                "| --- | --- | --- | --- |"]
        for k in sorted(bt["runs"], key=int):
            r = (bt["runs"][k] or {}).get("batched")
            o, _, st = tp_rates(r) if r else (None, None, None)
            wall = f"{r['wall_s']:.1f}" if r and r.get("wall_s") else "—"
            out.append(f"| --pp {k} | {num(o) if o else 'failed'} | {num(st) if st else '—'} | {wall} |")
            fig.add(bname, f"throughput output tok/s, whole process, --pp {k}", o, "tok/s")
            fig.add(bname, f"throughput output tok/s over the steps, --pp {k}", st, "tok/s")
    if doc.get("error"):
        out += ["", "Partly failed: " + "; ".join(doc["error"].splitlines())]
    return out + [""]


def gpus_text(n):
    return f"{n} GPU" + ("s" if n != 1 else "")


def load_text(b):
    if not b or not b.get("load_s"):
        return "—"
    return f"{b['load_s']:.1f} s" + (f", {b['load_gbps']:.1f} GB/s" if b.get("load_gbps") else "")


def huge_table(huge, lim, fig):
    """The 405B shape at --tp 8, --pp 2 --tp 4, --pp 8: a column pair per run. A batch-1 step runs a request's
    stages in turn, so its limit is one stage's GPUs: --tp N of them."""
    hname, runs = huge.get("model", "llama3.1-405b"), huge["runs"]
    one = next((r["bench"] for r in runs if r.get("bench")), None)
    size = f": {one['params'] / 1e9:.2f} G parameters, {one['weight_bytes'] / 1e9:.1f} GB of weights" if one else ""
    out = ["", f"{TITLES.get(hname, hname)} in {huge.get('weights', 'q4_k').upper()} "
           f"(`--dummy-weights={huge.get('weights', 'q4_k')}`){size}, on 8 GPUs three ways. A batch-1 step runs a "
           "request's stages in turn, so each % is of one stage's GPUs (its --tp ranks) together; throughput: "
           "bench/throughput.sh with the same prompts as below.", ""]
    head, rule = "| measure |", "| --- |"
    for r in runs:
        head += f" {r['args']} | % of {gpus_text(roofline.option_count(r['args'], '--tp'))} |"
        rule += " --- | --- |"
    out += [head, rule, "| load (random weights made and uploaded) |" + "".join(f" {load_text(r.get('bench'))} | |"
                                                                          for r in runs)]
    for label, cellf, xs in bench_rows(*[r.get("bench") for r in runs]):
        line = f"| {label} |"
        for r, x in zip(runs, xs):
            c, p = cellf(x, lim, roofline.option_count(r["args"], "--tp")) if x else ("—", None)
            line += f" {c} | {pct_text(p)} |"
            if x:
                fig.add(hname, f"{label}, {r['args']}", x["tok_s"], "tok/s", p)
        out.append(line)
    for i, what in ((0, "output tok/s, whole process"), (2, "output tok/s over the steps")):
        line = f"| 1000-prompt throughput: {what} |"
        for r in runs:
            v = tp_rates(r["batched"])[i] if r.get("batched") else None
            line += f" {num(v) if v else '—'} | |"
            fig.add(hname, f"throughput {what}, {r['args']}", v, "tok/s")
        out.append(line)
    return out


def render_tensor_parallel(doc, fig, pipeline=None):
    """pipeline: the pipeline section's doc of the same report (its --pp 1 and --pp 2 throughput rows), or None."""
    lim = Limits(doc)
    model = doc.get("model", "llama3-8b")
    runs = doc.get("runs", [])
    title = TITLES.get(model, model).replace("random bf16 weights", "random bf16 weights made in memory (--dummy-weights)")
    out = [f"{title}. `cllm bench` (prefill {doc.get('prompt_lens', '?')} tokens, batch-1 decode at "
           f"{doc.get('ctx', '?')} context) at each `--tp`: each rank on a GPU of its own, the partial sums over NCCL "
           "(fp32 parts summed in rank order; `--tp-nccl-sum`: ncclAllReduce's sum of bf16 parts). FLOPs and bytes "
           "are the whole model's. The % of limit of --tp 1 is of one GPU's limits; of --tp N, of N GPUs' together: "
           "decode, the whole model's bytes per step over N × the copy rate (each rank reads its 1/N of the weights: "
           "the fastest N GPUs' bandwidth allows); prefill, its FLOPs over N × the matmul rate. Two ranks on one GPU "
           "(`--gpus 0,0`, host memory): one GPU's limits.", ""]
    # 1. The 8B shape: a column group per run, its ratio to --tp 1 beside it.
    base = next((r.get("bench") for r in runs if r.get("name") == "tp1"), None)
    head, rule = "| measure |", "| --- |"
    for r in runs:
        more = r.get("name") != "tp1"
        head += f" {r['args']} | % of {gpus_text(r['gpus'])} |" + (" ÷ --tp 1 |" if more else "")
        rule += " --- | --- |" + (" --- |" if more else "")
    rows = bench_rows(base, *[r.get("bench") for r in runs])
    out += [head, rule] if rows else ["No `cllm bench` results."]
    for label, cellf, (b, *xs) in rows:
        line = f"| {label} |"
        for r, x in zip(runs, xs):
            c, p = cellf(x, lim, r["gpus"]) if x else ("—", None)
            line += f" {c} | {pct_text(p)} |"
            if r.get("name") != "tp1":
                line += f" {ratio(x['tok_s'] if x else 0, b['tok_s'] if b else 0)} |"
            if x:
                fig.add(model, f"{label}, {r['args']}", x["tok_s"], "tok/s", p)
        out.append(line)
    # 2. The 70B shape on G GPUs: split by heads against split by layers.
    big = doc.get("big") or {}
    if big:
        g, bname = big.get("gpus", 2), big.get("model", "llama3-70b")
        t, pp = big.get("tp"), big.get("pp")
        one = t or pp
        size = (f": {one['params'] / 1e9:.2f} G parameters, {one['weight_bytes'] / 1e9:.1f} GB of weights"
                if one and one.get("params") else "")
        out += ["", f"{TITLES.get(bname, bname)}{size}, on {g} GPUs, split by heads (`--tp {g}`: every step runs "
                f"on the {g} at once, so its % is of {g} GPUs' limits together) and by layers (`--pp {g}`: a batch-1 "
                "request runs the stages in turn, so its % is of one GPU's limits):", ""]
        if one:
            out += [f"| measure | --tp {g} | % of {gpus_text(g)} | --pp {g} | % of 1 GPU | --tp {g} ÷ --pp {g} |",
                    "| --- | --- | --- | --- | --- | --- |",
                    f"| load (random weights made and uploaded) | {load_text(t)} | | {load_text(pp)} | | |"]
            for label, cellf, (xt, xp) in bench_rows(t, pp):
                cells, pt, ppct = cell_pair(cellf, xt, xp, lim, g)
                out.append(f"| {label} | {cells} |")
                if xt:
                    fig.add(bname, f"{label}, --tp {g}", xt["tok_s"], "tok/s", pt)
                if xp:
                    fig.add(bname, f"{label}, --pp {g}", xp["tok_s"], "tok/s", ppct)
        else:
            out.append(f"Neither `--tp {g}` nor `--pp {g}` gave results (the errors below).")
        if big.get("info"):
            out += ["", f"Memory per GPU, `cllm info --dummy-weights --tp {g}`: " + "; ".join(big["info"]) + "."]
    # 2b. The 405B shape in Q4_K three ways (8 GPUs).
    huge = doc.get("huge") or {}
    if huge.get("runs"):
        out += huge_table(huge, lim, fig)
    # 3. Offline throughput, beside the pipeline section's --pp 1 and --pp 2 (same shape, its own run).
    thr = doc.get("throughput") or []
    if thr:
        pthr = (pipeline or {}).get("throughput") or {}
        theirs = [(f"--pp {k} (pipeline section)", int(k), (pthr.get(k) or {}).get("batched")) for k in sorted(pthr, key=int)]
        theirs = [x for x in theirs if x[2]]
        base = tp_rates(theirs[0][2])[2] if theirs and theirs[0][1] == 1 else None
        n = next((b["prompts"] for _, _, b in theirs + [(0, 0, r.get("batched")) for r in thr] if b), "?")
        out += ["", f"Offline throughput: bench/throughput.sh on the same shape, {n} prompts of about 128-1024 tokens, "
                "256 output tokens each, greedy, EOS ignored, `THROUGHPUT_ARGS=\"--dummy-weights ARGS\"`. Whole "
                "process: wall time of `cllm generate` (the load included); over the steps: the scheduler steps' own "
                "time." + (" The --pp rows are the pipeline section's runs (the same shape, weights from files; its "
                           "device line says when)." if theirs else ""), "",
                "| run | GPUs | output tok/s, whole process | output tok/s over the steps |"
                + (" ÷ --pp 1 (over the steps) |" if base else "") + " wall s |",
                "| --- | --- | --- | --- |" + (" --- |" if base else "") + " --- |"]
        for label, gpus, b, ours in [x + (False,) for x in theirs] + [(r["args"], r["gpus"], r.get("batched"), True)
                                                                      for r in thr]:
            o, _, st = tp_rates(b) if b else (None, None, None)
            wall = f"{b['wall_s']:.1f}" if b and b.get("wall_s") else "—"
            out.append(f"| {label} | {gpus} | {num(o) if o else ('—' if b else 'failed')} | {num(st) if st else '—'} |"
                       + (f" {ratio(st, base)} |" if base else "") + f" {wall} |")
            if ours:
                fig.add(model, f"throughput output tok/s, whole process, {label}", o, "tok/s")
                fig.add(model, f"throughput output tok/s over the steps, {label}", st, "tok/s")
    if doc.get("error"):
        out += ["", "Partly failed: " + "; ".join(doc["error"].splitlines())]
    return out + [""]


def render_fixed_lengths(doc, fig):
    model = doc.get("model", "?")
    out = [fixed_lengths.about(dict(doc, model=TITLES.get(model, model))), ""] + fixed_lengths.table(doc)
    for r in doc.get("runs", []):
        if r.get("error"):
            continue
        shape, rl = f"{r['input']}/{r['output']}", r.get("roofline") or {}
        if r.get("wall_s"):
            fig.add(model, f"{shape}: output tok/s, whole process", r["output_tokens"] / r["wall_s"], "tok/s",
                    rl.get("pct_wall"))
        if r.get("steps_s"):
            fig.add(model, f"{shape}: output tok/s over the steps", r["output_tokens"] / r["steps_s"], "tok/s",
                    rl.get("pct_steps"))
    return out + [""]


RENDER = {"single": render_single, "quant": render_quant, "kv_fp8": render_kv_fp8, "attention": render_attention,
          "throughput": render_throughput, "fixed_lengths": render_fixed_lengths, "pipeline": render_pipeline,
          "tensor_parallel": render_tensor_parallel}


# ---------- the document ----------

def gather(dirs):
    """The sections' results (from the last folder that has each), why the others have none, and the runs."""
    docs, notes, runs = {}, {}, []
    for d in dirs:
        run = load(os.path.join(d, "run.json")) or {}
        if run:
            runs.append(run)
        for name, _, _ in SECTIONS:
            doc = load(os.path.join(d, name + ".json"))
            if doc:
                docs[name] = doc
                notes.pop(name, None)
                if run.get("notes", {}).get(name):  # a run note beside results: it partly failed
                    doc["run_note"] = run["notes"][name]
            elif run.get("notes", {}).get(name) and name not in docs:
                notes[name] = run["notes"][name]
    return docs, notes, runs


def render(dirs, note=""):
    docs, notes, runs = gather(dirs)
    dates = sorted({d.get("date", "") for d in docs.values()} | {r.get("date", "") for r in runs} - {""})
    commits = sorted({d.get("commit", "unknown") for d in docs.values()})
    when = dates[-1] if dates else "never (no results)"
    commit = ", ".join(f"`{c}`" for c in commits) if commits else "none"
    out = ["# cllm benchmarks", "",
           f"Generated by `bench/report.py` from `bench/run.sh`'s results: latest {when}, cllm commit{'s' if len(commits) > 1 else ''} "
           f"{commit}. Not edited by hand: to regenerate, on a GPU machine with a build (`./build.sh`) and "
           "torch + transformers:", "",
           "    CLLM=./cllm OUT=/tmp/bench bench/run.sh        # every section this machine can run; "
           "--sections single,quant,kv_fp8,attention,throughput,fixed_lengths,pipeline,tensor_parallel picks",
           "    cp /tmp/bench/BENCH.md BENCH.md; cp /tmp/bench/history.csv bench/history.csv", "",
           "or one section alone (`OUT=/tmp/bench bench/quant.sh`, ...) and `python3 bench/report.py /tmp/bench "
           "[MORE_FOLDERS] --out BENCH.md`, which also appends the figures to bench/history.csv (one row per figure "
           "per generation: the history). Every figure is set against its physical limit measured on the same "
           "device at the start of the same run (bench/limits.py: bytes over the device-to-device copy bandwidth, "
           "FLOPs over the bf16 dense matmul rate of torch.matmul 8192³) and, where a reference runs on the same "
           "machine (transformers, PyTorch SDPA flash and cuDNN, cllm's own bf16 path), as a ratio to it in the "
           "same run. Each table's device line names the device, commit, date and limits its figures come from.", ""]
    if note:
        out += [note, ""]
    out += ["Sections: " + " · ".join(f"[{title}](#{title.lower().replace(' ', '-')})" for _, title, _ in SECTIONS), ""]
    figures = []
    for name, title, how in SECTIONS:
        out += [f"## {title}", ""]
        doc = docs.get(name)
        if not doc:
            out += [f"Not run in this generation ({notes.get(name) or 'no results in the results folder'}).", ""]
            continue
        fig = Figures(doc)
        out += [f"{how}. {device_line(doc)}", ""]
        # the tensor-parallel section's throughput rows sit beside the pipeline section's --pp 1 and --pp 2
        extra = {"pipeline": docs.get("pipeline")} if name == "tensor_parallel" else {}
        out += RENDER[name](doc, fig, **extra)
        if doc.get("run_note"):
            out += [f"bench/run.sh: {doc['run_note']}.", ""]
        figures += fig.rows
    return "\n".join(out).rstrip() + "\n", figures


def append_history(path, rows):
    key = lambda r: tuple(r[k] for k in ("date", "commit", "device", "section", "model", "measure"))
    seen = set()
    if os.path.exists(path):
        with open(path, newline="") as f:
            seen = {key(r) for r in csv.DictReader(f)}
    new = [r for r in rows if key(r) not in seen]
    fresh = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HISTORY_FIELDS, lineterminator="\n")
        if fresh:
            w.writeheader()
        w.writerows(new)
    return len(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="results folder(s) of bench/run.sh or of the section scripts")
    ap.add_argument("--out", required=True, help="the BENCH.md to write")
    ap.add_argument("--history", default=os.path.join(HERE, "history.csv"), help="CSV to append to")
    ap.add_argument("--no-history", action="store_true")
    ap.add_argument("--note", default="", help="a paragraph under the header")
    a = ap.parse_args()
    for d in a.results:
        if not os.path.isdir(d):
            sys.exit(f"report.py: {d}: not a folder")
    text, figures = render(a.results, a.note)
    with open(a.out, "w") as f:
        f.write(text)
    added = 0 if a.no_history else append_history(a.history, figures)
    print(f"report.py: wrote {a.out} ({len(figures)} figures"
          + ("" if a.no_history else f"; {added} new rows in {a.history}") + ")")


if __name__ == "__main__":
    main()
