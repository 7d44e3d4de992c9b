#!/usr/bin/env python3
"""Records the trace that docs/trace.md shows: a few steps of the fashion_mnist sample
(fashion_mnist --trace), written as a results file with the facts its caption states.

  scripts/record_trace.py [--sample build/cpu/samples/fashion_mnist] [--devices cpu,cpu,cpu]
                          [--master cpu|sharded|cuda:N] [--steps 20:22]
                          [--out bench/results/trace_COMMIT.json]

The file is the sample's Chrome trace (open it in https://ui.perfetto.dev) with these keys
beside traceEvents: towerlab_commit, date, machine (CPU model, its vector extensions, the
kernel), load_average_1min (before the run), command, and steps: each traced step's span
in milliseconds, first span start to last span end. scripts/plots.py draws
docs/img/trace.png from it (scripts/trace_png.py's picture), and scripts/check_docs.py
holds the caption to it. Record on a quiet machine: a trace of a loaded one shows the
other processes, not towerlab.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import compare_peers  # noqa: E402  (machine() and git_commit(), as the peer comparison writes them)


def step_spans(trace):
    """{step: milliseconds from its first span's start to its last span's end}."""
    bounds = {}
    for e in trace["traceEvents"]:
        step = e.get("args", {}).get("step")
        if e.get("ph") != "X" or step is None:
            continue
        lo, hi = bounds.get(step, (e["ts"], e["ts"] + e["dur"]))
        bounds[step] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))
    return {str(s): round((hi - lo) / 1000.0, 1) for s, (lo, hi) in sorted(bounds.items())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", default=os.path.join(ROOT, "build", "cpu", "samples", "fashion_mnist"))
    p.add_argument("--devices", default="cpu,cpu,cpu")
    p.add_argument("--master", help="the sample's --master (default: its own default)")
    p.add_argument("--steps", default="20:22", help="FIRST:LAST, the traced steps (1-based)")
    p.add_argument("--out", help="default: bench/results/trace_COMMIT.json")
    args = p.parse_args()
    commit = compare_peers.git_commit()
    out = args.out or os.path.join(ROOT, "bench", "results", f"trace_{commit}.json")
    last = int(args.steps.split(":")[-1])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        cmd = [args.sample, "--devices", args.devices] + (["--master", args.master] if args.master else [])
        cmd += ["--epochs", "1", "--steps", str(last + 2), "--test-samples", "256", "--trace", raw,
                "--trace-steps", args.steps]
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(raw) as f:
            trace = json.load(f)
    trace.update({
        "towerlab_commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": compare_peers.machine(),
        "load_average_1min": round(load, 2),
        "command": " ".join(["fashion_mnist"] + cmd[1:-4] + ["--trace", "FILE", "--trace-steps",
                                                             args.steps]),
        "steps": step_spans(trace),
    })
    with open(out, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
        f.write("\n")
    print(f"{os.path.relpath(out, ROOT)}: steps {trace['steps']} ms, load {load:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
