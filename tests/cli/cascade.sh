#!/usr/bin/env bash
# cascade.sh — cascade attention end to end on the tiny model (CPU): prompts
# sharing a 320-token prefix (above the rule's 256) with suffixes of their
# own give the same greedy outputs with cascade on (the default, where it
# pays), forced on every group (CLLM_CASCADE=always) and off; a bad value of
# CLLM_CASCADE exits 2 naming it. (That the cascade path runs, and the
# prefix is computed once, is checked in tests/test_scheduler.c.)
source "$(dirname "$0")/lib.sh"
TG="$CLLM generate -m tests/fixtures/tiny/llama.gguf --cpu -t 2 -n 24 --temp 0 --ignore-eos -c 512"

python3 - > "$TMP/prompts.jsonl" <<'PY'
import json, random
r = random.Random(39)
prefix = [r.randint(3, 280) for _ in range(320)]
for i in range(12):
    print(json.dumps({"id": i, "prompt": prefix + [r.randint(3, 280) for _ in range(r.randint(3, 60))]}))
PY

# the result lines without their timing
results() { sed 's/,"seconds":[0-9.e+-]*//' "$1"; }

for mode in off on always; do
    expect_exit "generate with CLLM_CASCADE=$mode" 0 env CLLM_CASCADE=$mode $TG -i "$TMP/prompts.jsonl" -o "$TMP/$mode.jsonl"
    results "$TMP/$mode.jsonl" > "$TMP/$mode.txt"
done
[ "$(wc -l < "$TMP/off.txt")" = 12 ] && [ "$(grep -c '"completion_tokens":24' "$TMP/off.txt")" = 12 ] \
    && ok "12 results of 24 tokens" || notok "12 results of 24 tokens" "$(head -c 600 "$TMP/off.txt")"
for mode in on always; do
    cmp -s "$TMP/off.txt" "$TMP/$mode.txt" && ok "CLLM_CASCADE=$mode: outputs identical to off" \
        || notok "CLLM_CASCADE=$mode: outputs identical to off" "$(diff "$TMP/off.txt" "$TMP/$mode.txt" | head -6)"
done

expect_exit "CLLM_CASCADE=sometimes exits 2" 2 env CLLM_CASCADE=sometimes $TG -i "$TMP/prompts.jsonl" -o "$TMP/bad.jsonl"
expect_grep "CLLM_CASCADE=sometimes: the value named" "$TMP/err" "CLLM_CASCADE: 'sometimes' is not off, on or always"
