#!/usr/bin/env bash
# generate.sh — `cllm generate` end to end. On the tiny model: -o naming the
# input is refused, a duplicate id survives a kill at any point, a torn last
# line is reported, an empty or broken input leaves an output of this run
# (exit 1), bad per-request values fail alone, an output holding results is
# not replaced without --overwrite, Ctrl-C stops with the --resume command,
# --retry-errors keeps a duplicate's line. On the default model (CPU): text
# lines are user turns for a model with a template (--raw: raw); a
# 100-line JSON Lines file with bad lines gives 100 output lines; resume skips
# finished ids; text, OpenAI batch, .gz and stdin inputs work.
source "$(dirname "$0")/lib.sh"
M=$MODELS/smollm2-135m-instruct.gguf

# ---- the tiny model (a second on the CPU): the run never loses work ----
TG="$CLLM generate -m tests/fixtures/tiny/llama.gguf --cpu -n 2 --temp 0 -c 64"
lines() { if [ -e "$1" ]; then wc -l < "$1" | tr -d ' '; else echo none; fi; }

# -o naming the input (same path, a symbolic or hard link, stdin from it) is
# refused before anything is written: exit 2, both paths named, input intact.
printf 'One\nTwo\nThree\n' > "$TMP/same.txt"; cp "$TMP/same.txt" "$TMP/same.orig"
ln -s "$TMP/same.txt" "$TMP/same-sym.txt"; ln "$TMP/same.txt" "$TMP/same-hard.txt"
for o in "$TMP/same.txt" "$TMP/same-sym.txt" "$TMP/same-hard.txt" "$TMP/../$(basename "$TMP")/same.txt"; do
    expect_exit "-o $(basename "$o") = -i exits 2" 2 $TG -i "$TMP/same.txt" -o "$o"
    expect_grep "-o $(basename "$o") = -i: both paths named" "$TMP/err" "output $o is the input $TMP/same.txt"
    cmp -s "$TMP/same.txt" "$TMP/same.orig" && ok "-o $(basename "$o") = -i: input intact" \
        || notok "-o $(basename "$o") = -i: input intact" "$(head -c 200 "$TMP/same.txt")"
done
expect_exit "-i - from the output file exits 2" 2 sh -c "$TG -i - -o $TMP/same-hard.txt < $TMP/same.txt"
cmp -s "$TMP/same.txt" "$TMP/same.orig" && ok "-i - from the output file: input intact" \
    || notok "-i - from the output file: input intact"
expect_exit "-o - appending to the input exits 2" 2 sh -c "$TG -i $TMP/same.txt >> $TMP/same.txt"
cmp -s "$TMP/same.txt" "$TMP/same.orig" && ok "-o - appending to the input: input intact" \
    || notok "-o - appending to the input: input intact" "$(head -c 300 "$TMP/same.txt")"

# A duplicate id: whatever prefix of the output a kill leaves, --resume gives
# every request its own line (the first x its result, the second x its
# duplicate error); the duplicate's line never stands in for the first's.
printf '%s\n' '{"id": "a", "prompt": "Hello"}' '{"id": "x", "prompt": "One two three", "max_tokens": 6}' \
    '{"id": "x", "prompt": "again"}' '{"id": "b", "prompt": "Bye"}' > "$TMP/dup.jsonl"
expect_exit "generate with a duplicate id" 0 $TG -i "$TMP/dup.jsonl" -o "$TMP/dup.out"
for k in 0 1 2 3; do
    head -n $k "$TMP/dup.out" > "$TMP/dup-$k.out"
    expect_exit "resume after $k of 4 lines" 0 $TG -i "$TMP/dup.jsonl" -o "$TMP/dup-$k.out" --resume
    x_ok=$(grep '"id":"x"' "$TMP/dup-$k.out" | grep -vc '"error"'); x_dup=$(grep -c '"id":"x".*duplicate id' "$TMP/dup-$k.out")
    [ "$(lines "$TMP/dup-$k.out")" = 4 ] && [ "$x_ok" = 1 ] && [ "$x_dup" = 1 ] && ok "resume after $k lines: x ran once, its duplicate failed once" \
        || notok "resume after $k lines: x ran once, its duplicate failed once" "$(cat "$TMP/dup-$k.out")"
done

# --resume --retry-errors keeps the duplicate's error line: run again, it
# fails again, so every request still has its line (4, not 3).
cp "$TMP/dup.out" "$TMP/dup-retry.out"
for k in 1 2; do
    expect_exit "--resume --retry-errors with a duplicate id (run $k)" 0 $TG -i "$TMP/dup.jsonl" -o "$TMP/dup-retry.out" --resume --retry-errors
    x_dup=$(grep -c '"id":"x".*duplicate id' "$TMP/dup-retry.out")
    [ "$(lines "$TMP/dup-retry.out")" = 4 ] && [ "$x_dup" = 1 ] && ok "--retry-errors run $k: 4 lines, the duplicate's error kept once" \
        || notok "--retry-errors run $k: 4 lines, the duplicate's error kept once" "$(cat "$TMP/dup-retry.out")"
done

# An output that holds results is not replaced without --overwrite (exit 2,
# the file named, --resume and --overwrite offered, the file untouched); an
# empty one is, and --overwrite replaces a full one.
cp "$TMP/dup.out" "$TMP/full.out"
expect_exit "an output holding results is refused" 2 $TG -i "$TMP/dup.jsonl" -o "$TMP/full.out"
expect_grep "the refusal names the file and both ways out" "$TMP/err" "full.out already holds [0-9]+ bytes of results; add --resume .* or --overwrite"
cmp -s "$TMP/dup.out" "$TMP/full.out" && ok "the refused output is untouched" || notok "the refused output is untouched"
: > "$TMP/empty.out"
expect_exit "an empty output is written" 0 $TG -i "$TMP/dup.jsonl" -o "$TMP/empty.out"
[ "$(lines "$TMP/empty.out")" = 4 ] && ok "an empty output gets the lines" || notok "an empty output gets the lines"
echo '{"id":"old"}' > "$TMP/full.out"
expect_exit "--overwrite replaces an output" 0 $TG -i "$TMP/dup.jsonl" -o "$TMP/full.out" --overwrite
[ "$(lines "$TMP/full.out")" = 4 ] && ! grep -q '"old"' "$TMP/full.out" && ok "--overwrite: only this run's lines" || notok "--overwrite: only this run's lines"
expect_exit "--chat with --raw exits 2" 2 $TG -i "$TMP/dup.jsonl" -o "$TMP/chatraw.out" --chat --raw

# Ctrl-C: generate stops between steps (exit 130), the finished requests
# have their lines, and stderr gives the command to finish: the same one
# with --resume; run as printed, it completes every prompt once.
for i in $(seq 1 3000); do echo "Prompt number $i says hello to the little model"; done > "$TMP/int.txt"
python3 - "$TMP/int.out" $TG -n 24 --max-seqs 8 -i "$TMP/int.txt" -o "$TMP/int.out" > "$TMP/int.rc" 2> "$TMP/int.err" <<'PY'
import os, signal, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
p = subprocess.Popen(cmd)
t = time.time()
while p.poll() is None and time.time() - t < 60:
    if os.path.exists(out) and os.path.getsize(out) > 0: break
    time.sleep(0.05)
p.send_signal(signal.SIGINT)
print(p.wait())
PY
n_int=$(lines "$TMP/int.out")
[ "$(cat "$TMP/int.rc")" = 130 ] && ok "SIGINT: exit 130" || notok "SIGINT: exit 130" "rc $(cat "$TMP/int.rc")" "$(tail -3 "$TMP/int.err")"
[ "$n_int" -gt 0 ] && [ "$n_int" -lt 3000 ] && [ "$(tail -c 1 "$TMP/int.out" | od -An -c | tr -d ' ')" = '\n' ] \
    && ok "SIGINT: stopped partway, whole lines ($n_int)" || notok "SIGINT: stopped partway, whole lines" "$n_int lines"
expect_grep "SIGINT: says how many lines are where" "$TMP/int.err" "interrupted; the [0-9]+ finished requests have their lines in $TMP/int.out"
resume_cmd=$(grep -A1 'To run the rest:' "$TMP/int.err" | tail -1 | sed 's/^ *cllm //')
case "$resume_cmd" in
    "generate -m tests/fixtures/tiny/llama.gguf --cpu -n 2 --temp 0 -c 64 -n 24 --max-seqs 8 -i $TMP/int.txt -o $TMP/int.out --resume")
        ok "SIGINT: the resume command is the same command with --resume" ;;
    *) notok "SIGINT: the resume command is the same command with --resume" "got: $resume_cmd" ;;
esac
expect_exit "SIGINT: the printed command resumes" 0 sh -c "$CLLM $resume_cmd"
n=$(lines "$TMP/int.out"); u=$(grep -o '"id":"[^"]*"' "$TMP/int.out" | sort -u | wc -l | tr -d ' ')
[ "$n" = 3000 ] && [ "$u" = 3000 ] && ok "SIGINT then --resume: every prompt once" || notok "SIGINT then --resume: every prompt once" "lines $n, distinct $u"

# Per-request sampling values out of range fail that request alone.
printf '%s\n' '{"id": "t", "prompt": "Hi", "temperature": -1}' '{"id": "p", "prompt": "Hi", "top_p": 5}' \
    '{"id": "m", "prompt": "Hi", "min_p": 2}' '{"id": "r", "prompt": "Hi", "repetition_penalty": 0}' \
    '{"id": "n", "prompt": "Hi", "max_tokens": 0}' '{"id": "good", "prompt": "Hi"}' > "$TMP/badreq.jsonl"
expect_exit "bad per-request values: the run goes on" 0 $TG -i "$TMP/badreq.jsonl" -o "$TMP/badreq.out"
for f in "t temperature" "p top_p" "m min_p" "r repetition_penalty" "n max_tokens"; do set -- $f
    expect_grep "per-request $2 out of range fails its request, named" "$TMP/badreq.out" "\"id\":\"$1\".*\"error\":\"line [0-9]+: field '$2' must"
done
expect_grep "the good request ran" "$TMP/badreq.out" '"id":"good".*"finish_reason":"(stop|length)"'
[ "$(grep -c '"error"' "$TMP/badreq.out")" = 5 ] && ok "exactly the 5 bad requests failed" || notok "exactly the 5 bad requests failed"

# A torn last line is cut on resume, and stderr says so: file and bytes.
printf 'Hello\nWorld\nAgain\n' > "$TMP/torn.txt"
expect_exit "generate for the torn test" 0 $TG -i "$TMP/torn.txt" -o "$TMP/torn.out"
head -n 2 "$TMP/torn.out" > "$TMP/torn-cut.out"; printf '{"id":"line-3","te' >> "$TMP/torn-cut.out"
expect_exit "resume over a torn last line" 0 $TG -i "$TMP/torn.txt" -o "$TMP/torn-cut.out" --resume
expect_grep "torn last line reported with file and bytes" "$TMP/err" "torn-cut.out: dropped its last 18 bytes, a partial line"
[ "$(lines "$TMP/torn-cut.out")" = 3 ] && ok "torn line's request ran again" || notok "torn line's request ran again"

# The output always reflects this run: an empty input (or only blank lines)
# empties a stale output and exits 1; an input that breaks while being read
# exits 1 after every request read before the break has its line.
for f in empty blank; do
    if [ $f = empty ]; then : > "$TMP/$f.txt"; else printf '\n  \n' > "$TMP/$f.txt"; fi
    echo '{"id":"stale"}' > "$TMP/stale.out"
    expect_exit "$f input exits 1" 1 $TG -i "$TMP/$f.txt" -o "$TMP/stale.out" --overwrite
    expect_grep "$f input says so" "$TMP/err" "$f.txt: the input holds no prompts"
    [ -e "$TMP/stale.out" ] && [ ! -s "$TMP/stale.out" ] && ok "$f input empties the output" || notok "$f input empties the output" "$(lines "$TMP/stale.out") lines"
done
echo '{"id":"stale"}' > "$TMP/stale.out"
printf '\x1f\x8b\x08\x00garbage that does not inflate' > "$TMP/junk.gz"
expect_exit "undecompressable .gz exits 1" 1 $TG -i "$TMP/junk.gz" -o "$TMP/stale.out" --overwrite
expect_grep "undecompressable .gz named" "$TMP/err" "junk.gz: read failed"
[ -e "$TMP/stale.out" ] && [ ! -s "$TMP/stale.out" ] && ok "undecompressable .gz empties the output" || notok "undecompressable .gz empties the output"
for i in $(seq 1 300); do echo "Prompt number $i says hello"; done | gzip -c > "$TMP/full.gz"
head -c $(( $(wc -c < "$TMP/full.gz") * 6 / 10 )) "$TMP/full.gz" > "$TMP/cut.gz"
echo '{"id":"stale"}' > "$TMP/stale.out"
expect_exit "cut .gz exits 1" 1 $TG -i "$TMP/cut.gz" -o "$TMP/stale.out" --overwrite
expect_grep "cut .gz named" "$TMP/err" "cut.gz: the gzip data is cut short after line"
n_read=$(sed -n 's/.*cut short after line \([0-9]*\).*/\1/p' "$TMP/err")
[ -n "$n_read" ] && [ "$n_read" -gt 0 ] && [ "$(lines "$TMP/stale.out")" = "$n_read" ] && ! grep -q stale "$TMP/stale.out" \
    && ok "cut .gz: the $n_read requests before the cut have their lines" || notok "cut .gz: the requests before the cut have their lines" "read $n_read, lines $(lines "$TMP/stale.out")"
expect_exit "missing input exits 2, output untouched" 2 $TG -i "$TMP/none.txt" -o "$TMP/stale.out" --overwrite
[ "$(lines "$TMP/stale.out")" = "$n_read" ] && ok "missing input leaves the output alone" || notok "missing input leaves the output alone"
# The model's own sampling settings (generation_config.json) are used where
# neither an option nor a request field is given: do_sample false makes the
# run greedy, so its text equals a --temp 0 run's; a given option wins.
mkdir -p "$TMP/gen" && cp tests/fixtures/tiny/llama/* "$TMP/gen/"
printf '%s\n' '{"id": "g", "prompt": "One two three", "max_tokens": 12}' > "$TMP/gen.jsonl"
GG="$CLLM generate -m $TMP/gen --cpu -c 64 -i $TMP/gen.jsonl --overwrite"
expect_exit "generate --temp 0 (generation_config.json without sampling keys)" 0 $GG -o "$TMP/gen-greedy.out" --temp 0
expect_exit "generate at cllm's default sampling" 0 $GG -o "$TMP/gen-default.out"
echo '{"do_sample": false, "temperature": 0.7}' > "$TMP/gen/generation_config.json"
expect_exit "generate with generation_config.json" 0 $GG -o "$TMP/gen-model.out"
expect_grep "generate: the model's sampling settings named" "$TMP/err" "generation_config.json recommends.*temperature 0,"
text_of() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["text"])' "$1"; }
[ "$(text_of "$TMP/gen-model.out")" = "$(text_of "$TMP/gen-greedy.out")" ] \
    && ok "generate: do_sample false gives the greedy text" \
    || notok "generate: do_sample false gives the greedy text" "$(text_of "$TMP/gen-model.out") / $(text_of "$TMP/gen-greedy.out")"
[ "$(text_of "$TMP/gen-default.out")" != "$(text_of "$TMP/gen-greedy.out")" ] \
    && ok "generate: cllm's default sampling is not greedy (the check above can fail)" \
    || notok "generate: cllm's default sampling is not greedy (the check above can fail)"
echo '{"do_sample": true, "temperature": 0.5, "top_k": 7}' > "$TMP/gen/generation_config.json"
expect_exit "generate: --temp over generation_config.json" 0 $GG -o "$TMP/gen-opt.out" --temp 0.9
expect_grep "generate: a given option wins over the model's" "$TMP/err" "recommends.*temperature 0.9, top-k 7,"
echo '{"temperature": -1}' > "$TMP/gen/generation_config.json"
expect_exit "generate: a hostile generation_config.json exits 2" 2 $GG -o "$TMP/gen-bad.out"
expect_grep "generate: hostile generation_config.json named" "$TMP/err" "generation_config.json: temperature is -1"
GEN="$CLLM generate -m $M --cpu -n 4 --temp 0 -c 256"

python3 - "$TMP/in.jsonl" <<'PY' 2>/dev/null || {
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(100):
        if i == 10: f.write('{"id": "bad-json", "prompt": \n'); continue
        if i == 20: f.write(json.dumps({"id": "empty", "prompt": ""}) + "\n"); continue
        if i == 30: f.write(json.dumps({"id": "long", "prompt": "word " * 400}) + "\n"); continue
        if i == 40: f.write(json.dumps({"id": "bad-type", "prompt": 7}) + "\n"); continue
        if i % 2: f.write(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"Say the number {i}."}]}) + "\n")
        else: f.write(json.dumps({"id": f"r{i}", "prompt": f"Count: {i},", "max_tokens": 3}) + "\n")
PY
    # no python: write the same file with the shell
    for i in $(seq 0 99); do
        case $i in
            10) echo '{"id": "bad-json", "prompt": ' ;;
            20) echo '{"id": "empty", "prompt": ""}' ;;
            30) printf '{"id": "long", "prompt": "%s"}\n' "$(printf 'word %.0s' $(seq 400))" ;;
            40) echo '{"id": "bad-type", "prompt": 7}' ;;
            *) if [ $((i % 2)) = 1 ]; then echo "{\"id\": \"r$i\", \"messages\": [{\"role\": \"user\", \"content\": \"Say the number $i.\"}]}"
               else echo "{\"id\": \"r$i\", \"prompt\": \"Count: $i,\", \"max_tokens\": 3}"; fi ;;
        esac
    done > "$TMP/in.jsonl"
}

expect_exit "generate 100 prompts" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/out.jsonl"
n=$(wc -l < "$TMP/out.jsonl")
[ "$n" = 100 ] && ok "100 output lines" || notok "100 output lines" "got $n"
n_err=$(grep -c '"error"' "$TMP/out.jsonl")
[ "$n_err" = 4 ] && ok "4 bad lines carry an error" || notok "4 bad lines carry an error" "got $n_err"
expect_grep "bad JSON reported with its line" "$TMP/out.jsonl" '"id":"line-11".*"error":"[^"]*line 11'
expect_grep "empty prompt reported" "$TMP/out.jsonl" '"id":"empty".*"error"'
expect_grep "prompt over the context reported" "$TMP/out.jsonl" '"id":"long".*"error":"[^"]*context'
expect_grep "good line has text and counts" "$TMP/out.jsonl" '"id":"r2",.*"completion_tokens":[1-3],'
expect_grep "chat line has a finish reason" "$TMP/out.jsonl" '"id":"r1",.*"finish_reason":"(stop|length)"'

# Resume: drop the last 30 lines and cut the file mid-line, then rerun.
head -n 70 "$TMP/out.jsonl" > "$TMP/part.jsonl"; printf '{"id":"r71","te' >> "$TMP/part.jsonl"
expect_exit "generate --resume" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/part.jsonl" --resume
n=$(wc -l < "$TMP/part.jsonl"); u=$(grep -o '"id":"[^"]*"' "$TMP/part.jsonl" | sort -u | wc -l)
[ "$n" = 100 ] && [ "$u" = 100 ] && ok "resume completes to 100 distinct lines" || notok "resume completes to 100 distinct lines" "lines $n, distinct ids $u"
cmp -s <(sort "$TMP/out.jsonl" | sed 's/"seconds":[0-9.e-]*//') <(sort "$TMP/part.jsonl" | sed 's/"seconds":[0-9.e-]*//') \
    && ok "resumed output equals a full run (greedy)" || notok "resumed output equals a full run (greedy)" "$(diff <(sort "$TMP/out.jsonl") <(sort "$TMP/part.jsonl") | head -5)"

# A text file sent to a model with a chat template: each line is a user turn
# (the same prompt as {"messages": [{"role": "user", ...}]}), unless --raw;
# JSON Lines "prompt" stays raw (the completions API) unless --chat.
printf 'Hi\n' > "$TMP/hi.txt"
echo '{"id": "m", "messages": [{"role": "user", "content": "Hi"}]}' > "$TMP/hi-msg.jsonl"
echo '{"id": "p", "prompt": "Hi"}' > "$TMP/hi-prompt.jsonl"
ptok() { $GEN -i "$@" 2>/dev/null | sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p'; }
t_msg=$(ptok "$TMP/hi-msg.jsonl"); t_txt=$(ptok "$TMP/hi.txt"); t_raw=$(ptok "$TMP/hi.txt" --raw)
t_prompt=$(ptok "$TMP/hi-prompt.jsonl"); t_pchat=$(ptok "$TMP/hi-prompt.jsonl" --chat)
[ -n "$t_msg" ] && [ "$t_txt" = "$t_msg" ] && ok "text line = a user turn by default ($t_txt tokens)" || notok "text line = a user turn by default" "text $t_txt, messages $t_msg"
[ -n "$t_raw" ] && [ "$t_raw" -lt "$t_msg" ] && ok "--raw: the line as it is ($t_raw tokens)" || notok "--raw: the line as it is" "raw $t_raw, messages $t_msg"
[ "$t_prompt" = "$t_raw" ] && [ "$t_pchat" = "$t_msg" ] && ok "JSON Lines prompt raw, templated with --chat" || notok "JSON Lines prompt raw, templated with --chat" "prompt $t_prompt, --chat $t_pchat"

printf 'The capital of France is\n\nOne, two,\n' > "$TMP/in.txt"
expect_exit "generate from text, stdin, to stdout" 0 sh -c "$GEN -i - < $TMP/in.txt"
n=$(wc -l < "$TMP/out"); [ "$n" = 2 ] && ok "text input: one line per prompt" || notok "text input: one line per prompt" "got $n"
expect_grep "text input ids are line numbers" "$TMP/out" '"id":"line-3"'

gzip -c "$TMP/in.txt" > "$TMP/in.txt.gz"
expect_exit "generate .gz in and out" 0 $GEN -i "$TMP/in.txt.gz" -o "$TMP/out.jsonl.gz"
n=$(gzip -dc "$TMP/out.jsonl.gz" | wc -l); [ "$n" = 2 ] && ok "gz output readable" || notok "gz output readable" "got $n lines"

echo '{"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}}' > "$TMP/batch.jsonl"
expect_exit "generate OpenAI batch" 0 $GEN -i "$TMP/batch.jsonl" -o "$TMP/batch.out"
expect_grep "OpenAI batch output shape" "$TMP/batch.out" '"custom_id":"q1".*"response":\{"status_code":200'

expect_exit "generate without -i exits 2" 2 $CLLM generate -m $M
expect_exit "generate missing input exits 2" 2 $GEN -i "$TMP/none.jsonl"
expect_grep "missing input named" "$TMP/err" "none.jsonl"

# The scheduler: many sequences per step give the same greedy results as one
# at a time; --ordered writes in input order; --verbose logs every step.
expect_exit "generate one sequence per step" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/one.jsonl" --max-seqs 1 --max-batched-tokens 64
cmp -s <(sort "$TMP/out.jsonl" | sed 's/"seconds":[0-9.e-]*//') <(sort "$TMP/one.jsonl" | sed 's/"seconds":[0-9.e-]*//') \
    && ok "batched output equals one at a time (greedy)" || notok "batched output equals one at a time (greedy)" "$(diff <(sort "$TMP/out.jsonl" | sed 's/"seconds":[0-9.e-]*//') <(sort "$TMP/one.jsonl" | sed 's/"seconds":[0-9.e-]*//') | head -5)"
expect_exit "generate --ordered --verbose" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/ord.jsonl" --ordered --verbose --max-seqs 8 --max-batched-tokens 64
ids_in=$(grep -o '"id": *"[^"]*"' "$TMP/in.jsonl" | sed 's/"id": *//; s/bad-json/line-11/' | tr -d '"' | tr '\n' ' ')
ids_out=$(grep -o '"id":"[^"]*"' "$TMP/ord.jsonl" | sed 's/"id"://' | tr -d '"' | tr '\n' ' ')
[ "$ids_in" = "$ids_out" ] && ok "--ordered keeps input order" || notok "--ordered keeps input order" "in: ${ids_in:0:120}" "out: ${ids_out:0:120}"
expect_grep "--verbose logs steps" "$TMP/err" 'step: [0-9]+ seqs, [0-9]+ tokens .*KV [0-9]+/[0-9]+ blocks'
expect_grep "--verbose: the step limits given" "$TMP/err" 'cllm generate: 8 sequences and 64 tokens per step$'
cmp -s <(sort "$TMP/out.jsonl" | sed 's/"seconds":[0-9.e-]*//') <(sort "$TMP/ord.jsonl" | sed 's/"seconds":[0-9.e-]*//') \
    && ok "ordered output has the same lines" || notok "ordered output has the same lines"
# --retry-errors: failed lines are run again (they fail again, one line each).
expect_exit "generate --resume --retry-errors" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/out.jsonl" --resume --retry-errors
n=$(wc -l < "$TMP/out.jsonl"); e=$(grep -c '"error"' "$TMP/out.jsonl")
[ "$n" = 100 ] && [ "$e" = 4 ] && ok "--retry-errors reruns only the failed ids" || notok "--retry-errors reruns only the failed ids" "lines $n, errors $e"
expect_exit "generate --max-seqs 0 exits 2" 2 $GEN -i "$TMP/in.jsonl" --max-seqs 0
# Left out, --max-seqs comes from the KV cache: -c 64 on the CPU holds 5
# blocks of 16, one sequence of 64 tokens -> the floor, 16; the tokens the cache's 80.
printf 'One\nTwo\n' > "$TMP/lim.txt"
expect_exit "generate -v with the default limits" 0 $TG -v -i "$TMP/lim.txt" -o "$TMP/lim.out"
expect_grep "--verbose: the limits from the KV cache" "$TMP/err" \
    'cllm generate: 16 sequences and 80 tokens per step \(sequences: the KV cache.s 5 blocks of 16 hold 1 sequences of 64 tokens, kept in \[16, 1024\]\)'

# --pp: the layers split into stages (CPU backends here), the hidden state
# handed from stage to stage: fp32 on the CPU, so the same greedy results.
same_as_one() { [ -s "$1" ] && [ -s "$TMP/one.jsonl" ] && cmp -s <(sort "$1" | sed 's/"seconds":[0-9.e-]*//') <(sort "$TMP/one.jsonl" | sed 's/"seconds":[0-9.e-]*//'); }
expect_exit "generate --pp 2" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/pp2.jsonl" --pp 2 -v
same_as_one "$TMP/pp2.jsonl" && ok "--pp 2 output equals one stage" || notok "--pp 2 output equals one stage" "$(diff <(sort "$TMP/pp2.jsonl") <(sort "$TMP/one.jsonl") | head -4)"
expect_grep "--pp 2 -v names the stages" "$TMP/err" "stage 1 on cpu: layers 15-29"
expect_exit "generate --pp 3 --pp-split 5,20,5" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/pp3.jsonl" --pp 3 --pp-split 5,20,5
same_as_one "$TMP/pp3.jsonl" && ok "--pp 3 output equals one stage" || notok "--pp 3 output equals one stage" "$(diff <(sort "$TMP/pp3.jsonl") <(sort "$TMP/one.jsonl") | head -4)"
expect_exit "generate --pp 8" 0 $GEN -i "$TMP/in.jsonl" -o "$TMP/pp8.jsonl" --pp 8 -t 1
same_as_one "$TMP/pp8.jsonl" && ok "--pp 8 output equals one stage" || notok "--pp 8 output equals one stage" "$(diff <(sort "$TMP/pp8.jsonl") <(sort "$TMP/one.jsonl") | head -4)"
expect_exit "generate --pp 31 exits 2" 2 $GEN -i "$TMP/in.jsonl" --pp 31
expect_grep "--pp 31 says why" "$TMP/err" "the model has 30 layers"
expect_exit "generate --pp-split short exits 2" 2 $GEN -i "$TMP/in.jsonl" --pp 2 --pp-split 10,10
expect_grep "--pp-split short says why" "$TMP/err" "hold 20 layers, the model has 30"
expect_exit "generate --gpu-mem-util 5 exits 2" 2 $GEN -i "$TMP/in.jsonl" --pp 2 --gpu-mem-util 5
expect_grep "--gpu-mem-util 5 says why" "$TMP/err" "must be a fraction"
expect_exit "generate --gpus junk exits 2" 2 $GEN -i "$TMP/in.jsonl" --pp 2 --gpus 0,x
expect_grep "--gpus junk says why" "$TMP/err" "--gpus '0,x'"
