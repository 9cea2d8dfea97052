#!/usr/bin/env bash
# multiprocess.sh — the multi-process pipeline start-up on CPU stages (what
# runs under mpirun, one process per GPU, minus NCCL): two processes, rank 1
# (the last stage: it reads the prompts, schedules, samples and writes)
# listening at --master, rank 0 serving the first stage. The output must equal
# one process's; a rank that dies ends the other with a message, not a hang;
# bad options are refused.
source "$(dirname "$0")/lib.sh"
M=$MODELS/smollm2-135m-instruct.gguf
RUN="$CLLM generate -m $M --cpu -n 6 --temp 0 -c 256 -t 1"
for i in $(seq 1 12); do echo "prompt $i: the quick brown fox $((i * 7919 % 1000)) jumps"; done > "$TMP/in.txt"
PORT=$((20000 + RANDOM % 20000))
same() { [ -s "$1" ] && [ -s "$2" ] && cmp -s <(sort "$1" | sed 's/"seconds":[0-9.e-]*//') <(sort "$2" | sed 's/"seconds":[0-9.e-]*//'); }

expect_exit "one process" 0 $RUN -i "$TMP/in.txt" -o "$TMP/one.jsonl"
( timeout 120 $RUN -i "$TMP/in.txt" -o "$TMP/two.jsonl" --world-size 2 --rank 1 --master 127.0.0.1:$PORT 2> "$TMP/r1.err"; echo $? > "$TMP/r1.rc" ) &
expect_exit "rank 0 serves stage 0" 0 timeout 120 $RUN --world-size 2 --rank 0 --master 127.0.0.1:$PORT -v
cp "$TMP/err" "$TMP/r0.err"
wait
[ "$(cat "$TMP/r1.rc")" = 0 ] && ok "rank 1 drives and writes" || notok "rank 1 drives and writes" "$(head -c 400 "$TMP/r1.err")"
expect_grep "rank 0 says what it serves" "$TMP/r0.err" "rank 0 of 2 serves stage 0 \(layers 0-14\) on cpu"
same "$TMP/two.jsonl" "$TMP/one.jsonl" && ok "two processes give one process's output" ||
    notok "two processes give one process's output" "$(diff <(sort "$TMP/two.jsonl") <(sort "$TMP/one.jsonl") | head -4)"

# the launcher's environment instead of the flags (mpirun sets OMPI_COMM_WORLD_*)
PORT=$((PORT + 1))
( OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 CLLM_MASTER=127.0.0.1:$PORT timeout 120 $RUN -i "$TMP/in.txt" -o "$TMP/env.jsonl" 2> "$TMP/e1.err"; echo $? > "$TMP/e1.rc" ) &
expect_exit "rank 0 from the environment" 0 env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 CLLM_MASTER=127.0.0.1:$PORT timeout 120 $RUN
wait
same "$TMP/env.jsonl" "$TMP/one.jsonl" && ok "ranks from the environment: same output" || notok "ranks from the environment: same output" "$(head -c 300 "$TMP/e1.err")"

# a serving rank killed mid-run: the driver fails with a message within its deadline
PORT=$((PORT + 1))
head -4 "$TMP/in.txt" > "$TMP/four.txt"
( CLLM_PP_TIMEOUT=10 timeout 100 $CLLM generate -m $M --cpu -n 200 --ignore-eos -c 256 -t 1 -i "$TMP/four.txt" \
    -o "$TMP/dead.jsonl" --world-size 2 --rank 1 --master 127.0.0.1:$PORT 2> "$TMP/d1.err"; echo $? > "$TMP/d1.rc" ) &
CLLM_PP_TIMEOUT=10 $CLLM generate -m $M --cpu -c 256 -t 1 --world-size 2 --rank 0 --master 127.0.0.1:$PORT 2> /dev/null &
R0=$!  # the cllm process itself: killed below
sleep 4; kill -9 $R0 2>/dev/null
wait
rc=$(cat "$TMP/d1.rc")
[ "$rc" = 2 ] && ok "the driver exits 2 when a stage dies" || notok "the driver exits 2 when a stage dies" "exit $rc" "$(tail -c 300 "$TMP/d1.err")"
expect_grep "and names the stage" "$TMP/d1.err" "stage 0's process"

expect_exit "--world-size without --master exits 2" 2 env -u CLLM_MASTER $RUN -i "$TMP/in.txt" --world-size 2 --rank 1
expect_grep "and says so" "$TMP/err" "--master ADDR:PORT"
expect_exit "--rank outside the world exits 2" 2 $RUN -i "$TMP/in.txt" --world-size 2 --rank 2 --master 127.0.0.1:1
expect_grep "and says so" "$TMP/err" "--rank 2: must be in \[0, 2\)"
expect_exit "--pp other than --world-size exits 2" 2 $RUN -i "$TMP/in.txt" --world-size 2 --pp 3 --master 127.0.0.1:1
expect_grep "and says so" "$TMP/err" "one process per stage"
PORT=$((PORT + 1))
expect_exit "a missing peer times out (exit 2)" 2 env CLLM_PP_TIMEOUT=2 timeout 60 $RUN -i "$TMP/in.txt" --world-size 2 --rank 1 --master 127.0.0.1:$PORT
expect_grep "and names it" "$TMP/err" "did not connect before the deadline"
