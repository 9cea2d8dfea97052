"""sdpa_reference.py — PyTorch's scaled_dot_product_attention on the shapes of
bench/attention.sh, through each of its flash (FlashAttention-2) and cuDNN
backends, timed like bench_attention.c (CUDA events, 5 warm-ups, median of
30); prints one line per shape and backend:

    RESULT KIND SHAPE BACKEND MS RATE      (RATE: TFLOP/s for prefill, TB/s for decode)
    SKIP KIND SHAPE BACKEND REASON         (the backend does not take the shape)

prefill: causal, 32 heads, head size 128, FLOPs 4 L^2 H D / 2 per sequence;
decode: one query row per sequence, GQA 32q/8kv (enable_gqa), head size 128,
bytes = the K and V read once.

Variants (bench_attention's "variant=NAME" rows): SDPA has no sliding window
nor soft-cap of its own (a dense mask would send it to its slow backends), so
those rows run PyTorch's flex_attention (compiled; block-sparse masks skip the
tiles outside a window) as backend "flex", the line ending "variant=NAME";
FLOPs and bytes counted as bench_attention counts them (a window: the pairs
and keys inside it). Sinks have no flex form here: they stand against
cllm's own plain kernel."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

D = 128
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


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


def each_backend(kind, shape, fn, work, unit_scale):
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                fn()  # raises when the backend does not take these inputs
                ms = median_ms(fn)
        except RuntimeError as e:
            reason = " ".join(str(e).split())[:160] or "not available"
            print(f"SKIP {kind} {shape} {name} {reason}", flush=True)
            continue
        print(f"RESULT {kind} {shape} {name} {ms:.4f} {work / ms / unit_scale:.3f}", flush=True)


def prefill(n, length):
    q, k, v = (torch.randn(n, 32, length, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * length * length * 32 * D / 2 * n
    each_backend("prefill", f"{n}x{length}", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 flops, 1e9)


def decode(n, ctx):
    q = torch.randn(n, 32, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(n, 8, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    nbytes = 2.0 * n * ctx * 8 * D * 2
    each_backend("decode", f"{n}x{ctx}", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 nbytes, 1e9)
    del q, k, v
    torch.cuda.empty_cache()


WINDOW, SOFTCAP = 4096, 50.0


def flex_rows():
    """The window4096 and softcap50 rows (1 x 16384 prefill, 8 x 32768 decode) through flex_attention."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        for v in ("window4096", "softcap50"):
            for kind, shape in (("prefill", "1x16384"), ("decode", "8x32768")):
                print(f"SKIP {kind} {shape} flex no flex_attention in this torch ({e}) variant={v}", flush=True)
        return
    flex = torch.compile(flex_attention, dynamic=False)
    cap = lambda score, b, h, q, kv: SOFTCAP * torch.tanh(score / SOFTCAP)

    def run(kind, shape, variant, fn, work, unit_scale):
        try:
            fn()  # compiles
            ms = median_ms(fn)
        except Exception as e:  # noqa: BLE001 (a compile or backend failure of any kind: that row is skipped)
            reason = " ".join(str(e).split())[:160] or type(e).__name__
            print(f"SKIP {kind} {shape} flex {reason} variant={variant}", flush=True)
            return
        print(f"RESULT {kind} {shape} flex {ms:.4f} {work / ms / unit_scale:.3f} variant={variant}", flush=True)

    L = 16384
    q, k, v = (torch.randn(1, 32, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    causal = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, L, device="cuda")
    window = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < WINDOW), None, None, L, L, device="cuda")
    pairs = sum(min(i + 1, WINDOW) for i in range(L))
    run("prefill", f"1x{L}", "window4096", lambda: flex(q, k, v, block_mask=window), 4.0 * pairs * 32 * D, 1e9)
    run("prefill", f"1x{L}", "softcap50", lambda: flex(q, k, v, score_mod=cap, block_mask=causal),
        4.0 * L * L / 2 * 32 * D, 1e9)
    del q, k, v
    n, ctx = 8, 32768
    q = torch.randn(n, 32, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(n, 8, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    last = ctx - 1  # the row's position: it sees keys (last - WINDOW, last]
    dwin = create_block_mask(lambda b, h, qi, ki: last - ki < WINDOW, None, None, 1, ctx, device="cuda")
    run("decode", f"{n}x{ctx}", "window4096", lambda: flex(q, k, v, block_mask=dwin, enable_gqa=True),
        2.0 * n * WINDOW * 8 * D * 2, 1e9)
    run("decode", f"{n}x{ctx}", "softcap50", lambda: flex(q, k, v, score_mod=cap, enable_gqa=True),
        2.0 * n * ctx * 8 * D * 2, 1e9)
    del q, k, v
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(f"# torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}")
    prefill(16, 1024)
    prefill(4, 4096)
    prefill(1, 16384)
    decode(8, 4096)
    decode(8, 32768)
    decode(1, 131072)
    flex_rows()
