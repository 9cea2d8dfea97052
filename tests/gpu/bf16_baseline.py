# bf16_baseline.py — how far transformers itself lands from the fp32 reference
# logits of the tiny fixtures when run in bf16 (and in fp32 with bf16-rounded
# weights): the error a bf16 engine legitimately has on these random-weight
# models. test_cuda_forward's BF16_REF table holds this script's output
# (H200, transformers in the GPU machine's image); metrics as there: per row
# max|d|/max|ref| and ||d||/||ref||, worst row of all prompts.
#   python3 tests/gpu/bf16_baseline.py tests/fixtures
import base64, json, sys, numpy as np, torch, transformers
fx = sys.argv[1]
for arch in ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt-oss"]:
    ref = json.load(open(f"{fx}/tiny/{arch}.ref.json"))
    res = {}
    for mode in ["bf16", "w-bf16"]:
        m = transformers.AutoModelForCausalLM.from_pretrained(f"{fx}/tiny/{ref['hf_dir']}", torch_dtype=torch.float32,
                                                              attn_implementation="eager").cuda().eval()
        if mode == "bf16": m = m.to(torch.bfloat16)
        else:
            with torch.no_grad():
                for p in m.parameters():
                    if p.dim() >= 2: p.copy_(p.to(torch.bfloat16).float())
        mx = [0, 0]
        for pr in ref["prompts"]:
            want = np.frombuffer(base64.b64decode(pr["logits_f32_b64"]), dtype=np.float32).reshape(pr["n_tokens"], -1)
            with torch.no_grad():
                got = m(torch.tensor([pr["ids"]]).cuda()).logits[0].float().cpu().numpy()
            d = got - want
            mx[0] = max(mx[0], float((np.abs(d).max(1) / np.abs(want).max(1)).max()))
            mx[1] = max(mx[1], float((np.linalg.norm(d, axis=1) / np.linalg.norm(want, axis=1)).max()))
        res[mode] = mx
    print(f"# baseline {arch:8s} transformers bf16: max-metric {res['bf16'][0]:.2e} norm {res['bf16'][1]:.2e} | fp32 acts + bf16 weights: max {res['w-bf16'][0]:.2e} norm {res['w-bf16'][1]:.2e}", flush=True)
