"""sdpa_reference.py — PyTorch's scaled_dot_product_attention on the shapes of
bench/attention.sh, timed like bench_attention.c (CUDA events, 5 warm-ups,
median of 30); prints one RESULT line per shape.

prefill: flash backend (FlashAttention-2), causal, 32 heads, head size 128;
decode: dense GQA 32q/8kv (enable_gqa), head size 128, default backend."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

D = 128


def median_ms(fn):
    times = []
    for i in range(35):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 5:
            times.append(a.elapsed_time(b))
    times.sort()
    return (times[14] + times[15]) / 2


def prefill(n, length):
    q, k, v = (torch.randn(n, 32, length, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    flops = 4.0 * length * length * 32 * D / 2 * n
    print(f"RESULT prefill {n}x{length} {ms:.4f} {flops / ms / 1e9:.1f}")


def decode(n, ctx):
    q = torch.randn(n, 32, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(n, 8, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    nbytes = 2.0 * n * ctx * 8 * D * 2
    print(f"RESULT decode {n}x{ctx} {ms:.4f} {nbytes / ms / 1e9:.3f}")


if __name__ == "__main__":
    prefill(16, 1024)
    prefill(4, 4096)
    prefill(1, 16384)
    decode(8, 4096)
    decode(8, 32768)
