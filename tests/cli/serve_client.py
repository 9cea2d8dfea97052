"""serve_client.py — the client side of tests/cli/serve.sh: drives a running
`cllm serve` with the official openai package (and raw sockets for what a
client library never sends), printing "ok - NAME" / "not ok - NAME" lines.

    python serve_client.py PORT api       # the API on any model
    python serve_client.py PORT text      # answers that need a real model (stop, seed)
    python serve_client.py PORT key KEY   # --api-key: 401 without it, 200 with it
    python serve_client.py PORT disconnect
    python serve_client.py PORT conns N   # --max-connections N: one more gets 503
    python serve_client.py PORT load EXPECTED.jsonl N_CLIENTS   # every reply equals generate's
    python serve_client.py PORT wait-running N                  # /metrics until running == N
    python serve_client.py PORT logprobs GENERATED.jsonl        # logprobs equal generate's (greedy)
"""
import asyncio
import json
import socket
import sys
import time
import urllib.request

import openai

PORT = int(sys.argv[1])
BASE = f"http://127.0.0.1:{PORT}"
failed = 0


def check(name, cond, evidence=""):
    global failed
    if cond:
        print(f"ok - {name}")
    else:
        failed += 1
        print(f"not ok - {name}")
        if evidence:
            print(f"  {str(evidence)[:600]}")
    sys.stdout.flush()


def client(key="none"):
    return openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0, timeout=120)


def raw(request: bytes, read_all=True):
    """Sends bytes as they are; returns (status, body)."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    s.sendall(request)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if not read_all and b"\r\n\r\n" in data:
            break
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else -1
    return status, body


def http_get(path):
    with urllib.request.urlopen(BASE + path, timeout=30) as r:
        return r.status, r.read().decode()


def metrics():
    _, text = http_get("/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split()
            out[k] = float(v)
    return out


def error_of(exc):
    try:
        return exc.response.json()["error"]
    except Exception:
        return {}


def api():
    c = client()
    st, body = http_get("/health")
    check("GET /health is 200", st == 200, body)
    models = c.models.list()
    check("GET /v1/models names the model", len(models.data) == 1 and models.data[0].id, models)
    mid = models.data[0].id
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    ch = r.choices[0]
    check("chat completion: one choice, assistant message, usage",
          ch.message.role == "assistant" and isinstance(ch.message.content, str) and r.usage.completion_tokens <= 5
          and r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
          and r.object == "chat.completion" and r.model == mid and ch.finish_reason in ("stop", "length"), r)
    check("chat completion: logprobs null", ch.logprobs is None, r)
    r = c.completions.create(model=mid, prompt="Once upon", max_tokens=6)
    check("completion: text, length after 6 tokens",
          r.object == "text_completion" and r.usage.completion_tokens <= 6 and isinstance(r.choices[0].text, str)
          and (r.choices[0].finish_reason == "length") == (r.usage.completion_tokens == 6), r)
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=2,
                                  temperature=0)
    check("n=2: two choices, indexes 0 and 1", [x.index for x in r.choices] == [0, 1], r)
    check("n=2 at temperature 0: the same text", r.choices[0].message.content == r.choices[1].message.content, r)
    # streaming: chunks in OpenAI's shape, the role first, a finish reason last, usage when asked
    whole = c.completions.create(model=mid, prompt="Once upon", max_tokens=6, temperature=0)
    chunks = list(c.completions.create(model=mid, prompt="Once upon", max_tokens=6, temperature=0, stream=True))
    text = "".join(x.choices[0].text for x in chunks if x.choices)
    check("streamed completion equals the whole one", text == whole.choices[0].text, (text, whole))
    check("streamed completion: last chunk has the finish reason",
          chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason, chunks[-1])
    chunks = list(c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            stream=True, n=2, stream_options={"include_usage": True}))
    roles = [x.choices[0].delta.role for x in chunks if x.choices and x.choices[0].delta.role]
    finals = [x.choices[0].index for x in chunks if x.choices and x.choices[0].finish_reason]
    check("streamed chat n=2: a role chunk and a finish per choice", len(roles) == 2 and sorted(finals) == [0, 1],
          chunks)
    check("streamed chat: usage in the last chunk",
          chunks[-1].usage is not None and not chunks[-1].choices and chunks[-1].usage.completion_tokens <= 10,
          chunks[-1])
    # errors: OpenAI's shape, the request alone fails
    for name, kw, param in [("temperature -1", {"temperature": -1}, "temperature"),
                            ("top_p 0", {"top_p": 0}, "top_p"), ("n 0", {"n": 0}, "n"),
                            ("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
                            ("top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs")]:
        try:
            c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], **kw)
            check(f"{name}: 400", False, "accepted")
        except openai.BadRequestError as e:
            err = error_of(e)
            check(f"{name}: 400 naming the field", err.get("param") == param and err.get("type") ==
                  "invalid_request_error" and err.get("message"), err)
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                  logprobs=True, top_logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    check("logprobs true, top_logprobs 2: an entry per token, 2 alternatives, greedy = the first",
          lp is not None and len(lp.content) == r.usage.completion_tokens and
          all(len(t.top_logprobs) == 2 and t.logprob <= 0 and t.logprob == t.top_logprobs[0].logprob
              and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in lp.content), r)
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    check("no logprobs asked: logprobs null", r.choices[0].logprobs is None, r)
    try:
        c.chat.completions.create(model=mid, messages=[{"role": "wizard", "content": "Hi"}])
        check("bad role: 400", False)
    except openai.BadRequestError as e:
        check("bad role: 400", "role" in error_of(e).get("param", ""), error_of(e))
    body = b'{"messages": [{"role": "user", "content": "Hi"}'
    st, b = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(body), body))
    err = json.loads(b or b"{}").get("error", {})
    check("malformed JSON: 400 with an OpenAI error body", st == 400 and err.get("type") == "invalid_request_error"
          and "message" in err and "param" in err and "code" in err, (st, b))
    st, b = raw(b"GET /v1/nothing HTTP/1.1\r\nConnection: close\r\n\r\n")
    check("unknown path: 404", st == 404 and b"error" in b, (st, b))
    st, b = raw(b"GET /v1/chat/completions HTTP/1.1\r\nConnection: close\r\n\r\n")
    check("wrong method: 405", st == 405, (st, b))
    st, b = raw(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    check("chunked body: 411", st == 411, (st, b))
    st, b = raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", read_all=False)
    check("Content-Length over --max-request-bytes: 413", st == 413, (st, b))
    st, b = raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}")
    check("duplicate Content-Length: 400", st == 400, (st, b))
    st, b = raw(b"\x00\x01garbage\r\n\r\n")
    check("garbage: 400", st == 400, (st, b))
    # keep-alive: two requests on one connection
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    s.sendall(b"GET /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    check("keep-alive: two pipelined requests, two answers", data.count(b"HTTP/1.1 200") == 2, data)
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    check("the server still serves after the bad requests", r.choices[0].message.role == "assistant", r)
    m = metrics()
    check("/metrics: the gauges and counters", all(k in m for k in [
        "cllm_requests_waiting", "cllm_requests_running", "cllm_kv_blocks_used", "cllm_kv_blocks_total",
        "cllm_generation_tokens_total", "cllm_prompt_tokens_total", "cllm_tokens_per_second"])
          and m["cllm_generation_tokens_total"] > 0 and m["cllm_kv_blocks_total"] > 0, m)


def text():
    c = client()
    msgs = [{"role": "user", "content": "Count from one to ten in words, separated by commas."}]
    full = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 3]  # a stop string from the greedy reply itself
    cut = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0, stop=["\x01zz", stop])
    ch = cut.choices[0]
    check("stop: the text ends before the first stop string, finish_reason stop",
          len(full) > 8 and ch.message.content == full[:full.index(stop)] and ch.finish_reason == "stop",
          (full, stop, ch))
    ch = c.completions.create(model="m", prompt="One, two, three,", max_tokens=20, temperature=0, stop=" five")
    check("stop as a string", ch.choices[0].finish_reason in ("stop", "length") and " five" not in ch.choices[0].text, ch)
    kw = dict(model="m", messages=[{"role": "user", "content": "Write a poem about the sea."}], max_tokens=24,
              temperature=1.0, top_p=1.0)
    a = [c.chat.completions.create(seed=1234, **kw).choices[0].message.content for _ in range(2)]
    b = c.chat.completions.create(seed=1234, n=2, **kw)
    check("seed: the same seed gives the same text", a[0] == a[1], a)
    check("seed with n=2: choice 0 is the seed's, choice 1 another draw",
          b.choices[0].message.content == a[0] and b.choices[1].message.content != a[0], (a, b))


def logprobs(generated):
    """The requests of GENERATED.jsonl (written by cllm generate with logprobs,
    greedy) through the server, whole and streamed: the same tokens and
    logprobs (both on the fp32 CPU backend: 1e-4)."""
    c = client()
    for line in open(generated):
        want = json.loads(line)
        req = want["request"]
        if "messages" in req:
            kw = dict(model="m", messages=req["messages"], max_tokens=req["max_tokens"], temperature=0,
                      logprobs=True, top_logprobs=req["top_logprobs"])
            got = c.chat.completions.create(**kw).choices[0].logprobs.content
            streamed = [t for ch in c.chat.completions.create(stream=True, **kw) for ch_ in ch.choices
                        if ch_.logprobs for t in ch_.logprobs.content]
            ref = want["logprobs"]["content"]
            pairs = lambda l: [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in l]
            refp = [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]]) for t in ref]
            for name, g in (("whole", pairs(got)), ("streamed", pairs(streamed))):
                ok = len(g) == len(refp) and all(a[0] == b[0] and abs(a[1] - b[1]) < 1e-4 and
                                                 [x[0] for x in a[2]] == [x[0] for x in b[2]] and
                                                 all(abs(x[1] - y[1]) < 1e-4 for x, y in zip(a[2], b[2]))
                                                 for a, b in zip(g, refp))
                check(f"chat logprobs {want['id']} {name} = generate's", ok, (g[:3], refp[:3]))
        else:
            kw = dict(model="m", prompt=req["prompt"], max_tokens=req["max_tokens"], temperature=0,
                      logprobs=req["logprobs"])
            got = c.completions.create(**kw).choices[0].logprobs
            toks, lps = [], []
            for ch in c.completions.create(stream=True, **kw):
                for ch_ in ch.choices:
                    if ch_.logprobs:
                        toks += ch_.logprobs.tokens
                        lps += ch_.logprobs.token_logprobs
            ref = want["logprobs"]
            for name, t, l, top in (("whole", got.tokens, got.token_logprobs, got.top_logprobs),
                                    ("streamed", toks, lps, None)):
                ok = t == ref["tokens"] and len(l) == len(ref["token_logprobs"]) and \
                    all(abs(a - b) < 1e-4 for a, b in zip(l, ref["token_logprobs"])) and \
                    (top is None or [sorted(x) for x in top] == [sorted(x) for x in ref["top_logprobs"]])
                check(f"completion logprobs {want['id']} {name} = generate's", ok, (t, l, ref))


def key(k):
    try:
        client("wrong").models.list()
        check("wrong API key: 401", False)
    except openai.AuthenticationError as e:
        check("wrong API key: 401 with an OpenAI error body", error_of(e).get("message"), error_of(e))
    st, b = raw(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    check("no API key: 401", st == 401, (st, b))
    r = client(k).completions.create(model="m", prompt="Hi", max_tokens=2)
    check("right API key: 200", r.usage.completion_tokens <= 2, r)
    st, _ = http_get("/health")
    check("/health needs no key", st == 200)


def disconnect():
    c = client()
    before = metrics()["cllm_generation_tokens_total"]
    stream = c.completions.create(model="m", prompt="Once upon a time", max_tokens=3000, temperature=0, stream=True)
    got = 0
    for _ in stream:
        got += 1
        if got == 3:
            break
    stream.close()
    t0 = time.time()
    m = metrics()
    while m["cllm_requests_running"] != 0 and time.time() - t0 < 20:
        time.sleep(0.1)
        m = metrics()
    check("disconnect mid-stream: the sequence is freed (running 0)", m["cllm_requests_running"] == 0, m)
    made = m["cllm_generation_tokens_total"] - before
    check("disconnect mid-stream: generation stopped early", made < 1000, made)
    time.sleep(0.5)
    check("disconnect mid-stream: nothing more generated", metrics()["cllm_generation_tokens_total"] - before == made)
    r = c.completions.create(model="m", prompt="Hi", max_tokens=3)
    check("after a disconnect the server still serves", r.usage.completion_tokens == 3, r)


async def load(expected_path, n_clients):
    want = {}
    with open(expected_path) as f:
        for line in f:
            o = json.loads(line)
            want[o["id"]] = o["text"]
    reqs = {}
    with open(expected_path.replace(".out", ".in")) as f:
        for line in f:
            o = json.loads(line)
            reqs[o["id"]] = o
    c = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(n_clients)

    async def one(rid, o):
        async with sem:
            if "messages" in o:
                s = await c.chat.completions.create(model="m", messages=o["messages"], max_tokens=o["max_tokens"],
                                                    stream=True)
                parts = [x.choices[0].delta.content or "" async for x in s if x.choices]
            else:
                s = await c.completions.create(model="m", prompt=o["prompt"], max_tokens=o["max_tokens"], stream=True)
                parts = [x.choices[0].text async for x in s if x.choices]
            return rid, "".join(parts)

    t0 = time.time()
    got = dict(await asyncio.gather(*[one(k, v) for k, v in reqs.items()]))
    dt = time.time() - t0
    diff = [k for k in reqs if got.get(k) != want.get(k)]
    check(f"load: {len(reqs)} streamed requests, {n_clients} at once, in {dt:.1f} s: every reply complete and "
          "equal to cllm generate's", not diff,
          "; ".join(f"{k}: served {got.get(k)!r} generate {want.get(k)!r}" for k in diff[:3]) + f" ({len(diff)} differ)")


def conns(limit):
    held = [socket.create_connection(("127.0.0.1", PORT), timeout=30) for _ in range(limit)]
    time.sleep(0.5)  # the server has accepted them
    st, b = raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    check(f"--max-connections {limit}: one more connection gets 503", st == 503 and b"error" in b, (st, b))
    for h in held:
        h.close()
    time.sleep(0.5)
    st, b = raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    check(f"--max-connections {limit}: served again once they close", st == 200, (st, b))
    # limit clients, each reconnecting as soon as its answer ends: never 503
    # (the slot was held through the closing linger: 503s under a full load)
    import concurrent.futures
    def one_client(_):
        return [raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")[0] for _ in range(25)]
    with concurrent.futures.ThreadPoolExecutor(limit) as ex:
        got = [st for sts in ex.map(one_client, range(limit)) for st in sts]
    check(f"--max-connections {limit}: {limit} clients reconnecting at once are never refused",
          got.count(200) == len(got), {st: got.count(st) for st in set(got)})


def wait_running(n):
    t0 = time.time()
    while time.time() - t0 < 60:
        if metrics()["cllm_requests_running"] >= n:
            return
        time.sleep(0.05)


what = sys.argv[2]
if what == "api":
    api()
elif what == "text":
    text()
elif what == "key":
    key(sys.argv[3])
elif what == "disconnect":
    disconnect()
elif what == "load":
    asyncio.run(load(sys.argv[3], int(sys.argv[4])))
elif what == "conns":
    conns(int(sys.argv[3]))
elif what == "logprobs":
    logprobs(sys.argv[3])
elif what == "wait-running":
    wait_running(int(sys.argv[3]))
sys.exit(1 if failed else 0)
