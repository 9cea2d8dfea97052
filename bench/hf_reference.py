#!/usr/bin/env python3
"""hf_reference.py — the same measurements as `cllm bench`, with Hugging Face
transformers (bf16, SDPA attention) on the same model folder, for the ratio.

    python3 bench/hf_reference.py MODEL_DIR --prompt-lens 512,4096 --ctx 128,4096 \
        --decode-tokens 64 --reps 3 --json hf.json

Prefill: one forward over T random ids, logits of the last row only
(logits_to_keep=1), no cache; one warm-up, the median of --reps. Decode, batch
1: a forward over C ids fills the KV cache, then single-token forwards with the
cache; one warm-up step, the median of --decode-tokens steps. Each timed call
ends with torch.cuda.synchronize(). Load: from_pretrained onto the GPU.
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def ints(s):
    v = [int(x) for x in s.split(",")]
    if any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"'{s}': positive integers expected")
    return v


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-lens", type=ints, default=[512, 4096])
    ap.add_argument("--ctx", type=ints, default=[128, 4096])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    t_load, model = timed(lambda: transformers.AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.bfloat16, device_map=a.device, attn_implementation="sdpa"))
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator(device=a.device).manual_seed(a.seed)
    rand = lambda n: torch.randint(0, vocab, (1, n), device=a.device, generator=gen)
    res = {"model": a.model, "impl": f"transformers {transformers.__version__}, torch {torch.__version__}, sdpa, bf16",
           "load_s": t_load, "prefill": [], "decode": []}

    with torch.inference_mode():
        for T in a.prompt_lens:
            run = lambda: model(rand(T), use_cache=False, logits_to_keep=1)
            timed(run)  # warm-up
            times = [timed(run)[0] for _ in range(a.reps)]
            s = statistics.median(times)
            res["prefill"].append({"tokens": T, "seconds": s, "tok_s": T / s})
            print(f"hf prefill {T}: {T / s:.1f} tok/s", flush=True)
        for C in a.ctx:
            out = model(rand(C), use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            step = lambda: model(rand(1), past_key_values=cache, use_cache=True, logits_to_keep=1)
            timed(step)  # warm-up
            times = [timed(step)[0] for _ in range(a.decode_tokens)]
            s = statistics.median(times)
            del out, cache
            # the same through generate(): (N+1 new tokens - 1 new token) / N, greedy, EOS ignored
            ids = rand(C)
            gen_n = lambda n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                             min_new_tokens=n, do_sample=False, pad_token_id=0)
            gen_n(2)  # warm-up
            t_n = timed(lambda: gen_n(a.decode_tokens + 1))[0]
            t_1 = min(timed(lambda: gen_n(1))[0] for _ in range(2))
            g = (t_n - t_1) / a.decode_tokens
            d = {"ctx": C, "batch": 1, "steps": a.decode_tokens, "step_s": s, "tok_s": 1 / s}
            if g > 0:  # else too noisy to use
                d.update(generate_step_s=g, generate_tok_s=1 / g)
            res["decode"].append(d)
            print(f"hf decode at {C}: {1 / s:.1f} tok/s (forward loop), "
                  f"{1 / g if g > 0 else float('nan'):.1f} tok/s (generate)", flush=True)
            torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
