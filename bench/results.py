#!/usr/bin/env python3
"""results.py — the results folder of one benchmark generation (stdlib only).

Every bench script writes one JSON per section into the folder ($OUT):
single.json, quant.json, kv_fp8.json, attention.json, throughput.json,
fixed_lengths.json, pipeline.json, tensor_parallel.json. Each is wrapped here with what its tables need beside the
figures: the section, the date (UTC), the cllm commit, the device as
nvidia-smi reports it, and the limits measured on it (limits.json, written
by bench/limits.py at the start of the run). run.json (bench/run.sh) says
why a section left no results.

    python3 bench/results.py device                   # the device, as JSON
    python3 bench/results.py limits-ok OUT            # exit 0 when OUT/limits.json is of this device
    python3 bench/results.py limits-args OUT          # "--peak-tflops X --peak-tbps Y" from OUT/limits.json
    python3 bench/results.py note OUT SECTION TEXT    # OUT/run.json: why SECTION has no results
    python3 bench/results.py start OUT SECTIONS       # OUT/run.json: the run's date, commit, device, sections
"""
import datetime
import json
import os
import subprocess
import sys

SECTIONS = ["single", "quant", "kv_fp8", "attention", "throughput", "fixed_lengths", "pipeline", "tensor_parallel"]


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def device():
    """The GPUs as nvidia-smi reports them: the first one's name and driver, how many."""
    rows = []
    for line in _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                      "--format=csv,noheader,nounits"]).splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            rows.append(parts)
    if not rows:
        return {"name": "unknown (no nvidia-smi)", "driver": "unknown", "count": 0, "memory_mib": None}
    names = sorted({r[0] for r in rows})
    try:
        mem = int(float(rows[0][2]))
    except ValueError:
        mem = None
    return {"name": rows[0][0] if len(names) == 1 else " + ".join(names), "driver": rows[0][1],
            "count": len(rows), "memory_mib": mem}


def commit():
    """BENCH_COMMIT, else git's short hash (+dirty when tracked files differ from it)."""
    c = os.environ.get("BENCH_COMMIT")
    if c:
        return c
    h = _run(["git", "rev-parse", "--short", "HEAD"]).strip() or "unknown"
    if h != "unknown" and subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode == 1:
        h += "+dirty"
    return h


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_section(out, name, data, gpus_used=1):
    """Writes OUT/NAME.json: data with the section, date, commit, device and limits."""
    doc = {"section": name, "date": now(), "commit": commit(), "device": device(), "gpus_used": gpus_used,
           "limits": load(os.path.join(out, "limits.json"))}
    doc.update(data)
    tmp = os.path.join(out, name + ".json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, os.path.join(out, name + ".json"))
    return doc


def note(out, section, text):
    path = os.path.join(out, "run.json")
    run = load(path) or {}
    run.setdefault("notes", {})[section] = text
    with open(path, "w") as f:
        json.dump(run, f, indent=1)


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd = argv[0]
    if cmd == "device":
        print(json.dumps(device()))
    elif cmd == "limits-ok":
        lim = load(os.path.join(argv[1], "limits.json"))
        sys.exit(0 if lim and lim.get("device") == device()["name"].split(" + ")[0] else 1)
    elif cmd == "limits-args":
        lim = load(os.path.join(argv[1], "limits.json")) or {}
        if lim.get("matmul_tflops") and lim.get("copy_tbps"):
            print(f"--peak-tflops {lim['matmul_tflops']:.1f} --peak-tbps {lim['copy_tbps']:.3f}")
    elif cmd == "note":
        note(argv[1], argv[2], " ".join(argv[3:]))
    elif cmd == "start":
        path = os.path.join(argv[1], "run.json")
        with open(path, "w") as f:
            json.dump({"date": now(), "commit": commit(), "device": device(),
                       "sections": argv[2].split(",") if len(argv) > 2 else [], "notes": {}}, f, indent=1)
    else:
        sys.exit(f"results.py: unknown command '{cmd}'\n\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
