#!/usr/bin/env bash
# tp_multiprocess.sh — `--tp N --world-size N`: a tensor-parallel group whose
# ranks are processes (what runs under mpirun, one process per GPU), here on
# CPU backends over 127.0.0.1: rank 0 listens at --master, reads the prompts,
# drives and writes; ranks 1..N-1 serve. On the tiny models (4 query heads, 2
# KV heads) --tp 2 and --tp 4 as processes give the bits of --tp N in one
# process (the link sums in the host group's rank order), and one backend's
# texts with logprobs within 1e-5 (as --tp N in one process: the ranks' partial
# sums associate otherwise than one backend's; measured worst 4.5e-6). A rank killed mid-run makes the driver exit
# 2 naming it, a silent one fails at CLLM_PP_TIMEOUT, the driver's death ends
# the servers; mismatched counts are refused. (--pp P --tp N as processes:
# pptp_multiprocess.sh.)
source "$(dirname "$0")/lib.sh"
F=tests/fixtures/tiny
for i in $(seq 1 6); do
    printf '{"id":"p%d","prompt":"The ranks read the file %d and %d","max_tokens":10,"logprobs":3}\n' $i $i $((i * 37))
done > "$TMP/in.jsonl"
GEN="$CLLM generate --cpu --temp 0 -c 64 -t 1 --ordered -i $TMP/in.jsonl"
PORT=$((20000 + RANDOM % 20000))
strip() { sed 's/"seconds":[0-9.e-]*//' "$1"; }
# servers N MODEL OPTS...: ranks 1..N-1 in the background (their exit codes in $TMP/rank$r.rc)
servers() {
    local n=$1 m=$2; shift 2
    for r in $(seq 1 $((n - 1))); do
        ( timeout 120 $CLLM generate --cpu -c 64 -t 1 -m $m --tp $n --world-size $n --rank $r \
            --master 127.0.0.1:$PORT "$@" 2> "$TMP/rank$r.err"; echo $? > "$TMP/rank$r.rc" ) &
    done
}
for a in llama qwen3 gemma3; do
    M=$F/$a.gguf
    expect_exit "$a: one backend" 0 $GEN -m $M -o "$TMP/$a-one.jsonl"
    for n in 2 4; do
        expect_exit "$a --tp $n, one process" 0 $GEN -m $M --tp $n -o "$TMP/$a-tp$n.jsonl"
        PORT=$((PORT + 1)); servers $n $M
        expect_exit "$a --tp $n --world-size $n: rank 0 drives" 0 timeout 120 $GEN -m $M --tp $n --world-size $n \
            --rank 0 --master 127.0.0.1:$PORT -o "$TMP/$a-mp$n.jsonl"
        wait
        rcs=$(cat "$TMP"/rank*.rc | tr -d '\n'); want=$(printf '0%.0s' $(seq 1 $((n - 1))))
        [ "$rcs" = "$want" ] && ok "$a --tp $n: the rank servers exit 0" || notok "$a --tp $n: the rank servers exit 0" "$rcs" "$(head -c 300 "$TMP/rank1.err")"
        rm -f "$TMP"/rank*.rc
        cmp -s <(strip "$TMP/$a-mp$n.jsonl") <(strip "$TMP/$a-tp$n.jsonl") && ok "$a --tp $n as processes: the bits of one process" ||
            notok "$a --tp $n as processes: the bits of one process" "$(diff <(strip "$TMP/$a-mp$n.jsonl") <(strip "$TMP/$a-tp$n.jsonl") | head -4)"
        expect_logprobs_close "$a --tp $n as processes: one backend's texts, logprobs within 1e-5" "$TMP/$a-mp$n.jsonl" \
            "$TMP/$a-one.jsonl" 1e-5
    done
done
# the launcher's environment instead of the flags (mpirun sets OMPI_COMM_WORLD_*), -v names the rank
PORT=$((PORT + 1))
( OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 CLLM_MASTER=127.0.0.1:$PORT timeout 120 $CLLM generate --cpu -c 64 \
    -t 1 -m $F/llama.gguf --tp 2 -v 2> "$TMP/e1.err"; echo $? > "$TMP/e1.rc" ) &
expect_exit "--tp 2: ranks from the environment" 0 env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 \
    CLLM_MASTER=127.0.0.1:$PORT timeout 120 $GEN -m $F/llama.gguf --tp 2 -o "$TMP/env.jsonl"
wait
cmp -s <(strip "$TMP/env.jsonl") <(strip "$TMP/llama-tp2.jsonl") && ok "ranks from the environment: same output" ||
    notok "ranks from the environment: same output" "$(head -c 300 "$TMP/e1.err")"
expect_grep "-v: the server names its rank" "$TMP/e1.err" "rank 1 of 2 serves tensor-parallel rank 1 on cpu"

# a rank server killed mid-run: the driver exits 2 within its deadline, naming the rank
for i in $(seq 1 24); do echo "prompt $i of a long run"; done > "$TMP/long.txt"
LONG="$CLLM generate --cpu -c 2100 -t 1 -m $F/llama.gguf -n 2000 --ignore-eos --tp 2 --world-size 2"
PORT=$((PORT + 1))
CLLM_PP_TIMEOUT=10 $LONG --rank 1 --master 127.0.0.1:$PORT 2> /dev/null &
R1=$!  # the cllm process itself: killed below
( sleep 2; kill -9 $R1 2>/dev/null ) &
expect_exit "a killed rank: the driver exits 2" 2 env CLLM_PP_TIMEOUT=10 timeout 100 $LONG --rank 0 \
    --master 127.0.0.1:$PORT -i "$TMP/long.txt" -o "$TMP/dead.jsonl"
wait
expect_grep "and names the rank" "$TMP/err" "tensor-parallel rank 1"
# a silent one (stopped): the driver fails at CLLM_PP_TIMEOUT
PORT=$((PORT + 1))
CLLM_PP_TIMEOUT=3 $LONG --rank 1 --master 127.0.0.1:$PORT 2> /dev/null &
R1=$!
( sleep 2; kill -STOP $R1 2>/dev/null ) &
expect_exit "a stopped rank: the driver exits 2" 2 env CLLM_PP_TIMEOUT=3 timeout 100 $LONG --rank 0 \
    --master 127.0.0.1:$PORT -i "$TMP/long.txt" -o "$TMP/silent.jsonl"
expect_grep "and says it did not answer" "$TMP/err" "tensor-parallel rank 1.*no answer within 3 s"
kill -9 $R1 2>/dev/null; wait
# the driver killed: the server exits 2 saying so
PORT=$((PORT + 1))
( CLLM_PP_TIMEOUT=10 timeout 100 $LONG --rank 1 --master 127.0.0.1:$PORT 2> "$TMP/s1.err"; echo $? > "$TMP/s1.rc" ) &
CLLM_PP_TIMEOUT=10 $LONG --rank 0 --master 127.0.0.1:$PORT -i "$TMP/long.txt" -o "$TMP/d0.jsonl" 2> /dev/null &
R0=$!
sleep 2; kill -9 $R0 2>/dev/null
wait
[ "$(cat "$TMP/s1.rc")" = 2 ] && ok "the driver killed: the server exits 2" || notok "the driver killed: the server exits 2" "exit $(cat "$TMP/s1.rc")"
expect_grep "and names the driver" "$TMP/s1.err" "rank 1: .*tensor-parallel rank 0"

# refused
expect_exit "--tp 2 --world-size 3 exits 2" 2 $GEN -m $F/llama.gguf --tp 2 --world-size 3 --rank 0 --master 127.0.0.1:1
expect_grep "and says one process per rank" "$TMP/err" "--tp 2 but --world-size 3: one process per tensor-parallel rank"
expect_exit "--tp 3 --world-size 3 on 4 heads exits 2" 2 env CLLM_PP_TIMEOUT=2 $GEN -m $F/llama.gguf --tp 3 \
    --world-size 3 --rank 0 --master 127.0.0.1:1
expect_grep "and names the heads" "$TMP/err" "4 attention heads do not split evenly over 3 ranks"
