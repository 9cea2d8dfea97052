#!/usr/bin/env python3
"""kv_quality.py — the reference side of the KV-cache quality comparison
(issue 40): teacher-forced KL divergence and top-1 agreement of a quantized
KV cache against the unquantized one, computed by transformers in fp32 on the
same windows `cllm perplexity` scores (disjoint windows of --ctx tokens, each
from an empty cache, every token but a window's first scored).

Quantized caches, applied to every layer's keys and values after rope and
before attention (so a token's own key is quantized too, as in cllm, which
writes the cache before reading it):
  int8-b32   int8 codes with one absmax scale per 32 values (the block format
             published as keeping 96.8% top-1 on a 35B model)
  fp8-head   e4m3 codes with one amax/448 scale per (token, KV head): the
             same arithmetic as cllm's `--kv-dtype fp8` (base/dtype.c
             fp8_quantize_row), so its figures check cllm's own
  fp8-b32    e4m3 with one scale per 32 values (is the scale or the 3-bit
             mantissa what costs?)
  fp8-tensor e4m3 with one static scale per layer for K and one for V,
             amax / 448 over the first window (the calibration pass runs it
             unquantized first), saturating: a checkpoint's per-tensor
             k_scale / v_scale, calibrated as vLLM's calculate_kv_scales
  fp8-calib  e4m3 with one static scale per layer and KV head (K and V
             apart), amax / 448 over the first window: cllm's `--kv-scales
             calibrate` when its first step is the first window
  e5m2-head  e5m2 (2 mantissa bits, range 57344) with one amax/57344 scale
             per (token, KV head): is e5m2's range worth its mantissa bit?

    python3 bench/kv_quality.py MODEL TEXT_FILE [--ctx 512] [--max-tokens N] [--gguf FILE]

MODEL: a transformers model folder (safetensors + tokenizer), or with --gguf
the folder holding that GGUF file (transformers dequantizes it to fp32: the
reference is then the dequantized weights). Prints one line per format: mean
KL(ref || quantized), top-1 agreement, positions.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def int8_b32(x):
    """Quantize-dequantize the last dimension in blocks of 32: int8, absmax/127 a block."""
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // 32, 32)
    scale = b.abs().amax(dim=-1, keepdim=True) / 127.0
    q = torch.where(scale > 0, torch.round(b / torch.where(scale > 0, scale, 1.0)).clamp(-127, 127), 0.0)
    return (q * scale).reshape(shape)


def fp8_head(x):
    """Quantize-dequantize each head vector (last dimension): e4m3, amax/448 a vector, saturating."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 448.0
    safe = torch.where(scale > 0, scale, 1.0)
    q = (x / safe).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype)
    return torch.where(scale > 0, q * scale, 0.0)


def fp8_b32(x):
    """e4m3 with one amax/448 scale per 32 values: does a finer scale than the head vector's help e4m3?"""
    shape = x.shape
    return fp8_head(x.reshape(*shape[:-1], shape[-1] // 32, 32)).reshape(shape)


def e5m2_head(x):
    """e5m2 per head vector: amax/57344 a vector, saturating."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 57344.0
    safe = torch.where(scale > 0, scale, 1.0)
    q = (x / safe).clamp(-57344, 57344).to(torch.float8_e5m2).to(x.dtype)
    return torch.where(scale > 0, q * scale, 0.0)


def fp8_static(x, scale):
    """e4m3 with a fixed scale per KV head (scale [KV], x [B, KV, T, D]), saturating."""
    s = scale.to(x.dtype).reshape(1, -1, 1, 1)
    return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s


# Each mode maps (key, value, layer) to the quantized pair; the static ones
# read CALIB (per layer: K and V amax per KV head over the first window).
CALIB = {}


def per_vector(fn):
    return lambda k, v, l: (fn(k), fn(v))


def calib_scale(amax):
    return torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))


def fp8_tensor(k, v, l):
    ka, va = CALIB[l]
    return fp8_static(k, calib_scale(ka.max()).expand_as(ka)), fp8_static(v, calib_scale(va.max()).expand_as(va))


def fp8_calib(k, v, l):
    ka, va = CALIB[l]
    return fp8_static(k, calib_scale(ka)), fp8_static(v, calib_scale(va))


def record(k, v, l):
    """The calibration pass: amax per KV head, keys and values unchanged."""
    CALIB[l] = (k.abs().amax(dim=(0, 2, 3)).float(), v.abs().amax(dim=(0, 2, 3)).float())
    return k, v


MODES = {"int8-b32": per_vector(int8_b32), "fp8-head": per_vector(fp8_head), "fp8-b32": per_vector(fp8_b32),
         "fp8-tensor": fp8_tensor, "fp8-calib": fp8_calib, "e5m2-head": per_vector(e5m2_head)}
ACTIVE = {"fn": None}


def quantized_sdpa(module, query, key, value, attention_mask, **kw):
    fn = ACTIVE["fn"]
    if fn is not None:
        key, value = fn(key, value, module.layer_idx)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)


def window_logprobs(model, ids, ctx):
    """Log-softmax rows of every scored position (each window's tokens but its first predict the next)."""
    out = []
    for start in range(0, len(ids) - 1, ctx):
        w = ids[start:start + ctx + 1]
        if len(w) < 2:
            break
        with torch.no_grad():
            logits = model(torch.tensor([w[:-1]])).logits[0].float()
        out.append(F.log_softmax(logits, dim=-1))
    return torch.cat(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--gguf", default=None, help="a GGUF file in MODEL (dequantized to fp32 by transformers)")
    a = ap.parse_args()
    AttentionInterface.register("quantized_kv", quantized_sdpa)
    extra = {"gguf_file": a.gguf} if a.gguf else {}
    tok = AutoTokenizer.from_pretrained(a.model, **extra)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="quantized_kv",
                                                 **extra)
    model.eval()
    ids = tok(open(a.text, encoding="utf-8").read())["input_ids"]
    if a.max_tokens:
        ids = ids[:a.max_tokens]
    ACTIVE["fn"] = record  # the static modes' scales: the first window, unquantized
    window_logprobs(model, ids[:a.ctx + 1], a.ctx)
    ACTIVE["fn"] = None
    ref = window_logprobs(model, ids, a.ctx)
    ref_top = ref.argmax(-1)
    print(f"# {a.model}: {len(ids)} tokens, ctx {a.ctx}, {ref.shape[0]} positions, fp32 reference")
    for name, fn in MODES.items():
        ACTIVE["fn"] = fn
        q = window_logprobs(model, ids, a.ctx)
        ACTIVE["fn"] = None
        kl = (ref.exp() * (ref - q)).sum(-1)
        top1 = (q.argmax(-1) == ref_top).float().mean().item()
        print(f"{name:10s} mean KL {kl.mean().item():.6f}  top-1 {100 * top1:.2f}%  positions {ref.shape[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
