#!/usr/bin/env python3
"""make_dummy_model.py — a model folder with config.json and the benchmark
tokenizer but no weight files, for `cllm ... --dummy-weights` (random weights
of the config's shapes, made in memory): shapes too big for the disk of the
GPU machine (a Llama-3-70B in bf16 is 141 GB).

    python3 bench/make_dummy_model.py llama3-8b /tmp/l8      # A/B runs without a 16 GB file to make
    python3 bench/make_dummy_model.py llama3-70b /tmp/l70
    python3 bench/make_dummy_model.py llama3.1-405b /tmp/l405
    python3 bench/make_dummy_model.py gemma2-9b /tmp/g9      # windows + soft-caps, head size 256

`--dummy-weights=q4_k` (or q8_0, q4_0, q4_1, q5_0, q5_1, q5_k, q6_k) makes the matrices
random but valid GGUF blocks of that type instead of bf16, as a llama.cpp
file of that type holds them (LM head Q6_K): the 405B shape is then 229 GB
(`cllm info /tmp/l405 --dummy-weights=q4_k --pp 8` shows the split).
"""
import argparse
import json
import os

from bench_tokenizer import make_tokenizer

# Published sizes (Meta-Llama-3-8B, Meta-Llama-3-70B, Meta-Llama-3.1-405B config.json).
SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8),
    "llama3.1-405b": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                          num_key_value_heads=8),
    # gemma-2-9b config.json: windows of 4096 on every other layer, soft-caps 50 / 30, head size 256
    "gemma2-9b": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=3584,
                      intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=256, vocab_size=256000, rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096,
                      query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", hidden_act=None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", help="folder to write (created)")
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    vocab = shape.get("vocab_size", 128256)
    tok, tok_cfg, bos, eos = make_tokenizer(vocab)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, max_position_embeddings=8192,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
               torch_dtype="bfloat16", bos_token_id=bos, eos_token_id=eos)
    cfg.update(shape)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    os.makedirs(a.out, exist_ok=True)
    for name, obj in (("config.json", cfg), ("tokenizer.json", tok), ("tokenizer_config.json", tok_cfg)):
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(obj, f)
    print(f"{a.out}: {a.shape} config and tokenizer, no weights (run cllm with --dummy-weights[=q4_k])")


if __name__ == "__main__":
    main()
