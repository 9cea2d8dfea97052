#!/usr/bin/env python3
"""fp8_weights_quality.py — the reference side of the FP8-weights quality
comparison (issue 40): teacher-forced KL divergence and top-1 agreement of
e4m3 weights against the model's own, by transformers in fp32 on the windows
`cllm perplexity` scores (see kv_quality.py).

Variants, on every Linear of the layers (q, k, v, o, gate, up, down; not the
embedding or an LM head tied to it):
  bf16    weights rounded to bf16 (the method's floor: what bf16 weights, the
          issue's reference, already move against fp32)
  w8a16   weights e4m3 with amax/448 per output row, activations as they are
  w8a8    the same weights, activations rounded to e4m3 per token (amax/448),
          as cllm's --weights fp8 multiplies them (FP8 x FP8)
  w8a16-b32  weights e4m3 with amax/448 per 32 input values (not a cllm
          format: is the scale or e4m3's 3-bit mantissa what costs?)
Each line gives KL and top-1 against fp32, and top-1 against the bf16 variant.

    python3 bench/fp8_weights_quality.py MODEL_DIR TEXT_FILE [--ctx 512] [--max-tokens N] [--gguf FILE]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from kv_quality import window_logprobs


def e4m3_rows(w):
    """Quantize-dequantize each row: e4m3 with amax/448 a row (an all-zero row stays zero)."""
    scale = w.abs().amax(dim=-1, keepdim=True) / 448.0
    safe = torch.where(scale > 0, scale, 1.0)
    return (w / safe).clamp(-448, 448).to(torch.float8_e4m3fn).to(w.dtype) * safe


def e4m3_b32(w):
    """e4m3 with amax/448 per 32 input values of a row: does a finer scale than the row's help e4m3?"""
    return e4m3_rows(w.reshape(w.shape[0], -1, 32)).reshape(w.shape)


class Fp8Linear(torch.nn.Module):
    def __init__(self, lin, act, bf16=False, b32=False):
        super().__init__()
        w = lin.weight.data
        q = w.to(torch.bfloat16).to(w.dtype) if bf16 else e4m3_b32(w) if b32 else e4m3_rows(w)
        self.weight = torch.nn.Parameter(q, requires_grad=False)
        self.bias = lin.bias
        self.act = act

    def forward(self, x):
        if self.act:
            x = e4m3_rows(x)
        return F.linear(x, self.weight, self.bias)


def swap(model, act, bf16=False, b32=False):
    for name, mod in list(model.model.named_modules()):
        for child, sub in list(mod.named_children()):
            if isinstance(sub, torch.nn.Linear):
                setattr(mod, child, Fp8Linear(sub, act, bf16, b32))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--gguf", default=None, help="a GGUF file in MODEL_DIR (dequantized to fp32 by transformers)")
    a = ap.parse_args()
    extra = {"gguf_file": a.gguf} if a.gguf else {}
    tok = AutoTokenizer.from_pretrained(a.model, **extra)
    ids = tok(open(a.text, encoding="utf-8").read())["input_ids"]
    if a.max_tokens:
        ids = ids[:a.max_tokens]
    load = lambda: AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, **extra).eval()
    ref = window_logprobs(load(), ids, a.ctx)
    print(f"# {a.model}: {len(ids)} tokens, ctx {a.ctx}, {ref.shape[0]} positions, fp32 reference")
    top_bf16 = None
    variants = (("bf16", False, True, False), ("w8a16", False, False, False), ("w8a8", True, False, False),
                ("w8a16-b32", False, False, True))
    for name, act, bf16, b32 in variants:
        m = load()
        swap(m, act, bf16, b32)
        q = window_logprobs(m, ids, a.ctx)
        kl = (ref.exp() * (ref - q)).sum(-1)
        top = q.argmax(-1)
        top1 = (top == ref.argmax(-1)).float().mean().item()
        top_bf16 = top if bf16 else top_bf16
        vs_bf16 = (top == top_bf16).float().mean().item()
        print(f"{name:9s} mean KL {kl.mean().item():.6f}  top-1 {100 * top1:.2f}% (vs bf16 {100 * vs_bf16:.2f}%)  "
              f"positions {ref.shape[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
