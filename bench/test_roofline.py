#!/usr/bin/env python3
"""test_roofline.py — bench/roofline.py's arithmetic on a case small enough
to work out by hand (stdlib only; run by tests/cli/roofline.sh, so by CI).
Prints "ok - ..." / "not ok - ..." lines."""
import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402

failed = 0


def check(name, got, want, tol=1e-9):
    global failed
    good = abs(got - want) <= tol * max(1.0, abs(want)) if isinstance(want, float) else got == want
    print(("ok - " if good else "not ok - ") + name + ("" if good else f"\n  got {got!r}, want {want!r}"))
    failed += not good


# A model: hidden 4, 1 layer, 2 query heads and 1 KV head of dim 2, FFN 8, vocab 10.
cfg = {"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
       "head_dim": 2, "intermediate_size": 8, "vocab_size": 10}
s = roofline.shape_from_config(cfg, weight_bytes_per_param=2)
# q 4x4=16, k 4x2=8, v 8, o 16, gate/up/down 3x4x8=96: 144; head 10x4 = 40
check("layer params from the config", s["layer_params"], 144)
check("head params from the config", s["head_params"], 40)
check("weight bytes from the config", s["weight_bytes"], 368)
# K and V, 1 layer, 1 KV head of 2, 2 bytes: 2 x 1 x 1 x 2 x 2 = 8 bytes a token
check("KV bytes per token", roofline.kv_bytes_per_token(s, 2), 8)

# The same model as safetensors: the header's bytes win (fp32 layers: 4 bytes each).
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, tie_word_embeddings=True), f)
    hdr, off = {}, 0
    for name, shape in [("model.embed_tokens.weight", [10, 4]), ("model.layers.0.self_attn.q_proj.weight", [4, 4]),
                        ("model.layers.0.self_attn.k_proj.weight", [2, 4]),
                        ("model.layers.0.self_attn.v_proj.weight", [2, 4]),
                        ("model.layers.0.self_attn.o_proj.weight", [4, 4]),
                        ("model.layers.0.mlp.gate_proj.weight", [8, 4]), ("model.layers.0.mlp.up_proj.weight", [8, 4]),
                        ("model.layers.0.mlp.down_proj.weight", [4, 8]),
                        ("model.layers.0.input_layernorm.weight", [4])]:
        n = shape[0] * (shape[1] if len(shape) > 1 else 1) * 4
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(hdr).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + b"\0" * off)
    st = roofline.model_shape(d)
    check("safetensors: layer matrix params", st["layer_params"], 144)
    check("safetensors: tied head = the embedding", st["head_params"], 40)
    # layers 144 x 4 + norm 4 x 4 = 592, head 40 x 4 = 160
    check("safetensors: weight bytes a step reads", st["weight_bytes"], 752)

# Two steps on a device of 1000 FLOP/s and 100 bytes/s (limits in T units).
lim = {"matmul_tflops": 1000 / 1e12, "copy_tbps": 100 / 1e12}
prefill = {"rows": 3, "drawn": 1, "context_tokens": 3, "attn_pairs": 6, "seconds": 4.0}
decode = {"rows": 2, "drawn": 2, "context_tokens": 9, "attn_pairs": 9, "seconds": 6.0}
# prefill: FLOPs 2*144*3 + 2*40*1 + 4*1*2*2*6 = 864 + 80 + 96 = 1040 -> 1.04 s;
#          bytes 368 + 8*3 = 392 -> 3.92 s: memory-bound, 3.92 s
t, f, b, c = roofline.step_floor(prefill, s, 8, 1000, 100)
check("prefill step FLOPs", f, 1040.0)
check("prefill step bytes", b, 392.0)
check("prefill step floor (memory-bound)", t, 3.92)
check("prefill step is memory-bound", c, False)
# decode: FLOPs 2*144*2 + 2*40*2 + 16*9 = 576 + 160 + 144 = 880 -> 0.88 s; bytes 368 + 72 = 440 -> 4.4 s
r = roofline.roofline([prefill, decode], s, lim, kv_elem_bytes=2, wall_s=20.0)
check("floor summed over the steps", r["roofline_s"], 8.32)
check("output tokens default to the drawn rows", r["output_tokens"], 3)
check("tok/s at the floor", r["roofline_tok_s"], 3 / 8.32)
check("% of the floor over the steps (10 s)", r["pct_steps"], 83.2)
check("% of the floor over the whole process (20 s)", r["pct_wall"], 41.6)
check("tok/s over the whole process", r["wall_tok_s"], 0.15)
# --pp 4's virtual engines overlap their steps: the run's own steps time (2.5 s, not the 10 s the steps sum to), and
# four GPUs share each step's work: the floor 8.32 / 4 = 2.08 s; 2.08 / 2.5 = 83.2%
r4 = roofline.roofline([prefill, decode], s, lim, kv_elem_bytes=2, steps_s=2.5, gpus=4)
check("--pp 4: the floor is one GPU's over four", r4["roofline_s"], 2.08)
check("--pp 4: % of the floor over the run's steps time", r4["pct_steps"], 83.2)
check("--pp 4: tok/s over the run's steps time", r4["steps_tok_s"], 3 / 2.5)
check("--pp 4: the summary says the GPUs share the steps", "4 GPUs sharing each step" in roofline.summary(r4), True)
# Compute-bound: a fast copy, a slow matmul.
r2 = roofline.roofline([prefill], s, {"matmul_tflops": 100 / 1e12, "copy_tbps": 1e6 / 1e12}, output_tokens=1)
check("a compute-bound step's floor is FLOPs / rate", r2["roofline_s"], 10.4)
check("compute-bound steps counted", r2["compute_bound_steps"], 1)

# FP8 layer matrices (--weights fp8): one byte a layer parameter, the head stays bf16: 144 + 80 = 224 bytes; the
# layers' FLOPs at the FP8 rate, the head's and attention's at bf16's.
s8 = roofline.shape_from_config(cfg, weight_bytes_per_param=2, fp8_layers=True)
check("fp8 layers: weight bytes", s8["weight_bytes"], 224.0)
# compute-bound prefill: layers 864 FLOPs at 400 FLOP/s = 2.16 s, head + attention 176 at 100 = 1.76 s: 3.92 s
lim8 = {"matmul_tflops": 100 / 1e12, "fp8_matmul_tflops": 400 / 1e12, "copy_tbps": 1e6 / 1e12}
r8 = roofline.roofline([prefill], s8, lim8, output_tokens=1)
check("fp8 layers: their FLOPs at the FP8 rate", r8["roofline_s"], 3.92)
check("fp8 layers: the summary says them, with a measured rate",
      ("FP8 layer matrices at" in roofline.summary(r8), "no FP8 rate" in roofline.summary(r8)), (True, False))
r8b = roofline.roofline([prefill], s8, {"matmul_tflops": 100 / 1e12, "copy_tbps": 1e6 / 1e12}, output_tokens=1)
check("fp8 layers, no FP8 rate measured: the bf16 rate stands in", r8b["roofline_s"], 10.4)
check("... and the summary says so", "no FP8 rate measured" in roofline.summary(r8b), True)
check("bf16 layers ignore an FP8 rate", roofline.roofline([prefill], s, lim8, output_tokens=1)["roofline_s"], 10.4)
check("options: --dummy-weights=fp8 makes FP8 layers", roofline.fp8_layers_in_args("--dummy-weights=fp8 --pp 2"), True)
check("options: --weights fp8 too", roofline.fp8_layers_in_args("--weights fp8"), True)
check("options: an fp8 cache alone does not", roofline.fp8_layers_in_args("--dummy-weights --kv-dtype fp8"), False)
check("options: --pp 2 --tp=4 take 8 GPUs", roofline.gpus_in_args("--dummy-weights --pp 2 --tp=4"), 8)
check("options: none given, one GPU; --tp 12 is not --tp 1", (roofline.gpus_in_args(""),
      roofline.option_count("--tp 12", "--tp")), (1, 12))
check("options: an fp8 cache is 1 byte an element", roofline.kv_elem_bytes_in_args("--kv-dtype fp8"), 1)
check("options: FP8 weights alone keep a bf16 cache", roofline.kv_elem_bytes_in_args("--dummy-weights=fp8"), 2)

# The limits and preemptions of a run, from its -v log.
log = ("cllm generate: 512 sequences and 8192 tokens per step (sequences: ...)\n"
       "step: 9 seqs, ..., 3 preempted, ...\nstep: 9 seqs, ..., 105 preempted, ...\n")
check("-v log: limits and the most preemptions", roofline.generate_limits(log),
      {"preempted": 105, "max_seqs": 512, "max_batched_tokens": 8192})
check("-v log: none said", roofline.generate_limits(""), {"preempted": 0})

# The CSV as cllm generate --steps-csv writes it.
with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    f.write("step,seconds,seqs,prefill_rows,decode_rows,rows_seen,drawn,context_tokens,attn_pairs\n"
            "1,0.5,2,13,0,13,2,13,51\n2,0.25,2,0,2,2,2,15,15\n")
steps = roofline.read_steps(f.name)
os.unlink(f.name)
check("CSV: rows are prefill + decode", [x["rows"] for x in steps], [13, 2])
check("CSV: pairs and context", (steps[0]["attn_pairs"], steps[1]["context_tokens"]), (51, 15))
sys.exit(1 if failed else 0)
