#!/usr/bin/env bash
# bench/serve_throughput.sh — the offline rate through `cllm serve` against
# `cllm generate`'s on the same prompts, on the GPU machine: N raw prompts of
# random lengths (about 128-1024 tokens, as bench/throughput.sh makes them),
# 256 tokens each (EOS ignored), greedy; generate reads them from a file,
# serve gets them from C concurrent HTTP clients (POST /v1/completions, each
# client sending its next prompt when the last answer is in). Prints both
# rates (generated tokens over wall time) and their ratio.
#   bench/serve_throughput.sh [MODEL_DIR] [N=512] [C=256]
# Environment: see bench/lib.sh (CLLM, OUT, BENCH_MODELS); ST_LEN="LO HI" the
# prompts' token range and ST_TOKENS the tokens per prompt (a smoke test on a
# tiny model: ST_LEN="8 64" ST_TOKENS=16).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
MODEL=${1:-}
N=${2:-512}
C=${3:-256}
[ -n "$MODEL" ] || MODEL=$(bench_model llama3-8b)
read -r LO HI <<< "${ST_LEN:-128 1024}"
python3 bench/random_prompts.py "$N" "$LO" "$HI" --jsonl "${ST_TOKENS:-256}" > "$OUT/st-prompts.jsonl"
t0=$(date +%s.%N)
"$CLLM" generate --overwrite -m "$MODEL" -i "$OUT/st-prompts.jsonl" -o "$OUT/st-generate.jsonl" --ignore-eos --temp 0 \
    --max-seqs "$C" -v 2> "$OUT/st-generate.log"
t1=$(date +%s.%N)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$CLLM" serve -m "$MODEL" --port "$PORT" --ignore-eos --temp 0 --max-seqs "$C" --max-connections "$C" \
    2> "$OUT/st-serve.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
# generate's time: its steps (-v), without the model load serve's clock also leaves out
steps=$(sed -n 's/^steps took \([0-9.]*\) s.*/\1/p' "$OUT/st-generate.log" | tail -1)
python3 - "$PORT" "$OUT/st-prompts.jsonl" "$C" "${steps:-$(python3 -c "print($t1 - $t0)")}" "$OUT/st-generate.jsonl" <<'PY'
import asyncio, json, sys, time, urllib.request
port, path, clients, gen_wall, gen_out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
for _ in range(600):  # the model loads: up to 5 minutes
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
        break
    except Exception:
        time.sleep(0.5)
reqs = [json.loads(l) for l in open(path)]

async def post(body):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    await w.drain()
    raw = await r.read()
    w.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"serve answered {head[:80]!r}")
    return json.loads(payload)["usage"]["completion_tokens"]

async def main():
    queue = list(reversed(reqs))
    total = 0
    async def worker():
        nonlocal total
        while queue:
            q = queue.pop()
            n = await post({"model": "m", "prompt": q["prompt"], "max_tokens": q["max_tokens"], "temperature": 0})
            total += n  # not `total += await ...`: that reads total before the await
    t0 = time.time()
    await asyncio.gather(*[worker() for _ in range(clients)])
    return total, time.time() - t0

total, wall = asyncio.run(main())
gen_tokens = sum(json.loads(l)["completion_tokens"] for l in open(gen_out))
g, s = gen_tokens / gen_wall, total / wall
print(f"| path | prompts | tokens | wall s | tokens/s |\n|---|---|---|---|---|")
print(f"| generate (file) | {len(reqs)} | {gen_tokens} | {gen_wall:.1f} | {g:.0f} |")
print(f"| serve ({clients} HTTP clients) | {len(reqs)} | {total} | {wall:.1f} | {s:.0f} |")
print(f"serve / generate: {s / g:.3f} (generate: its steps' time; serve: first request to last answer)")
PY
