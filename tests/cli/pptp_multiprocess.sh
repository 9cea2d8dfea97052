#!/usr/bin/env bash
# pptp_multiprocess.sh — `--pp P --tp N --world-size P*N`: P pipeline stages,
# each a tensor-parallel group of N processes (what runs under mpirun, one
# process per GPU), here on CPU backends over 127.0.0.1. World rank s*N + t is
# rank t of stage s; the last stage's rank 0 (world rank (P-1)*N) listens at
# --master, reads the prompts, drives and writes; each stage's rank 0 (its hub)
# takes the steps and hands them to its ranks, whose group meets at the hub's
# address on port PORT + 1 + s. On the tiny models (4 query heads, 2 KV heads)
# --pp 2 --tp 2 and --pp 2 --tp 4 as processes give the bits of the same split
# in one process (the ranks sum in the host group's rank order; the hidden
# state is handed over as it is), and one backend's texts with logprobs within
# 1e-5 (tp_multiprocess.sh's prompts and bound: the ranks' partial sums
# associate otherwise; --tp 2 in one process is as far from one backend).
# --pp 2 --tp 3 does not split 4 heads, --pp 3 on CPU backends needs NCCL
# between the stages: both refused. A rank killed mid-run (one after a stage's
# rank 0, a stage's hub, the driver) or a silent one (a rank, a hub) ends the
# others, exit 2 with a message naming the stage and rank (a silent hub's own
# ranks wait for it, as for an idle one, until it goes); `timeout` bounds
# every process.
source "$(dirname "$0")/lib.sh"
F=tests/fixtures/tiny
for i in $(seq 1 6); do
    printf '{"id":"p%d","prompt":"The ranks read the file %d and %d","max_tokens":10,"logprobs":3}\n' $i $i $((i * 37))
done > "$TMP/in.jsonl"
GEN="$CLLM generate --cpu --temp 0 -c 64 -t 1 --ordered -i $TMP/in.jsonl"
PORT=$((20000 + RANDOM % 20000))
next_port() { PORT=$((PORT + 10)); } # the stages' groups take PORT + 1 .. PORT + P
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
# servers P N DRIVER MODEL OPTS...: every rank but DRIVER in the background (exit codes in $TMP/rank$r.rc)
servers() {
    local p=$1 n=$2 d=$3 m=$4; shift 4
    for r in $(seq 0 $((p * n - 1))); do
        [ $r = $d ] && continue
        ( timeout 120 $CLLM generate --cpu -c 64 -t 1 -m $m --pp $p --tp $n --world-size $((p * n)) --rank $r \
            --master 127.0.0.1:$PORT "$@" 2> "$TMP/rank$r.err"; echo $? > "$TMP/rank$r.rc" ) &
    done
}
for a in llama qwen3 gemma3; do
    M=$F/$a.gguf
    expect_exit "$a: one backend" 0 $GEN -m $M -o "$TMP/$a-one.jsonl"
    for n in 2 4; do
        w=$((2 * n)) d=$n
        expect_exit "$a --pp 2 --tp $n, one process" 0 $GEN -m $M --pp 2 --tp $n -o "$TMP/$a-pp2tp$n.jsonl"
        next_port; servers 2 $n $d $M
        expect_exit "$a --pp 2 --tp $n --world-size $w: rank $d drives" 0 timeout 120 $GEN -m $M --pp 2 --tp $n \
            --world-size $w --rank $d --master 127.0.0.1:$PORT -o "$TMP/$a-mp$n.jsonl"
        wait
        rcs=$(cat "$TMP"/rank*.rc | tr -d '\n'); want=$(printf '0%.0s' $(seq 2 $w))
        [ "$rcs" = "$want" ] && ok "$a --pp 2 --tp $n: the other $((w - 1)) processes exit 0" ||
            notok "$a --pp 2 --tp $n: the other $((w - 1)) processes exit 0" "$rcs" "$(head -c 300 "$TMP/rank1.err")"
        rm -f "$TMP"/rank*.rc
        cmp -s <(strip "$TMP/$a-mp$n.jsonl") <(strip "$TMP/$a-pp2tp$n.jsonl") &&
            ok "$a --pp 2 --tp $n as processes: the bits of one process" ||
            notok "$a --pp 2 --tp $n as processes: the bits of one process" \
                "$(diff <(strip "$TMP/$a-mp$n.jsonl") <(strip "$TMP/$a-pp2tp$n.jsonl") | head -4)"
        expect_logprobs_close "$a --pp 2 --tp $n as processes: one backend's texts, logprobs within 1e-5" \
            "$TMP/$a-mp$n.jsonl" "$TMP/$a-one.jsonl" 1e-5
    done
done

# the launcher's environment instead of the flags (mpirun sets OMPI_COMM_WORLD_*); -v names each rank's place
next_port
for r in 0 1 3; do
    ( OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=$r CLLM_MASTER=127.0.0.1:$PORT timeout 120 $CLLM generate --cpu \
        -c 64 -t 1 -m $F/llama.gguf --pp 2 --tp 2 -v 2> "$TMP/e$r.err"; echo $? > "$TMP/e$r.rc" ) &
done
expect_exit "--pp 2 --tp 2: ranks from the environment" 0 env OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=2 \
    CLLM_MASTER=127.0.0.1:$PORT timeout 120 $GEN -m $F/llama.gguf --pp 2 --tp 2 -v -o "$TMP/env.jsonl"
cp "$TMP/err" "$TMP/e2.err"
wait
cmp -s <(strip "$TMP/env.jsonl") <(strip "$TMP/llama-pp2tp2.jsonl") && ok "ranks from the environment: same output" ||
    notok "ranks from the environment: same output" "$(head -c 300 "$TMP/e1.err")"
[ "$(cat "$TMP"/e0.rc "$TMP"/e1.rc "$TMP"/e3.rc | tr -d '\n')" = 000 ] && ok "ranks from the environment: all exit 0" ||
    notok "ranks from the environment: all exit 0" "$(cat "$TMP"/e*.rc | tr -d '\n')"
expect_grep "-v: stage 0's hub names its place" "$TMP/e0.err" "rank 0 of 4 serves stage 0's tensor-parallel rank 0 \(layers 0-0\) on cpu$"
expect_grep "-v: a rank of stage 0" "$TMP/e1.err" "rank 1 of 4 serves stage 0's tensor-parallel rank 1 \(layers 0-0\) on cpu$"
expect_grep "-v: the driver names its place" "$TMP/e2.err" "^stage 1's tensor-parallel rank 0 \(rank 2 of 4, the driver\) on cpu$"
expect_grep "-v: a rank of the driver's stage" "$TMP/e3.err" "rank 3 of 4 serves stage 1's tensor-parallel rank 1 \(layers 1-1\) on cpu$"

# `cllm info` places world rank s*N + t (its --gpus entry) as the processes above name themselves
expect_exit "info --pp 2 --tp 2 --gpus 0,1,2,3" 0 $CLLM info -m $F/llama.gguf --pp 2 --tp 2 --gpus 0,1,2,3
expect_grep "info: GPU 1 holds stage 0's rank 1 (world rank 1)" "$TMP/out" "^  GPU 1 +stage 0 rank 1:"
expect_grep "info: GPU 3 holds stage 1's rank 1 (world rank 3)" "$TMP/out" "^  GPU 3 +stage 1 rank 1:"

# failures: a long run of 4 processes, one of them killed (or stopped) 2 s in; every process must end
for i in $(seq 1 24); do echo "prompt $i of a long run"; done > "$TMP/long.txt"
LONG="$CLLM generate --cpu -c 2100 -t 1 -m $F/llama.gguf -n 2000 --ignore-eos --pp 2 --tp 2 --world-size 4"
# fail_run NAME VICTIM SIGNAL TIMEOUT: ranks 0..3 (2 drives), VICTIM sent SIGNAL after 2 s; stderr in $TMP/f$r.err
fail_run() {
    local name=$1 victim=$2 sig=$3 t=$4 r pid
    next_port; rm -f "$TMP"/f*.rc "$TMP"/f*.err
    for r in 0 1 2 3; do
        local extra=""; [ $r = 2 ] && extra="-i $TMP/long.txt -o $TMP/f.jsonl --overwrite"
        if [ $r = $victim ]; then
            CLLM_PP_TIMEOUT=$t $LONG --rank $r --master 127.0.0.1:$PORT $extra 2> "$TMP/f$r.err" &
            pid=$!  # the cllm process itself: signalled below
        else
            ( CLLM_PP_TIMEOUT=$t timeout 100 $LONG --rank $r --master 127.0.0.1:$PORT $extra 2> "$TMP/f$r.err"
              echo $? > "$TMP/f$r.rc" ) &
        fi
    done
    sleep 2; kill -$sig $pid 2>/dev/null
    # the driver ends on its own (by a deadline at most); then a stopped victim goes (a stopped hub's ranks
    # wait for it as for an idle one), and every other process must end on its own (timeout 100 each)
    while [ $victim != 2 ] && [ ! -s "$TMP/f2.rc" ]; do sleep 0.2; done
    # a stopped rank of stage 0: its hub must find it silent by its own deadline before the victim goes (killed
    # first, the hub would read a reset connection instead: seen under CI's load, the driver's deadline passing first)
    while [ $victim = 1 ] && [ "$sig" = STOP ] && [ ! -s "$TMP/f0.rc" ]; do sleep 0.2; done
    kill -9 $pid 2>/dev/null
    for r in 0 1 2 3; do
        while [ $r != $victim ] && [ ! -s "$TMP/f$r.rc" ]; do sleep 0.2; done
    done
    wait
    local rcs="" ; for r in 0 1 2 3; do [ $r = $victim ] || rcs="$rcs$(cat "$TMP/f$r.rc")"; done
    [ "${rcs//124/}" = "$rcs" ] && ok "$name: every process ends before its timeout" ||
        notok "$name: every process ends before its timeout" "exit codes (victim $victim left out): $rcs"
    [ "$victim" = 2 ] || { [ "$(cat "$TMP/f2.rc")" = 2 ] && ok "$name: the driver exits 2" ||
        notok "$name: the driver exits 2" "exit $(cat "$TMP/f2.rc")" "$(tail -c 300 "$TMP/f2.err")"; }
}
fail_run "stage 0's rank 1 killed" 1 9 10
expect_grep "the driver names stage 0's hub" "$TMP/f2.err" "pipeline stage 0's hub \(world rank 0, the stage's tensor-parallel rank 0\)"
expect_grep "stage 0's hub names the rank" "$TMP/f0.err" "rank 0: .*stage 0's tensor-parallel rank 1"
[ "$(cat "$TMP/f0.rc")" = 2 ] && ok "stage 0's hub exits 2" || notok "stage 0's hub exits 2" "exit $(cat "$TMP/f0.rc")"
fail_run "stage 1's rank 1 killed" 3 9 10  # stage 0's processes then end too (told to stop, or the driver gone)
expect_grep "the driver names the stage and rank" "$TMP/f2.err" "stage 1's tensor-parallel rank 1"
fail_run "stage 0's hub killed" 0 9 10
expect_grep "the driver names stage 0's hub" "$TMP/f2.err" "pipeline stage 0's hub"
expect_grep "stage 0's rank 1 names its hub" "$TMP/f1.err" "rank 1: stage 0's (hub|tensor-parallel rank 0)"
[ "$(cat "$TMP/f1.rc")" = 2 ] && ok "stage 0's rank 1 exits 2" || notok "stage 0's rank 1 exits 2" "exit $(cat "$TMP/f1.rc")"
fail_run "stage 0's rank 1 stopped" 1 STOP 3
expect_grep "stage 0's hub says it did not answer" "$TMP/f0.err" "stage 0's tensor-parallel rank 1: no answer within 3 s"
fail_run "stage 0's hub stopped" 0 STOP 3
expect_grep "the driver says stage 0's hub did not answer" "$TMP/f2.err" "pipeline stage 0's hub .*no answer within 3 s"
fail_run "the driver killed" 2 9 10
for r in 0 1 3; do
    [ "$(cat "$TMP/f$r.rc")" = 2 ] && ok "the driver killed: rank $r exits 2" || notok "the driver killed: rank $r exits 2" \
        "exit $(cat "$TMP/f$r.rc")" "$(tail -c 300 "$TMP/f$r.err")"
done
expect_grep "stage 0's hub names the driver" "$TMP/f0.err" "the driving process"

# refused
expect_exit "--pp 2 --tp 2 --world-size 3 exits 2" 2 $GEN -m $F/llama.gguf --pp 2 --tp 2 --world-size 3 --rank 0 \
    --master 127.0.0.1:1
expect_grep "and says one process per stage and rank" "$TMP/err" "--pp 2 --tp 2 but --world-size 3: one process per stage and rank, 4"
expect_exit "--pp 2 --tp 3 on 4 heads exits 2" 2 env CLLM_PP_TIMEOUT=2 $GEN -m $F/llama.gguf --pp 2 --tp 3 \
    --world-size 6 --rank 5 --master 127.0.0.1:1
expect_grep "and names the heads" "$TMP/err" "4 attention heads do not split evenly over 3 ranks"
expect_exit "--pp 3 --tp 2 on CPU backends exits 2" 2 $GEN -m $F/llama.gguf --pp 3 --tp 2 --world-size 6 --rank 4 \
    --master 127.0.0.1:1
expect_grep "and says NCCL is needed" "$TMP/err" "at most 2 stages \(more need NCCL between the stages' GPUs\)"
