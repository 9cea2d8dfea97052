#!/usr/bin/env python3
"""fp8_weights_quality.py — the reference side of the FP8-weights quality
comparison (issue 40): teacher-forced KL divergence and top-1 agreement of
e4m3 weights against the model's own, by transformers in fp32 on the windows
`cllm perplexity` scores (see kv_quality.py).

Variants, on every Linear of the layers (q, k, v, o, gate, up, down; not the
embedding or an LM head tied to it):
  w8a16   weights e4m3 with amax/448 per output row, activations as they are
  w8a8    the same weights, activations rounded to e4m3 per token (amax/448),
          as cllm's --weights fp8 multiplies them (FP8 x FP8)

    python3 bench/fp8_weights_quality.py MODEL_DIR TEXT_FILE [--ctx 512]
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


class Fp8Linear(torch.nn.Module):
    def __init__(self, lin, act):
        super().__init__()
        self.weight = torch.nn.Parameter(e4m3_rows(lin.weight.data), requires_grad=False)
        self.bias = lin.bias
        self.act = act

    def forward(self, x):
        if self.act:
            x = e4m3_rows(x)
        return F.linear(x, self.weight, self.bias)


def swap(model, act):
    for name, mod in list(model.model.named_modules()):
        for child, sub in list(mod.named_children()):
            if isinstance(sub, torch.nn.Linear):
                setattr(mod, child, Fp8Linear(sub, act))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(a.model)
    ids = tok(open(a.text, encoding="utf-8").read())["input_ids"]
    load = lambda: AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    ref = window_logprobs(load(), ids, a.ctx)
    print(f"# {a.model}: {len(ids)} tokens, ctx {a.ctx}, {ref.shape[0]} positions, fp32 reference")
    for name, act in (("w8a16", False), ("w8a8", True)):
        m = load()
        swap(m, act)
        q = window_logprobs(m, ids, a.ctx)
        kl = (ref.exp() * (ref - q)).sum(-1)
        top1 = (q.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(f"{name:6s} mean KL {kl.mean().item():.6f}  top-1 {100 * top1:.2f}%  positions {ref.shape[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
