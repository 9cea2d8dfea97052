#!/usr/bin/env python3
"""attention_results.py — bench/attention.sh's results: the lines of
bench_attention (OUT/attention-cllm.txt) and bench/sdpa_reference.py
(OUT/attention-sdpa.txt) as the rows of OUT/attention.json (stdlib only).

    python3 bench/attention_results.py OUT SDPA_EXIT_CODE

bench_attention: RESULT prefill[-fp8] SHAPE MS RATE [splits=N | flat | cascade ...] [copy=MS] [variant=NAME]
sdpa_reference:  RESULT KIND SHAPE BACKEND MS RATE [variant=NAME] | SKIP KIND SHAPE BACKEND REASON [variant=NAME]
A row's "variant" (window4096, softcap50, sinks) is absent for the plain causal kernel; a decode row's
"copy_ms" is a device-to-device cudaMemcpy moving the same bytes (half read, half written). The reference's
backends become impl "sdpa-flash", "sdpa-cudnn" and, for flex_attention's variant rows, "torch-flex"."""
import os
import sys


def unit(kind):
    return "TFLOP/s" if kind == "prefill" else "TB/s"


def split_variant(fields):
    """(fields without a trailing variant=NAME, NAME or None)"""
    if fields and fields[-1].startswith("variant="):
        return fields[:-1], fields[-1][len("variant="):]
    return fields, None


def with_variant(row, variant):
    if variant:
        row["variant"] = variant
    return row


def parse_cllm(lines):
    rows = []
    for line in lines:
        f, variant = split_variant(line.split())
        if len(f) >= 5 and f[0] == "RESULT":
            kind, _, kv = f[1].partition("-")
            impl = "cllm-" + f[5] if kind == "shared" and len(f) >= 6 else "cllm"  # shared: flat | cascade
            row = {"kind": kind, "shape": f[2], "impl": impl, "kv": kv or "bf16", "ms": float(f[3]),
                   "rate": float(f[4]), "unit": unit(kind)}
            copy = [x[len("copy="):] for x in f[5:] if x.startswith("copy=")]
            if copy:  # a device copy of the row's bytes, ms (decode rows)
                row["copy_ms"] = float(copy[0])
            rows.append(with_variant(row, variant))
    return rows


def reference_impl(backend):
    return "torch-flex" if backend == "flex" else "sdpa-" + backend


def parse_reference(lines):
    """(rows, skipped, the reference's own description line)"""
    rows, skipped, ref = [], [], None
    for line in lines:
        f, variant = split_variant(line.split())
        if line.startswith("# "):
            ref = line[2:].strip()
        elif len(f) >= 6 and f[0] == "RESULT":
            rows.append(with_variant({"kind": f[1], "shape": f[2], "impl": reference_impl(f[3]), "kv": "bf16",
                                      "ms": float(f[4]), "rate": float(f[5]), "unit": unit(f[1])}, variant))
        elif len(f) >= 4 and f[0] == "SKIP":
            skipped.append(with_variant({"kind": f[1], "shape": f[2], "impl": reference_impl(f[3]),
                                         "reason": " ".join(f[4:])}, variant))
    return rows, skipped, ref


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    out, sdpa_rc = argv[0], int(argv[1])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import results
    rows = parse_cllm(open(os.path.join(out, "attention-cllm.txt")))
    ref_rows, skipped, ref = parse_reference(open(os.path.join(out, "attention-sdpa.txt")))
    log_path = os.path.join(out, "attention-sdpa.log")
    log = open(log_path).read().strip().splitlines() if os.path.exists(log_path) else []
    error = None if sdpa_rc == 0 else f"bench/sdpa_reference.py exit {sdpa_rc}" + (f": {log[-1][:200]}" if log else "")
    results.write_section(out, "attention", {"reference": ref, "rows": rows + ref_rows, "skipped": skipped,
                                             "error": error})


if __name__ == "__main__":
    main(sys.argv[1:])
