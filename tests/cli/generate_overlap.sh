#!/usr/bin/env bash
# generate_overlap.sh — `cllm generate` with its prompts tokenized on worker
# threads and its lines written by a writer thread (app/ordered_work.c), on
# the tiny model (seconds on the CPU): --ordered writes in input order; the
# lines equal those of a run one request at a time (--max-seqs 1: nothing to
# overlap); a run killed partway (SIGKILL) or stopped by Ctrl-C and then
# resumed gives the same lines as a run left alone; token-id prompts are used
# as given (exact prompt lengths) and a bad one fails alone; --steps-csv and
# -v's share of wall time in steps. Then bench/roofline.py's arithmetic
# (bench/test_roofline.py) and bench/fixed_lengths.sh end to end on the CPU.
source "$(dirname "$0")/lib.sh"
TM=tests/fixtures/tiny/llama.gguf
TG="$CLLM generate -m $TM --cpu --temp 0 -c 128 -n 24 --ignore-eos --max-seqs 4"
# the lines without their timing: what must be the same from run to run
norm() { sed -E 's/"seconds":[0-9.]+,?//' "$1"; }
python3 -c "
import json
for i in range(400):
    print(json.dumps({'id': i, 'prompt': 'word ' * (i % 30 + 1) + str(i)}))" > "$TMP/in.jsonl"

# --ordered: the ids in input order; the same lines as one at a time.
expect_exit "generate --ordered, 400 prompts" 0 $TG --ordered -i "$TMP/in.jsonl" -o "$TMP/ordered.out"
ids=$(python3 -c "import json,sys; print(' '.join(str(json.loads(l)['id']) for l in open(sys.argv[1])))" "$TMP/ordered.out")
[ "$ids" = "$(seq -s ' ' 0 399)" ] && ok "--ordered: the lines in input order" \
    || notok "--ordered: the lines in input order" "got: $(echo "$ids" | cut -c1-200)"
expect_exit "generate one at a time (--max-seqs 1)" 0 $TG --max-seqs 1 -i "$TMP/in.jsonl" -o "$TMP/single.out"
if cmp -s <(norm "$TMP/ordered.out") <(norm "$TMP/single.out"); then ok "--ordered lines = one-at-a-time lines"
else notok "--ordered lines = one-at-a-time lines" "$(diff <(norm "$TMP/ordered.out") <(norm "$TMP/single.out") | head -4)"; fi
expect_exit "generate unordered" 0 $TG -i "$TMP/in.jsonl" -o "$TMP/unordered.out"
if cmp -s <(norm "$TMP/ordered.out" | sort) <(norm "$TMP/unordered.out" | sort); then ok "unordered: the same lines"
else notok "unordered: the same lines" "$(diff <(norm "$TMP/ordered.out" | sort) <(norm "$TMP/unordered.out" | sort) | head -4)"; fi

# Killed partway (SIGKILL once some lines are out), then --resume: with
# --ordered the file is then exactly the undisturbed run's.
$TG --ordered -i "$TMP/in.jsonl" -o "$TMP/killed.out" 2> /dev/null &
pid=$!
for _ in $(seq 600); do [ "$(wc -l < "$TMP/killed.out" 2> /dev/null || echo 0)" -ge 40 ] && break; sleep 0.01; done
kill -9 $pid 2> /dev/null; wait $pid 2> /dev/null
n_killed=$(wc -l < "$TMP/killed.out")
if [ "$n_killed" -lt 400 ]; then ok "SIGKILL left a partial output ($n_killed lines)"
else notok "SIGKILL left a partial output" "the run finished before the kill ($n_killed lines)"; fi
expect_exit "--resume --ordered after SIGKILL" 0 $TG --ordered --resume -i "$TMP/in.jsonl" -o "$TMP/killed.out"
if cmp -s <(norm "$TMP/ordered.out") <(norm "$TMP/killed.out"); then ok "killed + resumed --ordered = undisturbed run"
else notok "killed + resumed --ordered = undisturbed run" "$(diff <(norm "$TMP/ordered.out") <(norm "$TMP/killed.out") | head -4)"; fi

# Ctrl-C: exit 130 with the resume hint, every line written whole; resuming
# (unordered) completes the set.
$TG -i "$TMP/in.jsonl" -o "$TMP/int.out" 2> "$TMP/int.err" &
pid=$!
for _ in $(seq 600); do [ "$(wc -l < "$TMP/int.out" 2> /dev/null || echo 0)" -ge 40 ] && break; sleep 0.01; done
kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && ok "Ctrl-C: exit 130" || notok "Ctrl-C: exit 130" "exit $rc: $(tail -2 "$TMP/int.err")"
expect_grep "Ctrl-C: the resume hint" "$TMP/int.err" "cllm generate .* --resume"
done_n=$(sed -nE 's/.*interrupted; the ([0-9]+) finished requests.*/\1/p' "$TMP/int.err")
[ "$done_n" = "$(wc -l < "$TMP/int.out" | tr -d ' ')" ] && ok "Ctrl-C: the hint counts the lines written" \
    || notok "Ctrl-C: the hint counts the lines written" "hint $done_n, file $(wc -l < "$TMP/int.out")"
expect_exit "--resume after Ctrl-C" 0 $TG --resume -i "$TMP/in.jsonl" -o "$TMP/int.out"
if cmp -s <(norm "$TMP/ordered.out" | sort) <(norm "$TMP/int.out" | sort); then ok "interrupted + resumed = undisturbed run"
else notok "interrupted + resumed = undisturbed run" "$(diff <(norm "$TMP/ordered.out" | sort) <(norm "$TMP/int.out" | sort) | head -4)"; fi

# Token-id prompts: used as given; an id outside the vocabulary or not an
# integer fails alone.
printf '%s\n' '{"id": "a", "prompt": [5, 6, 7, 8, 9, 10, 11]}' '{"id": "b", "prompt": [5, 320]}' \
    '{"id": "c", "prompt": [5, 1.5]}' '{"id": "d", "prompt": "text"}' > "$TMP/ids.jsonl"
expect_exit "token-id prompts" 0 $TG -n 3 --ordered -i "$TMP/ids.jsonl" -o "$TMP/ids.out" -v --steps-csv "$TMP/steps.csv"
expect_grep "token ids: exactly their count of prompt tokens" "$TMP/ids.out" '"id":"a",.*"prompt_tokens":7,"completion_tokens":3'
expect_grep "token ids: an id outside the vocabulary fails alone" "$TMP/ids.out" '"id":"b",.*token id 320 is outside the vocabulary'
expect_grep "token ids: a non-integer fails alone" "$TMP/ids.out" "\"id\":\"c\",.*field 'prompt\[1\]' must be a token id"
expect_grep "token ids: a text prompt beside them runs" "$TMP/ids.out" '"id":"d",.*"finish_reason":"length"'
expect_grep "-v: the share of wall time in steps" "$TMP/err" 'wall [0-9.]+ s: load [0-9.]+ s, then [0-9.]+ s of which steps [0-9.]+ s = [0-9.]+%'
expect_grep "-v: the load's parts" "$TMP/err" "^the load's [0-9.]+ s: the model's tensors [0-9.]+ s, finding the GPUs [0-9.]+ s, backends, links and engine [0-9.]+ s, the rest .* [0-9.-]+ s$"
# the parts add up to the load the wall line gives (each printed to 0.01 s)
why=$(python3 - "$TMP/err" <<'PY' 2>&1
import re, sys
t = open(sys.argv[1]).read()
load = float(re.search(r"wall [0-9.]+ s: load ([0-9.]+) s", t).group(1))
parts = [float(x) for x in re.search(r"^the load's ([0-9.]+) s: .*? ([0-9.]+) s, .*? ([0-9.]+) s, .*? ([0-9.]+) s, .*? ([0-9.-]+) s$",
                                     t, re.M).groups()]
assert abs(parts[0] - load) <= 0.011, (parts, load)
assert abs(sum(parts[1:]) - parts[0]) <= 0.03, parts
PY
) && ok "-v: the load's parts add up to the load" || notok "-v: the load's parts add up to the load" "$why"
expect_grep "-v: the close's time, last" "$TMP/err" "^closed in [0-9.]+ s \(engine, backends, links, model\)$"
expect_grep "--steps-csv: the header" "$TMP/steps.csv" '^step,seconds,seqs,prefill_rows,decode_rows,rows_seen,drawn,context_tokens,attn_pairs$'
# the steps' rows: every prompt token and every generated token but the last
# of each request; their draws: every generated token
rows=$(python3 -c "
import csv, json, sys
r = list(csv.DictReader(open(sys.argv[1])))
out = [json.loads(l) for l in open(sys.argv[2]) if 'error' not in json.loads(l)]
print(sum(int(x['prefill_rows']) + int(x['decode_rows']) for x in r), sum(int(x['drawn']) for x in r),
      sum(o['prompt_tokens'] + o['completion_tokens'] - 1 for o in out), sum(o['completion_tokens'] for o in out))" \
    "$TMP/steps.csv" "$TMP/ids.out")
set -- $rows
[ "$1 $2" = "$3 $4" ] && ok "--steps-csv: rows and draws add up ($1 rows, $2 tokens)" \
    || notok "--steps-csv: rows and draws add up" "steps: $1 rows, $2 draws; output: $3, $4"
expect_exit "--steps-csv in a missing folder: exit 2" 2 $TG -n 1 -i "$TMP/ids.jsonl" -o "$TMP/ids2.out" \
    --steps-csv "$TMP/no/such/steps.csv"
expect_grep "--steps-csv in a missing folder: the file and the reason named" "$TMP/err" \
    "steps-csv $TMP/no/such/steps.csv: No such file or directory"

# The roofline's arithmetic, by hand.
python3 bench/test_roofline.py > "$TMP/roofline.txt" 2>&1; rc=$?
cat "$TMP/roofline.txt"
[ $rc = 0 ] || notok "bench/test_roofline.py exits 0" "exit $rc"

# bench/fixed_lengths.sh on the CPU: exact lengths, a table with the roofline
# (limits made up for the CPU: the arithmetic runs, the figures mean nothing).
mkdir -p "$TMP/bench"
echo '{"device": "cpu", "copy_tbps": 0.01, "matmul_tflops": 0.05}' > "$TMP/bench/limits.json"
OUT=$TMP/bench CLLM=$CLLM FL_NO_LIMITS=1 FL_PROMPTS=12 FL_SHAPES="8/4 20/16" FL_ARGS="--cpu -c 128" BENCH_COMMIT=test \
    bash bench/fixed_lengths.sh tests/fixtures/tiny/llama > "$TMP/fl.md" 2> "$TMP/fl.err"; rc=$?
[ $rc = 0 ] && ok "fixed_lengths.sh on the CPU exits 0" || notok "fixed_lengths.sh on the CPU exits 0" "exit $rc: $(tail -3 "$TMP/fl.err")"
expect_grep "fixed_lengths.sh: the 8/4 row, with its roofline %" "$TMP/fl.md" '^\| 8 / 4 \| 12 \| [0-9,]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+% \| [0-9.]+% \| [0-9.]+% \|'
expect_grep "fixed_lengths.sh: the 20/16 row" "$TMP/fl.md" '^\| 20 / 16 \| 12 \|'
expect_grep "fixed_lengths.sh: the sequences a step took and the preemptions, from the run's log" "$TMP/fl.md" \
    '^\| 8 / 4 \| 12 \|.* \| 16 \([0-9]+\) \|$'
python3 bench/report.py "$TMP/bench" --out "$TMP/bench/BENCH.md" --no-history > /dev/null 2>&1
expect_grep "report.py: the fixed-lengths table in BENCH.md" "$TMP/bench/BENCH.md" '^\| 20 / 16 \| 12 \|'
