#!/usr/bin/env bash
# progress.sh — `cllm generate`'s progress line on a terminal: run under a
# pseudo-terminal of a fixed size (80 and 40 columns), the output on stderr
# is replayed on a small screen model (\r, \n, ESC[K, autowrap at the width).
# No repaint may reach the last column (it would wrap and scroll a line per
# repaint), and the final summary must start a row of its own.
source "$(dirname "$0")/lib.sh"
for i in $(seq 1 1500); do echo "Prompt number $i says hello to the little model"; done > "$TMP/many.txt"

for cols in 80 40; do
python3 - "$cols" "$TMP/pty-$cols.log" $CLLM generate -m tests/fixtures/tiny/llama.gguf --cpu -n 24 --temp 0 -c 64 \
    --max-seqs 16 -i "$TMP/many.txt" -o "$TMP/many-$cols.jsonl" > "$TMP/s$cols" 2>&1 <<'PY'
import fcntl, os, pty, re, select, struct, subprocess, sys, termios, time
cols, log, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
master, slave = pty.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env={**os.environ, "COLUMNS": "300"})
os.close(slave)
data = b""
while True:
    r, _, _ = select.select([master], [], [], 0.5)
    if r:
        try: chunk = os.read(master, 65536)
        except OSError: chunk = b""
        if not chunk: break
        data += chunk
    elif p.poll() is not None: break
rc = p.wait()
open(log, "wb").write(data)
# The screen: rows of text; a character written at column cols wraps.
rows, row, col, wraps, repaints = [""], 0, 0, 0, data.count(b"\r") 
text = data.decode("utf-8", "replace")
i = 0
while i < len(text):
    c = text[i]
    if c == "\x1b":
        m = re.match(r"\x1b\[([0-9;]*)([A-Za-z])", text[i:])
        if m and m.group(2) == "K": rows[row] = rows[row][:col]
        i += len(m.group(0)) if m else 1
        continue
    if c == "\r": col = 0
    elif c == "\n": row += 1; col = 0; rows.append("") if row == len(rows) else None
    else:
        if col == cols:
            wraps += 1; row += 1; col = 0
            if row == len(rows): rows.append("")
        rows[row] = rows[row][:col].ljust(col) + c + rows[row][col + 1:]
        col += 1
    i += 1
rows = [r.rstrip() for r in rows if r.strip()]
print(f"rc {rc} repaints {repaints} wraps {wraps} widest {max((len(r) for r in rows), default=0)} rows {len(rows)}")
for r in rows: print("row|" + r)
PY
done
for cols in 80 40; do
    read -r _ rc _ rep _ wraps _ widest _ nrows < <(head -1 "$TMP/s$cols")
    [ "$rc" = 0 ] && ok "$cols columns: generate ran" || notok "$cols columns: generate ran" "$(head -c 600 "$TMP/s$cols")"
    [ "${rep:-0}" -ge 3 ] && ok "$cols columns: the progress line was repainted ($rep times)" \
        || notok "$cols columns: the progress line was repainted" "$rep repaints; make the run longer"
    [ "$wraps" = 0 ] && [ "$widest" -lt "$cols" ] && ok "$cols columns: no line reaches the width" \
        || notok "$cols columns: no line reaches the width" "wraps $wraps, widest $widest" "$(grep -m3 '^row|' "$TMP/s$cols")"
    [ "$nrows" = 1 ] && grep -qE '^row\|1500/1500 done' "$TMP/s$cols" && ok "$cols columns: the final summary alone on its row" \
        || notok "$cols columns: the final summary alone on its row" "$(grep '^row|' "$TMP/s$cols" | head -4)"
done
