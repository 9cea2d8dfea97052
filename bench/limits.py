#!/usr/bin/env python3
"""limits.py — the two physical limits every benchmark figure is set against,
measured on this machine's GPU 0 at the start of a run (torch):

  copy bandwidth: a device-to-device copy of COPY_GIB GiB (tensor.copy_),
      bytes = read + write (2 x size), median of 20 after 3 warm-ups;
  bf16 dense matmul rate: torch.matmul of two random 8192 x 8192 bf16
      matrices, 2 x 8192^3 FLOPs, median of 50 after 10 warm-ups.

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
    with open(a.json, "w") as f:
        json.dump(lim, f, indent=1)
    print(f"limits on {lim['device']}: copy {lim['copy_tbps']:.3f} TB/s, bf16 matmul {lim['matmul_tflops']:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
