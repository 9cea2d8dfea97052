#!/usr/bin/env bash
# logprobs.sh — `cllm generate` log-probabilities on the tiny llama (CPU,
# fp32): values against transformers (tests/fixtures/logprobs/llama.json,
# written by tests/fixtures/make_logprobs_refs.py; |diff| <= 1e-4), both
# OpenAI shapes, echo, vLLM's prompt_logprobs under chunking and the prefix
# cache, "logprobs": null when not asked, and bad values failing alone.
source "$(dirname "$0")/lib.sh"

REF=tests/fixtures/logprobs/llama.json
G="$CLLM generate -m tests/fixtures/tiny/llama.gguf --cpu --temp 0 -c 64 --ignore-eos --overwrite"

# ---- values against transformers; the same with 4 logits rows a step (the
# prompt scored over several chunks) and with the prompt in the prefix cache
cat > "$TMP/gold.jsonl" <<'J'
{"id":"warm","prompt":"Hello world","max_tokens":1}
{"id":"c","prompt":"Hello world","max_tokens":6,"logprobs":5,"echo":true,"prompt_logprobs":5}
{"id":"chat","messages":[{"role":"user","content":"Hello world"}],"max_tokens":3,"logprobs":true,"top_logprobs":4}
J
for run in plain small; do
    extra=""; [ $run = small ] && extra="--max-seqs 4 --max-batched-tokens 8"
    if $G $extra --ordered -i "$TMP/gold.jsonl" -o "$TMP/gold_$run.out" 2> "$TMP/err"; then ok "logprobs/run-$run"
    else notok "logprobs/run-$run" "$(tail -3 "$TMP/err")"; continue; fi
    python3 - "$REF" "$TMP/gold_$run.out" > "$TMP/cmp" 2>&1 <<'PY'
import json, sys
class D(dict):  # keeps every member: token strings may repeat (pieces of one UTF-8 character)
    pass
def hook(pairs):
    d = D(pairs); d.pairs = pairs; return d
ref = json.load(open(sys.argv[1]))
lines = {l["id"]: l for l in (json.loads(x, object_pairs_hook=hook) for x in open(sys.argv[2]))}
c, tol, bad = lines["c"], 1e-4, []
def near(a, b, what):
    if a is None or b is None or abs(a - b) > tol: bad.append(f"{what}: {a} vs {b}")
lp, plp, n = c["logprobs"], c["prompt_logprobs"], len(ref["prompt_ids"])
assert c["text"] == ref["prompt"] + ref["text"], (c["text"], ref["text"])
assert len(lp["tokens"]) == n + len(ref["greedy"]), lp["tokens"]
# text_offset: byte offsets into the echoed text; an added BOS takes no byte of it
off, raw = lp["text_offset"], c["text"].encode()
assert off[0] == 0 and off[-1] + len(lp["tokens"][-1].encode()) == len(raw), (off, lp["tokens"], c["text"])
assert all(raw[off[i]:off[i + 1]].decode(errors="replace") == lp["tokens"][i] for i in range(1, n - 1)), (off, lp["tokens"])
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and plp[0] is None
for i in range(1, n):
    near(lp["token_logprobs"][i], ref["prompt_logprobs"][i], f"echo logprob {i}")
    first = next(iter(plp[i].items()))  # the prompt token comes first
    if int(first[0]) != ref["prompt_ids"][i]: bad.append(f"prompt id {i}: {first[0]} vs {ref['prompt_ids'][i]}")
    near(first[1]["logprob"], ref["prompt_logprobs"][i], f"prompt_logprobs {i}")
for k, g in enumerate(ref["greedy"]):
    near(lp["token_logprobs"][n + k], g["logprob"], f"token {k}")
    got = [v for _, v in lp["top_logprobs"][n + k].pairs]
    want = [t[1] for t in g["top5"]]
    if len(got) != 5: bad.append(f"top {k}: {got}")
    for j, (a, w) in enumerate(zip(got, want)): near(a, w, f"top {k}.{j}")
ch = lines["chat"]["logprobs"]["content"]
assert len(ch) == 3 and all(len(e["top_logprobs"]) == 4 for e in ch), ch
for e in ch:
    assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and all(0 <= b < 256 for b in e["bytes"])
    assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6  # greedy: the top-1
    assert set(e["top_logprobs"][0]) == {"token", "logprob", "bytes"}
assert "logprobs" not in lines["warm"] and "prompt_logprobs" not in lines["warm"]
print("\n".join(bad) if bad else "same")
sys.exit(1 if bad else 0)
PY
    if [ $? = 0 ]; then ok "logprobs/transformers-$run"; else notok "logprobs/transformers-$run" "$(head -c 1500 "$TMP/cmp")"; fi
done

# ---- OpenAI batch output: null when not asked, the shapes when asked
cat > "$TMP/oa.jsonl" <<'J'
{"custom_id":"none","method":"POST","url":"/v1/completions","body":{"prompt":"Hi","max_tokens":2}}
{"custom_id":"cmp","method":"POST","url":"/v1/completions","body":{"prompt":"Hi","max_tokens":2,"logprobs":2}}
{"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"logprobs":true}}
{"custom_id":"bad","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":21}}
J
$G -i "$TMP/oa.jsonl" -o "$TMP/oa.out" 2> "$TMP/err"
python3 - "$TMP/oa.out" > "$TMP/cmp" 2>&1 <<'PY'
import json, sys
l = {x["custom_id"]: x for x in map(json.loads, open(sys.argv[1]))}
ch = lambda k: l[k]["response"]["body"]["choices"][0]
assert ch("none")["logprobs"] is None
c = ch("cmp")["logprobs"]
assert set(c) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"} and len(c["tokens"]) == 2, c
assert all(len(t) == 2 for t in c["top_logprobs"]) and c["text_offset"][0] == 0
h = ch("chat")["logprobs"]["content"]
assert len(h) == 2 and all(e["top_logprobs"] == [] for e in h), h
assert l["bad"]["response"] is None and "top_logprobs" in l["bad"]["error"]["message"]
print("shapes ok")
PY
if [ $? = 0 ]; then ok "logprobs/openai-shapes"; else notok "logprobs/openai-shapes" "$(head -c 1200 "$TMP/cmp")"; fi

# ---- bad values fail their own request; the others run
cat > "$TMP/bad.jsonl" <<'J'
{"id":"b1","prompt":"Hi","logprobs":21}
{"id":"b2","prompt":"Hi","logprobs":true}
{"id":"b3","prompt":"Hi","top_logprobs":3}
{"id":"b4","messages":[{"role":"user","content":"Hi"}],"logprobs":3}
{"id":"b5","messages":[{"role":"user","content":"Hi"}],"top_logprobs":3}
{"id":"b6","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"echo":true}
{"id":"b7","prompt":"Hi","prompt_logprobs":-1}
{"id":"b8","prompt":"Hi","echo":"yes"}
{"id":"b9","prompt":"Hi","logprobs":1.5}
{"id":"good","prompt":"Hi","max_tokens":2,"logprobs":0}
J
$G -i "$TMP/bad.jsonl" -o "$TMP/bad.out" 2> "$TMP/err"
python3 - "$TMP/bad.out" > "$TMP/cmp" 2>&1 <<'PY'
import json, sys
l = {x["id"]: x for x in map(json.loads, open(sys.argv[1]))}
want = {"b1": "'logprobs'", "b2": "'logprobs'", "b3": "'top_logprobs'", "b4": "'logprobs'", "b5": "'top_logprobs'",
        "b6": "'echo'", "b7": "'prompt_logprobs'", "b8": "'echo'", "b9": "'logprobs'"}
for k, f in want.items():
    assert f in l[k].get("error", ""), (k, l[k])
g = l["good"]
assert "error" not in g and len(g["logprobs"]["tokens"]) == 2 and g["logprobs"]["top_logprobs"] == [{}, {}], g
print("errors ok")
PY
if [ $? = 0 ]; then ok "logprobs/bad-values"; else notok "logprobs/bad-values" "$(head -c 1200 "$TMP/cmp")"; fi
