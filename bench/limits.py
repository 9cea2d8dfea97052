#!/usr/bin/env python3
"""limits.py — the two physical limits every benchmark figure is set against,
measured on this machine's GPU 0 at the start of a run (torch):

  copy bandwidth: a device-to-device copy of COPY_GIB GiB (tensor.copy_),
      bytes = read + write (2 x size), median of 20 after 3 warm-ups;
  bf16 dense matmul rate: torch.matmul of two random 8192 x 8192 bf16
      matrices, 2 x 8192^3 FLOPs, median of 50 after 10 warm-ups;
  FP8 dense matmul rate (where the GPU and torch have one: compute
      capability 8.9+): torch._scaled_mm of the same sizes in e4m3 with unit
      scales and bf16 out, fast accumulation off as cllm's FP8 GEMM runs it;
      left out of the JSON where it cannot run.

    python3 bench/limits.py --json OUT/limits.json [--copy-gib 4]

Times by CUDA events around each call.
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402


def event_ms(fn, warm, reps):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def fp8_matmul_ms(n, dev):
    """Times of torch._scaled_mm on n x n e4m3 matrices, or None where this GPU or torch has no FP8 matmul."""
    try:
        if torch.cuda.get_device_capability(dev) < (8, 9) or not hasattr(torch, "float8_e4m3fn"):
            return None
        x = (torch.randn(n, n, device=dev) / 4).to(torch.float8_e4m3fn)
        y = (torch.randn(n, n, device=dev) / 4).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device=dev)
        return event_ms(lambda: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16, use_fast_accum=False),
                        10, 50)
    except Exception as e:  # noqa: BLE001 -- an FP8 rate is optional; the run must go on without it
        print(f"limits.py: no FP8 matmul rate: {e}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--copy-gib", type=float, default=4.0)
    ap.add_argument("--n", type=int, default=8192, help="matmul size")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("limits.py: no CUDA device")
    dev = torch.device("cuda", 0)

    nbytes = int(a.copy_gib * 2**30)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy = event_ms(lambda: dst.copy_(src), 3, 20)
    del src, dst
    torch.cuda.empty_cache()

    n = a.n
    x = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    y = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    z = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
    mm = event_ms(lambda: torch.matmul(x, y, out=z), 10, 50)

    del x, y, z
    torch.cuda.empty_cache()
    fp8 = fp8_matmul_ms(n, dev)

    copy_ms, mm_ms = statistics.median(copy), statistics.median(mm)
    flops = 2.0 * n ** 3
    lim = {
        "device": results.device()["name"].split(" + ")[0],
        "torch_device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": results.now(),
        "copy_tbps": 2 * nbytes / (copy_ms / 1e3) / 1e12,
        "copy_best_tbps": 2 * nbytes / (min(copy) / 1e3) / 1e12,
        "copy_bytes": 2 * nbytes,
        "copy_ms": copy_ms,
        "matmul_tflops": flops / (mm_ms / 1e3) / 1e12,
        "matmul_best_tflops": flops / (min(mm) / 1e3) / 1e12,
        "matmul_n": n,
        "matmul_ms": mm_ms,
        "source": f"measured in this run: device-to-device copy of {a.copy_gib:g} GiB (read + write bytes), "
                  f"median of 20; torch.matmul {n}^3 bf16 on random data, median of 50",
    }
    if fp8:
        lim.update(fp8_matmul_tflops=flops / (statistics.median(fp8) / 1e3) / 1e12,
                   fp8_matmul_best_tflops=flops / (min(fp8) / 1e3) / 1e12, fp8_matmul_ms=statistics.median(fp8))
        lim["source"] += f"; torch._scaled_mm {n}^3 e4m3 (fast accumulation off), median of 50"
    with open(a.json, "w") as f:
        json.dump(lim, f, indent=1)
    fp8_note = f", fp8 matmul {lim['fp8_matmul_tflops']:.1f} TFLOP/s" if "fp8_matmul_tflops" in lim else ""
    print(f"limits on {lim['device']}: copy {lim['copy_tbps']:.3f} TB/s, bf16 matmul {lim['matmul_tflops']:.1f} TFLOP/s"
          f"{fp8_note}")


if __name__ == "__main__":
    main()
