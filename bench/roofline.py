#!/usr/bin/env python3
"""roofline.py — the fastest a `cllm generate` run could have gone on this
device, from what its steps did (stdlib only; no GPU needed).

Each step of the run (`cllm generate --steps-csv FILE`) ran some rows
(prefill and decode), drew some tokens, read some context from the KV cache
and computed some attention pairs. Its floor is the slower of its two limits:

    FLOPs = 2 x layer matrix params x rows        (every row goes through every layer matrix)
          + 2 x LM-head params x drawn rows       (only the rows that draw get logits)
          + 4 x layers x query heads x head dim x attention pairs   (QK^T and PV)
    bytes = weight bytes (layers + LM head: what a step reads once)
          + KV bytes per token x context tokens   (each sequence's cache, read once)
    floor = max(FLOPs / matmul rate, bytes / copy rate)

summed over the steps. The rates are bench/limits.py's (limits.json): the
bf16 matmul rate through cuBLAS and the device-to-device copy rate (read +
write bytes per second). With FP8 layer matrices (an FP8 checkpoint, or a run
with --weights fp8 / --dummy-weights=fp8) their bytes count one a parameter and
their FLOPs go at the measured FP8 matmul rate (limits.json's
fp8_matmul_tflops; the LM head stays bf16, attention runs in bf16); where
that rate was not measured the bf16 one stands in, and the summary says so. Norms, rope, sampling and the embedding lookup are
left out (small), so the floor is a little low: a percentage of it is a
little generous, never too hard.

    python3 bench/roofline.py --model DIR --steps steps.csv --limits limits.json \\
        [--output-tokens N] [--wall S] [--kv-bytes 2] [--json OUT.json]

The model is a Hugging Face folder (config.json; bytes from the safetensors
headers when they are there, else from the config at --weight-bytes per
parameter). Prints one line, and with --json writes the figures.
"""
import argparse
import csv
import glob
import json
import os
import re
import struct
import sys

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1}


def fp8_layers_in_args(args):
    """Whether `cllm` options make the layer matrices FP8 (--weights fp8, --dummy-weights=fp8)."""
    return re.search(r"--(weights|dummy-weights)[= ]fp8\b", args or "") is not None


def generate_limits(log):
    """The step limits a `cllm generate -v` run took and the preemptions it made, from its log's text."""
    took = re.search(r"^cllm generate: ([0-9]+) sequences and ([0-9]+) tokens per step", log or "", re.M)
    preempted = [int(n) for n in re.findall(r"([0-9]+) preempted", log or "")]
    out = {"preempted": max(preempted) if preempted else 0}
    if took:
        out.update(max_seqs=int(took.group(1)), max_batched_tokens=int(took.group(2)))
    return out


def option_count(args, name):
    """The count a `cllm` option gives in args (--pp N, --tp N), 1 where it is not there."""
    m = re.search(re.escape(name) + r"[ =]([0-9]+)\b", args or "")
    return int(m.group(1)) if m else 1


def gpus_in_args(args):
    """GPUs a run takes: --pp stages x --tp ranks (a --gpus list naming a GPU twice is not looked at)."""
    return option_count(args, "--pp") * option_count(args, "--tp")


def kv_elem_bytes_in_args(args):
    """Bytes a K/V element takes in the cache under these `cllm` options (--kv-dtype fp8: 1)."""
    return 1 if re.search(r"--kv-dtype[= ]fp8\b", args or "") else 2


def shape_from_config(cfg, weight_bytes_per_param=2.0, fp8_layers=False):
    """The shape figures of a config.json dict (dense decoders: llama, gemma, qwen, mistral); fp8_layers:
    the layer matrices take one byte a parameter (their per-row scales left out: 4 bytes a row)."""
    c = cfg.get("text_config", cfg)
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or hidden // heads
    ffn, vocab = c["intermediate_size"], c["vocab_size"]
    per_layer = hidden * heads * hd + 2 * hidden * kv_heads * hd + heads * hd * hidden + 3 * hidden * ffn
    layer_params, head_params = layers * per_layer, vocab * hidden
    layer_bytes = layer_params * (1.0 if fp8_layers else weight_bytes_per_param)
    return {"layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": hd,
            "layer_params": layer_params, "head_params": head_params, "fp8_layers": fp8_layers,
            "weight_bytes": layer_bytes + head_params * weight_bytes_per_param}


def model_shape(folder, weight_bytes_per_param=2.0, fp8_layers=False):
    """shape_from_config, with the layer and head parameters and the bytes a
    step reads taken from the safetensors headers when the folder has them
    (FP8 layer matrices there set fp8_layers)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    s = shape_from_config(cfg, weight_bytes_per_param, fp8_layers)
    if fp8_layers:
        return s  # the run made its FP8 matrices at load: the files' bytes are not what a step reads
    files = glob.glob(os.path.join(folder, "*.safetensors"))
    if not files:
        return s
    layers = head = embed = 0
    layer_bytes = head_bytes = embed_bytes = 0
    for p in files:
        with open(p, "rb") as f:
            hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for k, v in hdr.items():
            if not isinstance(v, dict) or "shape" not in v:
                continue
            n = 1
            for d in v["shape"]:
                n *= d
            nbytes = v["data_offsets"][1] - v["data_offsets"][0] if "data_offsets" in v else n * DTYPE_BYTES.get(
                v.get("dtype"), 2)
            if ".layers." in k:
                layer_bytes += nbytes
                layers += n if len(v["shape"]) == 2 else 0
                s["fp8_layers"] |= len(v["shape"]) == 2 and str(v.get("dtype", "")).startswith("F8")
            elif k.startswith("lm_head"):
                head, head_bytes = head + n, head_bytes + nbytes
            elif "embed_tokens" in k:
                embed, embed_bytes = embed + n, embed_bytes + nbytes
    if not head:  # tied: the embedding table is the LM head
        head, head_bytes = embed, embed_bytes
    s.update(layer_params=layers, head_params=head, weight_bytes=layer_bytes + head_bytes)
    return s


def kv_bytes_per_token(shape, kv_elem_bytes=2.0):
    return 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * kv_elem_bytes


def step_floor(step, shape, kv_token_bytes, flops_per_s, bytes_per_s, layer_flops_per_s=None):
    """(floor seconds, FLOPs, bytes, compute-bound?) of one step (a dict of the CSV's fields);
    layer_flops_per_s: the layer matrices' rate where it is not flops_per_s (FP8 matrices)."""
    rows, drawn = step["rows"], step["drawn"]
    layer_flops = 2.0 * shape["layer_params"] * rows
    other_flops = (2.0 * shape["head_params"] * drawn
                   + 4.0 * shape["layers"] * shape["heads"] * shape["head_dim"] * step["attn_pairs"])
    nbytes = shape["weight_bytes"] + kv_token_bytes * step["context_tokens"]
    tc = layer_flops / (layer_flops_per_s or flops_per_s) + other_flops / flops_per_s
    tb = nbytes / bytes_per_s
    return max(tc, tb), layer_flops + other_flops, nbytes, tc >= tb


def read_steps(path):
    """The steps of a --steps-csv file: rows (prefill + decode), drawn, context_tokens, attn_pairs, seconds."""
    steps = []
    with open(path) as f:
        for r in csv.DictReader(f):
            steps.append({"rows": int(r["prefill_rows"]) + int(r["decode_rows"]), "drawn": int(r["drawn"]),
                          "context_tokens": int(r["context_tokens"]), "attn_pairs": int(r["attn_pairs"]),
                          "seconds": float(r["seconds"])})
    return steps


def roofline(steps, shape, limits, kv_elem_bytes=2.0, output_tokens=None, wall_s=None, steps_s=None, gpus=1):
    """The run's floor and how close it came. limits: copy_tbps, matmul_tflops
    (limits.json). output_tokens default: the tokens the steps drew. steps_s:
    the steps' own time as the run measured it (default: the sum of the
    steps' seconds, which overcounts where steps overlap: --pp's virtual
    engines). gpus: the work of every step is shared by that many GPUs (--pp
    stages x --tp ranks), so the floor is the one-GPU floor over gpus."""
    fps, bps = limits["matmul_tflops"] * 1e12, limits["copy_tbps"] * 1e12
    fp8 = shape.get("fp8_layers", False)
    lfps = limits.get("fp8_matmul_tflops", 0) * 1e12 if fp8 else 0
    kvt = kv_bytes_per_token(shape, kv_elem_bytes)
    floor = flops = nbytes = 0.0
    compute_bound = 0
    for st in steps:
        t, f, b, c = step_floor(st, shape, kvt, fps, bps, lfps or None)
        floor, flops, nbytes, compute_bound = floor + t, flops + f, nbytes + b, compute_bound + c
    floor /= max(gpus, 1)
    if steps_s is None:
        steps_s = sum(st["seconds"] for st in steps)
    out = output_tokens if output_tokens is not None else sum(st["drawn"] for st in steps)
    r = {"steps": len(steps), "gpus": gpus, "compute_bound_steps": compute_bound, "flops": flops, "bytes": nbytes,
         "kv_bytes_per_token": kvt, "weight_bytes": shape["weight_bytes"], "output_tokens": out,
         "fp8_layers": fp8, "layer_matmul_tflops": (lfps or fps) / 1e12, "fp8_rate_measured": bool(lfps) or not fp8,
         "roofline_s": floor, "steps_s": steps_s,
         "roofline_tok_s": out / floor if floor else None,
         "steps_tok_s": out / steps_s if steps_s else None,
         "pct_steps": 100.0 * floor / steps_s if steps_s else None}
    if wall_s:
        r.update(wall_s=wall_s, wall_tok_s=out / wall_s, pct_wall=100.0 * floor / wall_s)
    return r


def summary(r):
    if not r["roofline_s"] or not r["steps_s"]:
        return f"no roofline: {r['steps']} steps"
    on = f", {r['gpus']} GPUs sharing each step" if r.get("gpus", 1) > 1 else ""
    if r.get("fp8_layers"):
        on += f", FP8 layer matrices at {r['layer_matmul_tflops']:.0f} TFLOP/s"
        if not r.get("fp8_rate_measured", True):
            on += " (the bf16 rate: no FP8 rate measured)"
    s = (f"roofline {r['roofline_tok_s']:,.0f} output tok/s ({r['roofline_s']:.2f} s over {r['steps']} steps, "
         f"{r['compute_bound_steps']} compute-bound{on}); over the steps {r['steps_tok_s']:,.0f} tok/s = "
         f"{r['pct_steps']:.1f}% of it")
    if r.get("wall_s"):
        s += f"; whole process {r['wall_tok_s']:,.0f} tok/s = {r['pct_wall']:.1f}%"
    return s


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model folder (config.json)")
    ap.add_argument("--steps", required=True, help="cllm generate --steps-csv file")
    ap.add_argument("--limits", required=True, help="bench/limits.py's limits.json")
    ap.add_argument("--output-tokens", type=int, help="default: the tokens the steps drew")
    ap.add_argument("--wall", type=float, help="the whole process's wall seconds")
    ap.add_argument("--kv-bytes", type=float, default=2.0, help="bytes per K/V element in the cache (fp8: 1)")
    ap.add_argument("--weight-bytes", type=float, default=2.0, help="bytes per parameter without safetensors")
    ap.add_argument("--fp8-layers", action="store_true", help="the run made FP8 layer matrices (--weights fp8)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    with open(a.limits) as f:
        limits = json.load(f)
    r = roofline(read_steps(a.steps), model_shape(a.model, a.weight_bytes, a.fp8_layers), limits, a.kv_bytes,
                 a.output_tokens, a.wall)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    print(summary(r))


if __name__ == "__main__":
    main(sys.argv[1:])
