#!/usr/bin/env bash
# serve.sh — `cllm serve` end to end with the official openai Python package
# (installed on first use into a venv under tests/out/, or $CLLM_PYVENV), the
# client side in serve_client.py. On the tiny model: the API (chat,
# completions, streaming, n, usage, errors, 404/405/411/413, keep-alive,
# /metrics, /health), --api-key and --max-connections. On the default model (CPU): stop strings,
# seeds, a client that disconnects mid-stream, SIGTERM with a request
# running (it finishes, exit 0; after --grace it is cut short, exit 0), and
# a load test: 64 concurrent streaming clients whose greedy replies must
# equal `cllm generate --temp 0`'s for the same prompts.
source "$(dirname "$0")/lib.sh"
M=$MODELS/smollm2-135m-instruct.gguf
TINY=tests/fixtures/tiny/llama.gguf

# The openai package: in a venv, or (no python3-venv) pip's --target folder on PYTHONPATH.
VENV=${CLLM_PYVENV:-tests/out/pyvenv-openai}
if "$VENV/bin/python" -c 'import openai' 2> /dev/null; then
    PY="$VENV/bin/python tests/cli/serve_client.py"
elif PYTHONPATH="$VENV/site" python3 -c 'import openai' 2> /dev/null; then
    PY="env PYTHONPATH=$VENV/site python3 tests/cli/serve_client.py"
elif rm -rf "$VENV" && python3 -m venv "$VENV" > "$TMP/pip.log" 2>&1 && "$VENV/bin/pip" install -q openai >> "$TMP/pip.log" 2>&1; then
    PY="$VENV/bin/python tests/cli/serve_client.py"
elif rm -rf "$VENV" && python3 -m pip install -q --target "$VENV/site" openai >> "$TMP/pip.log" 2>&1; then
    PY="env PYTHONPATH=$VENV/site python3 tests/cli/serve_client.py"
else
    notok "install the openai package (pip, from PyPI)" "$(tail -5 "$TMP/pip.log")"; exit 1
fi

# py ARGS...: serve_client.py; a crash (no "not ok" of its own) fails too.
py() { $PY "$@" || notok "serve_client.py $*: exit $?"; }

# start NAME ARGS...: `cllm serve ARGS --port 0` in the background; sets
# PORT and PID once it listens (the port it bound is in its first line).
start() {
    local name=$1; shift
    $CLLM serve "$@" --port 0 2> "$TMP/$name.err" > /dev/null &
    PID=$!
    PORT=
    for _ in $(seq 600); do
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$TMP/$name.err")
        [ -n "$PORT" ] && return 0
        kill -0 $PID 2> /dev/null || break
        sleep 0.1
    done
    notok "$name: the server starts" "$(tail -5 "$TMP/$name.err")"
    return 1
}

# stop NAME: SIGTERM; the server must exit 0 within 30 s.
stop() {
    kill -TERM $PID
    for _ in $(seq 300); do kill -0 $PID 2> /dev/null || break; sleep 0.1; done
    if kill -0 $PID 2> /dev/null; then kill -KILL $PID; notok "$1: SIGTERM stops the server" "still running after 30 s"; return; fi
    wait $PID; local rc=$?
    [ $rc = 0 ] && ok "$1: SIGTERM stops the server, exit 0" || notok "$1: SIGTERM stops the server, exit 0" "exit $rc" "$(tail -3 "$TMP/$1.err")"
}

# ---- options checked before the model loads
expect_exit "serve --port 70000 exits 2" 2 $CLLM serve -m $TINY --cpu --port 70000
expect_grep "serve --port 70000 names the range" "$TMP/err" "--port 70000: must be an integer in \[0, 65535\]"
expect_exit "serve --max-request-bytes 10 exits 2" 2 $CLLM serve -m $TINY --cpu --max-request-bytes 10
expect_exit "serve --help lists --api-key" 0 $CLLM serve --help
expect_grep "serve --help lists --api-key" "$TMP/out" "--api-key"

# ---- the tiny model: the API
if start tiny -m $TINY --cpu -c 512 --max-request-bytes 65536; then
    py $PORT api
    stop tiny
fi
if start key -m $TINY --cpu -c 512 --api-key s3cret --max-connections 3; then
    py $PORT key s3cret
    py $PORT conns 3
    stop key
fi

[ -e "$M" ] || { notok "the default model is present" "$M missing (models/fetch.sh default)"; exit 1; }

# ---- the default model: text, disconnect, load
if start real -m $M --cpu --temp 0; then
    py $PORT text
    py $PORT disconnect
    # logprobs through the server equal generate's (greedy, fp32 CPU), whole and streamed
    printf '%s\n' '{"id": "lc", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6, "logprobs": true, "top_logprobs": 3}' \
        '{"id": "lp", "prompt": "The capital of France is", "max_tokens": 5, "logprobs": 2}' > "$TMP/lp.in"
    if $CLLM generate -m $M --cpu --temp 0 -i "$TMP/lp.in" -o "$TMP/lp.out" 2> "$TMP/gen.err"; then
        python3 - "$TMP/lp.in" "$TMP/lp.out" "$TMP/lp.want" <<'PY'
import json, sys
reqs = {json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1])}
with open(sys.argv[3], "w") as f:
    for l in open(sys.argv[2]):
        o = json.loads(l)
        o["request"] = reqs[o["id"]]
        f.write(json.dumps(o) + "\n")
PY
        py $PORT logprobs "$TMP/lp.want"
    else
        notok "generate for the logprobs check" "$(tail -3 "$TMP/gen.err")"
    fi
    # 64 prompts, chat and completions alternately, through generate and through 64 clients at once
    python3 - "$TMP/load.in" <<'PY'
import json, sys
topics = ["the sea", "a cat", "the moon", "bread", "rain", "a clock", "trains", "winter"]
with open(sys.argv[1], "w") as f:
    for i in range(64):
        t = topics[i % 8]
        o = {"id": f"r{i}", "max_tokens": 6 + i % 3}
        if i % 2:
            o["prompt"] = f"Here is a short fact about {t} number {i}:"
        else:
            o["messages"] = [{"role": "user", "content": f"Tell me one thing about {t} ({i})."}]
        f.write(json.dumps(o) + "\n")
PY
    if $CLLM generate -m $M --cpu --temp 0 -i "$TMP/load.in" -o "$TMP/load.out" 2> "$TMP/gen.err"; then
        py $PORT load "$TMP/load.out" 64
    else
        notok "generate for the load test" "$(tail -3 "$TMP/gen.err")"
    fi
    stop real
fi

# ---- SIGTERM: a running request finishes; after --grace it is cut short
if start term -m $M --cpu --temp 0 --ignore-eos; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 40}' > "$TMP/term.json" &
    CURL=$!
    py $PORT wait-running 1
    stop term
    wait $CURL
    python3 -c 'import json,sys; u = json.load(open(sys.argv[1]))["usage"]; sys.exit(u["completion_tokens"] != 40)' "$TMP/term.json" \
        && ok "SIGTERM: the running request finished (40 tokens)" || notok "SIGTERM: the running request finished (40 tokens)" "$(head -c 300 "$TMP/term.json")"
fi
if start grace -m $M --cpu --temp 0 --ignore-eos --grace 1; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 3000}' > "$TMP/grace.json" &
    CURL=$!
    py $PORT wait-running 1
    t0=$(date +%s)
    stop grace
    wait $CURL
    python3 -c 'import json,sys; u = json.load(open(sys.argv[1]))["usage"]; sys.exit(not u["completion_tokens"] < 3000)' "$TMP/grace.json" \
        && [ $(( $(date +%s) - t0 )) -lt 15 ] && ok "SIGTERM after --grace 1: the request is cut short, answered" \
        || notok "SIGTERM after --grace 1: the request is cut short, answered" "$(head -c 300 "$TMP/grace.json")"
fi
exit 0
