#!/usr/bin/env python3
"""Draws the pictures of README.md and docs/ (PNG, 100 dpi) from committed results files.

  scripts/plots.py [--results bench/results] [--out docs/img] [--bench-plots]

The pictures the pages show are listed in PICTURES below, each with the results files it
is drawn from; scripts/check_docs.py reads the same list and checks that each picture's
caption and the numbers beside it agree with those files. Today:
  cpu_peers.png             towerlab against PyTorch, TensorFlow and JAX on the CPU, from
                            bench/compare_peers.py's JSON, one run on an AVX2 machine and one
                            on an AVX-512 machine (cpu_peers_avx2_66d322b.json,
                            cpu_peers_avx512_486e878.json), the machine, CPU flags, load and
                            commit of each run written below it
  trace.png                 three steps of the sample on two CPU towers, from
                            scripts/record_trace.py's JSON (trace_7991b3c.json)
  trace_sharded.png         the same with the master sharded over the two towers
                            (trace_0b3b2de.json)
  gpu_kernels.png           each kernel's % of its reference on a GPU (SGEMM against cuBLAS,
                            conv2d against cuDNN, the memory-bound kernels against the copy),
                            the targets marked, from scripts/gpu.py's benches' JSON
  ring_bandwidth_gpu.png    the ring's bytes read + written per second against size, per
                            tower count, beside the copy's (allreduce_bench.json)
  towers_speed_gpu.png      FashionNet's step time against towers on one GPU (trainer_bench.json)
  gpu_peers.png             FashionNet's step against PyTorch eager and CUDA graph, from
                            bench/gpu_peers.py's JSON (gpu_peers.json)
The GPU pictures pair the runs as bench/gpu_report.py's tables do (its *_rows functions),
and name the device and commit of their results folder (its build-info.txt and summaries).

--bench-plots also draws, from Google Benchmark JSON in --results (each file optional):
  trainer_bench.json        -> towers_speed.png: FashionNet images/s against towers
  matmul_bench.json         -> gemm_cpu.png: towerlab's SGEMM against OpenBLAS
  allreduce_bench.json      -> ring_bandwidth_cpu.png: ring bus bandwidth against size
No page shows these and no such JSON is committed (the last was measured at load 16-18
on a 2-CPU machine). Measure on a quiet machine, add the picture to PICTURES with its
caption, and show it. The JSON comes from:
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
import matplotlib.lines  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from PIL import Image  # noqa: E402  (Pillow comes with matplotlib)

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


def save(fig, out, name, layout=True):
    path = os.path.join(out, name)
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    # A palette of 64 colours keeps a picture of flat bars and lines under a third of its
    # size, with nothing lost to the eye.
    Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)
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


def plot_peers(paths, out, name="cpu_peers.png"):
    """images/s per contender, one bar per run (median of its rounds, min-max whiskers),
    labelled with the median of the per-round ratio to the best peer; the machine, its
    CPU flags, the load and the commit of each run below."""
    docs = [load(p) for p in paths]
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


def plot_trace(paths, out, name="trace.png"):
    """scripts/trace_png.py's timeline of scripts/record_trace.py's trace: each tower's
    layers, the master's update and, below, the first step's ring."""
    docs = [load(p) for p in paths]
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.dont_write_bytecode = True
    import trace_png  # noqa: E402  (the timeline's one drawing)
    doc = docs[0]
    names, spans = trace_png.parse(doc, "trace")
    towers = doc["command"].split("--devices ")[1].split()[0]
    if "--master " in doc["command"]:
        towers += f", master {doc['command'].split('--master ')[1].split()[0]}"
    title = (f"FashionNet on {towers} (steps {', '.join(doc['steps'])}), towerlab "
             f"{doc['towerlab_commit']}, {doc['machine']['cpu_model']}, "
             f"load {doc['load_average_1min']:.1f}")
    path = os.path.join(out, name)
    trace_png.render(names, spans, path, title)
    note(f"wrote {os.path.relpath(path, ROOT)}")


def gpu_report():
    """bench/gpu_report.py: it pairs each GPU run with its reference; the pictures draw its
    rows, so that they show what its tables say."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    sys.dont_write_bytecode = True
    import gpu_report as report  # noqa: E402
    return report


def gpu_run(paths):
    """'NVIDIA H100 80GB HBM3, towerlab 80982fc': the device and the commit of the results
    folders (their build-info.txt and summaries), every commit where they are several
    ('towerlab c66a6c2, ea44967')."""
    infos = [gpu_report().run_info(folder) for folder in dict.fromkeys(map(os.path.dirname, paths))]
    commits = list(dict.fromkeys((i["commit"] or "?")[:7] for i in infos))
    return f"{infos[0]['device'] or 'an unnamed GPU'}, towerlab {', '.join(commits)}"


MET, NOT_MET = "tab:blue", "tab:orange"
CUT = 150  # % of the reference; longer bars are cut there, their value written beside


def short_shape(shape):
    """N:32/C:64/H:56/W:56 -> 32x64x56x56, 16777216 -> 16M (elements), 4096/1000 -> 4096x1000."""
    numbers = [int(n) for n in re.findall(r"\d+", shape)]
    if len(numbers) == 1 and numbers[0] >= 2**20:
        return f"{numbers[0] / 2**20:g}M"
    return "x".join(str(n) for n in numbers)


def ratio_bars(ax, labels, ratios, targets, title):
    """One bar per kernel: % of its reference, coloured by whether it meets its target,
    the target a red mark across the bar."""
    y = range(len(labels))
    pct = [100 * r for r in ratios]
    colors = [MET if r >= t else NOT_MET for r, t in zip(ratios, targets)]
    ax.barh(y, [min(p, CUT) for p in pct], 0.75, color=colors)
    ax.vlines([100 * t for t in targets], [i - 0.45 for i in y], [i + 0.45 for i in y], color="crimson", lw=1.5)
    ax.axvline(100, color="gray", lw=0.8)
    for i, p, t in zip(y, pct, targets):
        ax.text(max(min(p, CUT), 100 * t) + 1.5, i, f"{p:.0f}%", va="center", fontsize=6.5)
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, CUT + 15)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("% of the reference's speed", fontsize=7.5)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)


def plot_gpu_kernels(paths, out, name="gpu_kernels.png"):
    """% of the reference per kernel, from bench/gpu_report.py's rows: SGEMM against cuBLAS
    per layout and shape, conv2d against cuDNN per layer and pass, and each memory-bound
    kernel against the copy of the same tensor on its large shapes (the copy moves 100 MB
    or more, twice the L2, where the target applies)."""
    report = gpu_report()
    rows = {os.path.basename(p): report.rows_of(p) for p in paths}
    gemm = rows.get("matmul_bench.json", [])
    conv = rows.get("conv2d_bench.json", [])
    memory = [r for f in paths if os.path.basename(f)[:-5] in report.MEMORY_BENCHES
              for r in rows[os.path.basename(f)] if r.target]
    fig = plt.figure(figsize=(12, 9.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[len(gemm) + 3, len(memory) + 3])
    passes = {"forward": "forward", "backward_data": "bwd data", "backward_weight": "bwd weight"}
    ratio_bars(fig.add_subplot(grid[0, 0]), [f"{r.kernel} {r.shape}" for r in gemm],
               [r.ratio for r in gemm], [r.target for r in gemm],
               "SGEMM against cuBLAS (FP32, TF32 off); target 90% at 4096, else 75%")
    ratio_bars(fig.add_subplot(grid[1, 0]), [f"{r.kernel} {short_shape(r.shape)}" for r in memory],
               [r.ratio for r in memory], [r.target for r in memory],
               "memory-bound kernels against the copy (large tensors); target 85%")
    ratio_bars(fig.add_subplot(grid[:, 1]), [f"{r.shape} {passes.get(r.kernel, r.kernel)}" for r in conv],
               [r.ratio for r in conv], [r.target for r in conv],
               "conv2d against cuDNN (FP32 FMA math); target 80%")
    legend = [matplotlib.patches.Patch(color=MET, label="meets its target"),
              matplotlib.patches.Patch(color=NOT_MET, label="below its target"),
              matplotlib.lines.Line2D([], [], color="crimson", label="target")]
    fig.legend(handles=legend, loc="lower right", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"towerlab's kernels as % of the reference's speed (same shape, same run),\n{gpu_run(paths)}",
                 fontsize=11)
    fig.text(0.01, 0.012, f"bars cut at {CUT}%, their value written beside; runs paired as bench/gpu_report.py "
             "pairs them", fontsize=7.5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, out, name, layout=False)


def plot_ring_gpu(paths, out, name="ring_bandwidth_gpu.png"):
    """The all-reduce on virtual towers of one GPU against the size each member reduces: above,
    microseconds per all-reduce, one colour per tower count, the one launch (the default
    there) solid, the ring's steps dashed and the copy of all the members' bytes dotted; below,
    the one launch's bytes read + written per second as % of that copy's (the bound any
    schedule has on one GPU), target 80% where the copy moves 100 MB or more."""
    rows = gpu_report().rows_of(paths[0])
    fig, (ax, below) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=[3, 2])
    colours = {}
    for variant, style, label in (("cuda", "-", "one launch"), ("cuda_steps", "--", "steps")):
        for towers in sorted({r.towers for r in rows}):
            line = sorted((r for r in rows if r.variant == variant and r.towers == towers),
                          key=lambda r: r.size)
            if not line:
                continue
            xs = [r.size / 2**20 for r in line]
            drawn = ax.plot(xs, [r.us for r in line], style, marker="o", ms=3,
                            color=colours.get(towers), label=f"{towers} towers, {label}")
            colours[towers] = drawn[0].get_color()
            if variant == "cuda":
                ax.plot(xs, [r.copy_us for r in line], ":", color=colours[towers],
                        label=f"copy of {towers} members' bytes")
                below.plot(xs, [100 * r.ratio for r in line], marker="o", ms=3,
                           color=colours[towers], label=f"{towers} towers")
    below.axhline(80, color="crimson", lw=1, label="target 80%")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    below.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    below.set_xlabel("bytes each member reduces (MiB)")
    ax.set_ylabel("microseconds per all-reduce")
    below.set_ylabel("one launch, % of the\ncopy's bytes per second")
    below.set_ylim(bottom=0)
    ax.set_title(f"All-reduce on virtual towers of one GPU\n{gpu_run(paths)}", fontsize=10)
    for a in (ax, below):
        a.grid(alpha=0.3)
        a.legend(fontsize=7, ncol=2 if a is ax else 1)
    save(fig, out, name)


def plot_towers_gpu(paths, out, name="towers_speed_gpu.png"):
    """FashionNet's step time against towers (virtual towers of one GPU sharing the batch),
    one line per batch-norm mode and batch."""
    rows = gpu_report().rows_of(paths[0])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, batch in sorted({(r.mode, r.batch) for r in rows}):
        line = [r for r in rows if (r.mode, r.batch) == (mode, batch)]
        ax.plot([r.towers for r in line], [r.ms for r in line], marker="o",
                label=f"batch {batch}, {mode} batch norm")
        for r in line:
            # a value goes below its point where another line's point is just above it
            below = any(0 < o.ms - r.ms < 0.15 for o in rows if o.towers == r.towers)
            ax.annotate(f"{r.ms:.3f}", (r.towers, r.ms), fontsize=7, textcoords="offset points",
                        xytext=(4, -11 if below else 4))
    ax.set_xticks(sorted({r.towers for r in rows}))
    ax.set_xlabel("towers (virtual, on one GPU; the batch is split among them)")
    ax.set_ylabel("ms per training step")
    ax.set_ylim(bottom=0)
    ax.set_title(f"FashionNet training step against towers\n{gpu_run(paths)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out, name)


def plot_gpu_peers(paths, out, name="gpu_peers.png"):
    """images/s per contender at each batch (median of the alternated rounds, min-max
    whiskers), towerlab's bars labelled with their ratio to each PyTorch contender."""
    rows = gpu_report().rows_of(paths[0])
    torch = load(paths[0]).get("torch", "?")
    batches = sorted({r.batch for r in rows})
    fig, axes = plt.subplots(len(batches), 1, figsize=(9, 1.2 + 1.5 * len(batches)), squeeze=False)
    top = max(max(r.rounds) for r in rows)
    for ax, batch in zip(axes[:, 0], batches):
        line = [r for r in rows if r.batch == batch]
        peers = [r for r in line if not r.contender.startswith("towerlab")]
        for i, r in enumerate(line):
            ax.barh(i, r.images_per_second, 0.7, color="tab:gray" if r in peers else "tab:blue",
                    xerr=[[r.images_per_second - min(r.rounds)], [max(r.rounds) - r.images_per_second]],
                    capsize=2)
            text = f" {r.images_per_second:.0f}"
            if r not in peers:
                text += " (" + ", ".join(f"{r.images_per_second / p.images_per_second:.2f}x "
                                         f"{p.contender.replace('PyTorch ', '')}" for p in peers) + ")"
            ax.text(max(r.rounds), i, text, va="center", fontsize=7.5)
        ax.set_yticks(range(len(line)), [r.contender for r in line], fontsize=8)
        ax.set_ylim(len(line) - 0.5, -0.5)
        ax.set_xlim(0, top * 1.35)
        ax.set_title(f"batch {batch}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    axes[-1, 0].set_xlabel("images/s, median of the alternated rounds (min-max)")
    fig.suptitle(f"FashionNet training step, towerlab against PyTorch {torch.split('+')[0]} eager and "
                 f"CUDA graph\n{gpu_run(paths)}", fontsize=10)
    fig.tight_layout()
    save(fig, out, name)


# The pictures the pages show: (picture, its results files, relative to bench/results).
# scripts/check_docs.py reads this list too, and checks that each picture's comment names
# these files and that its caption agrees with them. To redraw a picture from newer
# results, change its line here, then its comment and caption in the pages.
PICTURES = [
    ("cpu_peers.png", ["cpu_peers_avx2_66d322b.json", "cpu_peers_avx512_486e878.json"]),
    ("trace.png", ["trace_7991b3c.json"]),
    ("trace_sharded.png", ["trace_0b3b2de.json"]),
    ("gpu_kernels.png", ["gpu_h100_86a45f7/matmul_bench.json", "gpu_h100_63c29d0/conv2d_bench.json"]
     + [f"gpu_h100_ea44967/{b}_bench.json" for b in ("batchnorm", "bias", "loss")]
     + ["gpu_h100_3a386af/pool2d_bench.json"]),
    ("ring_bandwidth_gpu.png", ["gpu_h100_80480da/allreduce_bench.json"]),
    ("towers_speed_gpu.png", ["gpu_h100_63c29d0/trainer_bench.json"]),
    ("gpu_peers.png", ["gpu_h100_63c29d0/gpu_peers.json"]),
]
# How each is drawn, from the paths of its results files.
DRAW = {"cpu_peers.png": plot_peers, "trace.png": plot_trace,
        "trace_sharded.png": plot_trace,
        "gpu_kernels.png": plot_gpu_kernels,
        "ring_bandwidth_gpu.png": plot_ring_gpu, "towers_speed_gpu.png": plot_towers_gpu,
        "gpu_peers.png": plot_gpu_peers}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    p.add_argument("--bench-plots", action="store_true",
                   help="also draw the Google Benchmark plots (towers, GEMM, ring) from "
                        "trainer_bench.json, matmul_bench.json and allreduce_bench.json in --results; "
                        "docs/ shows none of them and none is committed")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = args.results

    for name, files in PICTURES:
        paths = [os.path.join(res, f) for f in files]
        if all(os.path.exists(p) for p in paths):
            DRAW[name](paths, args.out, name)
        else:
            note(f"{name}: {', '.join(f for f, p in zip(files, paths) if not os.path.exists(p))} "
                 "not found: it is not drawn")
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


if __name__ == "__main__":
    main()
