#!/usr/bin/env python3
"""The GPU benches' JSON (scripts/gpu.sh measure, one folder of <bench>.json) as markdown
tables of ratios against each kernel's reference in the same run, with issue 23's
targets: towerlab's SGEMM against cuBLAS (TF32 off), conv2d against cuDNN (FMA math, the
fastest algorithm), the memory-bound kernels and the ring against the device-to-device
copy of the same tensor, and the training step per tower count.

  gpu_report.py RESULTS_DIR [--title "..."] > page.md
"""
import argparse
import json
import os
import re

# "Large tensors": the copy moves 30 MB or more (read + written); below that the
# tensors stay in the H100's 50 MB L2 and a launch's fixed cost weighs.
LARGE_BYTES = 30e6


def load(folder, bench):
    path = os.path.join(folder, f"{bench}.json")
    if not os.path.exists(path):
        return []
    return [r for r in json.load(open(path))["benchmarks"] if not r.get("error_occurred")]


def us(run):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[run["time_unit"]]
    return run["real_time"] * scale


def verdict(ratio, target):
    return "met" if ratio >= target else "**not met**"


def matmul(folder):
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
            rows.append((m.group(1), shape, us(run), us(ref), us(ref) / us(run), target))
    if rows:
        print("\n## SGEMM against cuBLAS (FP32, TF32 off)\n")
        print("| layout | M x N x K | towerlab us | cuBLAS us | % of cuBLAS | target | |")
        print("|---|---|---|---|---|---|---|")
        for lay, shape, t, r, ratio, target in rows:
            print(f"| {lay} | {shape} | {t:.1f} | {r:.1f} | {100 * ratio:.0f}% | {100 * target:.0f}% | "
                  f"{verdict(ratio, target)} |")


def conv2d(folder):
    runs = {r["name"]: r for r in load(folder, "conv2d_bench")}
    rows = []
    for name, run in runs.items():
        m = re.match(r"conv2d_(\w+)/(\w+)/cuda/manual_time", name)
        if m and (ref := runs.get(f"conv2d_{m.group(1)}/{m.group(2)}/cudnn/manual_time")):
            rows.append((m.group(2), m.group(1), us(run), us(ref), us(ref) / us(run)))
    if rows:
        print("\n## conv2d against cuDNN (FP32 FMA math, the fastest algorithm cudnnFind returns)\n")
        print("| layer | pass | towerlab us | cuDNN us | % of cuDNN | target 80% |")
        print("|---|---|---|---|---|---|")
        for layer, pass_, t, r, ratio in rows:
            print(f"| {layer} | {pass_.replace('_', ' ')} | {t:.1f} | {r:.1f} | {100 * ratio:.0f}% | "
                  f"{verdict(ratio, 0.80)} |")


def rate(run):
    for key in ("bytes/s", "bytes_per_second"):
        if key in run:
            return run[key]
    return None


def memory_bound(folder):
    print("\n## Memory-bound kernels against the device-to-device copy of the same tensor\n")
    print("Bytes read + written per second, each kernel beside `BM_CopyReference` on the same "
          "shape in the same run; the target (85%) is for large tensors (the copy moves 30 MB or "
          "more, read + written).\n")
    print("| kernel | shape | towerlab us | copy us | % of the copy | target |")
    print("|---|---|---|---|---|---|")
    for bench in ("batchnorm_bench", "pool2d_bench", "bias_bench", "loss_bench",
                  "elementwise_bench", "optimizer_bench"):
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
            ratio = rate(r) / rate(copy)
            large = rate(copy) * us(copy) * 1e-6 >= LARGE_BYTES
            kernel = m.group(1) + ("" if m.group(2) == "cuda" else f" ({m.group(2)[5:]})")
            print(f"| {kernel} | {shape} | {us(r):.1f} | {us(copy):.1f} | {100 * ratio:.0f}% | "
                  f"{verdict(ratio, 0.85) if large else 'small tensor'} |")


def allreduce(folder):
    runs = load(folder, "allreduce_bench")
    copies = {}
    for r in runs:
        m = re.match(r"BM_CopyReference/cuda/(\d+)/(\d+)/manual_time", r["name"])
        if m:
            copies[m.group(2)] = r
    rows = []
    for r in runs:
        m = re.match(r"BM_RingAllReduce/(cuda\w*)/(\d+)/(\d+)/manual_time", r["name"])
        if m and m.group(3) in copies and "mem" in r:
            rows.append((m.group(1), m.group(2), int(m.group(3)), r["mem"] / copies[m.group(3)]["mem"]))
    if rows:
        print("\n## Ring all-reduce on virtual devices of one GPU against the copy\n")
        print("Bytes read + written per second by the ring's kernels, against the copy's "
              "(the bound any schedule has on one GPU); target 80%.\n")
        print("| variant | towers | bytes per member | % of the copy | target |")
        print("|---|---|---|---|---|")
        for variant, towers, size, ratio in rows:
            print(f"| {variant} | {towers} | {size >> 20} MiB | {100 * ratio:.0f}% | {verdict(ratio, 0.80)} |")


def trainer(folder):
    runs = load(folder, "trainer_bench")
    rows = [(m.group(1), int(m.group(2)), int(m.group(3)), r) for r in runs
            if (m := re.match(r"BM_FashionNetStep/(cuda\w*)/(\d+)/(\d+)/real_time", r["name"]))]
    if rows:
        print("\n## FashionNet's training step on virtual towers of one GPU\n")
        print("| batch norm | towers | batch | ms per step | images/s |")
        print("|---|---|---|---|---|")
        for mode, towers, batch, r in sorted(rows, key=lambda x: (x[0], x[2], x[1])):
            print(f"| {mode[5:]} | {towers} | {batch} | {us(r) / 1e3:.3f} | {r['items_per_second']:.0f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--title", default="towerlab's kernels on a GPU")
    args = p.parse_args()
    print(f"# {args.title}")
    for section in (matmul, conv2d, memory_bound, allreduce, trainer):
        section(args.folder)


if __name__ == "__main__":
    main()
