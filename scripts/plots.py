#!/usr/bin/env python3
"""Draws the pictures of README.md and docs/ (PNG, 100 dpi) from committed results files.

  scripts/plots.py [--results bench/results] [--out docs/img] [--bench-plots]

The pictures the pages show are listed in PICTURES below, each with the results files it
is drawn from; scripts/check_docs.py reads the same list and checks that each picture's
caption and the numbers beside it agree with those files. Today:
  cpu_peers.png             towerlab against PyTorch, TensorFlow and JAX on the CPU, from
                            bench/compare_peers.py's JSON (cpu_peers_avx512_400fa09.json), the
                            machine, CPU flags, load and commit of each run written below it
  trace.png                 three steps of the sample on two CPU towers, from
                            scripts/record_trace.py's JSON (trace_400fa09.json)

--bench-plots also draws, from Google Benchmark JSON in --results (each file optional):
  trainer_bench.json        -> towers_speed.png: FashionNet images/s against towers
  matmul_bench.json         -> gemm_cpu.png: towerlab's SGEMM against OpenBLAS
  allreduce_bench.json      -> ring_bandwidth_cpu.png: ring bus bandwidth against size
  gpu/*.json                -> gemm_gpu.png, ring_bandwidth_gpu.png, towers_speed_gpu.png
No page shows these: the committed JSON was measured at load 16-18 on a 2-CPU machine.
Measure again on a quiet machine, add the picture to PICTURES with its caption, and
show it. The JSON comes from (CPU; on a GPU machine the same with build/gpu/bench and
--benchmark_filter=cuda, written under gpu/):
  build/cpu/bench/trainer_bench --benchmark_filter=cpu_local --benchmark_format=json > trainer_bench.json
  OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=2 build/cpu/bench/matmul_bench \
    --benchmark_filter='Cpu.*cpu_NN' --benchmark_repetitions=3 --benchmark_format=json > matmul_bench.json
  build/cpu/bench/allreduce_bench --benchmark_filter=BM_RingAllReduce/cpu/ --benchmark_format=json \
    > allreduce_bench.json
(OPENBLAS_CORETYPE=SkylakeX where the CPU has avx512f.) Needs matplotlib: Debian's
python3-matplotlib (/usr/bin/python3 scripts/plots.py), or the peers' virtual environment
(build/peers-venv/bin/python scripts/plots.py).
"""
import argparse
import json
import os
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DPI = 100


def note(msg):
    print(f"plots: {msg}", file=sys.stderr)


def load(path):
    if not os.path.exists(path):
        note(f"{os.path.relpath(path, ROOT)} not found: its plot is skipped")
        return None
    with open(path) as f:
        return json.load(f)


def benchmark_rows(doc):
    """{run_name: row} from Google Benchmark JSON: the "max" aggregate where the bench
    ran repetitions (the repetition least disturbed by other work), else the mean of
    the plain runs of that name."""
    plain, best = defaultdict(list), {}
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "max":
                best[name] = b
        else:
            plain[name].append(b)
    rows = {}
    for name, runs in plain.items():
        if name in best:
            rows[name] = best[name]
            continue
        row = dict(runs[0])
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = sum(r[key] for r in runs) / len(runs)
        rows[name] = row
    return rows


def args_of(name):
    """The integer arguments of a benchmark name: BM_X/cpu_local/2/128/real_time -> [2, 128]."""
    return [int(p) for p in name.split("/")[1:] if re.fullmatch(r"\d+", p)]


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    note(f"wrote {os.path.relpath(path, ROOT)}")


def context_of(doc):
    """The machine and its load when the bench started: on a shared machine the load
    says how far the figures fall short of the machine's own."""
    ctx = doc.get("context", {})
    text = f"{ctx.get('num_cpus', '?')} CPUs"
    if ctx.get("load_avg"):
        text += f", load {ctx['load_avg'][0]:.1f}"
    return text


def plot_towers(doc, out, name, prefix, title):
    """images/s (items_per_second) against towers, one line per configuration and batch."""
    lines = defaultdict(dict)
    for run, row in benchmark_rows(doc).items():
        parts = run.split("/")
        if parts[0] != "BM_FashionNetStep" or not parts[1].startswith(prefix):
            continue
        towers, batch = args_of(run)[:2]
        mode = parts[1].split("_", 1)[1]
        lines[f"{mode} batch norm, batch {batch}"][towers] = row["items_per_second"]
    if not lines:
        note(f"no BM_FashionNetStep {prefix}* rows: {name} skipped")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(lines.items()):
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.set_xlabel("towers")
    ax.set_ylabel("images/s (training step, FashionNet)")
    ax.set_xticks(sorted({x for p in lines.values() for x in p}))
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title} ({context_of(doc)})")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out, name)


def plot_gemm(doc, out, name, series, title):
    """GFLOP/s against the square size n, one line per (benchmark prefix, label)."""
    rows = benchmark_rows(doc)
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = 0
    for prefix, label in series:
        points = {args_of(run)[0]: row["FLOP/s"] / 1e9 for run, row in rows.items()
                  if run.startswith(prefix + "/") and "FLOP/s" in row}
        if points:
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
            drawn += 1
    if not drawn:
        plt.close(fig)
        note(f"no {', '.join(p for p, _ in series)} rows: {name} skipped")
        return
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("n (C[n,n] = A[n,n] B[n,n], float32)")
    ax.set_ylabel("GFLOP/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title} ({context_of(doc)})")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out, name)


def plot_ring(doc, out, name, prefix, title):
    """Bus bandwidth (busbw) against message size, one line per tower count."""
    lines = defaultdict(dict)
    for run, row in benchmark_rows(doc).items():
        if run.startswith(prefix + "/") and "busbw" in row:
            towers, size = args_of(run)[:2]
            lines[towers][size] = row["busbw"] / 1e9
    if not lines:
        note(f"no {prefix} rows: {name} skipped")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for towers, points in sorted(lines.items()):
        xs = sorted(points)
        ax.plot([x / 2**20 for x in xs], [points[x] for x in xs], marker="o", label=f"{towers} towers")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("message size per tower (MiB)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title} ({context_of(doc)})")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out, name)


def peers_facts(doc):
    """What a caption must say about one compare_peers.py run: machine, flags, load, commit."""
    m = doc["machine"]
    loads = [r["load_average_1min"] for rnd in doc["rounds"] for r in rnd.values()]
    return {
        "commit": doc["towerlab_commit"],
        "date": doc["date"],
        "cpu": f"{m['cpus']}-CPU {m['cpu_model']}",
        "flags": " ".join(m["flags"]),
        "load": f"{min(loads):.1f} to {max(loads):.1f}",
    }


def plot_peers(docs, out, name="cpu_peers.png"):
    """images/s per contender, one bar per run (median of its rounds, min-max whiskers),
    labelled with the median of the per-round ratio to the best peer; the machine, its
    CPU flags, the load and the commit of each run below."""
    contenders = [row["contender"] for row in docs[0]["summary"]]
    labels = [row["label"].split(" (`")[0] for row in docs[0]["summary"]]
    runs = len(docs)
    height = 0.8 / runs
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(contenders) * max(runs, 1) ** 0.5 + 2.4))
    top = 0
    for k, doc in enumerate(docs):
        rows = {row["contender"]: row for row in doc["summary"]}
        for i, c in enumerate(contenders):
            row = rows[c]
            med = row["median_images_per_second"]
            y = i + (k - (runs - 1) / 2) * height
            color = "tab:blue" if c.startswith("towerlab") else "tab:gray"
            ax.barh(y, med, height * 0.9, color=color, alpha=1.0 - 0.35 * k,
                    xerr=[[med - row["min_images_per_second"]], [row["max_images_per_second"] - med]],
                    capsize=2)
            ratio = row["median_ratio_to_best_peer"]
            ax.text(row["max_images_per_second"], y, f" {med:.0f} ({ratio:.2f}x)  run {k + 1}",
                    va="center", fontsize=8)
            top = max(top, row["max_images_per_second"])
    ax.set_yticks(range(len(contenders)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.45)
    ax.set_xlabel("images/s, median of rounds (min-max); in brackets the median ratio to the best peer")
    s = docs[0]["settings"]
    ax.set_title(f"FashionNet training, batch {s['batch']}, {s['threads']} threads, "
                 f"{s['rounds']} rounds x {s['steps']} steps per run", fontsize=10)
    lines = []
    for k, doc in enumerate(docs):
        f = peers_facts(doc)
        lines.append(f"run {k + 1}: towerlab {f['commit']}, {f['date']}, {f['cpu']} ({f['flags']}),\n"
                     f"    load average {f['load']} before each contender")
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7.5, va="bottom")
    fig.tight_layout(rect=(0, 0.02 + 0.045 * runs, 1, 1))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    note(f"wrote {os.path.relpath(path, ROOT)}")


# The pictures docs/ shows, each from committed results: (picture, results files);
# DRAW says how each is drawn.
# scripts/check_docs.py reads this list too, and checks that the captions and the
# numbers beside each picture agree with these files.
def plot_trace(docs, out, name="trace.png"):
    """scripts/trace_png.py's timeline of scripts/record_trace.py's trace: each tower's
    layers, the master's update and, below, the first step's ring."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.dont_write_bytecode = True
    import trace_png  # noqa: E402  (the timeline's one drawing)
    doc = docs[0]
    names, spans = trace_png.parse(doc, "trace")
    towers = doc["command"].split("--devices ")[1].split()[0]
    title = (f"FashionNet on {towers} (steps {', '.join(doc['steps'])}), towerlab "
             f"{doc['towerlab_commit']}, {doc['machine']['cpu_model']}, "
             f"load {doc['load_average_1min']:.1f}")
    path = os.path.join(out, name)
    trace_png.render(names, spans, path, title)
    note(f"wrote {os.path.relpath(path, ROOT)}")


# The pictures the pages show: (picture, its results files, how it is drawn).
PICTURES = [
    ("cpu_peers.png", ["cpu_peers_avx512_400fa09.json"]),
    ("trace.png", ["trace_400fa09.json"]),
]
DRAW = {"cpu_peers.png": plot_peers, "trace.png": plot_trace}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    p.add_argument("--bench-plots", action="store_true",
                   help="also draw the Google Benchmark plots (towers, GEMM, ring) from "
                        "trainer_bench.json, matmul_bench.json and allreduce_bench.json; docs/ "
                        "shows none of them, as the committed JSON was measured at load 16-18")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = args.results
    gpu = os.path.join(res, "gpu")

    for name, files in PICTURES:
        docs = [load(os.path.join(res, f)) for f in files]
        if all(docs):
            DRAW[name](docs, args.out, name)
    if not args.bench_plots:
        return
    if doc := load(os.path.join(res, "trainer_bench.json")):
        plot_towers(doc, args.out, "towers_speed.png", "cpu", "FashionNet step on CPU towers")
    if doc := load(os.path.join(res, "matmul_bench.json")):
        plot_gemm(doc, args.out, "gemm_cpu.png",
                  [("BM_CpuTowerlab/cpu_NN", "towerlab"), ("BM_CpuOpenblas/cpu_NN", "OpenBLAS")],
                  "SGEMM on the CPU")
    if doc := load(os.path.join(res, "allreduce_bench.json")):
        plot_ring(doc, args.out, "ring_bandwidth_cpu.png", "BM_RingAllReduce/cpu", "Ring all-reduce, CPU towers")
    if doc := load(os.path.join(gpu, "trainer_bench.json")):
        plot_towers(doc, args.out, "towers_speed_gpu.png", "cuda", "FashionNet step on GPU towers")
    if doc := load(os.path.join(gpu, "matmul_bench.json")):
        plot_gemm(doc, args.out, "gemm_gpu.png",
                  [("BM_Cuda/cuda_NN", "towerlab"), ("BM_Cuda/cublas_NN", "cuBLAS")],
                  "SGEMM on the GPU")
    if doc := load(os.path.join(gpu, "allreduce_bench.json")):
        plot_ring(doc, args.out, "ring_bandwidth_gpu.png", "BM_RingAllReduce/cuda", "Ring all-reduce, GPU towers")


if __name__ == "__main__":
    main()
