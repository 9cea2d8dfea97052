#!/usr/bin/env bash
# chat.sh — `cllm chat` driven through a pipe (stdin not a terminal): turns,
# commands, greedy determinism, the context-full message, and the default
# model path.
source "$(dirname "$0")/lib.sh"
M=$MODELS/smollm2-135m-instruct.gguf
CHAT="$CLLM chat -m $M --cpu --temp 0 -n 12"

printf 'What is 2+2?\n/stats\nAnd 3+3?\n/exit\n' > "$TMP/turns"
expect_exit "chat through a pipe" 0 sh -c "$CHAT < $TMP/turns"
cp "$TMP/out" "$TMP/first"
expect_grep "chat: stats command" "$TMP/out" "prompt [0-9]+ tokens, reply [0-9]+ tokens"
n=$(grep -c . "$TMP/out"); [ "$n" -ge 3 ] && ok "chat: two replies printed" || notok "chat: two replies printed" "$(cat "$TMP/out")"
expect_exit "chat again" 0 sh -c "$CHAT < $TMP/turns"
cmp -s <(grep -v '^\[prompt' "$TMP/out") <(grep -v '^\[prompt' "$TMP/first") && ok "greedy chat is deterministic" \
    || notok "greedy chat is deterministic" "$(diff "$TMP/out" "$TMP/first" | head)"

printf 'Hello\n/clear\nHello\n' > "$TMP/turns2"
expect_exit "chat /clear" 0 sh -c "$CHAT < $TMP/turns2"
a=$(sed -n 1p "$TMP/out"); b=$(sed -n 3p "$TMP/out")
[ -n "$a" ] && [ "$a" = "$b" ] && ok "after /clear the same turn gives the same reply" || notok "after /clear the same turn gives the same reply" "'$a' vs '$b'"

printf 'Tell me a long story about dragons.\n' > "$TMP/turns3"
expect_exit "chat: context full is not an error" 0 sh -c "$CLLM chat -m $M --cpu --temp 0 -c 40 < $TMP/turns3"
expect_grep "chat: context full message" "$TMP/err" "context full"

printf 'Hi\n' > "$TMP/turns4"
expect_exit "chat: seeded sampling" 0 sh -c "$CLLM chat -m $M --cpu --temp 0.8 --seed 7 -n 12 < $TMP/turns4"
cp "$TMP/out" "$TMP/s1"
expect_exit "chat: same seed again" 0 sh -c "$CLLM chat -m $M --cpu --temp 0.8 --seed 7 -n 12 < $TMP/turns4"
cmp -s "$TMP/out" "$TMP/s1" && ok "same seed, same reply" || notok "same seed, same reply" "$(cat "$TMP/out" "$TMP/s1")"

expect_exit "chat: unknown template exits 2" 2 sh -c "$CHAT --chat-template nope < /dev/null"
expect_grep "chat: unknown template named" "$TMP/err" "nope"
expect_exit "chat: default model via CLLM_MODELS" 0 sh -c "CLLM_MODELS=$MODELS $CLLM --cpu --temp 0 -n 4 < $TMP/turns4"
expect_exit "chat: missing default model explains" 2 sh -c "CLLM_MODELS=$TMP/none $CLLM --cpu < /dev/null"
expect_grep "chat: fetch hint" "$TMP/err" "fetch.sh"

# Prefix caching: a second turn prefills only what follows the blocks the
# first turn left in the cache; /regen prefills about one block (a hit
# leaves at least two tokens, 2..17 with blocks of 16: a prompt's last rows
# must not run alone, engine_prompt_chunk).
printf 'What is 2+2?\n/stats\nAnd 3+3?\n/stats\n/regen\n/stats\n' > "$TMP/turns5"
expect_exit "chat: turns, /stats, /regen" 0 sh -c "$CHAT < $TMP/turns5"
p=$(grep -o 'prompt [0-9]* tokens' "$TMP/out" | awk '{print $2}' | tr '\n' ' ')
c=$(grep -o 'context [0-9]*/' "$TMP/out" | tr -dc '0-9\n' | tr '\n' ' ')
set -- $p; p1=$1 p2=$2 p3=$3; set -- $c; c1=$1 c2=$2
# (without the cache turn 2 would prefill c2 - 12 tokens, the whole conversation)
[ -n "$p3" ] && [ "$p2" -lt $((c2 - c1)) ] && [ "$p3" -le 17 ] \
    && ok "chat: later turns prefill only new tokens (prompts $p, contexts $c)" \
    || notok "chat: later turns prefill only new tokens" "prompts $p, contexts $c"

# Input that cannot be sent as it is says so (tiny model, CPU): a NUL byte in
# a piped line (the line editor drops it) or in a /read file (it would end the
# turn there) refuses the turn instead of sending another text.
T="$CLLM chat -m tests/fixtures/tiny/llama.gguf --cpu --temp 0 -n 4"
printf 'Hel\0lo\n' > "$TMP/nul_turn"
expect_exit "chat: a NUL byte in a line is not fatal" 0 sh -c "$T < $TMP/nul_turn"
expect_grep "chat: a NUL byte in a line is refused, named" "$TMP/err" "input line had 1 NUL byte: not sent"
[ ! -s "$TMP/out" ] && ok "chat: the line with a NUL byte got no reply" || notok "chat: the line with a NUL byte got no reply" "$(cat -v "$TMP/out")"
printf 'Hel\0lo' > "$TMP/nul.txt"
printf '/read %s\n' "$TMP/nul.txt" > "$TMP/nul_read"
expect_exit "chat: /read of a file with a NUL byte" 0 sh -c "$T < $TMP/nul_read"
expect_grep "chat: /read names the NUL byte and its offset" "$TMP/err" "nul.txt has a NUL byte at offset 3: not sent"

# A system prompt longer than the context is refused at once with its size
# (every turn would fail, and /clear keeps it); /system alone removes one
# that fits but leaves no room for a turn.
long=$(printf 'word %.0s' $(seq 200))
printf '/system %s\nHi\n' "$long" > "$TMP/sys_long"
expect_exit "chat: a /system prompt over the context" 0 sh -c "$T -c 64 < $TMP/sys_long"
expect_grep "chat: /system prompt over the context refused with its size" "$TMP/err" \
    "/system prompt takes [0-9]+ tokens with the chat template, the context holds 64"
grep -q "context full" "$TMP/err" && notok "chat: the turn after a refused /system runs" "$(cat "$TMP/err")" \
    || { [ -s "$TMP/out" ] && ok "chat: the turn after a refused /system runs" || notok "chat: the turn after a refused /system runs" "no reply"; }
expect_exit "chat: --system over the context exits 2" 2 sh -c "$T -c 64 --system '$long' < /dev/null"
expect_grep "chat: --system over the context named" "$TMP/err" "--system prompt takes [0-9]+ tokens.*context holds 64"
printf '/system Be short\nHi\n/system\nHi\n' > "$TMP/sys_full"
expect_exit "chat: a system prompt that leaves no room" 0 sh -c "$T -c 64 < $TMP/sys_full"
expect_grep "chat: context full names the system prompt's share and /system" "$TMP/err" \
    "the system prompt alone takes [0-9]+; /clear starts over keeping it.*/system alone removes it"
expect_grep "chat: /system alone removes the system prompt" "$TMP/out" "system prompt removed"
[ "$(grep -c 'context full' "$TMP/err")" = 1 ] && [ -n "$(sed -n '/system prompt removed/,$p' "$TMP/out" | sed 1d)" ] \
    && ok "chat: after /system alone the turn fits" || notok "chat: after /system alone the turn fits" "$(cat "$TMP/out" "$TMP/err")"

# An unknown /command is named (not answered with the help alone).
printf '/foo bar\n/help\n' > "$TMP/unknown"
expect_exit "chat: an unknown /command" 0 sh -c "$T < $TMP/unknown"
expect_grep "chat: unknown /command named" "$TMP/err" "^unknown command /foo \(try /help\)$"
expect_grep "chat: /help still lists the commands" "$TMP/out" "^commands: /clear"

# With -v through a pipe the statistics start their own line, after the
# reply's (stdout and stderr into one file, as a terminal shows them).
printf 'Hi\nHello\n' > "$TMP/two"
expect_exit "chat -v through a pipe" 0 sh -c "$T -v < $TMP/two > $TMP/both 2>&1"
n=$(grep -c '^\[prompt' "$TMP/both"); glued=$(grep -c '.\[prompt' "$TMP/both")
[ "$n" = 2 ] && [ "$glued" = 0 ] && ok "chat -v: the stats line is not glued to the reply" \
    || notok "chat -v: the stats line is not glued to the reply" "$(cat -v "$TMP/both")"

# Without --seed every reply draws with a fresh seed: the same turns twice,
# and /regen, give other text (the tiny model's nearly flat distribution
# over 512 tokens makes 16 equal draws out of the question).
S="$CLLM chat -m tests/fixtures/tiny/llama.gguf --cpu --temp 1 --top-k 0 --min-p 0 -n 16"
printf 'Hi\n/regen\n' > "$TMP/regen"
expect_exit "chat: sampling without --seed" 0 sh -c "$S < $TMP/regen"
cp "$TMP/out" "$TMP/r1"
expect_exit "chat: sampling without --seed again" 0 sh -c "$S < $TMP/regen"
! cmp -s "$TMP/out" "$TMP/r1" && ok "chat: no --seed, a fresh seed per run" || notok "chat: no --seed, a fresh seed per run" "$(cat -v "$TMP/out")"
[ "$(sed -n 1p "$TMP/out")" != "$(sed -n 2p "$TMP/out")" ] && ok "chat: /regen draws anew" \
    || notok "chat: /regen draws anew" "$(cat -v "$TMP/out")"
expect_exit "chat: /regen with -v" 0 sh -c "$S -v < $TMP/regen"
[ "$(grep -c '^\[prompt' "$TMP/err")" = 2 ] && ok "chat: /regen prints its stats line" || notok "chat: /regen prints its stats line" "$(cat "$TMP/err")"
expect_exit "chat: --seed with /regen" 0 sh -c "$S --seed 3 < $TMP/regen"
cp "$TMP/out" "$TMP/r1"
expect_exit "chat: --seed with /regen again" 0 sh -c "$S --seed 3 < $TMP/regen"
cmp -s "$TMP/out" "$TMP/r1" && ok "chat: --seed makes the conversation reproducible" || notok "chat: --seed makes the conversation reproducible" "$(cat -v "$TMP/out" "$TMP/r1")"

# A model without a chat template is named as such once, with what to expect.
expect_exit "chat: a model without a chat template" 0 sh -c "$T < $TMP/turns4"
expect_grep "chat: no chat template, completions expected" "$TMP/err" "no chat template.*base model.*instruct model"
[ "$(grep -c 'no chat template' "$TMP/err")" = 1 ] && ok "chat: the base-model note is said once" || notok "chat: the base-model note is said once" "$(cat "$TMP/err")"

# The banner: the file's name, parameters and weight type, not general.name.
expect_exit "chat: banner" 0 sh -c "$CHAT < /dev/null"
expect_grep "chat: banner names the model cleanly" "$TMP/err" "^cllm: smollm2-135m-instruct \(135 M parameters, Q4_1,"

# At a terminal (a pseudo-terminal here) text typed while a reply streams is
# neither echoed into it nor sent as the next turn, and Ctrl-C still stops a
# reply.
cat > "$TMP/chat_tty.py" <<'PY'
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
out = b""
def pump(t, until=None):
    global out
    end = time.time() + t
    while time.time() < end and not (until and until in out):
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try: d = os.read(fd, 4096)
            except OSError: return
            if not d: return
            out += d
pump(60, b"> ")
os.write(fd, b"Tell me a story about a cat.\r"); pump(1.5)
os.write(fd, b"SECRET\r")
pump(120, b"[prompt"); pump(0.5)
os.write(fd, b"Count from one to one hundred.\r"); pump(1.5)
os.write(fd, b"\x03")
pump(60, b"[stopped]"); pump(0.5)
os.write(fd, b"\x04"); pump(5)
os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
PY
python3 "$TMP/chat_tty.py" $CLLM chat -m $M --cpu --temp 0 -n 30 > "$TMP/pty_out" 2>&1
{ grep -q SECRET "$TMP/pty_out" || ! grep -q '^\[prompt' "$TMP/pty_out"; } && notok "chat at a terminal: text typed during a reply is not echoed or sent" "$(cat -v "$TMP/pty_out")" \
    || ok "chat at a terminal: text typed during a reply is not echoed or sent"
grep -q '\[stopped\]' "$TMP/pty_out" && ok "chat at a terminal: Ctrl-C stops a reply" \
    || notok "chat at a terminal: Ctrl-C stops a reply" "$(cat -v "$TMP/pty_out")"

# The model's own sampling settings (generation_config.json beside
# config.json) are used where no option is given; a given option wins; a
# hostile file is refused naming the file and the field.
mkdir -p "$TMP/gen" && cp tests/fixtures/tiny/llama/* "$TMP/gen/"
echo '{"do_sample": true, "temperature": 0.5, "top_k": 7, "top_p": 0.8}' > "$TMP/gen/generation_config.json"
G="$CLLM chat -m $TMP/gen --cpu -n 4"
expect_exit "chat: a model with generation_config.json" 0 sh -c "$G < $TMP/turns4"
expect_grep "chat: the model's sampling settings used" "$TMP/err" \
    "generation_config.json recommends.*temperature 0.5, top-k 7, top-p 0.8, min-p 0.05"
expect_exit "chat: options over generation_config.json" 0 sh -c "$G --temp 0.9 --top-p 1 < $TMP/turns4"
expect_grep "chat: a given option wins over the model's" "$TMP/err" "temperature 0.9, top-k 7, top-p 1,"
echo '{"do_sample": false, "temperature": 0.5}' > "$TMP/gen/generation_config.json"
expect_exit "chat: do_sample false" 0 sh -c "$G < $TMP/turns4"
expect_grep "chat: do_sample false is greedy" "$TMP/err" "recommends.*temperature 0,"
echo '{"temperature": "hot"}' > "$TMP/gen/generation_config.json"
expect_exit "chat: a hostile generation_config.json exits 2" 2 sh -c "$G < $TMP/turns4"
expect_grep "chat: hostile generation_config.json named" "$TMP/err" "generation_config.json: field 'temperature' must be a number"

# A model of models.txt whose file carries no sampling settings takes the
# settings of models.txt's sampling column (the file found by path in the
# cache, $CLLM_MODELS); a model outside models.txt does not; a malformed
# column (models.txt beside a copied binary) is refused naming the file.
mkdir -p "$TMP/cache" "$TMP/bin"
cp tests/fixtures/tiny/llama.gguf "$TMP/cache/smollm2-135m-instruct.gguf"
card=$(grep -v '^#' models.txt | awk '$1 == "smollm2-135m-instruct" {print $8}')
ctemp=$(echo "$card" | tr ',' '\n' | sed -n 's/^temperature=//p'); ctop=$(echo "$card" | tr ',' '\n' | sed -n 's/^top_p=//p')
[ -n "$ctemp" ] && [ -n "$ctop" ] && ok "models.txt: the default model's sampling listed ($card)" \
    || notok "models.txt: the default model's sampling listed" "'$card'"
expect_exit "chat: a models.txt model" 0 sh -c "CLLM_MODELS=$TMP/cache $CLLM chat -m $TMP/cache/smollm2-135m-instruct.gguf --cpu -n 2 < $TMP/turns4"
expect_grep "chat: models.txt's sampling used" "$TMP/err" "models.txt entry recommends.*temperature $ctemp, top-k 40, top-p $ctop,"
expect_exit "chat: a models.txt model with --top-p" 0 sh -c "CLLM_MODELS=$TMP/cache $CLLM chat -m $TMP/cache/smollm2-135m-instruct.gguf --cpu -n 2 --top-p 0.5 < $TMP/turns4"
expect_grep "chat: --top-p over models.txt's" "$TMP/err" "temperature $ctemp, top-k 40, top-p 0.5,"
cp tests/fixtures/tiny/llama.gguf "$TMP/cache/other.gguf"
expect_exit "chat: a model outside models.txt" 0 sh -c "CLLM_MODELS=$TMP/cache $CLLM chat -m $TMP/cache/other.gguf --cpu -n 2 < $TMP/turns4"
grep -q "recommends" "$TMP/err" && notok "chat: no models.txt sampling outside models.txt" "$(cat "$TMP/err")" \
    || ok "chat: no models.txt sampling outside models.txt"
cp "$CLLM" "$TMP/bin/cllm"
grep '^#' models.txt > "$TMP/bin/models.txt"
grep -v '^#' models.txt | awk '$1 == "smollm2-135m-instruct" {$8 = "temperature=warm"} {print}' >> "$TMP/bin/models.txt"
expect_exit "chat: a malformed sampling column exits 2" 2 sh -c "CLLM_MODELS=$TMP/cache $TMP/bin/cllm chat -m $TMP/cache/smollm2-135m-instruct.gguf --cpu -n 2 < $TMP/turns4"
expect_grep "chat: the malformed column named" "$TMP/err" "$TMP/bin/models.txt \(smollm2-135m-instruct's sampling column\): temperature 'warm' must be a number"

# models.txt marks every model instruct or base (chat warns of a base default).
bad=$(grep -v '^#' models.txt | grep -v '^\s*$' | awk '$7 != "instruct" && $7 != "base" {print $1}')
[ -z "$bad" ] && ok "models.txt: every model is marked instruct or base" || notok "models.txt: every model is marked instruct or base" "$bad"
[ "$(grep -v '^#' models.txt | grep -v '^\s*$' | head -1 | awk '{print $7}')" = instruct ] \
    && ok "models.txt: the default model is an instruct model" || notok "models.txt: the default model is an instruct model"
