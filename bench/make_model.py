#!/usr/bin/env python3
"""make_model.py — random-weight benchmark models in Hugging Face layout.

    python3 bench/make_model.py llama3-8b /tmp/cllm-bench/llama3-8b
    python3 bench/make_model.py gemma2-9b /tmp/cllm-bench/gemma2-9b
    python3 bench/make_model.py llama3-8b /tmp/x --tiny          # 2 layers, small widths: a smoke test
    python3 bench/make_model.py llama3-8b /tmp/l8.gguf --gguf    # one BF16 GGUF file (llama only), for
                                                                 # `cllm quantize` (issue 7's Q8_0 / Q4_K models)

Writes config.json, bf16 model*.safetensors (with an index when sharded),
tokenizer.json and tokenizer_config.json. Weights are initialised by
transformers' own init, in bf16, on the GPU when there is one (an 8B model in
seconds), with a fixed seed: two runs give the same weights.

The tokenizer is a byte-level BPE made up here, with exactly vocab_size
entries (256 bytes, then merges of byte pairs and triples, then <|bos|> and
<|eos|> as the last two ids), so the model's every id has a piece. Benchmarks
feed random ids; the tokenizer only has to load.
"""
import argparse
import json
import os
import struct
import sys
import time

import torch
import transformers

# Published sizes (Meta-Llama-3-8B, gemma-2-9b config.json).
SHAPES = {
    "llama3-8b": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig",
        args=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu"),
        tiny=dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=1536, vocab_size=32000),
    ),
    "gemma2-9b": dict(
        cls="Gemma2ForCausalLM", cfg="Gemma2Config",
        args=dict(hidden_size=3584, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=256, intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192,
                  rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096, query_pre_attn_scalar=256,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True,
                  hidden_activation="gelu_pytorch_tanh"),
        tiny=dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=128, intermediate_size=1536, vocab_size=32000, sliding_window=256,
                  query_pre_attn_scalar=128),
    ),
}


from bench_tokenizer import bytes_to_unicode, make_tokenizer  # noqa: E402 (torch-free, shared with make_dummy_model.py)


# GGUF v3, written by hand (the gguf package is not on every machine): value
# types and tensor types of ggml.
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_STR, GGUF_ARR = 4, 5, 6, 8, 9
GGML_F32, GGML_BF16 = 0, 30
GGUF_ALIGN = 32


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == GGUF_STR:
        return out + gguf_str(value)
    if vtype == GGUF_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == GGUF_STR:
            return out + b"".join(gguf_str(x) for x in items)
        return out + struct.pack("<%d%s" % (len(items), "i" if etype == GGUF_I32 else "I"), *items)
    return out + struct.pack({GGUF_U32: "<I", GGUF_I32: "<i", GGUF_F32: "<f"}[vtype], value)


def write_gguf_llama(path, args, tok, bos, eos, seed, device):
    """A llama GGUF as llama.cpp names it: random bf16 matrices (normal, std
    0.02 as transformers initialises them), norms of ones in f32; Wq/Wk are
    random, so llama.cpp's rope permutation of them does not matter."""
    C, F, L, V = args["hidden_size"], args["intermediate_size"], args["num_hidden_layers"], args["vocab_size"]
    H, KV = args["num_attention_heads"], args["num_key_value_heads"]
    D = C // H
    vocab = tok["model"]["vocab"]
    tokens = [None] * V
    for piece, i in vocab.items():
        tokens[i] = piece
    tokens[bos], tokens[eos] = "<|bos|>", "<|eos|>"
    types = [3 if i in (bos, eos) else 1 for i in range(V)]
    kvs = [
        gguf_kv("general.architecture", GGUF_STR, "llama"),
        gguf_kv("general.name", GGUF_STR, "random-llama3-8b-shape"),
        gguf_kv("general.file_type", GGUF_U32, 32),
        gguf_kv("llama.block_count", GGUF_U32, L),
        gguf_kv("llama.context_length", GGUF_U32, args["max_position_embeddings"]),
        gguf_kv("llama.embedding_length", GGUF_U32, C),
        gguf_kv("llama.feed_forward_length", GGUF_U32, F),
        gguf_kv("llama.attention.head_count", GGUF_U32, H),
        gguf_kv("llama.attention.head_count_kv", GGUF_U32, KV),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, args["rms_norm_eps"]),
        gguf_kv("llama.rope.freq_base", GGUF_F32, args["rope_theta"]),
        gguf_kv("llama.rope.dimension_count", GGUF_U32, D),
        gguf_kv("llama.vocab_size", GGUF_U32, V),
        gguf_kv("tokenizer.ggml.model", GGUF_STR, "gpt2"),
        gguf_kv("tokenizer.ggml.pre", GGUF_STR, "gpt-2"),
        gguf_kv("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, tokens)),
        gguf_kv("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, types)),
        gguf_kv("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, [a + " " + b for a, b in tok["model"]["merges"]])),
        gguf_kv("tokenizer.ggml.bos_token_id", GGUF_U32, bos),
        gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, eos),
    ]
    tensors = [("token_embd.weight", (V, C)), ("output_norm.weight", (C,)), ("output.weight", (V, C))]
    for l in range(L):
        b = f"blk.{l}."
        tensors += [(b + "attn_norm.weight", (C,)), (b + "attn_q.weight", (H * D, C)), (b + "attn_k.weight", (KV * D, C)),
                    (b + "attn_v.weight", (KV * D, C)), (b + "attn_output.weight", (C, H * D)),
                    (b + "ffn_norm.weight", (C,)), (b + "ffn_gate.weight", (F, C)), (b + "ffn_up.weight", (F, C)),
                    (b + "ffn_down.weight", (C, F))]
    infos, offset = b"", 0
    for name, shape in tensors:
        ggml = GGML_F32 if len(shape) == 1 else GGML_BF16
        nbytes = (4 if ggml == GGML_F32 else 2) * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        infos += gguf_str(name) + struct.pack("<I", len(shape)) + struct.pack("<%dQ" % len(shape), *reversed(shape))
        infos += struct.pack("<IQ", ggml, offset)
        offset += (nbytes + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
    gen = torch.Generator(device=device).manual_seed(seed)
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos)
        f.write(b"\0" * (-f.tell() % GGUF_ALIGN))
        for name, shape in tensors:
            if len(shape) == 1:
                data = torch.ones(shape, dtype=torch.float32).numpy().tobytes()
            else:
                w = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, 0.02, generator=gen)
                data = w.view(torch.int16).cpu().numpy().tobytes()
            f.write(data + b"\0" * (-len(data) % GGUF_ALIGN))
    return sum((s[0] * (s[1] if len(s) > 1 else 1)) for _, s in tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", help="folder to write (created)")
    ap.add_argument("--tiny", action="store_true", help="2-4 layers and small widths, same architecture")
    ap.add_argument("--gguf", action="store_true", help="write OUT as one BF16 GGUF file (llama3-8b only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    spec = SHAPES[a.shape]
    args = dict(spec["args"])
    if a.tiny:
        args.update(spec["tiny"])
    tok, tok_cfg, bos, eos = make_tokenizer(args["vocab_size"])
    if a.gguf:
        if a.shape != "llama3-8b":
            sys.exit("--gguf: llama3-8b only")
        t0 = time.time()
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        n = write_gguf_llama(a.out, args, tok, bos, eos, a.seed, a.device)
        print(f"{a.shape}{' (tiny)' if a.tiny else ''}: {n / 1e9:.3f} B parameters, BF16 GGUF, "
              f"{time.time() - t0:.1f} s -> {a.out}", flush=True)
        return
    cfg = getattr(transformers, spec["cfg"])(bos_token_id=bos, eos_token_id=eos, pad_token_id=None, **args)
    cfg.dtype = torch.bfloat16

    t0 = time.time()
    torch.manual_seed(a.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a.device):
        model = getattr(transformers, spec["cls"])(cfg)
    torch.set_default_dtype(old)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    t1 = time.time()

    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, max_shard_size="5GB")
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f, indent=1)
    t2 = time.time()
    print(f"{a.shape}{' (tiny)' if a.tiny else ''}: {n_params / 1e9:.3f} B parameters, bf16, "
          f"init {t1 - t0:.1f} s on {a.device}, save {t2 - t1:.1f} s -> {a.out}", flush=True)


if __name__ == "__main__":
    main()
