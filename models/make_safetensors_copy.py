#!/usr/bin/env python3
"""make_safetensors_copy.py — a Hugging Face (safetensors) copy of SmolLM2-135M-Instruct.

cllm reads both GGUF files and HF folders. Only the GGUF is downloaded, so this
script makes the HF folder from it: transformers reads the GGUF (dequantizing
the Q8_0/Q4_1 weights), then save_pretrained writes config.json,
generation_config.json, model.safetensors and the tokenizer files
(tokenizer.json, tokenizer_config.json, chat template) to
$CLLM_MODELS/smollm2-135m-instruct-st/ (CLLM_MODELS defaults to models/cache,
which git ignores).

The default dtype is float32: the weights are then exactly the dequantized GGUF
values, so tests/fixtures/real/smollm2-135m-instruct.ref.json applies to the copy
as well. --dtype bfloat16 writes half the bytes (about 270 MB instead of 540 MB).

Run:   python3 models/make_safetensors_copy.py [--dtype float32|bfloat16] [--out DIR]
Needs: torch, transformers 5.x, gguf, accelerate (pip install accelerate).
"""

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent
MODELS_DIR = Path(os.environ.get("CLLM_MODELS", HERE / "cache"))
GGUF_NAME = "smollm2-135m-instruct.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def plain_copy(model, dtype):
    """transformers marks a GGUF-loaded model as 'quantized with gguf' and refuses
    to save it, although its weights are ordinary dequantized tensors: rebuild
    the same architecture from a clean config and move the weights over."""
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    plain = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(k != "lm_head.weight" for k in missing):
        sys.exit(f"weights do not fit the rebuilt model: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    return plain


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--out", type=Path, default=MODELS_DIR / "smollm2-135m-instruct-st")
    args = ap.parse_args()

    if not (MODELS_DIR / GGUF_NAME).is_file():
        sys.exit(f"{MODELS_DIR / GGUF_NAME}: not found (run models/fetch.sh or set CLLM_MODELS)")
    tok = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR), gguf_file=GGUF_NAME,
                                                 dtype=DTYPES[args.dtype])
    model = plain_copy(model, DTYPES[args.dtype])
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.out} ({args.dtype}, {total / 1e6:.0f} MB): "
          + ", ".join(sorted(p.name for p in args.out.iterdir())))


if __name__ == "__main__":
    main()
