#!/usr/bin/env python3
"""The GPU benches' JSON (scripts/gpu.py measure, one folder of <bench>.json) as markdown
tables of ratios against each kernel's reference in the same run, with issue 23's
targets: towerlab's SGEMM against cuBLAS (TF32 off), conv2d against cuDNN (FMA math, the
fastest algorithm), the memory-bound kernels and the ring against the device-to-device
copy of the same tensor, the training step per tower count, and (gpu_peers.json,
bench/gpu_peers.py's) the step against PyTorch.

  gpu_report.py RESULTS_DIR [RESULTS_DIR ...] [--title "..."] > page.md

With several folders (the newest first), each table comes from the first folder that
holds its bench's JSON, and says which commit and device it measured: a lease that
re-measures only the kernels it changed keeps the other tables of an earlier one.

The *_rows functions pair each run with its reference and return the rows; the tables
here, the pictures of scripts/plots.py and the numbers scripts/check_docs.py allows in
their captions are all made from them, so that the three cannot disagree.
"""
import argparse
import json
import os
import re
import statistics
from collections import namedtuple

# "Large tensors": the copy moves 100 MB or more (read + written), twice the H100's
# 50 MB L2, so that it and the kernel beside it stream through HBM; below that the
# copy's tensors stay in L2 in part or whole (a copy of 2 x 25 MB ran at 6 TB/s, twice
# HBM's rate) and a launch's fixed cost weighs.
LARGE_BYTES = 100e6
MEMORY_BENCHES = ("batchnorm_bench", "pool2d_bench", "bias_bench", "loss_bench",
                  "elementwise_bench", "optimizer_bench")

# One kernel against its reference: times in us, ratio = reference time / towerlab time
# (or towerlab rate / reference rate), target None where none applies (a small tensor,
# or the unfused sequence a fused kernel is measured beside).
Pair = namedtuple("Pair", "kernel shape us ref_us ratio target")
Ring = namedtuple("Ring", "variant towers size mem copy_mem ratio us copy_us")
Step = namedtuple("Step", "mode towers batch ms images_per_second")
Peer = namedtuple("Peer", "contender batch images_per_second rounds ms")


def load(folder, bench):
    """A bench's runs; where it ran repetitions (trainer_bench, interleaved at random), the
    median of each case's repetitions, under the case's name."""
    path = os.path.join(folder, f"{bench}.json")
    if not os.path.exists(path):
        return []
    runs = [r for r in json.load(open(path))["benchmarks"] if not r.get("error_occurred")]
    if not any(r.get("run_type") == "aggregate" for r in runs):
        return runs
    return [dict(r, name=r["run_name"]) for r in runs if r.get("aggregate_name") == "median"]


def us(run):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[run["time_unit"]]
    return run["real_time"] * scale


def rate(run):
    for key in ("bytes/s", "bytes_per_second"):
        if key in run:
            return run[key]
    return None


def run_info(folder):
    """{"commit", "device"} of a results folder: the commit from its build-info.txt, the
    device from gpu_peers.json or from the line scripts/gpu.py's summaries print for
    cuda:0; None for what the folder does not say."""
    info = {"commit": None, "device": None}
    path = os.path.join(folder, "build-info.txt")
    if os.path.exists(path):
        m = re.search(r"^commit:\s*([0-9a-f]{7,40})", open(path).read(), re.M)
        info["commit"] = m and m.group(1)
    peers = os.path.join(folder, "gpu_peers.json")
    if os.path.exists(peers):
        info["device"] = json.load(open(peers)).get("device")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if info["device"] or not name.endswith("-summary.txt"):
            continue
        m = re.search(r"cuda:0 \(([^,)]+)", open(os.path.join(folder, name)).read())
        info["device"] = m and m.group(1)
    return info


def matmul_rows(folder):
    runs = {r["name"]: r for r in load(folder, "matmul_bench")}
    rows = []
    for name, run in runs.items():
        m = re.match(r"BM_Cuda/cuda_(\w+?)/(.*)/manual_time", name)
        if not m:
            continue
        ref = runs.get(f"BM_Cuda/cublas_{m.group(1)}/{m.group(2)}/manual_time")
        if ref:
            shape = m.group(2).replace("/", "x")
            target = 0.90 if shape == "4096x4096x4096" else 0.75
            rows.append(Pair(m.group(1), shape, us(run), us(ref), us(ref) / us(run), target))
    return rows


def conv2d_rows(folder):
    """kernel: the pass (forward, backward_data, backward_weight); shape: the layer."""
    runs = {r["name"]: r for r in load(folder, "conv2d_bench")}
    rows = []
    for name, run in runs.items():
        m = re.match(r"conv2d_(\w+)/(\w+)/cuda/manual_time", name)
        if m and (ref := runs.get(f"conv2d_{m.group(1)}/{m.group(2)}/cudnn/manual_time")):
            rows.append(Pair(m.group(1), m.group(2), us(run), us(ref), us(ref) / us(run), 0.80))
    return rows


def memory_bound_rows(folder, benches=MEMORY_BENCHES):
    """Each kernel against BM_CopyReference on the same shape; target 85% on large tensors."""
    rows = []
    for bench in benches:
        runs = load(folder, bench)
        copies = {}
        for r in runs:
            m = re.match(r"BM_CopyReference/cuda/(.*)/manual_time", r["name"])
            if m:
                copies[m.group(1)] = r
        for r in runs:
            m = re.match(r"BM_(\w+)/(cuda\w*)/(.*)/manual_time", r["name"])
            if not m or m.group(1).startswith(("CopyReference", "Cudnn")):
                continue
            shape = m.group(3)
            copy = copies.get(shape) or copies.get(shape + "/1")
            if not copy or rate(r) is None or rate(copy) is None:
                continue
            large = rate(copy) * us(copy) * 1e-6 >= LARGE_BYTES
            kernel = m.group(1) + ("" if m.group(2) == "cuda" else f" ({m.group(2)[5:]})")
            # Not held to the target: the unfused sequence a fused kernel is measured
            # beside, and cross-entropy through stored probabilities, the CPU's path (a
            # GPU recomputes the softmax), which moves a third more bytes than it is
            # credited with.
            alternative = "unfused" in m.group(2) or "from_probs" in m.group(2)
            target = 0.85 if large and not alternative else None
            rows.append(Pair(kernel, shape, us(r), us(copy), rate(r) / rate(copy), target))
    return rows


def allreduce_rows(folder):
    """The ring's bytes read + written per second ("mem") against the copy's with the same
    towers and size (allreduce_bench's reference copy)."""
    runs = load(folder, "allreduce_bench")
    copies = {}
    for r in runs:
        m = re.match(r"BM_CopyReference/cuda/(\d+)/(\d+)/manual_time", r["name"])
        if m:
            copies[m.group(1, 2)] = r
    rows = []
    for r in runs:
        m = re.match(r"BM_RingAllReduce/(cuda\w*)/(\d+)/(\d+)/manual_time", r["name"])
        copy = copies.get(m.group(2, 3)) if m else None
        if copy and "mem" in r:
            rows.append(Ring(m.group(1), int(m.group(2)), int(m.group(3)), r["mem"], copy["mem"],
                             r["mem"] / copy["mem"], us(r), us(copy)))
    return rows


def trainer_rows(folder):
    rows = []
    for r in load(folder, "trainer_bench"):
        m = re.match(r"BM_FashionNetStep/(cuda\w*)/(\d+)/(\d+)/real_time", r["name"])
        if m:
            rows.append(Step(m.group(1)[5:], int(m.group(2)), int(m.group(3)), us(r) / 1e3,
                             r["items_per_second"]))
    return sorted(rows, key=lambda s: (s.mode, s.batch, s.towers))


def peers_rows(folder):
    """gpu_peers.json: images/s per contender and batch, the median of the rounds first."""
    path = os.path.join(folder, "gpu_peers.json")
    if not os.path.exists(path):
        return []
    rows = []
    for key, seconds in json.load(open(path))["seconds_per_step"].items():
        contender, batch = key.rsplit(" | batch ", 1)
        batch = int(batch)
        rows.append(Peer(contender, batch, batch / statistics.median(seconds),
                         [batch / s for s in seconds], 1e3 * statistics.median(seconds)))
    return rows


def rows_of(path):
    """The rows one results file gives, by its name: <bench>.json or gpu_peers.json."""
    folder, bench = os.path.dirname(path), os.path.basename(path)[:-len(".json")]
    if bench in MEMORY_BENCHES:
        return memory_bound_rows(folder, [bench])
    makers = {"matmul_bench": matmul_rows, "conv2d_bench": conv2d_rows, "allreduce_bench": allreduce_rows,
              "trainer_bench": trainer_rows, "gpu_peers": peers_rows}
    return makers[bench](folder) if bench in makers else []


def verdict(ratio, target):
    return "met" if ratio >= target else "**not met**"


# Where the table being printed was measured, when the page draws on several folders.
source = ""


def table(title, header, cells, intro=""):
    """One section of the page: its title, where it was measured (with several folders),
    an optional paragraph, a markdown table of the rows' cells (nothing when there are no
    rows)."""
    if not cells:
        return
    print(f"\n## {title}\n")
    if source:
        print(source + "\n")
    if intro:
        print(intro + "\n")
    print("| " + " | ".join(header).rstrip() + " |")
    print("|" + "---|" * len(header))
    for row in cells:
        print("| " + " | ".join(row) + " |")


def percent(value):
    return f"{100 * value:.0f}%"


def matmul(sources):
    (folder, _), = sources
    table("SGEMM against cuBLAS (FP32, TF32 off)",
          ["layout", "M x N x K", "towerlab us", "cuBLAS us", "% of cuBLAS", "target", ""],
          [[r.kernel, r.shape, f"{r.us:.1f}", f"{r.ref_us:.1f}", percent(r.ratio), percent(r.target),
            verdict(r.ratio, r.target)] for r in matmul_rows(folder)])


def conv2d(sources):
    (folder, _), = sources
    table("conv2d against cuDNN (FP32 FMA math, the fastest algorithm cudnnFind returns)",
          ["layer", "pass", "towerlab us", "cuDNN us", "% of cuDNN", "target 80%"],
          [[r.shape, r.kernel.replace("_", " "), f"{r.us:.1f}", f"{r.ref_us:.1f}", percent(r.ratio),
            verdict(r.ratio, r.target)] for r in conv2d_rows(folder)])


def memory_bound(sources):
    table("Memory-bound kernels against the device-to-device copy of the same tensor",
          ["kernel", "shape", "towerlab us", "copy us", "% of the copy", "target"],
          [[r.kernel, r.shape, f"{r.us:.1f}", f"{r.ref_us:.1f}", percent(r.ratio),
            verdict(r.ratio, r.target) if r.target else
            "the fused kernel's reference" if "unfused" in r.kernel else
            "the CPU's path" if "from_probs" in r.kernel else "small tensor"]
           for folder, bench in sources for r in memory_bound_rows(folder, [bench])],
          "Bytes read + written per second, each kernel beside `BM_CopyReference` on the same "
          "shape in the same run; the target (85%) is for large tensors (the copy moves 100 MB or "
          "more, read + written: twice the 50 MB L2, so both stream through HBM).")


def allreduce(sources):
    (folder, _), = sources
    table("Ring all-reduce on virtual devices of one GPU against the copy",
          ["variant", "towers", "bytes per member", "% of the copy", "target"],
          [[r.variant, str(r.towers), f"{r.size >> 20} MiB", percent(r.ratio),
            verdict(r.ratio, 0.80) if 2 * r.towers * r.size >= LARGE_BYTES else "in the L2"]
           for r in allreduce_rows(folder)],
          "Bytes read + written per second by the ring's kernels, against those of a copy of "
          "all the members' bytes (the bound any schedule has on one GPU, with the ring's "
          "footprint in the L2 cache); target 80% where that copy moves 100 MB or more, read + "
          "written, as for the memory-bound kernels. Below, members and copy stay in the 50 MB "
          "L2 in part or whole, and the ring's launches and events between the members' "
          "streams weigh.")


def trainer(sources):
    (folder, _), = sources
    table("FashionNet's training step on virtual towers of one GPU",
          ["batch norm", "towers", "batch", "ms per step", "images/s"],
          [[r.mode, str(r.towers), str(r.batch), f"{r.ms:.3f}", f"{r.images_per_second:.0f}"]
           for r in trainer_rows(folder)])


def peers(sources):
    (folder, _), = sources
    table("FashionNet's training step against PyTorch",
          ["batch", "contender", "images/s (median)", "rounds", "ms per step"],
          [[str(r.batch), r.contender, f"{r.images_per_second:.0f}",
            " / ".join(f"{v:.0f}" for v in r.rounds), f"{r.ms:.3f}"]
           for r in sorted(peers_rows(folder), key=lambda r: r.batch)])


# Each table and the results it is made of.
SECTIONS = ((matmul, ("matmul_bench",)), (conv2d, ("conv2d_bench",)),
            (memory_bound, MEMORY_BENCHES), (allreduce, ("allreduce_bench",)),
            (trainer, ("trainer_bench",)), (peers, ("gpu_peers",)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", metavar="folder")
    p.add_argument("--title", default="towerlab's kernels on a GPU")
    args = p.parse_args()
    print(f"# {args.title}")
    global source
    for section, benches in SECTIONS:
        sources = []  # (folder, bench): each bench from the first folder that has it
        for bench in benches:
            folder = next((f for f in args.folders
                           if os.path.exists(os.path.join(f, bench + ".json"))), None)
            if folder:
                sources.append((folder, bench))
        if not sources:
            continue
        if len(args.folders) > 1:
            source = "Measured on " + "; ".join(
                describe(f, [b for g, b in sources if g == f])
                for f in dict.fromkeys(f for f, _ in sources)) + "."
        section(sources)


def describe(folder, benches):
    """'NVIDIA H100 80GB HBM3 at 3a386af (pool2d_bench; gpu_h100_3a386af/)'."""
    info = run_info(folder)
    return (f"{info['device'] or 'a device not recorded'} at "
            f"{(info['commit'] or 'an unrecorded commit')[:7]} ({', '.join(benches)}; "
            f"{os.path.basename(os.path.normpath(folder))}/)")


if __name__ == "__main__":
    main()
